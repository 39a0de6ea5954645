"""Generator for tasks/arithmetic.yaml.

Pairs (a, b) with a in 0–99, b in 0–9. A fixed n_test of them are held out for testing the new
operator, grouped by whether the local base model saw the pair with `*` ("seen") or not
("unseen"); the rest, shuffled, are the training pool (a run uses its first n_train). The pairs and
the old text are clbench.arith's (shared with tasks/sequential.py).
"""

from pydantic import BaseModel, ConfigDict, PositiveInt

from clbench import arith
from clbench.data import Example, TaskData


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    operator: str = "<spec>"
    template: str = "{a}{op}{b}="  # the prompt; the completion is the value
    n_test: PositiveInt = 300
    n_old_skill: PositiveInt = 500
    n_old_text: PositiveInt = 500
    n_replay: int = 1000
    data_seed: int = 0


def build(params: Params, tokenizer) -> TaskData:
    drawn = arith.draw(
        params.template,
        data_seed=params.data_seed,
        n_old_text=params.n_old_text,
        n_old_skill=params.n_old_skill,
        n_replay=params.n_replay,
    )
    seen = arith.mul_pairs_seen()
    ex = lambda a, b, group=None: Example(params.template.format(a=a, op=params.operator, b=b), str(a * b), group)
    test, pool = drawn.mul_pairs[: params.n_test], drawn.mul_pairs[params.n_test :]
    return TaskData(
        new_tokens=[params.operator],
        train=[ex(a, b) for a, b in pool],
        target_test=[ex(a, b, "seen" if (a, b) in seen else "unseen") for a, b in test],
        old_text=drawn.old_text,
        old_skill=drawn.old_skill,
        replay_text=drawn.replay_text,
    )
