"""Which dtype the trained weights live in: float32 master weights on every path, decided in one place.

AdamW's step at the learning rates RL fine-tuning uses (1e-6 to 1e-5) is far below half a bfloat16 step of a
typical weight (about 1e-4 at |w| = 0.02), so on bfloat16 weights with no float32 copy most updates round away:
one step at lr 1e-6 changes 2.3% of a tiny random Qwen2's elements and 0.4% of SmolLM2-135M's, against
99.8-100% in float32 (``benchmarks/update_precision.py``). Training therefore keeps float32 weights, and
``bf16=True`` means bfloat16 *autocast* (the matmuls run in bfloat16 on float32 weights), as TRL does when it
loads a model itself (TRL ``GRPOTrainer``: ``dtype`` defaults to float32).

:func:`decide_precision` is the rule, a pure function of the config, the device, the distributed backend, LoRA
and the model being loaded; ``llmgym-train`` (:func:`load_for_training`), the trainer itself for a model handed to
it from Python (:func:`align_trainer_model`), the PPO critic and value head (:mod:`llm_gym.trainer.ppo`) and the
``--dry_run`` memory plan all read it. What each backend does with the
weights it is handed (checked in the sources of the versions named):

- one process, DDP: nothing; the optimizer updates the parameters as loaded. So they are loaded in float32.
- FSDP (accelerate 1.15 ``utils/fsdp_utils.py`` ``fsdp2_prepare_model``; FSDP1 in ``accelerator.py``
  ``prepare_model``): with mixed precision on, accelerate upcasts every *trainable* 16-bit parameter to float32
  before sharding and computes in bfloat16 (``MixedPrecisionPolicy``). Loaded in float32, nothing is left to
  upcast: nothing is cast twice.
- DeepSpeed (0.19.6, ``runtime/engine.py`` ``_configure_distributed_model``): with ``bf16`` enabled the engine
  casts the parameters to bfloat16 itself and its optimizer keeps float32 master weights (``engine.py``
  ``_do_optimizer_sanity_check``: ZeRO-0 wraps the optimizer in ``runtime/fp16/fused_optimizer.py`` or
  ``unfused_optimizer.py``, ZeRO-1 with a float32 ``grad_accum_dtype`` in ``runtime/bf16_optimizer.py``, ZeRO-1/2/3
  otherwise in ``runtime/zero/stage_1_and_2.py`` / ``stage3.py``; unless ``bf16_master_weights_and_grads`` is
  set). A float32 load costs host memory while loading only. Without ``bf16`` the engine casts nothing.
- LoRA (PEFT 0.21 ``get_peft_model`` / ``PeftModel.from_pretrained``, ``autocast_adapter_dtype=True``): the
  adapter weights are upcast to float32 whatever the base's dtype, so a frozen base may be bfloat16 (opt-in
  ``dtype="bfloat16"``, half the memory, no update lost). ``modules_to_save`` copies are *not* upcast.

16-bit trained weights remain available as an explicit opt-in (``dtype="bfloat16"``, TRL ``ModelConfig``'s
name for the same choice); where it loses updates it comes with a warning that says so.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

#: Values of the ``dtype`` config field: the dtype the model's weights are loaded in for training.
WEIGHT_DTYPES = ("float32", "bfloat16")
DEFAULT_WEIGHT_DTYPE = "float32"
#: Distributed backends, as :func:`distributed_backend` names them.
BACKENDS = ("none", "ddp", "fsdp", "deepspeed")
#: The models a run trains: the policy (a full model, or a LoRA base with its adapters), PPO's separate
#: critic (a copy of the policy's backbone) and the value head (``Linear(hidden, 1)``, always created in float32).
ROLES = ("policy", "critic", "value_head")

#: What a step on bfloat16 weights loses, measured (``benchmarks/update_precision.py``, one AdamW step).
BF16_LOSS = (
    "AdamW updates smaller than half a bfloat16 step of the weight are rounded away: one step at lr 1e-6 "
    "changes 0.4% of SmolLM2-135M's elements (1.8% at 1e-5) against 99.8% in float32"
)


@dataclass(frozen=True)
class Precision:
    """The dtypes of one model in a training run, and why.

    ``load``: what ``from_pretrained`` is given (or what llm-gym creates the value head in); ``params``: the
    trainable parameters as the module holds them while training; ``master``: the copy AdamW updates (float32
    unless the opt-in loses it); ``compute``: the matmul dtype (bfloat16 under autocast); ``frozen``: a LoRA
    base's weights while training (None for full fine-tuning); ``warning``: set when updates are lost."""

    load: str
    params: str
    master: str
    compute: str
    reason: str
    frozen: str | None = None
    warning: str | None = None

    @property
    def keeps_updates(self) -> bool:
        """True when the optimizer updates float32 weights (a small step is not rounded away)."""
        return self.master == "float32"


