"""``llmgym``: look at environments and recorded episodes.

llmgym list                                    # every id, its description and its baselines
llmgym view episodes.jsonl                     # viewer window: board, reasoning, actions, reward per turn
llmgym render episodes.jsonl --out ep.gif      # headless GIF/MP4 export of one episode
llmgym play --env Sokoban                      # play an env yourself (short names or full ids)
llmgym export --env Sokoban --out expert.jsonl --verify   # solver trajectories as a chat dataset
llmgym check-template Qwen/Qwen3-0.6B           # can llmgym-train use this model's chat template? why?
llmgym serve --env Sokoban                       # serve envs over HTTP/WebSocket (OpenEnv protocol)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterator, Sequence

from llm_gym._cli import EXIT_CODES_HELP, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, env_help, snake_case_options
from llm_gym.registration import resolve_env_id


class UsageError(ValueError):
    """A mistake in the command line itself (exit code 2), as opposed to a failure while running (1)."""


def _json_object(text: str, flag: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{flag} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object")
    return value


def _load(path: str):
    from llm_gym.agent.records import RecordFile

    # a torn last line (its writer was killed) is skipped with a warning, not a reason to refuse the file;
    # records are read when shown (a 2 GB file costs one record at a time)
    records = RecordFile(path, on_torn=lambda message: print(f"warning: {message}", file=sys.stderr))
    if not records:
        raise ValueError(f"{path} holds no episode records")
    return records


def _episode_index(value: int, n: int) -> int:
    index = value + n if value < 0 else value
    if not 0 <= index < n:
        raise ValueError(f"episode index {value} is out of range: the file has {n} episode(s)")
    return index


def _replay_kwargs(args: argparse.Namespace) -> dict | None:
    """``--env_kwargs`` of view/render: the user's own kwargs (the only way a file path reaches a replay)."""
    if not args.env_kwargs:
        return None
    return _json_object(args.env_kwargs, "--env_kwargs")


def _cmd_view(args: argparse.Namespace) -> int:
    from llm_gym.render.viewer import run_viewer

    records = _load(args.file)
    run_viewer(
        records,
        fps=args.fps,
        episode=_episode_index(args.episode, len(records)),
        env_kwargs=_replay_kwargs(args),
    )
    return 0


def _cmd_render(args: argparse.Namespace) -> int:
    from pathlib import Path

    from llm_gym.render.export import VIDEO_SUFFIXES, export_episode
    from llm_gym.safe_io import atomic_path

    if Path(args.out).suffix.lower() not in VIDEO_SUFFIXES:  # said of the user's path, not our temporary one
        raise UsageError(f"--out must end in {' or '.join(VIDEO_SUFFIXES)}, got {args.out!r}")
    records = _load(args.file)
    index = _episode_index(args.episode, len(records))
    with atomic_path(args.out) as tmp:  # a failed render (full disk) leaves no partial GIF/MP4
        result = export_episode(
            records[index],
            tmp,
            fps=args.fps,
            cell=args.cell,
            caption_width=args.caption_width,
            hold_last=args.hold,
            env_kwargs=_replay_kwargs(args),
            max_frames=args.max_frames,
        )
    w, h = result.size
    print(f"wrote {args.out}: episode {index}, {result.n_frames} frames, {w}x{h}")
    if result.cut:
        print(
            f"warning: the episode has {len(records[index].turns) + 1} states; only the first {args.max_frames} "
            "were rendered (--max_frames)",
            file=sys.stderr,
        )
    if result.mismatch is not None:
        from llm_gym.agent.records import cut_note

        print(
            f"warning: the record does not match the environment ({result.mismatch}{cut_note(records[index])}); "
            "later frames show the recorded observations",
            file=sys.stderr,
        )
        return EXIT_RUNTIME if args.strict else EXIT_OK
    return EXIT_OK


