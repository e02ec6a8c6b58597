#!/usr/bin/env bash
# The learning study, version 2, as docs/learning-study.md reports it: (a) random-valid warm start -> RL, (b) partial
# expert warm start -> RL beside the warm start alone, (c) the SNR filter against none on the partial recipe; 2
# training seeds, 128 held-out seeds, FrozenLake and Bandit; two lanes in parallel (one torch thread each, for a
# 2-core machine), merged and published into docs/ at the end.
#
#   bash benchmarks/learning_study_protocol.sh [OUT_DIR]       # resumable: rerun the same command after a crash
#
# Every part (warm start, RL run, evaluation) is saved in OUT_DIR as it finishes and skipped when the command is
# run again. The warm-start learning rate and steps per environment come from the pilots on pilot seeds
# (docs/learning-study.md; WS_FrozenLake / WS_Bandit override them as "LR STEPS"); PILOTS=1 runs the pilots again
# first (FrozenLake: about an hour of CPU) and lets `learning_study.py --pick-sft` choose. The held-out seeds
# 200000.. are played only after training. Extra llmgym-train flags for every RL run (shared-prefix training is on by
# default; e.g. --use_prefix_sharing False to time without it): TRAIN_ARGS="--flag value" bash ... OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/learning_study}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MPLBACKEND=Agg
# the project's venv (scripts/setup.sh) unless PYTHON names another interpreter
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi
PY=${PYTHON:-python}
LS=(benchmarks/learning_study.py)
# compact prompts and no demonstration: the warm start teaches the format (docs/learning-study.md)
CHAT=(--demonstration none --no-instructions)
BASE=(--bf16 --num-prompts 4 --num-generations 4 --learning-rate 1e-5 "${CHAT[@]}" --train-args "${TRAIN_ARGS:-}")
declare -A STEPS=([FrozenLake]=6 [Bandit]=10)  # RL steps
declare -A MB=([FrozenLake]=4 [Bandit]=8)      # RL micro-batch (rollouts per forward/backward)

# Warm-start learning rate and steps chosen by the pilots (docs/learning-study.md), unless PILOTS=1 chooses again.
declare -A WS=([FrozenLake]="${WS_FrozenLake:-1e-4 60}" [Bandit]="${WS_Bandit:-1e-4 10}")
declare -A WS_BATCH=([FrozenLake]=8 [Bandit]=16)      # episodes per warm-start step
declare -A WS_RANDOM=([FrozenLake]=20 [Bandit]=10)     # steps of the random-valid warm start (the format only)

pilot() { # ENV: warm-start learnability of the expert recipe, evaluated on 32 pilot seeds after each step count
  local env=$1 d=$OUT/pilot_$1
  [ -s "$OUT/ws_$env.txt" ] && return 0
  if [ "${PILOTS:-0}" != 1 ]; then
    echo "${WS[$env]}" >"$OUT/ws_$env.txt"
    return 0
  fi
  "$PY" "${LS[@]}" --pilot-sft --envs "$env" --pilot-recipe expert --ws-lrs 1e-4 --sft-eval-steps 20 40 60 \
    --ws-batch "${WS_BATCH[$env]}" --eval-seed 5000 --num-eval-seeds 32 --bf16 "${CHAT[@]}" --work-dir "$d" \
    >"$d.log" 2>&1 || return 1
  "$PY" "${LS[@]}" --pick-sft "$d/out/sft_pilot_$env.json" >"$OUT/pick_$env.txt" || return 1
  tail -n 1 "$OUT/pick_$env.txt" >"$OUT/ws_$env.tmp" && mv "$OUT/ws_$env.tmp" "$OUT/ws_$env.txt"
}

study() { # ENV SEED [--skip-untrained]: every default run of one training seed, 128 held-out seeds
  local env=$1 seed=$2
  shift 2
  while [ ! -s "$OUT/ws_$env.txt" ]; do # the other lane may still be piloting
    [ -e "$OUT/failed" ] && return 1
    sleep 20
  done
  read -r lr steps <"$OUT/ws_$env.txt"
  "$PY" "${LS[@]}" --envs "$env" --train-seeds "$seed" --max-steps "${STEPS[$env]}" --micro-batch "${MB[$env]}" \
    --ws-lr "$lr" --ws-steps "$steps" --ws-random-steps "${WS_RANDOM[$env]}" --ws-batch "${WS_BATCH[$env]}" \
    "${BASE[@]}" --num-eval-seeds 128 \
    --work-dir "$OUT/work" \
    --out-dir "$OUT/${env}_seed$seed" "$@" >>"$OUT/${env}_seed$seed.log" 2>&1
}

rm -f "$OUT/failed"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
# The untrained model is evaluated once per environment; the two lanes take about the same time. (Commands in a
# && list do not stop on errors under `set -e`: the functions return 1 themselves.)
(pilot FrozenLake && study FrozenLake 0 && study Bandit 1 --skip-untrained) || { touch "$OUT/failed"; exit 1; } &
lane_a=$!
(pilot Bandit && study Bandit 0 && study FrozenLake 1 --skip-untrained) || { touch "$OUT/failed"; exit 1; } &
lane_b=$!
wait "$lane_a"
wait "$lane_b"
"$PY" "${LS[@]}" --merge "$OUT"/{FrozenLake_seed0,FrozenLake_seed1,Bandit_seed0,Bandit_seed1}/learning_study.json \
  --work-dir "$OUT/work" --out-dir "$OUT/merged" --publish
