"""``llmgym view``: step through recorded episodes, the board beside the model's reasoning, actions and reward.

The viewer is a small state machine (:class:`ViewerState`, driven by key names or pygame events) and a pure draw
function (:func:`draw_viewer`, state -> Surface), so both run without a window; :func:`run_viewer` only wires
them to a display.

Keys: left/right step a turn, space plays or pauses, up/down (or p/n) change episode, home/end jump to the first
or last turn, PgUp/PgDn and the mouse wheel scroll the reasoning, q or Esc quits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from llm_gym.agent.records import EpisodeRecord
from llm_gym.render.panel import draw_caption, turn_view
from llm_gym.render.text import blit_lines, ellipsize, font, wrap_text
from llm_gym.render.theme import CARD_SIZE, COLORS
from llm_gym.render.window import BAR_H, blit_fitted, run_window, screen_frame

VIEWER_SIZE = (1100, 640)
HELP = "left/right: step   space: play/pause   up/down or p/n: episode   wheel, PgUp/PgDn: scroll   q: quit"
_SCROLL_PAGE = 10
_WHEEL_LINES = 3
#: Frames kept per open episode, and episodes kept open: the viewer's memory does not grow with the number of
#: turns or episodes (a 10,000-turn record drawn up front was 10,001 boards, gigabytes; see docs/security.md).
FRAME_CACHE_SIZE = 16
EPISODE_CACHE_SIZE = 4


class CachedFrames(Sequence):
    """``n`` frames drawn on demand by ``draw(i)``, the ``cache_size`` most recently used kept (LRU).

    ``draw_range(lo, hi)``, when given, yields ``(i, frame)`` for ``lo <= i < hi`` in one pass: a miss below the
    last drawn frame (stepping backwards, where a replay restarts from the reset) then caches the half cache of
    frames before it too, so the next steps back are hits.
    """

    def __init__(
        self,
        n: int,
        draw: Callable[[int], np.ndarray],
        *,
        cache_size: int = FRAME_CACHE_SIZE,
        draw_range: Callable[[int, int], Iterator[tuple[int, np.ndarray]]] | None = None,
        close: Callable[[], None] | None = None,
    ):
        if cache_size < 1:
            raise ValueError(f"cache_size must be positive, got {cache_size}")
        self._n, self._draw, self._draw_range, self._close = int(n), draw, draw_range, close
        self.cache_size = cache_size
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._last = -1
        self.drawn = 0  # frames drawn so far (cache misses), for tests and profiling

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        i = int(i) + (self._n if i < 0 else 0)
        if not 0 <= i < self._n:
            raise IndexError(f"frame {i} out of range ({self._n} frames)")
        if i in self._cache:
            self._cache.move_to_end(i)
            return self._cache[i]
        if self._draw_range is not None and i < self._last:
            for j, f in self._draw_range(max(0, i - self.cache_size // 2 + 1), i + 1):
                self._put(j, f)
        else:
            self._put(i, self._draw(i))
        self._last = i
        self._cache.move_to_end(i)
        return self._cache[i]

    def _put(self, i: int, frame: np.ndarray) -> None:
        self.drawn += 1
        self._cache[i] = frame
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    @property
    def cached(self) -> int:
        return len(self._cache)

    def close(self) -> None:
        self._cache.clear()
        if self._close is not None:
            self._close()


@dataclass
class EpisodeFrames:
    """An episode ready to show: one board frame per state (a list, or frames drawn on demand), and what went
    wrong rebuilding it, if anything."""

    frames: Sequence[np.ndarray]
    problem: str | None = None

    def close(self) -> None:
        """Release what the frames hold (a live env, cached frames)."""
        close = getattr(self.frames, "close", None)
        if callable(close):
            close()


def load_episode(record: EpisodeRecord, env_kwargs: dict | None = None) -> EpisodeFrames:
    """Open ``record`` for viewing: frames are drawn when shown (:class:`CachedFrames` over a
    :class:`~llm_gym.render.replay.ReplayCursor`); when the env cannot be made, the recorded observations are
    shown as text cards, also drawn on demand.

    ``env_kwargs`` come from the user and override the record's (see ``replay_env_args``)."""
    from llm_gym.agent.records import cut_note
    from llm_gym.render.card import draw_text_card
    from llm_gym.render.replay import ReplayCursor
    from llm_gym.render.scene import to_array

    try:
        cursor = ReplayCursor(record, env_kwargs=env_kwargs)
    except Exception as e:  # any env failure must not take the viewer down: fall back to the recorded text

        def card(i: int) -> np.ndarray:
            o = record.initial_observation if i == 0 else record.turns[i - 1].observation
            return to_array(draw_text_card(o, f"recorded (turn {i})", CARD_SIZE))

        return EpisodeFrames(
            CachedFrames(len(record.turns) + 1, card), f"cannot replay ({type(e).__name__}): {e}"
        )
    problem = None if cursor.mismatch is None else f"replay mismatch at {cursor.mismatch}{cut_note(record)}"
    frames = CachedFrames(len(cursor), cursor.draw, draw_range=cursor.draw_range, close=cursor.close)
    return EpisodeFrames(frames, problem)


