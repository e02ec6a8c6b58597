"""Frames per second of ``rgb_array`` rendering: llm-gym boards vs Gymnasium's FrozenLake-v1, in one run.

    OMP_NUM_THREADS=1 SDL_VIDEODRIVER=dummy python benchmarks/render_fps.py [--frames 500]

Each env is stepped with random moves between renders (stepping is not timed); every ``render()`` returns an
``HxWx3 uint8`` array. The reference is Gymnasium's own toy-text renderer (``FrozenLake-v1``, 4x4, 256x256).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

import llm_gym  # noqa: E402,F401
from llm_gym.core import format_response  # noqa: E402


def _ours_step(env, rng):
    names = env.unwrapped.action_names
    return format_response([names[int(rng.integers(len(names)))]], "bench")


def _gym_step(env, rng):
    return int(rng.integers(env.action_space.n))


def frames_per_second(env_id: str, n_frames: int, step_fn, repeats: int = 3, **kwargs) -> tuple[float, tuple]:
    """Best-of-``repeats`` rendered frames per second, and the frame shape."""
    env = gym.make(env_id, render_mode="rgb_array", **kwargs)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    shape = env.render().shape  # warm caches (sprites, static layers, fonts)
    best = 0.0
    for rep in range(repeats):
        env.reset(seed=rep)
        elapsed = 0.0
        for _ in range(n_frames):
            _, _, terminated, truncated, _ = env.step(step_fn(env, rng))
            if terminated or truncated:
                env.reset()
            t0 = time.perf_counter()
            frame = env.render()
            elapsed += time.perf_counter() - t0
            assert frame.dtype == np.uint8 and frame.ndim == 3
        best = max(best, n_frames / elapsed)
    env.close()
    return best, shape


def _count_step(env, rng):
    return format_response([str(int(rng.integers(100)))], "bench", sep="||")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=500)
    args = parser.parse_args()
    ref_fps, ref_shape = frames_per_second("FrozenLake-v1", args.frames, _gym_step)
    rows = [
        ("gymnasium FrozenLake-v1 (reference)", ref_fps, ref_shape),
        ("llm-gym Sokoban-v0 (6x6)", *frames_per_second("llmgym/Sokoban-v0", args.frames, _ours_step)),
        (
            "llm-gym FrozenLake-v0 (4x4)",
            *frames_per_second("llmgym/FrozenLake-v0", args.frames, _ours_step),
        ),
        (
            "llm-gym Countdown-v0 (card)",
            *frames_per_second("llmgym/Countdown-v0", args.frames // 5, _count_step),
        ),
    ]
    ref_px = ref_fps * ref_shape[0] * ref_shape[1]
    print(f"{'renderer':38s} {'frame':>9s} {'frames/s':>9s} {'ratio':>7s} {'Mpx/s':>7s} {'ratio':>7s}")
    for name, fps, shape in rows:
        px = fps * shape[0] * shape[1]
        print(
            f"{name:38s} {f'{shape[1]}x{shape[0]}':>9s} {fps:9.0f} {fps / ref_fps:6.2f}x {px / 1e6:7.1f} "
            f"{px / ref_px:6.2f}x"
        )


if __name__ == "__main__":
    main()
