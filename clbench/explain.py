"""What a learned new token means in terms of old ones: `clbench explain RUN_ID`.

Every finished run stores its new tokens' learned rows (input and output embeddings) in
<cache>/rows/<run_id>.safetensors. explain() reloads the run's base model by its recorded
reference and reads each new input row as a token-to-dictionary mapping over the old input
rows: its nearest old tokens by cosine, and its best s-sparse decomposition (OMP) with the
relative residual, e.g.  <spec> ≈ 0.61·'*' + 0.20·'3' − …  (residual 0.42).
A run that trained its new output rows (training softmax over V ∪ U) gets the same reading of
those over the old output rows.

Where the task knows what each new token stands for (TaskData.meaning: pseudowords' dictionaries),
every run also stores how well its learned input row recovers that truth (meaning_recovery), and
explain prints the truth under each decomposition. The rules:
- space: the learned input row against the base's old input rows (for fft and the like, the
  base's rows, not the adapted ones), both CENTRED: minus the mean of the old rows. Uncentred,
  cosine ranks measure closeness to the mean row, not meaning: a new row starts at the mean plus
  noise, and on SmolLM2-135M frequent words are the old rows least like the mean, so an untrained
  row ranked its true (common) words ~48,400th of 49,152, far below chance (~24,600). Centred, an
  untrained row reads at chance and the ranks measure the direction training added;
- a true word is the base token it would be as text: " " + word where the task's new tokens are
  whole words (they absorb the space before them, so the word they replace carries it), the word
  itself otherwise. Only a word that is ONE base token is scored; one that splits into several
  pieces is left out (counted apart: meaning_words_scored of all);
- recall@s: with s = the number of true words of the token (the task's dictionary_size), the share
  of its scored true words among the s atoms OMP chooses (in the centred space); mean over tokens
  with a scored word;
- rank: 1 + the number of old rows with a strictly higher cosine to the row (1 = nearest);
  median over every scored (token, word) pair. Chance is (V + 1) / 2 for V old rows.
The nearest rows and the decomposition explain prints above the truth are the paper's reading,
uncentred: the row itself as a combination of old rows.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from clbench.cache import cache_root
from clbench.errors import ClbenchError
from clbench.sparse import nearest, omp
from clbench.storage import ResultStore


def rows_file(run_id: str) -> Path:
    return cache_root() / "rows" / f"{run_id}.safetensors"


@torch.no_grad()
def save_new_rows(
    path: Path, model, old_vocab: int, tokens: list[str], meaning: dict | None = None, whole_words: bool = False
) -> None:
    """meaning, whole_words: the task's truth and how its words read as tokens (kept for explain)."""
    new = slice(old_vocab, old_vocab + len(tokens))
    rows = {
        "input": model.get_input_embeddings().weight[new].detach().float().cpu().clone(),
        "output": model.get_output_embeddings().weight[new].detach().float().cpu().clone(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    metadata = {"tokens": json.dumps(tokens), "meaning": json.dumps(meaning or {}), "whole_words": str(whole_words)}
    save_file(rows, staging, metadata=metadata)
    staging.replace(path)  # a reader never sees half a file


def load_new_rows(path: Path) -> tuple[list[str], dict[str, torch.Tensor]]:
    with safe_open(str(path), "pt") as handle:
        tokens = json.loads(handle.metadata()["tokens"])
    return tokens, load_file(path)


def load_meaning(path: Path) -> tuple[dict[str, list[str]], bool]:
    """The truth a rows file was saved with; ({}, False) for a file written before it was kept."""
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    return json.loads(metadata.get("meaning", "{}")), metadata.get("whole_words") == "True"


def word_ids(tokenizer, words: list[str], *, whole_words: bool) -> list[int | None]:
    """Each true word's base token id, None where it is not one token (module docstring: the rule)."""
    pieces = [tokenizer.encode((" " if whole_words else "") + w, add_special_tokens=False) for w in words]
    return [ids[0] if len(ids) == 1 else None for ids in pieces]


@dataclass(frozen=True)
class Recovery:
    """How one learned row reads its true words: per word, its rank and whether OMP chose it."""

    words: list[str]
    ids: list[int | None]  # None: not one base token, not scored
    ranks: list[int | None]
    chosen: list[bool | None]  # among the s = len(words) atoms of the row's OMP decomposition

    @property
    def recall(self) -> float | None:
        scored = [c for c in self.chosen if c is not None]
        return sum(scored) / len(scored) if scored else None


def centred(dictionary: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The recovery space (module docstring): the dictionary minus its mean row, and that mean (float64)."""
    atoms = dictionary.detach().double().cpu()
    mean = atoms.mean(dim=0)
    return atoms - mean, mean


def recover(row: torch.Tensor, dictionary: torch.Tensor, words: list[str], ids: list[int | None]) -> Recovery:
    """Ranks and OMP recall of the true words in the space given: callers pass centred() rows."""
    atoms, x = dictionary.detach().double().cpu(), row.detach().double().cpu()
    cosine = (atoms @ x) / (atoms.norm(dim=1) * x.norm()).clamp_min(1e-300)
    chosen = set(omp(atoms, x, len(words)).indices)
    ranks = [None if i is None else 1 + int((cosine > cosine[i]).sum()) for i in ids]
    return Recovery(words, ids, ranks, [None if i is None else i in chosen for i in ids])


def recovery_metrics(recoveries: list[Recovery]) -> dict[str, float]:
    """meaning_recall_at_s, meaning_rank_median, meaning_words_scored (module docstring: the rules)."""
    recalls = [r.recall for r in recoveries if r.recall is not None]
    ranks = [rank for r in recoveries for rank in r.ranks if rank is not None]
    values = {"meaning_words_scored": float(len(ranks))}
    if ranks:
        values |= {"meaning_recall_at_s": sum(recalls) / len(recalls), "meaning_rank_median": statistics.median(ranks)}
    return values


@torch.no_grad()
def meaning_recovery(base, model, data) -> dict[str, float]:
    """The recovery metrics of an adapted model's new input rows; {} where the task knows no meaning."""
    if not data.meaning:
        return {}
    old_vocab = len(base.tokenizer)
    rows = model.get_input_embeddings().weight[old_vocab : old_vocab + len(data.new_tokens)]
    return rows_recovery(base, rows, data.new_tokens, data.meaning, whole_words=data.whole_word_tokens)


@torch.no_grad()
def rows_recovery(base, rows, tokens: list[str], meaning: dict[str, list[str]], *, whole_words: bool) -> dict:
    """meaning_recovery of new input rows as a rows file keeps them (load_new_rows, load_meaning)."""
    dictionary, mean = centred(base.model.get_input_embeddings().weight[: len(base.tokenizer)])  # once
    recoveries = [
        recover(row.double().cpu() - mean, dictionary, words, word_ids(base.tokenizer, words, whole_words=whole_words))
        for row, words in ((row, meaning.get(token, [])) for row, token in zip(rows, tokens))
        if words
    ]
    return recovery_metrics(recoveries)


def describe_truth(recovery: Recovery, names: list[str]) -> str:
    """The truth beside a decomposition: each true word's rank by cosine, ✓ if OMP chose it, both in
    the centred space (module docstring), so the ✓ atoms need not be the printed decomposition's."""
    parts = [
        f"{w!r} not one token" if i is None else f"{w!r} ({names[i]!r}) rank {rank}{' ✓' if chosen else ''}"
        for w, i, rank, chosen in zip(recovery.words, recovery.ids, recovery.ranks, recovery.chosen)
    ]
    recall = "" if recovery.recall is None else f"; recall@{len(recovery.words)} {recovery.recall:.2f}"
    return "truth (centred): " + ", ".join(parts) + recall + f"; chance rank {(len(names) + 1) / 2:g}"


def describe_rows(
    rows: torch.Tensor,
    tokens: list[str],
    dictionary: torch.Tensor,
    names: list[str],
    *,
    s: int,
    k: int = 5,
    truth: dict[str, list[int | None]] | None = None,
    meaning: dict[str, list[str]] | None = None,
) -> list[str]:
    """One block per new token: its k nearest dictionary rows and its s-sparse OMP decomposition;
    with meaning (token → true words) and truth (token → their word_ids), a line of the truth."""
    lines = []
    dictionary = dictionary.detach().double().cpu()  # once, not once per row
    space, mean = centred(dictionary) if meaning else (None, None)
    for token, row in zip(tokens, rows):
        close = ", ".join(f"{names[i]!r} {cosine:.3f}" for i, cosine in nearest(dictionary, row, k))
        fit = omp(dictionary, row, s)
        terms = " ".join(
            f"{'−' if w < 0 else '+'} {abs(w):.3g}·{names[i]!r}" for i, w in zip(fit.indices, fit.weights)
        )
        lines.append(f"{token}  nearest (cosine): {close}")
        lines.append(f"{' ' * len(token)}  ≈ {terms.removeprefix('+ ')}   (residual {fit.residual:.3f})")
        if meaning and meaning.get(token):
            found = recover(row.double().cpu() - mean, space, meaning[token], truth[token])
            lines.append(f"{' ' * len(token)}  {describe_truth(found, names)}")
    return lines


def explain(store: ResultStore, run_id: str, *, s: int, session) -> str:
    matches = store.query(
        "SELECT run_id, config FROM runs WHERE run_id LIKE ? AND status = 'finished'", [run_id + "%"]
    )
    if len(matches) != 1:
        what = "no finished run" if matches.empty else f"{len(matches)} finished runs"
        raise ClbenchError(f"{what} with id {run_id!r} in {store.path}")
    run_id, config = matches.run_id[0], json.loads(matches.config[0])
    path = rows_file(run_id)
    if not path.exists():
        raise ClbenchError(
            f"run {run_id} has no stored rows at {path} (run in another cache dir or before rows were kept)"
        )
    tokens, rows = load_new_rows(path)
    base = session.base(config["model"])
    if base.fingerprint != config["model_fingerprint"]:
        raise ClbenchError(f"base model {config['model']!r} is not the one run {run_id} used (fingerprint differs)")
    names = base.tokenizer.convert_ids_to_tokens(list(range(len(base.tokenizer))))
    head = f"run {run_id}: {config['task']} × {config['method']} (seed {config['seed']}, {config['model']}), s = {s}"
    meaning, whole_words = load_meaning(path)
    truth = {t: word_ids(base.tokenizer, words, whole_words=whole_words) for t, words in meaning.items()}
    out = [head, "input rows over the old input rows:"]
    out += describe_rows(
        rows["input"],
        tokens,
        base.model.get_input_embeddings().weight[: len(names)],
        names,
        s=s,
        truth=truth,
        meaning=meaning,
    )
    if config["train_vocab"] == "full" and not torch.equal(rows["input"], rows["output"]):
        out += ["output rows over the old output rows:"]
        out += describe_rows(
            rows["output"], tokens, base.model.get_output_embeddings().weight[: len(names)], names, s=s
        )
    return "\n".join(out)
