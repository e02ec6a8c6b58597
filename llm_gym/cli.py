"""``llmgym``: look at environments and recorded episodes.

llmgym view episodes.jsonl                     # viewer window: board, reasoning, actions, reward per turn
llmgym render episodes.jsonl --out ep.gif      # headless GIF/MP4 export of one episode
llmgym play --env Sokoban                      # play an env yourself (short names or full ids)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from llm_gym.registration import resolve_env_id


def _load(path: str):
    from llm_gym.agent.records import read_records

    records = read_records(path)
    if not records:
        raise ValueError(f"{path} holds no episode records")
    return records


def _episode_index(value: int, n: int) -> int:
    index = value + n if value < 0 else value
    if not 0 <= index < n:
        raise ValueError(f"episode index {value} is out of range: the file has {n} episode(s)")
    return index


def _cmd_view(args: argparse.Namespace) -> int:
    from llm_gym.render.viewer import run_viewer

    records = _load(args.file)
    run_viewer(records, fps=args.fps, episode=_episode_index(args.episode, len(records)))
    return 0


def _cmd_render(args: argparse.Namespace) -> int:
    from llm_gym.render.export import export_episode

    records = _load(args.file)
    index = _episode_index(args.episode, len(records))
    result = export_episode(
        records[index],
        args.out,
        fps=args.fps,
        cell=args.cell,
        caption_width=args.caption_width,
        hold_last=args.hold,
    )
    w, h = result.size
    print(f"wrote {result.path}: episode {index}, {result.n_frames} frames, {w}x{h}")
    if result.mismatch is not None:
        print(
            f"warning: the record does not match the environment ({result.mismatch}); "
            "later frames show the recorded observations",
            file=sys.stderr,
        )
        return 2 if args.strict else 0
    return 0


def _cmd_play(args: argparse.Namespace) -> int:
    from llm_gym.agent.records import write_records
    from llm_gym.render.play import run_play

    env_id = resolve_env_id(args.env)
    kwargs = json.loads(args.env_kwargs) if args.env_kwargs else {}
    if not isinstance(kwargs, dict):
        raise ValueError("--env-kwargs must be a JSON object")
    session = run_play(env_id, seed=args.seed, env_kwargs=kwargs)
    if args.record:
        played = [r for r in session.records if r.turns]
        n = write_records(args.record, played)
        print(f"wrote {n} episode(s) to {args.record}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmgym", description="Look at llm-gym environments and episodes.")
    sub = parser.add_subparsers(dest="command", required=True)

    view = sub.add_parser("view", help="step through recorded episodes in a window")
    view.add_argument("file", help="episode records (JSONL)")
    view.add_argument("--episode", type=int, default=0, help="episode to open first (0-based; -1 = last)")
    view.add_argument("--fps", type=float, default=2.0, help="turns per second while playing")
    view.set_defaults(func=_cmd_view)

    render = sub.add_parser("render", help="export one recorded episode as a GIF or MP4 (headless)")
    render.add_argument("file", help="episode records (JSONL)")
    render.add_argument("--out", required=True, help="output path ending in .gif or .mp4")
    render.add_argument("--episode", type=int, default=0, help="episode index (0-based; -1 = last)")
    render.add_argument("--fps", type=float, default=2.0, help="frames (turns) per second")
    render.add_argument(
        "--cell", type=int, default=None, help="board cell size in pixels (default: fit 384 px)"
    )
    render.add_argument("--caption-width", type=int, default=300, help="caption panel width in pixels")
    render.add_argument("--hold", type=int, default=2, help="extra frame-times to hold the last frame")
    render.add_argument("--strict", action="store_true", help="exit with status 2 if the replay mismatches")
    render.set_defaults(func=_cmd_render)

    play = sub.add_parser("play", help="play an environment yourself")
    play.add_argument("--env", required=True, help="short name (Sokoban, FrozenLake, ...) or full id")
    play.add_argument(
        "--seed", type=int, default=None, help="seed of the first episode (then +1 per episode)"
    )
    play.add_argument("--env-kwargs", default=None, help="JSON object of extra env kwargs")
    play.add_argument("--record", default=None, help="append the played episodes to this JSONL file")
    play.set_defaults(func=_cmd_play)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"llmgym {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
