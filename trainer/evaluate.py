"""``llmgym-eval``: success rate, pass@k, turns and valid-action rate of a model on fixed seeds per environment.

The model is a local transformers model (hub id, folder, or the offline alias ``smollm2``) played through one
batched ``generate`` per turn, or a served model behind an OpenAI-compatible endpoint. Every episode is appended
to ``episodes.jsonl`` (the :mod:`llm_gym.agent.records` format the viewer reads) as soon as its batch ends, so an
interrupted run continues with ``--resume``; ``summary.json`` holds the metrics and a table is printed.

    llmgym-eval --model smollm2 --env FrozenLake Sokoban --num_eval_seeds 32 --samples_per_seed 4
    llmgym-eval --endpoint http://localhost:8000/v1 --model Qwen/Qwen2.5-3B-Instruct --env Countdown
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast

from llm_gym.trainer.defaults import (
    EPISODES_FILE,
    EVAL_SEED,
    EVAL_TEMPERATURE,
    EVAL_TOP_P,
    MAX_NEW_TOKENS,
)
from llm_gym.trainer.output import RUN_CHAT_FIELDS, read_run_chat

from llm_gym._cli import EXIT_CODES_HELP, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, snake_case_options
from llm_gym.agent.baselines import (  # wilson_interval re-exported: llmgym-eval's statistics
    baseline_success,
    format_rate,
    outcome_summary,
    wilson_interval,
)
from llm_gym.agent.chat import CHAT_STYLES, ChatFormat
from llm_gym.agent.chat import chat_settings as chat_settings_of
from llm_gym.agent.records import EpisodeRecord, iter_records, repair_torn_tail, write_records
from llm_gym.registration import resolve_env_id
from llm_gym.safe_io import OutputLock, OutputLockedError, atomic_write_text
from llm_gym.serve.protocol import parse_env_urls

#: RAGEN's validation seeds (= llmgym-train's ``eval_seed``), away from its training seeds (``train_seed``).
DEFAULT_SEED_START = EVAL_SEED
SUMMARY_FILE = "summary.json"


# ------------------------------------------------------------------------------------------------ statistics
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` succeeded: ``1 - C(n-c, k) / C(n, k)``."""
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per seed, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# ------------------------------------------------------------------------------------------------ envs, units
@dataclass(frozen=True)
class Unit:
    """One episode to play: environment, reset seed and sample index (``n`` samples share a seed)."""

    env_id: str
    seed: int
    sample: int


def plan_units(env_ids: Sequence[str], seeds: Sequence[int], samples: int) -> list[Unit]:
    return [Unit(e, s, k) for e in env_ids for s in seeds for k in range(samples)]


def _unit_of(rec: EpisodeRecord) -> Unit | None:
    sample = rec.meta.get("sample")
    if rec.seed is None or not isinstance(sample, int):
        return None
    return Unit(rec.env_id, int(rec.seed), sample)


def _light(rec: EpisodeRecord) -> EpisodeRecord:
    """``rec`` without its texts (replies, observations, instructions): what the summary needs (success,
    turns, rewards, each turn's info) at a small fixed cost, so resuming over a large records file holds no
    copy of it."""
    import dataclasses

    turns = [dataclasses.replace(t, response="", observation="") for t in rec.turns]
    return dataclasses.replace(rec, initial_observation="", instructions="", turns=turns)


def load_done(
    path: Path, fingerprint: dict[str, Any], env_kwargs: dict[str, Any] | None = None
) -> dict[Unit, EpisodeRecord]:
    """Records already in ``path`` (for ``--resume``), without their texts (see :func:`_light`); refuses a file
    written with other settings or env kwargs."""
    done: dict[Unit, EpisodeRecord] = {}
    if not path.exists():
        return done
    for rec in iter_records(path):
        unit = _unit_of(rec)
        if unit is None:
            continue
        theirs = rec.meta.get("eval", {})
        # JSON round trip so that e.g. tuples compare equal to the lists the file holds.
        mine = {**fingerprint, "env_kwargs": json.loads(json.dumps(dict(env_kwargs or {})))}
        if theirs != mine:
            diff = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
            raise ValueError(
                f"{path} holds episodes evaluated with different settings ({', '.join(diff)}); "
                "use another --output_dir or --overwrite_output_dir"
            )
        done[unit] = _light(rec)
    return done


