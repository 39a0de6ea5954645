"""Generator for tasks/arithmetic.yaml.

Pairs (a, b) with a in 0–99, b in 0–9. A fixed n_test of them are held out for testing the new
operator, grouped by whether the local base model saw the pair with `*` ("seen") or not
("unseen"); the rest, shuffled, are the training pool (a run uses its first n_train).
"""

import random

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from clbench.arith import ADD_PAIRS, MUL_PAIRS, mul_pairs_seen
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
    rng = random.Random(params.data_seed)
    seen = mul_pairs_seen()

    def ex(a: int, op: str, b: int, value: int, group: str | None = None) -> Example:
        return Example(params.template.format(a=a, op=op, b=b), str(value), group)

    pairs = list(MUL_PAIRS)
    rng.shuffle(pairs)
    test, pool = pairs[: params.n_test], pairs[params.n_test :]
    # validation from the end of the pool: a run's first n_train training pairs are the same with or without it
    pool, validation = pool[: len(pool) - params.n_validation], pool[len(pool) - params.n_validation :]
    group = lambda a, b: "seen" if (a, b) in seen else "unseen"
    half = params.n_old_text // 2
    old_text = [ex(a, "+", b, a + b) for a, b in rng.sample(ADD_PAIRS, half)]
    old_text += [ex(a, "*", b, a * b) for a, b in rng.sample(MUL_PAIRS, params.n_old_text - half)]
    old_skill = [ex(a, "+", b, a + b) for a, b in rng.sample(ADD_PAIRS, params.n_old_skill)]
    # replay: expressions outside old_text and old_skill, so rehearsal never sees what is evaluated
    evaluated = {e.prompt for e in old_text + old_skill}
    replay = [ex(a, "+", b, a + b) for a, b in ADD_PAIRS] + [ex(a, "*", b, a * b) for a, b in MUL_PAIRS]
    replay = [e for e in replay if e.prompt not in evaluated]
    rng.shuffle(replay)
    return TaskData(
        new_tokens=[params.operator],
        train=[ex(a, params.operator, b, a * b) for a, b in pool],
        target_test=[ex(a, params.operator, b, a * b, group(a, b)) for a, b in test],
        old_text=[e.prompt + e.completion for e in old_text],
        old_skill=old_skill,
        replay_text=[e.prompt + e.completion for e in replay[: params.n_replay]],
        validation=[ex(a, params.operator, b, a * b, group(a, b)) for a, b in validation],
        validation_old_text=[e.prompt + e.completion for e in replay[params.n_replay :][: params.n_validation_old]],
        # the oracle reads `*`, the operation the new operator stands for (the paper's base `a*b` row)
        target_oracle=[ex(a, "*", b, a * b, group(a, b)) for a, b in test],
    )
