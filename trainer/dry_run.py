"""``llmgym-train ... --dry_run``: the resolved protocol as a table, and the per-GPU memory estimate.

Nothing is loaded: the settings come from the merged configuration layers (``--algo`` preset, ``--profile``,
CPU settings, ``--config``, flags), each row naming the layer that set it and, for profile settings, the source
the profile's YAML cites on that line (RAGEN file:line or paper section); the memory estimate reads only the
model's ``config.json`` (:mod:`llm_gym.trainer.memory`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

#: Settings printed by ``--dry_run`` (every other setting a layer changed is printed after them).
PROTOCOL_KEYS = (
    "model",
    "algo",
    "env",
    "env_kwargs",
    "max_turns",
    "max_actions_per_turn",
    "max_actions",
    "chat_style",
    "group_dynamics",
    "num_prompts",
    "num_generations",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_steps",
    "max_new_tokens",
    "max_completion_length",
    "temperature",
    "learning_rate",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "max_grad_norm",
    "lr_scheduler_type",
    "loss_type",
    "loss_agg_mode",
    "epsilon",
    "epsilon_high",
    "dual_clip",
    "beta",
    "entropy_coef",
    "scale_rewards",
    "critic_model",
    "value_lr",
    "critic_weight_decay",
    "value_clip",
    "vf_coef",
    "gae_gamma",
    "gae_lambda",
    "whiten_advantages",
    "filter_strategy",
    "filter_metric",
    "filter_include_zero",
    "filter_value",
    "filter_eps",
    "filter_variance_ddof",
    "filter_loss_scaling",
    "filter_update_steps",
    "advantages_after_filter",
    "filter_empty_stop_steps",
    "early_stop_reward_std_ratio",
    "early_stop_window",
    "early_stop_min_success",
    "early_stop_evals",
    "eval_seed",
    "num_eval_seeds",
    "eval_temperature",
    "eval_strategy",
    "eval_steps",
    "bf16",
    "gradient_checkpointing",
    "use_vllm",
)

_KEY_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*:(?P<rest>.*)$")


def yaml_citations(path: str | Path, algo: str | None = None) -> dict[str, str]:
    """``key -> comment`` for a profile YAML: a key's trailing ``# comment``, else the full-line comments right
    above it. Keys under ``per_algo: <algo>:`` count only for ``algo``."""
    p = Path(path)
    if not p.is_file():
        return {}
    out: dict[str, str] = {}
    above: list[str] = []
    section: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    for raw in p.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        m = _KEY_LINE.match(raw)
        if not m:
            above = []
            continue
        indent = len(m["indent"])
        while section and section[-1][0] >= indent:
            section.pop()
        value, _, comment = m["rest"].partition(" #")
        path_keys = [k for _, k in section]
        if not value.strip():  # a mapping opens
            section.append((indent, m["key"]))
            above = []
            continue
        scope_ok = not path_keys or (
            path_keys[0] == "per_algo" and len(path_keys) == 2 and path_keys[1] == algo
        )
        note = comment.strip() or " ".join(above).strip()
        if scope_ok and note:
            out[m["key"]] = note
        above = []
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def protocol_rows(config: Any, meta: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """``(setting, value, source, citation)`` rows: the value as it will run, the last layer that set it
    (``default`` when none did) and the profile's cited source for it."""
    layers: list[tuple[str, dict]] = list(meta.get("layers") or [])
    merged = dict(meta.get("merged") or {})
    cites: dict[str, str] = {}
    profile_file = meta.get("profile_file")
    if profile_file:
        common = Path(profile_file).with_name("_common.yaml")
        cites.update(yaml_citations(common, meta.get("algo")))
        cites.update(yaml_citations(profile_file, meta.get("algo")))
    keys = list(PROTOCOL_KEYS)
    for _, layer in layers:
        keys += [k for k in layer if k not in keys and k != "per_algo"]
    rows = []
    for key in keys:
        source = "default"
        for name, layer in layers:
            if key in layer:
                source = name
        if key in ("model", "algo"):
            value = meta.get(key)
            explicit = [name for name, layer in layers if layer.get(key) is not None]
            source = explicit[-1] if explicit else "default"
        elif key in merged:
            value = merged[key]
        elif hasattr(config, key):
            value = getattr(config, key)
        else:
            continue
        cite = cites.get(key, "") if source.startswith("profile") else ""
        rows.append((key, _fmt(value), source, cite))
    return rows


def format_rows(rows: list[tuple[str, str, str, str]]) -> str:
    widths = [max(len(r[i]) for r in [("setting", "value", "source", "cites"), *rows]) for i in range(3)]
    widths = [min(w, 40) for w in widths]
    lines = []
    for r in [("setting", "value", "source", "cites"), *rows]:
        lines.append("  ".join(f"{c[: widths[i]]:<{widths[i]}}" for i, c in enumerate(r[:3])) + "  " + r[3])
    return "\n".join(lines)


