"""The metric registry: each metric declared once, the headline lists derived, a task's own metric."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clbench import metrics as M
from clbench.errors import ClbenchError
from clbench.method import methods
from clbench.protocol import run_one
from clbench.report.summary import summary
from clbench.session import Session
from clbench.store import Store
from clbench.taskspec import load_tasks
from clbench.testing import MEMORY, NOT_REPRODUCIBLE, small_raw, write_task_file

# the lists cli.py (SUMMARY_METRICS), leaderboard.py (ORDER) and sweep.py (CURVE_METRICS) held before the registry
# the summary's since b5e511f: what was learned, then what was forgotten, then the rest (the front door's order)
SUMMARY_NOW = [
    "target_loss",
    "target_acc",
    "forgetting_oldvocab",
    "old_skill_acc_delta",
    "target_acc_seen",
    "target_acc_unseen",
    "forgetting_full",
    "trainable_params",
    "train_seconds",
]
LEADERBOARD_BEFORE = [
    "target_acc",
    "target_acc_seen",
    "target_acc_unseen",
    "target_loss",
    "old_skill_acc_delta",
    "forgetting_oldvocab",
    "forgetting_full",
    "trainable_params",
    "train_seconds",
]
CURVE_BEFORE = [
    "target_loss",
    "target_acc",
    "target_acc_seen",
    "target_acc_unseen",
    "forgetting_oldvocab",
    "forgetting_full",
]


# headline metrics added since (the reference points and next-token top-1, issue 15; bits per byte beside the
# base's, the one target measure of every position that compares across tokenizations: xling's; transition
# drift, the paper's forgetting, each beside the loss difference of the same softmax: issue 24)
ADDED = {"gap_closed", "target_top1", "word_gap", "target_bpb", "target_bpb_base"}
# the new tokens' own transitions, out of them and into them (issue 37)
AROUND_NEW = {"after_new_loss", "after_new_gap_closed", "new_token_loss"}
DRIFT = {"drift_kl_oldvocab", "drift_top1_changed_oldvocab", "drift_kl_full"}


def test_headline_lists_are_the_ones_before_the_registry_plus_the_references():
    for view, before in [("summary", SUMMARY_NOW), ("leaderboard", LEADERBOARD_BEFORE), ("curve", CURVE_BEFORE)]:
        assert [m for m in M.headline(view) if m not in ADDED | DRIFT | AROUND_NEW] == before, view
    follows = lambda view, metric: M.headline(view)[M.headline(view).index(metric) + 1]
    assert [follows("leaderboard", m) for m in ("forgetting_oldvocab", "forgetting_full")] == [
        "drift_kl_oldvocab",
        "drift_kl_full",
    ]
    assert follows("leaderboard", "drift_kl_oldvocab") == "drift_top1_changed_oldvocab"
    assert follows("summary", "forgetting_full") == "drift_kl_full"
    assert follows("curve", "forgetting_oldvocab") == "drift_kl_oldvocab"
    assert M.headline("summary")[:8] == [
        "target_loss", "target_acc", "after_new_loss", "forgetting_oldvocab", "after_new_gap_closed", "gap_closed",
        "drift_kl_oldvocab", "old_skill_acc_delta"
    ]  # fmt: skip
    assert M.headline("leaderboard")[:10] == [
        "target_acc", "target_top1", "target_acc_seen", "target_acc_unseen", "gap_closed", "word_gap",
        "after_new_loss", "after_new_gap_closed", "new_token_loss", "target_loss"
    ]  # fmt: skip
    assert M.headline("curve")[:4] == ["target_loss", "after_new_loss", "gap_closed", "target_acc"]
    after = lambda view, metric: M.headline(view)[M.headline(view).index(metric) + 1 :][:2]
    assert after("leaderboard", "target_loss") == after("summary", "target_top1") == ["target_bpb", "target_bpb_base"]


def test_directions_are_the_ones_before_the_registry():
    higher = {n for n in M.METRICS if M.METRICS.get(n).higher_is_better}
    assert higher == {
        "avg_target_acc",
        "bwt_target_acc",
        "bwt_target_loss",
        "fwt_target_acc",
        "fwt_target_loss",
        "old_skill_acc",
        "old_skill_acc_base",
        "old_skill_acc_delta",
        "old_skill_acc_delta_full",
        "target_acc",
        "target_acc_seen",
        "target_acc_unseen",
        "tokens_per_second",
        # added with the reference points (issue 15)
        "gap_closed",
        "target_top1",
        "target_top1_nolearn",
        "target_top1_oracle",
        "target_acc_nolearn",
        "target_acc_oracle",
        # added with dictionary recovery (issue 14)
        "meaning_recall_at_s",
        "meaning_words_scored",
        # added with greedy use of the new tokens (issue 14)
        "new_token_recall",
        # gap_closed at the positions after a new token (issue 37)
        "after_new_gap_closed",
    }
    assert not M.higher_is_better("target_bpb_init")


def test_every_built_in_metric_carries_its_computation():
    """Adding a built-in metric is its declaration with `score=` (clbench/metrics.py) plus its test: nothing in the
    protocol names it. The exceptions are families made elsewhere, each checked to be one."""
    stage_families = {f"{kind}_{m}" for kind in ("avg", "bwt", "fwt", "forgetting") for m in M.transfer_metrics()}
    for name in M.METRICS.names():
        metric = M.METRICS.get(name)
        if metric.score is not None or metric.compute is not None:
            continue
        family = name.rsplit("_", 1)[0]
        assert name in stage_families or M.METRICS.get(family).score is not None, name


def test_a_family_member_inherits_its_familys_declaration():
    assert M.lookup("forgetting_target_acc_spec") is M.METRICS.get("forgetting_target_acc")
    assert M.lookup("target_acc_plus") is M.METRICS.get("target_acc")
    assert M.lookup("target_acc_seen").definition.startswith("target_acc over the target examples of group seen")


def test_unknown_metric_says_did_you_mean():
    with pytest.raises(ClbenchError, match=re.escape("unknown metric 'target_acx' (did you mean 'target_acc'?)")):
        M.lookup("target_acx")
    with pytest.raises(KeyError, match=re.escape("did you mean 'forgetting_full'")):
        M.higher_is_better("forgeting_full")


@pytest.fixture
def scratch_registry(monkeypatch):
    """The metric registry as it is, restored after the test (which may register metrics)."""
    monkeypatch.setattr(M.METRICS, "_items", dict(M.METRICS._items))
    monkeypatch.setattr(M, "_declared_in", dict(M._declared_in))


def test_a_duplicate_declaration_is_an_error(scratch_registry):
    with pytest.raises(ClbenchError, match=r"^duplicate metric name 'target_loss'$"):
        M.register_metric("target_loss", higher_is_better=True, definition="another target loss")
    assert M.METRICS.get("target_loss").higher_is_better is False  # the first declaration stands


def test_an_unknown_headline_view_is_an_error(scratch_registry):
    with pytest.raises(ClbenchError, match=r"^metric 'x': unknown headline view\(s\) board; known: summary, "):
        M.register_metric("x", higher_is_better=True, definition="x", headline={"board": 1})
    with pytest.raises(ClbenchError, match=r"^unknown headline view 'board'"):
        M.headline("board")


def test_the_metrics_tests_leave_out_as_measured_are_declared():
    # clbench.testing.NOT_REPRODUCIBLE names metrics a renamed declaration would silently stop leaving out
    assert set(M.METRICS) >= NOT_REPRODUCIBLE >= MEMORY


def test_docs_hold_the_registrys_table():
    docs = (Path(__file__).parent.parent / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert M.markdown_table() in docs


# ---------------------------------------------------------------- a task's own metric

GAP = """

