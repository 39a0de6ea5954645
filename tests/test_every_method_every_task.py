"""Every registered method on every registered task, through the one protocol, on a tiny model.

The real bases make this hours of CPU; a tiny tied Llama over the character vocabulary runs each
pair in seconds and still exercises what differs between tasks: stages, whole-word tokens,
replay text, old-skill probes, byte counts. Each pair must finish (so with finite target and
forgetting numbers: a non-finite one fails the run), report those of the task-dependent metrics
its task's data calls for and no others (clbench.testing.reported_metrics reads them from the data: a new task
file needs no edit here), and a method declared frozen_backbone must leave old-vocabulary text and the old skill
exactly as the base had them.
"""

import dataclasses

import pytest

from clbench.errors import ClbenchError
from clbench.method import methods
from clbench.protocol import run_one
from clbench.session import Session
from clbench.store import Store
from clbench.taskspec import Task, load_tasks
from clbench.testing import TASK_DEPENDENT, reported_metrics, tiny_base


def read_by_characters(task: Task) -> Task:
    """The task with its explicit opt-in to unknown text: the tiny base's character tokenizer knows only the
    arithmetic characters, so the text tasks' words would be refused as <unk>."""
    return dataclasses.replace(task, spec=task.spec.model_copy(update={"allow_unknown_tokens": True}))


@pytest.fixture(scope="module")
def session():
    session = Session(device="cpu")
    # a context of 1024: the text tasks' examples, read by characters, are long
    session.bases["tiny-tied"] = tiny_base(tied=True, name="tiny-tied", positions=1024)
    return session


@pytest.mark.parametrize("task_name", load_tasks().names())
@pytest.mark.parametrize("method_name", methods().names())
def test_method_runs_on_task(task_name, method_name, session, tmp_path):
    task, method = read_by_characters(load_tasks().get(task_name)), methods().get(method_name)
    # the task's data, as the run builds it (the session keeps it): what the task's runs must report follows from it
    data = session.data(task, task.resolved()[2], session.base("tiny-tied"))
    run = lambda: run_one(
        task, method, seed=0, store=Store(tmp_path / "r.duckdb"), session=session, model="tiny-tied", n_train=4
    )
    if not method.adds_tokens and data.stages:
        with pytest.raises(ClbenchError, match=f"adds no token, and the stages of task '{task_name}'"):
            run()
        return
    outcome = run()
    assert outcome.status == "finished", outcome.reason
    values, expected = outcome.metrics, reported_metrics(data, adds_tokens=method.adds_tokens)
    assert {name for name in TASK_DEPENDENT if name in values} == expected
    if method.adds_tokens:  # old text holds old tokens only, and the full softmax gives the new ones some mass
        assert values["forgetting_full"] > values["forgetting_oldvocab"]
        assert values["drift_kl_full"] >= values["drift_kl_oldvocab"] >= 0.0
    else:  # no new token: the full softmax is the old one
        assert values["forgetting_full"] == values["forgetting_oldvocab"]
        assert values["drift_kl_full"] == values["drift_kl_oldvocab"] > 0.0
    if method.frozen_backbone:  # old text's hidden states are the base's: not pt, whose prompt precedes it
        assert values["forgetting_oldvocab"] == 0.0
        # every old transition exactly as the base had it; only the new rows' share of the full softmax moves
        assert values["drift_kl_oldvocab"] == values["drift_top1_changed_oldvocab"] == 0.0
        assert values["drift_kl_oldvocab_se"] == 0.0 < values["drift_kl_full"]
        # the old skill, where the task probes one (addition), is exactly the base's; elsewhere there is no delta
        delta = values.get("old_skill_acc_delta")
        assert delta == (0.0 if "old_skill_acc" in expected else None)
    else:  # a trained backbone (or prompt) moves the old transitions
        assert values["drift_kl_oldvocab"] > 0.0 and values["drift_kl_oldvocab_se"] > 0.0
