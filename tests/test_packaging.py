"""Packaging and layout: one namespace (``llm_gym``) from three top-level folders, nothing that shadows.

The fast tests read the repository: its top-level entries, that every package folder is in the build, that
nothing imports a top-level ``trainer`` (PyPI's Coqui ``trainer`` owns that name) and that no module is named
like a standard-library one (``python trainer/cli.py`` puts ``trainer/`` first on ``sys.path``, where a
``signal.py`` once broke ``import signal`` for torch). The slow test installs the project the two ways users do,
editable and from a built wheel, into fresh virtual environments beside Coqui's ``trainer``, and runs every
console script.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The top level the project asked for, and what may sit beside it.
REQUESTED_TOP_LEVEL = {
    "llm_gym",
    "trainer",
    "assets",
    "tests",
    "pyproject.toml",
    "README.md",
    "CONTRIBUTING.md",
}
ALLOWED_EXTRAS = {"docs", "benchmarks", "scripts", "requirements", ".ci", "mkdocs.yml", "setup.py"}
#: Where the build maps each repository folder (pyproject ``[tool.setuptools] package-dir``).
FOLDER_TO_PACKAGE = {"llm_gym": "llm_gym", "trainer": "llm_gym.trainer", "assets": "llm_gym.assets"}
#: Folders whose Python files we own (scripts may be run from any of them).
CODE_DIRS = ("llm_gym", "trainer", "assets", "tests", "benchmarks", "scripts")
#: Coqui's trainer, the PyPI distribution that installs a top-level ``trainer`` package, and coqpit, the one
#: dependency its ``import trainer`` needs that our environment lacks (torch, fsspec, psutil come from ours).
COQUI_TRAINER = ("trainer==0.0.36", "coqpit==0.0.17")


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _setup_packages(root: Path = ROOT) -> list[str]:
    """The package list setup.py gives setuptools (discovered, not written out) for the tree at ``root``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("llmgym_setup", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # setup() itself runs only as __main__
    return mod.packages(root)


def test_a_new_package_folder_needs_no_packaging_edit(tmp_path):
    # A subpackage of any of the three folders (an env family, a trainer module split into a package, a data
    # package) is found under the namespace its folder maps to.
    for rel in (
        "llm_gym",
        "llm_gym/envs",
        "llm_gym/envs/corridor",
        "trainer",
        "trainer/cli",
        "assets",
        "assets/levels",
    ):
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "__init__.py").write_text("")
    assert sorted(_setup_packages(tmp_path)) == [
        "llm_gym",
        "llm_gym.assets",
        "llm_gym.assets.levels",
        "llm_gym.envs",
        "llm_gym.envs.corridor",
        "llm_gym.trainer",
        "llm_gym.trainer.cli",
    ]


