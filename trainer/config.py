"""The one configuration module of the trainer: every llm-gym field, grouped, with its help text.

``LLMGymGRPOConfig`` is TRL's ``GRPOConfig`` plus the groups below. As in TRL's ``GRPOConfig``, every field
carries its help text in ``metadata``, so ``llmgym-train --help``, the docs and the code never drift apart.

Groups (one dataclass each, mixed into ``LLMGymGRPOConfig``):

- :class:`ModelArguments`: the dtype the trained weights are held in (float32 master weights by default);
- :class:`EnvArguments`: which environment and its turn/action limits;
- :class:`PromptArguments`: the chat the policy sees;
- :class:`RolloutArguments`: generation per turn and RAGEN's seeding (group sampling: ``num_prompts`` (P,
  environment seeds per round) x ``num_generations`` (G, rollouts sharing a seed), so
  ``generation_batch_size = P * G``);
- :class:`EvalArguments`: in-training evaluation on fixed seeds;
- :class:`OutputArguments`: episode records and the collapse report;
- :class:`FilterArguments`: SNR-aware group filtering (RAGEN-2, Sec. 4);
- :class:`MIArguments`: mutual-information collapse metrics (RAGEN-2, Sec. 3);
- :class:`GradientAnalysisArguments`: the gradient split by reward variance (RAGEN-2, Sec. 3 and App. H), measured
  without changing training;
- :class:`PPOArguments`: the critic and GAE, read only by ``--algo ppo`` / ``--algo dapo``;
- :class:`LossArguments`: dual-clip and one aggregation for every loss term (RAGEN-2's veRL loss);
- :class:`EarlyStopArguments`: RAGEN's early stops (reward-variance collapse, low validation success);
- :class:`WarmStartArguments`: ``--warm_start``, supervised fine-tuning before RL in the same run;
- ``LoRAArguments``: TRL's ``ModelConfig`` LoRA flags (``--use_peft``, ``--lora_r``, ...), built from TRL's own
  fields by :func:`llm_gym.trainer.lora.lora_arguments` (type checkers see
  :class:`llm_gym.trainer.lora.LoRAFieldTypes`).

Importing this module loads TRL (and through it torch). The defaults that commands without torch share with
the config (``llmgym-eval``'s seeds, temperature and token budget, the records file name) and the choices of the
string fields live in :mod:`llm_gym.trainer.defaults`, which imports nothing.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from llm_gym.trainer import gradient_analysis, snr_filter
from llm_gym.trainer.defaults import (
    CRITIC_MODELS,
    EPISODES_FILE,
    EVAL_TEMPERATURE,
    FILTER_DROPS,
    FILTER_LOSS_SCALINGS,
    FILTER_UPDATE_STEPS,
    GRADIENT_ANALYSIS_BUCKET_MODES,
    GROUP_DYNAMICS,
    LOSS_AGG_MODES,
    MAX_NEW_TOKENS,
    MI_MARGINALS,
    MI_REASONING,
    MI_SCORERS,
    SFT_LEARNING_RATE,
    TRAIN_SEED,
    TURN_CACHE_BUDGET_MIB,
    WARM_START_SEED,
)
from llm_gym.trainer.lora import LoRAFieldTypes, lora_arguments
from llm_gym.trainer.options import (  # the groups the three commands share, re-exported here with the rest
    EnvArguments,
    EvalSeedArguments,
    ModelArguments,
    PromptArguments,
)
from llm_gym.trainer.options import nonnegative_int as _nonnegative_int
from llm_gym.trainer.options import positive_int as _positive_int
from trl import GRPOConfig, SFTConfig

from llm_gym.core.checks import is_int, is_number

logger = logging.getLogger(__name__)


def _finite(name: str, value: Any) -> float:
    if not is_number(value) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


# ------------------------------------------------------------------------------------------ rollouts and seeds
@dataclass
class RolloutArguments:
    """Generation per turn, group sampling and RAGEN's seeding of training rounds."""

    max_new_tokens: int = field(
        default=MAX_NEW_TOKENS, metadata={"help": "Tokens the model may generate per turn (RAGEN: 400)."}
    )
    num_prompts: int | None = field(
        default=None,
        metadata={
            "help": "P: environment seeds (groups) per generation round; generation_batch_size = P * "
            "num_generations. None leaves TRL's batch settings as they are."
        },
    )
    train_seed: int = field(
        default=TRAIN_SEED,
        metadata={
            "help": "Base training seed: group g of round s plays seed train_seed + s * P + g (RAGEN)."
        },
    )
    num_train_seeds: int | None = field(
        default=None,
        metadata={
            "help": "Rows of the seed dataset; None = enough for max_steps rounds (or 100000 without)."
        },
    )
    group_dynamics: str = field(
        default="independent",
        metadata={
            "help": "Transition randomness within a group: independent (each rollout resets with its own "
            "dynamics_seed, so FrozenLake slips and Bandit payouts differ while the start state is shared, as in "
            "RAGEN) or shared (every rollout of a group sees the same transitions).",
            "choices": list(GROUP_DYNAMICS),
        },
    )
    use_prefix_sharing: bool | None = field(
        default=None,
        metadata={
            "help": "Compute the prefix a group's rollouts share once instead of G times, in HF generation and in "
            "the loss pass (exact: the same log-probs and gradients as the unshared pass). None: on wherever it is "
            "exact (sdpa attention, Llama/Qwen2/Qwen3/Mistral/SmolLM3), otherwise off with a note; True: on, or an "
            "error naming what prevents it; False: off."
        },
    )
    use_turn_cache: bool | None = field(
        default=None,
        metadata={
            "help": "Keep each episode's KV cache from one turn to the next in HF generation, so that a later turn "
            "prefills only the tokens its episode added (exact: the same logits and sampled tokens as re-prefilling "
            "the history). None: on wherever it is exact (sdpa or eager attention, Llama/Qwen2/Qwen3/Mistral/SmolLM3 "
            "without sliding windows), otherwise off with a note; True: on, or an error naming what prevents it; "
            "False: off (every turn prefills the whole history again)."
        },
    )
    turn_cache_budget_mib: float = field(
        default=TURN_CACHE_BUDGET_MIB,
        metadata={
            "help": "Most memory (MiB) the KV cache carried between turns of one rollout round may hold; a turn "
            "whose cache is larger is not carried, and the next turn prefills its history again (logged)."
        },
    )


