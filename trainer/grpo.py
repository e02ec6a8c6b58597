"""``LLMGymGRPOTrainer``: TRL's ``GRPOTrainer`` driven by multi-turn environment rollouts.

Thin by design: every override wraps ``super()``. The pieces it wires in live elsewhere: the rollouts
(``trainer.rollouts``), the SNR filter and MI metrics (``trainer.callbacks``), the config (``trainer.config``).
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from llm_gym.trainer.callbacks import after_scoring, make_signal_callbacks
from llm_gym.trainer.config import LLMGymGRPOConfig
from llm_gym.trainer.rollouts import EnvRolloutFunc, env_reward, seed_dataset
from transformers import TrainerCallback
from trl import GRPOTrainer

#: Per-episode metrics logged under ``env/`` (means over all processes' episodes of a generation round).
ENV_METRICS = ("success", "episode_reward", "turns", "valid_action_rate", "effective_action_rate")


def train_seeds(args: LLMGymGRPOConfig) -> list[int]:
    """Seed rows in RAGEN order: row ``s * P + g`` is group ``g`` of round ``s`` (``train_seed + s * P + g``).

    With ``shuffle_dataset=False`` TRL's sampler walks the rows in order, ``P`` unique rows per round.
    """
    num_prompts = args.num_prompts_per_round
    if args.num_train_seeds is not None:
        n = args.num_train_seeds
    elif args.max_steps and args.max_steps > 0:
        # A round holds spg * num_iterations micro-batches; the config ensures ga divides it.
        micro_batches = args.max_steps * args.gradient_accumulation_steps
        rounds = math.ceil(micro_batches / (args.steps_per_generation * args.num_iterations)) + 1
        n = num_prompts * rounds
    else:
        n = 100_000
    n = max(n, num_prompts)
    return [args.train_seed + i for i in range(n)]


def eval_seeds(args: LLMGymGRPOConfig) -> list[int]:
    return [args.eval_seed + i for i in range(args.num_eval_seeds)]


class EnvProgressCallback(TrainerCallback):
    """Show the latest reward and success rate on the training progress bar."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero:
            return
        for cb in self.trainer.callback_handler.callbacks:
            bar = getattr(cb, "training_bar", None)
            if bar is not None:
                post = {}
                if "reward" in logs:
                    post["reward"] = f"{logs['reward']:.3f}"
                if logs.get("env/success") is not None:
                    post["success"] = f"{logs['env/success']:.2f}"
                if post:
                    bar.set_postfix(post, refresh=False)


class LLMGymGRPOTrainer(GRPOTrainer):
    """GRPO on llm-gym environments with multi-turn rollouts and group sampling.

    Builds what the user did not pass: the seed datasets (training: RAGEN seeding; evaluation: fixed seeds),
    the environment reward function and the ``rollout_func``. After each generation round it logs ``env/*``
    metrics, writes episode records, stashes the per-sample extras as ``self._last_rollout`` and hands the
    scored batch to ``trainer.callbacks.after_scoring`` (SNR filter, MI metrics).
    """

    def __init__(
        self,
        model: Any,
        args: LLMGymGRPOConfig,
        processing_class: Any,
        *,
        reward_funcs: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        rollout_func: Any = None,
        callbacks: list | None = None,
        **kwargs: Any,
    ):
        if not isinstance(args, LLMGymGRPOConfig):
            raise TypeError("args must be an LLMGymGRPOConfig")
        if processing_class is None:
            raise ValueError("pass processing_class (the tokenizer); it is never fetched from a hub")
        if train_dataset is None:
            train_dataset = seed_dataset(train_seeds(args))
        if eval_dataset is None and args.num_eval_seeds > 0:
            eval_dataset = seed_dataset(eval_seeds(args))
        super().__init__(
            model=model,
            reward_funcs=reward_funcs if reward_funcs is not None else [env_reward],
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            rollout_func=rollout_func if rollout_func is not None else EnvRolloutFunc(args, processing_class),
            callbacks=callbacks,
            **kwargs,
        )
        self._last_rollout: dict[str, list] = {}
        self._last_records: list = []
        self._generation_rounds = 0
        self.add_callback(EnvProgressCallback(self))
        for cb in make_signal_callbacks(self):
            self.add_callback(cb)

    # ------------------------------------------------------------------------------------------ overrides
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        self._log_env_metrics(mode)
        self._save_records(mode)
        if mode == "train":
            self._generation_rounds += 1
            out = after_scoring(self, out)
        return out

    # ------------------------------------------------------------------------------------------- helpers
    def _gather_mean(self, values: list[float]) -> float:
        t = torch.tensor([float(v) for v in values], dtype=torch.float32, device=self.accelerator.device)
        g = self.accelerator.gather(t)
        return float(g.mean().item()) if g.numel() else float("nan")

    def _log_env_metrics(self, mode: str) -> None:
        roll = self._last_rollout
        if not roll:
            return
        for name in ENV_METRICS:
            self._metrics[mode][f"env/{name}"].append(self._gather_mean(roll[name]))
        budget = [float(r == "budget") for r in roll.get("stop_reason", [])]
        self._metrics[mode]["env/budget_stop_rate"].append(self._gather_mean(budget))

    def _save_records(self, mode: str) -> None:
        name = self.args.episode_records
        if not name or not self._last_records:
            return
        if mode == "train" and self._generation_rounds % self.args.records_every != 0:
            return
        from accelerate.utils import gather_object

        from llm_gym.agent.records import write_records

        records = self._last_records
        if self.accelerator.num_processes > 1:
            records = gather_object(records)
        if self.accelerator.is_main_process:
            path = name if os.path.isabs(name) else os.path.join(self.args.output_dir, name)
            write_records(path, records)
