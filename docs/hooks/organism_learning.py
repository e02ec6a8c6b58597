"""MkDocs hook: the model organism's recorded learning run from ``docs/data/organism_learning.json`` (written by
``benchmarks/organism_learning.py --publish``).

A page writes a marker on a line of its own and the build replaces it: ``<!-- organism-learning -->`` with the
table the README shows (``scripts/gen_readme.py``'s ``main_job_table``, one renderer for both),
``<!-- organism-learning-defaults -->`` with the defaults grid and ``<!-- organism-frozenlake-sft -->`` with the
FrozenLake SFT comparison (format-token loss weights), ``<!-- organism-frozenlake-rl -->`` with the recorded run of
the FrozenLake profile (``--profile organism --env CoordFrozenLake``).
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llm_gym.agent.baselines import format_rate

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*organism-learning\s*-->[ \t]*$", flags=re.M)
DEFAULTS_MARKER = re.compile(r"^<!--\s*organism-learning-defaults\s*-->[ \t]*$", flags=re.M)
FL_MARKER = re.compile(r"^<!--\s*organism-frozenlake-sft\s*-->[ \t]*$", flags=re.M)
FL_RL_MARKER = re.compile(r"^<!--\s*organism-frozenlake-rl\s*-->[ \t]*$", flags=re.M)
FL_ENV = "llmgym/CoordFrozenLake-v0"
DATA = ROOT / "docs" / "data" / "organism_learning.json"


def _gen_readme() -> Any:
    spec = importlib.util.spec_from_file_location("gen_readme", ROOT / "scripts" / "gen_readme.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def defaults_table(data: dict[str, Any]) -> str:
    """The defaults grid: RL from the same warm start with each entropy bonus / reward scaling setting, one
    column per training seed and their mean."""
    by_flags: dict[str, dict[int, Any]] = {}
    for r in data.get("defaults", {}).get("runs", {}).values():
        by_flags.setdefault(r["flags"], {})[r["seed"]] = r
    seeds = sorted({seed for runs in by_flags.values() for seed in runs})
    head = " | ".join(f"seed {seed}" for seed in seeds)
    lines = [
        f"| flags (from the main job's warm start) | success after RL, {head} | mean |",
        "|---|" + "---|" * (len(seeds) + 1),
    ]
    for flags, runs in by_flags.items():
        cells = [format_rate(runs[seed]["after"]["success"]) if seed in runs else "" for seed in seeds]
        mean = sum(r["after"]["success"]["rate"] for r in runs.values()) / len(runs)
        lines.append(f"| `{flags}` | " + " | ".join(cells) + f" | {mean:.3f} |")
    return "\n".join(lines)


def frozenlake_table(data: dict[str, Any]) -> str:
    """``llmgym-sft`` on FrozenLake solver episodes at each format-token loss weight and length, the plain-PyTorch
    control on the same episodes, random and optimum."""
    section = data.get("frozenlake_sft", {})
    fl = section.get("runs", {})
    if not fl:
        return ""
    runs = list(fl.values())
    first = runs[0]
    lines = [
        "| trained on the same solver episodes | steps | held-out success (greedy) | valid moves |"
        " CPU-s (the command) |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        label = (
            "`llmgym-sft`, TRL's loss (every reply token alike)"
            if r["format_loss_weight"] == 1.0
            else (f"`llmgym-sft --format_loss_weight {r['format_loss_weight']:g}`")
        )
        lines.append(
            f"| {label} | {r['steps']} | {format_rate(r['success'])} | {r['valid']['rate']:.2f} | "
            f"{r['sft']['cpu_seconds']:.0f} |"
        )
    control = section.get("control")
    if control:
        lines.append(
            f"| plain-PyTorch control ({control['states']} moves, characters, loss on the move) | "
            f"{control['steps']} | {format_rate(control['success'])} | 1 | "
            f"{control['train_cpu_seconds']:.0f} (training only) |"
        )
    lines.append(f"| random valid moves | | {format_rate(first['baselines']['random'])} | 1 | |")
    lines.append(f"| optimum (the solver) | | {format_rate(first['baselines']['optimum'])} | 1 | |")
    return "\n".join(lines) + (
        f"\n\n{first['episodes']} solver episodes; `llmgym-sft` steps of 32 episodes at lr 1e-3 constant "
        f"(`organism-s`); {first['success']['n']} held-out seeds."
    )


def frozenlake_rl_table(data: dict[str, Any]) -> str:
    """The FrozenLake profile's recorded run (base, warm start, RL, baselines); empty before one is recorded."""
    if FL_ENV not in data.get("envs", {}):
        return ""
    return _gen_readme().profile_run_table(data, FL_ENV)


def _renderers() -> dict[re.Pattern[str], Callable[[dict[str, Any]], str]]:
    return {
        MARKER: _gen_readme().main_job_table,
        DEFAULTS_MARKER: defaults_table,
        FL_MARKER: frozenlake_table,
        FL_RL_MARKER: frozenlake_rl_table,
    }


def expand(markdown: str, data_file: Path = DATA) -> str:
    renderers = {m: r for m, r in _renderers().items() if m.search(markdown)}
    if not renderers:
        return markdown
    data = json.loads(data_file.read_text(encoding="utf-8"))
    for marker, render in renderers.items():
        markdown = marker.sub(lambda _, render=render: render(data), markdown)
    return markdown


def on_page_markdown(markdown: str, **kwargs) -> str:
    return expand(markdown)