def _cmd_play(args: argparse.Namespace) -> int:
    from llm_gym.agent.records import write_records
    from llm_gym.render.play import run_play

    try:
        env_id = resolve_env_id(args.env)
    except ValueError as e:
        raise UsageError(str(e)) from None
    kwargs = _json_object(args.env_kwargs, "--env_kwargs") if args.env_kwargs else {}
    if args.seed is not None:
        from llm_gym.registration import check_seed

        try:
            check_seed(args.seed, "--seed", allow_none=False)
        except ValueError as e:
            raise UsageError(str(e)) from None
    session = run_play(env_id, seed=args.seed, env_kwargs=kwargs)
    if args.record:
        played = [r for r in session.records if r.turns]
        n = write_records(args.record, played)
        print(f"wrote {n} episode(s) to {args.record}")
    return 0


def _read_export(path: str, fmt: str) -> Iterator[dict]:
    """The rows of an export written in ``fmt`` (``hf``: a ``datasets`` folder, else JSONL)."""
    from llm_gym.agent.export import read_jsonl

    if fmt == "hf":
        from datasets import load_from_disk

        check_hf_folder(path)
        return iter(load_from_disk(path))
    return read_jsonl(path)


def check_hf_folder(path: str) -> None:
    """Refuse a ``datasets`` folder whose ``state.json`` names data files outside it: ``load_from_disk`` opens
    every ``_data_files`` entry as given, so ``../../etc/passwd`` there would be read (and its first bytes shown
    in the error). Each entry must be a plain file name of a regular file in the folder (a split folder of a
    ``DatasetDict`` is checked the same way)."""
    import os
    from pathlib import Path

    from llm_gym._jsonl import decode_json

    folder = Path(path)

    def load(p: Path) -> object:
        if p.is_symlink() or not p.is_file():
            raise ValueError(f"{folder} is not a datasets folder ({p.name} is missing or not a regular file)")
        with p.open("rb") as f:
            raw = f.read(1_000_001)
        if len(raw) > 1_000_000:
            raise ValueError(f"{p}: larger than 1,000,000 bytes; not a datasets folder's {p.name}")
        try:
            return decode_json(raw)
        except ValueError as e:
            raise ValueError(f"{p}: {e}") from None

    def plain(name: object, where: Path) -> Path:
        if (
            not isinstance(name, str)
            or not name
            or name in (".", "..")
            or "/" in name
            or "\\" in name
            or os.path.isabs(name)
        ):
            raise ValueError(
                f"{where}: {str(name)[:80]!r} is not a file name inside the folder; refusing to read it"
            )
        return where.parent / name

    if (folder / "dataset_dict.json").is_file():
        splits = load(folder / "dataset_dict.json")
        names = splits.get("splits") if isinstance(splits, dict) else None
        if not isinstance(names, list):
            raise ValueError(f"{folder / 'dataset_dict.json'}: no list of splits")
        for name in names:
            sub = plain(name, folder / "dataset_dict.json")
            check_hf_folder(str(sub))
        return
    state = load(folder / "state.json")
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not files:
        raise ValueError(f"{folder / 'state.json'}: no _data_files list")
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        target = plain(name, folder / "state.json")
        if target.is_symlink() or not target.is_file():
            raise ValueError(f"{folder}: data file {target.name!r} is missing or not a regular file")


