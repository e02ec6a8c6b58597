"""FrozenLake for LLM agents: Gymnasium's game with random maps, text observations and multi-action turns."""

from llm_gym.envs.frozen_lake.env import ACTIONS, FrozenLakeEnv, generate_map

__all__ = ["ACTIONS", "FrozenLakeEnv", "generate_map"]
