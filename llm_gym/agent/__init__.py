"""Agent-side helpers: chat formatting, the batched multi-turn rollout loop and episode records."""

from llm_gym.agent.chat import (
    DEFAULT_SYSTEM_PROMPT,
    ChatFormat,
    Conversation,
    generation_prompt,
    system_message,
    turn_text,
)
from llm_gym.agent.records import EpisodeRecord, TurnRecord, read_records, record_episode, write_records
from llm_gym.agent.rollout import Policy, episode_metrics, group_seeds, rollout
from llm_gym.registration import make_env

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "ChatFormat",
    "Conversation",
    "EpisodeRecord",
    "Policy",
    "TurnRecord",
    "episode_metrics",
    "generation_prompt",
    "group_seeds",
    "make_env",
    "read_records",
    "record_episode",
    "rollout",
    "system_message",
    "turn_text",
    "write_records",
]
