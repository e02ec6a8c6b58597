"""The type checks behind llm-gym's argument validation (envs, agent, render, trainer): one definition of "an
integer" and "a number", so that every check refuses the same values.

Python's ``bool`` is a subclass of ``int`` (``True == 1``), but a flag is never a count, a size or a seed: both
helpers refuse it. Each caller keeps its own range check and error message.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import numpy as np


def is_int(value: Any, *, numpy: bool = True) -> TypeGuard[int]:
    """Whether ``value`` is an integer: an ``int`` or (unless ``numpy=False``) a numpy integer, never a ``bool``.

    ``numpy=False`` where the value is stored as JSON or passed to code that needs a Python ``int``."""
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, np.integer)) if numpy else isinstance(value, int)


def is_number(value: Any) -> TypeGuard[int | float]:
    """Whether ``value`` is an ``int`` or a ``float``, never a ``bool`` (finiteness is the caller's check)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


__all__ = ["is_int", "is_number"]
