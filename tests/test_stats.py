"""Seed statistics, exact: Student's t intervals, Welch's test (checked against its formula), verdicts, cell text."""

import math
import statistics

import pytest
from scipy import stats as scipy_stats

from clbench.report.format import cell_text, fmt_ci
from clbench.stats import draw_means, group_p, mean_ci, paired_p, verdict, welch_p

ET = [5.18, 5.27, 5.24]  # the et on pseudowords, 100 steps, seeds 0–2
LORA = [5.10, 5.30, 5.20]


def test_mean_ci_is_students_t_half_width_and_none_for_one_seed():
    mean, half = mean_ci(ET)
    assert mean == pytest.approx(5.23, abs=1e-12)
    # t(0.975, 2) = 4.302652729749462; s = √(0.0042 / 2)
    assert half == pytest.approx(4.302652729749462 * math.sqrt(0.0021) / math.sqrt(3), rel=1e-12)
    assert half == pytest.approx(0.11383749100790277, rel=1e-12)
    assert mean_ci([0.8, 0.9])[1] == pytest.approx(12.706204736174698 * statistics.stdev([0.8, 0.9]) / math.sqrt(2))
    assert mean_ci([0.7]) == (0.7, None)  # one seed: no interval, never ±0
    assert mean_ci([0.7, float("nan")]) == (0.7, None)  # a value a run could not compute is left out
    assert mean_ci([0.0, 0.0, 0.0]) == (0.0, 0.0)  # no spread: a real zero-width interval
    mean, half = mean_ci([])
    assert math.isnan(mean) and half is None


def test_welch_p_matches_the_welch_formula_and_needs_two_seeds_a_side():
    a, b = statistics.variance(ET) / 3, statistics.variance(LORA) / 3
    t = (statistics.mean(ET) - statistics.mean(LORA)) / math.sqrt(a + b)
    df = (a + b) ** 2 / (a**2 / 2 + b**2 / 2)  # Welch–Satterthwaite
    assert welch_p(ET, LORA) == pytest.approx(2 * scipy_stats.t.sf(t, df), rel=1e-9)
    assert welch_p(ET, LORA) == pytest.approx(0.6709631037316779, rel=1e-9)
    assert welch_p([0.8], [0.1, 0.2]) is None and welch_p([0.1, 0.2], [0.9]) is None
    assert welch_p([0.0, 0.0, 0.0], [0.0, 0.0]) == 1.0  # neither varies, same value: no difference
    assert welch_p([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]) == 0.0  # neither varies, different values
    # neither varies, one value computed in two processes (xling-de's target_bpb_base): the same number
    assert welch_p([3.2287070052617133] * 3, [3.2287070608247506] * 3) == 1.0
    assert welch_p([3.2287] * 3, [3.2288] * 3) == 0.0  # 3e-5 apart: a difference, however small


def test_verdict_against_the_best():
    assert verdict(ET, LORA, is_best=True) == "best"
    assert verdict(ET, LORA) == "n.s."  # p = 0.671
    # equal variances (s = 0.1 each): Welch's df is 4, t = 0.9 / √(0.02 / 3)
    assert welch_p([6.0, 6.1, 6.2], LORA) == pytest.approx(
        2 * scipy_stats.t.sf(0.9 / math.sqrt(0.02 / 3), 4), rel=1e-9
    )
    assert verdict([6.0, 6.1, 6.2], LORA) == "worse"  # p = 0.000385
    assert verdict([5.9], LORA) == "1 seed" and verdict(ET, [5.0]) == "1 seed"


# two groups over data draws 0-2 × 2 seeds: a large draw effect both share, x above et by 0.10-0.12 on every draw
DRAWS = [0, 0, 1, 1, 2, 2]
ET_DRAWN = [4.0, 4.02, 5.0, 5.02, 6.0, 6.02]
X_DRAWN = [4.10, 4.12, 5.12, 5.14, 6.11, 6.13]


