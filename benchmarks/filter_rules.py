"""What the three group-filter rules keep at rho = 0.9 on RAGEN-2's batch shape (8 groups x 16 rollouts), on
0/1 and on graded rewards, against no filter (8 of 8 groups).

The rules, as ``llm_gym.trainer.snr_filter.decide`` runs them:

* RAGEN's main-table rule (the ``ragen2`` profile): ``softmax_top_p`` over the group reward std, zero-std groups
  included (RAGEN ``scripts/runs/run_main_table_diff_algo.sh``, ``ragen/trainer/rollout_filter.py``);
* llm-gym's ``top_p`` (the ``recommended`` profile): linear top-p over the variance mass, zero groups excluded,
  slack 0.01 in reward units (1e-4 on the variance);
* ``upstream_top_p``: the rule RAGEN's authors proposed to TRL / veRL / SkyRL: linear top-p over the variance mass,
  zero groups excluded, ``selection_eps`` 0.01 in variance units.

Rewards are simulated: every group draws its own difficulty, every rollout its outcome (see ``REGIMES``). The
numbers describe the rules, not a training run; a run's own ``snr/kept_groups`` is logged every round.

    python benchmarks/filter_rules.py              # 20,000 batches per regime (a few seconds)
    python benchmarks/filter_rules.py --quick      # 500 batches
"""

from __future__ import annotations

import argparse

import numpy as np
from llm_gym.trainer.snr_filter import decide

P, G, RHO = 8, 16, 0.9

RULES = {
    "RAGEN main table (softmax over std, zero groups in)": dict(
        strategy="softmax_top_p", include_zero=True, metric="std"
    ),
    "llm-gym top_p (variance, eps 0.01 squared)": dict(
        strategy="top_p", include_zero=False, metric="variance"
    ),
    "upstream_top_p (variance, eps 0.01 as given)": dict(
        strategy="upstream_top_p", include_zero=False, metric="variance"
    ),
}


def _binary(rng: np.random.Generator, p: np.ndarray) -> np.ndarray:
    return (rng.uniform(size=(P, G)) < p[:, None]).astype(float)


def _zero_one(rng: np.random.Generator) -> np.ndarray:
    return _binary(rng, rng.uniform(0, 1, P))


def _zero_one_saturated(rng: np.random.Generator) -> np.ndarray:
    # half the groups already always fail or always succeed (their std is 0), the rest anywhere in between
    p = np.where(rng.uniform(size=P) < 0.5, rng.choice([0.0, 1.0], P), rng.uniform(0, 1, P))
    return _binary(rng, p)


def _zero_one_rare(rng: np.random.Generator) -> np.ndarray:
    return _binary(rng, rng.uniform(0, 0.1, P))  # early training: a success is rare


def _frozen_lake(rng: np.random.Generator) -> np.ndarray:
    # goal 1 or 0, minus the format penalty 0.1 per invalid turn (up to 5 turns, 10% invalid)
    return _zero_one(rng) - 0.1 * rng.binomial(5, 0.1, (P, G))


def _countdown(rng: np.random.Generator) -> np.ndarray:
    # 1 for the target, the format score 0.1 for the right numbers with another value, else 0
    right = rng.uniform(0, 1, P)[:, None]
    numbers = rng.uniform(0, 1, P)[:, None]
    u = rng.uniform(size=(P, G))
    return np.where(u < right, 1.0, np.where(u < right + (1 - right) * numbers, 0.1, 0.0))


def _countdown_early(rng: np.random.Generator) -> np.ndarray:
    # no expression reaches the target yet: 0.1 for the right numbers, else 0
    return 0.1 * _binary(rng, rng.uniform(0, 1, P))


def _frozen_lake_early(rng: np.random.Generator) -> np.ndarray:
    # no goal reached yet: only the format penalties (0.1 per invalid turn) spread the returns
    return -0.1 * rng.binomial(5, rng.uniform(0, 0.3, P)[:, None], (P, G))


def _sokoban(rng: np.random.Generator) -> np.ndarray:
    # solved: +10 and +1 for the box, -0.1 per step; else -0.1 per step and per invalid turn
    solved = _binary(rng, rng.uniform(0, 0.5, P)).astype(bool)
    steps = rng.integers(1, 11, (P, G))
    fail = -0.1 * steps - 0.1 * rng.binomial(5, 0.2, (P, G))
    return np.where(solved, 11.0 - 0.1 * steps, fail)


REGIMES = {
    "0/1, success rate per group ~ U(0, 1)": _zero_one,
    "0/1, half the groups all-0 or all-1": _zero_one_saturated,
    "0/1, success rate per group ~ U(0, 0.1)": _zero_one_rare,
    "graded: FrozenLake (0/1 minus 0.1 per invalid turn)": _frozen_lake,
    "graded: Countdown (0 / 0.1 / 1)": _countdown,
    "graded: Sokoban returns (-1.5 .. 10.9)": _sokoban,
    "graded, small: Countdown before any hit (0 / 0.1)": _countdown_early,
    "graded, small: FrozenLake before any goal (penalties only)": _frozen_lake_early,
}


def measure(make_rewards, rule: dict, batches: int, seed: int) -> tuple[float, float, float]:
    """Mean kept groups (of P), the share of skipped batches, and the mean share of the variance mass kept."""
    rng = np.random.default_rng(seed)
    kept, skipped, mass = 0.0, 0, 0.0
    for _ in range(batches):
        d = decide(make_rewards(rng).reshape(-1), G, value=RHO, eps=0.01, **rule)
        kept += d.keep_groups.sum()
        skipped += d.skip
        total = d.variances.sum()
        mass += d.variances[d.keep_groups].sum() / total if total > 0 else 0.0
    return kept / batches, skipped / batches, mass / batches


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=20_000)
    p.add_argument("--quick", action="store_true", help="500 batches per regime")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    batches = 500 if a.quick else a.batches
    print(f"{batches} batches of {P} groups x {G} rollouts per regime, rho {RHO}; no filter keeps {P} of {P}")
    print("kept groups of 8 (ratio to no filter) / batches skipped / share of the variance mass kept\n")
    names = list(RULES)
    print("| rewards | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for i, (regime, make_rewards) in enumerate(REGIMES.items()):
        cells = []
        for rule in RULES.values():
            k, s, m = measure(make_rewards, rule, batches, a.seed + i)
            cells.append(f"{k:.2f} ({k / P:.2f}) / {s:.1%} / {m:.0%}")
        print(f"| {regime} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
