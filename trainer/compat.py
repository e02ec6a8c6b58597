"""Every private TRL / transformers member the trainer relies on, in one place.

TRL's ``GRPOTrainer`` has no public hook for what llm-gym changes in a training round (filtering rows after
scoring, buffering the kept rows into micro-batches, our loss) or in a checkpoint (the signal state, a value
head beside the weights), so the trainers override a few private methods and use a few private attributes. They
are why ``pyproject.toml`` pins ``trl>=1.16,<1.17``. Each one is named here:

- :data:`OVERRIDES`: the private methods :mod:`~llm_gym.trainer.grpo` and :mod:`~llm_gym.trainer.ppo` override
  (each override is marked ``@compat.overrides`` and calls ``super()``), with the parameters we rely on;
- the functions below: the private attributes we read or write and the private methods we call.

``tests/test_compat.py`` checks each against the installed TRL and transformers, one test per member named after
it, so an upgrade that renames or reshapes one fails by name; it also checks that no other trainer module
touches a private TRL member. Upgrading TRL: run that test first, fix what it names here, then widen the pin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

#: Private methods our trainers override: name -> (the class that defines it, the parameters after ``self``
#: that our override takes and passes on).
OVERRIDES: dict[str, tuple[str, tuple[str, ...]]] = {
    # the training round: generation + scoring (we add env metrics, records, advantages, the SNR filter)
    "_generate_and_score_completions": ("trl.GRPOTrainer", ("inputs",)),
    # buffering a round into micro-batches (filter_update_steps="proportional" fills them itself)
    "_prepare_inputs": ("trl.GRPOTrainer", ("generation_batch",)),
    # the rewards per function, kept to reduce them to one episode reward per row
    "_calculate_rewards": ("trl.GRPOTrainer", ("inputs", "prompts", "completions", "completion_ids_list")),
    # the policy loss (loss_agg_mode / dual_clip)
    "_compute_loss": ("trl.GRPOTrainer", ("model", "inputs")),
    # per-token log-probs through shared-prefix forwards (prefix sharing); TRL's pass otherwise
    "_get_per_token_logps_and_entropies": (
        "trl.GRPOTrainer",
        (
            "model",
            "input_ids",
            "attention_mask",
            "logits_to_keep",
            "batch_size",
            "compute_entropy",
            "compute_aux_loss",
        ),
    ),
    # checkpoints: the signal state and the completion marker after Trainer's files
    "_save_checkpoint": ("transformers.Trainer", ("model", "trial")),
    "_load_from_checkpoint": ("transformers.Trainer", ("resume_from_checkpoint", "model")),
    # PPO: the value head / critic saved beside the policy weights, not inside them
    "_save": ("transformers.Trainer", ("output_dir", "state_dict")),
    "_issue_warnings_after_load": ("transformers.Trainer", ("load_result",)),
    # PPO with a separate critic: actor and critic clipped each on its own
    "_clip_grad_norm": ("transformers.Trainer", ("model",)),
}

#: Private attributes of a ``GRPOTrainer`` instance used below (set in ``GRPOTrainer.__init__``).
TRAINER_ATTRIBUTES = ("_metrics", "_step", "_buffered_inputs", "_dist")
#: Private methods of ``GRPOTrainer`` / ``Trainer`` called below.
TRAINER_METHODS = ("_get_per_token_logps_and_entropies", "_get_output_dir", "_load_from_checkpoint")
#: Private attribute of a transformers ``PreTrainedModel`` used below.
MODEL_ATTRIBUTES = ("_keys_to_ignore_on_save",)

F = TypeVar("F", bound=Callable[..., Any])


def overrides(method: F) -> F:
    """Mark an override of a private TRL / transformers method; only the :data:`OVERRIDES` may be overridden."""
    if method.__name__ not in OVERRIDES:
        raise TypeError(
            f"{method.__name__} is not a private TRL/transformers method listed in compat.OVERRIDES"
        )
    return method


# ------------------------------------------------------------------------------------------ GRPOTrainer state
def metrics(trainer: Any, mode: str) -> dict[str, list[float]]:
    """TRL's metric lists of ``mode`` (``"train"`` / ``"eval"``): each key's mean is logged at the next log step
    (``GRPOTrainer._metrics``)."""
    return trainer._metrics[mode]


def micro_step(trainer: Any) -> int:
    """Micro-batches TRL has consumed so far; a round's buffer is refilled when it reaches a multiple of
    ``steps_per_generation * num_iterations`` (``GRPOTrainer._step``)."""
    return int(trainer._step)


def buffered_inputs(trainer: Any) -> list[dict] | None:
    """The current round's micro-batches (``GRPOTrainer._buffered_inputs``; None before the first round)."""
    return trainer._buffered_inputs


def set_buffered_inputs(trainer: Any, batches: list[dict]) -> None:
    """Replace the round's micro-batches (``GRPOTrainer._buffered_inputs``)."""
    trainer._buffered_inputs = batches


def distributed_backend(trainer: Any) -> Any:
    """TRL's FSDP helper whose ``summon_full_params`` gathers sharded weights for generation
    (``GRPOTrainer._dist``), or None."""
    return getattr(trainer, "_dist", None)


def per_token_logps_and_entropies(
    trainer: Any, model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, **kwargs: Any
) -> tuple[Any, Any, Any]:
    """``(log-probs, entropies, aux loss)`` of the last ``logits_to_keep`` tokens of each row, TRL's way
    (temperature, chunking by ``batch_size``; ``compute_entropy=True`` for entropies)
    (``GRPOTrainer._get_per_token_logps_and_entropies``)."""
    return trainer._get_per_token_logps_and_entropies(
        model, input_ids, attention_mask, logits_to_keep, **kwargs
    )


def run_output_dir(trainer: Any, trial: Any) -> str:
    """The folder Trainer writes this run's checkpoints into (``Trainer._get_output_dir``)."""
    return trainer._get_output_dir(trial=trial)


def load_checkpoint(trainer: Any, folder: str) -> None:
    """Load a checkpoint folder's weights into the trainer's model, whatever its layout (full, sharded, PEFT
    adapter); through a subclass's override, its own state too (``Trainer._load_from_checkpoint``)."""
    trainer._load_from_checkpoint(folder)


# ------------------------------------------------------------------------------------------ models
def ignore_on_save(model: Any, names: set[str]) -> None:
    """Keep the weights ``names`` (e.g. a value head) out of ``save_pretrained``'s output
    (``PreTrainedModel._keys_to_ignore_on_save``)."""
    ignore = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    model._keys_to_ignore_on_save = ignore | set(names)


__all__ = [
    "MODEL_ATTRIBUTES",
    "OVERRIDES",
    "TRAINER_ATTRIBUTES",
    "TRAINER_METHODS",
    "buffered_inputs",
    "distributed_backend",
    "ignore_on_save",
    "load_checkpoint",
    "metrics",
    "micro_step",
    "overrides",
    "per_token_logps_and_entropies",
    "run_output_dir",
    "set_buffered_inputs",
]
