"""Rendering for llm-gym: boards, answer cards, the episode viewer, replay and GIF/MP4 export.

pygame is imported lazily (``pip install "llm-gym[render]"``). ``render_frame(env)`` returns an ``HxWx3 uint8``
array drawn on an off-screen Surface and never touches a display; ``show_frame`` shows a frame in a window for
``render_mode="human"``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from llm_gym.render.window import Window

INSTALL_HINT = 'pygame is not installed; run `pip install "llm-gym[render]"`'

#: Called whenever ``pygame.font`` is (re)initialised: Font objects from before a ``pygame.quit()`` are dead
#: and using one crashes the interpreter, so caches of them register their ``clear`` here.
_ON_FONT_INIT: list[Callable[[], None]] = []


def require_pygame():
    """Import pygame (and initialise its font module), or raise ``DependencyNotInstalled`` with an install hint.

    Only ``pygame.font`` is initialised: never the display, so ``rgb_array`` rendering works headless."""
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    try:
        import pygame
    except ImportError as e:
        from gymnasium.error import DependencyNotInstalled

        raise DependencyNotInstalled(INSTALL_HINT) from e
    if not pygame.font.get_init():
        pygame.font.init()
        for clear in _ON_FONT_INIT:
            clear()
    return pygame


_scratch = threading.local()


def render_frame(env: Any) -> np.ndarray:
    """An RGB frame (``HxWx3 uint8``) of ``env``'s current state, drawn off-screen."""
    from llm_gym.render.scene import draw_env, to_array

    # The frame is copied out at once, so one scratch Surface per thread can be reused across frames.
    surface = draw_env(env, target=getattr(_scratch, "surface", None))
    _scratch.surface = surface
    return to_array(surface)


def show_frame(frame: np.ndarray, window: Window | None, fps: int = 4) -> Window:
    """Blit ``frame`` into ``window`` (created or resized as needed), wait for ``fps``, return the window."""
    from llm_gym.render.scene import from_array
    from llm_gym.render.window import Window

    size = (frame.shape[1], frame.shape[0])
    if window is None or window.size != size:
        if window is not None:
            window.close()
        window = Window(size)
    window.pump()
    window.show(from_array(frame))
    window.tick(fps)
    return window


__all__ = ["INSTALL_HINT", "render_frame", "require_pygame", "show_frame"]