# ------------------------------------------------------------------------------------------------ summary
def summarize_env(records: Sequence[EpisodeRecord], ks: Iterable[int], z: float = 1.96) -> dict[str, Any]:
    """Metrics for one environment's records: success (Wilson CI), pass@k over seeds, turns, valid actions."""
    from llm_gym.agent.rollout import episode_metrics

    n = len(records)
    wins = sum(r.success for r in records)
    lo, hi = wilson_interval(wins, n, z)
    by_seed: dict[int, list[bool]] = {}
    for r in records:
        by_seed.setdefault(int(cast(int, r.seed)), []).append(r.success)
    per_seed = min((len(v) for v in by_seed.values()), default=0)
    pass_k = {}
    for k in sorted(set(ks)):
        if by_seed and k <= per_seed:
            pass_k[f"pass@{k}"] = sum(pass_at_k(len(v), sum(v), k) for v in by_seed.values()) / len(by_seed)
    m = episode_metrics(records)
    return {
        "episodes": n,
        "seeds": len(by_seed),
        "samples_per_seed": per_seed,
        "successes": wins,
        "success_rate": wins / n if n else 0.0,
        "success_ci": [lo, hi],
        "ci_level": round(math.erf(z / math.sqrt(2)), 4),
        **pass_k,
        "mean_turns": m.get("turns", 0.0),
        "valid_action_rate": m.get("valid_action_rate", 0.0),
        "effective_action_rate": m.get("effective_action_rate", 0.0),
        "mean_reward": m.get("episode_reward", 0.0),
        # the answer format apart from the task: fully valid episodes, and the success among them
        **{k: v for k, v in outcome_summary(records, z).items() if k in ("valid", "success_given_valid")},
    }


def format_table(per_env: dict[str, dict[str, Any]]) -> str:
    """A fixed-width text table, one row per environment."""
    ks = sorted({k for s in per_env.values() for k in s if k.startswith("pass@")}, key=lambda k: int(k[5:]))
    head = [
        "env",
        "episodes",
        "success",
        "95% CI",
        *ks,
        "turns",
        "valid",
        "succ|valid",
        "reward",
        "random valid",
        "optimum",
    ]
    rows = []
    for env_id, s in per_env.items():
        lo, hi = s["success_ci"]
        rows.append(
            [
                env_id.split("/", 1)[-1],
                str(s["episodes"]),
                f"{s['success_rate']:.3f}",
                f"[{lo:.3f}, {hi:.3f}]",
                *(f"{s[k]:.3f}" if k in s else "-" for k in ks),
                f"{s['mean_turns']:.2f}",
                f"{s['valid_action_rate']:.3f}",
                format_rate(s["success_given_valid"], 2) if s.get("success_given_valid") else "-",
                f"{s['mean_reward']:.3f}",
                *(
                    format_rate(b, 3) if b else "-"
                    for b in (s.get("baseline", {}).get("random"), s.get("baseline", {}).get("optimum"))
                ),
            ]
        )
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(head), "  ".join("-" * w for w in widths), *map(line, rows)])


