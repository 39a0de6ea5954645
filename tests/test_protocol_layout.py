"""clbench/protocol.py read with `ast`: it reads in the order a run goes, takes the method from the plan alone,
and names no metric (what a metric is sits with its declaration in clbench/metrics.py)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import torch

from clbench import metrics as M

PROTOCOL = Path(__file__).resolve().parent.parent / "clbench" / "protocol.py"
TREE = ast.parse(PROTOCOL.read_text(encoding="utf-8"))
# the flow as the module docstring draws it: plan, the four phases, the run composed of them, then the store
RUN_ORDER = [
    "plan",
    "base_references",
    "expanded",
    "train_stages",
    "evaluate_adapted",
    "adapt_and_evaluate",
    "execute",
    "record",
    "run_one",
]
PHASES = ["base_references", "expanded", "train_stages", "evaluate_adapted"]


def functions() -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in TREE.body if isinstance(node, ast.FunctionDef)}


def docstrings() -> set[int]:
    """The ids of the module's, classes' and functions' docstring nodes: prose may name a metric."""
    owners = [TREE, *(n for n in ast.walk(TREE) if isinstance(n, ast.FunctionDef | ast.ClassDef))]
    return {id(owner.body[0].value) for owner in owners if ast.get_docstring(owner) is not None}


def test_protocol_names_no_metric():
    prose = docstrings()
    strings = [
        (node.lineno, node.value)
        for node in ast.walk(TREE)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
    ]
    assert len(strings) > 20  # the walk sees the file's strings: error messages, run-row keys, claim states
    named = [(line, value) for line, value in strings if value in M.METRICS]
    assert named == []


def test_protocol_reads_in_run_order():
    found = functions()
    assert [name for name in sorted(found, key=lambda n: found[n].lineno) if name in RUN_ORDER] == RUN_ORDER
    first_class = min(node.lineno for node in TREE.body if isinstance(node, ast.ClassDef))
    plan_types = [
        node.name for node in TREE.body if isinstance(node, ast.ClassDef) and node.lineno < found["plan"].lineno
    ]
    assert first_class < found["plan"].lineno and plan_types == ["Plan", "RunRecord", "Outcome"]


def test_phases_are_numbered_in_run_order():
    found = functions()
    assert [ast.get_docstring(found[name]).split(":")[0] for name in PHASES] == [
        "Phase 1",
        "Phase 2",
        "Phase 3",
        "Phase 4",
    ]


def test_the_method_comes_from_the_plan_alone():
    """A function handed the plan reads planned.method and takes no method beside it (a test's stand-in method goes
    into its plan: clbench.testing.tiny_plan)."""
    both = [
        name
        for name, node in functions().items()
        if {"planned", "method"} <= {a.arg for a in node.args.args + node.args.kwonlyargs}
    ]
    assert both == []
    assert functions()["adapt_and_evaluate"].args.args[0].arg == "planned"


def test_stage_cells_are_named_by_the_metrics_module():
    old = SimpleNamespace(loss_old=1.5, loss_full=2.5, example_kl_old=None, example_kl_full=None)
    target = SimpleNamespace(loss_old=0.25, loss_full=0.75, hits_old=torch.tensor([True, False, False, True]))
    assert M.stage_cells(old, [target]) == [
        (0, "loss_oldvocab", 1.5),
        (0, "loss_full", 2.5),
        (0, "drift_kl_oldvocab", None),
        (0, "drift_kl_full", None),
        (1, "target_loss", 0.25),
        (1, "target_acc", 0.5),
        (1, "target_loss_full", 0.75),
    ]
    assert M.transfer_metrics() == ["target_loss", "target_acc"]
    assert M.divergence_checked() == ["target_loss", "target_loss_full", "forgetting_oldvocab", "forgetting_full"]
    assert M.logged() == [
        "target_loss",
        "after_new_loss",
        "gap_closed",
        "target_acc",
        "target_top1",
        "forgetting_oldvocab",
        "forgetting_full",
    ]
    assert M.reproduced() == [
        "target_loss",
        "target_loss_full",
        "target_acc",
        "forgetting_oldvocab",
        "forgetting_full",
        "old_skill_acc",
    ]
