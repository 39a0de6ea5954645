#!/usr/bin/env bash
# Issue 37's reruns of every text table on task version 3, one after another, each into its table's database
# under LEADERBOARD (default: this checkout's leaderboard/). Finished runs and searches are kept, so a session
# starts it again and it goes on where the last one stopped; stop it (kill), CHECKPOINT the database being
# written (duckdb.connect(path).execute("CHECKPOINT")) and commit what it holds. Run it from a frozen worktree of
# one commit so that every run of a table comes from the same code:
#
#   git worktree add --detach ../frozen HEAD && cd ../frozen && ln -s ../baselines ../tasks clbench/ &&
#     PYTHONPATH=$PWD bash bench/republish_text.sh ~/clbench/leaderboard
#
# (pyproject.toml maps clbench.baselines and clbench.tasks to the top-level folders, which a worktree on
# PYTHONPATH does not: the links make them importable there. The script stops before any run where `clbench`
# would import another checkout's code.)
# The order is the publication order: pseudowords (every method, then data draws 1 and 2), then xling-es, xling-de,
# xling-ar (every method searched on validation, bench/xling_cpu.sh, up to 4 points past an edge: pseudowords' ewc
# choice was still on its low edge after 2 in a session whose runs were lost), then what adds to published tables:
# the s sweep's seeds (0 and 1 published), ewc at two more strengths. The xling tables come before those because
# they are the ones still on task version 1, and each takes about 5 hours on 2 cores.
set -euo pipefail
export PAST_EDGES=4
here=$(cd "$(dirname "$0")" && pwd)
lb=$(cd "${1:-$here/../leaderboard}" && pwd)
say() { echo "== $(date -u +%FT%TZ) $*"; }
say "clbench $(git -C "$here" rev-parse --short HEAD) → $lb"
for module in clbench clbench.baselines clbench.tasks; do
    found=$(python3 -c "import $module, os; print(os.path.realpath($module.__path__[0]))" 2>/dev/null) || found=none
    case $found in
    "$(dirname "$here")"/*) ;;
    *) echo "bench/republish_text.sh: $module imports from $found, not this checkout (see the usage above)" >&2
       exit 1 ;;
    esac
done

pw=$lb/pseudowords-cpu-v3/results.duckdb
mkdir -p "$(dirname "$pw")"
# pseudowords-cpu-v2's validation choices (its searches read the target set, which version 3 reads as version 2)
chosen=(et:0.0333 fft:1e-4 nonew:3.33e-5 lora:1e-3 et-full:0.03)
searched=(pt replay et-out et-dict ewc distill)
methods=("${chosen[@]%%:*}" "${searched[@]}")
for pair in "${chosen[@]}"; do
    say "pseudowords ${pair%%:*} at lr ${pair##*:}"
    clbench run --task pseudowords --profile cpu --method "${pair%%:*}" --set lr="${pair##*:}" --seeds 0,1,2 --db "$pw"
done
CENTRE=pseudowords bash "$here/xling_cpu.sh" pseudowords "$pw" "${searched[@]}"
bash "$here/data_draws.sh" pseudowords "$pw" "${methods[@]}"

for lang in es de ar; do
    db=$lb/xling-$lang-cpu-v3/results.duckdb
    mkdir -p "$(dirname "$db")"
    bash "$here/xling_cpu.sh" "xling-$lang" "$db" "${methods[@]}"
done

sw=$lb/pseudowords-sweep-cpu/results.duckdb
mkdir -p "$(dirname "$sw")"
et_lr=${chosen[0]##*:}
# one seed's whole grid before the next seed's: a chain stopped midway leaves whole curves to publish
for seed in 0 1 2; do
    say "pseudowords s sweep at et's lr $et_lr, seed $seed"
    clbench sweep --task pseudowords --method et --profile cpu --n 16,32,64,128,256 --param dictionary_size=1,2,4,8 \
        --seeds "$seed" --set lr="$et_lr" --db "$sw"
done

# ewc's trade-off between learning the new words and keeping the old text, at two weaker strengths than the table's
# λ = 1e6 (whose validation curve is flat in lr: its penalty, not lr, sets how far it moves). Each λ's lr is searched
# on validation like every method's (the tune key holds λ), around fft's 1e-4, then seeds 0-2 on data draw 0.
for lam in 1e5 1e4; do
    say "pseudowords ewc at lam $lam"
    clbench tune --task pseudowords --profile cpu --method ewc --set lam="$lam" --grid 3.7e-5,1.11e-4,3.33e-4 \
        --past-edges 4 --seeds 0 --db "$pw"
    clbench run --task pseudowords --profile cpu --method ewc --set lam="$lam" --tuned --seeds 0,1,2 --db "$pw"
done
say "done"