# ------------------------------------------------------------------------------------------ evaluation
@dataclass
class EvalArguments(EvalSeedArguments):
    """In-training evaluation on fixed seeds (``eval_seed .. eval_seed + num_eval_seeds - 1``)."""

    eval_temperature: float = field(
        default=EVAL_TEMPERATURE, metadata={"help": "Sampling temperature in evaluation (RAGEN-2: 0.5)."}
    )
    eval_before_after: bool = field(
        default=True, metadata={"help": "Evaluate before and after training (llmgym-train prints both)."}
    )


# ------------------------------------------------------------------------------------------ outputs
@dataclass
class OutputArguments:
    """Files written into ``output_dir`` besides TRL's checkpoints."""

    episode_records: str = field(
        default=EPISODES_FILE,
        metadata={"help": "JSONL file in output_dir for episode records (replay/viewer); '' = off."},
    )
    records_every: int = field(
        default=1, metadata={"help": "Write the records of every k-th generation round (eval rounds always)."}
    )
    collapse_report: str = field(
        default="collapse.jsonl",
        metadata={"help": "JSONL in output_dir with the MI, entropy and reward-variance series; '' = off."},
    )
    learning_curve: str = field(
        default="learning_curve.png",
        metadata={
            "help": "PNG in output_dir drawn at the end: training success per logged step, each evaluation with "
            "its confidence interval, and the random valid-action baseline's interval; '' = off."
        },
    )
    episode_gif: str = field(
        default="episode.gif",
        metadata={
            "help": "GIF in output_dir of the last evaluation's first episode, rendered at the end (needs the "
            "render extra; skipped with a note without it or without episode_records); '' = off."
        },
    )


