"""Make the README demo: a generated Sokoban level played by its optimal plan, written as LLM-style responses.

    python scripts/readme_demo.py --out docs/img/sokoban_episode.gif --viewer-png docs/img/viewer.png

The plan comes from the Sokoban solver; each turn's response has a short reasoning built from the board, so the
episode looks like what a good model would send. It is recorded as an :class:`EpisodeRecord` (JSONL) and
exported with ``llmgym render``, the same path a real evaluation run takes.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path

from llm_gym.core import format_response

_DELTA = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


def _find(rows: Sequence[str], chars: str) -> list[tuple[int, int]]:
    return [(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in chars]


def reasoning(rows: Sequence[str], moves: Sequence[str]) -> str:
    """A short first-person explanation of ``moves`` from the position ``rows`` (XSB)."""
    (player,) = _find(rows, "@+")
    boxes = set(_find(rows, "$*"))
    targets = _find(rows, ".*+")
    free = [b for b in sorted(boxes) if b not in targets]
    where = f"I am at {player}"
    if free:
        where += f", the box is at {free[0]} and the target at {[t for t in targets if t not in boxes][0]}"
    pushes = []
    r, c = player
    for m in moves:
        dr, dc = _DELTA[m]
        r, c = r + dr, c + dc
        if (r, c) in boxes:
            boxes.remove((r, c))
            boxes.add((r + dr, c + dc))
            pushes.append(m)
    plan = " then ".join(moves)
    if pushes and all(b in targets for b in boxes):
        why = f"Pushing {pushes[-1].lower()} puts the box on the target."
    elif pushes:
        why = f"Pushing the box {pushes[0].lower()} brings it closer to the target without trapping it."
    else:
        why = "I first walk around so that I stand behind the box."
    return f"{where}. {why} Moves: {plan}."


def demo_record(seed: int = 5, env_id: str = "llmgym/Sokoban-v0"):
    """The demo episode: ``env_id`` at ``seed`` played by the solver's optimal plan, two moves per turn."""
    from llm_gym.agent.records import record_episode
    from llm_gym.envs.sokoban import solve
    from llm_gym.registration import make_env

    env = make_env(env_id)
    env.reset(seed=seed)
    base = env.unwrapped
    plan = solve(base.current_level()).plan
    if not plan:
        raise ValueError(f"the solver found no plan for {env_id} seed {seed}")
    k = base.max_actions_per_turn
    chunks = [plan[i : i + k] for i in range(0, len(plan), k)]
    responses = []
    for chunk in chunks:
        responses.append(format_response(chunk, reasoning(base.board(), chunk)))
        env.step(responses[-1])  # advance the scratch env so the next reasoning sees the new board
    env.close()
    return record_episode(env_id, responses, seed=seed, meta={"policy": "optimal solver (demo)"})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img/sokoban_episode.gif")
    parser.add_argument("--records", default=None, help="also keep the episode record here (JSONL)")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--cell", type=int, default=40)
    parser.add_argument("--fps", type=float, default=1.0)
    parser.add_argument("--viewer-png", default=None, help="also save a viewer screenshot (second position)")
    args = parser.parse_args(argv)
    from llm_gym.agent.records import write_records
    from llm_gym.cli import main as cli_main

    record = demo_record(args.seed)
    if args.viewer_png:
        from llm_gym.render import require_pygame
        from llm_gym.render.viewer import ViewerState, draw_viewer

        state = ViewerState([record])
        state.handle_key("right")
        require_pygame().image.save(draw_viewer(state, (900, 480)), args.viewer_png)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.records) if args.records else Path(tmp) / "demo.jsonl"
        write_records(path, [record], append=False)
        return cli_main(
            [
                "render",
                str(path),
                "--out",
                args.out,
                "--cell",
                str(args.cell),
                "--fps",
                str(args.fps),
                "--strict",
            ]
        )


if __name__ == "__main__":
    raise SystemExit(main())