# ------------------------------------------------------------------------------------------------ the run
def evaluate(
    policy: Any,
    env_ids: Sequence[str],
    seeds: Sequence[int],
    *,
    samples: int = 1,
    output: str | Path,
    fingerprint: dict[str, Any],
    env_kwargs: dict[str, Any] | None = None,
    chat: Any = None,
    resume: bool = False,
    batch_size: int = 32,
    ks: Iterable[int] = (1,),
    progress: bool = True,
    env_url: str | Sequence[str] | None = None,
) -> dict[str, Any]:
    """Play every (env, seed, sample) not yet in ``output`` in batches of ``batch_size`` episodes and summarise.

    Each batch is one call to :func:`llm_gym.agent.rollout.rollout`, so the policy sees all active episodes of
    the batch at once on every turn; the batch's records are appended to ``output`` when it ends. ``chat`` is
    the :class:`llm_gym.agent.chat.ChatFormat` (e.g. a ``history_window``); put what it changes in ``fingerprint``.
    ``env_url``: play on ``llmgym serve`` servers (same episodes; not part of the fingerprint).
    """
    from llm_gym.agent.rollout import rollout

    if samples < 1 or batch_size < 1:
        raise ValueError("samples and batch_size must be >= 1")
    output = Path(output)
    env_kwargs = dict(env_kwargs or {})
    fp = dict(fingerprint)
    if resume and repair_torn_tail(output):  # a killed run's half-written last line; it is played again
        print(
            f"llmgym-eval: {output}: removed a torn last line (the previous run was interrupted)",
            file=sys.stderr,
        )
    done = load_done(output, fp, env_kwargs) if resume else {}
    if not resume and output.exists() and output.stat().st_size > 0:
        raise ValueError(
            f"{output} already has episodes; pass --resume to continue it or --overwrite_output_dir to replace it"
        )
    units = plan_units(env_ids, seeds, samples)
    todo = [u for u in units if u not in done]
    bar = _progress(len(units), len(units) - len(todo), progress)
    t0 = time.perf_counter()
    played = 0
    try:
        for env_id in env_ids:
            env_todo = [u for u in todo if u.env_id == env_id]
            for start in range(0, len(env_todo), batch_size):
                chunk = env_todo[start : start + batch_size]
                meta = {"eval": {**fp, "env_kwargs": env_kwargs}}
                records = rollout(
                    env_id,
                    [u.seed for u in chunk],
                    policy,
                    env_kwargs=env_kwargs,
                    chat=chat,
                    meta=meta,
                    env_url=env_url,
                )
                for u, rec in zip(chunk, records):
                    rec.meta.update(sample=u.sample, group=u.seed, group_index=u.sample)
                write_records(output, records)
                for u, rec in zip(chunk, records):
                    done[u] = _light(rec)
                played += len(records)
                bar.update(len(records))
    finally:
        bar.close()
    elapsed = time.perf_counter() - t0
    per_env = {e: summarize_env([done[u] for u in units if u.env_id == e], ks) for e in env_ids}
    return {
        "per_env": per_env,
        "episodes_played": played,
        "episodes_resumed": len(units) - len(todo),
        "wall_seconds": elapsed,
        "episodes_per_minute": 60.0 * played / elapsed if played and elapsed > 0 else None,
    }


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, initial: int, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(
        total=total, initial=initial, unit="ep", desc="llmgym-eval", file=sys.stderr, dynamic_ncols=True
    )


# ------------------------------------------------------------------------------------------------ CLI
#: ``--help`` sections in order (the titles ``llmgym-train`` uses): title -> what they hold.
HELP_GROUPS = {
    "model": "The model played: a local transformers model, or one served behind an OpenAI-compatible endpoint.",
    "environment": "Which environments are played, and their turn and action limits (as llmgym-train's).",
    "evaluation": "The seeds, the samples per seed and the sampling.",
    "prompt": "The chat the model sees (as llmgym-train's); unset ones come from the llmgym_run.json a trained "
    "model's folder holds, else the defaults shown.",
    "output": "The output folder: episodes.jsonl and summary.json.",
}


