"""The one window module: a display window, its event loop, and the screen frame shared by viewer and play.

Everything that opens a display goes through :class:`Window` (``render_mode="human"``, ``llmgym view``,
``llmgym play``); :func:`run_window` is the loop of the two interactive tools, :func:`screen_frame` and
:func:`blit_fitted` the layout they share (title bar, key-help bar, a board scaled into its area). Drawing stays
in pure functions (state -> Surface), so everything but :class:`Window` works headless.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from llm_gym.render.text import blit_lines, ellipsize, font, wrap_text
from llm_gym.render.theme import COLORS, Color

#: Height of the title bar and of the key-help bar.
BAR_H = 30
#: The smallest screen the viewer and play layouts fit in.
MIN_SIZE = (400, 240)


class Window:
    """A display window of ``size`` pixels titled ``title`` (initialises only the pygame display)."""

    def __init__(self, size: tuple[int, int], title: str = "llm-gym"):
        from llm_gym.render.backend import require_pygame

        pygame = require_pygame()
        pygame.display.init()
        self.pygame = pygame
        self.screen = pygame.display.set_mode(size)
        pygame.display.set_caption(title)
        self.clock = pygame.time.Clock()

    @property
    def size(self) -> tuple[int, int]:
        return self.screen.get_size()

    def show(self, surface: Any) -> None:
        """Blit ``surface`` at the top left and flip the display."""
        self.screen.blit(surface, (0, 0))
        self.pygame.display.flip()

    def events(self) -> list:
        return self.pygame.event.get()

    def pump(self) -> None:
        """Keep the window responsive without consuming events (for ``render_mode="human"``)."""
        self.pygame.event.pump()

    def tick(self, fps: float) -> float:
        """Wait so that at most ``fps`` frames pass per second; returns the seconds since the last tick."""
        return self.clock.tick(fps) / 1000.0

    def close(self) -> None:
        self.pygame.display.quit()


class App(Protocol):
    """What :func:`run_window` drives: ``version`` increases on every visible change."""

    running: bool
    version: int

    def handle_event(self, event: Any) -> None: ...


def run_window(
    app: App,
    draw: Callable[[Any, tuple[int, int]], Any],
    *,
    size: tuple[int, int],
    title: str,
    max_frames: int | None = None,
    fps: float = 30,
) -> None:
    """Open a window and loop until ``app.running`` is false (or ``max_frames`` iterations, for tests).

    Each iteration hands every pending event to ``app.handle_event``, advances ``app.tick(dt)`` when the app has
    one, and redraws with ``draw(app, size)`` only when ``app.version`` changed. The display is closed on exit,
    also on errors.
    """
    window = Window(size, title)
    try:
        tick = getattr(app, "tick", None)
        drawn, frames = -1, 0
        while app.running and (max_frames is None or frames < max_frames):
            for event in window.events():
                app.handle_event(event)
            dt = window.tick(fps)
            if tick is not None:
                tick(dt)
            if drawn != app.version:
                # Drawing may adjust state (the viewer clamps its scroll); take the version after it so that
                # adjustment does not force another redraw.
                window.show(draw(app, size))
                drawn = app.version
            frames += 1
    finally:
        window.close()


def screen_frame(size: tuple[int, int], title: str, help_text: str, *, title_color: Color | None = None):
    """A background Surface of ``size`` with the title bar (``title``) and the bottom key-help bar.

    Raises ``ValueError`` when ``size`` is below :data:`MIN_SIZE`. The free area is ``BAR_H`` to
    ``size[1] - BAR_H``.
    """
    from llm_gym.render.backend import require_pygame

    pg = require_pygame()
    w, h = size
    if w < MIN_SIZE[0] or h < MIN_SIZE[1]:
        raise ValueError(f"window size {size} is too small (at least {MIN_SIZE[0]}x{MIN_SIZE[1]})")
    surf = pg.Surface(size)
    surf.fill(COLORS["background"])
    pg.draw.rect(surf, COLORS["title_bar"], (0, 0, w, BAR_H))
    f = font(18)
    lines = ellipsize(wrap_text(title, f, w - 20, 1), 1, f, w - 20)
    blit_lines(surf, lines, f, (10, 8), title_color or COLORS["title_text"])
    bottom = h - BAR_H
    pg.draw.rect(surf, COLORS["panel_edge"], (0, bottom, w, BAR_H))
    small = font(16)
    blit_lines(surf, ellipsize([help_text], 1, small, w - 20), small, (10, bottom + 9), COLORS["text"])
    return surf


def blit_fitted(surface: Any, image: Any, area: tuple[int, int, int, int]) -> None:
    """Blit ``image`` centred in ``area`` (x, y, width, height), scaled down (never up) to fit."""
    from llm_gym.render.backend import require_pygame

    pg = require_pygame()
    x, y, area_w, area_h = area
    iw, ih = image.get_size()
    scale = min(1.0, area_w / iw, area_h / ih) if iw and ih else 1.0
    if scale < 1.0:
        image = pg.transform.smoothscale(image, (max(1, int(iw * scale)), max(1, int(ih * scale))))
        iw, ih = image.get_size()
    surface.blit(image, (x + (area_w - iw) // 2, y + (area_h - ih) // 2))


__all__ = ["BAR_H", "MIN_SIZE", "App", "Window", "blit_fitted", "run_window", "screen_frame"]
