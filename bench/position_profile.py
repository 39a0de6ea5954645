"""A task's old text, position by position, in its two readings (docs/metrics.md "What is scored"): each passage
alone (bos + text + eos, every position, as task versions 1 and 2 read it) and as running text (each passage after
the one before it and the task's old_text_break, as version 3 scores it); with --method, the same for the model that
method adapts, beside the base's, and the change at each kind of position.

    python bench/position_profile.py --task pseudowords --profile cpu [--model builtin:smollm2-135m]
    python bench/position_profile.py --task xling-es --profile cpu --method nonew \
        --param corpus=dataset-build:eng --set lr=1e-4 --budget steps=60 --budget batch_size=8 --seed 0

Prints, per reading, one line per kind of position: alone, the first token predicted from bos alone, the appended eos,
the first content positions one by one (their context is a word or two: part of what they measure is the window's
start) and every other position; running, the passage's first positions one by one and every other; then each
rule's mean. The adapted model is trained once under clbench's protocol into a
scratch store and read over the old vocabulary, as forgetting_oldvocab reads it. Computes only: nothing is stored.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from clbench.cli import parse_options
from clbench.data import TRAINING, encode_texts, scored
from clbench.errors import ClbenchError
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


def running(model, encoded, vocab: int) -> dict[str, torch.Tensor]:
    """Per passage read as running text (data.encode_texts under a break), the NLL over the first `vocab` logits of
    its first EARLY + 1 tokens one by one, after the passage before it, and of its others."""
    kinds = {f"running {k}": [] for k in range(EARLY + 1)} | {"running rest": []}
    with torch.inference_mode():
        for e in encoded:
            ids = torch.tensor([e.ids])
            logits = model(input_ids=ids).logits[0, e.loss_from - 1 : -1, :vocab].float()
            nll = torch.nn.functional.cross_entropy(logits, ids[0, e.loss_from :], reduction="none").double()
            for k in range(EARLY + 1):
                kinds[f"running {k}"].append(nll[k : k + 1])
            kinds["running rest"].append(nll[EARLY + 1 :])
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
    try:
        profile_task()
    except ClbenchError as error:
        sys.exit(f"position_profile: error: {error}")


def profile_task() -> None:
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
    for pairs, flag in ((args.set, "--set"), (args.param, "--param"), (args.budget, "--budget")):
        parse_options(pairs, flag)  # malformed: one line before a model is loaded
    task = load_tasks().get(args.task)
    model, _, params = task.resolved(args.profile)
    session = Session(device="cpu")
    base = session.base(args.model or model)
    data = session.data(task, params, base)  # the old text does not depend on --param's training corpus
    encoded = encode_texts(base.tokenizer, data.old_text, base.max_length, TRAINING)
    cut = data.old_text_break if data.old_text_break is not None else "\n\n"  # a task without one: as text's
    as_running = encode_texts(base.tokenizer, data.old_text, base.max_length, scored(False, cut))
    vocab = len(base.tokenizer)
    read = lambda model: profile(model, encoded, vocab) | running(model, as_running, vocab)
    rows = {"base": read(base.model)}
    if args.method:
        rows[args.method] = read(adapted(task, args, session))
    n = len(encoded)
    print(f"{args.task} --profile {args.profile}, {base.ref}: {n} old texts, mean loss by kind of position")
    print(f"{'position':<34}" + "".join(f"{name:>10}" for name in rows) + ("    change" if args.method else ""))
    for kind in rows["base"]:
        means = [p[kind].mean().item() for p in rows.values()]
        change = f"{means[1] - means[0]:>+10.3f}" if args.method else ""
        print(f"{kind:<34}" + "".join(f"{m:>10.3f}" for m in means) + change)
    rules = (
        ("alone, all but first and eos (v2)", ["content"]),
        ("alone, every position (v1)", ["first", "eos", "content"]),
        ("running text (v3)", ["running"]),
    )
    for label, kinds in rules:
        means = [mean_of(p, kinds) for p in rows.values()]
        change = f"{means[1] - means[0]:>+10.3f}" if args.method else ""
        print(f"{label:<34}" + "".join(f"{m:>10.3f}" for m in means) + change)


def mean_of(p: dict[str, torch.Tensor], prefixes: list[str]) -> float:
    """The mean over every position of the kinds whose name starts with one of `prefixes`, 'rest' (alone) counted
    as content."""
    chosen = [
        v for k, v in p.items() if any(k.startswith(x) for x in prefixes) or (k == "rest" and "content" in prefixes)
    ]
    return torch.cat(chosen).mean().item()


if __name__ == "__main__":
    main()
