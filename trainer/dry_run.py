"""``llmgym-train ... --dry_run``: the resolved protocol as a table, and the per-GPU memory estimate.

Nothing is loaded: the settings come from the merged configuration layers (``--algo`` preset, ``--profile``,
CPU settings, ``--config``, flags), each row naming the layer that set it and, for profile settings, the source
the profile's YAML cites on that line (RAGEN file:line or paper section); the memory estimate reads only the
model's ``config.json`` (:mod:`llm_gym.trainer.memory`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
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
    "dtype",
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


#: ``config.json`` files (JSON only, no weights) of the models the profiles and docs name, as published on the
#: Hugging Face hub; see ``model_configs/README.md`` for where each copy comes from.
BUNDLED_CONFIGS = Path(__file__).with_name("model_configs")


def bundled_model_configs() -> dict[str, Path]:
    """Hub id -> bundled ``config.json`` (``Qwen/Qwen2.5-3B`` -> ``model_configs/Qwen/Qwen2.5-3B/config.json``)."""
    return {
        f"{p.parent.parent.name}/{p.parent.name}": p for p in sorted(BUNDLED_CONFIGS.glob("*/*/config.json"))
    }


def find_model_config(model: str, explicit: str | None = None) -> Path | None:
    """The model's ``config.json``: ``explicit``, the local folder's, the cached hub snapshot's (no download), or
    the copy bundled with llm-gym for the models the profiles name (matched by exact hub id, never as a path)."""
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
        hit = None
    if isinstance(hit, str):
        return Path(hit)
    return bundled_model_configs().get(str(model))


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


def _setup_for(config: Any, meta: dict[str, Any], sharding: str, procs: int) -> tuple[Any, Any]:
    """``(TrainingSetup, Precision)`` of the resolved run on one of ``procs`` devices under ``sharding``: the
    weights as :func:`llm_gym.trainer.precision.decide_precision` loads them for that backend."""
    from llm_gym.trainer import memory
    from llm_gym.trainer.algorithms import get_algorithm
    from llm_gym.trainer.precision import decide_precision

    merged = dict(meta.get("merged") or {})

    def val(key: str) -> Any:
        return merged[key] if key in merged else getattr(config, key)

    settings = SimpleNamespace(
        dtype=val("dtype"),
        bf16=bool(val("bf16")),
        fp16=bool(val("fp16")),
        use_cpu=False,
        use_peft=bool(val("use_peft")),
        lora_modules_to_save=val("lora_modules_to_save"),
    )
    backend = {"none": "ddp" if procs > 1 else "none", "fsdp": "fsdp"}.get(sharding, "deepspeed")
    precision = decide_precision(settings, gpu=True, backend=backend)
    algo = get_algorithm(str(meta.get("algo")))
    per_round = int(val("num_prompts") or 1) * int(val("num_generations"))
    setup = memory.TrainingSetup(
        per_device_batch=int(val("per_device_train_batch_size")),
        # the completion holds every turn; the first prompt is short next to it (system + first state)
        prompt_length=512,
        completion_length=int(val("max_completion_length")),
        generation_batch=max(1, math.ceil(per_round / procs)),
        **memory.precision_setup(precision),
        gradient_checkpointing=bool(val("gradient_checkpointing")),
        sharding=sharding,
        num_devices=procs,
        critic=algo.uses_critic and val("critic_model") == "separate",
        value_head=algo.uses_critic,
        reference_model=float(val("beta")) != 0.0,
        use_vllm=bool(val("use_vllm")),
        vllm_gpu_memory_utilization=float(merged.get("vllm_gpu_memory_utilization", 0.3)),
    )
    return setup, precision


def _parameters(n: float) -> str:
    """A parameter count as people write it: 3.09B, 0.89M."""
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def memory_report(config: Any, meta: dict[str, Any]) -> tuple[str, bool | None]:
    """The per-GPU memory of the resolved settings: the table of the chosen setting, one line with its GiB per GPU
    and whether it fits ``gpu_memory_gib`` (else 80 and 141 GiB), and the plan over 1/2/4/8 GPUs with and without
    FSDP. Returns ``(text, fits)`` (``fits`` None: not known)."""
    from llm_gym.trainer import memory, organism

    path: Any = find_model_config(str(meta.get("model")), meta.get("model_config"))
    if path is None and not meta.get("model_config") and organism.is_organism(meta.get("model")):
        # built from scratch at run time: its shape is known by name (at the size's full vocabulary)
        from transformers import Qwen2Config

        name = str(meta.get("model"))
        model_cfg = Qwen2Config(**organism.config_fields(organism.organism_size(name))).to_dict()
        path = f"{name}, built at run time"
    elif path is None:
        have = ", ".join(bundled_model_configs())
        return (
            f"memory: no config.json found for {meta.get('model')!r} (not a local folder, not in the hub cache, "
            f"not one of the bundled configs: {have}); pass --model_config PATH/config.json",
            None,
        )
    else:
        model_cfg = json.loads(path.read_text(encoding="utf-8"))
    sharding, procs = accelerate_setup(meta.get("accelerate_config"))
    setup, precision = _setup_for(config, meta, sharding, procs)
    gpu = meta.get("gpu_memory_gib")
    sizes = (float(gpu),) if gpu else memory.PLAN_GPU_GIB
    # vLLM reserves a share of the GPU it runs on, so with it the totals depend on the GPU size
    est = memory.estimate_memory(model_cfg, setup, gpu_gib=sizes[0])
    models = "policy + critic" if setup.critic else "policy"
    lines = [
        f"memory per GPU ({path}; {_parameters(est.parameters)} parameters, {models}, "
        f"{memory.plan_label(sharding, procs)}, {setup.per_device_batch} rows x "
        f"{setup.prompt_length}+{setup.completion_length} tokens per micro-batch; weights {precision.load} -> "
        f"{precision.params}, AdamW on {precision.master}, compute {precision.compute}):",
        memory.format_table(est),
    ]
    if getattr(config, "use_peft", False):
        lines.append(
            "LoRA: counted as full fine-tuning (an upper bound: the adapters' states are not modelled)"
        )
    totals = {g: memory.estimate_memory(model_cfg, setup, gpu_gib=g).total for g in sizes}
    verdicts = ", ".join(
        f"{'fits' if memory.fits(t, g) else 'does NOT fit'} {g:g} GiB" for g, t in totals.items()
    )
    lines.append(
        f"memory: {totals[sizes[0]] / memory.GIB:.1f} GiB per GPU ({memory.plan_label(sharding, procs)}): "
        f"{verdicts} (10% headroom kept)"
    )
    rows = []
    for n in memory.PLAN_DEVICES:
        for kind in ("none",) if n == 1 else ("none", "fsdp"):
            s, _ = _setup_for(config, meta, kind, n)
            rows.append(
                (
                    memory.plan_label(kind, n),
                    {g: memory.estimate_memory(model_cfg, s, gpu_gib=g).total for g in sizes},
                )
            )
    lines += ["memory plan (per GPU, same settings; FSDP shards weights, gradients and AdamW state):"]
    lines.append(memory.format_plan(rows, sizes))
    ok = memory.fits(totals[sizes[0]], sizes[0]) if gpu else None
    return "\n".join(lines), ok


def dry_run(config: Any, meta: dict[str, Any], out=print) -> int:
    """Print the protocol table and the memory estimate; returns the exit code (0)."""
    out(f"llmgym-train --dry_run: {config.env} | profile {meta.get('profile')} | algo {meta.get('algo')}")
    out(format_rows(protocol_rows(config, meta)))
    text, _ = memory_report(config, meta)
    out("")
    out(text)
    return 0


__all__ = [
    "BUNDLED_CONFIGS",
    "PROTOCOL_KEYS",
    "bundled_model_configs",
    "dry_run",
    "find_model_config",
    "memory_report",
    "protocol_rows",
    "yaml_citations",
]
