"""Levels per second: llm-gym's Sokoban generators (with the exact optimal solution length) vs gym-sokoban's.

Also prints the optimal-length distribution of ``generator="ragen"`` (RAGEN's algorithm on ``np_random``) on
``--levels`` seeds (6x6, 1 box) next to the numbers measured from RAGEN's own generator on 2,000 seeds.

Reference: ``gym_sokoban.envs.room_utils.generate_room`` (random-walk topology + depth-first reverse play, no
solution length), loaded from its file so that gym-sokoban's package ``__init__`` (which needs ``gym``) is not
run. gym-sokoban sometimes raises on a failed room; only successful rooms are counted, failures are reported.
Both generators run in alternating slices of the same process, so load on the machine hits both alike.

    OMP_NUM_THREADS=1 python benchmarks/sokoban_generation.py [--seconds 6] [--seed 0]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import time
import warnings
from pathlib import Path

import numpy as np

from llm_gym.envs.sokoban import GeneratorConfig, RagenGeneratorConfig, generate_level, generate_ragen_level

SIZES = (((6, 6), 1), ((8, 8), 2))
#: RAGEN's generator (ragen/env/sokoban/utils.py), 6x6 with 1 box, 2,000 seeds: share of levels with optimal
#: length 1, <= 2, > 10, and the mean length.
RAGEN_TARGET = {"=1": 0.083, "<=2": 0.31, ">10": 0.007, "mean": 4.21}


def ragen_distribution(levels: int) -> dict[str, float]:
    lengths = np.array(
        [generate_ragen_level(np.random.default_rng(s)).optimal_length for s in range(levels)], dtype=float
    )
    return {
        "=1": float(np.mean(lengths == 1)),
        "<=2": float(np.mean(lengths <= 2)),
        ">10": float(np.mean(lengths > 10)),
        "mean": float(lengths.mean()),
    }


def load_room_utils():
    spec = importlib.util.find_spec("gym_sokoban")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("gym-sokoban is not installed: pip install --no-deps gym-sokoban")
    path = Path(next(iter(spec.submodule_search_locations))) / "envs" / "room_utils.py"
    module_spec = importlib.util.spec_from_file_location("gym_sokoban_room_utils", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="time per generator and room size")
    parser.add_argument("--slices", type=int, default=12, help="alternating slices per size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--levels", type=int, default=2000, help="seeds for the ragen length distribution")
    args = parser.parse_args()
    room_utils = load_room_utils()
    random.seed(args.seed)  # gym-sokoban draws from the global RNGs
    np.random.seed(args.seed)
    rng = np.random.default_rng(args.seed)

    print(f"{'room':>10} {'generator':<44} {'levels/s':>9} {'ok':>6} {'failed':>6} {'ratio':>7}")
    for dim, boxes in SIZES:
        ours = {
            "llm-gym (env default: length 2-10)": GeneratorConfig(
                dim_room=dim, num_boxes=boxes, min_optimal_length=2, max_optimal_length=10
            ),
            "llm-gym (unbounded length)": GeneratorConfig(
                dim_room=dim, num_boxes=boxes, min_optimal_length=1, max_optimal_length=None
            ),
        }
        ragen_cfg = RagenGeneratorConfig(dim_room=dim, num_boxes=boxes)
        steps = int(1.7 * sum(dim))

        def gym_sokoban_one(dim=dim, boxes=boxes, steps=steps) -> bool:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    room_utils.generate_room(dim=dim, num_steps=steps, num_boxes=boxes)
                return True
            except (RuntimeWarning, ValueError, IndexError, RecursionError):
                return False

        makers = {"gym-sokoban generate_room": gym_sokoban_one}
        for name, cfg in ours.items():
            makers[name] = lambda cfg=cfg: generate_level(rng, cfg) is not None
        makers['llm-gym generator="ragen" (depth 300)'] = lambda cfg=ragen_cfg: (
            generate_ragen_level(rng, cfg) is not None
        )
        stats = {name: [0, 0, 0.0] for name in makers}
        per_slice = args.seconds / args.slices
        for _ in range(args.slices):
            for name, make in makers.items():
                start = time.perf_counter()
                while time.perf_counter() - start < per_slice:
                    stats[name][0 if make() else 1] += 1
                stats[name][2] += time.perf_counter() - start
        ref = stats["gym-sokoban generate_room"][0] / stats["gym-sokoban generate_room"][2]
        for name, (ok, failed, elapsed) in stats.items():
            rate = ok / elapsed
            label = f"{dim[0]}x{dim[1]}/{boxes}"
            print(f"{label:>10} {name:<44} {rate:9.1f} {ok:6d} {failed:6d} {rate / ref:6.1f}x")

    dist = ragen_distribution(args.levels)
    print(
        f"\ngenerator='ragen', 6x6 / 1 box, optimal length on seeds 0..{args.levels - 1} vs RAGEN's generator:"
    )
    print(f"{'statistic':>10} {'ours':>8} {'RAGEN':>8} {'diff':>8}")
    for key in ("=1", "<=2", ">10"):
        diff = 100 * (dist[key] - RAGEN_TARGET[key])
        print(f"{key:>10} {100 * dist[key]:7.1f}% {100 * RAGEN_TARGET[key]:7.1f}% {diff:+7.1f}pp")
    print(
        f"{'mean':>10} {dist['mean']:8.2f} {RAGEN_TARGET['mean']:8.2f} {dist['mean'] - RAGEN_TARGET['mean']:+8.2f}"
    )


if __name__ == "__main__":
    main()
