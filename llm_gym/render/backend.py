"""pygame, imported lazily with an install hint: the one module of ``llm_gym.render`` every other one may import.

Nothing here imports pygame at module import, so ``import llm_gym.render`` works without the ``render`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Callable

INSTALL_HINT = 'pygame is not installed; run `pip install "llm-gym[render]"`'

#: Called whenever ``pygame.font`` is (re)initialised: Font objects from before a ``pygame.quit()`` are dead
#: and using one crashes the interpreter, so caches of them register their ``clear`` here.
_ON_FONT_INIT: list[Callable[[], None]] = []


def on_font_init(clear: Callable[[], None]) -> None:
    """Register ``clear`` to run whenever ``pygame.font`` is (re)initialised (for caches of Font objects)."""
    _ON_FONT_INIT.append(clear)


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
