"""What a process computes once and reuses across runs: base models, task data, the base's scores.

Base-model evaluations depend only on (model, data), and the expanded model before training only on (model, data,
init, seed): each is computed once per process and kept here, keyed by fingerprints, for every run that needs it
(clbench/protocol.py reads them; clbench/executors.py runs a job's requests with one Session).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clbench import distributed
from clbench.data import Encoded, TaskData, encode_examples, encode_texts
from clbench.devices import resolve_device
from clbench.distributed import log
from clbench.evaluate import Positions, Reference, Scores, head_of, positions, score
from clbench.models import Base, load_base
from clbench.taskspec import Task


@dataclass
class Session:
    """What a process computes once and reuses across runs: base models, task data, base scores."""

    trust_remote_code: bool = False
    device: str = "auto"  # auto: the GPU when torch sees one (launched as several processes: each its own)
    device_map: str | dict | None = None  # "auto": hub/local models placed across the GPUs (models.load_base)
    bases: dict[str, Base] = field(default_factory=dict)
    datasets: dict[tuple, TaskData] = field(default_factory=dict)
    base_scores: dict[tuple, tuple[Scores, Scores]] = field(default_factory=dict)
    base_target_scores: dict[tuple, Scores] = field(default_factory=dict)
    base_positions: dict[tuple, list[Positions]] = field(default_factory=dict)
    old_references: dict[tuple, Reference] = field(default_factory=dict)
    # the expanded model before any training is the same for every method (expand() precedes setup()),
    # so its target scores are too: one scoring per (base, data, init, seed) rather than per method
    init_scores: dict[tuple, Scores] = field(default_factory=dict)
    oracle_encodings: dict[tuple, list[Encoded]] = field(default_factory=dict)

    def base(self, ref: str) -> Base:
        if ref not in self.bases:
            log(f"loading base model {ref}")
            device = (
                distributed.device()
                if distributed.launched() and self.device == "auto"
                else resolve_device(self.device)
            )
            self.bases[ref] = load_base(
                ref, log=log, trust_remote_code=self.trust_remote_code, device=device, device_map=self.device_map
            )
        return self.bases[ref]

    def data(self, task: Task, params, base: Base) -> TaskData:
        key = (task.name, params.model_dump_json(), base.fingerprint)
        if key not in self.datasets:
            self.datasets[key] = task.build(params, base.tokenizer)
            if short := self.datasets[key].shortfall(params):
                log(f"{task.name}: {short}")
        return self.datasets[key]

    def scores_of_base(self, base: Base, data: TaskData, batch_size: int) -> tuple[Scores, Scores]:
        """(old text, old skill) scored by the unexpanded base model."""
        key = (base.fingerprint, data.fingerprint())
        if key not in self.base_scores:
            old, skill = old_sets(base, data)
            pad, vocab = base.tokenizer.pad_token_id, len(base.tokenizer)
            self.base_scores[key] = (
                score(
                    base.model,
                    old,
                    old_vocab=vocab,
                    pad_id=pad,
                    batch_size=batch_size,
                    at=self.old_positions(base, data, batch_size),
                ),
                score(base.model, skill, old_vocab=vocab, pad_id=pad, batch_size=batch_size),
            )
        return self.base_scores[key]

    def old_positions(self, base: Base, data: TaskData, batch_size: int) -> list[Positions]:
        """The base's hidden states at the old text's scored positions, computed once: a method with a
        frozen backbone has the very same on old text (it holds no new token), so its evaluation
        there is the head alone (protocol.expanded)."""
        return self._positions(base, data, batch_size, "old", lambda: old_sets(base, data)[0])

    def old_reference(self, base: Base, data: TaskData, batch_size: int) -> Reference:
        """What an adapted model's transition drift on old text is measured against: the base's positions
        there and its head (a copy where own_model hands the base's weights to the run: device_map)."""
        key = (base.fingerprint, data.fingerprint(), batch_size)
        if key not in self.old_references:
            head = head_of(base.model, len(base.tokenizer), keep=base.reload is not None)
            self.old_references[key] = Reference(self.old_positions(base, data, batch_size), head)
        return self.old_references[key]

    def oracle_positions(self, base: Base, data: TaskData, batch_size: int) -> list[Positions]:
        """The same for the target set's oracle version (each new token replaced by its meaning): it
        holds no new token either, so a frozen backbone's adapted-oracle score is the head alone."""
        return self._positions(base, data, batch_size, "oracle", lambda: self.oracle_encoded(base, data))

    def _positions(self, base: Base, data: TaskData, batch_size: int, which: str, encoded) -> list[Positions]:
        key = (base.fingerprint, data.fingerprint(), batch_size, which)
        if key not in self.base_positions:
            self.base_positions[key] = list(
                positions(base.model, encoded(), pad_id=base.tokenizer.pad_token_id, batch_size=batch_size)
            )
        return self.base_positions[key]

    def oracle_encoded(self, base: Base, data: TaskData) -> list[Encoded]:
        """The target set's oracle version under the base tokenizer, encoded once per (base, data)."""
        key = (base.fingerprint, data.fingerprint())
        if key not in self.oracle_encodings:
            self.oracle_encodings[key] = encode_examples(
                base.tokenizer, data.target_oracle, base.max_length, data.scoring
            )
        return self.oracle_encodings[key]

    def target_of_base(self, base: Base, data: TaskData, batch_size: int, *, oracle: bool = False) -> Scores:
        """The target set, or its oracle version, scored by the unexpanded base with its own tokenizer:
        the no-learning and the oracle reference (clbench/protocol.py base_references)."""
        key = (base.fingerprint, data.fingerprint(), oracle)
        if key not in self.base_target_scores:
            encoded = (
                self.oracle_encoded(base, data)
                if oracle
                else encode_examples(base.tokenizer, data.target_test, base.max_length, data.scoring)
            )
            self.base_target_scores[key] = score(
                base.model,
                encoded,
                old_vocab=len(base.tokenizer),
                pad_id=base.tokenizer.pad_token_id,
                batch_size=batch_size,
                at=self.oracle_positions(base, data, batch_size) if oracle else None,
            )
        return self.base_target_scores[key]


def old_sets(base: Base, data: TaskData) -> tuple[list[Encoded], list[Encoded]]:
    # Old material is encoded with the base tokenizer for both models: forgetting compares the
    # same token sequences, even where an expanded tokenizer would split the text differently.
    return (
        encode_texts(base.tokenizer, data.old_text, base.max_length, data.scoring),
        encode_examples(base.tokenizer, data.old_skill, base.max_length, data.scoring),
    )
