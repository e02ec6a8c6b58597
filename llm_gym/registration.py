"""The one table of llm-gym environment ids.

Every id lives in the ``llmgym`` namespace. Version policy: the ``-vN`` suffix is bumped whenever dynamics,
rewards, observation text or instructions change in a way that alters episodes for the same seed and actions.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import gymnasium as gym

from llm_gym.core.checks import is_int

NAMESPACE = "llmgym"


@dataclass(frozen=True)
class EnvEntry:
    """One registered id: its entry point, default kwargs and a one-line description (Markdown: it is the id's row
    in the README's and the docs' id tables, which :func:`id_table` generates)."""

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
        "4x4 random lake, 90% frozen, 80% intended moves (RAGEN-2 `FrozenLake` tag)",
    ),
    EnvEntry(
        "llmgym/FrozenLakeDeterministic-v0",
        _FL,
        "4x4 random lake, moves always as intended (RAGEN-2 main-table setting, `success_rate=1.0`)",
        {"success_rate": 1.0},
    ),
    EnvEntry(
        "llmgym/FrozenLakeSlippery-v0",
        _FL,
        "4x4 random lake, 80% frozen, 1/3 intended moves (RAGEN v1 / Gymnasium's slippery lake)",
        {"p": 0.8, "success_rate": 1 / 3},
    ),
    EnvEntry(
        "llmgym/FrozenLake8x8-v0",
        _FL,
        "8x8 random lake, 90% frozen, deterministic moves, 10 turns / 20 actions",
        {"size": 8, "success_rate": 1.0, "max_actions": 20, "max_turns": 10},
    ),
    EnvEntry(
        "llmgym/CoordFrozenLake-v0",
        _FL,
        "FrozenLake-v0 with a coordinate block before the grid (RAGEN-2 `CoordFrozenLake`)",
        {"observation_format": "grid_coord"},
    ),
    EnvEntry(
        "llmgym/CoordFrozenLakeDeterministic-v0",
        _FL,
        "CoordFrozenLake with moves always as intended (RAGEN-2 main table, `config/_3_frozen_lake.yaml`)",
        {"observation_format": "grid_coord", "success_rate": 1.0},
    ),
    EnvEntry(
        "llmgym/RagenCoordFrozenLake-v0",
        _FL,
        "CoordFrozenLakeDeterministic with RAGEN's exact coordinate text (RAGEN-2 main-table FrozenLake)",
        {"observation_format": "grid_coord", "observation_style": "ragen", "success_rate": 1.0},
    ),
    EnvEntry(
        "llmgym/RagenCoordFrozenLake-v1",
        _FL,
        "RagenCoordFrozenLake-v0 with RAGEN's map draw: a seed gives RAGEN's map (its 512 validation maps)",
        {
            "observation_format": "grid_coord",
            "observation_style": "ragen",
            "success_rate": 1.0,
            "generator": "ragen",
        },
    ),
    EnvEntry(
        "llmgym/Bandit-v0", _BANDIT, "two-armed symbolic bandit, arm name pairs from RAGEN-2's train list"
    ),
    EnvEntry(
        "llmgym/BanditHeldOut-v0",
        _BANDIT,
        "the same bandit with RAGEN-2's held-out (test) name pairs",
        {"split": "test"},
    ),
    EnvEntry(
        "llmgym/Sokoban-v0", _SOKOBAN, "6x6 room, 1 box, generated and solvable (RAGEN `SimpleSokoban`)"
    ),
    EnvEntry(
        "llmgym/SokobanLarge-v0",
        _SOKOBAN,
        "8x8 room, 2 boxes (RAGEN `LargerSokoban`)",
        {"dim_room": (8, 8), "num_boxes": 2},
    ),
    EnvEntry(
        "llmgym/SokobanNewVocab-v0",
        _SOKOBAN,
        "6x6 room, 1 box, remapped symbols (RAGEN `SokobanDifferentGridVocab`)",
        {"vocab": "remapped"},
    ),
    EnvEntry(
        "llmgym/CoordSokoban-v0",
        _SOKOBAN,
        "6x6 room, 1 box, coordinate + grid observation (RAGEN-2 `CoordSokoban`)",
        {"observation_format": "grid_coord"},
    ),
    EnvEntry(
        "llmgym/RagenSokoban-v0",
        _SOKOBAN,
        "Sokoban-v0 with RAGEN's level generator (reverse-play DFS, `search_depth` 300; easier levels)",
        {"generator": "ragen", "search_depth": 300},
    ),
    EnvEntry(
        "llmgym/RagenCoordSokoban-v0",
        _SOKOBAN,
        "CoordSokoban-v0 with RAGEN's level generator and exact coordinate text (RAGEN-2 `CoordSokoban`)",
        {
            "generator": "ragen",
            "search_depth": 300,
            "observation_format": "grid_coord",
            "observation_style": "ragen",
        },
    ),
    EnvEntry(
        "llmgym/RagenSokobanLarge-v0",
        _SOKOBAN,
        "8x8 room, 2 boxes, RAGEN's generator with `LargerSokoban`'s `search_depth` 10",
        {"dim_room": (8, 8), "num_boxes": 2, "generator": "ragen", "search_depth": 10},
    ),
    EnvEntry(
        "llmgym/RagenSokobanNewVocab-v0",
        _SOKOBAN,
        "remapped symbols, RAGEN's generator with `SokobanDifferentGridVocab`'s `search_depth` 30",
        {"vocab": "remapped", "generator": "ragen", "search_depth": 30},
    ),
    EnvEntry(
        "llmgym/SokobanFile-v0",
        _SOKOBAN,
        "levels from an XSB file (`level_file=`), the bundled 36-level sample by default",
        {"level_file": "sample"},
    ),
    EnvEntry(
        "llmgym/Countdown-v0",
        _COUNTDOWN,
        "reach the target with 3-4 numbers, each used exactly once (RAGEN Countdown)",
    ),
    EnvEntry(
        "llmgym/Countdown4-v0",
        _COUNTDOWN,
        "Countdown with always 4 numbers",
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
        "a MetaMathQA question (hub `meta-math/MetaMathQA` or a local file), one attempt (RAGEN)",
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
        "MetaMathQA with 3 attempts, reward 1, 0.5, 0.25 (RAGEN-2 paper's retry rule)",
        {"max_attempts": 3},
    ),
)


#: The remote client env (``llm_gym.serve.client.RemoteEnv``): registered, but not in :data:`ENVS`, so that
#: :func:`check_trusted_env_id` never accepts it from a record (its ``url`` would make llm-gym connect somewhere).
REMOTE_ID = "llmgym/Remote-v0"


def register_all() -> None:
    """Register every id in :data:`ENVS`, and :data:`REMOTE_ID`, with Gymnasium (idempotent)."""
    for entry in ENVS:
        if entry.id not in gym.registry:
            gym.register(
                id=entry.id,
                entry_point=entry.entry_point,
                kwargs=dict(entry.kwargs),
                disable_env_checker=False,
            )
    if REMOTE_ID not in gym.registry:
        gym.register(id=REMOTE_ID, entry_point="llm_gym.serve.client:RemoteEnv", disable_env_checker=False)


def make_env(
    env_id: str, env_kwargs: Mapping[str, Any] | None = None, *, env_url: str | None = None
) -> gym.Env:
    """``gym.make(env_id, **env_kwargs)`` with clear errors: the one way llm-gym code creates an environment.

    ``env_id`` must be a registered id, as records and configs store it (a command-line name goes through
    :func:`resolve_env_id` first). Gymnasium's passive env checker runs as the id's registration says (on
    for every llm-gym id: it checks only the first reset and step, and our envs pass it). With ``env_url`` (an
    ``llmgym serve`` address), the env is played there: ``llmgym/Remote-v0`` with the same id and kwargs, which
    gives the same episodes (:func:`pick_env_url` spreads sessions over several servers).

    Raises:
        ValueError: ``cannot make '<id>': ...`` for an unknown id (naming the closest registered ones) or
            arguments the environment does not take.
    """
    if not isinstance(env_id, str) or env_id not in gym.registry:
        try:
            resolved = resolve_env_id(env_id)
        except ValueError as e:
            raise ValueError(f"cannot make {env_id!r}: {e}") from None
        raise ValueError(f"cannot make {env_id!r}: not a registered id; did you mean {resolved!r}?")
    kwargs = dict(env_kwargs or {})
    if env_url is not None:
        kwargs = {"url": env_url, "env_id": check_trusted_env_id(env_id, "make_env"), "env_kwargs": kwargs}
        env_id = REMOTE_ID
    try:
        return gym.make(env_id, **kwargs)
    except (gym.error.Error, TypeError) as e:  # TypeError: a keyword the constructor does not take
        raise ValueError(f"cannot make {env_id!r} with kwargs {sorted(kwargs)}: {e}") from e


def pick_env_url(env_url: str | Sequence[str] | None, index: int) -> str | None:
    """The server of session ``index`` when sessions are spread over ``env_url`` (one address or several, used
    in turn), or ``None`` (play locally)."""
    if env_url is None:
        return None
    if isinstance(env_url, str):
        return env_url
    urls = list(env_url)
    if not urls:
        return None
    return urls[index % len(urls)]


def list_envs() -> list[str]:
    """All registered llm-gym ids, in table order."""
    return [e.id for e in ENVS]


def env_family(env_id: str) -> str:
    """The family of an llm-gym id: its class's package under ``llm_gym/envs/`` without underscores
    (``llmgym/FrozenLake-v0`` -> ``frozenlake``, the name of its docs page ``docs/envs/frozenlake.md``)."""
    entry = next(e for e in ENVS if e.id == check_trusted_env_id(env_id, "env_family"))
    return entry.entry_point.split(":")[0].rsplit(".", 1)[1].replace("_", "")


@functools.cache
def env_class(env_id: str) -> type:
    """The class of an llm-gym id (``env_id`` must be in :data:`ENVS`; its entry point is imported)."""
    from gymnasium.envs.registration import load_env_creator

    entry = next(e for e in ENVS if e.id == check_trusted_env_id(env_id, "env_class"))
    cls = load_env_creator(entry.entry_point)
    if not isinstance(cls, type):
        raise TypeError(f"{env_id}'s entry point {entry.entry_point!r} is not a class")
    return cls


@functools.cache
def _env_defaults(env_id: str) -> tuple[tuple[str, Any], ...]:
    from llm_gym.core.kwargs import kwarg_defaults

    entry = next(e for e in ENVS if e.id == check_trusted_env_id(env_id, "env_defaults"))
    return tuple({**kwarg_defaults(env_class(env_id)), **entry.kwargs}.items())


def env_defaults(env_id: str) -> dict[str, Any]:
    """The kwargs ``make_env(env_id)`` builds with when given none: the id's own kwargs over the constructor's
    defaults (:func:`llm_gym.core.kwargs.kwarg_defaults`)."""
    return dict(_env_defaults(env_id))


def id_table(entries: tuple[EnvEntry, ...] | None = None) -> str:
    """The Markdown table of ids and descriptions (default: every id in :data:`ENVS`), as the README and the
    docs show it (``scripts/gen_readme.py`` and the docs hook ``docs/hooks/id_table.py`` write it there)."""
    rows = ["| id | what it is |", "|---|---|"]
    rows += [f"| `{e.id}` | {e.description} |" for e in (ENVS if entries is None else entries)]
    return "\n".join(rows)


#: Seeds taken from untrusted input (records, exported rows, dataset rows): what ``numpy.random.default_rng``
#: takes without cost surprises, ``0 <= seed < 2**64``. The one rule for records, export and the TRL adapter.
SEED_LIMIT = 2**64


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages about untrusted values (a 4,000-digit
    integer is described by its size: its repr would be long, and past 4,300 digits ``repr`` itself raises)."""
    if is_int(value, numpy=False) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_trusted_env_id(env_id: Any, source: str = "the record") -> str:
    """``env_id`` if it is one of llm-gym's own ids (the :data:`ENVS` table), else ``ValueError``.

    The one check for ids from untrusted input (records, exported rows) and for the TRL adapter: never
    Gymnasium's ``module:Id`` form, which imports ``module``, nor another package's id such as ``CartPole-v1``.
    """
    known = list_envs()
    if not isinstance(env_id, str) or env_id not in known:
        raise ValueError(
            f"{short_repr(env_id, 80)} from {source} is not an llm-gym id; only ids registered under "
            f"{NAMESPACE}/ are accepted (known: {', '.join(known)})"
        )
    return env_id


