"""Task data, and turning it into padded batches with a loss mask.

Every training sequence is  [bos] prompt completion [eos]; its loss covers the completion and the eos.
Plain text is a completion with an empty prompt: every token after bos counts.

Scoring reads the same windows under one rule (`scored` below, docs/metrics.md "What is scored"): a position
is scored when its target is text the task is about. Two positions of a window are the window's format, not
knowledge, and are not scored: the first token predicted from bos alone (an empty prompt: what a window starts
with), and an eos the harness appended to a cut passage. A task whose completions end where the text ends
declares `eos_is_content` (arithmetic: the answer's end, so "12" never scores as "123").

Old text is cut from running text, and a passage's first words, read after bos alone, are the window's start as much
as its first token is: a fine-tune with nothing new to learn moves them by nats (docs/evidence.md, the format-only
control). So old text is read as running text, as a rolling log-likelihood reads a document: each passage is scored
whole after the passage before it and the task's `old_text_break` (unscored context); every token of it is scored
and no eos is appended. A task whose base learned each passage as a sequence of its own (arithmetic's equations)
declares no break, and its passages are read alone after bos.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, field

import torch

from clbench.errors import ClbenchError


@dataclass(frozen=True)
class Example:
    prompt: str
    completion: str
    group: str | None = None  # e.g. "seen" / "unseen": accuracy is also reported per group


@dataclass(frozen=True)
class Stage:
    """One stage of a sequential task: its own new tokens, training pool and target set."""

    name: str
    new_tokens: list[str]
    train: list[Example]
    target_test: list[Example]


# a task parameter that sizes a split → that split. A corpus may hold fewer examples than a profile asks (the
# packaged German prose gives xling 65 validation chunks of the 100 asked): the run then scores fewer than its
# config says, which validate and each run's log state
SIZED_SPLITS = {
    "n_target": "target_test",
    "n_validation": "validation",
    "n_old_text": "old_text",
    "n_validation_old": "validation_old_text",
}


def doc(text: str, default=MISSING, default_factory=MISSING):
    """A field with its one-line description, which docs/adding-a-task.md's tables show (clbench.guide)."""
    return field(default=default, default_factory=default_factory, metadata={"doc": text})


