"""Core API shared by every llm-gym environment: the base class, text spaces, parsing and reward specs."""

from llm_gym.core.env import ExpertMove, RagenPrompt, TextEnv, fits_limits
from llm_gym.core.parsing import ACTION_SEP, ParsedResponse, format_response, parse_response
from llm_gym.core.rewards import FORMAT_PENALTY, RewardComponent, RewardSpec
from llm_gym.core.spaces import BASE_CHARSET, AnyText, text_space

__all__ = [
    "ACTION_SEP",
    "BASE_CHARSET",
    "FORMAT_PENALTY",
    "AnyText",
    "ExpertMove",
    "ParsedResponse",
    "RagenPrompt",
    "RewardComponent",
    "RewardSpec",
    "TextEnv",
    "fits_limits",
    "format_response",
    "parse_response",
    "text_space",
]
