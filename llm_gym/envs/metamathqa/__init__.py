"""MetaMathQA: answer a math word problem; answers are checked by value (or exactly, with ``strict=True``)."""

from llm_gym.envs.metamathqa.env import MetaMathQAEnv

__all__ = ["MetaMathQAEnv"]
