"""``LLMGymGRPOConfig``: TRL's ``GRPOConfig`` plus the environment, rollout, signal (SNR/MI) and PPO fields.

Every field carries its help text in ``metadata`` (as TRL does), so ``llmgym-train --help``, the docs and the
code never drift apart. Group sampling: ``num_prompts`` (P, environment seeds per step) x ``num_generations``
(G, rollouts sharing a seed) trajectories per generation round, i.e. ``generation_batch_size = P * G``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from llm_gym.trainer.callbacks import SignalArguments
from llm_gym.trainer.ppo_args import PPOArguments
from trl import GRPOConfig

from llm_gym.agent.chat import DEFAULT_SYSTEM_PROMPT, ChatFormat
from llm_gym.registration import resolve_env_id

#: Short environment names accepted by ``--env`` (the preset files use the same names).
ENV_SHORT_NAMES: dict[str, str] = {
    "frozenlake": "llmgym/FrozenLake-v0",
    "sokoban": "llmgym/Sokoban-v0",
    "bandit": "llmgym/Bandit-v0",
    "countdown": "llmgym/Countdown-v0",
    "metamathqa": "llmgym/MetaMathQA-v0",
}


@dataclass
class EnvArguments:
    """Environment, rollout and evaluation settings (ours, beside TRL's fields)."""

    env: str = field(
        default="llmgym/FrozenLake-v0",
        metadata={
            "help": "Environment: a short name (FrozenLake, Sokoban, Bandit, Countdown, MetaMathQA) or an id."
        },
    )
    env_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "Extra gym.make kwargs as a dict or JSON string, e.g. '{\"size\": 6}'."},
    )
    max_turns: int | None = field(
        default=None,
        metadata={
            "help": "LLM turns per episode; None keeps the environment's default (RAGEN-2: 5 for grid games)."
        },
    )
    max_actions_per_turn: int | None = field(
        default=None,
        metadata={
            "help": "Actions kept from one response; None keeps the environment's default (RAGEN-2: 2)."
        },
    )
    max_actions: int | None = field(
        default=None,
        metadata={"help": "Actions executed per episode; None keeps the environment's default (10)."},
    )
    think: bool | None = field(
        default=None,
        metadata={
            "help": "Require <think>...</think> before <answer> (True), answer-only format (False), or the "
            "environment's default (None)."
        },
    )
    max_new_tokens: int = field(
        default=400, metadata={"help": "Tokens the model may generate per turn (RAGEN: 400)."}
    )
    reward_feedback: bool = field(
        default=False, metadata={"help": "Show the previous turn's reward each turn."}
    )
    system_prompt: str = field(
        default=DEFAULT_SYSTEM_PROMPT,
        metadata={"help": "Sentence opening the system message (instructions follow)."},
    )
    one_shot_example: bool = field(
        default=False,
        metadata={
            "help": "Show one demonstration turn (example state + well-formed answer) after the system message."
        },
    )
    chat_template: str | None = field(
        default=None, metadata={"help": "Path to a Jinja chat template that replaces the tokenizer's."}
    )
    num_prompts: int | None = field(
        default=None,
        metadata={
            "help": "P: environment seeds (groups) per generation round; generation_batch_size = P * "
            "num_generations. None leaves TRL's batch settings as they are."
        },
    )
    train_seed: int = field(
        default=10000,
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
    eval_seed: int = field(default=123, metadata={"help": "First validation seed (RAGEN: 123)."})
    num_eval_seeds: int = field(
        default=64,
        metadata={"help": "Fixed validation seeds eval_seed .. eval_seed + n - 1 (0 = no evaluation)."},
    )
    eval_temperature: float = field(
        default=0.5, metadata={"help": "Sampling temperature in evaluation (RAGEN)."}
    )
    eval_before_after: bool = field(
        default=True, metadata={"help": "Evaluate before and after training (llmgym-train prints both)."}
    )
    episode_records: str = field(
        default="episodes.jsonl",
        metadata={"help": "JSONL file in output_dir for episode records (replay/viewer); '' = off."},
    )
    records_every: int = field(
        default=1, metadata={"help": "Write the records of every k-th generation round (eval rounds always)."}
    )


@dataclass
class LLMGymGRPOConfig(GRPOConfig, EnvArguments, SignalArguments, PPOArguments):
    """TRL's ``GRPOConfig`` plus environment/rollout, SNR/MI signal and PPO critic settings."""

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
        self.env = resolve_env_id(self.env)
        if isinstance(self.env_kwargs, str):
            try:
                parsed = json.loads(self.env_kwargs) if self.env_kwargs.strip() else {}
            except json.JSONDecodeError as e:
                raise ValueError(f"env_kwargs must be a JSON object, got {self.env_kwargs!r}: {e}") from None
            self.env_kwargs = parsed
        if self.env_kwargs is None:
            self.env_kwargs = {}
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs must be a dict, got {type(self.env_kwargs).__name__}")
        for name in ("max_turns", "max_actions_per_turn", "max_actions", "max_new_tokens", "records_every"):
            value = getattr(self, name)
            if value is None and name not in ("max_new_tokens", "records_every"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_eval_seeds < 0:
            raise ValueError(f"num_eval_seeds must be >= 0, got {self.num_eval_seeds}")
        if self.eval_temperature < 0:
            raise ValueError(f"eval_temperature must be >= 0, got {self.eval_temperature}")
        if self.num_prompts is not None:
            if (
                isinstance(self.num_prompts, bool)
                or not isinstance(self.num_prompts, int)
                or self.num_prompts < 1
            ):
                raise ValueError(f"num_prompts must be a positive integer, got {self.num_prompts!r}")
            if self.steps_per_generation is not None:
                raise ValueError("set either num_prompts or steps_per_generation, not both")
            self.generation_batch_size = self.num_prompts * self.num_generations
        if (
            self.generation_batch_size is not None
            and self.generation_batch_size % self.per_device_train_batch_size
        ):
            raise ValueError(
                f"num_prompts x num_generations = {self.generation_batch_size} rollouts per round must be divisible "
                f"by per_device_train_batch_size ({self.per_device_train_batch_size}) x number of processes; "
                "change --num_prompts, --num_generations or --per_device_train_batch_size"
            )
        if self.mask_truncated_completions:
            raise ValueError(
                "mask_truncated_completions has no effect with llm-gym's multi-turn rollouts: every turn is closed "
                "with an end-of-turn token, so TRL never sees a truncated completion. Leave it False and watch "
                "env/budget_stop_rate (episodes cut by max_completion_length) instead"
            )
        if self.max_completion_length is not None and self.max_completion_length < 8:
            raise ValueError(f"max_completion_length must be >= 8, got {self.max_completion_length}")
        super().__post_init__()
        micro_batches = self.steps_per_generation * self.num_iterations
        if micro_batches % self.gradient_accumulation_steps:
            # Otherwise an optimizer step spans two generation rounds: seeds repeat and the SNR skip callback
            # could drop a kept round's gradients when the next round is empty.
            raise ValueError(
                f"gradient_accumulation_steps ({self.gradient_accumulation_steps}) must divide the micro-batches "
                f"of one generation round: steps_per_generation ({self.steps_per_generation}) x num_iterations "
                f"({self.num_iterations}) = {micro_batches}, where steps_per_generation = num_prompts x "
                "num_generations / (per_device_train_batch_size x processes). Lower --gradient_accumulation_steps "
                "or --per_device_train_batch_size, or raise --num_prompts"
            )
        self.validate_signal_args()
        self.validate_ppo_args()

    # ------------------------------------------------------------------------------------------- helpers
    def make_env_kwargs(self) -> dict[str, Any]:
        """gym.make kwargs: the turn/action limits plus ``env_kwargs`` (which win)."""
        kwargs: dict[str, Any] = {}
        for name in ("max_turns", "max_actions_per_turn", "max_actions", "think"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        kwargs.update(self.env_kwargs or {})
        return kwargs

    def chat_format(self) -> ChatFormat:
        """The chat format of training and in-training evaluation rollouts: always the full history, so the
        trained sequence is the one that was sampled (``llmgym-eval --history-window`` can shorten it)."""
        return ChatFormat(
            system_prompt=self.system_prompt,
            reward_feedback=self.reward_feedback,
            one_shot=self.one_shot_example,
        )

    @property
    def num_prompts_per_round(self) -> int:
        return (self.generation_batch_size or self.num_generations) // self.num_generations
