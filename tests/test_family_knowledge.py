"""A family's knowledge stays in its package: the rest of llm-gym asks the env (TextEnv's family hooks) and never
switches on a family's class or module name."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from llm_gym.core import TextEnv
from llm_gym.registration import ENVS

ROOT = Path(__file__).resolve().parent.parent
#: Code that must work for any family: the agent loop, export and baselines, rendering, adapters, CLIs, trainer.
GENERIC = [ROOT / "llm_gym" / "agent", ROOT / "llm_gym" / "render", ROOT / "llm_gym" / "integrations"]
GENERIC += [ROOT / "llm_gym" / "serve"]
GENERIC += [ROOT / "llm_gym" / "cli.py", ROOT / "trainer"]


def _families() -> tuple[set[str], set[str]]:
    """(family packages such as ``llm_gym.envs.sokoban``, env class names such as ``SokobanEnv``) from ENVS."""
    modules, classes = set(), set()
    for entry in ENVS:
        module, cls = entry.entry_point.split(":")
        modules.add(module)
        classes.add(cls)
    return modules, classes


def _files() -> list[Path]:
    out = []
    for p in GENERIC:
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def family_references(path: Path, root: Path = ROOT) -> list[str]:
    """Every place in ``path`` that names a family: an import of its package, its env class, or a string holding
    its class name, package path or package name (docstrings excepted)."""
    modules, classes = _families()
    short = {m.rsplit(".", 1)[1] for m in modules}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and node.module:
            if any(node.module == m or node.module.startswith(m + ".") for m in modules):
                found.append(f"{where} imports {node.module}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(alias.name == m or alias.name.startswith(m + ".") for m in modules):
                    found.append(f"{where} imports {alias.name}")
        elif isinstance(node, ast.Name) and node.id in classes:
            found.append(f"{where} uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in classes:
            found.append(f"{where} uses .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
            if text in short or any(c in text for c in classes) or any(m in text for m in modules):
                found.append(f"{where} names {text[:60]!r}")
    return found


def test_generic_code_never_names_a_family():
    found = [ref for path in _files() for ref in family_references(path)]
    listing = "\n".join(found)
    assert not found, f"family knowledge outside its package (add a TextEnv hook instead):\n{listing}"


def test_the_scan_finds_each_kind_of_reference(tmp_path):
    # The check above must be able to fail: each way of switching on a family is caught (lines 2-9), a docstring
    # naming a module is not (line 1).
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""Mentions llm_gym.envs.sokoban in a docstring, which is fine."""\n'
        "from llm_gym.envs.sokoban.solver import solve\n"
        "import llm_gym.envs.bandit\n"
        "def f(env):\n"
        "    if isinstance(env, FrozenLakeEnv): pass\n"
        "    if type(env).__name__ == 'MetaMathQAEnv': pass\n"
        "    if type(env).__module__.startswith('llm_gym.envs.frozen_lake'): pass\n"
        "    table = {'sokoban': 1}\n"
        "    return envs.countdown.CountdownEnv\n",
        encoding="utf-8",
    )
    found = family_references(bad, root=tmp_path)
    assert sorted({int(ref.split(":")[1].split(" ")[0]) for ref in found}) == [2, 3, 5, 6, 7, 8, 9], found


class _Free(TextEnv):
    """A minimal free-text env that overrides none of the family hooks."""

    action_names = None
    action_sep = None

    def _rules(self):
        return "Say anything."

    def _reset_game(self, options):
        self.done = False

    def _apply_action(self, action):
        self.done = True
        return {}, True

    def _observation(self):
        return "?"

    def _is_terminated(self):
        return self.done

    def _is_success(self):
        return False


class _Moves(_Free):
    action_names = ("Left", "Right")
    action_sep = TextEnv.action_sep


def test_hook_defaults_say_not_available():
    env = _Free()
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match="random answer is meaningless"):
        env.sample_valid_action(np.random.default_rng(0))
    assert env.optimum_solves({}) is None
    assert env.expert_name is None
    with pytest.raises(NotImplementedError, match="no expert"):
        env.expert_move()
    assert env.ragen_prompt() is None


def test_default_random_answer_draws_action_names():
    env = _Moves(max_actions_per_turn=3)
    env.reset(seed=0)
    rng = np.random.default_rng(5)
    replies = {env.sample_valid_action(rng, actions_per_turn=3, reasoning="") for _ in range(30)}
    assert all(r.startswith("<think></think><answer>") and r.count("||") == 2 for r in replies)
    assert len(replies) > 3
    with pytest.raises(ValueError, match=r"actions_per_turn must be in \[1, 3\]"):
        env.sample_valid_action(rng, actions_per_turn=4)
    counts = {env.sample_valid_action(rng).count("||") + 1 for _ in range(60)}
    assert counts == {1, 2, 3}  # default: a random count up to the per-turn limit


def test_agent_code_reaches_families_only_through_the_hooks():
    from llm_gym.agent import baselines, export

    env = _Free()
    env.reset(seed=0)
    with pytest.raises(baselines.NoBaseline, match="meaningless"):
        baselines.random_valid_policy(env, np.random.default_rng(0))
    assert baselines.optimum_solves(env, {}) is None
    with pytest.raises(ValueError, match="no expert for _Free"):
        export._expert_for(env)


#: Gymnasium's env docstring sections (``frozen_lake.py``), in sentence case as our docs write headings.
DOC_SECTIONS = (
    "Description",
    "Action",
    "Observation",
    "Starting state",
    "Rewards",
    "Episode end",
    "Information",
    "Arguments",
    "Version history",
)


@pytest.mark.parametrize("entry_point", sorted({e.entry_point for e in ENVS}))
def test_env_docstrings_have_gymnasiums_sections_in_order(entry_point):
    from gymnasium.envs.registration import load_env_creator

    doc = load_env_creator(entry_point).__doc__
    positions = [doc.find(f"\n    ## {section}\n") for section in DOC_SECTIONS]
    assert -1 not in positions, [s for s, p in zip(DOC_SECTIONS, positions) if p == -1]
    assert positions == sorted(positions)
    # Readable in a terminal and in the API reference: no crammed lines.
    assert max(len(line) for line in doc.splitlines()) <= 116
