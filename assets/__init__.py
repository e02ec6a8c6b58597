"""Data bundled with llm-gym, installed as ``llm_gym.assets`` (the repository keeps it in ``assets/``).

- ``sokoban/sample.xsb``: a small collection of Sokoban levels in XSB format.
- ``metamathqa_sample.jsonl``: a 40-row sample with MetaMathQA's schema, for offline use and tests.
"""

from __future__ import annotations

from pathlib import Path

_ROOT = Path(__file__).resolve().parent


def asset_path(*parts: str) -> Path:
    """Path of a bundled file, e.g. ``asset_path("sokoban", "sample.xsb")``."""
    return _ROOT.joinpath(*parts)
