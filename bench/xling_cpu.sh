#!/usr/bin/env bash
# The xling-de-cpu and xling-ar-cpu protocol, one method after another: each method's lr searched on validation
# (seed 0) on the grid c/3, c, 3c around its xling-es-cpu choice c, up to two more points past an edge the choice
# falls on, then seeds 0,1,2 on the test split at the choice. Finished runs are kept, so a stopped chain resumes
# where it stopped when started again on the same database.
#
#   bench/xling_cpu.sh xling-de results.duckdb distill et-full lora
#
# CENTRE=pseudowords takes each c from that task's cpu choices instead (the republication of issue 37); the
# control nonew, which trains as fft does, is centred on fft's choice where the task has none of its own.
# PAST_EDGES=N takes up to N points past an edge instead of 2.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: bench/xling_cpu.sh TASK DB METHOD..." >&2
    exit 2
fi
task=$1 db=$2
shift 2
# c/3, c, 3c around each method's cpu choice c in the centre task's file (xling-es), at 3 significant digits
grid_of() {
    python3 -c '
import sys
from clbench.taskspec import load_tasks
lrs = load_tasks().get(sys.argv[2]).lrs("cpu")
c = lrs.get(sys.argv[1], lrs.get("fft") if sys.argv[1] == "nonew" else None)
if c is None:
    sys.exit(f"bench/xling_cpu.sh: no {sys.argv[2]}-cpu choice for method {sys.argv[1]!r}")
print(",".join(f"{x:.3g}" for x in (c / 3, c, 3 * c)))' "$1" "${CENTRE:-xling-es}"
}
for method in "$@"; do
    grid=$(grid_of "$method")
    args=(--task "$task" --profile cpu --method "$method" --db "$db")
    echo "== $(date -u +%FT%TZ) $task $method: search $grid"
    clbench tune "${args[@]}" --grid "$grid" --past-edges "${PAST_EDGES:-2}" --seeds 0
    echo "== $(date -u +%FT%TZ) $task $method: test, seeds 0,1,2"
    clbench run "${args[@]}" --tuned --seeds 0,1,2
done
echo "== $(date -u +%FT%TZ) done"
