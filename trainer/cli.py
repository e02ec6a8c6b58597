"""``llmgym-train``: RL training of an LLM agent on an llm-gym environment.

Configuration layers, later ones win:

1. the ``--algo`` algorithm (:mod:`llm_gym.trainer.algorithms`; default: the profile's ``algo``, else ``grpo``);
2. the environment's settings in the ``--profile`` (``trainer/profiles/<profile>/<env>.yaml``; the default
   profile ``recommended`` holds our recommended settings per environment, NOT RAGEN-2's protocol: ``--profile
   ragen2`` reproduces RAGEN-2's main-table runs; a profile folder's ``_common.yaml`` applies to all its
   environments and its ``per_algo`` block to one ``--algo``);
3. CPU-sized settings, only when no GPU is found;
4. ``--config file.yaml``;
5. command-line fields, TRL style (``--learning_rate 1e-5``, ``-o`` for ``--output_dir``);
6. ``--set key=value`` (repeatable).

Exit codes (as every llm-gym command): 0 success, 1 runtime or I/O error, 2 usage or configuration error (a bad
option or value; an environment, profile or model that cannot be used).

Everything is validated (environment, batch divisibility, model, chat template present) before the model is
loaded; the chat template's token-level fitness is probed when the trainer is built, before any evaluation.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from llm_gym._cli import EXIT_CODES_HELP, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, snake_case_options
from llm_gym.core.checks import is_int

#: Profiles: one folder per profile, one ``<env>.yaml`` per environment (``<env>`` = the lower-case short name).
PROFILE_DIR = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "recommended"
#: Keys a profile or config file may hold besides config fields (``per_algo``: settings per ``--algo`` name).
META_KEYS = ("model", "algo", "per_algo")
#: A profile folder's settings shared by all its environments (an environment's file wins over it).
PROFILE_COMMON = "_common.yaml"

#: Settings used when no GPU is available, unless the user sets them (sized for 2 CPU cores, a few minutes).
#: ``per_device_train_batch_size`` then defaults to ``num_prompts * num_generations`` (one micro-batch per round).
CPU_SETTINGS: dict[str, Any] = {
    "use_cpu": True,
    "bf16": False,
    "gradient_checkpointing": True,
    "one_shot_example": True,
    "think": False,
    "temperature": 0.7,
    "num_prompts": 2,
    "num_generations": 4,
    "gradient_accumulation_steps": 1,
    "max_turns": 3,
    "max_new_tokens": 32,
    "max_completion_length": 320,
    "max_steps": 10,
    "learning_rate": 1e-5,
    "logging_steps": 1,
    "eval_strategy": "no",
    # 32 seeds: a Wilson 95% interval of about +-0.13 around 0.2 (8 seeds: +-0.26), so that a success rate can
    # be told apart from the random valid-action baseline printed beside it.
    "num_eval_seeds": 32,
    "per_device_eval_batch_size": 8,
    "save_strategy": "no",
    "dataloader_num_workers": 0,
    # The answer-only format has no <think> span, so MI on it would never be computed: score the whole turn.
    # 8 pairs every 3rd round (0, 3, 6, 9): 16 pairs every 2nd cost 11% of a loaded 20-minute main job.
    "mi_reasoning": "turn",
    "mi_every": 3,
    "mi_num_samples": 8,
    "mi_batch_size": 8,
}


#: CPU settings that only lower the profile's value.
CPU_CAPS = ("max_turns", "max_new_tokens", "max_completion_length")


class ConfigError(ValueError):
    """A configuration problem the user must fix; printed without a traceback."""


def _short(env: str) -> str:
    return env.split("/")[-1].split("-v")[0].lower()


def available_profiles() -> list[str]:
    """Names of the bundled profiles (folders of ``trainer/profiles/``)."""
    return sorted(p.name for p in PROFILE_DIR.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def profile_path(env: str, profile: str = DEFAULT_PROFILE) -> Path | None:
    """The profile's YAML for ``env`` (any name ``resolve_env_id`` accepts), or None when the profile has no
    settings for it. Raises :class:`ConfigError` for an unknown profile, or when a profile other than the
    default has nothing for this environment (running it would silently not follow the protocol)."""
    from llm_gym.registration import resolve_env_id

    if profile not in available_profiles():
        raise ConfigError(f"unknown profile {profile!r}; choose from {', '.join(available_profiles())}")
    try:
        env_id = resolve_env_id(env)
    except ValueError:
        return None  # the config's own validation reports the unknown name
    p = PROFILE_DIR / profile / f"{_short(env_id)}.yaml"
    if p.is_file():
        return p
    if profile != DEFAULT_PROFILE:
        have = sorted(f.stem for f in (PROFILE_DIR / profile).glob("*.yaml") if not f.stem.startswith("_"))
        raise ConfigError(f"profile {profile!r} has no settings for {env_id} (it covers: {', '.join(have)})")
    return None


def load_profile(path: Path) -> dict[str, Any]:
    """A profile's settings for one environment: the folder's ``_common.yaml`` (if any), then the environment's
    file on top (``per_algo`` merged per algorithm)."""
    common_path = path.with_name(PROFILE_COMMON)
    data = load_yaml(common_path) if common_path.is_file() else {}
    env_data = load_yaml(path)
    per_algo = {k: dict(v) for k, v in (data.get("per_algo") or {}).items()}
    for k, v in (env_data.get("per_algo") or {}).items():
        per_algo.setdefault(k, {}).update(v)
    data.update(env_data)
    if per_algo:
        data["per_algo"] = per_algo
    return data


def load_yaml(path: str | Path) -> dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(path)!r} not found")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of field: value at the top level")
    return data


def build_parser() -> Any:
    """HfArgumentParser over every config field plus the llmgym-train options."""
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from transformers import HfArgumentParser

    parser = HfArgumentParser(
        LLMGymGRPOConfig,
        prog="llmgym-train",
        description="Train an LLM agent with multi-turn RL (GRPO family or PPO) on an llm-gym environment. "
        "Every config field below can also be set in a YAML file (--config) or with --set key=value.",
        epilog=EXIT_CODES_HELP,
    )
    _add_alias(parser, "output_dir", "-o")
    group = parser.add_argument_group("llmgym-train")
    group.add_argument(
        "--model", default=None, help="Hub id, local folder, or 'smollm2' (offline SmolLM2-135M)."
    )
    group.add_argument("--algo", default=None, help="Algorithm: grpo (default), drgrpo, dapo or ppo.")
    group.add_argument(
        "--profile",
        default=None,
        help=f"Settings profile applied per environment (trainer/profiles/<profile>/<env>.yaml; default "
        f"{DEFAULT_PROFILE!r}: our recommended settings).",
    )
    group.add_argument("--config", default=None, help="YAML file of field: value overrides.")
    group.add_argument(
        "--dry_run",
        action="store_true",
        help="Resolve every setting, print the protocol table (setting, value, source) and the per-GPU memory "
        "estimate, and exit; no weights are loaded.",
    )
    group.add_argument(
        "--gpu_memory_gib",
        type=float,
        default=None,
        help="--dry_run: GPU memory to check the estimate against.",
    )
    group.add_argument(
        "--model_config",
        default=None,
        help="--dry_run: the model's config.json (default: the --model folder's, its cached hub snapshot's, or the "
        "copy bundled with llm-gym for the Qwen2.5 models the profiles name).",
    )
    group.add_argument(
        "--accelerate_config",
        default=None,
        help="--dry_run: the accelerate config the run will use (sharding, processes); default one process.",
    )
    group.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Override one field.")
    group.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        help="Resume from the newest complete checkpoint in output_dir, or from the given checkpoint folder; "
        "episode records written after it are dropped (they are played again).",
    )
    group.add_argument(
        "--overwrite_output_dir",
        action="store_true",
        help="Start afresh in a non-empty output_dir: its checkpoints, records, reports and final model are "
        "removed first (without this or --resume, a non-empty output_dir is refused).",
    )
    _negated_flag_help(parser)
    # HfArgumentParser lists a dashed alias next to every flag: keep it parsing, hidden (as llmgym-eval does)
    return snake_case_options(parser)


def _negated_flag_help(parser: Any) -> None:
    """HfArgumentParser's ``--no_X`` (for a boolean field that defaults to True) repeats X's help and shows a
    default of False; say what it does instead (the ``--X`` flag shows the default)."""
    for action in parser._actions:
        negated = [o for o in action.option_strings if o.startswith("--no_")]
        if negated and isinstance(action, argparse._StoreFalseAction):
            action.help = f"Set {action.dest} to False (same as --{action.dest} False)."
            action.default = argparse.SUPPRESS  # the --X flag's default fills the field


def _add_alias(parser: Any, dest: str, alias: str) -> None:
    """Let ``alias`` (a short flag such as ``-o``) set the field ``dest`` too."""
    for action in parser._actions:
        if action.dest == dest:
            action.option_strings.append(alias)
            parser._option_string_actions[alias] = action
            return
    raise ValueError(f"no option for {dest!r}")  # pragma: no cover


def _field_names() -> set[str]:
    from llm_gym.trainer.config import LLMGymGRPOConfig

    return {f.name for f in fields(LLMGymGRPOConfig) if f.init}


def _explicit_cli(parser: Any, argv: list[str]) -> tuple[dict[str, Any], argparse.Namespace]:
    """Parse ``argv``; returns only the fields given explicitly (type-converted) and the llmgym options."""
    saved = {a.dest: a.default for a in parser._actions}
    try:
        for a in parser._actions:
            if a.dest != "help":
                a.default = argparse.SUPPRESS
        ns = parser.parse_args(argv)
    finally:
        for a in parser._actions:
            a.default = saved[a.dest]
    given = vars(ns)
    meta = argparse.Namespace(
        model=given.pop("model", None),
        algo=given.pop("algo", None),
        profile=given.pop("profile", None),
        config=given.pop("config", None),
        set=given.pop("set", []),
        resume=given.pop("resume", None),
        dry_run=given.pop("dry_run", False),
        gpu_memory_gib=given.pop("gpu_memory_gib", None),
        model_config=given.pop("model_config", None),
        accelerate_config=given.pop("accelerate_config", None),
        overwrite_output_dir=given.pop("overwrite_output_dir", False),
    )
    return given, meta


def _convert(parser: Any, key: str, value: Any) -> Any:
    """Type-convert a string value the way the command line would (for YAML strings and --set)."""
    if not isinstance(value, str):
        return value
    for a in parser._actions:
        if a.dest == key and callable(a.type):
            try:
                return a.type(value)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"bad value for {key}: {value!r} ({e})") from None
    return value


def _check_keys(data: dict[str, Any], where: str, names: set[str]) -> None:
    unknown = sorted(k for k in data if k not in names and k not in META_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown config field(s) {', '.join(unknown)}; see llmgym-train --help")


def has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover
        return False


def resolve_config(
    argv: list[str], *, gpu: bool | None = None, log=print, dry_run: bool = False
) -> tuple[Any, dict[str, Any]]:
    """Merge the layers into an ``LLMGymGRPOConfig``; returns ``(config, meta)`` with ``meta`` holding
    ``model``, ``algo`` and ``resume``. Raises :class:`ConfigError` / ``ValueError`` on bad configuration."""
    from llm_gym.trainer.algorithms import algorithm_overrides, get_algorithm
    from llm_gym.trainer.config import LLMGymGRPOConfig

    parser = build_parser()
    names = _field_names()
    explicit, opts = _explicit_cli(parser, argv)
    sets: dict[str, Any] = {}
    for item in opts.set:
        if "=" not in item:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        k = k.strip().replace("-", "_")
        if k not in names and k not in META_KEYS:
            raise ConfigError(f"--set: unknown config field {k!r}; see llmgym-train --help")
        sets[k] = _convert(parser, k, v)
    user_file = load_yaml(opts.config) if opts.config else {}
    _check_keys(user_file, str(opts.config), names)
    user_file = {k: _convert(parser, k, v) for k, v in user_file.items()}

    env = sets.get("env", explicit.get("env", user_file.get("env", "FrozenLake")))
    profile_file = profile_path(str(env), opts.profile or DEFAULT_PROFILE)
    profile = load_profile(profile_file) if profile_file else {}
    _check_keys(profile, str(profile_file), names)
    per_algo = profile.get("per_algo") or {}
    for settings in per_algo.values():
        _check_keys(settings, f"{profile_file} per_algo", names)
    profile = {k: _convert(parser, k, v) for k, v in profile.items() if k != "per_algo"}

    def pick(key: str, default: Any = None) -> Any:
        for layer in (sets, {"model": opts.model, "algo": opts.algo}, user_file, profile):
            if layer.get(key) is not None:
                return layer[key]
        return default

    algo = get_algorithm(str(pick("algo", "grpo"))).name
    model = pick("model", "Qwen/Qwen2.5-3B-Instruct")
    gpu = has_gpu() if gpu is None else gpu
    cpu_layer: dict[str, Any] = {}
    merged: dict[str, Any] = dict(algorithm_overrides(algo))
    merged.update({k: v for k, v in profile.items() if k not in META_KEYS})
    # the profile's settings for this algorithm (e.g. RAGEN-2's loss aggregation of each row)
    profile_algo = {k: _convert(parser, k, v) for k, v in (per_algo.get(algo) or {}).items()}
    merged.update(profile_algo)
    user_keys = set(user_file) | set(explicit) | set(sets)
    if not gpu:
        cpu = {k: v for k, v in CPU_SETTINGS.items() if k not in user_keys}
        for key in CPU_CAPS:  # caps: never raise a profile's smaller value (Bandit keeps 1 turn)
            if key in cpu and merged.get(key) is not None:
                cpu[key] = min(cpu[key], merged[key])
        log(
            "llmgym-train: no GPU found; using CPU-sized settings ("
            + ", ".join(f"{k}={v}" for k, v in cpu.items())
            + "). Override any of them on the command line."
        )
        merged.update(cpu)
        cpu_layer = cpu
    merged.update({k: v for k, v in user_file.items() if k not in META_KEYS})
    merged.update(explicit)
    merged.update({k: v for k, v in sets.items() if k not in META_KEYS})
    if not gpu and "per_device_train_batch_size" not in user_keys and merged.get("num_prompts"):
        # one micro-batch per round: P x G rollouts, whatever P and G the user chose
        merged["per_device_train_batch_size"] = int(merged["num_prompts"]) * int(
            merged.get("num_generations", 8)
        )
    _check_steps(merged)
    merged["env"] = env
    merged.setdefault("output_dir", str(Path("runs") / f"{_short(str(env))}-{algo}"))
    build = dict(merged)
    if dry_run and not has_gpu():
        # --dry_run resolves the GPU settings on any machine: the config object is only built to validate them
        build.update(use_cpu=True, bf16=False, fp16=False)
    config = LLMGymGRPOConfig(**build)
    return config, {
        "model": model,
        "algo": algo,
        "profile": opts.profile or DEFAULT_PROFILE,
        "resume": opts.resume,
        "overwrite_output_dir": opts.overwrite_output_dir,
        "dry_run": opts.dry_run,
        "gpu_memory_gib": opts.gpu_memory_gib,
        "model_config": opts.model_config,
        "accelerate_config": opts.accelerate_config,
        # every layer as merged, for --dry_run's source column (later wins)
        "layers": [
            (f"preset (--algo {algo})", algorithm_overrides(algo)),
            (f"profile {opts.profile or DEFAULT_PROFILE}", {**profile, **profile_algo}),
            ("cpu settings", cpu_layer),
            (f"--config {opts.config}", user_file),
            ("flag", {**explicit, **sets}),
        ],
        "profile_file": str(profile_file) if profile_file else None,
        "merged": merged,
    }


def _check_steps(merged: dict[str, Any]) -> None:
    """``max_steps`` -1 (or 0) means "train for num_train_epochs": refuse values below -1, and a run with
    neither a step count nor epochs set by any layer (Trainer's default of 3 epochs over the 100,000-row seed
    dataset would be a run of that many rounds)."""
    steps = merged.get("max_steps", -1)
    if not is_int(steps, numpy=False) or steps < -1:
        raise ConfigError(
            f"max_steps must be a positive number of steps (or -1 with num_train_epochs), got {steps!r}"
        )
    if steps <= 0 and merged.get("num_train_epochs") is None:
        raise ConfigError(
            f"max_steps={steps} trains for num_train_epochs, which is not set: pass --max_steps N "
            "(or --num_train_epochs E to train on the seed dataset E times)"
        )


def _num(value: Any) -> str:
    """A metric for the summary lines: ``n/a`` when it is missing or not a finite number (TRL logs a NaN reward
    as None in its log history, e.g. when every reward function returned NaN)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return "n/a"
    return f"{x:.3f}" if x == x and abs(x) != float("inf") else "n/a"


