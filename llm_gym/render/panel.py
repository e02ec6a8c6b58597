"""The caption beside a board: turn, the model's reasoning (wrapped, scrollable), actions and reward."""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_gym.agent.records import EpisodeRecord
from llm_gym.core.parsing import parse_response
from llm_gym.render.text import blit_lines, ellipsize, font, wrap_text
from llm_gym.render.theme import COLORS

_PAD = 10


@dataclass(frozen=True)
class TurnView:
    """What the caption beside state ``state`` of an episode shows.

    State ``i < n`` is the board the model saw before turn ``i + 1``: the caption shows that turn's reasoning,
    actions and reward. State ``n`` is the final board: the caption shows the outcome (``final``)."""

    state: int
    n_turns: int
    reasoning: str = ""
    actions: tuple[str, ...] = ()
    reward: float = 0.0
    total_reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    status: str = ""
    final: bool = False


#: Longest reasoning shown in a caption, in characters: a caption holds a few hundred lines at most, and wrapping
#: 50 MB of text took minutes.
REASONING_MAX_CHARS = 20_000


def _capped(text: str) -> str:
    if len(text) <= REASONING_MAX_CHARS:
        return text
    return f"{text[:REASONING_MAX_CHARS]}\n[... {len(text) - REASONING_MAX_CHARS} more characters not shown]"


def _reasoning(response: str) -> str:
    parsed = parse_response(response, think=True, sep=None)
    if parsed.think:
        return _capped(parsed.think)
    if parsed.ok:
        return "(no reasoning)"
    return _capped(response)  # unparsable: show the raw text, which is what went wrong


def turn_view(record: EpisodeRecord, state: int) -> TurnView:
    """The caption content beside state ``state`` (``0 <= state <= len(record.turns)``)."""
    n = len(record.turns)
    if not 0 <= state <= n:
        raise ValueError(f"state must be in [0, {n}], got {state}")
    total = sum(float(t.reward) for t in record.turns[: state + 1])
    if state == n:
        last = record.turns[-1] if record.turns else None
        if last is None:
            status = "no turns"
        elif last.terminated:
            status = "solved" if (last.info or {}).get("success") else "ended"
        elif last.truncated:
            status = "truncated"
        else:
            status = "unfinished"
        text = (
            f"End of the episode after {n} turn{'s' if n != 1 else ''}: {status}, total reward {total:+.2f}."
        )
        return TurnView(state, n, text, total_reward=total, status=status, final=True)
    rec = record.turns[state]
    info = rec.info or {}
    error = info.get("error") if not info.get("action_is_valid", True) else None
    components = {k: float(v) for k, v in (rec.reward_components or {}).items() if float(v) != 0.0}
    return TurnView(
        state,
        n,
        _reasoning(rec.response),
        tuple(str(a) for a in rec.actions),
        float(rec.reward),
        total,
        components,
        None if error is None else str(error),
    )


def _fmt(x: float) -> str:
    return f"{x:+.2f}"


def draw_caption(view: TurnView, size: tuple[int, int], *, scroll: int = 0, font_size: int = 18):
    """Draw the caption for ``view`` into a new ``size`` Surface.

    Returns ``(surface, max_scroll)``: ``scroll`` skips that many reasoning lines (clamped), ``max_scroll`` is
    how many lines are hidden below when ``scroll`` is 0 (0 when all the reasoning fits)."""
    from llm_gym.render.backend import require_pygame

    pg = require_pygame()
    w, h = size
    surf = pg.Surface((w, h))
    surf.fill(COLORS["panel"])
    pg.draw.line(surf, COLORS["panel_edge"], (0, 0), (0, h), 1)
    body, bold, small = font(font_size), font(font_size, bold=True), font(max(12, font_size - 3), bold=True)
    inner = w - 2 * _PAD
    y = _PAD
    head = f"Turn {view.state + 1}/{view.n_turns}" if not view.final else f"End  [{view.status}]"
    y = blit_lines(surf, ellipsize(wrap_text(head, bold, inner, 1), 1, bold, inner), bold, (_PAD, y))
    # The bottom block (actions, reward, error) has a fixed place; reasoning fills the space above it.
    bottom: list[tuple[str, tuple[int, int, int]]] = []
    if not view.final:
        acts = ", ".join(view.actions) if view.actions else "(none executed)"
        bottom.append((f"Actions: {acts}", COLORS["text"]))
        reward = f"Reward: {_fmt(view.reward)}  (total {_fmt(view.total_reward)})"
        if view.components:
            reward += "  " + ", ".join(f"{k} {_fmt(v)}" for k, v in view.components.items())
        bottom.append((reward, COLORS["text"]))
        if view.error:
            bottom.append((f"Invalid: {view.error}", COLORS["warning"]))
    bottom_lines: list[tuple[str, tuple[int, int, int]]] = []
    for text, color in bottom:
        bottom_lines += [(line, color) for line in ellipsize(wrap_text(text, body, inner, 2), 2, body, inner)]
    step = body.get_linesize()
    bottom_top = h - _PAD - step * len(bottom_lines)
    for i, (line, color) in enumerate(bottom_lines):
        blit_lines(surf, [line], body, (_PAD, bottom_top + i * step), color)
    label = "RESULT" if view.final else "REASONING"
    y = blit_lines(surf, [label], small, (_PAD, y + 4), COLORS["muted"])
    lines = wrap_text(view.reasoning, body, inner)
    room = max(0, (bottom_top - 6 - y) // step)
    max_scroll = max(0, len(lines) - room)
    scroll = min(max(0, scroll), max_scroll)
    shown = lines[scroll : scroll + room]
    blit_lines(surf, shown, body, (_PAD, y))
    if max_scroll and room:
        # A thin scroll bar so the reader knows there is more.
        track_h = room * step
        bar_h = max(8, track_h * room // len(lines))
        bar_y = y + (track_h - bar_h) * scroll // max_scroll
        pg.draw.rect(surf, COLORS["panel_edge"], (w - 5, y, 3, track_h))
        pg.draw.rect(surf, COLORS["muted"], (w - 5, bar_y, 3, bar_h))
    return surf, max_scroll


def compose(board, caption):
    """``board`` and ``caption`` side by side on one Surface (height of the taller, board vertically centred)."""
    from llm_gym.render.backend import require_pygame

    pg = require_pygame()
    bw, bh = board.get_size()
    cw, ch = caption.get_size()
    out = pg.Surface((bw + cw, max(bh, ch)))
    out.fill(COLORS["background"])
    out.blit(board, (0, (out.get_height() - bh) // 2))
    out.blit(caption, (bw, 0))
    return out
