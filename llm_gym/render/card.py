"""Cards for answer environments (question, answer, verdict) and the plain-text fallback for any other env."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from llm_gym.render.text import blit_lines, ellipsize, font, wrap_text
from llm_gym.render.theme import CARD_SIZE, COLORS, Color

_PAD = 12
_TITLE_H = 34


def verdict_color(verdict: str) -> Color:
    """Green for a correct verdict, red for an incorrect one, grey before any answer, text colour otherwise."""
    v = verdict.strip().lower()
    if not v:
        return COLORS["pending"]
    if v.startswith(("incorrect", "wrong", "invalid", "fail")):
        return COLORS["incorrect"]
    if v.startswith(("correct", "right", "success", "solved")):
        return COLORS["correct"]
    return COLORS["text"]


def _frame(title: str, size: tuple[int, int]):
    from llm_gym.render.backend import require_pygame

    pg = require_pygame()
    w, h = size
    if w < 4 * _PAD or h < _TITLE_H + 2 * _PAD:
        raise ValueError(f"card size {size} is too small")
    surf = pg.Surface((w, h))
    surf.fill(COLORS["background"])
    pg.draw.rect(surf, COLORS["title_bar"], (0, 0, w, _TITLE_H))
    pg.draw.rect(surf, COLORS["panel_edge"], (0, 0, w, h), 1)
    f = font(22, bold=True)
    lines = ellipsize(wrap_text(title, f, w - 2 * _PAD, 1), 1, f, w - 2 * _PAD)
    blit_lines(surf, lines, f, (_PAD, (_TITLE_H - f.get_height()) // 2), COLORS["title_text"])
    return pg, surf


def draw_card(card: Mapping[str, str], size: tuple[int, int] = CARD_SIZE):
    """A card with ``card['title']``, the question, the last answer and the verdict (long text wrapped and cut).

    Missing keys are shown as empty; the layout is fixed, so every card of one size has the same geometry.
    Returns a new Surface (drawing is cached: a card only changes when an answer is given)."""
    keys = ("title", "question", "answer", "verdict")
    text = tuple(str(card.get(k, "") or "") for k in keys)
    return _card_surface(*text, tuple(size)).copy()


@lru_cache(maxsize=32)
def _card_surface(title: str, question: str, answer: str, verdict: str, size: tuple[int, int]):
    pg, surf = _frame(title, size)
    w, h = size
    inner = w - 2 * _PAD
    body, label = font(20), font(16, bold=True)
    answer_h = 2 * body.get_linesize() + 12
    verdict_h = body.get_linesize() + 12
    answer_top = h - _PAD - verdict_h - 8 - answer_h
    # Question: everything between the title bar and the answer box.
    y = blit_lines(surf, ["QUESTION"], label, (_PAD, _TITLE_H + 8), COLORS["muted"])
    room = max(0, (answer_top - 20 - y) // body.get_linesize())
    blit_lines(surf, ellipsize(wrap_text(question, body, inner, room), room, body, inner), body, (_PAD, y))
    # Answer box.
    blit_lines(surf, ["ANSWER"], label, (_PAD, answer_top - label.get_linesize()), COLORS["muted"])
    box = pg.Rect(_PAD, answer_top, inner, answer_h)
    pg.draw.rect(surf, COLORS["panel"], box)
    pg.draw.rect(surf, COLORS["panel_edge"], box, 1)
    shown = answer if answer else "(no answer yet)"
    color = COLORS["text"] if answer else COLORS["muted"]
    lines = ellipsize(wrap_text(shown, body, inner - 12, 2), 2, body, inner - 12)
    blit_lines(surf, lines, body, (_PAD + 6, answer_top + 6), color)
    # Verdict pill.
    pill = pg.Rect(_PAD, h - _PAD - verdict_h, inner, verdict_h)
    vcolor = verdict_color(verdict)
    pg.draw.rect(surf, vcolor, pill, border_radius=6)
    text = verdict if verdict else "waiting for an answer"
    line = ellipsize(wrap_text(text, body, inner - 12, 1), 1, body, inner - 12)
    blit_lines(surf, line, body, (_PAD + 6, pill.y + 6), COLORS["title_text"])
    return surf


def draw_text_card(text: str, title: str = "observation", size: tuple[int, int] = CARD_SIZE):
    """A fixed-size card showing ``text`` (wrapped, cut with an ellipsis when it does not fit)."""
    _, surf = _frame(title, size)
    w, h = size
    body = font(20)
    room = max(1, (h - _TITLE_H - 2 * _PAD) // body.get_linesize())
    lines = ellipsize(wrap_text(text, body, w - 2 * _PAD, room), room, body, w - 2 * _PAD)
    blit_lines(surf, lines, body, (_PAD, _TITLE_H + _PAD))
    return surf