@dataclass
class EvalOptions:
    """``llmgym-eval``'s own options (the shared ones are :mod:`llm_gym.trainer.options`' fields), each declared
    once: ``metadata`` holds the ``--help`` section (``group``) and the ``argparse`` keywords besides the default."""

    model: str | None = field(
        default=None,
        metadata={
            "group": "model",
            "required": True,
            "help": "Hub id, local folder, LoRA adapter folder (with adapter_config.json: loaded on its base model), "
            "'smollm2' or an organism; with --endpoint: the served name.",
        },
    )
    endpoint: str | None = field(
        default=None,
        metadata={
            "group": "model",
            "help": "OpenAI-compatible base URL (e.g. http://localhost:8000/v1) instead of a local model.",
        },
    )
    api_key: str | None = field(
        default=None,
        metadata={
            "group": "model",
            "help": "Bearer token for --endpoint (default: $OPENAI_API_KEY, which keeps it out of the process "
            "list); sent only to the endpoint's origin, never printed or recorded.",
        },
    )
    concurrency: int = field(
        default=16, metadata={"group": "model", "type": int, "help": "Parallel requests with --endpoint."}
    )
    timeout: float = field(
        default=120.0,
        metadata={
            "group": "model",
            "type": float,
            "help": "Total seconds per HTTP request with --endpoint (connect to last byte; retried up to 3 times).",
        },
    )
    device: str | None = field(
        default=None,
        metadata={
            "group": "model",
            "help": "Torch device for a local model (default: cuda if available, else cpu).",
        },
    )
    seed: int = field(
        default=0, metadata={"group": "model", "type": int, "help": "Torch sampling seed for a local model."}
    )
    batch_size: int = field(
        default=32,
        metadata={
            "group": "model",
            "type": int,
            "help": "Episodes played together (one generate per turn).",
        },
    )
    samples_per_seed: int = field(
        default=1,
        metadata={"group": "evaluation", "type": int, "help": "Episodes per seed (n for pass@k)."},
    )
    k: list[int] | None = field(
        default=None,
        metadata={
            "group": "evaluation",
            "type": int,
            "nargs": "+",
            "help": "pass@k values to report (default: 1 and n).",
        },
    )
    temperature: float = field(
        default=EVAL_TEMPERATURE,
        metadata={
            "group": "evaluation",
            "type": float,
            "help": f"Sampling temperature (RAGEN-2 eval: {EVAL_TEMPERATURE}; 0 = greedy).",
        },
    )
    top_p: float = field(
        default=EVAL_TOP_P,
        metadata={"group": "evaluation", "type": float, "help": "Nucleus sampling (1 = off)."},
    )
    max_new_tokens: int = field(
        default=MAX_NEW_TOKENS,
        metadata={
            "group": "evaluation",
            "type": int,
            "help": f"Tokens per reply (RAGEN: {MAX_NEW_TOKENS}).",
        },
    )
    history_window: int | None = field(
        default=None,
        metadata={
            "group": "prompt",
            "type": int,
            "help": "Show the model only the last k turns (default: the full history, as in training).",
        },
    )
    output_dir: str = field(
        default="llmgym_eval",
        metadata={"group": "output", "help": "Where episodes.jsonl and summary.json go."},
    )
    no_progress: bool = field(
        default=False, metadata={"group": "output", "action": "store_true", "help": "No progress bar."}
    )


#: Flags listed first in their ``--help`` section, in this order.
COMMON = ("model", "endpoint", "dtype", "env", "env_kwargs", "env_url", "eval_seed", "num_eval_seeds")


def build_parser() -> argparse.ArgumentParser:
    """``llmgym-eval``'s parser: its :class:`EvalOptions` and the options it shares with ``llmgym-train`` and
    ``llmgym-sft`` (:mod:`llm_gym.trainer.options`), in the :data:`HELP_GROUPS` sections."""
    from llm_gym.trainer.options import (
        DEPRECATED,
        EnvArguments,
        EvalSeedArguments,
        ModelArguments,
        OutputOptions,
        PromptArguments,
        accept_dashed,
        add_alias,
        add_deprecated_aliases,
        add_field_options,
        into_sections,
    )

    p = argparse.ArgumentParser(
        prog="llmgym-eval",
        usage="%(prog)s --model MODEL [--env ENV ...] [--num_eval_seeds N] [--samples_per_seed N] [-o OUTPUT_DIR]\n"
        "                   [--endpoint URL] [--resume | --overwrite_output_dir] [--OPTION VALUE ...]",
        description="Evaluate a model on llm-gym environments over fixed seeds (success rate with a Wilson "
        "interval, pass@k, mean turns, valid-action rate). Episodes go to episodes.jsonl, metrics to summary.json. "
        "Options are grouped by topic, the common ones first; the environment, seed, chat, dtype and output "
        "options are llmgym-train's.",
        epilog=EXIT_CODES_HELP,
    )
    sections = {title: p.add_argument_group(title, text) for title, text in HELP_GROUPS.items()}
    own = {f.name: f for f in fields(EvalOptions)}
    for name, f in own.items():
        kwargs = {k: v for k, v in f.metadata.items() if k != "group"}
        sections[f.metadata["group"]].add_argument(f"--{name}", default=f.default, **kwargs)
    add_field_options(
        sections["model"],
        ModelArguments,
        ["dtype"],
        overrides={
            "dtype": {
                "default": "auto",
                "choices": ["auto", "float32", "bfloat16", "float16"],
                "help_suffix": "llmgym-eval: the dtype a local model is loaded in for generation; auto (its "
                "default) keeps the checkpoint's own.",
            }
        },
    )
    env_default = EnvArguments.__dataclass_fields__["env"].default
    add_field_options(
        sections["environment"],
        EnvArguments,
        overrides={
            "env": {"nargs": "+", "default": [env_default], "help_suffix": "Several: each is evaluated."},
            "env_url": {"help_suffix": "The random-valid baseline still runs here."},
        },
    )
    add_field_options(
        sections["evaluation"], EvalSeedArguments, overrides={"num_eval_seeds": {"default": 32}}
    )
    add_field_options(sections["prompt"], PromptArguments, list(RUN_CHAT_FIELDS), unset_default=True)
    out = sections["output"].add_mutually_exclusive_group()
    add_field_options(
        out, OutputOptions, overrides={"resume": {"action": "store_true", "nargs": None, "const": None}}
    )
    add_alias(p, "output_dir", "-o")
    add_alias(p, "samples_per_seed", "-n")
    into_sections(p, sections, {a.dest: s for s, g in sections.items() for a in g._group_actions}, COMMON)
    snake_case_options(p)
    add_deprecated_aliases(p, DEPRECATED["llmgym-eval"])
    return accept_dashed(p)


