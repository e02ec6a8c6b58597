"""Replay recorded episodes: rebuild every state by re-running the environment, and check the record.

An :class:`~llm_gym.agent.records.EpisodeRecord` holds the env id, kwargs, seed, reset options and each turn's
raw response. :func:`replay_episode` makes the env, resets it the same way, feeds it the recorded responses and
draws each state. When the env's observation, reward or end flags disagree with the record, the replay reports
the first :class:`Mismatch` (which turn, which field, expected vs got); the remaining states are then shown as
text cards of the recorded observations instead of boards from a diverged env.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from llm_gym.agent.records import EpisodeRecord, TurnRecord


@dataclass(frozen=True)
class Mismatch:
    """The first place where the re-run environment and the record disagree (``turn`` 0 is the reset)."""

    turn: int
    field: str
    expected: Any
    got: Any

    def __str__(self) -> str:
        where = "reset" if self.turn == 0 else f"turn {self.turn}"
        return (
            f"{where}: {self.field} differs; record has {_short(self.expected)}, env gives {_short(self.got)}"
        )


class ReplayMismatchError(ValueError):
    """Raised by ``replay_episode(..., strict=True)`` when the record and the environment disagree."""

    def __init__(self, mismatch: Mismatch):
        super().__init__(str(mismatch))
        self.mismatch = mismatch


@dataclass
class Replay:
    """A replayed episode: ``frames[0]`` is the state after reset, ``frames[t]`` the state after turn ``t``."""

    record: EpisodeRecord
    frames: list[np.ndarray] = field(default_factory=list)
    mismatch: Mismatch | None = None

    @property
    def ok(self) -> bool:
        return self.mismatch is None


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def make_env(record: EpisodeRecord) -> gym.Env:
    """The environment a record was made with (``render_mode`` from the record is ignored)."""
    import llm_gym  # noqa: F401  (registers the llmgym/ ids)

    kwargs = {k: v for k, v in dict(record.env_kwargs or {}).items() if k != "render_mode"}
    try:
        return gym.make(record.env_id, disable_env_checker=True, **kwargs)
    except gym.error.Error as e:
        raise ValueError(f"cannot make {record.env_id!r} to replay the episode: {e}") from e


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _compare(
    turn: int, rec: TurnRecord, obs: str, reward: float, terminated: bool, truncated: bool
) -> Mismatch | None:
    if rec.observation != obs:
        return Mismatch(turn, "observation", rec.observation, obs)
    expected = _as_float(rec.reward)
    if not (
        math.isclose(expected, reward, rel_tol=1e-6, abs_tol=1e-6)
        or (math.isnan(expected) and math.isnan(reward))
    ):
        return Mismatch(turn, "reward", rec.reward, reward)
    if bool(rec.terminated) != bool(terminated):
        return Mismatch(turn, "terminated", rec.terminated, terminated)
    if bool(rec.truncated) != bool(truncated):
        return Mismatch(turn, "truncated", rec.truncated, truncated)
    return None


def replay_episode(
    record: EpisodeRecord,
    *,
    cell: int | None = None,
    draw: bool = True,
    strict: bool = False,
) -> Replay:
    """Re-run ``record``'s episode and draw every state.

    Args:
        record: the episode to replay.
        cell: board cell size in pixels (``None``: fit the default board size).
        draw: draw frames (``False`` only checks the record).
        strict: raise :class:`ReplayMismatchError` on the first disagreement instead of reporting it.

    Raises:
        ValueError: the env id cannot be made (unknown id, bad kwargs), or ``strict`` and a mismatch.
    """
    from llm_gym.render.scene import draw_env, to_array

    env = make_env(record)
    result = Replay(record)
    try:
        obs, _ = env.reset(seed=record.seed, options=record.reset_options)
        if draw:
            result.frames.append(to_array(draw_env(env, cell)))
        if obs != record.initial_observation:
            result.mismatch = Mismatch(0, "observation", record.initial_observation, obs)
        else:
            for t, rec in enumerate(record.turns, 1):
                obs, reward, terminated, truncated, _ = env.step(rec.response)
                result.mismatch = _compare(t, rec, obs, float(reward), terminated, truncated)
                if result.mismatch is not None:
                    break
                if draw:
                    result.frames.append(to_array(draw_env(env, cell)))
    finally:
        env.close()
    if result.mismatch is not None:
        if strict:
            raise ReplayMismatchError(result.mismatch)
        if draw:
            _fill_from_record(result)
    return result


def _fill_from_record(result: Replay) -> None:
    """After a mismatch, show the recorded observations (as text cards of the board's size)."""
    from llm_gym.render.card import draw_text_card
    from llm_gym.render.scene import to_array

    h, w = result.frames[0].shape[:2]
    size = (max(w, 48), max(h, 58))  # the smallest card; only degenerate boards are smaller (then cropped)
    observations = [result.record.initial_observation] + [t.observation for t in result.record.turns]
    for t in range(len(result.frames), len(observations)):
        card = to_array(draw_text_card(observations[t], f"recorded (turn {t})", size))
        result.frames.append(card[:h, :w] if card.shape[:2] != (h, w) else card)
    if result.mismatch is not None and result.mismatch.turn == 0:
        result.frames[0] = to_array(draw_text_card(observations[0], "recorded (reset)", size))[:h, :w]


def verify_episode(record: EpisodeRecord) -> Mismatch | None:
    """The first disagreement between ``record`` and a re-run of its environment, or ``None``."""
    return replay_episode(record, draw=False).mismatch


def record_episode(
    env_id: str,
    responses: Iterable[str],
    *,
    seed: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    reset_options: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> EpisodeRecord:
    """Play ``responses`` in a fresh ``env_id`` and return the episode as a record (stops when it ends)."""
    import llm_gym  # noqa: F401

    kwargs = dict(env_kwargs or {})
    env = gym.make(env_id, disable_env_checker=True, **kwargs)
    try:
        options = dict(reset_options) if reset_options is not None else None
        obs, _ = env.reset(seed=seed, options=options)
        record = EpisodeRecord(
            env_id=env_id,
            seed=seed,
            initial_observation=obs,
            env_kwargs=kwargs,
            reset_options=options,
            instructions=getattr(env.unwrapped, "instructions", ""),
            meta=dict(meta or {}),
        )
        for response in responses:
            obs, reward, terminated, truncated, info = env.step(response)
            record.turns.append(TurnRecord.from_step(response, obs, reward, terminated, truncated, info))
            if terminated or truncated:
                break
    finally:
        env.close()
    return record
