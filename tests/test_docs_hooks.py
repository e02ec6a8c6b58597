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
        ("organism_learning", "<!-- organism-learning -->"),
        ("organism_learning", "<!-- organism-frozenlake-sft -->"),
        ("organism_learning", "<!-- organism-frozenlake-rl -->"),
        ("organism_learning", "<!-- organism-learning-defaults -->"),
        *[
            ("ragen2_claims", f"<!-- ragen2-claims-{n} -->")
            for n in ("arms", "crossings", "collapse", "spearman", "gradient", "table8", "status")
        ],
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


def test_the_organism_table_is_the_recorded_run():
    import json

    data = json.loads((HOOKS.parent / "data" / "organism_learning.json").read_text())
    after = data["envs"]["llmgym/Bandit-v0"]["grpo"]["after"]["success"]
    text = _hook("organism_learning").expand("<!-- organism-learning -->\n")
    assert f"**{after['rate']:.3f} [{after['ci'][0]:.3f}, {after['ci'][1]:.3f}]**" in text
    text = _hook("organism_learning").expand("<!-- organism-learning-defaults -->\n")
    assert text.count("--entropy_coef") == len({r["flags"] for r in data["defaults"]["runs"].values()})


def test_the_frozenlake_table_is_the_recorded_sft_runs():
    import json

    data = json.loads((HOOKS.parent / "data" / "organism_learning.json").read_text())
    runs = data["frozenlake_sft"]["runs"].values()
    text = _hook("organism_learning").expand("<!-- organism-frozenlake-sft -->\n")
    for r in runs:
        s = r["success"]
        assert f"{s['rate']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}]" in text
    assert "random valid moves" in text and "optimum" in text


def test_the_frozenlake_rl_table_is_the_profile_run_beside_every_baseline():
    import json

    data = json.loads((HOOKS.parent / "data" / "organism_learning.json").read_text())
    run = data["envs"]["llmgym/CoordFrozenLake-v0"]["grpo"]
    text = _hook("organism_learning").expand("<!-- organism-frozenlake-rl -->\n")
    for s in (
        run["base"],
        run["warm_start"]["success"],
        run["baselines"]["random"],
        run["baselines"]["optimum"],
    ):
        assert f"{s['rate']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}]" in text
    best = run["baselines"]["best_constant"]
    assert f"always `{best['action']}`" in text and f"after {run['rl_steps']} GRPO steps" in text