@dataclass(frozen=True)
class TaskData:
    new_tokens: list[str] = doc(
        "the tokens to add, U; distinct, none already in the base vocabulary or read by its tokenizer as one known "
        "token"
    )
    train: list[Example] = doc("non-empty: the training pool; a run trains on its first `n_train`")
    target_test: list[Example] = doc(
        "non-empty: held-out examples written with the new tokens: `target_loss`, `target_acc`, …"
    )
    old_text: list[str] = doc("non-empty: text in the old vocabulary only: forgetting is measured here")
    old_skill: list[Example] = doc(
        "a probe of a skill the base had; gives `old_skill_acc`, `old_skill_acc_base`, `old_skill_acc_delta` "
        "(`_full`)",
        default_factory=list,
    )
    # never the evaluation text, or forgetting would be measured on what was rehearsed
    replay_text: list[str] = doc(
        "old-vocabulary text **disjoint from `old_text`**, for methods that rehearse old data: `replay` and `ewc` "
        "need it and are refused without it",
        default_factory=list,
    )
    # AddedToken single_word + lstrip
    whole_word_tokens: bool = doc(
        'new tokens are words: each matches only as a whole word and absorbs the space before it (`" glorp"` is '
        'one token, `"glorpy"` none)',
        default=False,
    )
    meaning: dict[str, list[str]] = doc(
        "ground truth where known: what each new token stands for (e.g. a pseudo-word's dictionary); gives the "
        "dictionary-recovery metrics (`meaning_recall_at_s`, …)",
        default_factory=dict,
    )
    stages: list[Stage] = doc(
        "a sequential task: stages trained in order; then `new_tokens`, `train` and `target_test` are their "
        "concatenations, and after each stage every stage's target set is evaluated",
        default_factory=list,
    )
    # disjoint from train, target_test, old_text and replay_text, so no choice is ever made on what is reported
    validation: list[Example] = doc(
        "held out like `target_test`, for choosing hyperparameters: `clbench tune` scores it in place of the "
        'target set and stops on a task without it ("no validation split")',
        default_factory=list,
    )
    validation_old_text: list[str] = doc(
        "old-vocabulary text disjoint from `old_text` and `replay_text`: what `clbench tune` scores in place of "
        "`old_text`; needed with `validation`",
        default_factory=list,
    )
    target_oracle: list[Example] = doc(
        "where the task knows what a new token stands for: `target_test` with each new token replaced by its "
        "meaning (pseudowords: the word it replaced; arithmetic: `*`), one per target example, same completions; "
        "the base on these is the oracle reference (`target_loss_oracle`, `gap_closed`)",
        default_factory=list,
    )
    # not in the fingerprint, so that no task's data fingerprint or run id moved when it was added; a generator that
    # changes it takes a new task version
    train_oracle: list[Example] = doc(
        "a plain task's training examples with each new token written as what it stands for there, one per `train` "
        "example, same completions: what `distill`'s teacher reads (without it, a token's one word in `meaning`, or "
        "where the task knows no meaning, its own sub-word pieces); not in the data fingerprint",
        default_factory=list,
    )
    # a 6-word continuation is 0 for every method
    exact_match: bool = doc(
        "a completion is a short answer that can be matched whole (arithmetic's value); false for a free-text "
        "continuation: `target_acc` is then not reported",
        default=True,
    )
    # otherwise the eos is the harness's, appended to a cut window, and not scored (Scoring, the module docstring)
    eos_is_content: bool = doc(
        "the eos after each completion is where the text ends (arithmetic's answer), a thing to learn and score",
        default=False,
    )

    # not in the fingerprint, so that the tasks without a break kept their run ids when it came; a generator that
    # changes it takes a new task version (as the text tasks' version 3 did)
    old_text_break: str | None = doc(
        "old text is running text: each passage is scored after the passage before it (the last, for the first) "
        "and this break, unscored context, so no passage starts a window; null: each passage alone after bos, "
        "its first token context (arithmetic's equations, each a sequence of its own to the base)",
        default="\n\n",
    )

    @property
    def scoring(self) -> Scoring:
        return scored(self.eos_is_content, self.old_text_break)

    def check(self, task: str) -> None:
        """What a generator must guarantee about its splits; a violation is the generator's bug."""
        for name, oracle, examples, kind in (
            ("target_oracle", self.target_oracle, self.target_test, "target"),
            ("train_oracle", self.train_oracle, self.train, "training"),
        ):
            if oracle and (
                len(oracle) != len(examples) or any(o.completion != e.completion for o, e in zip(oracle, examples))
            ):
                raise ClbenchError(f"task {task!r}: {name} must pair each {kind} example, with its completion")
        if self.train_oracle and self.stages:
            raise ClbenchError(f"task {task!r}: train_oracle pairs a plain task's train; a sequential task has none")
        pairs = lambda examples: {(e.prompt, e.completion) for e in examples}
        if pairs(self.validation) & (pairs(self.target_test) | pairs(self.train)):
            raise ClbenchError(f"task {task!r}: validation examples overlap the target or training set")
        if set(self.validation_old_text) & (set(self.old_text) | set(self.replay_text)):
            raise ClbenchError(f"task {task!r}: validation_old_text overlaps old_text or replay_text")

    def shortfall(self, params) -> str:
        """The splits holding fewer examples than the task's parameters ask, as one clause for validate and the
        run log ("the data holds fewer than asked: 65 validation of n_validation 100"), else ""; params: the
        task's parameter model (a split it does not size is not checked)."""
        short = []
        for name, split in SIZED_SPLITS.items():
            asked, held = getattr(params, name, None), len(getattr(self, split))
            if isinstance(asked, int) and held < asked:
                short.append(f"{held} {split.replace('_', ' ')} of {name} {asked}")
        return f"the data holds fewer than asked: {', '.join(short)}" if short else ""

    def fingerprint(self) -> str:
        fields = {k: v for k, v in asdict(self).items() if k not in ("train_oracle", "old_text_break")}
        blob = json.dumps(fields, sort_keys=True, ensure_ascii=False).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class Encoded:
    ids: list[int]
    loss_from: int  # positions >= loss_from are predicted targets (index into ids)
    # UTF-8 bytes of the completion text the targets cover (bits per byte); 0 where not counted (training)
    scored_bytes: int = 0


@dataclass(frozen=True)
class Scoring:
    """Which positions of a window are targets: training reads them all (TRAINING); evaluation reads what the
    rule of the module docstring leaves (scored())."""

    from_bos: bool  # the first token predicted from bos alone (a window with an empty prompt)
    eos: bool  # the eos appended after the completion
    # plain texts (encode_texts) are running text: each read after the one before it and this break (None: alone)
    running: str | None = None


TRAINING = Scoring(from_bos=True, eos=True)


