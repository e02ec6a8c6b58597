"""LoRA from the command line, with TRL's ``ModelConfig`` flags (``--use_peft``, ``--lora_r``, ``--lora_alpha``...).

The fields are not copied: :func:`lora_arguments` builds the config group from ``trl.ModelConfig``'s own fields
(names, defaults and help text), and :func:`peft_config` turns them into a ``peft.LoraConfig`` through
``trl.get_peft_config``, so ``llmgym-train --use_peft --lora_r 8`` means exactly what it means for TRL's scripts.
Only the LoRA fields are taken: ``ModelConfig``'s loading fields (``model_name_or_path``, ``dtype``,
quantization) have their llm-gym equivalents (``--model``; ``--dtype``, decided per path by
:mod:`llm_gym.trainer.precision`).

Saved adapters (``adapter_config.json`` in ``output_dir/final``) load anywhere a model does:
``llmgym-eval --model runs/x/final`` puts the adapter on its base model (:mod:`llm_gym.trainer.models`).
"""

from __future__ import annotations

import functools
from dataclasses import MISSING, field, fields, make_dataclass
from typing import Any

#: The ``trl.ModelConfig`` fields that configure LoRA (what ``trl.get_peft_config`` reads).
LORA_FIELDS = (
    "use_peft",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "lora_target_parameters",
    "lora_modules_to_save",
    "lora_task_type",
    "use_rslora",
    "use_dora",
)


class LoRAFieldTypes:
    """The :data:`LORA_FIELDS` as type checkers and IDEs see them on the config (``args.lora_r``).

    Only annotations: the fields themselves (defaults, help) come from ``trl.ModelConfig`` through
    :func:`lora_arguments`; ``tests/test_lora.py`` checks that the two list the same names and types.
    """

    use_peft: bool
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    lora_target_modules: list[str] | None
    lora_target_parameters: list[str] | None
    lora_modules_to_save: list[str] | None
    lora_task_type: str
    use_rslora: bool
    use_dora: bool


@functools.cache
def lora_arguments() -> type:
    """The ``LoRAArguments`` config group: TRL's ``ModelConfig`` LoRA fields with their defaults and help."""
    from trl import ModelConfig

    specs = []
    for f in fields(ModelConfig):
        if f.name not in LORA_FIELDS:
            continue
        kwargs: dict[str, Any] = {"metadata": dict(f.metadata)}
        if f.default is not MISSING:
            kwargs["default"] = f.default
        else:  # pragma: no cover - TRL's LoRA fields all have plain defaults today
            kwargs["default_factory"] = f.default_factory
        specs.append((f.name, f.type, field(**kwargs)))
    missing = set(LORA_FIELDS) - {name for name, _, _ in specs}
    if missing:  # pragma: no cover - a TRL upgrade renamed a flag: fail loudly rather than drop it
        raise RuntimeError(f"trl.ModelConfig no longer has the LoRA field(s) {sorted(missing)}")
    cls = make_dataclass("LoRAArguments", specs)
    cls.__doc__ = "LoRA (PEFT) settings: TRL's ``ModelConfig`` flags, read by ``trl.get_peft_config``."
    cls.__module__ = __name__
    return cls


def peft_config(args: Any) -> Any:
    """``peft.LoraConfig`` for ``args`` (any object with the :data:`LORA_FIELDS`), or None without ``use_peft``.

    Goes through ``trl.ModelConfig`` (which turns a one-element ``lora_target_modules`` list into the string,
    e.g. ``all-linear``) and ``trl.get_peft_config``."""
    if not getattr(args, "use_peft", False):
        return None
    from trl import ModelConfig, get_peft_config

    values = {name: getattr(args, name) for name in LORA_FIELDS if hasattr(args, name)}
    return get_peft_config(ModelConfig(**values))


__all__ = ["LORA_FIELDS", "LoRAFieldTypes", "lora_arguments", "peft_config"]