# ------------------------------------------------------------------------------------------ SNR filter
@dataclass
class FilterArguments:
    """SNR-aware group filtering (RAGEN-2, Sec. 4): train on the groups whose rewards spread."""

    filter_strategy: str = field(
        default="top_p",
        metadata={
            "help": "Group filter on per-group reward spread: top_p (RAGEN-2 cumulative variance mass), top_k, "
            "min_p, softmax_top_p (RAGEN's older rule, its main table's), upstream_top_p (the rule RAGEN's authors "
            "proposed to TRL/veRL/SkyRL: linear top-p over the variance, filter_eps unsquared; loss masking there, "
            "filter_drop=mask) or off."
        },
    )
    filter_value: float = field(
        default=0.9,
        metadata={
            "help": "rho for top_p / softmax_top_p (share of the total score kept), fraction of groups for "
            "top_k, fraction of the best score for min_p."
        },
    )
    filter_include_zero: bool = field(
        default=False,
        metadata={
            "help": "Let zero-variance groups be kept (RAGEN-2 recommends False: they carry no task signal)."
        },
    )
    filter_eps: float = field(
        default=0.01,
        metadata={
            "help": "top_p threshold slack in reward units (RAGEN: 0.01 on its std score; squared for the variance "
            "score): keep the smallest prefix reaching rho*total - eps; rho*total <= eps rejects the batch. "
            "upstream_top_p takes it in variance units as given (the PRs' selection_eps)."
        },
    )
    filter_metric: str = field(
        default="variance",
        metadata={
            "help": "Group score: variance (the paper) or std (RAGEN's code); unbiased estimator either way."
        },
    )
    filter_variance_ddof: int = field(
        default=1,
        metadata={
            "help": "Delta degrees of freedom of the group reward variance / std the filter ranks by: 1 (unbiased, "
            "RAGEN's torch std and the upstream PRs' default) or 0 (population)."
        },
    )
    filter_loss_scaling: str = field(
        default="none",
        metadata={
            "help": "Multiply advantages by the kept-group ratio: none (RAGEN scripts), linear or sqrt."
        },
    )
    filter_drop: str = field(
        default="remove",
        metadata={
            "help": "remove: dropped groups leave the batch, so the update skips their forward/backward; "
            "mask: keep them with zero loss weight (full compute; needed for multimodal batches)."
        },
    )
    filter_update_steps: str = field(
        default="fixed",
        metadata={
            "help": "fixed: every round takes the same optimizer steps, the kept rows spread over them; "
            "proportional (RAGEN): kept rows are padded with random duplicates to whole update batches and only "
            "ceil(kept rows / update batch) optimizer steps change the weights, the round's other steps are "
            "empty (no gradient, weights and AdamW state untouched). Needs filter_drop=remove.",
            "choices": list(FILTER_UPDATE_STEPS),
        },
    )
    advantages_after_filter: bool = field(
        default=False,
        metadata={
            "help": "Compute the advantages (the compute_advantages hook: PPO's GAE and whitening) on the rows the "
            "filter kept, as RAGEN does, instead of on the whole round before filtering."
        },
    )
    filter_empty_stop_steps: int = field(
        default=5,
        metadata={
            "help": "Stop training after this many consecutive rounds with nothing kept (0 = never stop)."
        },
    )

    def _validate_filter(self) -> None:
        snr_filter.validate_filter(self.filter_strategy, self.filter_value, self.filter_eps)
        choices = {
            "filter_metric": snr_filter.METRICS,
            "filter_loss_scaling": FILTER_LOSS_SCALINGS,
            "filter_drop": FILTER_DROPS,
            "filter_update_steps": FILTER_UPDATE_STEPS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not _nonnegative_int(self.filter_variance_ddof):
            raise ValueError(
                f"filter_variance_ddof must be an integer >= 0, got {self.filter_variance_ddof!r}"
            )
        if self.filter_strategy == "upstream_top_p" and self.filter_metric != "variance":
            raise ValueError(
                "filter_strategy='upstream_top_p' ranks groups by the reward variance; set filter_metric='variance'"
            )
        if self.filter_update_steps == "proportional" and self.filter_drop != "remove":
            raise ValueError("filter_update_steps='proportional' needs filter_drop='remove'")
        if not _nonnegative_int(self.filter_empty_stop_steps):
            raise ValueError(
                f"filter_empty_stop_steps must be an integer >= 0, got {self.filter_empty_stop_steps!r}"
            )
        spg, group = getattr(self, "steps_per_generation", None), getattr(self, "num_generations", None)
        if (
            self.filter_strategy != "off"
            and self.filter_drop == "remove"
            and self.filter_update_steps == "fixed"
            and spg
            and group
            and group % spg
        ):
            logger.warning(
                "SNR filtering: steps_per_generation=%s does not divide num_generations=%s, so each process pads "
                "its kept rows with up to %s masked rows (they cost compute) for TRL's even split into micro-batches. "
                "Raise per_device_train_batch_size (and lower gradient_accumulation_steps to keep the update batch) "
                "until steps_per_generation = rollouts per process / per_device_train_batch_size divides "
                "num_generations.",
                spg,
                group,
                spg - 1,
            )


# ------------------------------------------------------------------------------------------ MI metrics
@dataclass
class MIArguments:
    """Mutual-information collapse metrics (RAGEN-2, Sec. 3): does the reasoning still depend on the input?"""

    mi_every: int = field(
        default=5,
        metadata={
            "help": "Compute MI collapse metrics every k generation rounds, and on the first; 0 = off."
        },
    )
    mi_num_samples: int = field(
        default=64, metadata={"help": "At most this many (prompt, reasoning) pairs per scope and process."}
    )
    mi_std_eps: float = field(default=1e-3, metadata={"help": "Epsilon in the MI z-score denominator."})
    mi_ema_decay: float = field(
        default=0.9, metadata={"help": "EMA decay of the marginal std (MI-ZScore-EMA)."}
    )
    mi_first_turn: bool = field(
        default=True, metadata={"help": "Log first-turn MI metrics (mi/first_turn/*)."}
    )
    mi_trajectory: bool = field(
        default=True,
        metadata={"help": "Log trajectory MI metrics (mi/trajectory/*): a random turn of each draw."},
    )
    mi_reasoning: str = field(
        default="think",
        metadata={
            "help": "Reasoning Z: think (tokens inside <think>...</think>) or turn (all model tokens of a turn)."
        },
    )
    mi_marginal: str = field(
        default="code",
        metadata={"help": "Per-token marginal: code (RAGEN code, logmeanexp of per-token scores) or paper."},
    )
    mi_batch_size: int = field(
        default=16, metadata={"help": "Sequences per no-grad forward when cross-scoring."}
    )
    mi_scorer: str = field(
        default="cached",
        metadata={
            "help": "cached: encode each prompt once and reuse its KV cache for every reasoning (much cheaper on "
            "long trajectories); trl: full sequences through TRL's log-prob function (any model TRL supports)."
        },
    )

    def _validate_mi(self) -> None:
        choices = {"mi_reasoning": MI_REASONING, "mi_marginal": MI_MARGINALS, "mi_scorer": MI_SCORERS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not _nonnegative_int(self.mi_every):
            raise ValueError(f"mi_every must be an integer >= 0, got {self.mi_every!r}")
        for name, low in (("mi_num_samples", 2), ("mi_batch_size", 1)):
            value = getattr(self, name)
            if not is_int(value, numpy=False) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not self.mi_std_eps > 0:
            raise ValueError(f"mi_std_eps must be > 0, got {self.mi_std_eps}")
        if not 0.0 <= self.mi_ema_decay < 1.0:
            raise ValueError(f"mi_ema_decay must be in [0, 1), got {self.mi_ema_decay}")


# ------------------------------------------------------------------------------------------ gradient analysis
@dataclass
class GradientAnalysisArguments:
    """The gradient split by reward variance (RAGEN-2, Sec. 3, Fig. 3 and App. H; RAGEN's gradient analysis):
    measured in a round, never applied (:mod:`llm_gym.trainer.gradient_analysis`)."""

    gradient_analysis_every: int = field(
        default=0,
        metadata={
            "help": "Every k training rounds (and on the first), bucket the round's groups by reward variance and "
            "back-propagate the task, entropy and KL terms of the loss separately, per bucket and for all groups "
            "(grad_analysis/<bucket>/<term>_norm), without changing training; 0 = off (RAGEN: 50). One process; "
            "costs one forward pass and one backward pass per term over the round."
        },
    )
    gradient_analysis_buckets: int = field(
        default=6,
        metadata={"help": "Buckets of the quantile mode: equal group counts by reward variance (RAGEN: 6)."},
    )
    gradient_analysis_bucket_mode: str = field(
        default="quantile",
        metadata={
            "help": "quantile: gradient_analysis_buckets buckets of equal group count, bucket_1 the lowest reward "
            "variance; fixed_rv: RAGEN's fixed edges on the group reward std, [0,1), [1,2), ..., [5,inf).",
            "choices": list(GRADIENT_ANALYSIS_BUCKET_MODES),
        },
    )

    def _validate_gradient_analysis(self) -> None:
        gradient_analysis.check_setup(self)


@dataclass
class SignalArguments(FilterArguments, MIArguments, GradientAnalysisArguments, OutputArguments):
    """The RAGEN-2 signal tools together (SNR filter, MI metrics, gradient analysis and their report), for code
    that uses only them."""

    def validate_signal_args(self) -> None:
        """Raise ``ValueError`` on an out-of-range or unknown filter / MI / gradient-analysis / report setting."""
        self._validate_filter()
        self._validate_mi()
        self._validate_gradient_analysis()
        if self.collapse_report and os.path.basename(self.collapse_report) != self.collapse_report:
            raise ValueError(
                f"collapse_report must be a file name inside output_dir, got {self.collapse_report!r}"
            )
        for name in ("learning_curve", "episode_gif"):
            value = getattr(self, name)
            if value and (not isinstance(value, str) or os.path.basename(value) != value):
                raise ValueError(f"{name} must be a file name inside output_dir or '', got {value!r}")
        if not _positive_int(self.records_every):
            raise ValueError(f"records_every must be a positive integer, got {self.records_every!r}")


# ------------------------------------------------------------------------------------------ PPO critic
@dataclass
class PPOArguments:
    """Critic (value head) and GAE settings; read only by ``--algo ppo`` / ``--algo dapo``.

    Defaults follow RAGEN-2's PPO protocol (RAGEN-2, App. B.2; RAGEN ``config/base.yaml``): GAE with
    gamma = lambda = 1, critic learning rate 1e-5, value clipping 0.2, advantages whitened over model tokens.
    """

    vf_coef: float = field(
        default=0.5,
        metadata={
            "help": "Weight of the clipped value loss added to the policy loss (PPO only). The value head shares the "
            "policy's backbone, so this also scales the value gradient that reaches the backbone."
        },
    )
    value_lr: float = field(
        default=1e-5,
        metadata={
            "help": "Learning rate of the value head's own optimizer parameter group (PPO only). RAGEN-2 uses 1e-5 "
            "for the critic and 1e-6 for the actor."
        },
    )
    value_clip: float | None = field(
        default=0.2,
        metadata={
            "help": "Clip range of the value update around the values seen at rollout time (PPO-style clipped "
            "value loss). 0 (or None) disables clipping."
        },
    )
    gae_gamma: float = field(
        default=1.0,
        metadata={
            "help": "GAE discount gamma over model tokens (PPO only). Environment tokens are transparent."
        },
    )
    gae_lambda: float = field(
        default=1.0,
        metadata={
            "help": "GAE lambda over model tokens (PPO only). 1.0 gives returns minus values (Monte Carlo)."
        },
    )
    whiten_advantages: bool = field(
        default=True,
        metadata={
            "help": "Whiten the token-level GAE advantages (zero mean, unit std over all model tokens of the "
            "batch) before the policy loss (PPO only)."
        },
    )
    value_head_init_std: float = field(
        default=1e-3,
        metadata={
            "help": "Std of the normal init of the value head's weight (its bias starts at 0), so initial values "
            "are close to 0 (PPO only)."
        },
    )
    value_detach_backbone: bool = field(
        default=False,
        metadata={
            "help": "Stop the value loss's gradient at the backbone's last hidden state, so only the value head "
            "learns from it and the policy weights see the policy loss alone (PPO only)."
        },
    )

    critic_model: str = field(
        default="head",
        metadata={
            "help": "head: a linear value head on the policy's backbone (one model); separate: a full critic model "
            "initialised from the policy's weights with its own value head, as RAGEN/veRL (PPO only).",
            "choices": list(CRITIC_MODELS),
        },
    )
    critic_weight_decay: float = field(
        default=0.0,
        metadata={"help": "AdamW weight decay of the critic's parameters (veRL's critic: 0.01) (PPO only)."},
    )

    def validate_ppo_args(self) -> None:
        """Raise ``ValueError`` with a clear message when a PPO setting is out of range."""
        if self.critic_model not in CRITIC_MODELS:
            raise ValueError(f"critic_model must be one of {CRITIC_MODELS}, got {self.critic_model!r}")
        if _finite("critic_weight_decay", self.critic_weight_decay) < 0:
            raise ValueError(f"critic_weight_decay must be >= 0, got {self.critic_weight_decay}")
        if _finite("vf_coef", self.vf_coef) < 0:
            raise ValueError(f"vf_coef must be >= 0, got {self.vf_coef}")
        if _finite("value_lr", self.value_lr) <= 0:
            raise ValueError(f"value_lr must be > 0, got {self.value_lr}")
        if self.value_clip is not None and _finite("value_clip", self.value_clip) < 0:
            raise ValueError(f"value_clip must be >= 0 (0 or None disables clipping), got {self.value_clip}")
        for name in ("gae_gamma", "gae_lambda"):
            if not 0.0 <= _finite(name, getattr(self, name)) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if _finite("value_head_init_std", self.value_head_init_std) < 0:
            raise ValueError(f"value_head_init_std must be >= 0, got {self.value_head_init_std}")
        for name in ("whiten_advantages", "value_detach_backbone"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")


# ------------------------------------------------------------------------------------------ loss
@dataclass
class LossArguments:
    """How the policy loss is built when it differs from TRL's: dual-clip, and one aggregation for every term.

    Both unset: TRL computes the loss as its ``loss_type`` says. Either set: llm-gym computes it
    (:mod:`llm_gym.trainer.losses`), with the entropy bonus and KL aggregated like the policy term (veRL).
    """

    loss_agg_mode: str | None = field(
        default=None,
        metadata={
            "help": "Aggregate policy, entropy and KL terms alike: token-mean, seq-mean-token-mean (per sequence: "
            "RAGEN's token-mean with micro-batches of one sequence), seq-mean-token-sum (RAGEN's Dr.GRPO) or "
            "seq-mean-token-sum-norm (TRL's dr_grpo). None: TRL's loss_type decides (its entropy is a token mean).",
            "choices": list(LOSS_AGG_MODES),
        },
    )
    dual_clip: float | None = field(
        default=None,
        metadata={
            "help": "Dual-clip PPO bound c > 1 for negative advantages (Ye et al. 2020; veRL clip_ratio_c, RAGEN: "
            "3.0). None: off."
        },
    )

    def validate_loss_args(self) -> None:
        """Raise ``ValueError`` for an unknown aggregation, a dual-clip bound <= 1, or a TRL option our loss lacks."""
        if self.loss_agg_mode is not None and self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"loss_agg_mode must be one of {LOSS_AGG_MODES} or None, got {self.loss_agg_mode!r}"
            )
        if self.dual_clip is not None and not _finite("dual_clip", self.dual_clip) > 1.0:
            raise ValueError(f"dual_clip must be > 1, got {self.dual_clip}")
        if self.loss_agg_mode is None and self.dual_clip is None:
            return
        loss_type = getattr(self, "loss_type", "dapo")
        if loss_type not in ("grpo", "dr_grpo", "dapo", "bnpo"):
            raise ValueError(
                f"loss_agg_mode / dual_clip work with loss_type grpo, dr_grpo, dapo or bnpo, not {loss_type!r}"
            )
        unsupported = {
            "top_entropy_quantile": getattr(self, "top_entropy_quantile", 1.0) < 1.0,
            "importance_sampling_level": getattr(self, "importance_sampling_level", "token") != "token",
            "delta": getattr(self, "delta", None) is not None,
            "off_policy_mask_threshold": getattr(self, "off_policy_mask_threshold", None) is not None,
            "use_adaptive_entropy": bool(getattr(self, "use_adaptive_entropy", False)),
        }
        bad = [k for k, v in unsupported.items() if v]
        if bad:
            raise ValueError(
                f"loss_agg_mode / dual_clip do not support TRL's {', '.join(bad)}; leave them at default"
            )


# ------------------------------------------------------------------------------------------ early stops
@dataclass
class EarlyStopArguments:
    """RAGEN's early stops (``ragen/trainer/agent_trainer.py``): off by default, on in the ``ragen2`` profile."""

    early_stop_reward_std_ratio: float = field(
        default=0.0,
        metadata={
            "help": "Stop when the mean in-group reward std of early_stop_window consecutive kept rounds stays below "
            "this fraction of its mean over the first early_stop_window kept rounds (RAGEN: 0.1); 0 = off."
        },
    )
    early_stop_window: int = field(
        default=10,
        metadata={"help": "Rounds of the reward-std baseline and of the collapse window (RAGEN: 10)."},
    )
    early_stop_min_success: float = field(
        default=0.0,
        metadata={
            "help": "Stop when the evaluation success stays below this for early_stop_evals evaluations in a row "
            "(RAGEN: 0.01); 0 = off."
        },
    )
    early_stop_evals: int = field(
        default=5, metadata={"help": "Consecutive low-success evaluations before stopping (RAGEN: 5)."}
    )

    def validate_early_stop_args(self) -> None:
        for name in ("early_stop_reward_std_ratio", "early_stop_min_success"):
            if not 0.0 <= _finite(name, getattr(self, name)) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("early_stop_window", "early_stop_evals"):
            if not _positive_int(getattr(self, name)):
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")


# ------------------------------------------------------------------------------------------ warm start (SFT)
def check_format_loss_weight(name: str, value: Any) -> None:
    """A format-token loss weight must be a finite number in (0, 1]: 0 would never teach the format."""
    if not (is_number(value) and math.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")


@dataclass
class SFTDataArguments(EvalSeedArguments):
    """What ``llmgym-sft`` trains on, and the evaluation seeds its data must not overlap (a data row with a seed in
    ``eval_seed .. eval_seed + num_eval_seeds - 1`` is refused: training on the test boards)."""

    data: str | None = field(
        default=None,
        metadata={
            "help": "llmgym export output: a JSONL file of chat rows, or a folder written with --format hf "
            "(datasets.save_to_disk). Loss on the assistant turns of each episode only."
        },
    )
    format_loss_weight: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the reply's format tokens (<think>, </think>, <answer>, </answer>, the action "
            "separator, the end of turn) in the loss against the answer's content: 1.0 weighs every reply token "
            "alike (TRL's loss); lower puts the gradient on the decision. On the model organism's FrozenLake 0.1 "
            "raised held-out success from 0.36 to 0.62 on the same rows (docs/training/organism.md)."
        },
    )

    def validate_sft_data(self) -> None:
        if not self.data:
            raise ValueError("--data is required: llmgym export output (a JSONL file or a datasets folder)")
        self.validate_eval_seeds()
        check_format_loss_weight("format_loss_weight", self.format_loss_weight)


@dataclass
class WarmStartArguments:
    """``llmgym-train --warm_start``: supervised fine-tuning on trajectories of a policy we have, then RL."""

    warm_start: str | None = field(
        default=None,
        metadata={
            "help": "Fine-tune on trajectories before RL, in the same run: random (the random valid-action policy: "
            "the answer format without a policy), expert (the solver; see warm_start_expert_fraction), or a path "
            "to llmgym export output; none: no warm start (over a profile's). Evaluations of the base model, the warm "
            "start and the RL model are reported on the same seeds. The data's seeds must not overlap the evaluation "
            "seeds."
        },
    )
    warm_start_expert_fraction: float | None = field(
        default=None,
        metadata={
            "help": "With --warm_start expert: share of the episodes the solver plays, the others by the random "
            "valid-action policy (default 1.0: all expert; 0.5: a partial expert)."
        },
    )
    warm_start_episodes: int = field(
        default=256, metadata={"help": "Episodes of warm-start data (seeds warm_start_seed ..)."}
    )
    warm_start_seed: int = field(
        default=WARM_START_SEED, metadata={"help": "First seed of the warm-start data episodes."}
    )
    warm_start_max_steps: int = field(
        default=60,
        metadata={
            "help": "Optimizer steps of the warm start (repeating the data as needed; SmolLM2 on 3x3 FrozenLake "
            "learned to read the board between steps 20 and 60 at lr 1e-4: docs/learning-study.md)."
        },
    )
    warm_start_learning_rate: float = field(
        default=SFT_LEARNING_RATE, metadata={"help": "Learning rate of the warm start."}
    )
    warm_start_batch_size: int = field(
        default=8, metadata={"help": "Episodes per optimizer step of the warm start."}
    )
    warm_start_micro_batch_size: int = field(
        default=4,
        metadata={
            "help": "Episodes per forward/backward pass of the warm start (divides warm_start_batch_size)."
        },
    )
    warm_start_format_loss_weight: float = field(
        default=1.0,
        metadata={"help": "The warm start's format_loss_weight (llmgym-sft's; 1.0 = TRL's loss)."},
    )
    warm_start_lr_scheduler_type: str = field(
        default="linear",
        metadata={
            "help": "The warm start's learning-rate schedule (TRL's lr_scheduler_type; default linear, TRL's). "
            "constant suits a model that learns after a plateau (the organism on FrozenLake)."
        },
    )

    def validate_warm_start_args(self) -> None:
        if isinstance(self.warm_start, str) and self.warm_start.strip().lower() == "none":
            self.warm_start = None  # --warm_start none: no warm start, over a profile that names one
        if self.warm_start is None:
            return
        if not isinstance(self.warm_start, str) or not self.warm_start.strip():
            raise ValueError("warm_start must be random, expert or a path to llmgym export output")
        fraction = self.warm_start_expert_fraction
        if fraction is not None:
            if self.warm_start != "expert":
                raise ValueError("warm_start_expert_fraction needs --warm_start expert")
            if not 0.0 <= _finite("warm_start_expert_fraction", fraction) <= 1.0:
                raise ValueError(f"warm_start_expert_fraction must be in [0, 1], got {fraction}")
        for name in ("warm_start_episodes", "warm_start_max_steps", "warm_start_batch_size"):
            if not _positive_int(getattr(self, name)):
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not _positive_int(self.warm_start_micro_batch_size) or (
            self.warm_start_batch_size % self.warm_start_micro_batch_size
        ):
            raise ValueError(
                f"warm_start_micro_batch_size ({self.warm_start_micro_batch_size!r}) must be a positive divisor of "
                f"warm_start_batch_size ({self.warm_start_batch_size})"
            )
        if not _nonnegative_int(self.warm_start_seed):
            raise ValueError(f"warm_start_seed must be a non-negative integer, got {self.warm_start_seed!r}")
        if not _finite("warm_start_learning_rate", self.warm_start_learning_rate) > 0:
            raise ValueError(f"warm_start_learning_rate must be > 0, got {self.warm_start_learning_rate}")
        check_format_loss_weight("warm_start_format_loss_weight", self.warm_start_format_loss_weight)
        from transformers.trainer_utils import SchedulerType

        schedules = [s.value for s in SchedulerType]
        if self.warm_start_lr_scheduler_type not in schedules:  # fail before the RL model loads, not after
            raise ValueError(
                f"warm_start_lr_scheduler_type must be one of {', '.join(schedules)}, "
                f"got {self.warm_start_lr_scheduler_type!r}"
            )

    @property
    def warm_start_fraction(self) -> float | None:
        """Share of expert episodes in the data the warm start builds (None: the data is a given path)."""
        if self.warm_start == "random":
            return 0.0
        if self.warm_start == "expert":
            return 1.0 if self.warm_start_expert_fraction is None else float(self.warm_start_expert_fraction)
        return None


# ------------------------------------------------------------------------------------------ the full config
if TYPE_CHECKING:
    LoRAArguments = LoRAFieldTypes
else:  # TRL's own ModelConfig fields (defaults, help), see trainer/lora.py
    LoRAArguments = lora_arguments()


@dataclass
class LLMGymGRPOConfig(
    GRPOConfig,
    ModelArguments,
    EnvArguments,
    PromptArguments,
    RolloutArguments,
    EvalArguments,
    SignalArguments,
    PPOArguments,
    LossArguments,
    EarlyStopArguments,
    WarmStartArguments,
    LoRAArguments,  # TRL's ModelConfig LoRA flags (--use_peft, --lora_r, ...)
):
    """TRL's ``GRPOConfig`` plus llm-gym's environment, prompt, rollout, evaluation, output, SNR filter,
    MI, PPO and LoRA settings (see the module docstring for the groups)."""

    # TRL fields whose default differs for multi-turn environment training.
    num_generations_eval: int | None = field(
        default=1,
        metadata={"help": "Rollouts per evaluation seed (1: each fixed seed is played once, as in RAGEN)."},
    )
    shuffle_dataset: bool | None = field(
        default=False,
        metadata={
            "help": "Shuffle the seed rows; False (default) keeps RAGEN's seeding train_seed + s * P + g."
        },
    )

    def __post_init__(self) -> None:
        self.validate_env_args()
        self.validate_model_args()
        if not _positive_int(self.max_new_tokens):
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if _finite("turn_cache_budget_mib", self.turn_cache_budget_mib) < 0:
            raise ValueError(f"turn_cache_budget_mib must be >= 0, got {self.turn_cache_budget_mib}")
        self.validate_eval_seeds()
        if _finite("eval_temperature", self.eval_temperature) < 0:
            raise ValueError(f"eval_temperature must be >= 0, got {self.eval_temperature}")
        # Sampling divides the logits by the temperature: 0 gives inf / NaN probabilities mid-training.
        if not _finite("temperature", self.temperature) > 0:
            raise ValueError(
                f"temperature must be > 0 (training samples the rollouts), got {self.temperature}; "
                "use a small value such as 0.1 for near-greedy sampling"
            )
        if _finite("learning_rate", self.learning_rate) < 0:
            raise ValueError(f"learning_rate must be >= 0, got {self.learning_rate}")
        if self.num_prompts is not None:
            if not _positive_int(self.num_prompts):
                raise ValueError(f"num_prompts must be a positive integer, got {self.num_prompts!r}")
            if self.steps_per_generation is not None:
                raise ValueError("set either num_prompts or steps_per_generation, not both")
            self.generation_batch_size = self.num_prompts * cast(int, self.num_generations)
        if (
            self.generation_batch_size is not None
            and self.generation_batch_size % self.per_device_train_batch_size
        ):
            raise ValueError(
                f"num_prompts x num_generations = {self.generation_batch_size} rollouts per round must be "
                f"divisible by per_device_train_batch_size ({self.per_device_train_batch_size}) x number of "
                "processes; change --num_prompts, --num_generations or --per_device_train_batch_size"
            )
        if self.mask_truncated_completions:
            raise ValueError(
                "mask_truncated_completions has no effect with llm-gym's multi-turn rollouts: every turn is "
                "closed with an end-of-turn token, so TRL never sees a truncated completion. Leave it False "
                "and watch env/budget_stop_rate (episodes cut by max_completion_length) instead"
            )
        if self.max_completion_length is not None and self.max_completion_length < 8:
            raise ValueError(f"max_completion_length must be >= 8, got {self.max_completion_length}")
        # Evaluation plays episodes and reports no loss (LLMGymGRPOTrainer.prediction_step), so the best
        # checkpoint or a plateau scheduler goes by evaluation success, not transformers' default "loss".
        if str(self.metric_for_best_model or "").removeprefix("eval_") == "loss":
            raise ValueError(
                "metric_for_best_model='loss': llm-gym evaluation plays episodes and reports no loss; use "
                "env/success (the default when load_best_model_at_end is set) or another eval_env/* metric"
            )
        scheduler = getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type)
        needs_metric = self.load_best_model_at_end or scheduler in ("reduce_lr_on_plateau", "greedy")
        if self.metric_for_best_model is None and needs_metric:
            self.metric_for_best_model = "env/success"  # transformers then sets greater_is_better=True
        from llm_gym.trainer.deprecations import use_current_checkpointing_names

        use_current_checkpointing_names(self)  # else transformers warns that TRL's default name is deprecated
        super().__post_init__()
        micro_batches = cast(int, self.steps_per_generation) * self.num_iterations  # set by GRPOConfig
        if micro_batches % self.gradient_accumulation_steps:
            # Otherwise an optimizer step spans two generation rounds: seeds repeat and the SNR skip
            # callback could drop a kept round's gradients when the next round is empty.
            raise ValueError(
                f"gradient_accumulation_steps ({self.gradient_accumulation_steps}) must divide the "
                f"micro-batches of one generation round: steps_per_generation ({self.steps_per_generation}) "
                f"x num_iterations ({self.num_iterations}) = {micro_batches}, where steps_per_generation = "
                "num_prompts x num_generations / (per_device_train_batch_size x processes). Lower "
                "--gradient_accumulation_steps or --per_device_train_batch_size, or raise --num_prompts"
            )
        self.validate_signal_args()
        self.validate_ppo_args()
        self.validate_loss_args()
        self.validate_early_stop_args()
        self.validate_warm_start_args()

    @property
    def num_prompts_per_round(self) -> int:
        """P: environment seeds per generation round."""
        group = cast(int, self.num_generations)
        return (self.generation_batch_size or group) // group


