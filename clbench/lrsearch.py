"""The rules of a learning-rate search, pure and torch-free: `clbench tune` applies them, `clbench merge`
combines two databases' searches by them, and the reports say where each choice sits in its search.

A search is a list of points {lr, seeds, values, mean, run_ids}, one per lr, sorted by lr.
"""

from __future__ import annotations

import math

from clbench.errors import ClbenchError


def mean(values: list[float]) -> float:
    """Mean over seeds; +inf when any seed failed, so a point that diverges once is never chosen."""
    return sum(values) / len(values) if values and all(math.isfinite(v) for v in values) else math.inf


def choose(search: list[dict]) -> dict:
    """The grid point with the lowest finite mean; ties to the smaller lr."""
    finite = [point for point in search if math.isfinite(point["mean"])]
    if not finite:
        raise ClbenchError("every learning rate of the grid diverged or scored non-finite: widen the grid downwards")
    return min(finite, key=lambda point: (point["mean"], point["lr"]))


def edge(search: list[dict], lr: float) -> str:
    """Where the chosen lr sits among the lrs searched: "inside", "low edge", "high edge" or "one point".

    A choice on an edge was never compared with a point beyond it, so the best lr may lie there. A diverged
    point counts as searched: a choice below one is bracketed by it."""
    lrs = sorted(point["lr"] for point in search)
    if len(lrs) < 2:
        return "one point"
    return "low edge" if lr == lrs[0] else "high edge" if lr == lrs[-1] else "inside"


def next_point(search: list[dict], lr: float) -> float | None:
    """The lr one grid step past the edge a choice sits on (the ratio of the two outermost lrs on that side),
    to 3 significant digits; None for a choice inside its search, or in a search of one point (no step)."""
    where, lrs = edge(search, lr), sorted(point["lr"] for point in search)
    if where not in ("low edge", "high edge"):
        return None
    step = lrs[0] ** 2 / lrs[1] if where == "low edge" else lrs[-1] ** 2 / lrs[-2]
    step = float(f"{step:.3g}")
    return None if step in lrs else step


def edge_hint(search: list[dict], lr: float) -> str:
    """A sentence for a choice on an edge, with the next point past it (next_point); "" for one inside."""
    where, after = edge(search, lr), next_point(search, lr)
    side = {"low edge": "lowest lr searched: search below", "high edge": "highest lr searched: search above"}
    if where in side:
        return f"the choice {lr:g} is the {side[where]} it too" + (f" (e.g. --grid {after:g})" if after else "")
    if where == "one point":
        return f"only lr {lr:g} was searched: nothing was chosen against it"
    return ""


def extended(stored: list[dict], search: list[dict], log=lambda message: None) -> list[dict]:
    """search plus the stored points of lrs it lacks that were run on the same seeds, by lr."""
    searched = {point["lr"] for point in search}
    seeds = search[0]["seeds"]
    others = [p for p in stored if p["lr"] not in searched]
    kept = [p for p in others if p["seeds"] == seeds]
    if kept:
        log(f"  the stored search's {len(kept)} other point(s) on seeds {seeds} join the choice")
    if len(kept) < len(others):
        log("  stored points on other seeds are dropped from the search")
    return sorted(search + kept, key=lambda point: point["lr"])


def merged_search(here: list[dict], there: list[dict]) -> tuple[list[dict], dict] | None:
    """One key's stored searches from two databases → (the search both make, its choice), by extended()'s
    rule (there's points, and here's at lrs there lacks, on the same seeds); None when there adds nothing
    here lacks or was searched on other seeds (then here's stands)."""
    if not there or (here and here[0]["seeds"] != there[0]["seeds"]):
        return None
    search = extended(here, there)
    return None if search == here else (search, choose(search))