def _python_files() -> list[Path]:
    files = []
    for d in CODE_DIRS:
        files += [p for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(files)


def _package_dirs(folder: str) -> list[Path]:
    base = ROOT / folder
    return sorted(p.parent for p in base.rglob("__init__.py") if "__pycache__" not in p.parts)


def _subprocess_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(
        OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1"
    )
    return env


# ---------------------------------------------------------------------------------------------- layout (fast)


def test_top_level_holds_the_requested_folders_and_nothing_unexpected():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    top = {line.split("/", 1)[0] for line in out.splitlines() if line and (ROOT / line).exists()}
    assert REQUESTED_TOP_LEVEL <= top, f"missing at the top level: {sorted(REQUESTED_TOP_LEVEL - top)}"
    unexpected = sorted(t for t in top - REQUESTED_TOP_LEVEL - ALLOWED_EXTRAS if not t.startswith("."))
    assert not unexpected, (
        f"unexpected top-level entries (move them, or allow them here on purpose): {unexpected}"
    )


def _top_level_trainer_imports(source: str, name: str) -> list[str]:
    """``name:line: module`` for every import of a top-level ``trainer`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func in ("import_module", "__import__", "find_spec") and isinstance(node.args[0].value, str):
                modules = [node.args[0].value]
        found += [f"{name}:{node.lineno}: {m}" for m in modules if m.split(".")[0] == "trainer"]
    return found


def test_nothing_imports_a_top_level_trainer():
    bad = [
        hit
        for p in _python_files()
        for hit in _top_level_trainer_imports(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
    ]
    assert not bad, "import llm_gym.trainer instead (PyPI's Coqui `trainer` owns the name):\n" + "\n".join(
        bad
    )


def test_the_import_check_sees_every_spelling():
    # The check above must be able to fail: each spelling of a top-level trainer import is caught, ours are not.
    source = (
        "import trainer\nfrom trainer.cli import main\nimport importlib\nimportlib.import_module('trainer.grpo')\n"
        "from llm_gym.trainer import cli\nfrom . import trainer as t\nimport llm_gym.trainer\n"
    )
    hits = _top_level_trainer_imports(source, "x.py")
    assert [h.rsplit(": ", 1)[1] for h in hits] == ["trainer", "trainer.cli", "trainer.grpo"]


def test_no_module_is_named_like_a_stdlib_module():
    stdlib = set(sys.stdlib_module_names)
    names = [(p.stem, p) for p in _python_files() if not p.stem.startswith("__")]
    names += [(p.name, p) for d in CODE_DIRS if (ROOT / d).is_dir() for p in _package_dirs(d)]
    bad = sorted(str(p.relative_to(ROOT)) for name, p in names if name in stdlib)
    assert not bad, f"these shadow the standard library when a script runs from their folder: {bad}"


def test_every_package_folder_is_built_and_every_script_points_into_our_namespace():
    project = _pyproject()
    tool = project["tool"]["setuptools"]
    assert tool["package-dir"] == {package: folder for folder, package in FOLDER_TO_PACKAGE.items()}
    assert "packages" not in tool, (
        "setup.py discovers the packages; a hand list in pyproject.toml would drift"
    )
    listed = _setup_packages()
    expected = set()
    for folder, package in FOLDER_TO_PACKAGE.items():
        for d in _package_dirs(folder):
            rel = d.relative_to(ROOT / folder).parts
            expected.add(".".join((package, *rel)))
    # Exactly the package folders, each once, all inside the llm_gym namespace (never a top-level trainer).
    assert sorted(listed) == sorted(expected), (
        f"setup.py packages {sorted(listed)} != folders {sorted(expected)}"
    )
    # A folder of Python files without __init__.py would be left out of the wheel silently.
    for folder in FOLDER_TO_PACKAGE:
        loose = sorted(
            str(p.relative_to(ROOT))
            for p in (ROOT / folder).rglob("*.py")
            if "__pycache__" not in p.parts and not (p.parent / "__init__.py").exists()
        )
        assert not loose, f"Python files outside any package (not installed): {loose}"
    # Data files of the trainer package (presets, accelerate configs) must match its package-data globs.
    globs = project["tool"]["setuptools"]["package-data"]["llm_gym.trainer"]
    data = [
        p.relative_to(ROOT / "trainer").as_posix()
        for p in (ROOT / "trainer").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    unshipped = [f for f in data if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not unshipped, f"trainer data files not in package-data (not installed): {unshipped}"
    for name, target in project["project"]["scripts"].items():
        module, _, func = target.partition(":")
        assert module.split(".")[0] == "llm_gym", f"{name} -> {target}: scripts must live in llm_gym"
        folder = max(
            (f for f, p in FOLDER_TO_PACKAGE.items() if module == p or module.startswith(p + ".")),
            key=lambda f: len(FOLDER_TO_PACKAGE[f]),  # the most specific mapping: llm_gym.trainer -> trainer/
        )
        rest = module[len(FOLDER_TO_PACKAGE[folder]) :].lstrip(".").split(".")
        path = (ROOT / folder).joinpath(*[r for r in rest if r]).with_suffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert func in defined, f"{name} -> {target}: no function {func!r} in {path.relative_to(ROOT)}"


def _script_modules() -> list:
    params = []
    for p in sorted((ROOT / "trainer").glob("*.py")):
        if 'if __name__ == "__main__"' in p.read_text(encoding="utf-8"):
            # cli.py imports torch, transformers and TRL for its --help (about 9 s on a busy 2-core machine).
            marks = [pytest.mark.slow] if p.stem == "cli" else []
            params.append(pytest.param(p.name, marks=marks, id=p.stem))
    return params


@pytest.mark.parametrize("script", _script_modules())
def test_trainer_module_runs_as_a_script(script):
    # `python trainer/cli.py` puts trainer/ first on sys.path: a module there named like a stdlib one (or a
    # circular import through the package) crashes before argparse runs.
    proc = subprocess.run(
        [sys.executable, f"trainer/{script}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=_subprocess_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage:" in proc.stdout


def test_cli_script_is_covered():
    # The module that once crashed this way must stay in the list above.
    assert "cli" in [p.id for p in _script_modules()]


# ------------------------------------------------------------------------------------------ installs (slow)


def _run(cmd: list[str], *, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_subprocess_env()
    )
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A source copy of the project (what an sdist holds), its wheel and its PEP 660 editable wheel."""
    import shutil

    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("llm_gym", "trainer", "assets"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    dist = tmp / "dist"
    # Offline and quick: the build backend (setuptools) comes from this environment, nothing from an index.
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(dist),
            str(src),
        ],
        cwd=tmp,
    )
    (wheel,) = dist.glob("llm_gym-*.whl")
    # The editable wheel is what `pip install -e` builds (PEP 660); building it here with our setuptools lets a
    # bare venv install it without setuptools of its own.
    edist = tmp / "editable"
    edist.mkdir()
    code = (
        "import sys, setuptools.build_meta as b; "
        "print(b.build_editable(sys.argv[1], config_settings={'editable_mode': 'strict'}))"
    )
    _run([sys.executable, "-c", code, str(edist)], cwd=src)
    (editable,) = edist.glob("*.whl")
    return {"tmp": tmp, "src": src, "wheel": wheel, "editable": editable}