from clbench.metrics import register_metric

register_metric(
    "target_acc_gap",
    higher_is_better=False,
    definition="target_acc_seen − target_acc_unseen: how much the new operator's accuracy depends on the pair",
    headline={"summary": 45},
    compute=lambda values: values["target_acc_seen"] - values["target_acc_unseen"],
)
"""


def gap_task_dir(directory: Path) -> Path:
    """The small arithmetic task, its generator (a copy of tasks/arithmetic.py) declaring target_acc_gap."""
    write_task_file(directory, "gap", raw=small_raw("gap"))
    with (directory / "arithmetic.py").open("a", encoding="utf-8") as generator:
        generator.write(GAP)
    return directory


def test_a_task_declares_a_metric_that_its_runs_store(tmp_path, tiny_builtin, scratch_registry):
    task = load_tasks([gap_task_dir(tmp_path / "tasks")]).get("gap")
    assert [m.name for m in task.metrics] == ["target_acc_gap"]
    assert M.lookup("target_acc_gap").higher_is_better is False
    columns = M.headline("summary")  # rank 45: after target_acc_unseen (40), before drift_top1_changed_oldvocab (64)
    assert columns[columns.index("target_acc_unseen") + 1 : columns.index("drift_top1_changed_oldvocab")] == [
        "target_acc_gap"
    ]
    assert load_tasks().get("arithmetic").metrics == []  # the builtin task's module declares none

    store = Store(tmp_path / "r.duckdb")
    outcome = run_one(
        task, methods().get("et"), seed=0, store=store, session=Session(), model="builtin:tiny", n_train=8
    )
    values = outcome.metrics
    assert outcome.status == "finished"
    assert values["target_acc_gap"] == values["target_acc_seen"] - values["target_acc_unseen"]
    stored = store.query("SELECT value FROM results WHERE metric = 'target_acc_gap'").value.tolist()
    assert stored == [values["target_acc_gap"]]
    assert "target_acc_gap" in summary(store, wide=True).splitlines()[0]  # a headline column of `clbench results`


def test_loading_a_task_again_is_no_duplicate_but_another_file_declaring_its_metric_is(tmp_path, scratch_registry):
    first = load_tasks([gap_task_dir(tmp_path / "a")]).get("gap")
    again = load_tasks([tmp_path / "a"]).get("gap")  # another Task object executes the same file again
    assert again.metrics == first.metrics
    other = load_tasks([gap_task_dir(tmp_path / "b")]).get("gap")
    with pytest.raises(ClbenchError, match=r"^duplicate metric name 'target_acc_gap'$"):
        other.resolved()  # loading its generator module registers the metric again
