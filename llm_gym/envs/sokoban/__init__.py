"""Sokoban for LLM agents: the environment, seeded level generation, an optimal solver and XSB level files."""

from llm_gym.envs.sokoban.env import DEFAULT_VOCAB, REMAPPED_VOCAB, SokobanEnv
from llm_gym.envs.sokoban.generator import GeneratedLevel, GeneratorConfig, generate_level
from llm_gym.envs.sokoban.level import (
    SokobanLevel,
    format_collection,
    format_xsb,
    load_levels,
    parse_level,
    parse_levels,
    sample_path,
)
from llm_gym.envs.sokoban.ragen_generator import RagenGeneratorConfig, generate_ragen_level
from llm_gym.envs.sokoban.solver import ACTIONS, SolveResult, solve

__all__ = [
    "ACTIONS",
    "DEFAULT_VOCAB",
    "REMAPPED_VOCAB",
    "GeneratedLevel",
    "GeneratorConfig",
    "RagenGeneratorConfig",
    "SokobanEnv",
    "SokobanLevel",
    "SolveResult",
    "format_collection",
    "format_xsb",
    "generate_level",
    "generate_ragen_level",
    "load_levels",
    "parse_level",
    "parse_levels",
    "sample_path",
    "solve",
]