def _cmd_export(args: argparse.Namespace) -> int:
    from llm_gym.agent.export import iter_export, verify_rows, write_jsonl

    kwargs = _json_object(args.env_kwargs, "--env_kwargs") if args.env_kwargs else {}
    if args.check:
        return _report_problems(
            verify_rows(_read_export(args.check, args.format), env_kwargs=kwargs, keep=SHOWN_PROBLEMS),
            args.check,
        )
    if not args.env or not args.out:
        raise UsageError("export needs --env and --out (or --check FILE to verify an existing export)")
    if args.num_episodes < 1 or args.seed < 0:
        raise UsageError("--num_episodes must be positive and --seed non-negative")
    if args.format == "hf" and args.num_episodes > MAX_HF_EPISODES:
        raise UsageError(
            f"--format hf holds every row in memory: at most {MAX_HF_EPISODES:,} episodes (write JSONL for more; "
            "datasets.load_dataset('json', ...) reads it)"
        )
    try:
        env_id = resolve_env_id(args.env)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.expert_fraction is not None and args.policy == "random":  # a mix is what --expert_fraction asks
        raise UsageError("--expert_fraction mixes expert and random episodes; leave out --policy random")
    fraction = (
        {"expert": 1.0, "random": 0.0}[args.policy] if args.expert_fraction is None else args.expert_fraction
    )
    if not 0.0 <= fraction <= 1.0:
        raise UsageError(f"--expert_fraction must be in [0, 1], got {fraction}")
    skipped: list[tuple[int, str]] = []
    n_skipped = 0
    policies: Counter[str] = Counter()
    seeds = range(args.seed, args.seed + args.num_episodes)

    def rows() -> Iterator[dict]:
        nonlocal n_skipped
        for seed, row, why in iter_export(env_id, seeds, env_kwargs=kwargs, expert_fraction=fraction):
            if row is not None:
                policies[row["policy"]] += 1
                yield row
                continue
            n_skipped += 1
            if len(skipped) < 10:
                skipped.append((seed, why))

    if args.format == "hf":
        from datasets import Dataset

        from llm_gym.safe_io import atomic_dir

        with atomic_dir(args.out) as tmp:  # a failed save leaves no partial data set folder
            data = list(rows())
            Dataset.from_list(data).save_to_disk(str(tmp))
        n = len(data)
    else:
        n = write_jsonl(rows(), args.out)  # rows are written as they are played
    played = ", ".join(f"{c} {p}" for p, c in policies.items()) or "none"
    print(
        f"wrote {n} episode(s) of {env_id} ({played}; seeds {seeds.start}..{seeds.stop - 1}) to {args.out}; "
        f"skipped {n_skipped} seed(s)"
    )
    for seed, why in skipped:
        print(f"  skipped seed {seed}: {why}")
    if args.verify:
        problems = verify_rows(_read_export(args.out, args.format), env_kwargs=kwargs, keep=SHOWN_PROBLEMS)
        return _report_problems(problems, args.out)
    return EXIT_OK


#: Failing rows ``llmgym export --check`` prints (and keeps: the others are only counted).
SHOWN_PROBLEMS = 20
#: Most episodes ``llmgym export --format hf`` takes (``Dataset.from_list`` needs every row in memory).
MAX_HF_EPISODES = 1_000_000


def _cmd_check_template(args: argparse.Namespace) -> int:
    # Lazy: the trainer (transformers, TRL) is an optional extra and heavy to import.
    try:
        from llm_gym.trainer.chat_templates import check_template
        from llm_gym.trainer.models import ModelError, load_tokenizer, resolve_model
    except ImportError as e:
        raise UsageError(
            f"check-template needs the train extra (pip install 'llm-gym[train]'): {e}"
        ) from None
    try:
        resolved = resolve_model(args.model)
        tok = load_tokenizer(resolved, chat_template=args.chat_template)
    except ModelError as e:
        raise UsageError(str(e)) from None
    except OSError as e:  # not a tokenizer folder, not in the cache, ...
        raise UsageError(f"cannot load the tokenizer of {args.model!r}: {e}") from None
    source = f"file {args.chat_template}" if args.chat_template else "the tokenizer's"
    print(f"model: {resolved}\nchat template: {source}")
    check = check_template(tok)
    for line in check.lines():
        print(f"  {line}" if not line.startswith("verdict") else line)
    return EXIT_OK if check.ok else EXIT_RUNTIME


def _cmd_serve(args: argparse.Namespace) -> int:
    from llm_gym.serve.config import ServeUsageError

    try:
        from llm_gym.serve.server import cmd_serve  # needs the serve extra
    except ImportError as e:
        raise UsageError(str(e)) from None
    try:
        return cmd_serve(args)
    except ServeUsageError as e:
        raise UsageError(str(e)) from None


def _report_problems(problems, path: str) -> int:
    from llm_gym.registration import short_repr

    for p in problems[:SHOWN_PROBLEMS]:
        # a row's seed and reason are untrusted: a 20 MB seed string is shown shortened
        print(f"row {p.index} (seed {short_repr(p.seed)}): {p.reason[:1000]}", file=sys.stderr)
    failed = getattr(problems, "failed", len(problems))
    if failed:
        print(f"{path}: {failed} row(s) failed the replay check", file=sys.stderr)
        return EXIT_RUNTIME
    print(f"{path}: every row replays exactly (and every expert row to a solved episode)")
    return EXIT_OK


