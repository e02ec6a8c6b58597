"""Parse an LLM response into actions.

The format follows RAGEN: ``<think>...</think><answer>a1 || a2</answer>`` (or only ``<answer>...</answer>`` when
thinking is off). Parsing is linear in the text length (no backtracking regex), case-insensitive in the tags,
tolerant of whitespace and of chatter before, between and after the blocks, and never raises.
"""

from __future__ import annotations

from typing import NamedTuple

ACTION_SEP = "||"

# ASCII-only lowering keeps indices aligned with the original text (str.lower can change the length, e.g. "İ").
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


class ParsedResponse(NamedTuple):
    """What :func:`parse_response` found.

    ``ok`` is False when the required tags are missing or the answer is empty; ``error`` then says why.
    ``actions`` are the stripped, non-empty answer parts (at most ``max_actions``); ``dropped`` counts the parts
    beyond that cap.
    """

    ok: bool
    think: str = ""
    answer: str = ""
    actions: tuple[str, ...] = ()
    dropped: int = 0
    error: str | None = None


def parse_response(
    text: str,
    *,
    think: bool = True,
    max_actions: int | None = None,
    sep: str | None = ACTION_SEP,
) -> ParsedResponse:
    """Split an LLM response into its reasoning and its actions.

    Args:
        text: the raw response. Anything that is not a ``str`` is a format error.
        think: require a ``<think>`` block before the ``<answer>`` block.
        max_actions: keep at most this many actions (the rest are counted in ``dropped``); ``None`` keeps all.
        sep: the action separator; ``None`` treats the whole answer as one action (answer environments).
    """
    if not isinstance(text, str):
        return ParsedResponse(ok=False, error=f"response must be a str, got {type(text).__name__}")
    lower = text.lower() if text.isascii() else text.translate(_ASCII_LOWER)
    thought = ""
    start = 0
    if think:
        i = lower.find("<think>")
        j = lower.find("</think>", i + 7) if i >= 0 else -1
        if j < 0:
            return ParsedResponse(ok=False, error="missing <think>...</think> block")
        thought, start = text[i + 7 : j], j + 8
    i = lower.find("<answer>", start)
    j = lower.find("</answer>", i + 8) if i >= 0 else -1
    if j < 0:
        return ParsedResponse(ok=False, think=thought.strip(), error="missing <answer>...</answer> block")
    answer = text[i + 8 : j].strip()
    parts = [p.strip() for p in answer.split(sep)] if sep else [answer]
    parts = [p for p in parts if p]
    if not parts:
        return ParsedResponse(ok=False, think=thought.strip(), answer=answer, error="empty answer")
    dropped = 0
    if max_actions is not None and len(parts) > max_actions:
        dropped = len(parts) - max_actions
        parts = parts[:max_actions]
    return ParsedResponse(
        ok=True, think=thought.strip(), answer=answer, actions=tuple(parts), dropped=dropped
    )


def format_response(actions, think: str = "", *, use_think: bool = True, sep: str = ACTION_SEP) -> str:
    """The canonical response text for ``actions`` (inverse of :func:`parse_response`)."""
    if isinstance(actions, str):
        actions = [actions]
    answer = f"<answer>{f' {sep} '.join(actions)}</answer>"
    return f"<think>{think}</think>{answer}" if use_think else answer
