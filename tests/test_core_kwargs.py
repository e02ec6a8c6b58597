"""One declaration of an env's kwargs (``llm_gym.core.kwargs``): which are data, which are light, which reset
options exist; replay and ``llmgym serve`` both read it, so they accept the same data values."""

from __future__ import annotations

from typing import Any

import pytest

import llm_gym
from llm_gym.agent.records import EpisodeRecord
from llm_gym.core.env import TextEnv
from llm_gym.core.kwargs import (
    constructor_kwargs,
    data_kwargs,
    kwarg_defaults,
    light_kwargs,
    names_bundled_data,
    reset_options,
)
from llm_gym.registration import env_class, env_defaults
from llm_gym.render.replay import replay_env_args

ALL_IDS = llm_gym.list_envs()


class _Base(TextEnv):
    light_kwargs = ("colour",)
    reset_options = ("start",)

    def __init__(self, *, colour: str = "red", size: int = 3, **kwargs: Any):
        super().__init__(**kwargs)


class _Family(_Base):
    """A family that forgets ``data_kwargs`` for its ``dataset``: it still counts as data."""

    light_kwargs = ("hint", "dataset")  # listing a data kwarg as light does not make it light

    def __init__(self, *, hint: bool = False, dataset: str | None = None, size: int = 5, **kwargs: Any):
        super().__init__(size=size, **kwargs)


def test_declarations_follow_the_class_chain():
    names = constructor_kwargs(_Family)
    assert {"hint", "dataset", "size", "colour", "max_turns", "think", "render_mode"} <= names
    assert "self" not in names and "kwargs" not in names
    assert kwarg_defaults(_Family)["size"] == 5  # the nearest class's default, as a call gets
    assert kwarg_defaults(_Family)["max_turns"] == 5 and kwarg_defaults(_Base)["size"] == 3
    assert data_kwargs(_Family) == {"dataset": ()}  # undeclared, still data, nothing bundled
    assert light_kwargs(_Family) == set(TextEnv.light_kwargs) | {"colour", "hint"}  # never size nor dataset
    assert reset_options(_Family) == {"dynamics_seed", "start"}


def test_every_family_declares_within_its_constructor():
    for env_id in ALL_IDS:
        cls = env_class(env_id)
        taken = constructor_kwargs(cls)
        assert light_kwargs(cls) <= taken, env_id
        assert set(data_kwargs(cls)) <= taken, env_id
        assert "dynamics_seed" in reset_options(cls)
        assert set(env_defaults(env_id)) <= taken, env_id  # the id's kwargs are constructor kwargs too
    # what scales a reset's work is never light
    for env_id, heavy in (
        ("llmgym/Sokoban-v0", {"dim_room", "num_boxes", "search_depth", "solver_max_states", "generator"}),
        ("llmgym/FrozenLake-v0", {"size", "p", "generator"}),
        ("llmgym/Countdown-v0", {"num_count", "number_range", "target_range", "max_rows", "operators"}),
        ("llmgym/MetaMathQA-v0", {"checker", "split"}),
        ("llmgym/Bandit-v0", {"arm_pairs"}),
    ):
        assert not heavy & light_kwargs(env_class(env_id)), env_id


def test_bundled_data_values():
    assert names_bundled_data(None, (), "x") and names_bundled_data("sample", ("sample",), None)
    assert names_bundled_data("meta-math/MetaMathQA", (), "meta-math/MetaMathQA")  # the id's own default
    for value in ("sample", "/etc/passwd", "../x", 5, ["sample"]):
        assert not names_bundled_data(value, (), None), value


# values a record or a client might name for a data kwarg
DATA_VALUES = [
    None,
    "sample",
    "/etc/passwd",
    "meta-math/MetaMathQA",
    "Jiayi-Pan/Countdown-Tasks-3to4",
    "ragen",
]


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_replay_and_the_server_accept_the_same_data_values(env_id):
    pytest.importorskip("openenv.core.env_server", reason="the serve extra (openenv) is not installed")
    from llm_gym.serve.protocol import RequestError, check_env_kwargs

    good = {"env_id": env_id, "seed": 0, "initial_observation": "x", "turns": []}
    for key in data_kwargs(env_class(env_id)):
        for value in DATA_VALUES:
            try:
                replay_env_args(EpisodeRecord.from_dict({**good, "env_kwargs": {key: value}}))
                replay_ok = True
            except ValueError as e:
                assert "file paths are not taken from a record" in str(e)
                replay_ok = False
            try:
                check_env_kwargs(env_id, {key: value})
                server_ok = True
            except RequestError as e:
                assert e.status == 422 and "names a file or data set" in e.message
                server_ok = False
            assert replay_ok == server_ok, (key, value)
            expected = names_bundled_data(
                value, data_kwargs(env_class(env_id))[key], env_defaults(env_id)[key]
            )
            assert replay_ok == expected, (key, value)


def test_replay_refuses_countdown_sample_which_names_no_bundled_data():
    # Countdown bundles no data: "sample" would be a file in the replaying folder or a hub id (it was taken)
    def record(env_id, kwargs):
        return EpisodeRecord.from_dict(
            {"env_id": env_id, "seed": 0, "initial_observation": "x", "turns": [], "env_kwargs": kwargs}
        )

    with pytest.raises(ValueError, match="file paths are not taken from a record"):
        replay_env_args(record("llmgym/Countdown-v0", {"dataset": "sample"}))
    # MetaMathQA bundles its sample; SokobanFile-v0's own default is the bundled levels
    assert replay_env_args(record("llmgym/MetaMathQA-v0", {"dataset": "sample"}))[1] == {"dataset": "sample"}
    assert replay_env_args(record("llmgym/SokobanFile-v0", {"level_file": "sample"}))[1] == {
        "level_file": "sample"
    }
