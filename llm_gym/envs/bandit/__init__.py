"""Bandit: a one-turn two-armed bandit whose arms are named after a risky and a safe option."""

from llm_gym.envs.bandit.env import BanditEnv

__all__ = ["BanditEnv"]
