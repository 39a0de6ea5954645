"""The paper's arithmetic result on the shipped arithmetic base (builtin:arith-llama)."""

import pytest

from clbench.cli import main
from clbench.store import Store

pytestmark = pytest.mark.slow


def test_et_keeps_addition_exactly_and_fft_loses_it(tmp_path, capsys):
    db = tmp_path / "results.duckdb"
    assert main(["run", "--task", "arithmetic", "--method", "et,fft", "--db", str(db)]) == 0
    frame = Store(db).query("SELECT method, metric, value FROM results WHERE status = 'finished'")
    value = {(r.method, r.metric): r.value for r in frame.itertuples()}
    assert value["et", "old_skill_acc_delta"] == 0.0
    assert value["et", "forgetting_oldvocab"] == 0.0
    assert value["et", "target_acc_seen"] >= 0.9
    assert value["et", "trainable_params"] == 128  # one new row of the 128-wide embedding
    assert value["fft", "old_skill_acc_delta"] <= -0.2
    assert value["fft", "forgetting_oldvocab"] > 0.1
    # an identical rerun records nothing new
    assert main(["run", "--task", "arithmetic", "--method", "et,fft", "--db", str(db)]) == 0
    assert "0 finished, 2 already in" in capsys.readouterr().err
    assert len(Store(db).query("SELECT * FROM runs")) == 2
