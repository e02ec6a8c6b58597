"""The table-generating doc hooks replace their marker line and nothing after it.

A marker pattern ending in ``-->\\s*$`` (multi-line mode) also ate the newline of the blank line after the marker,
so the paragraph after a generated table joined the table as rows with empty cells (issue 34).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HOOKS = Path(__file__).resolve().parent.parent / "docs" / "hooks"


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(f"_docs_hook_{name}", HOOKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # config_tables' dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def _markers() -> list[tuple[str, str]]:
    import json

    family = next(iter(json.loads((HOOKS.parent / "data" / "env_cards.json").read_text())["cards"]))
    return [
        ("id_table", "<!-- id-table -->"),
        ("reward_tables", "<!-- reward-table: llmgym/Sokoban-v0 -->"),
        ("config_tables", "<!-- config-table: FilterArguments -->"),
        ("config_tables", "<!-- config-groups -->"),
        ("env_cards", f"<!-- env-card: {family} -->"),
    ]


@pytest.mark.parametrize("name,marker", _markers())
def test_the_blank_line_after_a_marker_survives(name, marker):
    hook = _hook(name)
    text = hook.expand(f"Intro.\n\n{marker}\n\n**Next** paragraph.\n")
    assert marker not in text, "the marker was not expanded"
    _, sep, tail = text.partition("\n\n**Next** paragraph.")
    assert sep and tail == "\n", f"the paragraph after the marker lost its blank line: {text[-200:]!r}"
    # trailing spaces after the marker are still part of the marker line
    assert hook.expand(f"{marker}  \n\nNext.\n").endswith("\n\nNext.\n")
