"""Continual-learning metrics of a sequential task: pure functions of the stage × task matrix.

R has T + 1 rows and T columns: R[i][j] is the score on stage j+1's target set after the first i
stages were trained (row 0: every stage's new tokens added at their initialisation, nothing
trained). With T stages, following GEM (Lopez-Paz & Ranzato 2017, "Gradient Episodic Memory
for Continual Learning", §5) with b_j = R[0][j] as the "untrained" baseline:

    average          = 1/T       Σ_j        R[T][j]
    backward transfer = 1/(T−1)  Σ_{j<T−1} (R[T][j] − R[j+1][j])      final vs. right after learning j
    forward transfer  = 1/(T−1)  Σ_{j≥1}   (R[j][j] − R[0][j])        before learning j vs. untrained
    forgetting of j   = max_{j+1 ≤ l < T} R[l][j] − R[T][j],  j < T−1  (Chaudhry et al. 2018, RWalk)

Sign convention: transfer > 0 is good (an improvement), forgetting > 0 is bad. For a metric where
lower is better (a loss) every difference is negated, so the signs keep their meaning. Avalanche's
`forgetting` differs: it takes R[j+1][j] − R[T][j] (the value right after training, not the best),
and its BWT is minus that.
"""

from __future__ import annotations

from collections.abc import Sequence

Matrix = Sequence[Sequence[float]]


def _stages(R: Matrix) -> int:
    T = len(R) - 1
    if T < 1 or any(len(row) != T for row in R):
        raise ValueError(f"a stage matrix needs T+1 rows of T values, got {[len(r) for r in R]}")
    return T


def _gain(new: float, old: float, higher_is_better: bool) -> float:
    return new - old if higher_is_better else old - new


def average(R: Matrix) -> float:
    T = _stages(R)
    return sum(R[T]) / T


def backward_transfer(R: Matrix, higher_is_better: bool) -> float:
    T = _stages(R)
    if T < 2:
        return float("nan")
    return sum(_gain(R[T][j], R[j + 1][j], higher_is_better) for j in range(T - 1)) / (T - 1)


def forward_transfer(R: Matrix, higher_is_better: bool) -> float:
    T = _stages(R)
    if T < 2:
        return float("nan")
    return sum(_gain(R[j][j], R[0][j], higher_is_better) for j in range(1, T)) / (T - 1)


def forgetting(R: Matrix, higher_is_better: bool) -> list[float]:
    """Per stage j < T−1 (the last stage cannot have been forgotten yet)."""
    T = _stages(R)
    best = max if higher_is_better else min
    return [_gain(best(R[later][j] for later in range(j + 1, T)), R[T][j], higher_is_better) for j in range(T - 1)]


def summarize(R: Matrix, metric: str, higher_is_better: bool, stage_names: list[str]) -> dict[str, float]:
    """The run-level numbers stored with a sequential run, e.g. bwt_target_acc, forgetting_target_acc_spec."""
    values = {
        f"avg_{metric}": average(R),
        f"bwt_{metric}": backward_transfer(R, higher_is_better),
        f"fwt_{metric}": forward_transfer(R, higher_is_better),
    }
    for name, value in zip(stage_names, forgetting(R, higher_is_better)):
        values[f"forgetting_{metric}_{name}"] = value
    return values
