"""The one table of llm-gym environment ids.

Every id lives in the ``llmgym`` namespace. Version policy: the ``-vN`` suffix is bumped whenever dynamics,
rewards, observation text or instructions change in a way that alters episodes for the same seed and actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

NAMESPACE = "llmgym"


@dataclass(frozen=True)
class EnvEntry:
    """One registered id: its entry point, default kwargs and a one-line description."""

    id: str
    entry_point: str
    description: str
    kwargs: dict[str, Any] = field(default_factory=dict)


_FL = "llm_gym.envs.frozen_lake:FrozenLakeEnv"
_BANDIT = "llm_gym.envs.bandit:BanditEnv"
_SOKOBAN = "llm_gym.envs.sokoban:SokobanEnv"
_COUNTDOWN = "llm_gym.envs.countdown:CountdownEnv"
_MATH = "llm_gym.envs.metamathqa:MetaMathQAEnv"

ENVS: tuple[EnvEntry, ...] = (
    EnvEntry(
        "llmgym/FrozenLake-v0",
        _FL,
        "4x4 random lake, 90% frozen, 80% intended moves (RAGEN-2 FrozenLake tag)",
    ),
    EnvEntry(
        "llmgym/FrozenLakeDeterministic-v0",
        _FL,
        "4x4 random lake, moves always as intended (RAGEN-2 main-table setting)",
        {"success_rate": 1.0},
    ),
    EnvEntry(
        "llmgym/FrozenLakeSlippery-v0",
        _FL,
        "4x4 random lake, 80% frozen, 1/3 intended moves (RAGEN v1 / Gymnasium slippery)",
        {"p": 0.8, "success_rate": 1 / 3},
    ),
    EnvEntry(
        "llmgym/FrozenLake8x8-v0",
        _FL,
        "8x8 random lake, 90% frozen, deterministic moves, 20 actions",
        {"size": 8, "success_rate": 1.0, "max_actions": 20, "max_turns": 10},
    ),
    EnvEntry(
        "llmgym/CoordFrozenLake-v0",
        _FL,
        "FrozenLake-v0 with the coordinate + grid observation (RAGEN-2 CoordFrozenLake)",
        {"observation_format": "grid_coord"},
    ),
    EnvEntry("llmgym/Bandit-v0", _BANDIT, "two-armed symbolic bandit, arm pairs from RAGEN-2's train list"),
    EnvEntry(
        "llmgym/BanditHeldOut-v0",
        _BANDIT,
        "two-armed bandit with RAGEN-2's held-out (test) arm pairs",
        {"split": "test"},
    ),
    EnvEntry("llmgym/Sokoban-v0", _SOKOBAN, "6x6 room, 1 box, generated and solvable (RAGEN SimpleSokoban)"),
    EnvEntry(
        "llmgym/SokobanLarge-v0",
        _SOKOBAN,
        "8x8 room, 2 boxes (RAGEN LargerSokoban)",
        {"dim_room": (8, 8), "num_boxes": 2},
    ),
    EnvEntry(
        "llmgym/SokobanNewVocab-v0",
        _SOKOBAN,
        "6x6 room, 1 box, remapped symbols (RAGEN SokobanDifferentGridVocab)",
        {"vocab": "remapped"},
    ),
    EnvEntry(
        "llmgym/CoordSokoban-v0",
        _SOKOBAN,
        "6x6 room, 1 box, coordinate + grid observation (RAGEN-2 CoordSokoban)",
        {"observation_format": "grid_coord"},
    ),
    EnvEntry(
        "llmgym/SokobanFile-v0",
        _SOKOBAN,
        "levels read from an XSB file (`level_file=`), bundled sample by default",
        {"level_file": "sample"},
    ),
    EnvEntry(
        "llmgym/Countdown-v0",
        _COUNTDOWN,
        "reach the target with 3-4 numbers, each used once (RAGEN Countdown)",
    ),
    EnvEntry(
        "llmgym/Countdown4-v0",
        _COUNTDOWN,
        "Countdown with always 4 numbers, each used once",
        {"num_count": (4, 4)},
    ),
    EnvEntry(
        "llmgym/CountdownAtMostOnce-v0",
        _COUNTDOWN,
        "Countdown where each number may be used at most once (RAGEN-2 paper wording)",
        {"allow_unused": True},
    ),
    EnvEntry(
        "llmgym/MetaMathQA-v0",
        _MATH,
        "MetaMathQA question (HF meta-math/MetaMathQA), equivalence-checked answer, one attempt (RAGEN)",
    ),
    EnvEntry(
        "llmgym/MetaMathQASample-v0",
        _MATH,
        "MetaMathQA-v0 on the bundled 40-problem sample (works offline)",
        {"dataset": "sample"},
    ),
    EnvEntry(
        "llmgym/MetaMathQARetry-v0",
        _MATH,
        "MetaMathQA with 3 attempts, reward 1, 0.5, 0.25 for a correct first, second, third answer (RAGEN-2 paper)",
        {"max_attempts": 3},
    ),
)


def register_all() -> None:
    """Register every id in :data:`ENVS` with Gymnasium (idempotent)."""
    for entry in ENVS:
        if entry.id not in gym.registry:
            gym.register(
                id=entry.id,
                entry_point=entry.entry_point,
                kwargs=dict(entry.kwargs),
                disable_env_checker=False,
            )


def list_envs() -> list[str]:
    """All registered llm-gym ids, in table order."""
    return [e.id for e in ENVS]


def _norm(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def resolve_env_id(name: str) -> str:
    """A registered id from what a person types on a command line.

    ``Sokoban``, ``sokoban``, ``Sokoban-v0``, ``frozen_lake`` and ``llmgym/Sokoban-v0`` resolve to the llm-gym id
    (case, ``_`` and ``-`` ignored; the version may be left out); any other registered Gymnasium id passes
    through. Unknown names raise ``ValueError`` listing the choices.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("env must be a name such as FrozenLake or an id such as llmgym/Sokoban-v0")
    name = name.strip()
    if name in gym.registry:
        return name
    bare = name.split("/", 1)[1] if name.lower().startswith(NAMESPACE.lower() + "/") else name
    for env_id in list_envs():
        full = env_id.split("/", 1)[1]
        if _norm(bare) in (_norm(full), _norm(full.rsplit("-v", 1)[0])):
            return env_id
    shorts = ", ".join(dict.fromkeys(e.split("/", 1)[1].rsplit("-v", 1)[0] for e in list_envs()))
    raise ValueError(
        f"unknown environment {name!r}; choose from the short names ({shorts}) "
        f"or a registered id (known: {', '.join(list_envs())})"
    )
