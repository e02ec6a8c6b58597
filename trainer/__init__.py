"""llm-gym trainer: multi-turn RL for LLM agents on llm-gym environments, built on TRL's ``GRPOTrainer``.

Heavy imports (torch, transformers, trl) happen lazily, so ``import llm_gym.trainer`` is cheap.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "LLMGymGRPOConfig": "llm_gym.trainer.config",
    "LLMGymGRPOTrainer": "llm_gym.trainer.grpo",
    "LLMGymPPOTrainer": "llm_gym.trainer.ppo",
    "EnvRolloutFunc": "llm_gym.trainer.rollouts",
    "resolve_model": "llm_gym.trainer.models",
    "load_model_and_tokenizer": "llm_gym.trainer.models",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