def scored(eos_is_content: bool, old_text_break: str | None = None) -> Scoring:
    """The scoring rule for a task: a first token from bos alone is never scored, an appended eos only where the
    task declares it content (tasks' `eos_is_content`); plain text read as running text where the task declares
    its break (`old_text_break`)."""
    return Scoring(from_bos=False, eos=eos_is_content, running=old_text_break)


def encode(tokenizer, prompt: str, completion: str, max_length: int | None, scoring: Scoring = TRAINING) -> Encoded:
    """max_length: the model's context (a longer sequence is an error); None: unbounded (running() cuts its own)."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    head = bos + tokenizer.encode(prompt, add_special_tokens=False)
    body = tokenizer.encode(completion, add_special_tokens=False)
    ids = head + body + ([tokenizer.eos_token_id] if scoring.eos else [])
    if not head:
        raise ClbenchError("tokenizer has no bos token and the prompt is empty: nothing to condition on")
    if max_length is not None and len(ids) > max_length:
        raise ClbenchError(
            f"a sequence of {len(ids)} tokens exceeds the model context of {max_length}: {prompt + completion!r:.60}"
        )
    if scoring is TRAINING:
        return Encoded(ids, len(head))
    # an empty prompt: the completion's first token is read as context, not scored
    skipped = 1 if len(head) == len(bos) and not scoring.from_bos and body else 0
    return Encoded(ids, len(head) + skipped, len(completion.encode()) - _leading_bytes(tokenizer, completion, skipped))


def _leading_bytes(tokenizer, text: str, tokens: int) -> int:
    """UTF-8 bytes of the text its first `tokens` tokens read (leading_text)."""
    return len(leading_text(tokenizer, text, tokens).encode())


def leading_text(tokenizer, text: str, tokens: int) -> str:
    """The text its first `tokens` tokens read (a token ending inside a character reads it whole)."""
    if not tokens:
        return ""
    if tokenizer.is_fast:
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        return text[: offsets[tokens - 1][1]]
    return tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)[:tokens])


def encode_examples(tokenizer, examples: list[Example], max_length: int, scoring: Scoring = TRAINING) -> list[Encoded]:
    return [encode(tokenizer, e.prompt, e.completion, max_length, scoring) for e in examples]


def encode_texts(tokenizer, texts: list[str], max_length: int, scoring: Scoring = TRAINING) -> list[Encoded]:
    if scoring.running is None or len(texts) < 2:
        return [encode(tokenizer, "", t, max_length, scoring) for t in texts]
    return [running(tokenizer, before, text, max_length, scoring) for before, text in preceded(texts)]


def preceded(texts: list[str]) -> list[tuple[str, str]]:
    """(the text before it, text) for each text read as running text; the last comes before the first."""
    return list(zip(texts[-1:] + texts, texts))


def running(tokenizer, before: str, text: str, max_length: int, scoring: Scoring) -> Encoded:
    """text as the completion of the text before it and the break (scoring.running), an unscored prompt that loses
    its oldest tokens where the window would pass max_length; read alone where no token of it fits."""
    window = encode(tokenizer, before + scoring.running, text, None, scoring)
    bos = int(tokenizer.bos_token_id is not None)
    over = len(window.ids) - max_length
    if over >= window.loss_from - bos:  # no room for any context beside it
        return encode(tokenizer, "", text, max_length, scoring)
    if over <= 0:
        return window
    return Encoded(window.ids[:bos] + window.ids[bos + over :], window.loss_from - over, window.scored_bytes)


def sets_read(data: TaskData, n_train: int) -> list[tuple[str, list[Example], bool]]:
    """(name, examples, expanded) for every set a run encodes; expanded: read with the new tokens added
    (what the method trains on and is scored on), else with the base tokenizer (old material, and the
    oracle the base reads). The base's own reading of the target set, new tokens and all, is not here:
    that is the no-learning reference, <unk> and all."""
    as_examples = lambda texts: [Example("", t) for t in texts]
    trains = [(f"stage {s.name!r} train", s.train[:n_train], True) for s in data.stages]
    return [
        *(trains or [("train", data.train[:n_train], True)]),
        ("target", data.target_test, True),
        ("replay text", as_examples(data.replay_text), True),
        ("old text", as_examples(data.old_text), False),
        ("old skill", data.old_skill, False),
        ("target oracle", data.target_oracle, False),
    ]


def read_all(base_tokenizer, expanded, data: TaskData, n_train: int, max_length: int, *, allow_unknown: bool):
    """Encodes every set of sets_read as a run does (a sequence over max_length is an error) → one line per
    set holding text its tokenizer reads as the unknown token, which a run would silently train or score
    as <unk>; none where allow_unknown (the task's `allow_unknown_tokens`). The check scans ids already
    encoded, and is skipped for a tokenizer without an unknown token (it can never produce one)."""
    problems = []
    for name, examples, with_new_tokens in sets_read(data, n_train):
        tokenizer = expanded if with_new_tokens else base_tokenizer
        encoded = encode_examples(tokenizer, examples, max_length)
        if not allow_unknown and tokenizer.unk_token_id is not None:
            problems += filter(None, [unknown_text(tokenizer, name, examples, encoded)])
    unk, cut = base_tokenizer.unk_token_id, data.old_text_break
    if cut and not allow_unknown and unk is not None and unk in base_tokenizer.encode(cut, add_special_tokens=False):
        problems.append(
            f"old_text_break {cut!r}: the base tokenizer reads it as {base_tokenizer.unk_token!r}, so every old-text "
            "passage would follow an unknown token; give a break it reads (or null: each passage alone after bos)"
        )
    return problems


PIECES_SHOWN = 10  # a text task read with a character tokenizer has dozens: the line stays one line


def unknown_text(tokenizer, name: str, examples: list[Example], encoded: list[Encoded]) -> str | None:
    unk, skip = tokenizer.unk_token_id, int(tokenizer.bos_token_id is not None)
    # bos and eos are left out: a tokenizer may use one token for unk, bos and eos (GPT-2's <|endoftext|>)
    bad = [i for i, e in enumerate(encoded) if unk in e.ids[skip:-1]]
    if not bad:
        return None
    pieces = sorted(
        {p for i in bad for text in (examples[i].prompt, examples[i].completion) for p in _unknown(tokenizer, text)}
    )
    first = examples[bad[0]].prompt + examples[bad[0]].completion
    shown = ", ".join(map(repr, pieces[:PIECES_SHOWN])) + (
        f" and {len(pieces) - PIECES_SHOWN} more" if len(pieces) > PIECES_SHOWN else ""
    )
    return (
        f"{name} example {bad[0]} {first!r:.60}: the tokenizer reads {shown} as {tokenizer.unk_token!r} "
        f"({len(bad)} of {len(examples)} examples; `allow_unknown_tokens: true` in the task file accepts that)"
    )


def _unknown(tokenizer, text: str) -> set[str]:
    """The parts of text the tokenizer reads as its unknown token (on the error path only)."""
    if not tokenizer.is_fast:  # no offsets: the characters it cannot read alone
        return {c for c in text if tokenizer.encode(c, add_special_tokens=False) == [tokenizer.unk_token_id]}
    read = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return {text[a:b] for i, (a, b) in zip(read["input_ids"], read["offset_mapping"]) if i == tokenizer.unk_token_id}


class Padded:
    """Examples padded into one matrix once; a batch is then a row selection, a few tensor ops per
    step instead of a Python loop over its examples (which cost ~1 ms a step, 8 % of a small model's).

    Padding is on the right, so under a causal mask no real position ever attends to a pad: the
    model needs no padding mask, and without one SDPA takes its plain
    causal kernel (SmolLM2-135M, 8 × 139 tokens: hidden states at real positions identical to the
    masked forward's, bit for bit, ~8 % faster)."""

    def __init__(self, encoded: list[Encoded], pad_id: int):
        self.lengths = torch.tensor([len(e.ids) for e in encoded])
        self.loss_from = torch.tensor([e.loss_from for e in encoded])
        width = int(self.lengths.max())
        self.ids = torch.tensor([e.ids + [pad_id] * (width - len(e.ids)) for e in encoded], dtype=torch.long)

    def batch(self, rows: list[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """→ input_ids, attention_mask, target_mask, as wide as the batch's longest example."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        lengths, loss_from = self.lengths[rows], self.loss_from[rows]
        width = int(lengths.max())
        positions = torch.arange(width)
        attention = (positions < lengths[:, None]).long()
        # target_mask[b, t] says ids[b, t+1] is scored: from loss_from to the last token
        target = (positions[:-1] >= loss_from[:, None] - 1) & (positions[:-1] < lengths[:, None] - 1)
        return self.ids[rows, :width], attention, target


def collate(batch: list[Encoded], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """→ input_ids, attention_mask, target_mask; target_mask[b, t] says ids[b, t+1] is scored."""
    return Padded(batch, pad_id).batch(range(len(batch)))
