"""The continual-learning metrics against matrices computed by hand (clbench/cl_metrics.py)."""

import math

import pytest

from clbench import cl_metrics as C
from clbench.metrics import bits_per_byte, higher_is_better

# accuracy after 0..3 stages (rows) on stages 1..3 (columns)
ACC = [
    [0.1, 0.2, 0.0],
    [0.9, 0.3, 0.1],
    [0.6, 0.8, 0.4],
    [0.5, 0.7, 0.9],
]


def test_average_is_the_last_row_mean():
    assert C.average(ACC) == pytest.approx((0.5 + 0.7 + 0.9) / 3)


def test_backward_transfer_gem():
    # stage 1: 0.5 − 0.9, stage 2: 0.7 − 0.8
    assert C.backward_transfer(ACC, True) == pytest.approx(((0.5 - 0.9) + (0.7 - 0.8)) / 2)


def test_forward_transfer_gem():
    # stage 2 before its training (row 1) vs untrained (row 0): 0.3 − 0.2; stage 3: 0.4 − 0.0
    assert C.forward_transfer(ACC, True) == pytest.approx(((0.3 - 0.2) + (0.4 - 0.0)) / 2)


def test_forgetting_takes_the_best_value_before_the_end():
    # stage 1: max(0.9, 0.6) − 0.5; stage 2: max(0.8) − 0.7; the last stage has none
    assert C.forgetting(ACC, True) == pytest.approx([0.4, 0.1])


def test_losses_keep_the_sign_meaning():
    loss = [[5.0, 6.0], [1.0, 5.5], [2.0, 1.5]]
    assert C.backward_transfer(loss, False) == pytest.approx(1.0 - 2.0)  # got worse: negative
    assert C.forward_transfer(loss, False) == pytest.approx(6.0 - 5.5)  # helped: positive
    assert C.forgetting(loss, False) == pytest.approx([2.0 - 1.0])  # got worse: positive
    assert C.summarize(loss, "target_loss", False, ["a", "b"]) == pytest.approx(
        {"avg_target_loss": 1.75, "bwt_target_loss": -1.0, "fwt_target_loss": 0.5, "forgetting_target_loss_a": 1.0}
    )


def test_one_stage_has_no_transfer():
    assert C.average([[0.0], [0.5]]) == 0.5
    assert math.isnan(C.backward_transfer([[0.0], [0.5]], True))
    assert math.isnan(C.forward_transfer([[0.0], [0.5]], True))
    assert C.forgetting([[0.0], [0.5]], True) == []


def test_a_ragged_matrix_is_refused():
    with pytest.raises(ValueError):
        C.average([[0.1, 0.2], [0.3]])


def test_metric_directions():
    assert higher_is_better("bwt_target_loss") and higher_is_better("fwt_target_acc")
    assert not higher_is_better("forgetting_target_acc_spec") and not higher_is_better("target_bpb")


def test_bits_per_byte():
    assert bits_per_byte(8 * math.log(2), 4) == pytest.approx(2.0)
    assert math.isnan(bits_per_byte(1.0, 0))
