"""Gymnasium's own environment suite, per registered ``llmgym/`` id, with Gymnasium's checkers.

Gymnasium's ``tests/envs/test_envs.py`` and ``test_rendering.py`` are not in its wheel; ``scripts/
gymnasium_suite.py`` runs those files themselves over our ids from a Gymnasium checkout. This module mirrors what
they do per id so that the suite runs here without one: ids are made as their ``tests/envs/utils.py`` makes them
(``spec.make()`` with no kwargs; ``ImportError``, ``DependencyNotInstalled`` and ``MissingArgument`` skip an id),
then ``check_env`` with no warning, the passive checker with no warning but "out of date", a 50-step rollout of
two envs on one seed compared with ``data_equivalence``, a pickled env replaying the same reset and step, and every
render mode but ``human`` after a reset and after a step. An id skipped at make is checked again with the
bundled data it needs offline (MetaMathQA), and ``llmgym/Remote-v0`` must be skipped for the right reason.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence

import llm_gym  # noqa: F401 (registers the ids)
from tests._envs import make_kwargs

pytestmark = pytest.mark.slow  # every id x five checks, pygame frames included: ~10 s on 2 busy cores

IDS = sorted(i for i in gym.registry if i.startswith("llmgym/"))
#: What Gymnasium's ``try_make_env`` skips instead of failing.
SKIPS = (ImportError, AttributeError, gym.error.DependencyNotInstalled, gym.error.MissingArgument)
#: The warning their passive-checker test allows (a deprecated id's version).
OUT_OF_DATE = re.compile(r"The environment (.*?) is out of date\. You should consider upgrading to version")
SEED, NUM_STEPS = 0, 50


def _spec_kwargs(env_id: str) -> dict:
    """``{}`` as Gymnasium's suite makes it; the bundled data where the default is a hub data set (offline)."""
    try:
        gym.make(env_id, disable_env_checker=True).close()
    except gym.error.MissingArgument:
        pytest.skip(f"{env_id} needs arguments (Gymnasium's suite skips it too)")
    except SKIPS:
        return make_kwargs(env_id)
    return {}


def _unexpected(caught, allowed: re.Pattern | None = None) -> list[str]:
    return [str(w.message) for w in caught if not (allowed is not None and allowed.search(str(w.message)))]


def test_ids_that_cannot_be_made_with_defaults_are_skipped_for_gymnasiums_reasons():
    skipped = {}
    for env_id in IDS:
        try:
            gym.make(env_id, disable_env_checker=True).close()
        except SKIPS as e:
            skipped[env_id] = e
    assert isinstance(skipped.pop("llmgym/Remote-v0"), gym.error.MissingArgument)
    assert set(skipped) <= {i for i in IDS if make_kwargs(i)}, skipped  # only the hub-data ids besides Remote


@pytest.mark.parametrize("env_id", IDS)
def test_all_env_api(env_id):
    kwargs = _spec_kwargs(env_id)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = gym.spec(env_id).make(disable_env_checker=True, **kwargs).unwrapped
        check_env(env, skip_render_check=True)
        env.close()
    assert not _unexpected(caught, OUT_OF_DATE), _unexpected(caught, OUT_OF_DATE)


@pytest.mark.parametrize("env_id", IDS)
def test_all_env_passive_env_checker(env_id):
    kwargs = _spec_kwargs(env_id)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = gym.make(env_id, **kwargs)
        env.reset()
        env.step(env.action_space.sample())
        env.close()
    assert not _unexpected(caught, OUT_OF_DATE), _unexpected(caught, OUT_OF_DATE)


@pytest.mark.parametrize("env_id", IDS)
def test_env_determinism_rollout(env_id):
    kwargs = _spec_kwargs(env_id)
    env_1 = gym.spec(env_id).make(disable_env_checker=True, **kwargs)
    env_2 = gym.spec(env_id).make(disable_env_checker=True, **kwargs)
    assert data_equivalence(env_1.reset(seed=SEED), env_2.reset(seed=SEED), exact=True)
    env_1.action_space.seed(SEED)
    for step in range(NUM_STEPS):
        action = env_1.action_space.sample()
        out_1, out_2 = env_1.step(action), env_2.step(action)
        assert data_equivalence(out_1, out_2, exact=True), step
        assert env_1.observation_space.contains(out_1[0])
        if out_1[2] or out_1[3]:
            env_1.reset(seed=SEED)
            env_2.reset(seed=SEED)
    env_1.close()
    env_2.close()


@pytest.mark.parametrize("env_id", IDS)
def test_pickle_env(env_id):
    kwargs = _spec_kwargs(env_id)
    env = gym.spec(env_id).make(disable_env_checker=True, **kwargs).unwrapped
    action = env.action_space.sample()
    reset, step = env.reset(seed=123), env.step(action)
    copy = pickle.loads(pickle.dumps(env))
    assert data_equivalence(reset, copy.reset(seed=123))
    assert data_equivalence(step, copy.step(action))
    env.close()
    copy.close()


def _check_rendered(frame, mode: str) -> None:
    if mode == "rgb_array":
        assert isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[2] == 3
        assert frame.dtype == np.uint8
    elif mode == "ansi":
        assert isinstance(frame, str) and frame
    else:
        raise AssertionError(f"unknown render mode {mode}")


@pytest.mark.parametrize("env_id", IDS)
def test_render_modes(env_id, monkeypatch):
    pytest.importorskip("pygame")
    monkeypatch.setitem(os.environ, "SDL_VIDEODRIVER", "dummy")
    monkeypatch.setitem(os.environ, "SDL_AUDIODRIVER", "dummy")
    kwargs = _spec_kwargs(env_id)
    env = gym.spec(env_id).make(**kwargs)
    assert "rgb_array" in env.metadata["render_modes"]
    for mode in env.metadata["render_modes"]:
        if mode == "human":
            continue
        new_env = gym.spec(env_id).make(render_mode=mode, **kwargs)
        try:
            new_env.reset()
            _check_rendered(new_env.render(), mode)
            new_env.step(new_env.action_space.sample())
            _check_rendered(new_env.render(), mode)
        finally:
            new_env.close()
    env.close()
