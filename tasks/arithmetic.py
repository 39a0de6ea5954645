"""Generator for tasks/arithmetic.yaml.

Pairs (a, b) with a in 0–99, b in 0–9. A fixed n_test of them are held out for testing the new
operator, grouped by whether the local base model saw the pair with `*` ("seen") or not
("unseen"); the rest, shuffled, are the training pool (a run uses its first n_train). The pairs and
the old text are clbench.arith's (shared with tasks/sequential.py).
"""

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

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
    n_validation: int = Field(100, ge=0, description="training-pool pairs held out for `clbench tune`")
    n_validation_old: int = Field(100, ge=0, description="old-vocabulary expressions for `clbench tune`")
    data_seed: int = 0


def build(params: Params, tokenizer) -> TaskData:
    drawn = arith.draw(
        params.template,
        data_seed=params.data_seed,
        n_old_text=params.n_old_text,
        n_old_skill=params.n_old_skill,
        n_replay=params.n_replay,
        n_validation_old=params.n_validation_old,
    )
    seen = arith.mul_pairs_seen()
    group = lambda a, b: "seen" if (a, b) in seen else "unseen"
    ex = lambda a, b, group=None, op=params.operator: Example(
        params.template.format(a=a, op=op, b=b), str(a * b), group
    )
    test, pool = drawn.mul_pairs[: params.n_test], drawn.mul_pairs[params.n_test :]
    # validation from the end of the pool: a run's first n_train training pairs are the same with or without it
    pool, validation = pool[: len(pool) - params.n_validation], pool[len(pool) - params.n_validation :]
    return TaskData(
        new_tokens=[params.operator],
        train=[ex(a, b) for a, b in pool],
        target_test=[ex(a, b, group(a, b)) for a, b in test],
        old_text=drawn.old_text,
        old_skill=drawn.old_skill,
        replay_text=drawn.replay_text,
        validation=[ex(a, b, group(a, b)) for a, b in validation],
        validation_old_text=drawn.validation_old_text,
        # the oracle reads `*`, the operation the new operator stands for (the paper's base `a*b` row)
        target_oracle=[ex(a, b, group(a, b), op="*") for a, b in test],
        train_oracle=[ex(a, b, op="*") for a, b in pool],
        # an equation ends after its answer: the eos says the answer is complete ("12" is not "123")
        eos_is_content=True,
        # each equation a sequence of its own, as the base learned them: no running text to give it context
        old_text_break=None,
    )
