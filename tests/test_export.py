"""`clbench export` and `clbench push`: every run as one record, read back exactly by pandas and DuckDB."""

from __future__ import annotations

import json
import math
import socket
from datetime import datetime
from pathlib import Path

import duckdb
import huggingface_hub
import pandas as pd
import pytest

import clbench.hub
from clbench.cli import main
from clbench.store import Store

READ_ONLY_DIR = Path("/sys")  # refuses new files even to root (see test_bad_input.py)

COLUMNS = [
    "run_id", "task", "task_version", "method", "model", "seed", "split", "status", "reason", "metrics", "config",
    "versions", "model_fingerprint", "data_fingerprint", "git_commit", "started_at", "finished_at",
]  # fmt: skip


def run(run_id: str, task: str, method: str, seed: int, config: dict, **fields) -> dict:
    return {
        "run_id": run_id,
        "task": task,
        "task_version": 2,
        "method": method,
        "model": "builtin:tiny",
        "seed": seed,
        "status": "finished",
        "reason": None,
        "config": config,
        "model_fingerprint": f"model-{run_id}",
        "data_fingerprint": f"data-{run_id}",
        "versions": {"clbench": "0.1.0", "torch": "2.13.0"},
        "git_commit": "0123abc+dirty",
        "started_at": datetime(2026, 1, 2, 3, 4, 5, 123456),
        "finished_at": datetime(2026, 1, 2, 3, 6, 7, 654321),
    } | fields


CONFIG = {"budget": {"n_train": 8, "steps": 3}, "method_config": {"lr": 0.1, "rank": None}, "params": {"n": [1, 2]}}
# (run, metrics): a reported run with floats that print long, a tuning run, a failed run without metrics, and a run
# from before the split existed (no config.split: it scored the test sets) with the nullable fields null
RUNS = [
    (run("a1", "arith", "et", 0, CONFIG | {"split": "test"}), {"target_acc": 0.1 + 0.2, "target_loss": 1 / 3}),
    (run("b2", "arith", "et", 1, CONFIG | {"split": "validation"}), {"target_loss": 2.5e-300}),
    (run("c3", "arith", "fft", 0, CONFIG | {"split": "test"}, status="failed", reason="diverged: loss nan"), {}),
    (
        run("d4", "words", "lora", 2, {"old": True}, model_fingerprint=None, git_commit=None, finished_at=None),
        {"forgetting_full": -0.125, "trainable_params": 4096.0},
    ),
]
SPLITS = {"a1": "test", "b2": "validation", "c3": "test", "d4": "test"}


def expected(run_ids: list[str]) -> list[dict]:
    return [r | {"split": SPLITS[r["run_id"]], "metrics": m} for r, m in RUNS if r["run_id"] in run_ids]


@pytest.fixture
def db(tmp_path) -> Path:
    store = Store(tmp_path / "r.duckdb")
    for record, metrics in reversed(RUNS):  # the files are ordered by run_id, not by insertion
        store.record(record, metrics)
    return tmp_path / "r.duckdb"


def from_pandas(frame: pd.DataFrame) -> list[dict]:
    """pandas' missing values as None; the nested fields as Python objects."""
    assert list(frame.columns) == COLUMNS
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return [
        row
        | {
            "metrics": dict(row["metrics"]),  # pyarrow reads a map as (key, value) pairs, JSON as a dict
            "config": row["config"] if isinstance(row["config"], dict) else json.loads(row["config"]),
            "versions": row["versions"] if isinstance(row["versions"], dict) else json.loads(row["versions"]),
        }
        for row in rows
    ]


def read_jsonl(path: Path) -> pd.DataFrame:
    """As docs/results.md says: pandas' default float parser rounds the last digit, and it leaves timestamps text."""
    frame = pd.read_json(path, lines=True, dtype=False, precise_float=True)
    return frame.assign(started_at=pd.to_datetime(frame.started_at), finished_at=pd.to_datetime(frame.finished_at))


def from_duckdb(relation: duckdb.DuckDBPyRelation) -> list[dict]:
    assert relation.columns == COLUMNS
    rows = [dict(zip(relation.columns, values)) for values in relation.fetchall()]
    return [row | {"config": json.loads(row["config"]), "versions": json.loads(row["versions"])} for row in rows]


