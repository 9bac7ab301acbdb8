#!/usr/bin/env bash
# The side-by-side runs of results/benchmarks/job_startup/README.md: one git worktree per commit (the repo's
# .venv linked in), each module run alone on the machine, one after the other. Usage:
#   bash results/benchmarks/job_startup/run_side_by_side.sh NAME COMMIT TESTS...   (writes /tmp/NAME.log)
set -euo pipefail
name=$1; commit=$2; shift 2
root=$(git rev-parse --show-toplevel)
wt=/tmp/wt-$commit
[ -d "$wt" ] || { git -C "$root" worktree add -q --detach "$wt" "$commit" && ln -s "$root/.venv" "$wt/.venv"; }
cd "$wt"
PYTHONPATH=$wt OMP_NUM_THREADS=1 .venv/bin/python -m pytest -m "not slow and not gpu" -q -p no:cacheprovider \
  --durations=0 "$@" > "/tmp/$name.log" 2>&1
tail -1 "/tmp/$name.log"
