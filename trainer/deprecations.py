"""Deprecation warnings that are ours to silence, and only those.

Transformers 5 renamed gradient checkpointing to activation checkpointing and warns (``FutureWarning``) on every
use of the old names. Two sources reached a user's run, several times each:

- TRL's configs set the old field ``gradient_checkpointing`` (default True): :func:`use_current_checkpointing_names`
  hands its value to transformers under the current name (``activation_checkpointing``), so nothing is
  deprecated (our configs, profiles and flags keep accepting the old name, as TRL's do);
- TRL 1.16's generation and scoring helpers (``trl.models.unwrap_model_for_generation``,
  ``trl.models.utils.disable_gradient_checkpointing``, ``GRPOTrainer`` itself) and PEFT's ``PeftModel`` read
  ``is_gradient_checkpointing`` and call ``gradient_checkpointing_disable`` / ``gradient_checkpointing_enable``.
  A user cannot act on that (the calls are in those libraries, made for us): :func:`old_checkpointing_names`
  silences exactly those three messages around our calls into them; every other warning, and the same ones from
  any other caller, still show.

TRL 1.16 also deprecates ``SFTTrainer(compute_loss_func=...)`` (removal in 2.0, outside our ``trl<1.17`` pin).
``--format_loss_weight`` uses it; :func:`compute_loss_func_in_trl_1_16` silences that one message around our call.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

#: The messages transformers' ``modeling_utils`` issues for the old names TRL's helpers use.
_MESSAGE = r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` is deprecated"


@contextlib.contextmanager
def old_checkpointing_names() -> Iterator[None]:
    """Silence transformers' ``FutureWarning`` for the deprecated gradient-checkpointing names in this block (our
    calls into TRL and PEFT code that still uses them)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_MESSAGE, category=FutureWarning)
        yield


@contextlib.contextmanager
def compute_loss_func_in_trl_1_16() -> Iterator[None]:
    """Silence TRL's ``FutureWarning`` that ``compute_loss_func`` goes in TRL 2.0 in this block (our pin stops
    before it; the user cannot act on it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`compute_loss_func` is deprecated", category=FutureWarning
        )
        yield


def enable_activation_checkpointing(model, **kwargs) -> None:
    """Turn activation (gradient) checkpointing on under its current name, the old one on older transformers."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable(**kwargs)


def use_current_checkpointing_names(args) -> None:
    """Before ``TrainingArguments.__post_init__``: a value given under the old name (TRL's default True, a profile's
    ``gradient_checkpointing``) moves to the current one unless that is set (a no-op on transformers without it)."""
    for old, new in (
        ("gradient_checkpointing", "activation_checkpointing"),
        ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
    ):
        if hasattr(args, new) and getattr(args, new) is None and getattr(args, old, None) is not None:
            setattr(args, new, getattr(args, old))