class ViewerState:
    """Which episode and state are shown, play/pause, and the reasoning scroll position.

    ``turn`` is the state index ``0..n``: state ``i < n`` is the board the model saw before turn ``i + 1``,
    shown with that turn's reasoning, actions and reward; state ``n`` is the final board and the outcome.

    ``handle_key`` takes key names (``"left"``, ``"right"``, ``"space"``, ``"up"``, ``"down"``, ``"n"``,
    ``"p"``, ``"home"``, ``"end"``, ``"pageup"``, ``"pagedown"``, ``"q"``, ``"escape"``); unknown names are
    ignored. ``tick(dt)`` advances one turn every ``1 / fps`` seconds while playing. ``version`` increases on
    every visible change, so a window redraws only when needed.
    """

    def __init__(
        self,
        records: Sequence[EpisodeRecord],
        *,
        fps: float = 2.0,
        episode: int = 0,
        loader: Callable[[EpisodeRecord], EpisodeFrames] = load_episode,
    ):
        if not records:
            raise ValueError("no episodes to view")
        if not fps > 0:
            raise ValueError(f"fps must be positive, got {fps}")
        if not 0 <= episode < len(records):
            raise ValueError(f"episode index must be in [0, {len(records) - 1}], got {episode}")
        # a Sequence is kept as is: a RecordFile reads each episode when it is shown
        self.records = records if isinstance(records, Sequence) else list(records)
        self.fps = float(fps)
        self.episode = episode
        self.turn = 0
        self.playing = False
        self.scroll = 0
        self.max_scroll = 0
        self.running = True
        self.version = 0
        self._loader = loader
        self._loaded: OrderedDict[int, EpisodeFrames] = OrderedDict()  # LRU of open episodes
        self._clock = 0.0

    # ------------------------------------------------------------------ queries
    @property
    def record(self) -> EpisodeRecord:
        return self.records[self.episode]

    @property
    def n_turns(self) -> int:
        return len(self.record.turns)

    def episode_frames(self) -> EpisodeFrames:
        """The current episode's frames (opened on first use; the last ``EPISODE_CACHE_SIZE`` stay open)."""
        if self.episode in self._loaded:
            self._loaded.move_to_end(self.episode)
        else:
            self._loaded[self.episode] = self._loader(self.record)
            while len(self._loaded) > EPISODE_CACHE_SIZE:
                _, old = self._loaded.popitem(last=False)
                if hasattr(old, "close"):
                    old.close()
        return self._loaded[self.episode]

    def close(self) -> None:
        """Release every open episode (live envs, cached frames)."""
        while self._loaded:
            _, old = self._loaded.popitem(last=False)
            if hasattr(old, "close"):
                old.close()

    # ------------------------------------------------------------------ transitions
    def _changed(self) -> None:
        self.version += 1

    def _go_turn(self, turn: int) -> None:
        turn = min(max(0, turn), self.n_turns)
        if turn != self.turn:
            self.turn = turn
            self.scroll = 0
            self.max_scroll = 0
            self._changed()

    def _go_episode(self, episode: int) -> None:
        episode = min(max(0, episode), len(self.records) - 1)
        if episode != self.episode:
            self.episode = episode
            self.turn = 0
            self.scroll = 0
            self.max_scroll = 0
            self.playing = False
            self._clock = 0.0
            self._changed()

    def scroll_by(self, lines: int) -> None:
        new = min(max(0, self.scroll + lines), self.max_scroll)
        if new != self.scroll:
            self.scroll = new
            self._changed()

    def set_scroll_limit(self, max_scroll: int) -> None:
        """Called by the draw function once it knows how many reasoning lines are hidden."""
        self.max_scroll = max(0, int(max_scroll))
        self.scroll = min(self.scroll, self.max_scroll)

    def handle_key(self, key: str) -> None:
        key = key.lower()
        if key in ("q", "escape"):
            self.running = False
        elif key == "right":
            self.playing = False
            self._go_turn(self.turn + 1)
        elif key == "left":
            self.playing = False
            self._go_turn(self.turn - 1)
        elif key == "space":
            if not self.playing and self.turn >= self.n_turns:
                self._go_turn(0)  # play again from the start
            self.playing = not self.playing
            self._clock = 0.0
            self._changed()
        elif key in ("down", "n"):
            self._go_episode(self.episode + 1)
        elif key in ("up", "p"):
            self._go_episode(self.episode - 1)
        elif key == "home":
            self._go_turn(0)
        elif key == "end":
            self._go_turn(self.n_turns)
        elif key == "pagedown":
            self.scroll_by(_SCROLL_PAGE)
        elif key == "pageup":
            self.scroll_by(-_SCROLL_PAGE)

    def handle_event(self, event) -> None:
        """Apply a pygame event (key press, mouse wheel, window close)."""
        from llm_gym.render.backend import require_pygame

        pygame = require_pygame()
        if event.type == pygame.QUIT:
            self.running = False
        elif event.type == pygame.KEYDOWN:
            self.handle_key(_key_names().get(event.key) or pygame.key.name(event.key))
        elif event.type == pygame.MOUSEWHEEL:
            self.scroll_by(-event.y * _WHEEL_LINES)

    def tick(self, dt: float) -> None:
        """Advance time by ``dt`` seconds; while playing, one turn per ``1 / fps`` seconds, pausing at the end."""
        if not self.playing:
            return
        self._clock += max(0.0, dt)
        period = 1.0 / self.fps
        while self._clock >= period and self.playing:
            self._clock -= period
            if self.turn >= self.n_turns:
                self.playing = False
                self._changed()
            else:
                self._go_turn(self.turn + 1)
                if self.turn >= self.n_turns:
                    self.playing = False


