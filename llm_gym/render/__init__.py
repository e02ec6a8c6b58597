"""Rendering for llm-gym: boards, answer cards, the episode viewer, replay and GIF/MP4 export.

pygame is imported lazily (``pip install "llm-gym[render]"``). ``render_frame(env)`` returns an ``HxWx3 uint8``
array drawn on an off-screen Surface and never touches a display; ``show_frame`` shows a frame in a window for
``render_mode="human"``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from llm_gym.render.backend import INSTALL_HINT, require_pygame

if TYPE_CHECKING:
    from llm_gym.render.window import Window

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
