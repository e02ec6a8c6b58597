"""Countdown: combine the given numbers with + - * / to reach a target; a safe arithmetic parser checks answers."""

from llm_gym.envs.countdown.env import CountdownEnv, Verdict, check_answer, generate_puzzle

__all__ = ["CountdownEnv", "Verdict", "check_answer", "generate_puzzle"]