@lru_cache(maxsize=1)
def _key_names() -> dict[int, str]:
    """pygame key codes -> the names :meth:`ViewerState.handle_key` takes (pygame's own names have spaces)."""
    import pygame

    return {
        pygame.K_LEFT: "left",
        pygame.K_RIGHT: "right",
        pygame.K_UP: "up",
        pygame.K_DOWN: "down",
        pygame.K_SPACE: "space",
        pygame.K_ESCAPE: "escape",
        pygame.K_PAGEUP: "pageup",
        pygame.K_PAGEDOWN: "pagedown",
        pygame.K_HOME: "home",
        pygame.K_END: "end",
    }


def draw_viewer(state: ViewerState, size: tuple[int, int] = VIEWER_SIZE):
    """The whole viewer screen for ``state`` as a Surface (no display needed); updates the scroll limit."""
    from llm_gym.render.backend import require_pygame
    from llm_gym.render.scene import from_array

    pg = require_pygame()
    w, h = size
    rec = state.record
    seed = "none" if rec.seed is None else rec.seed
    result = "solved" if rec.success else "not solved"
    top = (
        f"Episode {state.episode + 1}/{len(state.records)}   {rec.env_id}   seed {seed}   "
        f"{len(rec.turns)} turns   total reward {rec.total_reward:+.2f}   {result}"
        + ("   [playing]" if state.playing else "")
    )
    surf = screen_frame(size, top, HELP)
    data = state.episode_frames()
    y0 = BAR_H
    if data.problem:
        f = font(18)
        lines = ellipsize(wrap_text(data.problem, f, w - 20, 2), 2, f, w - 20)
        pg.draw.rect(surf, COLORS["highlight"], (0, y0, w, 8 + f.get_linesize() * len(lines)))
        y0 = blit_lines(surf, lines, f, (10, y0 + 4), COLORS["warning"]) + 4
    bottom = h - BAR_H
    # Left: the board, scaled down only if it does not fit.
    frame = data.frames[min(state.turn, len(data.frames) - 1)]
    area_w = int(w * 0.45)
    blit_fitted(surf, from_array(frame), (10, y0 + 10, area_w, bottom - y0 - 20))
    # Right: the caption with scrollable reasoning.
    caption, max_scroll = draw_caption(
        turn_view(rec, state.turn), (w - area_w - 30, bottom - y0 - 20), scroll=state.scroll
    )
    state.set_scroll_limit(max_scroll)
    surf.blit(caption, (area_w + 20, y0 + 10))
    return surf


def run_viewer(
    records: Sequence[EpisodeRecord],
    *,
    fps: float = 2.0,
    episode: int = 0,
    size: tuple[int, int] = VIEWER_SIZE,
    max_frames: int | None = None,
    env_kwargs: dict | None = None,
) -> ViewerState:
    """Open a window and run the viewer until the user quits (or ``max_frames`` loop iterations, for tests).

    ``env_kwargs``: the user's kwargs for replaying, overriding the records' (file paths are only taken from here).
    """
    loader = load_episode if env_kwargs is None else (lambda rec: load_episode(rec, env_kwargs))
    state = ViewerState(records, fps=fps, episode=episode, loader=loader)
    try:
        run_window(state, draw_viewer, size=size, title="llm-gym viewer", max_frames=max_frames)
    finally:
        state.close()
    return state
