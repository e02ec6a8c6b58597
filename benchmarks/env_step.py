"""Steps per second of llmgym/FrozenLake-v0 (text parse + step + text observation) against Gymnasium's
FrozenLake-v1 (integer actions), both built with ``gym.make`` and its default wrappers, in the same run.

    OMP_NUM_THREADS=1 python benchmarks/env_step.py [--steps 200000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import llm_gym  # noqa: F401  (registers llmgym/* ids)
from llm_gym.envs.frozen_lake.env import ACTIONS


def run(env: gym.Env, actions: list, steps: int) -> tuple[float, float, int]:
    """Seconds spent in ``step`` and in ``reset`` over ``steps`` steps (resetting whenever an episode ends),
    and the number of resets."""
    clock = time.perf_counter
    env.reset(seed=0)
    n = len(actions)
    step_s = reset_s = 0.0
    resets = 0
    for i in range(steps):
        t0 = clock()
        _, _, term, trunc, _ = env.step(actions[i % n])
        t1 = clock()
        step_s += t1 - t0
        if term or trunc:
            env.reset()
            reset_s += clock() - t1
            resets += 1
    return step_s, reset_s, resets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    ints = [int(a) for a in rng.integers(0, 4, size=4096)]
    texts = [f"<think>I will go {ACTIONS[a].lower()}.</think><answer>{ACTIONS[a]}</answer>" for a in ints]
    theirs = gym.make("FrozenLake-v1")  # slippery by default, like llmgym/FrozenLake-v0
    ours = gym.make("llmgym/FrozenLake-v0", max_actions_per_turn=1)

    results = {"theirs": [], "ours": []}
    for _ in range(args.repeats):  # interleave so both see the same machine state
        results["theirs"].append(run(theirs, ints, args.steps))
        results["ours"].append(run(ours, texts, args.steps))
    rows = {}
    for name, label in (
        ("theirs", "gymnasium FrozenLake-v1 (int action)"),
        ("ours", "llmgym/FrozenLake-v0 (text)"),
    ):
        step_s = min(r[0] for r in results[name])
        best = min(results[name], key=lambda r: r[1] / max(r[2], 1))
        reset_us = 1e6 * best[1] / max(best[2], 1)
        rows[name] = (step_s, reset_us)
        print(
            f"{label:40s} {args.steps / step_s:10,.0f} steps/s  {1e6 * step_s / args.steps:6.2f} us/step"
            f"  reset {reset_us:6.1f} us"
        )
    ratio = rows["ours"][0] / rows["theirs"][0]
    print(f"step cost ratio ours/gymnasium: {ratio:.2f}x  (target <= 2.00x)")
    print(
        f"reset cost ratio ours/gymnasium: {rows['ours'][1] / rows['theirs'][1]:.2f}x  "
        "(ours draws a new random map with a path check; theirs reuses a fixed map)"
    )


if __name__ == "__main__":
    main()
