"""Every ``TrainerCallback`` the llm-gym trainer registers (one module for callbacks).

- :class:`EnvProgressCallback`: latest reward and success rate on the progress bar;
- :class:`SkipUpdateCallback`: right before ``optimizer.step()``, makes an empty step a no-op (the trainer's
  ``skip_optimizer_step``);
- :class:`EmptyStopCallback`: stops training after ``filter_empty_stop_steps`` rounds in a row with nothing kept;
- :class:`CollapseReportCallback`: appends the MI / entropy / reward-variance / gradient-analysis series to a JSONL
  file;
- :class:`RewardStdCollapseCallback`, :class:`LowSuccessStopCallback`: RAGEN's early stops (off by default);
- :class:`CheckpointMarkerCallback`: ``llmgym-sft``'s checkpoints get the completion marker ``--resume`` looks for
  (``llmgym-train``'s trainers write it in their own ``_save_checkpoint``).

The collapse plot's callback (``CollapsePlotCallback``) lives with the trackers it draws for
(:mod:`llm_gym.trainer.trackers`). Callbacks get what they use as constructor arguments (the trainer's public
surface, the signal state read-only, the :class:`StopSignal` the stop callbacks share); none reads a private
attribute of the trainer.
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

#: Metric prefixes the collapse report keeps from each log line (``grad_analysis/``: on analysis rounds only).
REPORT_PREFIXES = ("mi/", "snr/", "grad_analysis/")
#: Keys (beyond :data:`REPORT_PREFIXES`) the collapse report keeps from each log line: the success and the step
#: time beside the MI and entropy series, so collapse and cost can be read against learning from one file.
REPORT_KEYS = (
    "entropy",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "kl",
    "env/success",
    "env/valid_action_rate",
    "step_time",
)


class StopSignal:
    """Why training stops early. The first stop callback that fires sets :attr:`reason` (and says it once);
    every stop callback then stops training. One object, shared by a trainer's stop callbacks and saved in its
    checkpoints (:class:`EmptyStopCallback`), so a resumed run that had stopped stops again."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            logger.warning(reason)
            print(f"[llm-gym] {reason}", flush=True)


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
    """Right before ``optimizer.step()``, a step that must not change the weights (the trainer's
    ``step_is_empty``: the SNR filter kept nothing this round, or an empty proportional step) becomes a no-op
    through the trainer's ``skip_optimizer_step``. (DeepSpeed steps inside its engine, so
    :func:`make_signal_callbacks` refuses the filter under DeepSpeed.)"""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer.step_is_empty:
            self.trainer.skip_optimizer_step(kwargs.get("optimizer") or self.trainer.optimizer)