@dataclass
class LLMGymSFTConfig(SFTConfig, ModelArguments, SFTDataArguments, LoRAArguments):
    """TRL's ``SFTConfig`` plus llm-gym's data settings (with the evaluation seeds the data must not overlap), the
    weights' dtype and TRL's LoRA flags (``llmgym-sft``). The loss is on the assistant turns of each episode only
    (the mask comes from the same token-exact rendering as RL rollouts,
    :func:`llm_gym.trainer.sft.tokenize_conversation`)."""

    # TRL fields whose default differs for warm starts on exported episodes.
    learning_rate: float = field(
        default=SFT_LEARNING_RATE,
        metadata={"help": "AdamW learning rate (pilots on SmolLM2-135M: docs/learning-study.md)."},
    )
    logging_steps: float = field(default=5, metadata={"help": "Log every this many optimizer steps."})
    report_to: None | str | list[str] = field(
        default="none", metadata={"help": "Trackers to report to (none, tensorboard, trackio, ...)."}
    )
    save_strategy: str = field(
        default="no", metadata={"help": "Checkpoints during training (the final model is always saved)."}
    )
    max_length: int | None = field(
        default=None,
        metadata={
            "help": "Longest episode in tokens; longer rows are dropped and counted (never truncated: a cut "
            "episode would teach a partial game). None: the model's context (max_position_embeddings)."
        },
    )

    def __post_init__(self) -> None:
        self.validate_sft_data()
        self.validate_model_args()
        if self.max_length is not None and not _positive_int(self.max_length):
            raise ValueError(f"max_length must be a positive integer or None, got {self.max_length!r}")
        if self.packing:
            raise ValueError("packing is not supported: every row is one episode with its own loss mask")
        from llm_gym.trainer.deprecations import use_current_checkpointing_names

        use_current_checkpointing_names(self)  # else transformers warns that TRL's default name is deprecated
        super().__post_init__()


__all__ = [
    "EarlyStopArguments",
    "EnvArguments",
    "EvalArguments",
    "EvalSeedArguments",
    "FilterArguments",
    "GradientAnalysisArguments",
    "LLMGymGRPOConfig",
    "LLMGymSFTConfig",
    "LoRAArguments",
    "LossArguments",
    "MIArguments",
    "ModelArguments",
    "OutputArguments",
    "PPOArguments",
    "PromptArguments",
    "RolloutArguments",
    "SFTDataArguments",
    "SignalArguments",
    "WarmStartArguments",
]
