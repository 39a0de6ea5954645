"""distill (baselines/distill.py) and its teacher (clbench/teacher.py) on a tiny in-process model.

python -m pytest -q tests/test_distill.py
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from clbench import teacher
from clbench.arith import char_tokenizer
from clbench.data import Encoded, Example, Stage, TaskData, encode_examples, encode_texts
from clbench.errors import ClbenchError
from clbench.expand import expand
from clbench.method import methods
from clbench.protocol import adapt_and_evaluate, plan
from clbench.session import Session
from clbench.spec import RunSpec
from clbench.taskspec import Budget, builtin_task_dir, load_tasks
from clbench.testing import tiny_base, tiny_plan
from clbench.train import train

LR = 1e-2
MUL = [(3, 4), (7, 2), (12, 5), (9, 9), (40, 3), (6, 6)]


def spec_data() -> TaskData:
    """`<spec>` stands for the two characters `*+` in each training example (train_oracle): a teacher reading
    one position longer than the student's, so the new token is compared with the second."""
    ex = lambda a, b, op="<spec>": Example(f"{a}{op}{b}=", str(a * b))
    return TaskData(
        new_tokens=["<spec>"],
        train=[ex(a, b) for a, b in MUL],
        target_test=[ex(2, 3), ex(8, 7)],
        old_text=["1+2=3", "4*5=20", "33+9=42"],
        train_oracle=[ex(a, b, "*+") for a, b in MUL],
        old_text_break=None,  # equations, each alone after bos (the character vocabulary has no "\n")
    )


def set_up(tied: bool):
    """The expanded model with distill's adapter and teacher, as the protocol makes them."""
    base = tiny_base(tied)
    model, tokenizer = copy.deepcopy(base.model), copy.deepcopy(base.tokenizer)
    data = spec_data()
    expansion = expand(model, tokenizer, data.new_tokens, init="random", seed=0)
    spec = methods().get("distill")
    adapter = spec.setup(model, expansion, spec.config())
    student = encode_examples(tokenizer, data.train, 32)
    stage = Stage("", data.new_tokens, data.train, data.target_test)
    adapter.teacher(teacher.readings(base.tokenizer, data, stage, student, 32), base.tokenizer.pad_token_id)
    return base, model, adapter, student


def by_hand(base, student, row: torch.Tensor, out_row: torch.Tensor):
    """The distillation loss and the next-token loss of one batch of every example, without clbench's hooks,
    readings or padding: each example alone through the base, the new row spliced into its input embeddings
    and out_row into its logits; the teacher is the base reading `*+` where the student reads `<spec>`."""
    old = len(base.tokenizer)
    squared, positions, nll, targets = 0.0, 0, 0.0, 0
    for example in student:
        ids = torch.tensor(example.ids)
        where = int((ids >= old).nonzero())  # the one <spec>
        table = base.model.get_input_embeddings().weight
        embeds = torch.cat([table[ids[:where]], row[None], table[ids[where + 1 :]]])
        hidden = base.model(inputs_embeds=embeds[None], output_hidden_states=True).hidden_states[-1][0]
        read = torch.cat([ids[:where], torch.tensor([15, 14]), ids[where + 1 :]])  # `*` `+`
        with torch.no_grad():
            taught = base.model(input_ids=read[None], output_hidden_states=True).hidden_states[-1][0]
        # every student position; <spec> with `+`, the later ones one further on
        at = [i if i < where else i + 1 for i in range(len(ids))]
        squared = squared + ((hidden - taught[at]) ** 2).sum()
        positions += len(ids) * hidden.shape[-1]
        # the full softmax over the completion and eos; the head reads the hidden states detached
        head = torch.cat([base.model.get_output_embeddings().weight, out_row[None]])
        logits = hidden.detach()[example.loss_from - 1 : -1] @ head.T
        nll = nll + F.cross_entropy(logits, ids[example.loss_from :], reduction="sum")
        targets += len(ids) - example.loss_from
    return squared / positions, nll / targets


