"""Replay recorded episodes: rebuild every state by re-running the environment, and check the record.

An :class:`~llm_gym.agent.records.EpisodeRecord` holds the env id, kwargs, seed, reset options and each turn's
raw response. :func:`replay_episode` makes the env, resets it the same way, feeds it the recorded responses and
draws each state. When the env's observation, reward or end flags disagree with the record, the replay reports
the first :class:`Mismatch` (which turn, which field, expected vs got); the remaining states are then shown as
text cards of the recorded observations instead of boards from a diverged env.
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from llm_gym.agent.records import EpisodeRecord, TurnRecord
from llm_gym.registration import make_env


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
    from llm_gym.registration import short_repr

    return short_repr(value, limit)


#: Longest ``env_kwargs`` / ``reset_options`` a record may carry, in characters of JSON.
RECORD_ARGS_MAX_CHARS = 1_000_000


def _json_size(value: Any, what: str) -> None:
    try:
        size = len(json.dumps(value, default=repr))
    except (TypeError, ValueError, RecursionError):
        raise ValueError(f"the record's {what} is not plain JSON") from None
    if size > RECORD_ARGS_MAX_CHARS:
        raise ValueError(
            f"the record's {what} is {size} characters of JSON, more than {RECORD_ARGS_MAX_CHARS}"
        )


def replay_env_args(
    record: EpisodeRecord, env_kwargs: Mapping[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """The env id and kwargs to replay ``record`` with, after checking them: records are untrusted input.

    Every replay path (``llmgym render`` / ``view``, :func:`replay_episode`, :func:`verify_episode`) goes
    through here. The id must be one of llm-gym's own ids (``llmgym/Name-vN``): never Gymnasium's
    ``module:Id`` form, which imports ``module``, nor another package's id. Each kwarg must be one the env's
    constructor takes (``render_mode`` is dropped: frames are drawn off-screen), and the constructors bound every
    size. Kwargs that name a file or a data set (the family's ``data_kwargs``, :mod:`llm_gym.core.kwargs`) are
    taken from the record only when they name bundled data or the id's own default: a record is untrusted, and a
    path in it could read any file (``/dev/zero``, ``../../etc/passwd``). Other values must be given by the user
    in ``env_kwargs``, which also overrides the record's values.

    Raises:
        ValueError: saying what is not accepted and how to get past it when that is safe.
    """
    from llm_gym.core.kwargs import constructor_kwargs, foreign_data_kwargs
    from llm_gym.registration import check_trusted_env_id, env_class, env_defaults

    try:
        env_id = check_trusted_env_id(record.env_id)
    except ValueError as e:
        raise ValueError(f"cannot make {_short(record.env_id)} to replay the record: {e}") from None
    cls = env_class(env_id)
    accepted = constructor_kwargs(cls) - {"render_mode"}
    recorded = record.env_kwargs
    if not isinstance(recorded, Mapping):
        raise ValueError(f"the record's env_kwargs must be an object, got {type(recorded).__name__}")
    foreign = set(foreign_data_kwargs(cls, recorded, env_defaults(env_id)))
    _json_size(dict(recorded), "env_kwargs")
    _json_size(record.reset_options, "reset_options")
    given = dict(env_kwargs or {})
    kwargs: dict[str, Any] = {}
    for key, value in recorded.items():
        if key == "render_mode" or key in given:
            continue
        if not isinstance(key, str) or key not in accepted:
            raise ValueError(
                f"the record passes {_short(key)} to {env_id}, which takes only: {', '.join(sorted(accepted))}"
            )
        if key in foreign:
            raise ValueError(
                f"the record asks for {key}={_short(value)}; file paths are not taken from a record. To replay "
                f'it, pass the file yourself: --env_kwargs \'{{"{key}": "PATH"}}\' on the command line '
                f"(env_kwargs={{{key!r}: PATH}} in Python)"
            )
        kwargs[key] = value
    for key in given:
        if key not in accepted:
            raise ValueError(f"{env_id} does not take {key!r}; it takes: {', '.join(sorted(accepted))}")
    kwargs.update(given)
    return env_id, kwargs


def _replay_env(record: EpisodeRecord, env_kwargs: Mapping[str, Any] | None = None) -> gym.Env:
    """The environment a record was made with, checked by :func:`replay_env_args`."""
    env_id, kwargs = replay_env_args(record, env_kwargs)
    try:
        return make_env(env_id, kwargs)
    except (
        TypeError,
        OverflowError,
        KeyError,
        IndexError,
        RuntimeError,
    ) as e:  # a constructor given a value of a wrong type, or a source it cannot load
        raise ValueError(f"cannot make {env_id!r} with the record's kwargs: {e}") from None


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


def iter_replay(
    record: EpisodeRecord,
    *,
    cell: int | None = None,
    draw: bool = True,
    env_kwargs: Mapping[str, Any] | None = None,
    result: Replay | None = None,
) -> Generator[np.ndarray, None, None]:
    """Re-run ``record``'s episode, yielding each state's frame as soon as it is drawn (so an exporter can write
    frames one by one instead of holding them all). The first disagreement is stored in ``result.mismatch``;
    from there on the recorded observations are yielded as text cards. Arguments as in :func:`replay_episode`.
    """
    from llm_gym.render.scene import draw_env, to_array

    result = result if result is not None else Replay(record)
    env = _replay_env(record, env_kwargs)
    shape = None
    try:
        try:
            obs, _ = env.reset(seed=record.seed, options=record.reset_options)
        except (TypeError, KeyError, IndexError, OverflowError, RuntimeError) as e:
            # Reset options of a wrong type, or kwargs that only fail at reset (RecursionError is a RuntimeError).
            raise ValueError(
                f"cannot reset {record.env_id} with the record's kwargs and options: {e}"
            ) from None
        first = to_array(draw_env(env, cell)) if draw else None
        shape = None if first is None else first.shape[:2]
        if obs != record.initial_observation:
            result.mismatch = Mismatch(0, "observation", record.initial_observation, obs)
        else:
            if first is not None:
                yield first
            for t, rec in enumerate(record.turns, 1):
                obs, reward, terminated, truncated, _ = env.step(rec.response)
                result.mismatch = _compare(t, rec, obs, float(reward), terminated, truncated)
                if result.mismatch is not None:
                    break
                if draw:
                    yield to_array(draw_env(env, cell))
    finally:
        env.close()
    if result.mismatch is not None and shape is not None:
        yield from _recorded_cards(record, shape, result.mismatch.turn)


def replay_episode(
    record: EpisodeRecord,
    *,
    cell: int | None = None,
    draw: bool = True,
    strict: bool = False,
    env_kwargs: Mapping[str, Any] | None = None,
) -> Replay:
    """Re-run ``record``'s episode and draw every state.

    Args:
        record: the episode to replay.
        cell: board cell size in pixels (``None``: fit the default board size).
        draw: draw frames (``False`` only checks the record).
        strict: raise :class:`ReplayMismatchError` on the first disagreement instead of reporting it.
        env_kwargs: kwargs from the user, trusted, overriding the record's (see :func:`replay_env_args`).

    Raises:
        ValueError: the record's env id or kwargs are not accepted (see :func:`replay_env_args`), the env cannot
            be made, or ``strict`` and a mismatch.
    """
    result = Replay(record)
    for frame in iter_replay(record, cell=cell, draw=draw, env_kwargs=env_kwargs, result=result):
        result.frames.append(frame)
    if result.mismatch is not None and strict:
        raise ReplayMismatchError(result.mismatch)
    return result


def _recorded_cards(record: EpisodeRecord, shape: tuple[int, int], first: int) -> Iterator[np.ndarray]:
    """After a mismatch at state ``first``, the recorded observations from there on as text cards of the board's
    size."""
    from llm_gym.render.card import draw_text_card
    from llm_gym.render.scene import to_array

    h, w = shape
    size = (max(w, 48), max(h, 58))  # the smallest card; only degenerate boards are smaller (then cropped)
    for t in range(first, len(record.turns) + 1):
        observation = record.initial_observation if t == 0 else record.turns[t - 1].observation
        title = "recorded (reset)" if t == 0 else f"recorded (turn {t})"
        yield to_array(draw_text_card(observation, title, size))[:h, :w]


class ReplayCursor:
    """Draw any state of ``record`` on demand, holding one live env instead of every frame.

    ``replay_episode`` draws all ``n + 1`` states up front (a 10,000-turn record is 10,001 boards, gigabytes).
    Here opening checks the record (a replay without drawing, so :attr:`mismatch` is known at once) and draws
    one board; :meth:`draw` then steps the live env forward to the state asked for, and restarts it from the
    reset when asked for an earlier one. States from the first mismatch on are the recorded observations as
    text cards, exactly as in :func:`iter_replay`. Cost: memory of one env and one frame; time one env step
    per turn moved forward (a restart replays from the reset, about 10 us per turn for the board games).

    Raises:
        ValueError: as :func:`replay_episode` (record not accepted, env cannot be made or reset).
    """

    def __init__(
        self, record: EpisodeRecord, *, cell: int | None = None, env_kwargs: Mapping[str, Any] | None = None
    ):
        self.record = record
        self.cell = cell
        self.env_kwargs = dict(env_kwargs or {})
        self.mismatch = verify_episode(record, env_kwargs=self.env_kwargs)
        self._env: gym.Env | None = None
        self._pos = 0
        first = self._draw_env_state(0)
        self.shape: tuple[int, int] = first.shape[:2]
        self._first = first

    def __len__(self) -> int:
        return len(self.record.turns) + 1

    def _draw_env_state(self, t: int) -> np.ndarray:
        from llm_gym.render.scene import draw_env, to_array

        if self._env is None or self._pos > t:
            self.close()
            self._env = _replay_env(self.record, self.env_kwargs)
            # Checked by verify_episode above: the same reset and steps succeed and match the record.
            self._env.reset(seed=self.record.seed, options=self.record.reset_options)
            self._pos = 0
        while self._pos < t:
            self._env.step(self.record.turns[self._pos].response)
            self._pos += 1
        return to_array(draw_env(self._env, self.cell))

    def draw(self, t: int) -> np.ndarray:
        """The frame of state ``t`` (``0`` after reset, ``t`` after turn ``t``); negative ``t`` counts from the end."""
        n = len(self)
        if t < 0:
            t += n
        if not 0 <= t < n:
            raise IndexError(f"state {t} out of range: the episode has {n} states")
        if self.mismatch is not None and t >= self.mismatch.turn:
            return next(_recorded_cards(self.record, self.shape, t))
        if t == 0 and self._first is not None:
            return self._first
        return self._draw_env_state(t)

    def draw_range(self, lo: int, hi: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(t, frame)`` for states ``lo..hi - 1`` in one forward pass (a viewer stepping backwards caches a
        run of earlier states with one restart instead of one restart per state)."""
        for t in range(max(0, lo), min(hi, len(self))):
            yield t, self.draw(t)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


def verify_episode(record: EpisodeRecord, *, env_kwargs: Mapping[str, Any] | None = None) -> Mismatch | None:
    """The first disagreement between ``record`` and a re-run of its environment, or ``None`` (``env_kwargs``: as
    in :func:`replay_episode`)."""
    return replay_episode(record, draw=False, env_kwargs=env_kwargs).mismatch