def weight_dtype_of(config: Any) -> str:
    """The config's ``dtype`` (None: the default float32); raises ``ValueError`` for anything else."""
    value = getattr(config, "dtype", None) or DEFAULT_WEIGHT_DTYPE
    value = str(value).removeprefix("torch.")
    if value not in WEIGHT_DTYPES:
        raise ValueError(
            f"dtype must be one of {', '.join(WEIGHT_DTYPES)} (the dtype the trained weights are loaded in; "
            f"float32 keeps every update, bfloat16 is an opt-in that loses small ones), got {value!r}"
        )
    return value


def _autocast(config: Any) -> str | None:
    if getattr(config, "bf16", False):
        return "bfloat16"
    if getattr(config, "fp16", False):
        return "float16"
    return None


def decide_precision(
    config: Any,
    *,
    gpu: bool,
    backend: str = "none",
    lora: bool | None = None,
    role: str = "policy",
) -> Precision:
    """The dtypes of ``role`` (``policy``, ``critic`` or ``value_head``) for ``config`` on a GPU (``gpu``) or the
    CPU under ``backend`` (``none``, ``ddp``, ``fsdp``, ``deepspeed``). ``lora``: the policy is a LoRA base with
    trainable adapters (default: ``config.use_peft``). Reads ``dtype``, ``bf16``, ``fp16``, ``use_cpu``,
    ``use_peft`` and ``lora_modules_to_save`` from ``config``. Pure: no torch, no I/O."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    requested = weight_dtype_of(config)
    amp = _autocast(config)
    where = "GPU" if gpu and not getattr(config, "use_cpu", False) else "CPU"
    compute_note = f"{amp} autocast computes the matmuls" if amp else "no autocast (bf16=False)"
    # DeepSpeed in a 16-bit mode casts every parameter itself and keeps a float32 master copy in its optimizer.
    ds_dtype = amp if backend == "deepspeed" else None  # the dtype DeepSpeed casts to, when it casts
    ds_cast = ds_dtype is not None
    # accelerate's FSDP preparation upcasts 16-bit *trainable* parameters to float32 when mixed precision is on.
    fsdp_upcast = backend == "fsdp" and amp is not None

    if role == "value_head":
        params = ds_dtype or "float32"
        return Precision(
            load="float32",
            params=params,
            master="float32",
            compute=amp or "float32",
            reason="the value head is created in float32 by llm-gym"
            + ("; DeepSpeed casts it with the module and keeps a float32 master copy" if ds_cast else ""),
        )

    lora = bool(getattr(config, "use_peft", False)) if lora is None else bool(lora)
    if role == "critic" and lora:
        raise ValueError("critic_model='separate' is not supported with LoRA; the value head is used instead")
    model = "the critic (a copy of the policy's backbone)" if role == "critic" else "the policy"

    if lora:
        frozen = ds_dtype or requested
        saved = getattr(config, "lora_modules_to_save", None)
        if ds_cast or fsdp_upcast:
            # DeepSpeed: fp32 master copies of every trainable tensor (TRL turns PEFT's adapter upcast off under
            # ZeRO-3, so the module holds bf16 adapters); FSDP: accelerate upcasts the trainable ones.
            params, master = (ds_dtype or "float32"), "float32"
        else:
            params = master = "bfloat16" if (saved and requested == "bfloat16") else "float32"
        reason = (
            f"LoRA on {where}: the frozen base is loaded in {requested}"
            + (" (opt-in; frozen weights lose no update)" if requested == "bfloat16" else "")
            + ", PEFT upcasts the adapters to float32 (autocast_adapter_dtype=True)"
            + ("; DeepSpeed keeps float32 master copies of them" if ds_cast else "")
            + f"; {compute_note}"
        )
        warning = None
        if master != "float32":
            warning = (
                f"dtype='bfloat16' with lora_modules_to_save={saved}: those modules are trained as full bfloat16 "
                f"copies with no float32 master (PEFT upcasts only the adapters). {BF16_LOSS}. Use dtype='float32'"
            )
        return Precision(
            load=requested,
            params=params,
            master=master,
            compute=amp or requested,
            frozen=frozen,
            reason=reason,
            warning=warning,
        )

    if ds_dtype is not None:
        params, master = ds_dtype, "float32"
        how = (
            f"DeepSpeed casts the parameters to {amp} itself and its optimizer keeps float32 master weights "
            "(ZeRO's float32 partitions / BF16_Optimizer)"
            + ("; the float32 load costs host memory while loading only" if requested == "float32" else "")
        )
    elif fsdp_upcast:
        params = master = "float32"
        how = (
            "accelerate's FSDP preparation upcasts 16-bit trainable parameters to float32 (the opt-in saves "
            "host memory while loading only)"
            if requested == "bfloat16"
            else "float32 already, so accelerate's FSDP upcast has nothing left to cast"
        )
    else:
        params = master = requested
        how = (
            "float32 weights, gradients and AdamW state: the master copy is the weights themselves"
            if requested == "float32"
            else "bfloat16 weights, gradients and AdamW state (opt-in): no float32 copy"
        )
    reason = f"{model} on {where} ({backend}): loaded in {requested}; {how}; {compute_note}"
    warning = None
    if master != "float32":
        warning = (
            f"dtype='bfloat16': {model} trains on bfloat16 weights with no float32 master copy. {BF16_LOSS}. "
            "Leave dtype at float32 (bf16=True still computes in bfloat16) unless memory forces this"
        )
    return Precision(
        load=requested,
        params=params,
        master=master,
        compute=amp or params,
        reason=reason,
        warning=warning,
    )


def _truthy(value: Any) -> bool:
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


def distributed_backend(config: Any = None, environ: Mapping[str, str] | None = None) -> str:
    """The backend a run will use, known before the trainer exists: ``accelerate launch`` sets
    ``ACCELERATE_USE_DEEPSPEED`` / ``ACCELERATE_USE_FSDP``; the config's ``deepspeed`` / ``fsdp`` fields say the
    same without it; more than one process (``WORLD_SIZE``) otherwise means DDP."""
    env = os.environ if environ is None else environ
    if _truthy(env.get("ACCELERATE_USE_DEEPSPEED")) or getattr(config, "deepspeed", None):
        return "deepspeed"
    if _truthy(env.get("ACCELERATE_USE_FSDP")) or getattr(config, "fsdp", None):
        return "fsdp"
    try:
        world = int(env.get("WORLD_SIZE", "1") or 1)
    except ValueError:
        world = 1
    return "ddp" if world > 1 else "none"


def backend_of(accelerator: Any) -> str:
    """The backend of a built ``accelerate.Accelerator`` (its ``distributed_type``)."""
    kind = str(getattr(getattr(accelerator, "distributed_type", None), "value", "NO")).upper()
    if kind == "DEEPSPEED":
        return "deepspeed"
    if kind == "FSDP":
        return "fsdp"
    return "none" if kind == "NO" else "ddp"


def decide_for_trainer(
    config: Any, accelerator: Any, role: str = "policy", lora: bool | None = None
) -> Precision:
    """:func:`decide_precision` for a built trainer: the device and the backend of its ``accelerator``."""
    gpu = getattr(getattr(accelerator, "device", None), "type", "cpu") != "cpu"
    return decide_precision(config, gpu=gpu, backend=backend_of(accelerator), lora=lora, role=role)


def upcast_trainable(model: Any, precision: Precision) -> list[str]:
    """Cast ``model``'s trainable 16-bit parameters to float32 in place when ``precision`` trains float32 weights,
    and return their names. A model handed to the trainer already loaded in bfloat16 (from Python, not through
    :func:`load_for_training`) would otherwise train with no float32 copy. Frozen weights (a LoRA base) keep their
    dtype, as in accelerate's FSDP upcast; DeepSpeed-partitioned parameters are the engine's to cast."""
    if precision.params != "float32":
        return []
    import torch

    names = []
    for name, p in model.named_parameters():
        if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16) and not hasattr(p, "ds_id"):
            p.data = p.data.float()
            names.append(name)
    return names


def align_trainer_model(
    model: Any, config: Any, accelerator: Any, log: Callable[[str], Any] | None = None
) -> Precision:
    """The policy's decision for a built trainer, applied to the model it was handed (:func:`upcast_trainable`);
    ``log`` (default: this module's logger) says how many parameters were upcast, if any."""
    lora = bool(getattr(config, "use_peft", False)) or hasattr(model, "peft_config")
    precision = decide_for_trainer(config, accelerator, lora=lora)
    names = upcast_trainable(model, precision)
    if names:
        (log or logger.warning)(
            f"llmgym-train: the model was handed over with {len(names)} trainable 16-bit parameters "
            f"({names[0]}, ...); upcast to float32 (dtype={precision.load!r}; bf16 stays autocast). "
            "Load it in float32, or set dtype='bfloat16' to train 16-bit weights"
        )
    return precision


def announce(precision: Precision, log: Callable[[str], Any] | None = print) -> None:
    """Print the decision (``log``, e.g. rank 0's print) and raise its warning as a ``UserWarning``."""
    if log is not None:
        log(
            f"llmgym-train: weights {precision.load} -> trained as {precision.params}, "
            f"updates on {precision.master}: {precision.reason}"
        )
    if precision.warning:
        warnings.warn(precision.warning, UserWarning, stacklevel=2)


def load_for_training(
    name_or_path: str,
    config: Any,
    *,
    gpu: bool,
    environ: Mapping[str, str] | None = None,
    log: Callable[[str], Any] | None | str = "main",
) -> tuple[Any, Any, Precision]:
    """``(model, tokenizer, precision)`` for training: the dtype from :func:`decide_precision` (a LoRA adapter
    folder as the model counts as LoRA: its adapter keeps training), announced before the weights load (``log``:
    ``"main"`` prints on the launch's main process only)."""
    from pathlib import Path

    from llm_gym.trainer.models import adapter_base, load_model_and_tokenizer, resolve_model

    resolved = resolve_model(name_or_path)
    lora = bool(getattr(config, "use_peft", False)) or (
        Path(resolved).is_dir() and adapter_base(resolved) is not None
    )
    env = os.environ if environ is None else environ
    precision = decide_precision(config, gpu=gpu, backend=distributed_backend(config, env), lora=lora)
    if log == "main":
        log = print if str(env.get("RANK", "0")) == "0" else None
    announce(precision, log)  # type: ignore[arg-type]
    model, tokenizer = load_model_and_tokenizer(
        resolved,
        dtype=precision.load,
        chat_template=getattr(config, "chat_template", None),
        adapter_trainable=True,
    )
    return model, tokenizer, precision


# ------------------------------------------------------------------------------------------ measuring it
def trainable_snapshot(model: Any) -> dict[str, Any]:
    """A copy of every trainable parameter (name -> tensor), to compare after an update."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def changed_fraction(model: Any, snapshot: Mapping[str, Any]) -> float:
    """The fraction of the snapshot's elements whose value differs now (bit-exact comparison)."""
    params = dict(model.named_parameters())
    changed = total = 0
    for name, before in snapshot.items():
        now = params[name].detach()
        changed += int((now != before.to(now.device)).sum())
        total += before.numel()
    if total == 0:
        raise ValueError("no trainable elements to compare")
    return changed / total


def trainable_dtypes(model: Any) -> dict[str, int]:
    """Elements of trainable parameters per dtype name (``{"float32": 99904}``)."""
    out: dict[str, int] = {}
    for p in model.parameters():
        if p.requires_grad:
            key = str(p.dtype).removeprefix("torch.")
            out[key] = out.get(key, 0) + p.numel()
    return out


__all__ = [
    "BACKENDS",
    "DEFAULT_WEIGHT_DTYPE",
    "Precision",
    "ROLES",
    "WEIGHT_DTYPES",
    "align_trainer_model",
    "announce",
    "backend_of",
    "changed_fraction",
    "decide_for_trainer",
    "decide_precision",
    "distributed_backend",
    "load_for_training",
    "trainable_dtypes",
    "trainable_snapshot",
    "upcast_trainable",
    "weight_dtype_of",
]
