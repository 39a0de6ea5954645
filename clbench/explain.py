"""What a learned new token means in terms of old ones: `clbench explain RUN_ID`.

Every finished run stores its new tokens' learned rows (input and output embeddings) in
<cache>/rows/<run_id>.safetensors. explain() reloads the run's base model by its recorded
reference and reads each new input row as a token-to-dictionary mapping over the old input
rows: its nearest old tokens by cosine, and its best s-sparse decomposition (OMP) with the
relative residual, e.g.  <spec> ≈ 0.61·'*' + 0.20·'3' − …  (residual 0.42).
A run that trained its new output rows (training softmax over V ∪ U) gets the same reading of
those over the old output rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from clbench.cache import cache_root
from clbench.errors import ClbenchError
from clbench.sparse import nearest, omp


def rows_file(run_id: str) -> Path:
    return cache_root() / "rows" / f"{run_id}.safetensors"


@torch.no_grad()
def save_new_rows(path: Path, model, old_vocab: int, tokens: list[str]) -> None:
    new = slice(old_vocab, old_vocab + len(tokens))
    rows = {
        "input": model.get_input_embeddings().weight[new].detach().float().cpu().clone(),
        "output": model.get_output_embeddings().weight[new].detach().float().cpu().clone(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    save_file(rows, staging, metadata={"tokens": json.dumps(tokens)})
    staging.replace(path)  # a reader never sees half a file


def load_new_rows(path: Path) -> tuple[list[str], dict[str, torch.Tensor]]:
    with safe_open(str(path), "pt") as handle:
        tokens = json.loads(handle.metadata()["tokens"])
    return tokens, load_file(path)


def describe_rows(
    rows: torch.Tensor, tokens: list[str], dictionary: torch.Tensor, names: list[str], *, s: int, k: int = 5
) -> list[str]:
    """One block per new token: its k nearest dictionary rows and its s-sparse OMP decomposition."""
    lines = []
    for token, row in zip(tokens, rows):
        close = ", ".join(f"{names[i]!r} {cosine:.3f}" for i, cosine in nearest(dictionary, row, k))
        fit = omp(dictionary, row, s)
        terms = " ".join(
            f"{'−' if w < 0 else '+'} {abs(w):.3g}·{names[i]!r}" for i, w in zip(fit.indices, fit.weights)
        )
        lines.append(f"{token}  nearest (cosine): {close}")
        lines.append(f"{' ' * len(token)}  ≈ {terms.removeprefix('+ ')}   (residual {fit.residual:.3f})")
    return lines


def explain(store, run_id: str, *, s: int, session) -> str:
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
    out = [head, "input rows over the old input rows:"]
    out += describe_rows(rows["input"], tokens, base.model.get_input_embeddings().weight[: len(names)], names, s=s)
    if config["train_vocab"] == "full" and not torch.equal(rows["input"], rows["output"]):
        out += ["output rows over the old output rows:"]
        out += describe_rows(
            rows["output"], tokens, base.model.get_output_embeddings().weight[: len(names)], names, s=s
        )
    return "\n".join(out)
