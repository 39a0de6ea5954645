"""The base's loss on a task's old text, position by position: what the rule before the content rule scored
(bos + text + eos, every position) against what it scores now (docs/metrics.md "What is scored").

    python bench/position_profile.py --task pseudowords --profile cpu [--model builtin:smollm2-135m]

Prints one line per kind of position: the first token predicted from bos alone, the appended eos, every other
position, and the two rules' means. Computes only: nothing is stored.
"""

from __future__ import annotations

import argparse

import torch

from clbench.data import TRAINING, encode_texts
from clbench.session import Session
from clbench.taskspec import load_tasks


def profile(model, encoded) -> dict[str, torch.Tensor]:
    """Per text, the NLL of its first target (from bos alone), its last (the appended eos) and its others."""
    first, last, rest = [], [], []
    with torch.inference_mode():
        for e in encoded:
            ids = torch.tensor([e.ids])
            logits = model(input_ids=ids).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none").double()
            first.append(nll[0])
            last.append(nll[-1])
            rest.append(nll[1:-1])
    return {"first": torch.stack(first), "eos": torch.stack(last), "rest": torch.cat(rest)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="pseudowords")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    task = load_tasks().get(args.task)
    model, _, params = task.resolved(args.profile)
    session = Session(device="cpu")
    base = session.base(args.model or model)
    data = session.data(task, params, base)
    encoded = encode_texts(base.tokenizer, data.old_text, base.max_length, TRAINING)
    p = profile(base.model, encoded)
    n = len(encoded)
    every = torch.cat([p["first"], p["eos"], p["rest"]])
    print(f"{args.task} --profile {args.profile}, {base.ref}: {n} old texts, {len(every) / n:.1f} positions each")
    print(f"  first token from bos alone  {p['first'].mean():.3f}")
    print(f"  appended eos                {p['eos'].mean():.3f}")
    print(f"  every other position        {p['rest'].mean():.3f}   (the content rule's old-text loss)")
    print(f"  every position (rule before) {every.mean():.3f}")


if __name__ == "__main__":
    main()