def test_parquet_round_trips_every_field_through_pandas_and_duckdb(db, tmp_path, capsys):
    out = tmp_path / "runs.parquet"
    assert main(["export", "--db", str(db), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote 4 runs to {out}\n"
    everything = expected(["a1", "b2", "c3", "d4"])
    assert from_pandas(pd.read_parquet(out)) == everything
    with duckdb.connect() as connection:
        assert from_duckdb(connection.sql(f"SELECT * FROM '{out}'")) == everything
        # the types a reader gets: metrics a map (one lookup per name), config JSON, the split a column
        assert connection.sql(
            f"SELECT run_id, metrics['target_loss'], config->>'$.budget.n_train' FROM '{out}' WHERE split = 'test'"
        ).fetchall() == [("a1", 1 / 3, "8"), ("c3", None, "8"), ("d4", None, None)]


def test_jsonl_round_trips_every_field_through_pandas_and_duckdb(db, tmp_path):
    out, parquet = tmp_path / "runs.jsonl", tmp_path / "runs.parquet"
    assert main(["export", "--db", str(db), "--format", "jsonl", "--out", str(out)]) == 0
    assert main(["export", "--db", str(db), "--out", str(parquet)]) == 0
    everything = expected(["a1", "b2", "c3", "d4"])
    lines = out.read_text().splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == ["a1", "b2", "c3", "d4"]
    assert json.loads(lines[0])["config"] == CONFIG | {"split": "test"}  # a nested object, not a string
    assert from_pandas(read_jsonl(out)) == everything
    with duckdb.connect() as connection:
        # DuckDB reads the lines with the Parquet file's types given, and gets the same values
        types = dict(
            connection.sql(f"SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM '{parquet}')").fetchall()
        )
        assert from_duckdb(connection.sql(f"SELECT * FROM read_json('{out}', columns = {types})")) == everything


def test_default_out_is_in_the_working_directory_and_task_method_filter(db, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--db", str(db), "--format", "jsonl", "--task", "arith", "--method", "et,lora"]) == 0
    assert main(["export", "--db", str(db), "--task", "words,arith", "--method", "fft"]) == 0
    assert from_pandas(read_jsonl(Path("clbench-results.jsonl"))) == expected(["a1", "b2"])
    assert from_pandas(pd.read_parquet("clbench-results.parquet")) == expected(["c3"])


def test_format_follows_the_out_suffix_unless_given(db, tmp_path):
    for name in ["runs.jsonl", "runs.NDJSON", "runs.json"]:
        assert main(["export", "--db", str(db), "--out", str(tmp_path / name)]) == 0
        lines = (tmp_path / name).read_text().splitlines()
        assert [json.loads(line)["run_id"] for line in lines] == ["a1", "b2", "c3", "d4"]
    # an unknown suffix keeps the documented default, and an explicit --format is obeyed
    assert main(["export", "--db", str(db), "--out", str(tmp_path / "runs.bin")]) == 0
    assert main(["export", "--db", str(db), "--format", "jsonl", "--out", str(tmp_path / "runs.txt")]) == 0
    assert from_pandas(pd.read_parquet(tmp_path / "runs.bin")) == expected(["a1", "b2", "c3", "d4"])
    assert from_pandas(read_jsonl(tmp_path / "runs.txt")) == expected(["a1", "b2", "c3", "d4"])


def test_non_finite_metrics_survive_in_parquet_and_are_nan_infinity_in_jsonl(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    store.record(run("n1", "arith", "et", 0, {}), {"a": math.nan, "b": math.inf, "c": -math.inf})
    assert main(["export", "--db", str(store.path), "--out", str(tmp_path / "n.parquet")]) == 0
    assert main(["export", "--db", str(store.path), "--format", "jsonl", "--out", str(tmp_path / "n.jsonl")]) == 0
    metrics = dict(pd.read_parquet(tmp_path / "n.parquet").metrics[0])
    assert math.isnan(metrics["a"]) and metrics["b"] == math.inf and metrics["c"] == -math.inf
    line = (tmp_path / "n.jsonl").read_text()
    assert '"metrics":{"a":NaN,"b":Infinity,"c":-Infinity}' in line  # as Python's json writes and reads them


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--db", "{tmp}/none.duckdb"], "results database {tmp}/none.duckdb does not exist (run `clbench run` first)"),
        (
            ["--format", "csv"],
            "argument --format: invalid choice: 'csv' (choose from 'parquet', 'jsonl') (see `clbench export --help`)",
        ),
        (["--out", f"{READ_ONLY_DIR}/runs.parquet"], f"cannot write {READ_ONLY_DIR}/runs.parquet: "),
        (["--out", "{tmp}/missing/runs.parquet"], "cannot write {tmp}/missing/runs.parquet: No such file or directory"),
        (["--out", "{tmp}"], "cannot write {tmp}: it is a directory"),
        (["--task", "arith", "--method", "pt"], "no runs in {tmp}/r.duckdb match --task arith and --method pt; nothing written"),
        (["--format", "jsonl"], "--out {tmp}/runs.parquet names a parquet file but --format is jsonl; give one that agrees"),
    ],
    ids=["missing-db", "unknown-format", "unwritable-out", "missing-folder", "out-is-a-folder", "no-runs-match", "format-contradicts-out"],
)  # fmt: skip
def test_bad_export_is_one_line_and_leaves_out_untouched(db, tmp_path, capsys, args, message):
    out = tmp_path / "runs.parquet"
    out.write_text("an earlier export")
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [a.format(tmp=tmp_path) for a in ["export", "--db", str(db), "--out", str(out), *args]]
    assert main(args) == 2
    assert one_error(capsys).startswith(f"clbench: error: {message.format(tmp=tmp_path)}")
    # no partial file beside it (the no-runs case had DuckDB write one), and the earlier export is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert out.read_text() == "an earlier export"


class FakeHub:
    """HfApi up to the network boundary: records what would be created and uploaded."""

    calls: list = []

    def __init__(self, endpoint=None, token=None):
        self.calls.append(("HfApi", endpoint, token))

    def create_repo(self, repo_id, *, repo_type=None, private=None, exist_ok=False):
        self.calls.append(("create_repo", repo_id, repo_type, private, exist_ok))
        return f"https://huggingface.co/datasets/{repo_id}"

    def upload_folder(self, *, repo_id, repo_type, folder_path, commit_message):
        files = {p.name: p.read_bytes() for p in Path(folder_path).iterdir()}  # read now: the folder is temporary
        self.calls.append(("upload_folder", repo_id, repo_type, commit_message, files))


@pytest.fixture
def hub(monkeypatch):
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHub)
    monkeypatch.setattr(clbench.hub, "reachable", lambda: True)
    FakeHub.calls = []
    return FakeHub.calls


def test_push_uploads_the_parquet_export_and_a_dataset_card(db, tmp_path, hub, monkeypatch, capsys):
    monkeypatch.setenv("MY_HF_TOKEN", "hf_secret")
    args = ["push", "--db", str(db), "--repo", "org/results", "--private", "--token-env", "MY_HF_TOKEN"]
    assert main(args) == 0
    assert capsys.readouterr().out == "pushed to https://huggingface.co/datasets/org/results\n"
    upload = hub[2]
    assert hub[:2] == [
        ("HfApi", clbench.hub.ENDPOINT, "hf_secret"),
        ("create_repo", "org/results", "dataset", True, True),
    ]
    assert upload[:4] == ("upload_folder", "org/results", "dataset", "clbench push: 4 runs")
    assert sorted(upload[4]) == ["README.md", "clbench-results.parquet"]
    (tmp_path / "pushed.parquet").write_bytes(upload[4]["clbench-results.parquet"])
    assert from_pandas(pd.read_parquet(tmp_path / "pushed.parquet")) == expected(["a1", "b2", "c3", "d4"])
    card = upload[4]["README.md"].decode()
    assert card.startswith("---\nconfigs:\n- config_name: default\n  data_files: clbench-results.parquet\n")
    assert "4 runs of clbench" in card and "keep `split == 'test'` for the\nreported results" in card
    assert all(f"| `{name}` |" in card for name in COLUMNS)


def test_push_without_a_token_env_leaves_the_token_to_huggingface_hub(db, hub):
    assert main(["push", "--db", str(db), "--repo", "org/results"]) == 0
    assert hub[:2] == [("HfApi", clbench.hub.ENDPOINT, None), ("create_repo", "org/results", "dataset", False, True)]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--repo", "org/a/b"], "--repo 'org/a/b': Repo id must be in the form 'repo_name' or 'namespace/repo_name'"),
        (["--repo", "results"], "--repo takes ORG/NAME (the dataset's owner and name), got 'results'"),
        (["--repo", "org/results", "--token-env", "UNSET_TOKEN"], "--token-env UNSET_TOKEN: $UNSET_TOKEN is not set"),
        (["--repo", "org/results", "--db", "{tmp}/none.duckdb"], "results database {tmp}/none.duckdb does not exist"),
    ],
    ids=["bad-repo", "no-org", "unset-token", "missing-db"],
)
def test_bad_push_is_one_line_and_asks_nothing_of_the_hub(db, tmp_path, hub, capsys, monkeypatch, args, message):
    monkeypatch.delenv("UNSET_TOKEN", raising=False)
    assert main([a.format(tmp=tmp_path) for a in ["push", "--db", str(db), *args]]) == 2
    assert one_error(capsys).startswith(f"clbench: error: {message.format(tmp=tmp_path)}")
    assert hub == []


def test_push_offline_names_what_could_not_be_reached(db, hub, capsys, monkeypatch):
    monkeypatch.setattr(clbench.hub, "reachable", lambda: False)
    assert main(["push", "--db", str(db), "--repo", "org/results"]) == 2
    assert one_error(capsys) == (
        f"clbench: error: could not reach {clbench.hub.ENDPOINT} to push org/results: no connection "
        "(or HF_HUB_OFFLINE is set); `clbench export` writes the same file here"
    )
    assert hub == []


def test_a_connection_error_from_the_real_client_is_one_line(db, capsys, monkeypatch):
    with socket.socket() as closed:  # bound, never listening: a connection to it is refused at once
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
        monkeypatch.setattr(clbench.hub, "ENDPOINT", endpoint)
        monkeypatch.setattr(clbench.hub, "reachable", lambda: True)  # as if the probe had got through
        monkeypatch.setenv("TOKEN", "hf_x")
        assert main(["push", "--db", str(db), "--repo", "org/results", "--token-env", "TOKEN"]) == 2
    assert one_error(capsys).startswith(f"clbench: error: could not reach {endpoint} to push org/results: ")
