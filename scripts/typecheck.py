"""Type-check ``llm_gym`` as it is installed: mypy over ``llm_gym/`` and ``trainer/`` (installed as
``llm_gym.trainer``).

    python scripts/typecheck.py            # what CI runs (settings: [tool.mypy] in pyproject.toml)
    python scripts/typecheck.py --help     # mypy's own options may follow, e.g. --no-incremental

setuptools maps ``trainer/`` to ``llm_gym.trainer`` and ``assets/`` to ``llm_gym.assets`` (``package-dir`` in
pyproject.toml), and an editable install does it with an import hook that static tools cannot see: in the
repository ``llm_gym/`` has no ``trainer`` folder. So the script first lays the package out as installed, as
symbolic links under ``.cache/typecheck_src/`` (the docs' API hook does the same for mkdocstrings), runs mypy on
``-p llm_gym`` there, and prints each error with its repository path (``trainer/grpo.py:12``), so editors and CI
logs point at the real file. The exit code is mypy's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - mypy depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
VIEW = ROOT / ".cache" / "typecheck_src"


def package_dirs() -> dict[str, Path]:
    """``package-dir`` of pyproject.toml: installed package -> repository folder."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {name: ROOT / folder for name, folder in data["tool"]["setuptools"]["package-dir"].items()}


def build_view(out: Path = VIEW) -> Path:
    """``out/llm_gym/``: every entry of ``llm_gym/`` plus the mapped sub-packages, as symbolic links."""
    dirs = package_dirs()
    pkg = out / "llm_gym"
    if out.exists():
        shutil.rmtree(out)
    pkg.mkdir(parents=True)
    for entry in dirs["llm_gym"].iterdir():
        if entry.name != "__pycache__":
            os.symlink(entry, pkg / entry.name)
    for name, folder in dirs.items():
        if name != "llm_gym":
            os.symlink(folder, pkg / name.split(".", 1)[1])
    return out


def repository_paths(text: str, out: Path = VIEW) -> str:
    """Rewrite ``<view>/llm_gym/trainer/x.py`` to ``trainer/x.py`` (and so on for every mapped folder)."""
    for name, folder in sorted(package_dirs().items(), key=lambda kv: -len(kv[0])):
        view = (out / name.replace(".", "/")).relative_to(ROOT).as_posix()
        text = re.sub(re.escape(view) + "/", folder.relative_to(ROOT).as_posix() + "/", text)
    return text


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    build_view()
    env = {**os.environ, "MYPYPATH": str(VIEW.relative_to(ROOT))}
    cmd = [sys.executable, "-m", "mypy", "-p", "llm_gym", *args]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    sys.stdout.write(repository_paths(res.stdout))
    sys.stderr.write(repository_paths(res.stderr))
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