def find_model_config(model: str, explicit: str | None = None) -> Path | None:
    """The model's ``config.json``: ``explicit``, the local folder's, or the cached hub snapshot's (no download)."""
    if explicit:
        p = Path(explicit)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise ValueError(f"--model_config {explicit!r}: no such config.json")
        return p
    folder = Path(str(model)).expanduser()
    if folder.is_dir():
        return folder / "config.json" if (folder / "config.json").is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(str(model), "config.json")
    except Exception:  # noqa: BLE001 - any lookup failure just means: not cached
        return None
    return Path(hit) if isinstance(hit, str) else None


def accelerate_setup(path: str | None) -> tuple[str, int]:
    """``(sharding, processes)`` of an accelerate config file (``none``/``fsdp``/``zeroN``); one process without."""
    if not path:
        return "none", 1
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--accelerate_config {path!r} not found")
    data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    kind = str(data.get("distributed_type", "NO")).upper()
    procs = int(data.get("num_processes", 1) or 1)
    if kind == "FSDP":
        return "fsdp", procs
    if kind == "DEEPSPEED":
        stage = int((data.get("deepspeed_config") or {}).get("zero_stage", 0) or 0)
        return (f"zero{stage}" if stage else "none"), procs
    return "none", procs


def memory_report(config: Any, meta: dict[str, Any]) -> tuple[str, bool | None]:
    """The per-GPU memory table for the resolved settings and whether it fits ``gpu_memory_gib`` (None: unknown)."""
    from llm_gym.trainer import memory
    from llm_gym.trainer.algorithms import get_algorithm

    merged = dict(meta.get("merged") or {})

    def val(key: str) -> Any:
        return merged[key] if key in merged else getattr(config, key)

    path = find_model_config(str(meta.get("model")), meta.get("model_config"))
    if path is None:
        return (
            f"memory: no config.json found for {meta.get('model')!r} (not a local folder, not in the hub cache); "
            "pass --model_config PATH/config.json",
            None,
        )
    model_cfg = json.loads(path.read_text(encoding="utf-8"))
    sharding, procs = accelerate_setup(meta.get("accelerate_config"))
    rows = int(val("per_device_train_batch_size"))
    per_round = int(val("num_prompts") or 1) * int(val("num_generations"))
    uses_critic = get_algorithm(str(meta.get("algo"))).uses_critic
    bf16 = bool(val("bf16"))
    setup = memory.TrainingSetup(
        per_device_batch=rows,
        # the completion holds every turn; the first prompt is short next to it (system + first state)
        prompt_length=512,
        completion_length=int(val("max_completion_length")),
        generation_batch=max(1, per_round // procs),
        weight_dtype="bfloat16" if bf16 else "float32",
        master_weights=bf16 and sharding != "none",
        gradient_checkpointing=bool(val("gradient_checkpointing")),
        sharding=sharding,
        num_devices=procs,
        critic=uses_critic and val("critic_model") == "separate",
        reference_model=float(val("beta")) != 0.0,
        use_vllm=bool(val("use_vllm")),
        vllm_gpu_memory_utilization=float(merged.get("vllm_gpu_memory_utilization", 0.3)),
    )
    gpu = meta.get("gpu_memory_gib")
    if setup.use_vllm and gpu is None:
        return "memory: with use_vllm pass --gpu_memory_gib (vLLM reserves a share of the GPU)", None
    est = memory.estimate_memory(model_cfg, setup, gpu_gib=gpu)
    head = (
        f"memory per GPU ({path}; {est.parameters / 1e9:.2f}B parameters, {sharding} x {procs} process(es), "
        f"{rows} rows x {setup.prompt_length}+{setup.completion_length} tokens per micro-batch):"
    )
    text = head + "\n" + memory.format_table(est)
    ok = None
    if gpu is not None:
        ok = memory.fits(est.total, gpu)
        verdict = "fits" if ok else "does NOT fit"
        text += (
            f"\n{verdict} a {gpu:g} GiB GPU (estimate {est.total / memory.GIB:.1f} GiB, 10% headroom kept)"
        )
    return text, ok


def dry_run(config: Any, meta: dict[str, Any], out=print) -> int:
    """Print the protocol table and the memory estimate; returns the exit code (0)."""
    out(f"llmgym-train --dry_run: {config.env} | profile {meta.get('profile')} | algo {meta.get('algo')}")
    out(format_rows(protocol_rows(config, meta)))
    text, _ = memory_report(config, meta)
    out("")
    out(text)
    return 0


__all__ = ["PROTOCOL_KEYS", "dry_run", "memory_report", "protocol_rows", "yaml_citations"]
