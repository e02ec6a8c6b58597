"""CONTRIBUTING.md's worked example builds: its Corridor family, taken from the page's text, is written to a
throwaway package, registered for this test only, and passes the contract checks, the baselines, export and
both chat formats, with no edit anywhere else."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from llm_gym import registration
from llm_gym.agent.baselines import baseline_success, format_baseline
from llm_gym.agent.chat import ChatFormat, Conversation
from llm_gym.agent.export import export_episodes, verify_rows
from llm_gym.registration import EnvEntry, make_env, resolve_env_id

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
ENV_ID = "llmgym/Corridor-v0"
PACKAGE = "llmgym_walkthrough.corridor"  # stands in for llm_gym.envs.corridor (same family name: corridor)


def _block(first_line: str) -> str:
    """The ```python block of CONTRIBUTING.md that starts with ``first_line``, pointed at the throwaway package."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE, flags=re.S)
    (code,) = [b for b in blocks if b.startswith(first_line + "\n")]
    return code.replace("llm_gym.envs.corridor", PACKAGE)


@pytest.fixture(scope="module")
def corridor(tmp_path_factory):
    """The walkthrough's family as a package on sys.path, its ENVS line in the table, its id registered."""
    root = tmp_path_factory.mktemp("family")
    pkg = root / PACKAGE.replace(".", "/")
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "env.py").write_text(_block("# llm_gym/envs/corridor/env.py"), encoding="utf-8")
    (pkg / "__init__.py").write_text(_block("# llm_gym/envs/corridor/__init__.py"), encoding="utf-8")
    # The guide's one registration line, EnvEntry(<constants>) inside ENVS, read without executing it.
    (assign,) = ast.parse(_block("# llm_gym/registration.py")).body
    (call,) = [e for e in assign.value.elts if isinstance(e, ast.Call)]
    assert call.func.id == "EnvEntry" and not call.keywords
    entry = EnvEntry(*(ast.literal_eval(a) for a in call.args))
    sys.path.insert(0, str(root))
    mp = pytest.MonkeyPatch()
    mp.setattr(registration, "ENVS", (*registration.ENVS, entry))
    registration.register_all()
    try:
        yield {"root": root, "entry": entry}
    finally:
        mp.undo()
        gym.registry.pop(ENV_ID, None)
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith(PACKAGE.split(".")[0])]:
            del sys.modules[name]


def test_the_guide_registers_one_line_pointing_into_the_family_package(corridor):
    entry = corridor["entry"]
    assert entry.id == ENV_ID and entry.entry_point == f"{PACKAGE}:CorridorEnv"
    assert resolve_env_id("Corridor") == ENV_ID
    assert f"| `{ENV_ID}` | {entry.description} |" in registration.id_table()


def test_check_env_and_the_docstring_sections(corridor):
    env = gym.make(ENV_ID)
    check_env(env.unwrapped)
    doc = type(env.unwrapped).__doc__
    for section in ("Description", "Action", "Observation", "Starting state", "Rewards", "Episode end"):
        assert f"## {section}" in doc
    for section in ("Information", "Arguments", "Version history"):
        assert f"## {section}" in doc


_EPISODE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import gymnasium as gym, numpy as np
gym.register(id="llmgym/Corridor-v0", entry_point=sys.argv[2])
env = gym.make("llmgym/Corridor-v0")
obs, info = env.reset(seed=11)
trace, rng = [obs, json.dumps(info, sort_keys=True)], np.random.default_rng(11)
for t in range(8):
    response = env.unwrapped.sample_valid_action(rng) if t % 3 != 2 else "no tags"
    obs, r, term, trunc, info = env.step(response)
    trace += [obs, r, term, trunc, json.dumps(info, sort_keys=True)]
    if term or trunc:
        break
print(json.dumps(trace))
"""


def test_same_seed_same_episode_across_processes(corridor):
    runs = []
    for hashseed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", _EPISODE, str(corridor["root"]), corridor["entry"].entry_point],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, PYTHONHASHSEED=hashseed),
        )
        runs.append(json.loads(out.stdout))
    assert runs[0] == runs[1] and len(runs[0]) > 2


def test_groups_start_alike_and_info_contract_holds(corridor):
    envs = gym.make_vec(ENV_ID, num_envs=3, vectorization_mode="sync")
    obs, _ = envs.reset(seed=[5] * 3)
    assert len(set(obs)) == 1
    envs.close()
    env = gym.make(ENV_ID)
    starts = {env.reset(seed=s)[0] for s in range(8)}
    assert len(starts) >= 3
    _, info = env.reset(seed=3)
    rng = np.random.default_rng(3)
    for _ in range(5):
        _, r, term, trunc, info = env.step(env.unwrapped.sample_valid_action(rng))
        assert {"success", "action_is_valid", "actions", "reward_components", "turn", "error"} <= set(info)
        assert r == pytest.approx(sum(info["reward_components"].values()))
        if term or trunc:
            break


def test_baselines_see_the_random_policy_and_the_optimum(corridor):
    b = baseline_success(ENV_ID, range(40), samples=2)
    assert b["optimum"]["rate"] == 1.0  # at most 4 cells to walk: always within 5 turns of 2 moves
    assert 0 < b["random"]["rate"] < 1 and b["random"]["n"] == 80
    assert format_baseline(b).startswith("random valid ")
    tight = baseline_success(ENV_ID, range(40), max_turns=1, max_actions_per_turn=1)
    assert 0 < tight["optimum"]["rate"] < 1  # only starts next to the exit fit one move


def test_export_rows_replay_to_solved_episodes(corridor):
    result = export_episodes(ENV_ID, range(6))
    assert len(result.rows) == 6 and not result.skipped
    assert {row["expert"] for row in result.rows} == {"walk-right"}
    assert verify_rows(result.rows) == []
    short = export_episodes(ENV_ID, range(20), env_kwargs={"max_actions": 1})
    assert short.skipped and all("budget" in why for why in short.skipped.values())


@pytest.mark.parametrize("style", ["llmgym", "ragen"])
def test_chat_formats_render_the_family(corridor, style):
    env = make_env(ENV_ID, {})
    obs, _ = env.reset(seed=2)
    conv = Conversation(env, ChatFormat(style=style, one_shot=style == "llmgym"))
    conv.add_observation(obs)
    system = conv.messages()[0]["content"]
    assert "Walk to the exit E" in system  # its instructions (RAGEN's layout has no text of its own for it)
    assert obs in conv.messages()[-1]["content"]


# ------------------------------------------------------------------------- the README and the commands
def _script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_regenerated_with_the_family_has_its_row_and_fits_the_cap(corridor):
    """Step 5's `python scripts/gen_readme.py`: the family gets one row and README stays under its byte cap."""
    gen = _script("gen_readme")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    new = gen.render(readme)
    rows = [r for r in new.splitlines() if "(docs/envs/corridor.md)" in r]
    assert rows == ["| [Corridor](docs/envs/corridor.md) | `Corridor-v0` |"]
    assert new.replace(rows[0] + "\n", "") == readme  # nothing else changes
    assert len(new.encode("utf-8")) <= gen.MAX_BYTES


def test_any_registered_id_works_as_env_without_extra_flags(corridor, capsys):
    """`--env Corridor` in llmgym-train (no profile of its own), llmgym-eval and llmgym list, and the
    family in --env's help."""
    pytest.importorskip("trl")
    from llm_gym.trainer import evaluate
    from llm_gym.trainer.resolve import resolve_config

    from llm_gym.cli import main as llmgym

    config, meta = resolve_config(["--env", "Corridor"], gpu=False, log=lambda *_: None)
    assert (
        config.env == ENV_ID and meta["profile"] == "recommended"
    )  # a profile without corridor.yaml: skipped
    make_env(ENV_ID, config.make_env_kwargs()).close()  # the CPU layer's limits fit the new family
    args = evaluate.build_parser().parse_args(["--model", "m", "--env", "Corridor", "--max_turns", "2"])
    env_ids, env_kwargs, _ = evaluate._check_args(args)
    assert env_ids == [ENV_ID] and env_kwargs == {"max_turns": 2}
    assert "Corridor." in " ".join(evaluate.build_parser()._option_string_actions["--env"].help.split())
    assert llmgym(["list", "--num_eval_seeds", "4"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^{ENV_ID} +{re.escape(corridor['entry'].description)}$", out, flags=re.M)
    assert "optimum 1.000" in out.split(ENV_ID, 1)[1].splitlines()[1]


#: What a contributor runs after the walkthrough's steps: the generators it names, then the tests that read
#: every id or family (the env contract on the new id; the others whole).
CONTRIBUTOR_COMMANDS = (
    ["scripts/gen_readme.py"],
    ["scripts/gen_env_cards.py"],
    ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_env_contract.py", "-k", "Corridor"],
    [
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/test_readme.py",
        "tests/test_registration.py",
        "tests/test_family_knowledge.py",
        "tests/test_env_cards.py",
        "tests/test_import_cycles.py",
    ],
)
#: The repository's parts a contributor's checkout needs for those commands (trainer/ is read as files by the
#: static tests; the imported trainer/ and assets/ stay the installed ones).
CHECKOUT = (
    "llm_gym",
    "trainer",
    "tests",
    "docs",
    "scripts",
    ".ci",
    "README.md",
    "CONTRIBUTING.md",
    "mkdocs.yml",
    "pyproject.toml",
    "setup.py",
)


def _docs_page() -> str:
    """Step 5's page, as the guide describes it: the rules, the ids, the reward table and the card."""
    return (
        "# Corridor\n\nWalk right along a one-row corridor to the exit `E`.\n\n"
        f"| id | what it is |\n|---|---|\n| `{ENV_ID}` | walk right to the corridor's exit |\n\n"
        f"<!-- reward-table: {ENV_ID} -->\n\n<!-- env-card: corridor -->\n"
    )


@pytest.mark.slow  # a checkout copy, the card generator (a served throughput run) and five test files: ~40 s
def test_the_walkthrough_in_a_checkout_passes_what_a_contributor_runs(tmp_path):
    """The six files of the walkthrough written into a copy of the repository as the guide says (the package,
    the ENVS line, the docs page, README regenerated), then the generators and tests a contributor runs."""
    import shutil

    repo = tmp_path / "repo"
    for name in CHECKOUT:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__", "site"))
        else:
            shutil.copy2(src, repo / name)
    family = repo / "llm_gym" / "envs" / "corridor"
    family.mkdir()
    for first in ("# llm_gym/envs/corridor/env.py", "# llm_gym/envs/corridor/__init__.py"):
        code = re.findall(r"```python\n(.*?)```", GUIDE, flags=re.S)
        (block,) = [b for b in code if b.startswith(first + "\n")]
        (family / first.rsplit("/", 1)[1]).write_text(block, encoding="utf-8")
    guide = _block("# llm_gym/registration.py").replace(
        PACKAGE, "llm_gym.envs.corridor"
    )  # the page's own text
    (line,) = [ln for ln in guide.splitlines() if ln.strip().startswith("EnvEntry(")]
    registration_py = repo / "llm_gym" / "registration.py"
    text = registration_py.read_text(encoding="utf-8")
    head, sep, rest = text.partition("ENVS: tuple[EnvEntry, ...] = (\n")
    end = rest.index("\n)\n")
    registration_py.write_text(f"{head}{sep}{rest[:end]}\n{line}{rest[end:]}", encoding="utf-8")
    (repo / "docs" / "envs" / "corridor.md").write_text(_docs_page(), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    for command in CONTRIBUTOR_COMMANDS:
        out = subprocess.run(
            [sys.executable, *command], cwd=repo, env=env, capture_output=True, text=True, timeout=900
        )
        failed = [ln for ln in out.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        assert out.returncode == 0, (command, failed, out.stdout[-3000:], out.stderr[-3000:])
        if "pytest" in command:
            assert " passed" in out.stdout and "error" not in out.stdout.splitlines()[-1], out.stdout[-500:]
    readme = (repo / "README.md").read_text(encoding="utf-8")
    assert "| [Corridor](docs/envs/corridor.md) | `Corridor-v0` |" in readme
    cards = json.loads((repo / "docs" / "data" / "env_cards.json").read_text(encoding="utf-8"))["cards"]
    assert cards["corridor"]["env_id"] == ENV_ID and cards["corridor"]["throughput"]["served_steps_per_s"] > 0
