"""Per-example records of a run (`clbench run --log-samples`): the `samples` table (clbench/store.py).

One row per target and old-text example: its summed NLL and scored tokens under both softmaxes (the
numbers target_loss and forgetting_* average), and the greedy predictions at its first completion
position next to the token expected there. Old-text rows carry the base's NLL on the same token
sequences, so each example's forgetting can be read off (adapted − base, per token).
"""

from __future__ import annotations

from clbench.data import Encoded, Example
from clbench.evaluate import Scores

SETS = ("target", "old_text")


def example_rows(
    set_name: str,
    examples: list[Example],
    encoded: list[Encoded],
    scores: Scores,
    tokenizer,
    base: Scores | None = None,
) -> list[tuple]:
    """(eval_set, example, prompt, completion, nll_old, n_old, nll_full, n_full, base_nll_old, expected,
    prediction_old, prediction_full) per example, in the set's order; base: the base's scores of the
    same encoded examples (old text), else base_nll_old is None."""
    token = lambda i: tokenizer.decode([i]) if i >= 0 else None  # -1: an example with no scored position
    return [
        (
            set_name,
            i,
            example.prompt,
            example.completion,
            float(scores.example_nll_old[i]),
            int(scores.example_n_old[i]),
            float(scores.example_nll_full[i]),
            int(scores.example_n_full[i]),
            float(base.example_nll_old[i]) if base is not None else None,
            token(e.ids[e.loss_from]),
            token(int(scores.first_token_old[i])),
            token(int(scores.first_token_full[i])),
        )
        for i, (example, e) in enumerate(zip(examples, encoded))
    ]
