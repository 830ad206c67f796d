#!/usr/bin/env bash
# A Hydra multirun: every combination of the comma-separated values is one evora job, run
# one after another in this process, each in its own run folder under one sweep folder:
#   runs/<date>_<time>_sweep/<job number>/
# When the jobs are done, evora writes sweep_summary.md (a table) and sweep_summary.json in
# the sweep folder: every job's overrides and results side by side.
#
#   launch/sweep.sh                                          # strategy=es,ga seed=0,1 tracking=wandb: 4 jobs
#   launch/sweep.sh strategy.sigma=0.001,0.002 seed=0,1,2    # 6 jobs, tracked locally
#   launch/sweep.sh model=qwen2_5_0_5b task=countdown hardware=gpu strategy=es,ga tracking=wandb
#
# With tracking=wandb the jobs of a sweep share one W&B group (the sweep's name); it needs
# WANDB_API_KEY or `wandb login`. On a cluster, the same sweep as one job:
#   launch/submit.sh -- -m hardware=multinode strategy=es,ga seed=0,1 tracking=wandb tracking.out_dir=/shared/runs
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EVORA=${EVORA:-$(command -v evora || echo "$ROOT/.venv/bin/evora")}

if (($# == 0)); then
  set -- strategy=es,ga seed=0,1 tracking=wandb  # the default sweep: two strategies, two seeds
fi
case "${1:-}" in
  -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;;  # the header
esac
exec "$EVORA" -m "$@"
