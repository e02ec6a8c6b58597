"""MkDocs hook: environment cards from ``docs/data/env_cards.json`` (written by ``scripts/gen_env_cards.py``).

A family page writes ``<!-- env-card: FAMILY -->`` on a line of its own; the build replaces it with that family's
card (``llm_gym.agent.cards.card_markdown``). A family without a card fails the build.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from llm_gym.agent.cards import card_markdown

MARKER = re.compile(r"^<!--\s*env-card:\s*(\S+)\s*-->[ \t]*$", flags=re.M)
CARDS = Path(__file__).resolve().parents[1] / "data" / "env_cards.json"


def expand(markdown: str, cards_file: Path = CARDS) -> str:
    """Replace every env-card marker; a family missing from the cards raises (and fails the build)."""
    if not MARKER.search(markdown):
        return markdown
    cards = json.loads(cards_file.read_text(encoding="utf-8"))["cards"]

    def card(m: re.Match) -> str:
        if m.group(1) not in cards:
            raise KeyError(f"no environment card for {m.group(1)!r}: run python scripts/gen_env_cards.py")
        return card_markdown(cards[m.group(1)])

    return MARKER.sub(card, markdown)


def on_page_markdown(markdown: str, **kwargs) -> str:
    return expand(markdown)
