"""Parse an LLM response into actions.

The format follows RAGEN: ``<think>...</think><answer>a1 || a2</answer>`` (or only ``<answer>...</answer>`` when
thinking is off). Parsing is linear in the text length (no backtracking regex), case-insensitive in the tags,
tolerant of whitespace and of chatter before, between and after the blocks, and never raises.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

ACTION_SEP = "||"

#: Longest response read, in characters (about 250k tokens, beyond any generation limit). Longer text is a format
#: error decided from its length alone, so a hostile 100 MB reply costs O(1) time and no copy.
RESPONSE_MAX_LENGTH = 1_000_000

# Case-insensitive in ASCII only (like the tags' spelling): no lowered copy of the text is made, and non-ASCII
# letters that fold to ASCII (the Kelvin sign) never match. re searches a literal in linear time.
_TAGS = {
    tag: re.compile(re.escape(tag), re.IGNORECASE | re.ASCII)
    for tag in ("<think>", "</think>", "<answer>", "</answer>")
}


def _find(tag: str, text: str, start: int = 0) -> int:
    m = _TAGS[tag].search(text, start)
    return m.start() if m else -1


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
        text: the raw response. Anything that is not a ``str``, and text longer than
            :data:`RESPONSE_MAX_LENGTH` characters, is a format error.
        think: require a ``<think>`` block before the ``<answer>`` block.
        max_actions: keep at most this many actions (the rest are counted in ``dropped``); ``None`` keeps all.
        sep: the action separator; ``None`` treats the whole answer as one action (answer environments).
    """
    refused = _refuse(text)
    if refused is not None:
        return refused
    thought = ""
    start = 0
    if think:
        i = _find("<think>", text)
        j = _find("</think>", text, i + 7) if i >= 0 else -1
        if j < 0:
            return ParsedResponse(ok=False, error="missing <think>...</think> block")
        thought, start = text[i + 7 : j], j + 8
    i = _find("<answer>", text, start)
    j = _find("</answer>", text, i + 8) if i >= 0 else -1
    if j < 0:
        return ParsedResponse(ok=False, think=thought.strip(), error="missing <answer>...</answer> block")
    return _split_actions(thought.strip(), text[i + 8 : j].strip(), sep, max_actions)


def _refuse(text: Any) -> ParsedResponse | None:
    """The format error for a response that is not a str or is too long to read, else ``None``."""
    if not isinstance(text, str):
        return ParsedResponse(ok=False, error=f"response must be a str, got {type(text).__name__}")
    if len(text) > RESPONSE_MAX_LENGTH:
        return ParsedResponse(
            ok=False, error=f"response longer than {RESPONSE_MAX_LENGTH} characters ({len(text)})"
        )
    return None


def _split_actions(thought: str, answer: str, sep: str | None, max_actions: int | None) -> ParsedResponse:
    """The shared tail of both parsers: split the answer on ``sep`` into stripped, non-empty actions and keep the
    first ``max_actions`` (the rest counted in ``dropped``); an empty answer is a format error."""
    parts = [p.strip() for p in answer.split(sep)] if sep else [answer]
    parts = [p for p in parts if p]
    if not parts:
        return ParsedResponse(ok=False, think=thought, answer=answer, error="empty answer")
    dropped = 0
    if max_actions is not None and len(parts) > max_actions:
        dropped = len(parts) - max_actions
        parts = parts[:max_actions]
    return ParsedResponse(ok=True, think=thought, answer=answer, actions=tuple(parts), dropped=dropped)


def format_response(actions, think: str = "", *, use_think: bool = True, sep: str = ACTION_SEP) -> str:
    """The canonical response text for ``actions`` (inverse of :func:`parse_response`)."""
    if isinstance(actions, str):
        actions = [actions]
    answer = f"<answer>{f' {sep} '.join(actions)}</answer>"
    return f"<think>{think}</think>{answer}" if use_think else answer


#: What RAGEN removes from the think and answer contents (``ragen/llm_agent/ctx_manager.py``,
#: ``special_token_list``), in its order.
RAGEN_SPECIAL_TOKENS = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")


def parse_ragen_response(
    text: str,
    *,
    think: bool = True,
    max_actions: int | None = None,
    sep: str | None = ACTION_SEP,
) -> ParsedResponse:
    """RAGEN's parsing (``ContextManager._parse_response`` in ``ragen/llm_agent/ctx_manager.py``).

    Same result as ``re.search(r"<think>(.*?)</think>\\s*<answer>(.*?)</answer>", text, re.DOTALL)`` (or
    ``r"<answer>(.*?)</answer>"`` when ``think`` is off): tags are case-sensitive, only whitespace may separate
    ``</think>`` from ``<answer>``, text before and after the blocks is ignored. The special tokens are then
    removed from both contents, which are stripped, and the answer is split on ``sep`` into stripped, non-empty
    actions, keeping the first ``max_actions``. It is computed by literal searches in linear time rather than by
    the lazy regex (which backtracks quadratically on hostile text). An empty answer is a format error, as in
    RAGEN (no action is executed).
    """
    refused = _refuse(text)
    if refused is not None:
        return refused
    thought = ""
    if think:
        # The leftmost <think> starts the match if any start does; the think group ends at the first </think>
        # followed by whitespace and <answer>; a match exists iff a </answer> follows that <answer>.
        i = text.find("<think>")
        if i < 0:
            return ParsedResponse(ok=False, error="no <think>...</think><answer>...</answer> match")
        k = text.find("</think>", i + 7)
        a = -1
        while k >= 0:
            m = k + 8
            while m < len(text) and text[m].isspace():
                m += 1
            if text.startswith("<answer>", m):
                a = m
                break
            k = text.find("</think>", k + 1)
        if a < 0:
            return ParsedResponse(ok=False, error="no <think>...</think><answer>...</answer> match")
        thought = text[i + 7 : k]
    else:
        a = text.find("<answer>")
        if a < 0:
            return ParsedResponse(ok=False, error="no <answer>...</answer> match")
    j = text.find("</answer>", a + 8)
    if j < 0:
        return ParsedResponse(ok=False, error="no <answer>...</answer> match")
    answer = text[a + 8 : j]
    for token in RAGEN_SPECIAL_TOKENS:
        answer = answer.replace(token, "").strip()
        thought = thought.replace(token, "").strip()
    return _split_actions(thought, answer, sep, max_actions)
