#!/usr/bin/env bash
# More data draws of a task (issue 37, item 4): each method's test runs, seeds 0,1,2, on data_seed 1 and 2 (which
# word each pseudo-word stands for, which sentences), at the method's validation choice stored in the same
# database (its `tuned` row; for a method run at a fixed lr, the lr of its data_seed 0 test runs). The lr is not
# searched again per draw: it was chosen on validation for the task, and a draw changes the words, not what the
# method is. Finished runs are kept, so a stopped chain resumes when started again.
#
#   bench/data_draws.sh pseudowords results.duckdb et fft nonew lora
#
# DRAWS="1 2 3" draws others. The tables pool the draws (clbench/report/load.py DRAWS) and say so.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: bench/data_draws.sh TASK DB METHOD..." >&2
    exit 2
fi
task=$1 db=$2
shift 2
lr_of() {
    python3 - "$task" "$db" "$1" <<'PY'
import sys
import duckdb
task, db, method = sys.argv[1:]
con = duckdb.connect(db, read_only=True)
# A searched method's lr is its stored validation choice: a search that moved past an edge leaves test runs at
# the first choice too (ewc on pseudowords-cpu-v3 at 3.7e-5, then 1.23e-5), and the choice is the later one.
lrs = con.execute("SELECT DISTINCT lr FROM tuned WHERE task = ? AND method = ?", [task, method]).fetchall()
if not lrs:
    lrs = con.execute(
        "SELECT DISTINCT CAST(json_extract(config, '$.method_config.lr') AS DOUBLE) FROM runs WHERE task = ? "
        "AND method = ? AND status = 'finished' AND json_extract_string(config, '$.split') = 'test' "
        "AND coalesce(CAST(json_extract(config, '$.params.data_seed') AS INTEGER), 0) = 0",
        [task, method],
    ).fetchall()
if len(lrs) != 1:
    sys.exit(f"bench/data_draws.sh: {method} has {len(lrs)} lrs (tuned, else data_seed 0 test runs) in {db}, not one")
print(repr(lrs[0][0]))
PY
}
for method in "$@"; do
    lr=$(lr_of "$method")
    for draw in ${DRAWS:-1 2}; do
        echo "== $(date -u +%FT%TZ) $task $method: data_seed $draw, lr $lr, seeds 0,1,2"
        clbench run --task "$task" --profile cpu --method "$method" --param data_seed="$draw" --set lr="$lr" \
            --seeds 0,1,2 --db "$db"
    done
done
echo "== $(date -u +%FT%TZ) done"
