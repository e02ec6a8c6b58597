"""Draw any environment: dispatch on its public state by duck typing.

* ``board()`` -> Sokoban-style XSB rows, drawn as a board;
* ``card()`` -> an answer card (title, question, answer, verdict);
* ``desc`` + ``player`` -> a FrozenLake board;
* anything else -> a text card of the current observation.

A new environment plugs in by exposing one of these; nothing here names an environment class.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llm_gym.render.board import draw_board, layout_from_lake, layout_from_xsb
from llm_gym.render.card import draw_card, draw_text_card
from llm_gym.render.theme import CARD_SIZE


def env_kind(env: Any) -> str:
    """``"board"``, ``"card"``, ``"lake"`` or ``"text"``: how :func:`draw_env` will draw ``env``."""
    env = getattr(env, "unwrapped", env)
    if callable(getattr(env, "board", None)):
        return "board"
    if callable(getattr(env, "card", None)):
        return "card"
    if hasattr(env, "desc") and hasattr(env, "player"):
        return "lake"
    return "text"


def _observation_text(env: Any) -> str:
    obs = getattr(env, "_observation", None)
    if callable(obs):
        try:
            return str(obs())
        except Exception as e:  # an env not reset yet has no observation; show why instead of crashing
            return f"(no observation: {type(e).__name__})"
    return repr(env)


def draw_env(env: Any, cell: int | None = None, card_size: tuple[int, int] = CARD_SIZE, target=None):
    """A pygame Surface of ``env``'s current state (never touches the display).

    Boards are drawn into ``target`` when it has the right size (saves an allocation per frame)."""
    env = getattr(env, "unwrapped", env)
    kind = env_kind(env)
    if kind == "board":
        rows = env.board()
        if not rows:
            return draw_text_card("(call reset() first)", type(env).__name__, card_size)
        return draw_board(layout_from_xsb(rows), cell, target)
    if kind == "card":
        card = env.card()
        if not isinstance(card, dict):
            raise ValueError(f"{type(env).__name__}.card() must return a dict, got {type(card).__name__}")
        return draw_card(card, card_size)
    if kind == "lake":
        if not env.desc:
            return draw_text_card("(call reset() first)", type(env).__name__, card_size)
        return draw_board(layout_from_lake(env.desc, env.player), cell, target)
    return draw_text_card(_observation_text(env), type(env).__name__, card_size)


def to_array(surface) -> np.ndarray:
    """An ``HxWx3 uint8`` copy of ``surface`` (one conversion, row-major)."""
    from llm_gym.render.backend import require_pygame

    pg = require_pygame()
    w, h = surface.get_size()
    return np.frombuffer(pg.image.tobytes(surface, "RGB"), dtype=np.uint8).reshape(h, w, 3).copy()


def from_array(frame: np.ndarray):
    """A Surface holding an ``HxWx3 uint8`` frame."""
    from llm_gym.render.backend import require_pygame

    pg = require_pygame()
    frame = np.ascontiguousarray(frame, dtype=np.uint8)
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"expected an HxWx3 frame, got shape {frame.shape}")
    h, w, _ = frame.shape
    return pg.image.frombuffer(frame.tobytes(), (w, h), "RGB").copy()
