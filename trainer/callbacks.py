"""Every ``TrainerCallback`` the llm-gym trainer registers (one module for callbacks).

- :class:`EnvProgressCallback`: latest reward and success rate on the progress bar;
- :class:`SkipUpdateCallback`: drops the gradients of a round in which the SNR filter kept nothing;
- :class:`EmptyStopCallback`: stops training after ``filter_empty_stop_steps`` such rounds in a row;
- :class:`CollapseReportCallback`: appends the MI / entropy / reward-variance series to a JSONL file.

Callbacks get what they use as constructor arguments (the :class:`~llm_gym.trainer.signals.SignalState`, the
trainer's public methods); none reads a private attribute of the trainer.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

from llm_gym.trainer.signals import SignalState
from transformers import TrainerCallback

logger = logging.getLogger(__name__)

#: Keys (beyond ``mi/`` and ``snr/``) the collapse report keeps from each log line.
REPORT_KEYS = ("entropy", "reward", "reward_std", "frac_reward_zero_std")
#: TRL metrics appended per micro-batch by ``compute_loss``; meaningless on a skipped (all-masked) update.
LOSS_METRICS = (
    "entropy",
    "kl",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "cispo_clip_ratio",
    "vespo/phi_seq_mean",
    "ppo/value_loss",
)


class EnvProgressCallback(TrainerCallback):
    """Show the latest reward and success rate on the training progress bar."""

    def __init__(self, callback_handler: Any):
        self.callback_handler = callback_handler

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero:
            return
        for cb in self.callback_handler.callbacks:
            bar = getattr(cb, "training_bar", None)
            if bar is not None:
                post = {}
                if "reward" in logs:
                    post["reward"] = f"{logs['reward']:.3f}"
                if logs.get("env/success") is not None:
                    post["success"] = f"{logs['env/success']:.2f}"
                if post:
                    bar.set_postfix(post, refresh=False)


class SkipUpdateCallback(TrainerCallback):
    """Drops every gradient right before ``optimizer.step()`` when the round kept nothing.

    Zero advantages are not enough: AdamW momentum and weight decay would still move the weights.
    With ``grad=None`` AdamW skips the parameter entirely, so the weights stay bitwise equal.
    (DeepSpeed steps inside its engine, so :func:`make_signal_callbacks` refuses the filter under DeepSpeed.)

    Args:
        state: the trainer's signal state (``skip`` is set per round by ``signals.after_scoring``).
        trainer: used for ``optimizer`` (when the event does not pass one), ``current_gradient_accumulation_steps``
            and ``drop_last_metrics(keys, count)``.
    """

    def __init__(self, state: SignalState, trainer: Any) -> None:
        self.state = state
        self.trainer = trainer

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.state.skip:
            return
        optimizer = kwargs.get("optimizer") or self.trainer.optimizer
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
        self.state.skipped_steps += 1
        # TRL's loss metrics of this step come from masked dummy rows only (entropy would read 0): drop them
        n = int(
            getattr(self.trainer, "current_gradient_accumulation_steps", 0)
            or args.gradient_accumulation_steps
        )
        self.trainer.drop_last_metrics(LOSS_METRICS, n)


class EmptyStopCallback(TrainerCallback):
    """Stops training after ``filter_empty_stop_steps`` consecutive rounds with nothing kept."""

    def __init__(self, state: SignalState) -> None:
        self.state = state

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        st = self.state
        limit = args.filter_empty_stop_steps
        if limit and st.consecutive_empty >= limit and st.stop_reason is None:
            st.stop_reason = (
                f"stopping at step {state.global_step}: {st.consecutive_empty} consecutive rounds had no group "
                f"with reward variance above the {args.filter_strategy} threshold (filter_empty_stop_steps={limit}); "
                "the policy gets no task signal from these prompts"
            )
            logger.warning(st.stop_reason)
            print(f"[llm-gym] {st.stop_reason}", flush=True)
        if st.stop_reason is not None:
            control.should_training_stop = True


class CollapseReportCallback(TrainerCallback):
    """Appends the MI / entropy / reward-variance series to ``output_dir/collapse_report`` (JSONL)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and state.global_step == 0 and os.path.exists(self.path):
            os.remove(self.path)  # a fresh run starts a fresh series; a resumed one appends

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        row = {
            k: v
            for k, v in logs.items()
            if (k.startswith(("mi/", "snr/")) or k in REPORT_KEYS)
            and isinstance(v, (int, float))
            and math.isfinite(v)
        }
        if not any(k.startswith(("mi/", "snr/")) for k in row):
            return
        row = {"step": state.global_step, **row}
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def make_signal_callbacks(
    args: Any, state: SignalState, trainer: Any, *, deepspeed: bool = False
) -> list[TrainerCallback]:
    """The SNR / MI callbacks: skip update, early stop, and the collapse-report writer (if ``collapse_report``)."""
    if args.filter_strategy != "off" and deepspeed:
        # Measured on 2 CPU processes with ZeRO-2: a skipped round changed every rank's weights and AdamW state.
        raise ValueError(
            "SNR filtering (filter_strategy="
            f"{args.filter_strategy!r}) is refused under DeepSpeed: DeepSpeed steps the optimizer inside its "
            "engine, so a round in which the filter keeps no group would still move the weights (AdamW momentum "
            "and weight decay) instead of being skipped. Use FSDP (trainer/accelerate_configs/fsdp.yaml, ZeRO-3 "
            "style sharding with an exact skip) or DDP for SNR filtering, or set --filter_strategy off to train "
            "under DeepSpeed without the filter."
        )
    callbacks: list[TrainerCallback] = [SkipUpdateCallback(state, trainer), EmptyStopCallback(state)]
    if args.collapse_report:
        callbacks.append(CollapseReportCallback(os.path.join(args.output_dir, args.collapse_report)))
    return callbacks
