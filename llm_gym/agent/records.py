"""Episode records: one JSON object per line, written by evaluation and training, read by replay and the viewer.

A record holds what is needed to rebuild the episode (env id, kwargs, seed, reset options and each turn's raw
response) and what the agent saw and got (observations, parsed actions, rewards, info).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 1


def to_jsonable(value: Any) -> Any:
    """Convert tuples, numpy scalars/arrays and non-finite floats into plain JSON values."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


@dataclass
class TurnRecord:
    """One turn: the model's full response and what the environment answered."""

    response: str
    observation: str
    reward: float
    actions: list[str] = field(default_factory=list)
    reward_components: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_step(
        cls, response: str, observation: str, reward: float, terminated: bool, truncated: bool, info: dict
    ) -> TurnRecord:
        """The record of one ``env.step(response)`` and what it returned."""
        return cls(
            response=response,
            observation=observation,
            reward=float(reward),
            actions=[str(a) for a in info.get("actions", [])],
            reward_components={str(k): float(v) for k, v in dict(info.get("reward_components", {})).items()},
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=dict(info),
        )


@dataclass
class EpisodeRecord:
    """One episode, replayable from ``env_id``, ``env_kwargs``, ``seed``, ``reset_options`` and the responses."""

    env_id: str
    seed: int | None
    initial_observation: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    reset_options: dict[str, Any] | None = None
    instructions: str = ""
    turns: list[TurnRecord] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION

    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def success(self) -> bool:
        return bool(self.turns and self.turns[-1].info.get("success", False))

    def to_dict(self) -> dict[str, Any]:
        d = to_jsonable(asdict(self))
        d["total_reward"] = self.total_reward
        d["success"] = self.success
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeRecord:
        if not isinstance(d, dict) or "env_id" not in d:
            raise ValueError("not an episode record: expected an object with an 'env_id' key")
        version = d.get("version", FORMAT_VERSION)
        if version > FORMAT_VERSION:
            raise ValueError(
                f"episode record version {version} is newer than this llm-gym ({FORMAT_VERSION})"
            )
        # Unknown keys (from newer writers) are ignored so old readers still load the record.
        turn_keys = {f.name for f in fields(TurnRecord)}
        turns = [TurnRecord(**{k: v for k, v in t.items() if k in turn_keys}) for t in d.get("turns", [])]
        known = {
            "env_id",
            "seed",
            "initial_observation",
            "env_kwargs",
            "reset_options",
            "instructions",
            "meta",
        }
        return cls(turns=turns, version=version, **{k: d[k] for k in known if k in d})


def write_records(path: str | Path, records: Iterable[EpisodeRecord], *, append: bool = True) -> int:
    """Write records as JSON lines; returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("a" if append else "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    return n


def iter_records(path: str | Path) -> Iterator[EpisodeRecord]:
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield EpisodeRecord.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError, ValueError) as e:
                raise ValueError(f"{path}:{lineno}: bad episode record: {e}") from None


def read_records(path: str | Path) -> list[EpisodeRecord]:
    """All records in a JSONL file; a malformed line raises ``ValueError`` naming the line."""
    return list(iter_records(path))
