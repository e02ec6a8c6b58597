"""MkDocs hook: the id table generated from ``llm_gym.registration.ENVS``.

A page writes ``<!-- id-table -->`` on a line of its own; the build replaces it with every registered id and its
one-line description (README.md gets the same table from ``scripts/gen_readme.py``).
"""

from __future__ import annotations

import re

from llm_gym.registration import id_table

MARKER = re.compile(r"^<!--\s*id-table\s*-->[ \t]*$", flags=re.M)


def expand(markdown: str) -> str:
    return MARKER.sub(lambda m: id_table(), markdown)


def on_page_markdown(markdown: str, **kwargs) -> str:
    return expand(markdown)
