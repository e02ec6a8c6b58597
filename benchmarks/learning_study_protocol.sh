#!/usr/bin/env bash
# The learning study as docs/learning-study.md reports it: learning-rate pilots on pilot seeds, then no filter
# vs the SNR filter, 2 training seeds, 128 held-out seeds, on FrozenLake (6 steps) and Bandit (10 steps); two
# lanes in parallel (one torch thread each, for a 2-core machine), merged into docs/data and docs/img at the end.
#
#   bash benchmarks/learning_study_protocol.sh [OUT_DIR]        # about 80 min wall on 2 cores, 18 GB RAM
#
# The learning rate of each environment is chosen by `learning_study.py --pick-lr` (highest success on the
# pilot seeds 5000..5031 after 4 steps); the held-out seeds 200000.. are played only after training.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/learning_study}
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT")" ]; then
  echo "learning_study_protocol: $OUT is not empty; give a new folder" >&2
  exit 2
fi
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MPLBACKEND=Agg
# the project's venv (scripts/setup.sh) unless PYTHON names another interpreter
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi
PY=${PYTHON:-python}
LS=(benchmarks/learning_study.py)
BASE=(--num-prompts 4 --num-generations 4 --bf16)
# FrozenLake rounds are accumulated in micro-batches of 4 rollouts in the study (a micro-batch of 8 peaks at
# 14 GB resident, and the two lanes train FrozenLake at the same time); the pilots keep 8 (one at a time).
declare -A STUDY_MB=([FrozenLake]=4 [Bandit]=8)

pilot() { # ENV LR...: one no-filter run per learning rate, 4 steps, training seed 7, pilot seeds 5000..5031
  local env=$1 skip=() files=()
  shift
  for lr in "$@"; do
    local d=$OUT/pilot_${env}_$lr
    "$PY" "${LS[@]}" --envs "$env" --conditions no_filter --train-seeds 7 --max-steps 4 "${BASE[@]}" \
      --micro-batch 8 --learning-rate "$lr" --eval-seed 5000 --num-eval-seeds 32 "${skip[@]}" \
      --out-dir "$d" --png "$d/curve.png" --work-dir "$d/runs" >"$d.log" 2>&1 || return 1
    skip=(--skip-untrained)
    files+=("$d/learning_study.json")
  done
  "$PY" "${LS[@]}" --pick-lr "${files[@]}" >"$OUT/pick_$env.txt" || return 1
  tail -n 1 "$OUT/pick_$env.txt" >"$OUT/lr_$env.tmp" && mv "$OUT/lr_$env.tmp" "$OUT/lr_$env.txt"
}

study() { # ENV SEED STEPS [--skip-untrained]: both conditions, 128 held-out seeds
  local env=$1 seed=$2 steps=$3
  shift 3
  while [ ! -s "$OUT/lr_$env.txt" ]; do # the other lane may still be piloting
    [ -e "$OUT/failed" ] && return 1
    sleep 20
  done
  local d=$OUT/${env}_seed$seed
  "$PY" "${LS[@]}" --envs "$env" --train-seeds "$seed" --max-steps "$steps" "${BASE[@]}" \
    --micro-batch "${STUDY_MB[$env]}" --learning-rate "$(cat "$OUT/lr_$env.txt")" --num-eval-seeds 128 "$@" \
    --out-dir "$d" --png "$d/curve.png" --work-dir "$d/runs" >"$d.log" 2>&1
}

trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
# The untrained model is evaluated once per environment; the two lanes take about the same time. (Commands in a
# && list do not stop on errors under `set -e`: the functions return 1 themselves.)
(pilot FrozenLake 1e-5 5e-5 && study FrozenLake 0 6) || { touch "$OUT/failed"; exit 1; } &
lane_a=$!
(
  pilot Bandit 1e-5 5e-5 2e-4 && study Bandit 1 10 --skip-untrained && study Bandit 0 10 &&
    study FrozenLake 1 6 --skip-untrained
) || { touch "$OUT/failed"; exit 1; } &
lane_b=$!
wait "$lane_a"
wait "$lane_b"
"$PY" "${LS[@]}" --merge "$OUT"/{FrozenLake_seed0,FrozenLake_seed1,Bandit_seed0,Bandit_seed1}/learning_study.json --publish
