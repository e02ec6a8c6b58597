"""Every ``TrainerCallback`` the llm-gym trainer registers (one module for callbacks).

- :class:`EnvProgressCallback`: latest reward and success rate on the progress bar;
- :class:`SkipUpdateCallback`: drops the gradients of a round in which the SNR filter kept nothing;
- :class:`EmptyStopCallback`: stops training after ``filter_empty_stop_steps`` such rounds in a row;
- :class:`CollapseReportCallback`: appends the MI / entropy / reward-variance series to a JSONL file;
- :class:`RewardStdCollapseCallback`, :class:`LowSuccessStopCallback`: RAGEN's early stops (off by default).

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

from llm_gym.core.checks import is_number
from llm_gym.safe_io import append_text

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
    "policy_loss",
    "clip_ratio/dual_mean",
)


def _finite(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


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
                # TRL logs a NaN mean (every reward NaN) as None: show only finite numbers
                if _finite(logs.get("reward")):
                    post["reward"] = f"{logs['reward']:.3f}"
                if _finite(logs.get("env/success")):
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
        # skip: the round kept nothing; empty_step: filter_update_steps="proportional" left this step without rows
        if not (self.state.skip or self.state.empty_step):
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
        append_text(self.path, json.dumps(row) + "\n")  # a failed write leaves no torn line


class RewardStdCollapseCallback(TrainerCallback):
    """RAGEN's reward-variance early stop (``ragen/trainer/agent_trainer.py``, the ``reward_variance_collapse``
    stop): the baseline is the mean of the in-group reward std (before filtering, averaged over groups) of the first
    ``early_stop_window`` rounds that kept something; training stops once ``early_stop_window`` consecutive later
    kept rounds all fall below ``early_stop_reward_std_ratio`` x baseline. Rounds that kept nothing are not counted.

    Reads ``state.last["snr/group_std_before"]`` and ``state.skip`` after each round (set by
    :func:`llm_gym.trainer.signals.after_scoring`)."""

    def __init__(self, state: SignalState, ratio: float, window: int) -> None:
        from collections import deque

        self.state, self.ratio, self.window = state, float(ratio), int(window)
        self.first: list[float] = []
        self.recent: deque[float] = deque(maxlen=self.window)
        self.base: float | None = None
        self.seen_round = 0

    def state_dict(self) -> dict[str, Any]:
        """The baseline and windows, saved in checkpoints so that a resumed run keeps its baseline."""
        return {
            "first": self.first,
            "recent": list(self.recent),
            "base": self.base,
            "seen_round": self.seen_round,
        }

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.first = [float(v) for v in data.get("first", [])]
        self.recent.clear()
        self.recent.extend(float(v) for v in data.get("recent", []))
        self.base = None if data.get("base") is None else float(data["base"])
        self.seen_round = int(data.get("seen_round", 0))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        st = self.state
        if st.rounds != self.seen_round:  # one new generation round since the last look
            self.seen_round = st.rounds
            std = st.last.get("snr/group_std_before")
            if std is not None and not st.skip and math.isfinite(std):
                if self.base is None:
                    self.first.append(std)
                    if len(self.first) == self.window:
                        self.base = sum(self.first) / self.window
                else:
                    self.recent.append(std)
                    if (
                        len(self.recent) == self.window
                        and all(v < self.ratio * self.base for v in self.recent)
                        and st.stop_reason is None
                    ):
                        st.stop_reason = (
                            f"stopping at step {state.global_step}: reward std collapsed (last {self.window} rounds "
                            f"below {self.ratio} x the baseline {self.base:.4g}; early_stop_reward_std_ratio)"
                        )
                        logger.warning(st.stop_reason)
                        print(f"[llm-gym] {st.stop_reason}", flush=True)
        if st.stop_reason is not None:
            control.should_training_stop = True


class LowSuccessStopCallback(TrainerCallback):
    """RAGEN's low-validation-success early stop (``ragen/trainer/agent_trainer.py``, ``low_validation_success``):
    stop when ``eval_env/success`` stays below ``early_stop_min_success`` for ``early_stop_evals`` evaluations in a
    row. Only evaluations inside ``train()`` count: RAGEN's validation before training is not checked
    (``agent_trainer.py:972-975``), so neither is the ``evaluate()`` llmgym-train runs before (or after) it."""

    def __init__(self, state: SignalState, min_success: float, evals: int) -> None:
        self.state, self.min_success, self.evals = state, float(min_success), int(evals)
        self.low = 0
        self.training = False

    def state_dict(self) -> dict[str, Any]:
        return {"low": self.low}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.low = int(data.get("low", 0))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # A resumed run keeps the count restored from its checkpoint (load_state_dict runs before this hook).
        self.training = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.training = False

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: dict | None = None, **kwargs: Any
    ) -> None:
        value = (metrics or {}).get("eval_env/success")
        if value is None or not self.training:
            return
        self.low = self.low + 1 if value < self.min_success else 0
        if self.low >= self.evals and self.state.stop_reason is None:
            self.state.stop_reason = (
                f"stopping at step {state.global_step}: evaluation success below {self.min_success} for "
                f"{self.low} evaluations in a row (early_stop_min_success)"
            )
            logger.warning(self.state.stop_reason)
            print(f"[llm-gym] {self.state.stop_reason}", flush=True)
        if self.state.stop_reason is not None:
            control.should_training_stop = True


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
    if getattr(args, "early_stop_reward_std_ratio", 0.0) > 0:
        callbacks.append(
            RewardStdCollapseCallback(state, args.early_stop_reward_std_ratio, args.early_stop_window)
        )
    if getattr(args, "early_stop_min_success", 0.0) > 0:
        callbacks.append(LowSuccessStopCallback(state, args.early_stop_min_success, args.early_stop_evals))
    if args.collapse_report:
        callbacks.append(CollapseReportCallback(os.path.join(args.output_dir, args.collapse_report)))
        from llm_gym.trainer.trackers import CollapsePlotCallback, image_trackers

        trackers = image_trackers(args.report_to)
        if trackers:  # the collapse plot as an image in TensorBoard / trackio (after the series is written)
            callbacks.append(
                CollapsePlotCallback(
                    os.path.join(args.output_dir, args.collapse_report),
                    trainer.callback_handler.callbacks,
                    trackers,
                )
            )
    return callbacks