#: ``llmgym list``'s default seeds: the evaluation seeds every command starts at (RAGEN's validation seeds).
LIST_SEED, LIST_NUM_SEEDS = 123, 32


def list_lines(env_ids: Sequence[str], seeds: Sequence[int] | None) -> Iterator[str]:
    """``llmgym list``'s lines: each id with its one-line description (the registry's), then, when ``seeds`` is
    given, its random valid-action and optimum baselines on those seeds (:func:`~llm_gym.agent.baselines.
    baseline_success`, the numbers every evaluation prints beside a model's). An id whose default data is not
    bundled (a hub data set) gets no baselines: computing them would start that download."""
    from llm_gym.registration import ENVS

    described = {e.id: e.description for e in ENVS}
    width = max(len(e) for e in env_ids)
    for env_id in env_ids:
        yield f"{env_id:{width}s}  {described[env_id]}"
        if seeds is None:
            continue
        yield f"{'':{width}s}    {_baselines(env_id, seeds)}"


def _baselines(env_id: str, seeds: Sequence[int]) -> str:
    from llm_gym.agent.baselines import baseline_success, format_baseline
    from llm_gym.serve.protocol import external_data

    missing = external_data(env_id)
    if missing:
        return f"baselines: n/a (its default {', '.join(missing)} is a hub data set; pass it as a kwarg)"
    try:
        b = baseline_success(env_id, seeds)
    except Exception as e:  # an id that cannot be built with its defaults says what it needs
        return f"baselines: n/a ({' '.join(str(e).split())[:200]})"
    text = format_baseline(b) or "no baselines"
    if b.get("random") is None and b.get("reason"):
        text += f" ({b['reason']})"
    return f"{text} (seeds {seeds[0]}..{seeds[-1]})"