def test_paired_p_is_the_paired_t_test_with_its_edge_cases():
    # differences 0.5, 0.7, 0.6: t = 0.6 / (0.1 / √3) = 10.39 on 2 df
    assert paired_p([5.5, 5.9, 5.7], [5.0, 5.2, 5.1]) == pytest.approx(
        2 * scipy_stats.t.sf(0.6 / (0.1 / math.sqrt(3)), 2), rel=1e-9
    )
    assert paired_p([5.5, 5.9, 5.7], [5.0, 5.2, 5.1]) == pytest.approx(0.009132611386275467, rel=1e-9)
    assert paired_p([1.0, 2.0], [1.0, 2.0]) == 1.0  # every difference 0: no difference (scipy: NaN)
    assert paired_p([1.0, 2.0, math.nan], [0.0, 1.0, 5.0]) == 0.0  # the same difference twice; the NaN pair left out
    assert paired_p([1.0], [0.0]) is None


def test_groups_that_pool_data_draws_are_tested_paired_by_draw_and_others_by_welch():
    # over runs the draw effect swamps the difference (Welch p = 0.836); paired by draw it is the whole signal:
    # draw means 4.11 / 5.13 / 6.12 vs 4.01 / 5.01 / 6.01, differences 0.10, 0.12, 0.11 → t = 0.11 / (0.01 / √3)
    assert welch_p(X_DRAWN, ET_DRAWN) == pytest.approx(0.8360146790242254, rel=1e-9)
    p, n = group_p(X_DRAWN, ET_DRAWN, DRAWS, DRAWS)
    assert n == 3 and p == pytest.approx(2 * scipy_stats.t.sf(0.11 / (0.01 / math.sqrt(3)), 2), rel=1e-6)
    assert p == pytest.approx(0.0027434893944260487, rel=1e-6)
    assert verdict(X_DRAWN, ET_DRAWN, draws=DRAWS, best_draws=DRAWS) == "worse"
    assert verdict(X_DRAWN, ET_DRAWN) == "n.s."  # the same values, no draws named: Welch over runs
    # one side holds one draw, or names none: Welch over runs
    assert group_p(X_DRAWN, ET_DRAWN, DRAWS, [0] * 6) == (welch_p(X_DRAWN, ET_DRAWN), 0)
    assert group_p(X_DRAWN, ET_DRAWN, DRAWS, [None] * 6) == (welch_p(X_DRAWN, ET_DRAWN), 0)
    # draws 0, 1 shared of 0, 1, 3 and 0, 1, 2: paired on those two (differences 0.10, 0.12)
    p, n = group_p(X_DRAWN, ET_DRAWN, [0, 0, 1, 1, 3, 3], DRAWS)
    assert n == 2 and p == pytest.approx(2 * scipy_stats.t.sf(0.11 / (0.01 * math.sqrt(2) / math.sqrt(2)), 1))
    assert draw_means(X_DRAWN, DRAWS, [0, 2, 7]) == pytest.approx({0: 4.11, 2: 6.12})


def test_cell_text_rounds_the_mean_to_the_intervals_second_digit_and_marks_the_verdict():
    assert fmt_ci(5.23, 0.11383749100790277) == "5.23 ± 0.11"
    assert fmt_ci(0.85, 0.6353102368087346) == "0.85 ± 0.64"
    assert fmt_ci(1.75, 3.177) == "1.8 ± 3.2"
    assert fmt_ci(1234.5, 56.0) == "1234 ± 56"  # round half to even
    assert fmt_ci(-0.0004, 0.05) == "0.000 ± 0.050"  # no "-0.000"
    assert fmt_ci(0.0, 0.0) == "0 ± 0" and fmt_ci(0.7, None) == "0.7" and fmt_ci(0.7, float("nan")) == "0.7"
    # three equal seeds whose mean is not exact in binary: an interval of float rounding is none
    same = [0.9733333333333334] * 3
    assert fmt_ci(*mean_ci(same)) == "0.9733 ± 0" and fmt_ci(14.752941166345815, 5.4e-15) == "14.75 ± 0"
    assert fmt_ci(0.5, 1e-9) == "0.5000000000 ± 0.0000000010"  # a real, if tiny, spread stays
    row = {"mean": 5.23, "ci95": 0.1138, "eval_se": 0.012, "verdict": "n.s."}
    assert cell_text(row) == "5.23 ± 0.11 [0.012] ≈"
    assert cell_text(row | {"verdict": "best"}) == "5.23 ± 0.11 [0.012]"  # bold is the table's
    assert cell_text({"mean": 5.9, "ci95": float("nan"), "eval_se": float("nan"), "verdict": "1 seed"}) == "5.9 ?"
    assert cell_text({"mean": 6.1, "ci95": 0.2484, "eval_se": float("nan"), "verdict": "worse"}) == "6.10 ± 0.25"