def adam_first_step(gradient: torch.Tensor, clip: float) -> torch.Tensor:
    """AdamW's first update (bias-corrected, no decay) of a gradient clipped by the factor `clip`."""
    clipped = gradient * clip
    return -LR * clipped / (clipped.abs() + 1e-8)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_one_step_moves_the_new_row_towards_the_teachers_hidden_states(tied):
    base, model, adapter, student = set_up(tied)
    row = adapter.rows.weight.detach().clone().requires_grad_(True)
    # tied: the output row is the input row, read detached; untied: its own
    out_row = row[0].detach() if tied else adapter.out_rows.detach()[0].clone().requires_grad_(True)
    distilled, next_token = by_hand(base, student, row[0], out_row)
    (row_gradient,) = torch.autograd.grad(distilled, row)
    out_gradient = None if tied else torch.autograd.grad(next_token, out_row)[0]

    seen = []

    def penalty():
        seen.append(adapter.penalty())
        return seen[-1]

    result = train(
        model,
        adapter.param_groups,
        student,
        steps=1,
        batch_size=len(student),  # one batch of every example
        lr=LR,
        seed=0,
        pad_id=base.tokenizer.pad_token_id,
        penalty=penalty,
    )
    # the loss distill trains on equals the hand-made one; the logged loss is the next-token loss
    assert seen[0].item() == pytest.approx(distilled.item(), rel=1e-6)
    assert result.final_loss == pytest.approx(next_token.item(), rel=1e-6)
    # one AdamW step on exactly these gradients, clipped together to norm 1: the distillation loss moves the input
    # row alone, the next-token loss the untied output row alone
    norm = torch.cat([row_gradient.flatten(), *([] if tied else [out_gradient])]).norm().item()
    clip = min(1.0, 1.0 / (norm + 1e-6))
    torch.testing.assert_close(adapter.rows.weight - row, adam_first_step(row_gradient, clip), rtol=1e-4, atol=1e-9)
    if not tied:
        torch.testing.assert_close(
            adapter.out_rows[0] - out_row, adam_first_step(out_gradient, clip), rtol=1e-4, atol=1e-9
        )
    # and the step brought the student nearer the teacher
    after, _ = by_hand(base, student, adapter.rows.weight.detach()[0], out_row.detach())
    assert after.item() < distilled.item() - 1e-3 * distilled.item()


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_old_vocabulary_logits_are_bit_identical_and_forgetting_is_zero(tied):
    base, data = tiny_base(tied), spec_data()
    spec, seen = methods().get("distill"), {}

    def setup(model, expansion, config):  # the protocol's own setup call, observed
        seen["adapter"] = spec.setup(model, expansion, config)
        seen["model"] = model
        return seen["adapter"]

    budget = Budget(n_train=6, steps=4, batch_size=3, eval_batch_size=8)
    values = adapt_and_evaluate(
        tiny_plan(base, data, dataclasses.replace(spec, setup=setup), budget), session=Session()
    ).values
    assert values["forgetting_oldvocab"] == 0.0
    model, adapter, old = seen["model"], seen["adapter"], len(base.tokenizer)
    text = torch.tensor([e.ids for e in encode_texts(base.tokenizer, ["4*5=20", "7+8=15"], 32)])
    with torch.no_grad():
        adapted, original = model(input_ids=text).logits, base.model(input_ids=text).logits
    assert adapted.shape[-1] == old + 1 and torch.equal(adapted[..., :old], original)
    # what was trained is in the model: tied, the one new row is the output row too
    assert torch.equal(model.get_input_embeddings().weight[old], adapter.rows.weight[0].detach())
    output_row = adapter.rows.weight if tied else adapter.out_rows
    assert torch.equal(model.get_output_embeddings().weight[old], output_row[0].detach())


def test_the_teacher_reads_each_token_as_the_task_knows_it():
    tokenizer = tiny_base(False).tokenizer
    old = len(tokenizer)
    train = [Example("12<spec>5=", "60")]
    student = [[1, 5, 6, old, 9, 16, 10, 4, 2]]  # <bos> 1 2 <spec> 5 = 6 0 <eos>
    stage = lambda data: Stage("", data.new_tokens, data.train, [])
    plain = TaskData(new_tokens=["<spec>"], train=train, target_test=train, old_text=["1"])
    cases = {
        # its own pieces: six unknown characters, <spec> compared with the last
        "pieces": (plain, [1, 5, 6, 3, 3, 3, 3, 3, 3, 9, 16, 10, 4, 2], [0, 1, 2, 8, 9, 10, 11, 12, 13]),
        "meaning": (dataclasses.replace(plain, meaning={"<spec>": ["*"]}), [1, 5, 6, 15, 9, 16, 10, 4, 2], list(range(9))),
        "train_oracle": (
            dataclasses.replace(plain, train_oracle=[Example("12*+5=", "60")], meaning={"<spec>": ["*", "+"]}),
            [1, 5, 6, 15, 14, 9, 16, 10, 4, 2],
            [0, 1, 2, 4, 5, 6, 7, 8, 9],
        ),
    }  # fmt: skip
    for kind, (data, read, at) in cases.items():
        assert teacher.source(data) == kind
        (reading,) = teacher.readings(tokenizer, data, stage(data), [Encoded(student[0], loss_from=7)], 32)
        assert reading == teacher.Reading(student[0], read, list(range(9)), at), kind


