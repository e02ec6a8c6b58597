"""``LLMGymGRPOTrainer``: TRL's ``GRPOTrainer`` driven by multi-turn environment rollouts.

The trainer only wires; the pieces live elsewhere: the rollouts (:mod:`llm_gym.trainer.rollouts`), the reward
reduction and row operations (:mod:`llm_gym.trainer.batch`), the SNR filter and MI metrics
(:mod:`llm_gym.trainer.signals` over the pure :mod:`~llm_gym.trainer.snr_filter` and
:mod:`~llm_gym.trainer.mutual_info`), the callbacks (:mod:`llm_gym.trainer.callbacks`) and the config
(:mod:`llm_gym.trainer.config`).

One training round reads top to bottom in :meth:`LLMGymGRPOTrainer._generate_and_score_completions`: TRL's
rollouts and scores, the episode metrics and records, one episode reward per row, the advantages (the
:meth:`~LLMGymGRPOTrainer.compute_advantages` hook), the signal tools' :class:`~llm_gym.trainer.signals.RoundDecision`
(MI metrics, the SNR filter), and the decision applied and logged. A skipped round's optimizer steps are made
no-ops by :meth:`~LLMGymGRPOTrainer.skip_optimizer_step`, which ``SkipUpdateCallback`` calls right before
``optimizer.step()``. Every private TRL member used goes through :mod:`llm_gym.trainer.compat`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from collections.abc import Iterable
from typing import Any, cast

import torch
from llm_gym.trainer import compat, prefix_sharing, turn_cache
from llm_gym.trainer.batch import (
    constant_group_rows,
    episode_rewards,
    loss_mask,
    split_micro_batches,
    take_rows,
)
from llm_gym.trainer.callbacks import EnvProgressCallback, make_signal_callbacks
from llm_gym.trainer.config import LLMGymGRPOConfig
from llm_gym.trainer.output import (
    SIGNAL_STATE_FILE,
    read_resume_state,
    write_checkpoint_marker,
    write_run_file,
)
from llm_gym.trainer.precision import align_trainer_model
from llm_gym.trainer.rollouts import EnvRolloutFunc, RolloutInfo, env_reward, seed_dataset
from llm_gym.trainer.signals import RoundDecision, SignalState, decide_round
from torch import nn
from trl import GRPOTrainer

#: Batch key that carries each row's episode reward through the SNR filter (``advantages_after_filter``).
ROW_REWARD = "llmgym_episode_reward"

#: Per-episode metrics logged under ``env/`` (means over all processes' episodes of a generation round).
ENV_METRICS = ("success", "episode_reward", "turns", "valid_action_rate", "effective_action_rate")
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
        spg = cast(int, args.steps_per_generation)  # set by GRPOConfig.__post_init__
        rounds = math.ceil(micro_batches / (spg * args.num_iterations)) + 1
        n = num_prompts * rounds
    else:
        n = 100_000
    n = max(n, num_prompts)
    return [args.train_seed + i for i in range(n)]


def eval_seeds(args: LLMGymGRPOConfig) -> list[int]:
    return [args.eval_seed + i for i in range(args.num_eval_seeds)]


class LLMGymGRPOTrainer(GRPOTrainer):
    """GRPO on llm-gym environments with multi-turn rollouts and group sampling.

    Builds what the user did not pass: the seed datasets (training: RAGEN seeding; evaluation: fixed seeds),
    the environment reward function and the ``rollout_func``.

    Public surface (what callbacks, the signal glue and subclasses use; nothing else reads its internals):

    - :attr:`last_rollout`: the latest round's :class:`~llm_gym.trainer.rollouts.RolloutInfo` (or None);
    - :attr:`last_round`: the latest training round's :class:`~llm_gym.trainer.signals.RoundDecision` (its
      ``batch`` left out), or None;
    - :attr:`signal_state`: the signal tools' state across rounds (:class:`~llm_gym.trainer.signals.SignalState`;
      read-only outside :mod:`~llm_gym.trainer.signals`);
    - :attr:`step_is_empty`, :meth:`skip_optimizer_step`, :attr:`skipped_steps`: the skipped updates;
    - :meth:`log_metric` / :meth:`drop_last_metrics`: TRL's per-round metrics, logged at the next ``on_log``;
    - :meth:`sequence_logps`: per-token log-probs of full sequences under the current policy.

    Hook for algorithms (override in a subclass; :class:`llm_gym.trainer.ppo.LLMGymPPOTrainer` does):

    - :meth:`compute_advantages`: replace the advantages of a scored training batch.
    """

    args: LLMGymGRPOConfig
    model: nn.Module

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
        if kwargs.get("peft_config") is None and args.use_peft:
            from llm_gym.trainer.lora import peft_config

            kwargs["peft_config"] = peft_config(args)  # TRL's ModelConfig flags -> LoraConfig
        from llm_gym.trainer.deprecations import old_checkpointing_names

        with old_checkpointing_names():  # with LoRA, TRL/PEFT read checkpointing under its deprecated name
            super().__init__(
                model=model,
                reward_funcs=reward_funcs if reward_funcs is not None else [env_reward],
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=processing_class,
                rollout_func=rollout_func
                if rollout_func is not None
                else EnvRolloutFunc(args, processing_class),
                callbacks=callbacks,
                **kwargs,
            )
        # float32 master weights also for a model handed over in 16 bits, not loaded by llmgym-train (precision.py)
        align_trainer_model(self.model, args, self.accelerator)
        self._round_rewards_per_func: torch.Tensor | None = None
        self._generation_rounds = 0
        self._empty_step = False
        #: The signal tools' state across rounds (MI cadence and EMAs, samplers, empty rounds in a row).
        self.signal_state = SignalState.for_process(args.seed, self.accelerator.process_index)
        #: The latest training round's decision (its batch left out), or None before the first.
        self.last_round: RoundDecision | None = None
        #: Optimizer steps made no-ops so far (rounds the filter kept nothing in, empty proportional steps).
        self.skipped_steps = 0
        #: Shared-prefix forwards (:mod:`llm_gym.trainer.prefix_sharing`), or None when off.
        self.prefix_sharing = prefix_sharing.from_setting(
            args.use_prefix_sharing, self.model, lockstep=self.accelerator.num_processes > 1
        )
        #: The KV cache carried across turns in HF generation (:mod:`llm_gym.trainer.turn_cache`), or None when off.
        # (vLLM generation reuses an episode's history through its own prefix caching)
        self.turn_cache = (
            None
            if args.use_vllm
            else turn_cache.from_setting(args.use_turn_cache, self.model, args.turn_cache_budget_mib)
        )
        self.add_callback(EnvProgressCallback(self.callback_handler))
        deepspeed = bool(getattr(self, "is_deepspeed_enabled", False))
        for cb in make_signal_callbacks(args, self, deepspeed=deepspeed):
            self.add_callback(cb)

    # ------------------------------------------------------------------------------------------ public surface
    @property
    def last_rollout(self) -> RolloutInfo | None:
        """Per-sample extras of the latest generation round on this process (None with a ``rollout_func``
        that keeps none)."""
        return getattr(self.rollout_func, "last", None)

    def log_metric(self, name: str, value: float, mode: str | None = None) -> None:
        """Append ``value`` to metric ``name``; TRL logs the mean at the next log step. ``mode`` defaults to
        ``"train"`` while the model trains, else ``"eval"``."""
        mode = mode or ("train" if self.model.training else "eval")
        compat.metrics(self, mode)[name].append(float(value))

    def drop_last_metrics(self, names: Iterable[str], count: int, mode: str = "train") -> None:
        """Forget the last ``count`` values of each metric in ``names`` (e.g. loss metrics of a skipped update)."""
        for name in names:
            values = compat.metrics(self, mode).get(name)
            if values:
                del values[-count:]

    def completion_positions(
        self, captured: list[torch.Tensor], prompt_width: int, width: int
    ) -> torch.Tensor:
        """(B, width) values at the states before each completion token, from per-position tensors a forward hook
        captured during the latest log-prob call (one per forward): hidden position ``prompt_width - 1 + t`` for
        token ``t``, or, after a shared-prefix call, the packed position of the row's token before it."""
        sharing = self.prefix_sharing
        if sharing is not None and sharing.last is not None:
            return sharing.unpack(captured)
        if not captured:
            raise RuntimeError(
                "the forward hook captured nothing: the backbone forward did not run through it"
            )
        return torch.cat(captured, dim=0)[:, prompt_width - 1 : prompt_width - 1 + width]

    def sequence_logps(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int
    ) -> torch.Tensor:
        """(B, logits_to_keep) log-probs of the last ``logits_to_keep`` tokens of each row, in one forward."""
        logps, _, _ = compat.per_token_logps_and_entropies(
            self, self.model, input_ids, attention_mask, logits_to_keep, batch_size=input_ids.shape[0]
        )
        return logps

    @property
    def step_is_empty(self) -> bool:
        """Whether the optimizer step being accumulated must leave the weights alone: the SNR filter kept nothing
        this round, or (``filter_update_steps="proportional"``) this step of the round has no rows."""
        return (self.last_round is not None and self.last_round.skip) or self._empty_step

    def skip_optimizer_step(self, optimizer: Any) -> None:
        """Make the coming ``optimizer.step()`` a no-op (``SkipUpdateCallback`` calls this right before it when
        :attr:`step_is_empty`).

        Every gradient goes to None: zero advantages are not enough, since AdamW momentum and weight decay would
        still move the weights, while AdamW skips a parameter without a gradient, so the weights and the optimizer
        state stay bitwise equal. The step's loss metrics came from masked dummy rows only (entropy would read 0)
        and are dropped."""
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
        self.skipped_steps += 1
        steps = (
            getattr(self, "current_gradient_accumulation_steps", 0) or self.args.gradient_accumulation_steps
        )
        self.drop_last_metrics(LOSS_METRICS, int(steps))

    # ------------------------------------------------------------------------------------------ hooks
    def compute_advantages(self, batch: dict, rewards: torch.Tensor) -> dict:
        """Hook: called once per training round after TRL scored ``batch`` and before the SNR filter.

        Args:
            batch: TRL's scored batch for this process (``advantages`` holds TRL's group advantages).
            rewards: (B,) episode reward of each row of ``batch`` (NaN for an unscorable sample).

        Returns the batch the loss will see. The default keeps TRL's advantages. An override may replace
        ``advantages`` (shape (B,) or token-level (B, T)) and add per-row tensors (first dimension B): the SNR
        filter keeps or drops them with their rows.
        """
        return batch

    # ------------------------------------------------------------------------------------------ TRL overrides
    @compat.overrides
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._round_rewards_per_func = rewards_per_func  # gathered over processes, in rank order
        return rewards_per_func

    @compat.overrides
    def _generate_and_score_completions(self, inputs):
        """One generation round, top to bottom. Evaluation rounds stop after step 2."""
        # ---------------------------------------------------------------------------------- 1. ROLLOUTS, SCORES
        # TRL plays the episodes through our rollout_func (multi-turn, token-exact), scores them with the reward
        # functions (our _calculate_rewards keeps the per-function rewards) and computes its group advantages
        from llm_gym.trainer.deprecations import old_checkpointing_names

        with old_checkpointing_names():  # TRL toggles checkpointing through transformers' deprecated names
            out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"

        # ---------------------------------------------------------------------------------- 2. EPISODES
        self._log_env_metrics(mode)  # env/success, env/episode_reward, ... over every process's episodes
        self._save_records(mode)  # episodes.jsonl (every records_every-th training round, every evaluation)
        if mode != "train":
            return out
        self._generation_rounds += 1

        # ---------------------------------------------------------------------------------- 3. EPISODE REWARDS
        # one reward per row (NaN: unscorable): every process's rows for the filter, this process's for the hook
        per_func = self._round_rewards_per_func
        assert per_func is not None  # kept by _calculate_rewards in step 1
        rewards = episode_rewards(per_func, self.reward_weights)
        n = out["prompt_ids"].size(0)
        start = self.accelerator.process_index * n
        local = rewards[start : start + n].to(self.accelerator.device)
        gathered = rewards.detach().cpu().double().numpy()

        # ---------------------------------------------------------------------------------- 4. ADVANTAGES
        advantages = out.get("advantages")
        if advantages is not None and advantages.dim() == 1:
            # a group of equal rewards has no signal: exactly zero advantage, not TRL's float32 rounding noise
            group = cast(int, self.num_generations)  # GRPOConfig's default, 8, unless set
            constant = constant_group_rows(rewards, group)[start : start + n]
            out["advantages"] = advantages.masked_fill(constant.to(advantages.device), 0.0)
        after_filter = self.args.advantages_after_filter
        if after_filter:
            # RAGEN computes (and whitens) advantages on the rows the filter kept, copies included: the reward
            # rides along with its row through the filter
            out[ROW_REWARD] = local
        else:
            out = self.compute_advantages(out, local)

        # ---------------------------------------------------------------------------------- 5. SIGNAL DECIDES
        # MI metrics on the unfiltered round (every mi_every rounds), then the SNR filter on the gathered rewards
        decision = decide_round(self, out, gathered, self.signal_state)

        # ---------------------------------------------------------------------------------- 6. APPLY, LOG
        # the kept rows (padded to whole micro-batches), or every row with the dropped ones masked
        out = decision.batch
        if after_filter:
            out = self.compute_advantages(out, out.pop(ROW_REWARD))
        if decision.loss_scale != 1.0:
            # filter_loss_scaling multiplies the final advantages, whichever hook computed them (RAGEN)
            out["advantages"] = out["advantages"] * decision.loss_scale
        # skip / update_micro_batches are read as each optimizer step comes (step_is_empty, _prepare_inputs)
        self.last_round = dataclasses.replace(decision, batch={})
        for name, value in decision.metrics.items():
            self.log_metric(name, value, "train")
        return out

    @compat.overrides
    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        """TRL's per-token log-probs (loss, old and reference log-probs, PPO's rollout values), through shared-prefix
        forwards when prefix sharing is on (MoE auxiliary losses and multimodal inputs take TRL's pass)."""
        sharing = self.prefix_sharing
        if sharing is not None:
            sharing.last = None
            if not compute_aux_loss and all(v is None for v in multimodal.values()):
                res = prefix_sharing.per_token_logps(
                    sharing,
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size=batch_size,
                    compute_entropy=compute_entropy,
                    autocast=self.accelerator.autocast,
                )
                if res is not None:
                    return res[0], res[1], None
        return super()._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=batch_size,
            compute_entropy=compute_entropy,
            compute_aux_loss=compute_aux_loss,
            **multimodal,
        )

    @compat.overrides
    def _prepare_inputs(self, generation_batch):
        """TRL's buffering of one generation round into micro-batches, except:

        - with ``filter_update_steps="proportional"``: the kept rows fill the first micro-batches in their order
          (kept groups, then the copies; RAGEN's actor splits its batch unshuffled,
          ``ragen/workers/actor/dp_actor.py``) and the round's remaining ones are empty, flagged so that their
          optimizer steps take no update;
        - with prefix sharing and several micro-batches per round: the groups are shuffled instead of the rows, so a
          micro-batch holds whole groups (or consecutive rows of one) and encodes their prompt once
          (:func:`llm_gym.trainer.prefix_sharing.group_order`)."""
        args = self.args
        spg = cast(int, args.steps_per_generation)  # set by GRPOConfig.__post_init__
        proportional = args.filter_update_steps == "proportional" and args.filter_strategy != "off"
        by_group = self.prefix_sharing is not None and spg > 1
        if not self.model.training or not (proportional or by_group):
            return super()._prepare_inputs(generation_batch)
        step = compat.micro_step(self)
        if step % (spg * self.num_iterations) == 0 or compat.buffered_inputs(self) is None:
            batch = self._generate_and_score_completions(generation_batch)
            if proportional:
                chunks, _ = split_micro_batches(batch, args.per_device_train_batch_size, spg)
            else:
                order = prefix_sharing.group_order(batch["prompt_ids"], batch["prompt_mask"])
                chunks, _ = split_micro_batches(take_rows(batch, order), len(order) // spg, spg)
            compat.set_buffered_inputs(self, chunks)
        index = step % spg
        real = self.last_round.update_micro_batches if self.last_round is not None else None
        self._empty_step = real is not None and index >= real
        batches = compat.buffered_inputs(self)
        assert batches is not None  # filled above
        return batches[index]

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Evaluation plays the episodes (``_prepare_inputs`` rolls out, scores and logs them) and stops there.
        TRL would also compute the policy loss of the evaluation batch: a number with no meaning in RL (the
        advantages of one sampled batch) that costs one more forward pass over every whole trajectory. No
        ``eval_loss`` is reported."""
        with torch.no_grad():
            self._prepare_inputs(inputs)
        return None, None, None

    @compat.overrides
    def _compute_loss(self, model, inputs):
        """TRL's loss, or with ``loss_agg_mode`` / ``dual_clip`` set, :func:`llm_gym.trainer.losses.policy_loss`:
        the clipped (dual-clipped) surrogate with the entropy bonus and KL aggregated like the policy term."""
        args = self.args
        if args.loss_agg_mode is None and args.dual_clip is None:
            return super()._compute_loss(model, inputs)
        from llm_gym.trainer.losses import TRL_LOSS_TYPE_AGG, policy_loss

        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, entropies, _ = compat.per_token_logps_and_entropies(
            self, model, ids, attn, inputs["completion_ids"].size(1), compute_entropy=True
        )
        mask = loss_mask(inputs)
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        kl = None
        if self.beta != 0.0:
            ref = inputs["ref_per_token_logps"]
            kl = torch.exp(ref - logps) - (ref - logps) - 1
        weights = None
        if self.use_vllm and args.vllm_importance_sampling_correction:
            weights = inputs["importance_sampling_ratio"]
        mode = "train" if self.model.training else "eval"
        ga = self.current_gradient_accumulation_steps if mode == "train" else 1
        agg = args.loss_agg_mode or TRL_LOSS_TYPE_AGG.get(self.loss_type, "token-mean")
        res = policy_loss(
            logps,
            old,
            inputs["advantages"],
            mask,
            clip_low=self.epsilon_low,
            clip_high=self.epsilon_high,
            agg=agg,
            dual_clip=args.dual_clip,
            entropies=entropies,
            entropy_coef=self.entropy_coef,
            kl=kl,
            beta=self.beta,
            norm_length=self.max_completion_length,
            weights=weights,
        )
        if args.loss_agg_mode is None and self.loss_type == "dapo":
            # TRL's token mean over the whole update batch: token sum / the tokens of one optimizer step
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                normalizer = normalizer * ga / args.steps_per_generation
            loss = res.total * mask.sum().clamp(min=1.0) / normalizer
        else:
            loss = res.total / ga
        gather = self.accelerator.gather
        m = compat.metrics(self, mode)
        m["policy_loss"].append(gather(res.policy.detach()).nanmean().item())
        tokens = self.accelerator.reduce(
            torch.stack([(entropies.detach() * mask).sum(), mask.sum().float()]), reduction="sum"
        )
        m["entropy"].append((tokens[0] / tokens[1].clamp(min=1.0)).item())
        m["clip_ratio/region_mean"].append(gather(res.clip_frac).mean().item())
        if args.dual_clip is not None:
            m["clip_ratio/dual_mean"].append(gather(res.dual_clip_frac).mean().item())
        if res.kl is not None:  # policy_loss returns the KL term when given one
            m["kl"].append(gather(res.kl.detach()).mean().item())
        return loss

    @compat.overrides
    def _save_checkpoint(self, model, trial):
        """Trainer's checkpoint, plus each process's signal state; then, once every process saved its files,
        the completion marker; only then the rotation (``save_total_limit``) deletes older checkpoints, so a
        kill during the save always leaves the previous complete checkpoint in place."""
        args = self.args
        limit = args.save_total_limit
        args.save_total_limit = None  # Trainer rotates inside its save, before our marker: we do it after
        try:
            super()._save_checkpoint(model, trial)
        finally:
            args.save_total_limit = limit
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

        from llm_gym.safe_io import atomic_write_text

        run_dir = compat.run_output_dir(self, trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        rank = self.accelerator.process_index
        os.makedirs(folder, exist_ok=True)
        atomic_write_text(
            os.path.join(folder, SIGNAL_STATE_FILE.format(rank=rank)), json.dumps(self._resume_state()) + "\n"
        )
        self.accelerator.wait_for_everyone()
        if args.should_save:
            write_run_file(folder, args)
            write_checkpoint_marker(folder, self.state.global_step, self.accelerator.num_processes)
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )
        self.accelerator.wait_for_everyone()

    def _resume_state(self) -> dict[str, Any]:
        """What a resumed run needs besides Trainer's own state: the signal state, the generation-round count
        (``records_every``), the skipped-step count and the callbacks' state (early-stop baselines, a stop
        reason)."""
        callbacks = {
            type(cb).__name__: cb.state_dict()
            for cb in self.callback_handler.callbacks
            if cb.__module__ == "llm_gym.trainer.callbacks" and hasattr(cb, "state_dict")
        }
        return {
            "signal_state": self.signal_state.state_dict(),
            "generation_rounds": self._generation_rounds,
            "skipped_steps": self.skipped_steps,
            "callbacks": callbacks,
        }

    @compat.overrides
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model=model)
        rank = self.accelerator.process_index
        data, borrowed = read_resume_state(resume_from_checkpoint, rank)
        if data is None:  # a checkpoint of an older llm-gym: the signal state starts afresh
            path = os.path.join(resume_from_checkpoint, SIGNAL_STATE_FILE.format(rank=rank))
            warnings.warn(f"{path} is missing: MI cadence, EMAs and early-stop state restart", stacklevel=2)
            return
        if borrowed:  # saved by fewer processes: rank 0's shared counters, this process's own sampling afresh
            warnings.warn(
                f"{resume_from_checkpoint} was saved by fewer processes: process {rank} takes rank 0's round count "
                "and early-stop state; its MI sampling and averages start afresh",
                stacklevel=2,
            )
        self.signal_state.load_state_dict(data.get("signal_state", {}))
        self._generation_rounds = int(data.get("generation_rounds", 0))
        # older checkpoints kept the count in the signal state
        self.skipped_steps = int(
            data.get("skipped_steps", data.get("signal_state", {}).get("skipped_steps", 0))
        )
        saved = data.get("callbacks", {})
        for cb in self.callback_handler.callbacks:
            if type(cb).__name__ in saved and hasattr(cb, "load_state_dict"):
                cb.load_state_dict(saved[type(cb).__name__])

    # ------------------------------------------------------------------------------------------ helpers
    def _gather_mean(self, values: list[float]) -> float:
        t = torch.tensor([float(v) for v in values], dtype=torch.float32, device=self.accelerator.device)
        g = self.accelerator.gather(t)
        return float(g.mean().item()) if g.numel() else float("nan")

    def _log_env_metrics(self, mode: str) -> None:
        roll = self.last_rollout
        if roll is None:
            return
        for name in ENV_METRICS:
            self.log_metric(f"env/{name}", self._gather_mean(getattr(roll, name)), mode)
        budget = [float(r == "budget") for r in roll.stop_reason]
        self.log_metric("env/budget_stop_rate", self._gather_mean(budget), mode)

    def _save_records(self, mode: str) -> None:
        name = self.args.episode_records
        roll = self.last_rollout
        if not name or roll is None or not roll.records:
            return
        if mode == "train" and self._generation_rounds % self.args.records_every != 0:
            return
        from accelerate.utils import gather_object

        from llm_gym.agent.records import write_records

        records = roll.records
        if self.accelerator.num_processes > 1:
            records = gather_object(records)
        if self.accelerator.is_main_process:
            path = name if os.path.isabs(name) else os.path.join(str(self.args.output_dir), name)
            write_records(path, records)
