"""MkDocs hook: reward tables generated from each environment's declared ``RewardSpec``.

A page writes ``<!-- reward-table: llmgym/Sokoban-v0 -->`` on a line of its own; the build replaces it with the
table of that id's reward components (name, default, meaning), so the docs cannot drift from the code.
The spec is read from the registered class and kwargs without constructing the env (MetaMathQA-v0 would
otherwise load its hub dataset).
"""

from __future__ import annotations

import re

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

import llm_gym  # noqa: F401  (registers the llmgym/* ids)

MARKER = re.compile(r"^<!--\s*reward-table:\s*(\S+)\s*-->[ \t]*$", flags=re.M)


def reward_spec(env_id: str):
    """The reward spec an env made with ``gym.make(env_id)`` starts from (registered overrides applied)."""
    spec = gym.spec(env_id)
    cls = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    return cls.default_reward_spec().with_overrides(spec.kwargs.get("rewards"))


def reward_table(env_id: str) -> str:
    return reward_spec(env_id).markdown_table()


def expand(markdown: str) -> str:
    """Replace every reward-table marker; an unknown id raises (and fails the build)."""
    return MARKER.sub(lambda m: reward_table(m.group(1)), markdown)


def on_page_markdown(markdown: str, **kwargs) -> str:
    return expand(markdown)
