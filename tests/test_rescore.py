"""`clbench rescore`: runs recorded before a metric existed get it, by an exact rebuild; nothing stored changes.

The runs are made by `clbench run` in process (the tiny model and task), then made "old" by deleting the drift
metrics from their records: what a run made before drift was declared looks like.
"""

import json
import shutil
from types import SimpleNamespace

import duckdb
import pytest
import torch

from clbench.cli import main
from clbench.provenance import cpu_model, differences, hardware, versions
from clbench.records import RecordStore, merge
from clbench.store import Store

DRIFT = "metric LIKE 'drift%'"


def values(store, where: str = "true") -> dict[tuple[str, str], float]:
    rows = store.query(f"SELECT run_id, metric, value FROM metrics WHERE {where} ORDER BY run_id, metric")
    return {(r.run_id, r.metric): r.value for r in rows.itertuples()}


@pytest.fixture
def made(tiny_cli, tmp_path):
    """A results DB with et and fft (seed 0, 3 steps) as they are recorded today, and its copy without drift."""
    db = tmp_path / "today.duckdb"
    assert main(tiny_cli.run_args(db, "--method", "et,fft", "--budget", "steps=3")) == 0
    old = tmp_path / "old.duckdb"
    shutil.copy(db, old)
    with duckdb.connect(str(old)) as connection:
        connection.execute(f"DELETE FROM metrics WHERE {DRIFT}")
    return Store(db), old


def test_rescore_adds_exactly_the_missing_drift_and_changes_nothing_else(tiny_cli, made, capsys):
    today, old = made
    before = values(Store(old))
    assert main(["rescore", "--db", str(old), "--task-dir", str(tiny_cli.tasks)]) == 0
    out = capsys.readouterr().out
    assert out.count(" 8 metrics added") == 2  # the 4 drift metrics and their 4 standard errors, per run
    assert values(Store(old)) == values(today)  # bit for bit what a run of today records
    assert values(Store(old), f"NOT ({DRIFT})") == before  # no stored value replaced
    kl = values(Store(old), "metric = 'drift_kl_oldvocab'")
    assert sorted(kl.values())[0] == 0.0 < sorted(kl.values())[1]  # et exactly 0, fft above
    assert main(["rescore", "--db", str(old), "--task-dir", str(tiny_cli.tasks)]) == 0
    assert "nothing to rescore" in capsys.readouterr().out


def test_a_run_that_does_not_rebuild_exactly_is_left_as_it_was(tiny_cli, made, capsys):
    _, old = made
    with duckdb.connect(str(old)) as connection:
        connection.execute("UPDATE metrics SET value = value + 0.01 WHERE metric = 'target_loss' AND run_id IN "
                           "(SELECT run_id FROM runs WHERE method = 'fft')")  # fmt: skip
        # as if made elsewhere: another CPU, and before the record named its CPU the torch entry alone
        connection.execute("UPDATE runs SET versions = json_object('torch', '0.0.1') WHERE method = 'fft'")
    before = values(Store(old))
    assert main(["rescore", "--db", str(old), "--task-dir", str(tiny_cli.tasks)]) == 2
    captured = capsys.readouterr()
    assert "not rescored: run " in captured.err and "did not rebuild exactly" in captured.err
    refusal = next(line for line in captured.err.splitlines() if "not rescored: run " in line)
    # the rebuild's own record: these versions and this CPU, no accelerator, one process, the tiny task's batch of 4
    here = versions() | {"accelerator": "cpu", "processes": 1, "batch_size": 4, "batch_size_per_process": 4}
    assert json.loads(Store(old).query("SELECT versions FROM runs WHERE method = 'et'").versions[0]) == here
    assert refusal.endswith(
        "left as it was; it was made with "
        + ", ".join(
            f"{name} {'0.0.1' if name == 'torch' else 'not recorded'} (here {value})" for name, value in here.items()
        )
    )
    assert captured.err.strip().splitlines()[-1] == "clbench: error: 1 of 2 runs not rescored (above); the others were"
    after = values(Store(old))
    assert {k: v for k, v in after.items() if k in before} == before
    assert {metric for (_, metric) in set(after) - set(before)} == {  # et got its drift, fft nothing
        "drift_kl_oldvocab", "drift_kl_full", "drift_top1_changed_oldvocab", "drift_top1_changed_full",
        "drift_kl_oldvocab_se", "drift_kl_full_se", "drift_top1_changed_oldvocab_se", "drift_top1_changed_full_se",
    }  # fmt: skip


def test_a_record_store_gets_the_metrics_as_files_of_their_own(tiny_cli, made, tmp_path):
    today, old = made
    store = RecordStore(tmp_path / "records")
    merge(store, Store(old))
    record_files = lambda: sorted(p.parent.name + "/" + p.name for p in (tmp_path / "records" / "records").glob("*/*"))
    merged = record_files()
    assert main(["rescore", "--db", str(tmp_path / "records") + "/", "--task-dir", str(tiny_cli.tasks)]) == 0
    assert values(store) == values(today)
    added = sorted(set(record_files()) - set(merged))
    assert len(added) == 2 and all(name.split("/")[1].startswith("metrics.added-") for name in added)
    assert sorted(p.name for p in (tmp_path / "records" / "tmp").iterdir()) == []
    run_id = store.query("SELECT run_id FROM runs WHERE method = 'et'").run_id[0]
    drift = {"drift_kl_oldvocab": 0.0}
    assert store.add_metrics(run_id, drift) == 0  # a name it holds is never added again, nor replaced


def test_an_undeclared_metric_is_refused_in_one_line(tiny_cli, made, capsys):
    _, old = made
    assert main(["rescore", "--db", str(old), "--missing", "drift_kl_olvocab"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("clbench: error: ") and "drift_kl_oldvocab" in err[0]


def test_differences_name_what_a_record_lacks_or_holds_otherwise():
    here = {"torch": "2.13.0+cpu", "transformers": "5.25.0", "cpu": "Intel(R) Xeon(R) Processor"}
    recorded = {"torch": "2.13.0+cpu", "transformers": "5.24.0"}  # a record from before the CPU was named
    assert differences(recorded, here) == [
        "transformers 5.24.0 (here 5.25.0)",
        "cpu not recorded (here Intel(R) Xeon(R) Processor)",
    ]
    assert differences(here, here) == [] and differences(None, {"cpu": "x"}) == ["cpu not recorded (here x)"]
    assert versions()["cpu"] == cpu_model() and isinstance(cpu_model(), str) and cpu_model()


def test_a_named_run_the_store_lacks_is_refused_in_one_line(tiny_cli, made, capsys):
    _, old = made
    before = old.read_bytes()
    assert main(["rescore", "--db", str(old), "--run", "0123456789abcdef"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"clbench: error: no run '0123456789abcdef' in {old}"]
    assert old.read_bytes() == before


def test_hardware_names_the_gpus_over_every_process_and_each_process_share_of_the_batch(monkeypatch):
    cpu = torch.nn.Linear(2, 2)
    assert hardware(cpu, 10) == {"accelerator": "cpu", "processes": 1, "batch_size": 10, "batch_size_per_process": 10}

    class Placed:  # a model placed by device_map over two GPUs, one layer left on the CPU
        def parameters(self):
            return [SimpleNamespace(device=torch.device(name)) for name in ("cuda:1", "cpu", "cuda:0", "cuda:1")]

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "NVIDIA H200")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert hardware(Placed(), 10) == {
        "accelerator": "cuda: NVIDIA H200 × 8",
        "processes": 4,
        "batch_size": 10,
        "batch_size_per_process": 3,
    }
