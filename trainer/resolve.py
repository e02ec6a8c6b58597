"""``llmgym-train``'s configuration: profiles, YAML files, CPU settings and the merge of the layers.

Layers, later ones win:

1. the ``--algo`` algorithm (:mod:`llm_gym.trainer.algorithms`; default: the profile's ``algo``, else ``grpo``);
2. the environment's settings in the ``--profile`` (``trainer/profiles/<profile>/<env>.yaml``; the default
   profile ``recommended`` holds our recommended settings per environment, NOT RAGEN-2's protocol: ``--profile
   ragen2`` reproduces RAGEN-2's main-table runs; a profile folder's ``_common.yaml`` applies to all its
   environments and its ``per_algo`` block to one ``--algo``);
3. CPU-sized settings, only when no GPU is found;
4. ``--config file.yaml``;
5. command-line fields, TRL style (``--learning_rate 1e-5``, ``-o`` for ``--output_dir``);
6. ``--set key=value`` (repeatable).

:func:`resolve_config` merges them into an :class:`~llm_gym.trainer.config.LLMGymGRPOConfig` (which validates
every field); ``--dry_run`` prints each setting with the layer that set it (:mod:`llm_gym.trainer.dry_run`).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from llm_gym.trainer.defaults import DEFAULT_PROFILE
from llm_gym.trainer.flags import RunOptions, build_parser, parse_explicit

from llm_gym.core.checks import is_int

#: Profiles: one folder per profile, one ``<env>.yaml`` per environment (``<env>`` = the lower-case short name).
PROFILE_DIR = Path(__file__).with_name("profiles")
#: Keys a profile or config file may hold besides config fields (``per_algo``: settings per ``--algo`` name;
#: ``cpu_sized``: the profile is sized for a CPU, so the CPU-settings layer does not override it).
META_KEYS = ("model", "algo", "per_algo", "cpu_sized")
#: A profile folder's settings shared by all its environments (an environment's file wins over it).
PROFILE_COMMON = "_common.yaml"
#: The model when no layer names one.
DEFAULT_MODEL = "Qwen/Qwen2.5-3B-Instruct"

#: Settings used when no GPU is available, unless the user sets them (sized for 2 CPU cores, a few minutes).
#: ``per_device_train_batch_size`` then defaults to ``num_prompts * num_generations`` (one micro-batch per round).
CPU_SETTINGS: dict[str, Any] = {
    "use_cpu": True,
    "bf16": False,
    "gradient_checkpointing": True,
    "one_shot_example": True,
    # the solver's move for the demonstration's own state: the format without a constant answer to copy
    # (docs/learning-study.md#format-demonstrations)
    "demonstration": "solver",
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


def short_env_name(env: str) -> str:
    """``llmgym/FrozenLake-v0`` -> ``frozenlake`` (profile file names, the default output folder)."""
    return env.split("/")[-1].split("-v")[0].lower()


# ------------------------------------------------------------------------------------------ profiles and YAML
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
        return None  # resolve_config reports the unknown name
    p = PROFILE_DIR / profile / f"{short_env_name(env_id)}.yaml"
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


def has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover
        return False


# ------------------------------------------------------------------------------------------ the merge
def resolve_config(
    argv: list[str], *, gpu: bool | None = None, log=print, dry_run: bool = False
) -> tuple[Any, dict[str, Any]]:
    """Merge the layers into an ``LLMGymGRPOConfig``; returns ``(config, meta)``: ``meta`` holds the
    :class:`~llm_gym.trainer.flags.RunOptions` (``model``, ``algo`` and ``profile`` resolved), the layers as merged
    (for ``--dry_run``'s source column), the profile file and the merged settings. Raises :class:`ConfigError` /
    ``ValueError`` on bad configuration."""
    from llm_gym.trainer.algorithms import algorithm_overrides, get_algorithm
    from llm_gym.trainer.config import LLMGymGRPOConfig

    from llm_gym.registration import resolve_env_id

    parser = build_parser()
    names = {f.name for f in fields(LLMGymGRPOConfig) if f.init}
    explicit, opts = parse_explicit(parser, argv)
    sets = _set_layer(parser, opts.set, names)
    user_file = load_yaml(opts.config) if opts.config else {}
    _check_keys(user_file, str(opts.config), names)
    user_file = {k: _convert(parser, k, v) for k, v in user_file.items()}

    env = sets.get("env", explicit.get("env", user_file.get("env", "FrozenLake")))
    profile_name = opts.profile or DEFAULT_PROFILE
    profile_file, profile, per_algo = _profile_layer(parser, str(env), profile_name, names)

    def pick(key: str, default: Any = None) -> Any:
        for layer in (sets, {"model": opts.model, "algo": opts.algo}, user_file, profile):
            if layer.get(key) is not None:
                return layer[key]
        return default

    algo = get_algorithm(str(pick("algo", "grpo"))).name
    model = pick("model", DEFAULT_MODEL)
    gpu = has_gpu() if gpu is None else gpu
    # layers 1-2: the --algo preset, the profile, the profile's settings for this algorithm (e.g. RAGEN-2's loss
    # aggregation of each row)
    merged: dict[str, Any] = {**algorithm_overrides(algo), **_without_meta(profile)}
    profile_algo = {k: _convert(parser, k, v) for k, v in (per_algo.get(algo) or {}).items()}
    merged.update(profile_algo)
    # layers 3-6: CPU settings (no GPU), --config, flags, --set
    user_keys = set(user_file) | set(explicit) | set(sets)
    if profile.get(
        "cpu_sized"
    ):  # a profile made for the CPU (the organism's): the CPU layer fills only its gaps
        user_keys |= set(profile) | set(profile_algo)
    cpu_layer = {} if gpu else _cpu_layer(merged, user_keys, log)
    merged.update({**cpu_layer, **_without_meta(user_file), **explicit, **_without_meta(sets)})
    if not gpu:
        _one_micro_batch_per_round(merged, user_keys)
    resolve_env_id(env)  # an unknown name is reported as such ("did you mean"), not as a missing max_steps
    _check_steps(merged)
    merged["env"] = env
    merged.setdefault("output_dir", str(Path("runs") / f"{short_env_name(str(env))}-{algo}"))
    config = LLMGymGRPOConfig(**_config_kwargs(merged, dry_run))
    return config, {
        **asdict(opts),
        "model": model,
        "algo": algo,
        "profile": profile_name,
        # every layer as merged, for --dry_run's source column (later wins)
        "layers": [
            (f"preset (--algo {algo})", algorithm_overrides(algo)),
            (f"profile {profile_name}", {**profile, **profile_algo}),
            ("cpu settings", cpu_layer),
            (f"--config {opts.config}", user_file),
            ("flag", {**explicit, **sets}),
        ],
        "profile_file": str(profile_file) if profile_file else None,
        "merged": merged,
    }


def _without_meta(layer: dict[str, Any]) -> dict[str, Any]:
    """A profile or file layer without its :data:`META_KEYS` (``model`` and ``algo`` are picked separately)."""
    return {k: v for k, v in layer.items() if k not in META_KEYS}


def _one_micro_batch_per_round(merged: dict[str, Any], user_keys: set[str]) -> None:
    """On the CPU, ``per_device_train_batch_size`` = P x G (one micro-batch per round, whatever P and G the user
    chose), unless the user set it."""
    if "per_device_train_batch_size" not in user_keys and merged.get("num_prompts"):
        merged["per_device_train_batch_size"] = int(merged["num_prompts"]) * int(
            merged.get("num_generations", 8)
        )


def _config_kwargs(merged: dict[str, Any], dry_run: bool) -> dict[str, Any]:
    """The merged settings as config arguments; ``--dry_run`` resolves the GPU settings on any machine, so on one
    without a GPU the config object (only built to validate them) gets CPU precision flags."""
    build = dict(merged)
    if dry_run and not has_gpu():
        build.update(use_cpu=True, bf16=False, fp16=False)
    return build


def _set_layer(parser: argparse.ArgumentParser, items: list[str], names: set[str]) -> dict[str, Any]:
    """The ``--set KEY=VALUE`` layer, type-converted."""
    sets: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        k = k.strip().replace("-", "_")
        if k not in names and k not in META_KEYS:
            raise ConfigError(f"--set: unknown config field {k!r}; see llmgym-train --help")
        sets[k] = _convert(parser, k, v)
    return sets


def _profile_layer(
    parser: argparse.ArgumentParser, env: str, profile_name: str, names: set[str]
) -> tuple[Path | None, dict[str, Any], dict[str, Any]]:
    """The profile's file for ``env``, its settings (type-converted, ``per_algo`` left out) and its
    ``per_algo`` block (converted per algorithm later)."""
    profile_file = profile_path(env, profile_name)
    profile = load_profile(profile_file) if profile_file else {}
    _check_keys(profile, str(profile_file), names)
    per_algo = profile.get("per_algo") or {}
    for settings in per_algo.values():
        _check_keys(settings, f"{profile_file} per_algo", names)
    profile = {k: _convert(parser, k, v) for k, v in profile.items() if k != "per_algo"}
    return profile_file, profile, per_algo


def _cpu_layer(merged: dict[str, Any], user_keys: set[str], log: Any) -> dict[str, Any]:
    """:data:`CPU_SETTINGS` the user did not set; the :data:`CPU_CAPS` never raise a profile's smaller value
    (Bandit keeps 1 turn). Says what it sets through ``log``."""
    cpu = {k: v for k, v in CPU_SETTINGS.items() if k not in user_keys}
    for key in CPU_CAPS:
        if key in cpu and merged.get(key) is not None:
            cpu[key] = min(cpu[key], merged[key])
    log(
        "llmgym-train: no GPU found; using CPU-sized settings ("
        + ", ".join(f"{k}={v}" for k, v in cpu.items())
        + "). Override any of them on the command line."
    )
    return cpu


def _convert(parser: argparse.ArgumentParser, key: str, value: Any) -> Any:
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


__all__ = [
    "CPU_CAPS",
    "CPU_SETTINGS",
    "DEFAULT_MODEL",
    "META_KEYS",
    "PROFILE_COMMON",
    "PROFILE_DIR",
    "ConfigError",
    "RunOptions",
    "available_profiles",
    "has_gpu",
    "load_profile",
    "load_yaml",
    "profile_path",
    "resolve_config",
    "short_env_name",
]