def _eval_summary(metrics: dict[str, Any]) -> str:
    """One line of evaluation results (TRL prefixes eval metrics with ``eval_``)."""
    parts = []
    for key, label in (
        ("success", "success"),
        ("valid_action_rate", "valid actions"),
        ("episode_reward", "reward"),
    ):
        value = metrics.get(f"eval_env/{key}")
        if value is not None:
            parts.append(f"{label} {_num(value)}")
    return ", ".join(parts) or "no metrics"


#: Written to output_dir after the before/after evaluation: baselines and success among valid answers.
EVAL_REPORT_FILE = "eval_report.json"


def _eval_report(config: Any) -> dict[str, Any]:
    """The random valid-action baseline and solver optimum on the evaluation seeds (same limits), and each
    evaluation's success / valid answers / success among valid answers (Wilson 95%) from the episode records
    (none when records are off); written to ``output_dir/eval_report.json``."""
    import json

    from llm_gym.agent.baselines import evaluation_report
    from llm_gym.agent.records import read_records

    path = Path(config.output_dir) / config.episode_records if config.episode_records else None
    records = (
        [r for r in read_records(path) if r.meta.get("mode") == "eval"] if path and path.is_file() else []
    )
    seeds = list(range(config.eval_seed, config.eval_seed + config.num_eval_seeds))
    samples = int(getattr(config, "num_generations_eval", 1) or 1)
    report = evaluation_report(config.env, seeds, config.make_env_kwargs(), records, samples=samples)
    from llm_gym.safe_io import atomic_write_text

    atomic_write_text(Path(config.output_dir) / EVAL_REPORT_FILE, json.dumps(report, indent=2) + "\n")
    return report