@pytest.mark.slow  # building the wheel takes a few seconds
def test_wheel_ships_one_namespace_and_the_bundled_data(built):
    names = zipfile.ZipFile(built["wheel"]).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"llm_gym", next(t for t in tops if t.endswith(".dist-info"))}, sorted(tops)
    for needed in (
        "llm_gym/assets/sokoban/sample.xsb",
        "llm_gym/assets/metamathqa_sample.jsonl",
        "llm_gym/trainer/cli.py",
        "llm_gym/trainer/callbacks.py",
    ):
        assert needed in names
    trainer_data = [
        "llm_gym/trainer/" + p.relative_to(ROOT / "trainer").as_posix()
        for p in (ROOT / "trainer").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert trainer_data and not [f for f in trainer_data if f not in names], "trainer data files missing"
    for folder, package in FOLDER_TO_PACKAGE.items():
        for d in _package_dirs(folder):
            rel = d.relative_to(ROOT / folder).as_posix()
            init = "/".join(
                filter(None, (package.replace(".", "/"), "" if rel == "." else rel, "__init__.py"))
            )
            assert init in names, f"{init} missing from the wheel"


_PROBE = """
import importlib.metadata as md, importlib.util, json, sys
import gymnasium as gym
import llm_gym, llm_gym.trainer, llm_gym.assets
from llm_gym.trainer import callbacks
out = {
    "llm_gym": llm_gym.__file__,
    "llm_gym_trainer": llm_gym.trainer.__file__,
    "callbacks": callbacks.__file__,
    "trainer_origin": importlib.util.find_spec("trainer").origin,
    "coqui_files": sorted(str(f) for f in md.distribution("trainer").files),
    "ours_files": sorted(str(f) for f in (md.distribution("llm-gym").files or [])),
    "sample": str(llm_gym.assets.asset_path("sokoban", "sample.xsb")),
}
env = gym.make("llmgym/SokobanFile-v0"); env.reset(seed=0); env.close()
env = gym.make("llmgym/MetaMathQASample-v0"); env.reset(seed=0); env.close()
import trainer  # Coqui's, in the same process as ours
out["coqui_import"] = trainer.__file__
out["coqui_trainer_class"] = trainer.Trainer.__module__
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wheel", "editable"])
def test_fresh_venv_install_beside_coqui_trainer(built, kind):
    tmp = built["tmp"]
    venv = tmp / f"venv-{kind}"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    bindir = py.parent
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps"]
    _run([*pip, "--no-index", str(built[kind])], cwd=tmp)
    # Coqui's trainer comes from PyPI (the one network step; CI machines reach the registry).
    _run([*pip, *COQUI_TRAINER], cwd=tmp)
    # Heavy dependencies (gymnasium, numpy, torch, TRL, pygame) are reused from this environment rather than
    # downloaded: a plain path line in a .pth appends this environment's site-packages after the venv's own.
    # It is written after the installs, so pip never sees this environment's editable llm-gym; and a path line
    # does not run the .pth files over there, so that editable install's import hook stays inactive.
    purelib = _run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=tmp
    ).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (Path(purelib) / "_llmgym_test_deps.pth").write_text("\n".join(ours) + "\n", encoding="utf-8")

    out = json.loads(_run([str(py), "-c", _PROBE], cwd=tmp).stdout.strip().splitlines()[-1])
    home = Path(purelib) if kind == "wheel" else built["src"]
    for key in ("llm_gym", "llm_gym_trainer", "callbacks", "sample"):
        assert Path(out[key]).resolve().is_relative_to(home.resolve()), (key, out[key], home)
    assert Path(out["sample"]).is_file()
    # The top-level `trainer` is Coqui's file, and our distribution installs no top-level trainer.
    assert Path(out["trainer_origin"]) == Path(purelib) / "trainer" / "__init__.py"
    assert "trainer/__init__.py" in out["coqui_files"]
    assert not [f for f in out["ours_files"] if f.startswith("trainer/")]
    assert out["coqui_import"] == out["trainer_origin"] and out["coqui_trainer_class"] == "trainer.trainer"

    scripts = _pyproject()["project"]["scripts"]
    assert {"llmgym", "llmgym-train", "llmgym-eval", "llmgym-collapse-report"} <= set(scripts)
    for name in scripts:
        exe = bindir / name
        assert exe.exists(), f"console script {name} not installed"
        proc = subprocess.run(
            [str(exe), "--help"], cwd=tmp, capture_output=True, text=True, timeout=300, env=_subprocess_env()
        )
        assert proc.returncode == 0 and "usage:" in proc.stdout, f"{name} --help:\n{proc.stderr[-3000:]}"
