"""MkDocs hook: a static view of the installed ``llm_gym`` package for the API reference.

setuptools installs ``trainer/`` as ``llm_gym.trainer`` and ``assets/`` as ``llm_gym.assets`` (``package-dir`` in
pyproject.toml). mkdocstrings reads source statically (griffe; nothing is imported, so no torch is needed), and
griffe finds a package by its folder, where ``llm_gym/`` has neither. This hook builds, when the config loads, a
folder of symbolic links laid out like the installed package, and mkdocs.yml points mkdocstrings at it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPPED = {"trainer": ROOT / "trainer", "assets": ROOT / "assets"}  # as in pyproject.toml's package-dir
OUT = ROOT / ".cache" / "api_src"


def build_source_view(out: Path = OUT) -> Path:
    pkg = out / "llm_gym"
    if out.exists():
        shutil.rmtree(out)
    pkg.mkdir(parents=True)
    for entry in (ROOT / "llm_gym").iterdir():
        if entry.name != "__pycache__":
            os.symlink(entry, pkg / entry.name)
    for name, src in MAPPED.items():
        os.symlink(src, pkg / name)
    return out


build_source_view()