@overload
def check_seed(seed: Any, what: str = ..., *, allow_none: Literal[False]) -> int: ...
@overload
def check_seed(seed: Any, what: str = ..., *, allow_none: bool = ...) -> int | None: ...
def check_seed(seed: Any, what: str = "seed", *, allow_none: bool = True) -> int | None:
    """``seed`` as an ``int`` if it is an integer in ``[0, 2**64)`` (or ``None`` when allowed), else ``ValueError``
    (the value is shortened in the message)."""
    if seed is None and allow_none:
        return None
    if not is_int(seed) or not 0 <= seed < SEED_LIMIT:
        null = "null or " if allow_none else ""
        raise ValueError(f"{what} must be {null}an integer in [0, 2**64), got {short_repr(seed)}")
    return int(seed)


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
    short_names = list(dict.fromkeys(_short_name(e) for e in list_envs()))
    # One line: the suggestion first, then one name per family rather than every id (list_envs() has them all).
    families = ", ".join(family_names())
    raise ValueError(
        f"unknown environment {name!r}{_did_you_mean(bare, short_names)}; choose a short name such as "
        f"{families} (or one of their variants: {len(ENVS)} ids in llm_gym.list_envs()) "
        "or a registered Gymnasium id"
    )


def family_names() -> list[str]:
    """One short name per family, its first id's (``FrozenLake``, ``Bandit``, ...): what ``--env`` help and
    error messages list (any id of :data:`ENVS` is accepted too)."""
    first_of_family: dict[str, str] = {}
    for entry in ENVS:
        first_of_family.setdefault(entry.entry_point, _short_name(entry.id))
    return list(first_of_family.values())


def _short_name(env_id: str) -> str:
    """``llmgym/Sokoban-v0`` -> ``Sokoban``."""
    return env_id.split("/", 1)[1].rsplit("-v", 1)[0]


def _did_you_mean(name: str, short_names: list[str]) -> str:
    """``" (did you mean 'Sokoban'?)"`` for the closest short name(s), or ``""`` when none is close."""
    import difflib

    by_norm = {_norm(s): s for s in short_names}
    close = difflib.get_close_matches(_norm(name.rsplit("-v", 1)[0]), list(by_norm), n=2, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(by_norm[c]) for c in close) + "?)"