def chat_settings(a: argparse.Namespace, log: Any = None) -> dict[str, Any]:
    """The chat-format flags, unset ones taken from the ``llmgym_run.json`` of a trained model's folder
    (``--model OUTPUT/final`` or a checkpoint; not with ``--endpoint``), else the defaults."""
    given = {name: getattr(a, name) for name in RUN_CHAT_FIELDS}
    saved: dict[str, Any] = {}
    if not a.endpoint and any(v is None for v in given.values()):
        found = read_run_chat(a.model)
        if found is not None:
            saved, where = found
            used = sorted(k for k in saved if given.get(k) is None)
            if used and log is not None:
                log(f"llmgym-eval: chat settings of the trained run from {where}: {', '.join(used)}")
    defaults = chat_settings_of(ChatFormat())
    out = {k: (given[k] if given[k] is not None else saved.get(k, defaults[k])) for k in RUN_CHAT_FIELDS}
    if out["chat_style"] not in CHAT_STYLES:
        raise ValueError(f"chat_style must be one of {CHAT_STYLES}, got {out['chat_style']!r}")
    return out


def _check_args(a: argparse.Namespace) -> tuple[list[str], dict[str, Any], list[int]]:
    if a.history_window is not None and a.history_window < 1:
        raise ValueError(f"--history_window must be >= 1, got {a.history_window}")
    if a.num_eval_seeds < 1 or a.samples_per_seed < 1 or a.batch_size < 1 or a.eval_seed < 0:
        raise ValueError(
            "--num_eval_seeds, --samples_per_seed and --batch_size must be >= 1 and --eval_seed >= 0"
        )
    try:
        given = json.loads(a.env_kwargs) if a.env_kwargs is not None else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"--env_kwargs is not valid JSON: {e}") from None
    if not isinstance(given, dict):
        raise ValueError("--env_kwargs must be a JSON object")
    from llm_gym.trainer.options import env_kwargs_of

    # the turn and action limits, then --env_kwargs (which wins): llmgym-train's rule
    limits = {f: getattr(a, f) for f in ("max_turns", "max_actions_per_turn", "max_actions", "think")}
    env_kwargs = env_kwargs_of({**limits, "env_kwargs": given})
    env_ids = list(dict.fromkeys(resolve_env_id(e) for e in a.env))
    from llm_gym.registration import make_env

    # an unknown or out-of-range kwarg fails now, not after the weights loaded (on every --env_url server too)
    urls = parse_env_urls(getattr(a, "env_url", None))
    if not urls:
        for env_id in env_ids:
            make_env(env_id, env_kwargs).close()
    else:
        from llm_gym.serve.client import check_servers

        at_once = min(a.batch_size, a.num_eval_seeds * a.samples_per_seed)  # one batch of episodes at a time
        try:  # served as a local run would play them, with room for a batch's sessions
            check_servers(urls, env_ids, env_kwargs, sessions=at_once, command="llmgym-eval")
        except ConnectionError as e:  # a server named on the command line that cannot be used: exit 2
            raise ValueError(str(e)) from None
    ks = sorted(set(a.k or [1, a.samples_per_seed]))
    if any(k < 1 or k > a.samples_per_seed for k in ks):
        raise ValueError(
            f"--k values must be between 1 and --samples_per_seed ({a.samples_per_seed}), got {ks}"
        )
    return env_ids, env_kwargs, ks