def _cmd_list(args: argparse.Namespace) -> int:
    from llm_gym.registration import list_envs

    if args.num_eval_seeds < 0 or args.eval_seed < 0:
        raise UsageError("--eval_seed and --num_eval_seeds must be >= 0")
    seeds = range(args.eval_seed, args.eval_seed + args.num_eval_seeds) if args.num_eval_seeds else None
    for line in list_lines(list_envs(), seeds):
        print(line, flush=True)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgym", description="Look at llm-gym environments and episodes.", epilog=EXIT_CODES_HELP
    )
    sub = parser.add_subparsers(dest="command", required=True)

    ls = sub.add_parser("list", help="every environment id, its description and its baselines")
    ls.add_argument(
        "--eval_seed", type=int, default=LIST_SEED, help="first seed of the baselines (default: %(default)s)"
    )
    ls.add_argument(
        "--num_eval_seeds",
        type=int,
        default=LIST_NUM_SEEDS,
        help="seeds of the baselines (default: %(default)s; 0: ids and descriptions only)",
    )
    ls.set_defaults(func=_cmd_list)

    view = sub.add_parser("view", help="step through recorded episodes in a window")
    view.add_argument("file", help="episode records (JSONL)")
    view.add_argument("--episode", type=int, default=0, help="episode to open first (0-based; -1 = last)")
    view.add_argument("--fps", type=float, default=2.0, help="turns per second while playing")
    replay_help = (
        "JSON object of env kwargs for replaying, overriding the record's; file paths (level_file, dataset) "
        "are taken only from here, never from a record"
    )
    view.add_argument("--env_kwargs", "--env-kwargs", default=None, help=replay_help)
    view.set_defaults(func=_cmd_view)

    render = sub.add_parser("render", help="export one recorded episode as a GIF or MP4 (headless)")
    render.add_argument("file", help="episode records (JSONL)")
    render.add_argument("-o", "--out", required=True, help="output path ending in .gif or .mp4")
    render.add_argument("--episode", type=int, default=0, help="episode index (0-based; -1 = last)")
    render.add_argument("--fps", type=float, default=2.0, help="frames (turns) per second")
    render.add_argument(
        "--cell", type=int, default=None, help="board cell size in pixels (default: fit 384 px)"
    )
    render.add_argument("--caption-width", type=int, default=300, help="caption panel width in pixels")
    render.add_argument("--hold", type=int, default=2, help="extra frame-times to hold the last frame")
    render.add_argument("--strict", action="store_true", help="exit with status 1 if the replay mismatches")
    render.add_argument("--env_kwargs", "--env-kwargs", default=None, help=replay_help)
    render.add_argument(
        "--max_frames",
        "--max-frames",
        type=int,
        default=1000,
        help="render at most this many states (turns + 1)",
    )
    render.set_defaults(func=_cmd_render)

    play = sub.add_parser("play", help="play an environment yourself")
    play.add_argument(
        "--env", required=True, help=env_help("A family's short name, a variant's name or an id.")
    )
    play.add_argument(
        "--seed", type=int, default=None, help="seed of the first episode (then +1 per episode)"
    )
    play.add_argument("--env-kwargs", default=None, help="JSON object of extra env kwargs")
    play.add_argument("--record", default=None, help="append the played episodes to this JSONL file")
    play.set_defaults(func=_cmd_play)

    export = sub.add_parser(
        "export",
        help="write solver (expert) or random valid-action episodes as a chat dataset (JSONL or Hugging Face "
        "datasets)",
    )
    export.add_argument(
        "--env", default=None, help=env_help("A family's short name, a variant's name or an id.")
    )
    export.add_argument(
        "-o", "--out", default=None, help="output: a .jsonl file, or a folder with --format hf"
    )
    export.add_argument(
        "--num_episodes", type=int, default=100, help="seeds to play: --seed, --seed + 1, ..."
    )
    export.add_argument("--seed", type=int, default=0, help="first seed")
    export.add_argument(
        "--policy",
        choices=("expert", "random"),
        default="expert",
        help="who plays: the solver (expert; unsolved seeds are skipped) or the random valid-action policy "
        "(the answer format without a policy; every episode kept)",
    )
    export.add_argument(
        "--expert_fraction",
        type=float,
        default=None,
        help="mix: this share of the seeds played by the solver, the rest by the random valid-action policy",
    )
    export.add_argument(
        "--format", choices=("jsonl", "hf"), default="jsonl", help="JSONL or datasets.save_to_disk"
    )
    export.add_argument("--env_kwargs", default=None, help="JSON object of env kwargs (stored in every row)")
    export.add_argument(
        "--verify", action="store_true", help="replay every written row and exit 1 unless all are solved"
    )
    export.add_argument(
        "--check",
        default=None,
        metavar="FILE",
        help="only replay-check an existing export (with its --env_kwargs)",
    )
    export.set_defaults(func=_cmd_export)

    check = sub.add_parser(
        "check-template",
        help="check that a model's chat template works for token-exact multi-turn training, and why",
        description="Load only the tokenizer and check its chat template for llmgym-train's token-exact "
        "multi-turn rollouts: prefix-preserving (adding a turn leaves earlier text unchanged), the end-of-turn "
        "token, the generation prompt, and whether TRL ships a training variant that llmgym-train would use "
        "instead. Exit 0 if llmgym-train can train with it, 1 if not, 2 if the model cannot be loaded.",
    )
    check.add_argument("model", help="hub id (cached), local folder, LoRA adapter folder, or 'smollm2'")
    check.add_argument(
        "--chat_template", default=None, metavar="FILE", help="Jinja file replacing the tokenizer's template"
    )
    check.set_defaults(func=_cmd_check_template)

    from llm_gym.serve.config import add_parser as add_serve_parser

    add_serve_parser(sub, _cmd_serve)
    return snake_case_options(parser)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"llmgym {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, OSError) as e:
        print(f"llmgym {args.command}: error: {e}", file=sys.stderr)
        return EXIT_RUNTIME
    except MemoryError:
        print(f"llmgym {args.command}: error: out of memory", file=sys.stderr)
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