class EmptyStopCallback(TrainerCallback):
    """Stops training after ``filter_empty_stop_steps`` consecutive rounds with nothing kept (read from the
    signal state); holds the shared :class:`StopSignal` in checkpoints."""

    def __init__(self, state: SignalState, stop: StopSignal) -> None:
        self.state, self.stop = state, stop

    def state_dict(self) -> dict[str, Any]:
        return {"stop_reason": self.stop.reason}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.stop.reason = data.get("stop_reason")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        empty = self.state.consecutive_empty
        limit = args.filter_empty_stop_steps
        if limit and empty >= limit:
            self.stop.stop(
                f"stopping at step {state.global_step}: {empty} consecutive rounds had no group "
                f"with reward variance above the {args.filter_strategy} threshold (filter_empty_stop_steps={limit}); "
                "the policy gets no task signal from these prompts"
            )
        if self.stop.reason is not None:
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
            if (k.startswith(REPORT_PREFIXES) or k in REPORT_KEYS)
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

    Reads the trainer's ``last_round`` (a :class:`~llm_gym.trainer.signals.RoundDecision`: its
    ``snr/group_std_before`` metric and ``skip``) after each step."""

    def __init__(self, trainer: Any, stop: StopSignal, ratio: float, window: int) -> None:
        from collections import deque

        self.trainer, self.stop = trainer, stop
        self.ratio, self.window = float(ratio), int(window)
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
        decision = self.trainer.last_round
        if decision is not None and decision.index + 1 != self.seen_round:  # a new round since the last look
            self.seen_round = decision.index + 1
            std = decision.metrics.get("snr/group_std_before")
            if std is not None and not decision.skip and math.isfinite(std):
                if self.base is None:
                    self.first.append(std)
                    if len(self.first) == self.window:
                        self.base = sum(self.first) / self.window
                else:
                    self.recent.append(std)
                    if len(self.recent) == self.window and all(
                        v < self.ratio * self.base for v in self.recent
                    ):
                        self.stop.stop(
                            f"stopping at step {state.global_step}: reward std collapsed (last {self.window} rounds "
                            f"below {self.ratio} x the baseline {self.base:.4g}; early_stop_reward_std_ratio)"
                        )
        if self.stop.reason is not None:
            control.should_training_stop = True


class LowSuccessStopCallback(TrainerCallback):
    """RAGEN's low-validation-success early stop (``ragen/trainer/agent_trainer.py``, ``low_validation_success``):
    stop when ``eval_env/success`` stays below ``early_stop_min_success`` for ``early_stop_evals`` evaluations in a
    row. Only evaluations inside ``train()`` count: RAGEN's validation before training is not checked
    (``agent_trainer.py:972-975``), so neither is the ``evaluate()`` llmgym-train runs before (or after) it."""

    def __init__(self, stop: StopSignal, min_success: float, evals: int) -> None:
        self.stop, self.min_success, self.evals = stop, float(min_success), int(evals)
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
        if self.low >= self.evals:
            self.stop.stop(
                f"stopping at step {state.global_step}: evaluation success below {self.min_success} for "
                f"{self.low} evaluations in a row (early_stop_min_success)"
            )
        if self.stop.reason is not None:
            control.should_training_stop = True


def make_signal_callbacks(args: Any, trainer: Any, *, deepspeed: bool = False) -> list[TrainerCallback]:
    """The SNR / MI callbacks: skip update, early stops, and the collapse-report writer (if ``collapse_report``).
    ``trainer``: its public ``signal_state``, ``last_round``, ``step_is_empty``, ``skip_optimizer_step``,
    ``optimizer`` and ``callback_handler``."""
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
    stop = StopSignal()
    callbacks: list[TrainerCallback] = [
        SkipUpdateCallback(trainer),
        EmptyStopCallback(trainer.signal_state, stop),
    ]
    if getattr(args, "early_stop_reward_std_ratio", 0.0) > 0:
        callbacks.append(
            RewardStdCollapseCallback(trainer, stop, args.early_stop_reward_std_ratio, args.early_stop_window)
        )
    if getattr(args, "early_stop_min_success", 0.0) > 0:
        callbacks.append(LowSuccessStopCallback(stop, args.early_stop_min_success, args.early_stop_evals))
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


class CheckpointMarkerCallback(TrainerCallback):
    """After each checkpoint of a plain TRL trainer (``llmgym-sft``'s ``SFTTrainer``): ``files`` (name -> text)
    written into it, then, once every process saved, the completion marker
    (:func:`~llm_gym.trainer.output.write_checkpoint_marker`) that makes it one ``--resume`` takes; only then the
    rotation (``save_total_limit``). Trainer rotates inside its save, before this runs, so its own rotation is
    turned off for the run: a kill during a save always leaves the previous complete checkpoint."""

    def __init__(self, files: dict[str, str] | None = None):
        self.files = dict(files or {})
        self.limit: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.limit, args.save_total_limit = args.save_total_limit, None

    def on_train_end(self, args, state, control, **kwargs):
        args.save_total_limit = self.limit

    def on_save(self, args, state, control, **kwargs):
        from accelerate import PartialState
        from llm_gym.trainer.output import write_checkpoint_marker
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

        from llm_gym.safe_io import atomic_write_text

        processes = PartialState()
        processes.wait_for_everyone()  # every process's files (its RNG state) are in place
        if args.should_save:
            folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            for name, text in self.files.items():
                atomic_write_text(os.path.join(folder, name), text)
            write_checkpoint_marker(folder, state.global_step, processes.num_processes)
            rotate_checkpoints(
                output_dir=args.output_dir,
                save_total_limit=self.limit,
                best_model_checkpoint=state.best_model_checkpoint,
                use_mtime=True,
            )
        processes.wait_for_everyone()
