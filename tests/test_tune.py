"""clbench tune: each method's lr chosen on the validation split, stored, and taken by `run --tuned`."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from clbench.cli import main
from clbench.errors import ClbenchError
from clbench.lrsearch import choose, edge, edge_hint, extended, next_point
from clbench.protocol import validation_data
from clbench.session import Session
from clbench.store import Store
from clbench.taskspec import load_tasks
from clbench.testing import TASK, write_tiny_task

GRID = "0.001,0.03"


def test_choose_takes_the_lowest_finite_mean_and_ties_go_to_the_smaller_lr():
    search = [{"lr": 0.1, "mean": 1.0}, {"lr": 0.01, "mean": 1.0}, {"lr": 1.0, "mean": math.inf}]
    assert choose(search)["lr"] == 0.01
    assert choose([{"lr": 1.0, "mean": 0.5}, {"lr": 0.1, "mean": 0.7}])["lr"] == 1.0
    with pytest.raises(ClbenchError, match="every learning rate of the grid diverged"):
        choose([{"lr": 1.0, "mean": math.inf}])


def test_a_search_extends_the_stored_one_on_the_same_seeds():
    point = lambda lr, mean, seeds=(0,): {"lr": lr, "mean": mean, "seeds": list(seeds)}
    stored = [point(0.01, 0.5), point(0.1, 0.2), point(1.0, 0.1, seeds=(0, 1))]
    # 0.1 is searched again (the new value wins); 1.0 was run on other seeds: not comparable, dropped
    assert extended(stored, [point(0.1, 0.3), point(0.3, 0.4)]) == [point(0.01, 0.5), point(0.1, 0.3), point(0.3, 0.4)]
    assert extended([], [point(0.3, 0.4)]) == [point(0.3, 0.4)]


def test_a_choice_on_an_edge_of_its_search_is_named_with_the_next_point_past_it():
    search = [{"lr": lr, "mean": m} for lr, m in [(1e-3, 2.0), (3e-3, 1.5), (1e-2, 1.0), (3e-2, math.inf)]]
    assert [edge(search, lr) for lr in (1e-3, 3e-3, 3e-2)] == ["low edge", "inside", "high edge"]
    assert edge(search, 1e-2) == "inside"  # bracketed by a point that diverged: it was searched, and lost
    assert edge(search[:1], 1e-3) == "one point" and edge_hint(search, 3e-3) == ""
    assert edge_hint(search[:3], 1e-2) == (
        "the choice 0.01 is the highest lr searched: search above it too (e.g. --grid 0.0333)"
    )
    assert (
        edge_hint(search, 1e-3)
        == "the choice 0.001 is the lowest lr searched: search below it too (e.g. --grid 0.000333)"
    )
    assert edge_hint(search[:1], 1e-3) == "only lr 0.001 was searched: nothing was chosen against it"
    # one grid step past the edge, to 3 significant digits; none inside, none without a step, none already searched
    assert [next_point(search, lr) for lr in (1e-3, 3e-3, 3e-2)] == [0.000333, None, 0.09]
    assert next_point(search[:1], 1e-3) is None and next_point([{"lr": 1.0}, {"lr": 1.0001}], 1.0) is None


def test_tune_past_an_edge_chooses_among_every_point_searched(tiny_cli, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    db = tmp_path / "r.duckdb"
    tune = ["tune", "--task", TASK, "--task-dir", str(tiny_cli.tasks), "--db", str(db), "--method", "et"]
    assert main([*tune, "--grid", "0.03"]) == 0
    assert main([*tune, "--grid", "0.001"]) == 0
    out, err = capsys.readouterr()
    assert "the stored search's 1 other point(s) on seeds [0] join the choice" in err
    assert "tune tiny-arith × et: only lr 0.03 was searched: nothing was chosen against it" in err
    assert out.splitlines()[-2].split() == ["method", "0.001", "0.03", "chosen", "where"]
    tuned = Store(db).query("SELECT lr, score, search FROM tuned")
    search = json.loads(tuned.search[0])
    assert [p["lr"] for p in search] == [0.001, 0.03]
    best = min(search, key=lambda p: p["mean"])
    assert (tuned.lr[0], tuned.score[0]) == (best["lr"], best["mean"])


def test_a_stored_search_joins_the_choice_on_the_tasks_objective_of_now(tmp_path, capsys, monkeypatch, tiny_cli):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    db, tasks = tmp_path / "r.duckdb", tmp_path / "tasks"
    tune = ["tune", "--task", TASK, "--task-dir", str(tasks), "--db", str(db), "--method", "et"]
    write_tiny_task(tasks, tiny_cli.model)  # tune_metric: target_loss
    assert main([*tune, "--grid", "0.03"]) == 0
    write_tiny_task(tasks, tiny_cli.model, tune_metric="forgetting_full")
    assert main([*tune, "--grid", "0.001"]) == 0
    capsys.readouterr()
    store = Store(db)
    value = lambda run_id, metric: store.query(
        "SELECT value FROM metrics WHERE run_id = ? AND metric = ?", [run_id, metric]
    ).value[0]
    (search,) = [json.loads(s) for s in store.query("SELECT search FROM tuned").search]
    assert [p["lr"] for p in search] == [0.001, 0.03]
    for point in search:  # the 0.03 point was searched on target_loss, and is read again on forgetting_full
        assert point["values"] == [value(point["run_ids"][0], "forgetting_full")]
    assert value(search[1]["run_ids"][0], "forgetting_full") != value(search[1]["run_ids"][0], "target_loss")
    assert store.query("SELECT objective FROM tuned").objective[0] == "forgetting_full"


def test_past_edges_searches_one_grid_step_past_the_edge_the_choice_sits_on(tiny_cli, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    db = tmp_path / "r.duckdb"
    tune = ["tune", "--task", TASK, "--task-dir", str(tiny_cli.tasks), "--db", str(db), "--method", "et"]
    assert main([*tune, "--grid", "0.001,0.003", "--past-edges", "1"]) == 0
    search = json.loads(Store(db).query("SELECT search FROM tuned").search[0])
    # of two points the choice sits on an edge either way; one step past it (the grid's ratio 3) joins the search
    means = {p["lr"]: p["mean"] for p in search}
    first = 0.001 if means[0.001] <= means[0.003] else 0.003  # choose's rule: the lowest mean, ties to the smaller lr
    past, where = {0.001: (0.000333, "low edge"), 0.003: (0.009, "high edge")}[first]
    assert sorted(means) == sorted([0.001, 0.003, past])
    message = f"tune tiny-arith × et: the choice {first:g} is on the {where}: one more point, {past:g}"
    assert message in capsys.readouterr().err


def test_the_validation_split_is_disjoint_from_everything_reported(tiny_cli):
    task = load_tasks([tiny_cli.tasks]).get(TASK)
    session = Session(device="cpu")
    _, _, params = task.resolved()
    data = task.build(params, session.base(str(tiny_cli.model)).tokenizer)
    swapped = validation_data(task, data)
    assert swapped.target_test == data.validation and swapped.old_text == data.validation_old_text
    assert len(data.validation) == 100 and len(data.validation_old_text) == 100
    prompts = lambda examples: {e.prompt for e in examples}
    assert not prompts(data.validation) & (prompts(data.target_test) | prompts(data.train))
    assert not set(data.validation_old_text) & (set(data.old_text) | set(data.replay_text))
    assert [o.prompt.replace("*", "<spec>") for o in data.target_oracle] == [t.prompt for t in data.target_test]


def test_tune_stores_its_search_and_choice_and_run_tuned_takes_it(tiny_cli, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    db = tmp_path / "r.duckdb"
    common = ["--task", TASK, "--task-dir", str(tiny_cli.tasks), "--db", str(db)]
    assert main(["run", *common, "--method", "et", "--tuned"]) == 2  # nothing tuned yet
    assert "no tuned lr for tiny-arith × et" in capsys.readouterr().err

    assert main(["tune", *common, "--method", "et", "--grid", GRID, "--seeds", "0,1"]) == 0
    out = capsys.readouterr().out
    store = Store(db)
    tuned = store.query("SELECT * FROM tuned")
    assert len(tuned) == 1 and tuned.method[0] == "et" and tuned.objective[0] == "target_loss"
    search = json.loads(tuned.search[0])
    assert [p["lr"] for p in search] == [0.001, 0.03] and all(len(p["run_ids"]) == 2 for p in search)
    # every point is an ordinary run on the validation split, its value the stored metric
    for point in search:
        stored = [
            store.query("SELECT value FROM metrics WHERE run_id = ? AND metric = 'target_loss'", [run_id]).value.iloc[
                0
            ]
            for run_id in point["run_ids"]
        ]
        assert point["values"] == stored and point["mean"] == sum(stored) / 2
    best = min(search, key=lambda p: (p["mean"], p["lr"]))
    assert tuned.lr[0] == best["lr"] and tuned.score[0] == best["mean"]
    assert f"{best['mean']:.4f}*" in out
    splits = store.query("SELECT json_extract_string(config, '$.split') AS split FROM runs").split
    assert list(splits) == ["validation"] * 4
    assert store.query("SELECT * FROM results").empty  # tuning runs are never results

    assert main(["run", *common, "--method", "et", "--tuned"]) == 0
    capsys.readouterr()
    config = json.loads(store.query("SELECT config FROM runs WHERE config->>'split' = 'test'").config[0])
    assert config["method_config"]["lr"] == best["lr"]
    # the reported run is another run than every tuning point (its split is part of the run id)
    reported = store.query("SELECT DISTINCT run_id FROM results").run_id
    assert len(reported) == 1 and reported[0] not in {r for p in search for r in p["run_ids"]}

    assert main(["run", *common, "--method", "et", "--tuned", "--set", "lr=0.1"]) == 2
    assert "the lr is given twice" in capsys.readouterr().err


def test_a_task_file_ships_lrs_per_profile(tiny_cli, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    write_tiny_task(tmp_path / "tasks", tiny_cli.model, lr={"et": 0.0123})
    db = tmp_path / "r.duckdb"
    assert main(["run", "--task", TASK, "--task-dir", str(tmp_path / "tasks"), "--db", str(db), "--method", "et"]) == 0
    capsys.readouterr()
    config = json.loads(Store(db).query("SELECT config FROM runs").config[0])
    assert config["method_config"]["lr"] == 0.0123 and config["split"] == "test"


XLING_SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "xling_cpu.sh"


def _xling_chain(tmp_path, *methods, task="xling-de", **extra_env):
    """bench/xling_cpu.sh with a `clbench` on PATH that only logs its arguments: the commands it would run."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "clbench"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", **extra_env}
    done = subprocess.run(
        ["bash", str(XLING_SCRIPT), task, "de.duckdb", *methods], env=env, capture_output=True, text=True
    )
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return done, calls