def _error(msg: str, code: int = EXIT_USAGE) -> int:
    print(f"llmgym-train: error: {msg}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``llmgym-train``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if "-h" in argv or "--help" in argv:
        build_parser().print_help()
        return EXIT_OK
    from llm_gym.trainer.models import ModelError, adapter_base, check_model
    from llm_gym.trainer.output import (
        prepare_output_dir,
        publish_resume_choice,
        read_resume_choice,
        write_run_file,
    )

    from llm_gym.safe_io import OutputLock, OutputLockedError

    rank, world_size = _launch_rank()
    main_process = rank == 0
    log = print if main_process else (lambda *_: None)
    lock = None
    if "--dry_run" in argv:
        from llm_gym.trainer.dry_run import dry_run

        try:
            config, meta = resolve_config(argv, gpu=True, log=log, dry_run=True)
            return dry_run(config, meta)
        except (ConfigError, ValueError) as e:
            return _error(str(e))
    try:
        config, meta = resolve_config(argv, log=log)
        resolved = check_model(str(meta["model"]), chat_template=config.chat_template)
        if config.use_peft and Path(resolved).is_dir() and adapter_base(resolved) is not None:
            raise ConfigError(
                f"{meta['model']} is a LoRA adapter: without --use_peft llmgym-train continues training it; "
                "to train a new adapter, pass its base model (or a merged model) as --model"
            )
        _check_env(config)
        if meta["resume"] == "latest" and not Path(config.output_dir).is_dir():
            raise ConfigError(f"--resume: output folder {config.output_dir} does not exist")
        several = world_size > 1
        if main_process:
            # One run per output folder, held until this process ends (other ranks share rank 0's run).
            lock = OutputLock(config.output_dir, "training run").acquire()
            try:
                meta["resume"] = prepare_output_dir(
                    config, meta["resume"], bool(meta.get("overwrite_output_dir")), log=log
                )
                write_run_file(config.output_dir, config)
            except (ValueError, OSError) as e:
                if several:  # the other ranks wait for rank 0's choice: tell them why there is none
                    publish_resume_choice(config.output_dir, None, error=str(e))
                    _wait_for_ranks()
                raise
            if several:
                publish_resume_choice(config.output_dir, meta["resume"])
        if several:
            # Rank 0 alone chooses the checkpoint (and deletes incomplete ones); the others read its choice
            # after this barrier instead of looking at a folder rank 0 may be changing.
            _wait_for_ranks()
            if not main_process:
                meta["resume"] = read_resume_choice(config.output_dir)
    except (ConfigError, ModelError, OutputLockedError, ValueError) as e:
        if lock is not None:
            lock.release()
        return _error(str(e))
    except OSError as e:  # an output folder under a file, a full disk, ...
        if lock is not None:
            lock.release()
        return _error(_os_error(e), EXIT_RUNTIME)
    try:
        return run(config, meta)
    except Exception as e:
        from llm_gym.agent.templates import ChatTemplateError

        if isinstance(e, ChatTemplateError):  # a template that fails on a later turn's chat: one line too
            return _error(str(e), EXIT_RUNTIME)
        if not _is_io_failure(e):
            raise
        return _error(_os_error(e), EXIT_RUNTIME)
    finally:
        if lock is not None:
            lock.release()


def _launch_rank() -> tuple[int, int]:
    """This process's rank and the number of processes, as the launcher (accelerate, torchrun) set them."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _wait_for_ranks() -> None:
    """A barrier over the launched processes (before the trainer exists; accelerate's shared state sets up the
    process group the trainer reuses)."""
    from accelerate import PartialState

    PartialState().wait_for_everyone()


def _is_io_failure(e: BaseException) -> bool:
    """An ``OSError``, or a writer's own error for one (torch.save's ``PytorchStreamWriter failed writing``,
    safetensors' ``IoError``): a full disk while saving a checkpoint surfaces as these."""
    if isinstance(e, OSError):
        return True
    text = str(e)
    if isinstance(e, RuntimeError) and "failed writing" in text:
        return True
    return type(e).__name__ == "SafetensorError" and ("IoError" in text or "No space" in text)


def _check_env(config: Any) -> None:
    """Make the environment once with the run's kwargs, so an unknown or out-of-range kwarg
    (``--env_kwargs '{"bogus": 1}'``) is a usage error now rather than a traceback after the model loaded."""
    from llm_gym.registration import make_env

    if not getattr(config, "env_url", None):
        make_env(config.env, config.make_env_kwargs()).close()
        return
    from llm_gym.serve.client import check_servers

    # sessions open at once: a round's episodes (generation_batch_size, over all processes) or an evaluation batch
    evals = config.num_eval_seeds * (config.num_generations_eval or 1)
    at_once = max(
        config.generation_batch_size, min(evals, config.per_device_eval_batch_size * config.world_size)
    )
    try:  # every server serves the id as a local run would play it, with room for the run's sessions
        check_servers(
            config.env_url, [config.env], config.make_env_kwargs(), sessions=at_once, command="llmgym-train"
        )
    except ConnectionError as e:  # a server named on the command line that cannot be used: exit 2
        raise ValueError(str(e)) from None


def _os_error(e: OSError) -> str:
    """One line for an I/O error (``[Errno 28] No space left on device: 'path'``)."""
    return " ".join(str(e).split())


def run(config: Any, meta: dict[str, Any]) -> int:
    """Load the model (the heavy part) and train; prints success before and after training."""
    from llm_gym.trainer.algorithms import trainer_class
    from llm_gym.trainer.chat_templates import ChatTemplateError
    from llm_gym.trainer.models import ModelError
    from llm_gym.trainer.precision import load_for_training

    t0 = time.time()
    try:
        # float32 master weights (bf16 = autocast); a LoRA adapter folder as --model keeps training its adapter
        model, tokenizer, _ = load_for_training(str(meta["model"]), config, gpu=has_gpu())
        cls = trainer_class(meta["algo"])
        # The rollout function probes the chat template here, before any training or evaluation.
        trainer = cls(model=model, args=config, processing_class=tokenizer)
    except (ModelError, ChatTemplateError) as e:  # the named model cannot be used: configuration
        return _error(str(e), EXIT_USAGE)
    except OSError as e:
        return _error(str(e), EXIT_RUNTIME)
    is_main = trainer.accelerator.is_main_process
    say = print if is_main else (lambda *a, **k: None)
    say(
        f"llmgym-train: {config.env} | model {meta['model']} | algo {meta['algo']} | "
        f"{config.num_prompts_per_round} seeds x {config.num_generations} rollouts per round | "
        f"output {config.output_dir}"
    )
    do_eval = config.eval_before_after and config.num_eval_seeds > 0
    before = trainer.evaluate() if do_eval else {}
    if before:
        say(f"llmgym-train: before training: {_eval_summary(before)}")
    from llm_gym.trainer.output import (
        checkpoint_step,
        load_finished_checkpoint,
        save_final,
        training_finished,
    )

    # main() resolved --resume to a complete checkpoint folder; one at max_steps trains no further step
    resume = meta.get("resume") or None
    if resume and training_finished(checkpoint_step(resume), config.max_steps):
        load_finished_checkpoint(trainer, resume, log=say)
    else:
        trainer.train(resume_from_checkpoint=resume)
    after = trainer.evaluate() if do_eval else {}
    save_final(trainer, config)  # written beside and renamed: final/ is whole or absent
    if is_main:
        last = next((r for r in reversed(trainer.state.log_history) if "reward" in r), {})
        summary = [f"llmgym-train: done in {time.time() - t0:.0f}s"]
        if after:
            print(f"llmgym-train: after training: {_eval_summary(after)}")
        if before and after:
            from llm_gym.agent.baselines import format_baseline, format_outcomes

            report = _eval_report(config)
            for label, ev in zip(("before", "after"), report["evals"][:1] + report["evals"][-1:]):
                print(
                    f"llmgym-train: {label} training ({config.num_eval_seeds} seeds): {format_outcomes(ev)}"
                )
            base = format_baseline(report["baseline"])
            print(f"llmgym-train: baseline on the same seeds and limits: {base}")
            summary.append(
                f"success before {_num(before.get('eval_env/success'))} -> "
                f"after {_num(after.get('eval_env/success'))} ({base})"
            )
        if last:
            summary.append(
                f"last train reward {_num(last['reward'])}, success {_num(last.get('env/success'))}"
            )
        print(" | ".join(summary))
        sharing = getattr(trainer, "prefix_sharing", None)
        if sharing is not None:
            from llm_gym.trainer.prefix_sharing import summary_line

            print(f"llmgym-train: {summary_line(sharing)}")
        if config.collapse_report:
            _collapse_png(config)
    return EXIT_OK


def _collapse_png(config: Any) -> None:
    """Plot the run's collapse series (MI, entropies, reward variance) next to it as a PNG."""
    from llm_gym.trainer.collapse_report import plot, read_series

    path = Path(config.output_dir) / config.collapse_report
    rows = read_series(path) if path.is_file() else []
    if rows:
        out = plot(rows, path.with_suffix(".png"), f"collapse report: {Path(config.output_dir).name}")
        print(f"llmgym-train: collapse report {out}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
