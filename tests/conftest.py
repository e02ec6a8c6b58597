"""Test-wide settings (offline, single-threaded torch, headless pygame) and the shared tiny model."""

import os

import pytest

for _key, _value in {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "SDL_VIDEODRIVER": "dummy",
    "SDL_AUDIODRIVER": "dummy",
    "PYGAME_HIDE_SUPPORT_PROMPT": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A random tiny Qwen2 (ChatML template) saved once per test session; tests load their own copy from it."""
    pytest.importorskip("transformers")
    from tests._tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))