def make_policy(a: argparse.Namespace) -> tuple[Any, str]:
    """The policy for the parsed args and a printable model name; fails early on a bad endpoint or model."""
    from llm_gym.trainer.policies import HFPolicy, OpenAIPolicy, SamplingParams

    sampling = SamplingParams(a.temperature, a.top_p, a.max_new_tokens)
    if a.endpoint:
        policy = OpenAIPolicy(
            a.endpoint, a.model, sampling, api_key=a.api_key, timeout=a.timeout, concurrency=a.concurrency
        )
        policy.probe()
        return policy, a.model
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(a.seed)
    return HFPolicy.from_pretrained(
        a.model, sampling, batch_size=a.batch_size, device=device, dtype=a.dtype
    ), a.model


def main(argv: Sequence[str] | None = None) -> int:
    from llm_gym.agent.chat import chat_format_from_settings

    args = build_parser().parse_args(argv)
    lock = None
    try:
        env_ids, env_kwargs, ks = _check_args(args)
        if not args.endpoint:  # an organism is built for the one env it is evaluated on
            from llm_gym.trainer.organism import materialize

            one = env_ids[0] if len(env_ids) == 1 else None
            args.model = materialize(args.model, one, env_kwargs, seed=args.seed)
        env_urls = parse_env_urls(args.env_url)
        chat_kw = chat_settings(args, log=lambda m: print(m, file=sys.stderr))
        out_dir = Path(args.output_dir)
        episodes = out_dir / EPISODES_FILE
        # One evaluation per output folder (two would interleave their episodes in one file). A folder that
        # does not exist yet is locked once the model or endpoint proved usable, so a bad command line
        # creates no folder.
        if out_dir.is_dir():
            lock = OutputLock(out_dir, "evaluation").acquire()
        if (
            episodes.exists()
            and episodes.stat().st_size > 0
            and not (args.resume or args.overwrite_output_dir)
        ):
            raise ValueError(
                f"{episodes} already has episodes; pass --resume to continue it or --overwrite_output_dir"
            )
        policy, model_name = make_policy(args)
        if lock is None:
            lock = OutputLock(out_dir, "evaluation").acquire()
        if args.overwrite_output_dir and episodes.exists():
            episodes.unlink()
        fingerprint = {
            "model": model_name,
            "endpoint": args.endpoint,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "max_new_tokens": args.max_new_tokens,
            "history_window": args.history_window,
            **chat_kw,  # a resumed evaluation must show the model the same chat
        }
        seeds = list(range(args.eval_seed, args.eval_seed + args.num_eval_seeds))
        result = evaluate(
            policy,
            env_ids,
            seeds,
            samples=args.samples_per_seed,
            output=episodes,
            fingerprint=fingerprint,
            env_kwargs=env_kwargs,
            chat=chat_format_from_settings(chat_kw, history_window=args.history_window),
            resume=args.resume,
            batch_size=args.batch_size,
            ks=ks,
            progress=not args.no_progress,
            env_url=env_urls,
        )
        for env_id, per in result["per_env"].items():  # chance and the optimum on the same seeds and limits
            per["baseline"] = baseline_success(env_id, seeds, env_kwargs, samples=args.samples_per_seed)
        summary = {
            **fingerprint,
            "envs": result["per_env"],
            "seeds": [seeds[0], seeds[-1]],
            "samples_per_seed": args.samples_per_seed,
            "env_kwargs": env_kwargs,
            "episodes_file": str(episodes),
            "episodes_played": result["episodes_played"],
            "episodes_resumed": result["episodes_resumed"],
            "wall_seconds": round(result["wall_seconds"], 3),
            "episodes_per_minute": result["episodes_per_minute"],
        }
        atomic_write_text(out_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    except (ValueError, OutputLockedError) as e:
        # bad arguments, a busy output folder, and a model (ModelError) or endpoint (EndpointError) that cannot serve
        print(f"llmgym-eval: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # full disk, an output path under a file, ...: one line, exit 1
        print(f"llmgym-eval: error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_RUNTIME
    finally:
        if lock is not None:
            lock.release()
    print(format_table(result["per_env"]))
    print(f"episodes: {episodes}  summary: {out_dir / SUMMARY_FILE}")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
