"""setuptools' package list, discovered instead of written out (everything else is in pyproject.toml).

Every package under ``llm_gym/`` is found, so a new env family (``llm_gym/envs/<family>/``) ships without an edit
here. ``trainer/`` and ``assets/`` and their subpackages are found under the names pyproject.toml's ``package-dir``
maps them to (``llm_gym.trainer``, ``llm_gym.assets``): discovery over the whole tree would install them as
top-level ``trainer`` and ``assets``, and PyPI's Coqui ``trainer`` owns that name. pyproject.toml cannot say this on its own
(its ``packages`` is either a hand list or a ``find`` that ignores ``package-dir``).
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


#: Repository folders installed under another name (pyproject.toml's ``package-dir``).
MAPPED = {"trainer": "llm_gym.trainer", "assets": "llm_gym.assets"}


def packages(root: Path = ROOT) -> list[str]:
    """Every package the wheel ships: ``llm_gym`` and its subpackages, then each mapped folder and its
    subpackages under the mapped name."""
    found = find_packages(str(root), include=["llm_gym", "llm_gym.*"])
    for folder, name in MAPPED.items():
        found += [name, *(f"{name}.{sub}" for sub in find_packages(str(root / folder)))]
    return found


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import packages()
    setup(packages=packages())
