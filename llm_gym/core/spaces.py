"""Text spaces for LLM environments.

Gymnasium's ``Text`` defaults to an alphanumeric charset, which rejects spaces, newlines and board glyphs.
Observations use ``Text`` with an explicit charset; actions use :class:`AnyText`, because an action is the raw
LLM response and may contain any unicode character.
"""

from __future__ import annotations

import string
from typing import Any

from gymnasium.spaces import Text

#: Printable ASCII (letters, digits, punctuation, space, tab, newline) plus glyphs used by RAGEN boards.
BASE_CHARSET = "".join(sorted(set(string.printable) - {"\x0b", "\x0c", "\r"})) + "√"


def text_space(max_length: int, extra_glyphs: str = "", *, min_length: int = 0) -> Text:
    """A ``Text`` space whose charset covers printable ASCII, ``√`` and ``extra_glyphs``."""
    charset = BASE_CHARSET + "".join(sorted(set(extra_glyphs) - set(BASE_CHARSET)))
    return Text(max_length=max_length, min_length=min_length, charset=charset)


class AnyText(Text):
    """A text space that contains every ``str`` up to ``max_length`` characters.

    ``sample()`` draws from the (printable) charset as ``Text`` does; ``contains`` accepts any unicode, since an
    LLM may print anything. Vectorised envs with shared memory need charset-only text: use
    ``vector_kwargs={"shared_memory": False}`` with ``AsyncVectorEnv`` when actions may hold other characters.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, charset: str = BASE_CHARSET, seed=None):
        super().__init__(max_length=max_length, min_length=min_length, charset=charset, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"
