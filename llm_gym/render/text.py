"""Text helpers: cached fonts, word wrapping that never overflows, and blitting wrapped lines."""

from __future__ import annotations

from llm_gym.render.backend import on_font_init, require_pygame
from llm_gym.render.theme import COLORS, Color

_FONTS: dict[int, object] = {}
on_font_init(_FONTS.clear)


def font(size: int = 20, bold: bool = False):
    """pygame's bundled default font at ``size`` (cached; needs only ``pygame.font``, never the display).

    The bundled font is already bold-ish; ``bold`` only makes headings a size larger (synthetic bold smears
    letters together at small sizes)."""
    pg = require_pygame()
    key = size + 2 if bold else size
    if key not in _FONTS:
        _FONTS[key] = pg.font.Font(None, key)
    return _FONTS[key]


def _split_long_word(word: str, fnt, width: int) -> list[str]:
    pieces, current = [], ""
    for ch in word:
        if current and fnt.size(current + ch)[0] > width:
            pieces.append(current)
            current = ch
        else:
            current += ch
    if current:
        pieces.append(current)
    return pieces


def clean(text: object) -> str:
    """``text`` as a str pygame can render: tabs expanded, other control characters and lone surrogates replaced."""
    s = str(text).replace("\r\n", "\n").replace("\t", "    ")
    return "".join(
        ch if (ch == "\n" or (ord(ch) >= 32 and not 0xD800 <= ord(ch) <= 0xDFFF)) else "?" for ch in s
    )


def wrap_text(text: str, fnt, width: int, max_lines: int | None = None) -> list[str]:
    """Lines of ``text`` that each fit in ``width`` pixels; keeps explicit newlines, splits over-long words.

    With ``max_lines``, only the start of ``text`` is wrapped (cost independent of its length) and at most
    ``max_lines + 1`` lines come back: more than ``max_lines`` means the text goes on (see :func:`ellipsize`)."""
    if width <= 0:
        raise ValueError(f"wrap width must be positive, got {width}")
    text = str(text)
    cut = False
    if max_lines is not None:
        # A visible glyph is at least a pixel wide, so max_lines + 1 lines (each with its break: a space or
        # "\r\n") hold at most this many characters; zero-width marks or long space runs only cut earlier.
        budget = (max(0, max_lines) + 1) * (width + 2)
        cut = len(text) > budget
        text = text[:budget]
    out: list[str] = []
    for para in clean(text).split("\n"):
        line = ""
        for word in para.split(" "):
            candidate = f"{line} {word}" if line else word
            if fnt.size(candidate)[0] <= width:
                line = candidate
                continue
            if line:
                out.append(line)
            if fnt.size(word)[0] <= width:
                line = word
            else:
                *full, line = _split_long_word(word, fnt, width) or [""]
                out.extend(full)
        out.append(line)
    if max_lines is None:
        return out
    if cut and len(out) <= max_lines:
        out.append("")  # the text was cut: mark that it goes on
    return out[: max(0, max_lines) + 1]


def ellipsize(lines: list[str], max_lines: int, fnt, width: int) -> list[str]:
    """At most ``max_lines`` lines; when text is cut, the last kept line ends with an ellipsis."""
    if max_lines <= 0:
        return []
    if len(lines) <= max_lines:
        return lines
    kept = lines[:max_lines]
    last = kept[-1].rstrip()
    while last and fnt.size(last + " ...")[0] > width:
        last = last[:-1]
    kept[-1] = last + " ..."
    return kept


def blit_lines(surface, lines: list[str], fnt, pos: tuple[int, int], color: Color = COLORS["text"]) -> int:
    """Draw ``lines`` from ``pos`` downwards; returns the y just below the last line."""
    x, y = pos
    step = fnt.get_linesize()
    for line in lines:
        if line:
            surface.blit(fnt.render(line, True, color), (x, y))
        y += step
    return y
