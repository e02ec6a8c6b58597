"""setuptools' package list, discovered instead of written out (everything else is in pyproject.toml).

Every package under ``llm_gym/`` is found, so a new env family (``llm_gym/envs/<family>/``) ships without an edit
here. ``trainer/`` and ``assets/`` are added under the names pyproject.toml's ``package-dir`` maps them to
(``llm_gym.trainer``, ``llm_gym.assets``): discovery over the whole tree would install them as top-level
``trainer`` and ``assets``, and PyPI's Coqui ``trainer`` owns that name. pyproject.toml cannot say this on its own
(its ``packages`` is either a hand list or a ``find`` that ignores ``package-dir``).
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


def packages() -> list[str]:
    """Every package the wheel ships: ``llm_gym`` and its subpackages, then the two mapped folders."""
    return [*find_packages(str(ROOT), include=["llm_gym", "llm_gym.*"]), "llm_gym.trainer", "llm_gym.assets"]


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import packages()
    setup(packages=packages())
