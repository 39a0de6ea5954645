"""Generator for tasks/sequential.yaml: new operators taught one after another.

Each stage adds its own operator token standing for an operation the arithmetic base knows
(`*` or `+`), with its own held-out operand pairs; the old text and old-skill probe are the
arithmetic task's (addition and multiplication written with the old vocabulary).
"""

import random

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from clbench import arith
from clbench.data import Example, Stage, TaskData
from clbench.errors import ClbenchError

OPERATIONS = {"*": (arith.MUL_PAIRS, lambda a, b: a * b), "+": (arith.ADD_PAIRS, lambda a, b: a + b)}


class StageParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z][a-z0-9]*$")
    token: str
    means: str = Field(pattern=r"^[*+]$", description="the operation the new token stands for")


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stages: list[StageParams] = Field(min_length=1)
    template: str = "{a}{op}{b}="
    n_test: PositiveInt = 200
    n_pool: PositiveInt = 500
    n_old_skill: PositiveInt = 500
    n_old_text: PositiveInt = 500
    n_replay: int = 1000
    data_seed: int = 0


def stage(spec: StageParams, params: Params, index: int) -> Stage:
    pairs, value = OPERATIONS[spec.means]
    pairs = list(pairs)
    random.Random(f"{params.data_seed}-{index}").shuffle(pairs)  # each stage its own split
    ex = lambda a, b: Example(params.template.format(a=a, op=spec.token, b=b), str(value(a, b)), group=spec.name)
    test, pool = pairs[: params.n_test], pairs[params.n_test : params.n_test + params.n_pool]
    return Stage(spec.name, [spec.token], [ex(a, b) for a, b in pool], [ex(a, b) for a, b in test])


def build(params: Params, tokenizer) -> TaskData:
    if len({s.name for s in params.stages}) != len(params.stages):
        raise ClbenchError("sequential: stage names must be distinct")
    stages = [stage(spec, params, i) for i, spec in enumerate(params.stages)]
    old = arith.draw(  # the arithmetic task's old text for the same seed
        params.template,
        data_seed=params.data_seed,
        n_old_text=params.n_old_text,
        n_old_skill=params.n_old_skill,
        n_replay=params.n_replay,
    )
    return TaskData(
        new_tokens=[t for s in stages for t in s.new_tokens],
        train=[e for s in stages for e in s.train],
        target_test=[e for s in stages for e in s.target_test],
        old_text=old.old_text,
        old_skill=old.old_skill,
        replay_text=old.replay_text,
        stages=stages,
        meaning={s.token: [s.means] for s in params.stages},
        # an equation ends after its answer: the eos says the answer is complete ("12" is not "123")
        eos_is_content=True,
        # each equation a sequence of its own, as the base learned them: no running text to give it context
        old_text_break=None,
    )
