"""``llmgym play``: a person plays any environment in a window.

Arrow keys send direction actions on board games (when the env has actions named Up/Down/Left/Right); anything
can also be typed and sent with Enter (an answer, or action names such as ``Up || Left``). Every move is wrapped
into the env's response format with :func:`llm_gym.core.format_response`, so the env sees exactly what an LLM
would send. :class:`PlaySession` is the state machine (testable without a window); :func:`draw_play` draws it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from llm_gym.agent.records import EpisodeRecord, TurnRecord
from llm_gym.core.parsing import ACTION_SEP, format_response
from llm_gym.registration import make_env
from llm_gym.render.text import blit_lines, ellipsize, font, wrap_text
from llm_gym.render.theme import COLORS
from llm_gym.render.window import BAR_H, blit_fitted, run_window, screen_frame

PLAY_SIZE = (1000, 600)
HELP = "arrows: move   type + Enter: send an answer   Enter after the end: new episode   Esc: quit"
HUMAN_THINK = "human player"
_DIRECTIONS = ("up", "down", "left", "right")
_MAX_INPUT = 500


class PlaySession:
    """One person playing ``env_id``: the env, the text being typed, and the episodes played so far."""

    def __init__(self, env_id: str, *, seed: int | None = None, env_kwargs: Mapping[str, Any] | None = None):
        self.env_id = env_id
        self.env_kwargs = {k: v for k, v in dict(env_kwargs or {}).items() if k != "render_mode"}
        self.env = make_env(env_id, self.env_kwargs)
        base = self.env.unwrapped
        names = getattr(base, "action_names", None) or ()
        #: arrow key name -> the env's action of that name
        self.arrow_actions: dict[str, str] = {n.lower(): n for n in names if n.lower() in _DIRECTIONS}
        self.buffer = ""
        self.running = True
        self.records: list[EpisodeRecord] = []
        self.message = ""
        self.version = 0
        self._next_seed = seed
        self.new_episode()

    @property
    def unwrapped(self):
        return self.env.unwrapped

    @property
    def record(self) -> EpisodeRecord:
        """The current episode."""
        return self.records[-1]

    @property
    def done(self) -> bool:
        turns = self.record.turns
        return bool(turns and (turns[-1].terminated or turns[-1].truncated))

    def new_episode(self) -> None:
        seed = self._next_seed
        if seed is None:
            # A concrete seed, recorded, so that the episode can be replayed and verified.
            seed = int(cast(int, np.random.SeedSequence().entropy)) % 2**32  # an int when none is given
        obs, _ = self.env.reset(seed=seed)
        self._next_seed = seed + 1
        self.records.append(
            EpisodeRecord.from_reset(
                self.env, self.env_id, seed, obs, env_kwargs=self.env_kwargs, meta={"policy": "human"}
            )
        )
        self.buffer = ""
        self.message = "new episode"
        self.version += 1

    def response_for(self, answer: str) -> str:
        """``answer`` wrapped in the env's response format (with a ``<think>`` block when the env wants one)."""
        base = self.unwrapped
        sep = getattr(base, "action_sep", None) or ACTION_SEP
        return format_response([answer], HUMAN_THINK, use_think=getattr(base, "think", True), sep=sep)

    def send(self, answer: str) -> None:
        """Send ``answer`` as one turn (ignored once the episode is over)."""
        if self.done:
            self.message = "the episode is over: press Enter for a new one"
            self.version += 1
            return
        response = self.response_for(answer)
        obs, reward, terminated, truncated, info = self.env.step(response)
        self.record.turns.append(TurnRecord.from_step(response, obs, reward, terminated, truncated, info))
        if info.get("error"):
            self.message = f"invalid: {info['error']}"
        elif terminated:
            self.message = "solved!" if info.get("success") else "episode over"
        elif truncated:
            self.message = "out of turns or actions"
        else:
            self.message = f"reward {float(reward):+.2f}"
        self.version += 1

    def handle_key(self, key: str, text: str = "") -> None:
        """A key press: ``key`` is a key name (``"up"``, ``"return"``, ``"backspace"``, ``"escape"``...),
        ``text`` the character it types, if any."""
        key = key.lower()
        if key == "escape":
            self.running = False
        elif key in self.arrow_actions:
            self.send(self.arrow_actions[key])
        elif key in ("return", "enter", "keypad enter"):
            if self.done:
                self.new_episode()
            elif self.buffer.strip():
                answer, self.buffer = self.buffer.strip(), ""
                self.send(answer)
        elif key == "backspace":
            self.buffer = self.buffer[:-1]
            self.version += 1
        elif text and text.isprintable() and len(self.buffer) < _MAX_INPUT:
            self.buffer += text
            self.version += 1

    def handle_event(self, event) -> None:
        import pygame

        if event.type == pygame.QUIT:
            self.running = False
        elif event.type == pygame.KEYDOWN:
            self.handle_key(pygame.key.name(event.key), getattr(event, "unicode", "") or "")

    def close(self) -> None:
        self.env.close()


