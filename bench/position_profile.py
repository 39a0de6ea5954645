"""A task's old text, position by position: what the rule before the content rule scored (bos + text + eos,
every position) against what it scores now (docs/metrics.md "What is scored"); with --method, the same for the
model that method adapts, beside the base's, and the change at each kind of position.

    python bench/position_profile.py --task pseudowords --profile cpu [--model builtin:smollm2-135m]
    python bench/position_profile.py --task xling-es --profile cpu --method nonew \
        --param corpus=dataset-build:eng --set lr=1e-4 --budget steps=60 --budget batch_size=8 --seed 0

Prints one line per kind of position: the first token predicted from bos alone, the appended eos, the first
content positions one by one (their context is a word or two: part of what they measure is the window's start),
every other position, and the two rules' means. The adapted model is trained once under clbench's protocol into a
scratch store and read over the old vocabulary, as forgetting_oldvocab reads it. Computes only: nothing is stored.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from clbench.cli import parse_options
from clbench.data import TRAINING, encode_texts
from clbench.method import methods
from clbench.protocol import run_one
from clbench.session import Session
from clbench.store import Store
from clbench.taskspec import load_tasks

EARLY = 3  # content positions reported one by one after the first


def profile(model, encoded, vocab: int) -> dict[str, torch.Tensor]:
    """Per text, the NLL over the first `vocab` logits of its first target (from bos alone), its last (the appended
    eos), its next EARLY targets one by one and its others."""
    kinds = {"first": [], "eos": [], "rest": []} | {f"content {k + 1}": [] for k in range(EARLY)}
    with torch.inference_mode():
        for e in encoded:
            ids = torch.tensor([e.ids])
            logits = model(input_ids=ids).logits[0, :-1, :vocab].float()
            nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none").double()
            kinds["first"].append(nll[:1])
            kinds["eos"].append(nll[-1:])
            content = nll[1:-1]
            for k in range(EARLY):
                kinds[f"content {k + 1}"].append(content[k : k + 1])
            kinds["rest"].append(content[EARLY:])
    return {kind: torch.cat(values) for kind, values in kinds.items()}


def adapted(task, args, session: Session):
    """The model args.method adapts (one seed, under the protocol), captured in memory."""
    captured = {}
    with tempfile.TemporaryDirectory(prefix="clbench-profile-") as scratch:
        outcome = run_one(
            task,
            methods().get(args.method),
            seed=args.seed,
            store=Store(Path(scratch) / "scratch.duckdb"),
            session=session,
            on_adapted=lambda base, data, model, tokenizer: captured.update(model=model),
            profile=args.profile,
            model=args.model,
            options=parse_options(args.set),
            param_overrides=parse_options(args.param, "--param"),
            budget_overrides=parse_options(args.budget, "--budget"),
        )
    print(f"{args.method} seed {args.seed}: {outcome.status}; forgetting_oldvocab "
          f"{outcome.metrics.get('forgetting_oldvocab', float('nan')):.4f}")  # fmt: skip
    return captured["model"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="pseudowords")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--model", default=None)
    parser.add_argument("--method", default=None, help="also profile the model this method adapts")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a method option")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="a task parameter")
    parser.add_argument("--budget", action="append", default=[], metavar="KEY=VALUE", help="a budget key")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    task = load_tasks().get(args.task)
    model, _, params = task.resolved(args.profile)
    session = Session(device="cpu")
    base = session.base(args.model or model)
    data = session.data(task, params, base)  # the old text does not depend on --param's training corpus
    encoded = encode_texts(base.tokenizer, data.old_text, base.max_length, TRAINING)
    vocab = len(base.tokenizer)
    rows = {"base": profile(base.model, encoded, vocab)}
    if args.method:
        rows[args.method] = profile(adapted(task, args, session), encoded, vocab)
    n = len(encoded)
    print(f"{args.task} --profile {args.profile}, {base.ref}: {n} old texts, mean loss by kind of position")
    print(f"{'position':<34}" + "".join(f"{name:>10}" for name in rows) + ("    change" if args.method else ""))
    for kind in rows["base"]:
        means = [p[kind].mean().item() for p in rows.values()]
        change = f"{means[1] - means[0]:>+10.3f}" if args.method else ""
        print(f"{kind:<34}" + "".join(f"{m:>10.3f}" for m in means) + change)
    for label, kinds in (("content rule (all but first, eos)", ["content"]), ("rule before (every position)", None)):
        means = [mean_of(p, kinds) for p in rows.values()]
        change = f"{means[1] - means[0]:>+10.3f}" if args.method else ""
        print(f"{label:<34}" + "".join(f"{m:>10.3f}" for m in means) + change)


def mean_of(p: dict[str, torch.Tensor], prefixes: list[str] | None) -> float:
    """The mean over every position of the kinds whose name starts with one of `prefixes` (None: every kind),
    with 'rest' counted as content."""
    chosen = [v for k, v in p.items() if prefixes is None or k == "rest" or any(k.startswith(x) for x in prefixes)]
    return torch.cat(chosen).mean().item()


if __name__ == "__main__":
    main()