@pytest.mark.parametrize(
    ("methods", "task", "centre", "grids"),
    [
        # tasks/xling-es.yaml's cpu choices: distill 0.009, nonew 1e-4 (c/3, c, 3c at 3 significant digits)
        (("distill", "nonew"), "xling-de", {}, ("0.003,0.009,0.027", "3.33e-05,0.0001,0.0003")),
        # tasks/xling-de.yaml's: distill 0.027, nonew 3.33e-5
        (
            ("distill", "nonew"),
            "xling-ar",
            {"CENTRE": "xling-de"},
            ("0.009,0.027,0.081", "1.11e-05,3.33e-05,9.99e-05"),
        ),
        # tasks/pseudowords.yaml's cpu choices: et 0.0333, nonew 3.33e-5
        (
            ("et", "nonew"),
            "pseudowords",
            {"CENTRE": "pseudowords"},
            ("0.0111,0.0333,0.0999", "1.11e-05,3.33e-05,9.99e-05"),
        ),
    ],
)
def test_the_chain_searches_around_each_methods_centre_choice_then_runs_three_seeds(
    tmp_path, methods, task, centre, grids
):
    done, calls = _xling_chain(tmp_path, *methods, task=task, **centre)
    assert done.returncode == 0, done.stderr
    x = f"--task {task} --profile cpu --method {{}} --db de.duckdb"
    expected = []
    for method, grid in zip(methods, grids):
        expected += [
            f"tune {x.format(method)} --grid {grid} --past-edges 2 --seeds 0",
            f"run {x.format(method)} --tuned --seeds 0,1,2",
        ]
    assert calls == expected


def test_the_xling_chain_stops_before_any_run_at_a_method_xling_es_has_no_choice_for(tmp_path):
    done, calls = _xling_chain(tmp_path, "nosuch", "et")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == "bench/xling_cpu.sh: no xling-es-cpu choice for method 'nosuch'"
    assert calls == []