def draw_play(session: PlaySession, size: tuple[int, int] = PLAY_SIZE):
    """The play screen for ``session`` as a Surface (no display needed)."""
    from llm_gym.render.backend import require_pygame
    from llm_gym.render.scene import draw_env

    pg = require_pygame()
    w, h = size
    base = session.unwrapped
    rec = session.record
    top = (
        f"{session.env_id}   seed {rec.seed}   episode {len(session.records)}   turn {len(rec.turns)}   "
        f"total reward {rec.total_reward:+.2f}"
    )
    surf = screen_frame(size, top, HELP)
    f, small = font(18), font(16)
    bottom = h - BAR_H
    area_w = int(w * 0.5)
    blit_fitted(surf, draw_env(base), (10, BAR_H + 10, area_w, bottom - BAR_H - 20))
    # Right column: instructions, status, input box.
    x, inner = area_w + 30, w - area_w - 40
    input_h = 2 * f.get_linesize() + 12
    input_top = bottom - 10 - input_h
    status_top = input_top - 2 * f.get_linesize() - 10
    room = max(0, (status_top - BAR_H - 20) // small.get_linesize())
    instructions = getattr(base, "instructions", "") or ""
    blit_lines(
        surf,
        ellipsize(wrap_text(instructions, small, inner, room), room, small, inner),
        small,
        (x, BAR_H + 10),
        COLORS["muted"],
    )
    color = COLORS["warning"] if session.message.startswith("invalid") else COLORS["text"]
    if session.done:
        color = COLORS["correct"] if rec.success else COLORS["incorrect"]
    blit_lines(
        surf, ellipsize(wrap_text(session.message, f, inner, 2), 2, f, inner), f, (x, status_top), color
    )
    hint = (
        "type an answer or actions, then Enter"
        if not session.arrow_actions
        else "arrows, or type actions + Enter"
    )
    blit_lines(surf, [hint], small, (x, input_top - small.get_linesize() - 2), COLORS["muted"])
    box = pg.Rect(x, input_top, inner, input_h)
    pg.draw.rect(surf, COLORS["panel"], box)
    pg.draw.rect(surf, COLORS["panel_edge"], box, 1)
    shown = session.buffer + "_" if not session.done else "(press Enter for a new episode)"
    lines = wrap_text(shown, f, inner - 12)[-2:]
    blit_lines(
        surf, lines, f, (x + 6, input_top + 6), COLORS["text"] if not session.done else COLORS["muted"]
    )
    return surf


def run_play(
    env_id: str,
    *,
    seed: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    size: tuple[int, int] = PLAY_SIZE,
    max_frames: int | None = None,
) -> PlaySession:
    """Open a window and play until Esc (or ``max_frames`` loop iterations, for tests); returns the session."""
    session = PlaySession(env_id, seed=seed, env_kwargs=env_kwargs)
    try:
        run_window(session, draw_play, size=size, title=f"llm-gym: {env_id}", max_frames=max_frames)
    finally:
        session.close()
    return session
