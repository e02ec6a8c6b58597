"""llm-gym: Gymnasium text environments for LLM agents.

``import llm_gym`` registers every ``llmgym/...`` id; then ``gymnasium.make("llmgym/Sokoban-v0")``.
"""

from llm_gym.core import AnyText, ParsedResponse, RewardComponent, RewardSpec, TextEnv, parse_response
from llm_gym.registration import ENVS, EnvEntry, list_envs, register_all, resolve_env_id

__version__ = "0.1.0"

register_all()

__all__ = [
    "ENVS",
    "AnyText",
    "EnvEntry",
    "ParsedResponse",
    "RewardComponent",
    "RewardSpec",
    "TextEnv",
    "list_envs",
    "parse_response",
    "register_all",
    "resolve_env_id",
]