def test_a_reading_that_differs_in_one_span_compares_its_head_tail_and_last_positions():
    # 9 9 <u> 7 8 against 9 9 1 2 3 7 8; and a teacher that reads the student's span as nothing
    assert teacher.aligned([9, 9, 50, 7, 8], [9, 9, 1, 2, 3, 7, 8]) == teacher.Reading(
        [9, 9, 50, 7, 8], [9, 9, 1, 2, 3, 7, 8], [0, 1, 2, 3, 4], [0, 1, 4, 5, 6]
    )
    assert teacher.aligned([9, 50, 8], [9, 8]).student_at == [0, 2]
    assert teacher.aligned([9, 8], [9, 8]).teacher_at == [0, 1]


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"meaning": {"<spec>": ["*", "+"]}},
            "task 'refused': new token '<spec>' stands for 2 words (meaning) and the task has no train_oracle saying "
            "which one each training example means: a distilling method's teacher cannot read it",
        ),
        (
            {"target_oracle": [Example("2*3=", "6")]},
            "task 'refused' says what its new tokens stand for in its target examples (target_oracle) but not in its "
            "training examples (no train_oracle, no meaning): a distilling method's teacher cannot read them",
        ),
    ],
)
def test_a_task_that_cannot_say_what_a_token_stands_for_is_refused_before_a_run(fields, message, tmp_path):
    data = dataclasses.replace(spec_data(), train_oracle=[], target_test=[Example("2<spec>3=", "6")], **fields)
    generator = tmp_path / "refused.py"
    generator.write_text(
        "from pydantic import BaseModel\nfrom clbench.data import Example, Stage, TaskData\n"
        f"class Params(BaseModel):\n    pass\ndef build(params, tokenizer):\n    return {data!r}\n"
    )
    (tmp_path / "refused.yaml").write_text(
        f"name: refused\nversion: 1\ndescription: refused\ngenerator: {generator}:build\nmodel: tiny\n"
        "budget: {n_train: 6, steps: 1, batch_size: 2}\n"
    )
    session = Session()
    session.bases["tiny"] = tiny_base(tied=True)
    task = load_tasks([tmp_path]).get("refused")
    with pytest.raises(ClbenchError) as refused:
        plan_of(task, "distill", session)
    assert str(refused.value) == message
    assert "teacher" not in plan_of(task, "et", session).config  # et reads no teacher


def plan_of(task, method: str, session: Session):
    return plan(RunSpec.make(task.name, method), task, methods().get(method), session=session)


def test_the_config_records_what_the_teacher_read(tmp_path):
    session = Session()
    session.bases["tiny"] = tiny_base(tied=True)
    (tmp_path / "arith.yaml").write_text(
        "name: arith\nversion: 1\ndescription: arithmetic\n"
        f"generator: {builtin_task_dir() / 'arithmetic.py'}:build\nmodel: tiny\n"
        "budget: {n_train: 6, steps: 1, batch_size: 2}\nparams: {n_test: 4, n_old_skill: 4, n_old_text: 4, n_replay: 4}\n"
    )
    planned = plan_of(load_tasks([tmp_path]).get("arith"), "distill", session)
    assert planned.config["teacher"] == "train_oracle"
    assert planned.data.train_oracle[0] == dataclasses.replace(
        planned.data.train[0], prompt=planned.data.train[0].prompt.replace("<spec>", "*")
    )


def test_the_pseudowords_teacher_reads_the_word_each_training_sentence_lost():
    task = load_tasks().get("pseudowords")
    data = task.build(task.resolved()[2], char_tokenizer())
    assert len(data.train_oracle) == len(data.train) and teacher.source(data) == "train_oracle"
    read = {}
    for example, oracle in zip(data.train, data.train_oracle):
        *context, pseudo = example.prompt.split()
        assert oracle.prompt.split()[:-1] == context and oracle.completion == example.completion
        read.setdefault(pseudo, set()).add(oracle.prompt.split()[-1])
    # the word each sentence held: one of the pseudo-word's s = 2 words, both where the training pool has both
    assert read.keys() == data.meaning.keys() and all(read[p] <= set(data.meaning[p]) for p in read)
    assert sorted(len(words) for words in read.values()) == [1, 1, 2, 2, 2, 2, 2, 2]
