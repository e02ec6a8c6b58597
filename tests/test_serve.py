"""``llmgym serve`` and ``llmgym/Remote-v0`` over the wire (127.0.0.1 only; every wait bounded, every server stopped).

The request checks (:mod:`llm_gym.serve.protocol`) are pure and tested without a server; the rest runs against
real ``llmgym serve`` processes: the env contract for every registered id, identical episodes to the local env,
determinism across two server processes, stock OpenEnv clients, the trainer's and evaluator's ``--env_url``
hooks, and the faults (killed client, killed and restarted server, idle client, oversized and malformed
messages, wrong token, full server).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import llm_gym
from llm_gym.serve.config import ServeConfig, token_matches
from llm_gym.serve.protocol import (
    RequestError,
    check_action,
    check_reset_request,
    jsonable,
    parse_env_urls,
    space_from_json,
    space_to_json,
)
from tests._envs import ALL_IDS, make_kwargs
from tests._serve import ROOT, running_server, start_server
from tests.test_env_contract import _responses

pytest.importorskip("openenv.core.env_server", reason="the serve extra (openenv) is not installed")
websockets = pytest.importorskip("websockets")

from llm_gym.serve.client import RemoteEnvError, RemoteRequestError  # noqa: E402

TOKEN = "t0ken-for-the-tests-0123456789"
SOKOBAN, FL = "llmgym/Sokoban-v0", "llmgym/FrozenLake-v0"


def _norm(value):
    """What JSON keeps of a value (info tuples arrive as lists): the form records store."""
    return json.loads(json.dumps(value))


def _trace(env, seed: int, responses: list[str], options=None) -> list:
    obs, info = env.reset(seed=seed, options=options)
    out = [obs, _norm(info)]
    for text in responses:
        obs, r, term, trunc, info = env.step(text)
        out += [obs, r, term, trunc, _norm(info)]
        if term or trunc:
            break
    return out


# ------------------------------------------------------------------------------------------ pure checks
SERVED = tuple(ALL_IDS)


def test_reset_request_checks_every_field():
    env_id, kwargs, seed, options = check_reset_request(
        {"seed": 3, "env_id": SOKOBAN, "env_kwargs": {"max_turns": 2}, "options": {"dynamics_seed": 1}},
        served=SERVED,
    )
    assert (env_id, kwargs, seed, options) == (SOKOBAN, {"max_turns": 2}, 3, {"dynamics_seed": 1})
    assert check_reset_request({}, served=(FL, SOKOBAN))[0] == FL  # the first served id by default
    cases = {
        404: [
            {"env_id": "CartPole-v1"},
            {"env_id": "os:system"},
            {"env_id": "llmgym/Remote-v0"},  # never served: its url would make the server connect out
            {"env_id": "llmgym/Nope-v0"},
        ],
        400: [{"sed": 3}, {"module": "os"}],
        422: [
            {"env_id": SOKOBAN, "env_kwargs": {"bogus": 1}},
            {"env_id": SOKOBAN, "env_kwargs": {"level_file": "/etc/passwd"}},
            # a hub data set other than the id's own default
            {"env_id": "llmgym/MetaMathQASample-v0", "env_kwargs": {"dataset": "meta-math/MetaMathQA"}},
            # kwargs that scale a reset's work are the operator's (this one took 93 s and 2.4 GB per session)
            {
                "env_id": "llmgym/RagenSokoban-v0",
                "env_kwargs": {"dim_room": [30, 30], "num_boxes": 10, "search_depth": 1000},
            },
            {"env_id": SOKOBAN, "env_kwargs": {"solver_max_states": 10_000_000}},
            {"env_id": FL, "env_kwargs": {"size": 64}},
            {"env_id": "llmgym/Countdown-v0", "env_kwargs": {"number_range": [0, 1000000]}},
            # an option no env understands, another family's option
            {"options": {"dynamics_sed": 1}},
            {"env_id": SOKOBAN, "options": {"map": ["SG"]}},
            # Countdown bundles no data: its "sample" would be a file in the server's folder or a hub id
            {"env_id": "llmgym/Countdown-v0", "env_kwargs": {"dataset": "sample"}},
            {"env_id": SOKOBAN, "env_kwargs": {"render_mode": "human"}},
            {"env_id": SOKOBAN, "env_kwargs": [1, 2]},
            {"seed": -1},
            {"seed": 2**64},
            {"seed": "1"},
            {"seed": True},
            {"options": [1]},
            {"options": {"x": float("nan")}},
        ],
        413: [{"env_id": SOKOBAN, "env_kwargs": {"vocab": "x" * 20000}}],
    }
    for status, requests in cases.items():
        for request in requests:
            with pytest.raises(RequestError) as err:
                check_reset_request(request, served=SERVED)
            assert err.value.status == status, request
    # the bundled sample is the one data set a client may ask for, where its family bundles one
    assert check_reset_request(
        {"env_id": "llmgym/MetaMathQA-v0", "env_kwargs": {"dataset": "sample"}}, served=SERVED
    )[1] == {"dataset": "sample"}
    assert check_reset_request(
        {"env_id": "llmgym/SokobanFile-v0", "env_kwargs": {"level_file": "sample"}}, served=SERVED
    )[1] == {"level_file": "sample"}
    with pytest.raises(RequestError, match="only ask for nothing"):
        check_reset_request(
            {"env_id": "llmgym/Countdown-v0", "env_kwargs": {"dataset": "sample"}}, served=SERVED
        )
    with pytest.raises(RequestError, match="not served here"):
        check_reset_request({"env_id": SOKOBAN}, served=(FL,))
    # kwargs the operator fixed apply, and a client may not change them
    assert check_reset_request({"env_id": SOKOBAN}, served=SERVED, fixed_kwargs={"max_turns": 3})[1] == {
        "max_turns": 3
    }
    with pytest.raises(RequestError, match="fixed by the server"):
        check_reset_request(
            {"env_id": SOKOBAN, "env_kwargs": {"max_turns": 4}}, served=SERVED, fixed_kwargs={"max_turns": 3}
        )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(
    request=st.dictionaries(
        st.sampled_from(["seed", "env_id", "env_kwargs", "options", "x"]) | st.text(max_size=6),
        json_values | st.sampled_from(ALL_IDS),
        max_size=5,
    )
)
def test_any_reset_request_is_accepted_or_refused_with_a_4xx(request):
    try:
        env_id, kwargs, seed, options = check_reset_request(request, served=SERVED)
    except RequestError as e:
        assert 400 <= e.status < 500 and e.message
        return
    assert env_id in SERVED and isinstance(kwargs, dict) and (options is None or isinstance(options, dict))
    assert seed is None or 0 <= seed < 2**64


def test_action_size_limit_is_a_413():
    assert check_action("x" * 10, 10) == "x" * 10
    with pytest.raises(RequestError) as err:
        check_action("x" * 11, 10)
    assert err.value.status == 413 and "nothing was executed" in str(err.value)
    with pytest.raises(RequestError) as err:
        check_action(None, 10)
    assert err.value.status == 422


def test_spaces_and_values_travel_as_data():
    env = gym.make(SOKOBAN)
    for space in (env.observation_space, env.action_space):
        back = space_from_json(json.loads(json.dumps(space_to_json(space))))
        assert type(back) is type(space) and back.max_length == space.max_length
        assert back.character_set == space.character_set
    for bad in ({"type": "Box"}, {"type": "Text", "max_length": -1}, {"type": "Text", "max_length": 3}, "x"):
        with pytest.raises(ValueError):
            space_from_json(bad)
    assert jsonable({"a": (1, np.int64(2), np.float32(0.5)), 3: [True, None]}) == {
        "a": [1, 2, 0.5],
        "3": [True, None],
    }
    with pytest.raises(ValueError):
        jsonable({"f": object()})


def test_tokens_and_bind_address():
    assert token_matches(f"Bearer {TOKEN}", TOKEN)
    import base64

    basic = base64.b64encode(f"any:{TOKEN}".encode()).decode()
    assert token_matches(f"Basic {basic}", TOKEN)
    for wrong in (
        None,
        "",
        f"Bearer {TOKEN}x",
        "Bearer",
        f"Token {TOKEN}",
        "Basic !!!",
        f"bearer {TOKEN[:-1]}",
    ):
        assert not token_matches(wrong, TOKEN)
    with pytest.raises(ValueError, match="needs a token"):
        ServeConfig(env_ids=(FL,), host="0.0.0.0")
    with pytest.raises(ValueError, match="at least 16"):
        ServeConfig(env_ids=(FL,), token="short")
    with pytest.raises(ValueError, match="not an llm-gym id"):
        ServeConfig(env_ids=("CartPole-v1",))
    assert ServeConfig(env_ids=(FL,), host="0.0.0.0", token=TOKEN).limits()["token_required"]
    assert parse_env_urls("http://a:1, http://b:2") == ["http://a:1", "http://b:2"]
    assert parse_env_urls(None) is None
    for bad in ("a:1", "file:///x", ["http://a:1", 3]):
        with pytest.raises(ValueError):
            parse_env_urls(bad)
    # a token in --env_url would be saved with the run's settings (checkpoints, trackers): refused, never echoed
    secret = "s3cret-token-0123456789"
    for bad in (f"http://llmgym:{secret}@127.0.0.1:8000", f"http://a:1,ws://{secret}@h:2"):
        with pytest.raises(ValueError, match="LLMGYM_SERVE_TOKEN") as err:
            parse_env_urls(bad)
        assert secret not in str(err.value)
    assert parse_env_urls(f"http://u:{secret}@h:1", allow_credentials=True) == [f"http://u:{secret}@h:1"]


def test_operator_kwargs_must_be_taken_by_a_served_id():
    # A misspelt kwarg would be dropped for every id: clients would get the default data (the hub), not the file.
    for ids, kwargs in (
        (("llmgym/MetaMathQA-v0",), {"datset": "/data/mm.jsonl"}),
        ((SOKOBAN, FL), {"dataset": "x.jsonl"}),  # neither takes a dataset
        ((SOKOBAN,), {"render_mode": "human"}),  # the server never renders
    ):
        with pytest.raises(ValueError, match="--env_kwargs"):
            ServeConfig(env_ids=ids, env_kwargs=kwargs)
    # fixed for every served id that takes it: one id taking it is enough
    assert ServeConfig(env_ids=(SOKOBAN, "llmgym/MetaMathQA-v0"), env_kwargs={"dataset": "sample"}).env_kwargs


def test_allowed_client_kwargs_must_be_taken_and_never_data():
    assert ServeConfig(
        env_ids=(SOKOBAN,), allow_client_kwargs=("search_depth", "search_depth")
    ).allow_client_kwargs == ("search_depth",)
    assert ServeConfig(env_ids=(SOKOBAN,), allow_client_kwargs=("all",)).allow_client_kwargs == ("all",)
    for names, why in (
        (("level_file",), "data and rendering"),
        (("render_mode",), "data and rendering"),
        (("sise",), "no served id"),
    ):
        with pytest.raises(ValueError, match=why):
            ServeConfig(env_ids=(SOKOBAN,), allow_client_kwargs=names)


def test_ids_whose_default_data_is_a_hub_data_set_are_served_only_when_named(capsys):
    from llm_gym.cli import build_parser
    from llm_gym.serve.config import config_from_args

    parser = build_parser()
    served = config_from_args(parser.parse_args(["serve"])).env_ids
    assert "llmgym/MetaMathQA-v0" not in served and "llmgym/MetaMathQARetry-v0" not in served
    assert "llmgym/MetaMathQASample-v0" in served and SOKOBAN in served  # bundled or generated data
    given = config_from_args(parser.parse_args(["serve", "--env_kwargs", '{"dataset": "sample"}']))
    assert "llmgym/MetaMathQA-v0" in given.env_ids  # the operator gave its data
    named = config_from_args(parser.parse_args(["serve", "--env", "MetaMathQA"])).env_ids
    assert named == ("llmgym/MetaMathQA-v0",)  # the operator's choice
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--help"])
    assert "hub data set" in " ".join(capsys.readouterr().out.split())


def test_cli_refuses_an_open_address_without_a_token_and_unknown_ids(monkeypatch, capsys):
    from llm_gym.cli import main

    monkeypatch.delenv("LLMGYM_SERVE_TOKEN", raising=False)
    for args in (
        ["--host", "0.0.0.0"],
        ["--env", "CartPole-v1"],
        ["--env_kwargs", "[1]"],
        ["--port", "-5"],
        ["--allow_client_kwargs", "dataset"],
        ["--max_concurrent_resets", "0"],
        ["--shutdown_timeout", "-1"],
    ):
        assert main(["serve", *args]) == 2, args  # refused before binding anything
        err = capsys.readouterr().err
        assert err.startswith("llmgym serve: error:") and "Traceback" not in err


def test_remote_id_is_registered_but_never_trusted_from_a_record():
    assert "llmgym/Remote-v0" in gym.registry and "llmgym/Remote-v0" not in llm_gym.list_envs()
    with pytest.raises(ValueError):
        llm_gym.registration.check_trusted_env_id("llmgym/Remote-v0")


# --------------------------------------------------------------------------------------- over the wire
def test_clients_set_light_kwargs_and_only_repeat_the_servers_others():
    def kwargs(env_id, env_kwargs, **kw):
        return check_reset_request({"env_id": env_id, "env_kwargs": env_kwargs}, served=SERVED, **kw)[1]

    ragen = "llmgym/RagenSokoban-v0"
    light = {
        "max_turns": 2,
        "max_actions": 4,
        "think": False,
        "parse_mode": "ragen",
        "observation_format": "grid_coord",
    }
    assert kwargs(SOKOBAN, light) == light
    # a work-scaling kwarg at the value the server uses anyway (the id's own, a tuple default as a list) is fine
    assert (
        kwargs(ragen, {"search_depth": 300, "generator": "ragen", "dim_room": [6, 6]})["search_depth"] == 300
    )
    with pytest.raises(RequestError, match="--allow_client_kwargs search_depth") as err:
        kwargs(ragen, {"search_depth": 1000})
    assert (
        "this server uses 300" in err.value.message and "max_turns" in err.value.message
    )  # what a client may set
    # the operator's value instead, which clients may repeat; or the operator lets clients choose
    fixed = {"generator": "ragen", "search_depth": 300}
    assert kwargs(SOKOBAN, fixed, fixed_kwargs=fixed) == fixed
    with pytest.raises(RequestError, match="fixed by the server"):
        kwargs(SOKOBAN, {"search_depth": 30}, fixed_kwargs=fixed)
    assert kwargs(ragen, {"search_depth": 30}, allow=("search_depth",))["search_depth"] == 30
    assert kwargs(ragen, {"dim_room": [7, 7], "num_boxes": 2}, allow=("all",))["num_boxes"] == 2
    with pytest.raises(
        RequestError, match="names a file or data set"
    ):  # data stays the operator's, even with all
        kwargs("llmgym/MetaMathQA-v0", {"dataset": "/etc/passwd"}, allow=("all",))
    # each family's documented reset options travel; nothing else does
    for env_id, options in (
        (FL, {"map": ["SF", "FG"], "dynamics_seed": 2}),
        (SOKOBAN, {"level": "#####\n#@$.#\n#####"}),
        ("llmgym/SokobanFile-v0", {"level_index": 0}),
        ("llmgym/Countdown-v0", {"nums": [1, 2], "target": 3}),
        ("llmgym/MetaMathQASample-v0", {"index": 1}),
    ):
        assert check_reset_request({"env_id": env_id, "options": options}, served=SERVED)[3] == options
    with pytest.raises(RequestError, match="does not take the option 'index'"):
        check_reset_request({"env_id": FL, "options": {"index": 1}}, served=SERVED)


PROFILES = ROOT / "trainer" / "profiles"


@pytest.mark.parametrize(
    "profile", sorted(p.relative_to(PROFILES).as_posix() for p in PROFILES.glob("*/[!_]*.yaml"))
)
def test_every_profiles_env_kwargs_work_on_a_server_started_with_its_heavy_ones(profile):
    """The recipe docs/serving.md gives: the operator starts the server with the run's kwargs that clients may not
    set (RAGEN's generator, search depth, data), the run sends all of its kwargs, and the server takes them."""
    import yaml

    from llm_gym.registration import resolve_env_id
    from llm_gym.serve.protocol import changed_kwargs, client_settable

    common = PROFILES / profile.split("/")[0] / "_common.yaml"
    settings = {**(yaml.safe_load(common.read_text()) if common.exists() else {})}
    settings.update(yaml.safe_load((PROFILES / profile).read_text()))
    env_id = resolve_env_id(settings["env"])
    # what LLMGymGRPOConfig.make_env_kwargs sends: the turn/action limits and think, then env_kwargs
    run = {
        k: settings[k] for k in ("max_turns", "max_actions_per_turn", "max_actions", "think") if k in settings
    }
    run.update(settings.get("env_kwargs") or {})
    operator = {k: v for k, v in run.items() if k not in client_settable(env_id)}
    # light: everything else (FrozenLake's size: the organism's 3x3 board, heavy because it scales a reset)
    assert set(operator) <= {"generator", "search_depth", "dataset", "size"}, operator
    served = (env_id,)
    _, kwargs, _, _ = check_reset_request(
        {"env_id": env_id, "env_kwargs": run}, served=served, fixed_kwargs=operator
    )
    assert kwargs == run and set(changed_kwargs(env_id, operator)) <= set(run)


@pytest.fixture(scope="module")
def server():
    with running_server("--env", ",".join(ALL_IDS)) as s:  # every registered id, named (hub-data ids too)
        yield s


def _remote(server, env_id, **kw):
    return gym.make("llmgym/Remote-v0", url=server.url, env_id=env_id, env_kwargs=make_kwargs(env_id), **kw)


@pytest.mark.parametrize(
    "poison",
    [
        lambda d: d.update(reward=float("nan")),
        lambda d: d.update(reward=float("-inf")),
        lambda d: d["observation"]["info"].update(score=float("inf")),
        lambda d: d["observation"]["info"].update(nested={"deep": [1.0, float("nan")]}),
    ],
)
def test_non_finite_rewards_and_info_from_a_server_never_reach_the_agent(server, monkeypatch, poison):
    from llm_gym.serve.client import RemoteEnv, RemoteEnvError

    env = _remote(server, "llmgym/Bandit-v0")
    env.reset(seed=0)
    real = RemoteEnv._call

    def hostile(self, message):  # the server's step reply, as a hostile server would send it
        data = real(self, message)
        if message.get("type") == "step":
            poison(data)
        return data

    monkeypatch.setattr(RemoteEnv, "_call", hostile)
    try:
        with pytest.raises(RemoteEnvError, match="NaN or an infinite number"):
            env.step(env.unwrapped.example_response())
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ["llmgym/FrozenLake-v0", "llmgym/Bandit-v0"])
def test_a_solver_demonstration_of_a_served_env_is_the_local_one(server, env_id):
    """CPU defaults show a solver demonstration; the served env mirrors no expert, so it is played locally."""
    from llm_gym.agent.chat import ChatFormat, example_exchange

    fmt = ChatFormat(one_shot=True, demonstration="solver")
    remote = _remote(server, env_id)
    try:
        shown = example_exchange(remote, fmt)
    finally:
        remote.close()
    assert shown == example_exchange(gym.make(env_id, **make_kwargs(env_id)), fmt)
    assert shown and shown[-1]["role"] == "assistant"


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_contract_and_identical_episodes_over_the_wire(server, env_id):
    remote = _remote(server, env_id)
    local = gym.make(env_id, **make_kwargs(env_id))
    try:
        check_env(remote.unwrapped)
        for seed in (0, 11):
            local.reset(seed=seed)  # some families draw valid answers from the current state
            responses = _responses(local, 6, seed)
            assert _trace(remote, seed, responses) == _trace(local, seed, responses)
            base, rbase = local.unwrapped, remote.unwrapped
            assert rbase.instructions == base.instructions
            for name in ("turn", "actions_left", "turns_left", "think", "max_turns", "action_sep"):
                if hasattr(base, name):
                    assert getattr(rbase, name) == getattr(base, name), name
            assert tuple(rbase.action_names or ()) == tuple(base.action_names or ())
            assert rbase.reward_spec == base.reward_spec
            assert rbase.example_response() == base.example_response()
        assert remote.observation_space.max_length == local.observation_space.max_length
    finally:
        remote.close()
        local.close()


def test_group_of_sessions_shares_a_start_and_dynamics_seeds_split_transitions(server):
    envs = [
        gym.make("llmgym/Remote-v0", url=server.url, env_id="llmgym/FrozenLakeSlippery-v0") for _ in range(6)
    ]
    try:
        starts = {e.reset(seed=21)[0] for e in envs}
        assert len(starts) == 1  # a GRPO group: one seed, one start state, in six sessions
        local = gym.make("llmgym/FrozenLakeSlippery-v0")
        moves = ["<think>x</think><answer>Right || Down</answer>"] * 3
        for k, e in enumerate(envs):  # dynamics_seed travels in options and gives the local env's transitions
            assert _trace(e, 21, moves, {"dynamics_seed": k}) == _trace(
                local, 21, moves, {"dynamics_seed": k}
            )
    finally:
        for e in envs:
            e.close()


@pytest.mark.slow  # two server processes or a server restart: ~10-20 s on 2 loaded cores
def test_determinism_across_two_server_processes():
    responses = [
        "<think>a</think><answer>Up || Left</answer>",
        "bad",
        "<think>b</think><answer>Down</answer>",
    ]
    traces = []
    for hashseed in ("1", "2"):
        with running_server("--env", SOKOBAN, "--env", FL, env={"PYTHONHASHSEED": hashseed}) as s:
            run = []
            for env_id in (SOKOBAN, FL):
                env = gym.make("llmgym/Remote-v0", url=s.url, env_id=env_id)
                run += [_trace(env, seed, responses, {"dynamics_seed": 3}) for seed in (5, 6)]
                env.close()
            traces.append(run)
    assert traces[0] == traces[1]


def test_stock_openenv_client_round_trip(server):
    from openenv.core import GenericEnvClient

    local = gym.make(SOKOBAN)
    with GenericEnvClient(base_url=server.url).sync() as client:
        result = client.reset(seed=4, env_id=SOKOBAN)
        obs, info = local.reset(seed=4)
        assert result.observation["text"] == obs and result.done is False and result.reward is None
        assert result.observation["instructions"] == local.unwrapped.instructions
        assert result.observation["info"] == _norm(info)
        action = "<think>t</think><answer>Left || Up</answer>"
        result = client.step({"text": action})
        obs, reward, term, trunc, info = local.step(action)
        assert result.observation["text"] == obs and result.reward == reward
        assert result.done == (term or trunc) and result.observation["terminated"] == term
        assert result.observation["info"] == _norm(info)
        state = client.state()
        assert state["env_id"] == SOKOBAN and state["seed"] == 4 and state["step_count"] == 1
        with pytest.raises(
            RuntimeError, match="does not take 'sed'"
        ):  # a stock server would drop it silently
            client.reset(sed=4)
        with pytest.raises(RuntimeError, match="Invalid message|VALIDATION"):
            client.step({"txt": "x"})
    assert server.wait_open_envs(0) == 0


# ---------------------------------------------------------------------------------------------- faults
def test_unknown_ids_and_bad_kwargs_are_clear_4xx(server):
    with pytest.raises(RemoteRequestError) as err:
        gym.make("llmgym/Remote-v0", url=server.url, env_id=SOKOBAN, env_kwargs={"bogus": 1})
    assert err.value.status == 422 and "bogus" in str(err.value)
    with pytest.raises(RemoteRequestError) as err:
        gym.make("llmgym/Remote-v0", url=server.url, env_id=SOKOBAN, env_kwargs={"level_file": "/etc/passwd"})
    assert err.value.status == 422
    with pytest.raises(RemoteRequestError) as err:
        gym.make("llmgym/Remote-v0", url=server.url, env_id=SOKOBAN, env_kwargs={"max_turns": 0})
    assert err.value.status == 422 and "max_turns" in str(err.value)
    with pytest.raises(ValueError, match="not an llm-gym id"):  # refused before anything is sent
        gym.make("llmgym/Remote-v0", url=server.url, env_id="CartPole-v1")
    # the reset measured at 93 s and 2.4 GB per session: refused before any work
    heavy = {"dim_room": [30, 30], "num_boxes": 10, "search_depth": 1000, "solver_max_states": 10_000_000}
    t0 = time.monotonic()
    with pytest.raises(RemoteRequestError, match="server operator's") as err:
        gym.make("llmgym/Remote-v0", url=server.url, env_id="llmgym/RagenSokoban-v0", env_kwargs=heavy)
    assert err.value.status == 422 and time.monotonic() - t0 < 10
    env = gym.make("llmgym/Remote-v0", url=server.url, env_id=SOKOBAN)
    with pytest.raises(RemoteRequestError, match="does not take the option 'dynamics_sed'"):
        env.reset(
            seed=1, options={"dynamics_sed": 1}
        )  # a local env would ignore it: a group without its seeds
    env.close()


def test_oversized_action_is_a_413_and_the_session_goes_on(server):
    remote = gym.make("llmgym/Remote-v0", url=server.url, env_id=SOKOBAN)
    local = gym.make(SOKOBAN)
    try:
        assert remote.reset(seed=2)[0] == local.reset(seed=2)[0]
        with pytest.raises(RemoteRequestError) as err:
            remote.step("x" * 16385)
        assert err.value.status == 413 and "nothing was executed" in str(err.value)
        action = "<think>t</think><answer>Right</answer>"
        assert _norm(remote.step(action)) == _norm(local.step(action))  # as if the big action never came
    finally:
        remote.close()


def _raw_session(url, token=None):
    from websockets.sync.client import connect

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return connect(
        "ws" + url[4:] + "/ws", additional_headers=headers, open_timeout=10, proxy=None, max_size=None
    )


def test_malformed_and_oversized_messages(server):
    from websockets.exceptions import ConnectionClosed

    with _raw_session(server.url) as ws:
        for raw, code in (
            ("{not json", "INVALID_JSON"),
            (json.dumps({"type": "teleport"}), "UNKNOWN_TYPE"),
            (json.dumps({"type": "step", "data": {"text": 5}}), "VALIDATION_ERROR"),
            (json.dumps({"type": "step", "data": {"text": "x"}}), "EXECUTION_ERROR"),  # no reset yet: a 409
            (json.dumps({"type": "reset", "data": {"env_id": "os:system"}}), "EXECUTION_ERROR"),
        ):
            ws.send(raw)
            reply = json.loads(ws.recv(timeout=20))
            assert reply["type"] == "error" and reply["data"]["code"] == code, (raw, reply)
        ws.send(
            json.dumps({"type": "reset", "data": {"seed": 1, "env_id": SOKOBAN}})
        )  # the session still works
        assert json.loads(ws.recv(timeout=20))["type"] == "observation"
        ws.send("x" * (300 << 10))  # over the transport limit: the connection is closed (1009)
        with pytest.raises(ConnectionClosed) as err:
            ws.recv(timeout=20)
        assert err.value.rcvd is not None and err.value.rcvd.code == 1009
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for body, status in ((b"{", 400), (b"[1]", 400), (json.dumps({"env_id": FL, "x": 1}).encode(), 400)):
        req = urllib.request.Request(server.url + "/llmgym/describe", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            opener.open(req, timeout=20)
        assert err.value.code == status
    import http.client

    conn = http.client.HTTPConnection(server.url.split("//", 1)[1], timeout=20)
    conn.putrequest("POST", "/llmgym/describe")
    conn.putheader("Content-Length", str(2 << 20))  # refused on the header, before the body is read
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()

    # OpenEnv's stateless HTTP routes: /reset answers the first observation, /step has no episode (409)
    def post(path, payload):
        req = urllib.request.Request(
            server.url + path, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with opener.open(req, timeout=20) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    status, body = post("/reset", {"seed": 8, "env_id": SOKOBAN})
    assert status == 200 and body["observation"]["text"] == gym.make(SOKOBAN).reset(seed=8)[0]
    assert post("/reset", {"env_id": "os:system"})[0] == 404
    status, body = post("/step", {"action": {"text": "<answer>Up</answer>"}})
    assert status == 409 and "reset first" in body["detail"]
    # POST /mcp answers JSON-RPC without state (tests/test_openenv.py); OpenEnv's other MCP routes are refused
    req = urllib.request.Request(server.url + "/mcp/tools", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        opener.open(req, timeout=20)
    assert err.value.code == 404
    assert server.wait_open_envs(0) == 0


@pytest.mark.slow  # two server processes or a server restart: ~10-20 s on 2 loaded cores
def test_wrong_token_is_refused_and_the_right_one_works():
    with running_server("--env", FL, env={"LLMGYM_SERVE_TOKEN": TOKEN}) as s:
        for token in (None, TOKEN + "x"):
            with pytest.raises(RemoteEnvError, match="401"):
                gym.make("llmgym/Remote-v0", url=s.url, env_id=FL, token=token or "")
        from websockets.exceptions import InvalidStatus

        with pytest.raises(InvalidStatus) as err:
            _raw_session(s.url, token="wrong-token-wrong-token")
        assert err.value.response.status_code == 401
        env = gym.make("llmgym/Remote-v0", url=s.url, env_id=FL, token=TOKEN)
        assert env.reset(seed=1)[0] == gym.make(FL).reset(seed=1)[0]
        env.close()
        # a stock OpenEnv client sends no headers: the token goes in the URL (HTTP Basic)
        from openenv.core import GenericEnvClient

        host = s.url.split("//", 1)[1]
        with GenericEnvClient(base_url=f"http://llmgym:{TOKEN}@{host}").sync() as client:
            assert client.reset(seed=1).observation["text"] == gym.make(FL).reset(seed=1)[0]
        assert s.wait_open_envs(0, token=TOKEN) == 0


CLIENT_SCRIPT = """
import sys, time, gymnasium as gym, llm_gym
env = gym.make("llmgym/Remote-v0", url=sys.argv[1], env_id="llmgym/Sokoban-v0")
env.reset(seed=1)
env.step("<think>.</think><answer>Up</answer>")
print("mid-episode", flush=True)
time.sleep(120)
"""


def test_client_killed_mid_episode_frees_its_session(server):
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT_SCRIPT, server.url], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "mid-episode"
        assert server.status()["open_envs"] >= 1
        proc.kill()
        proc.wait(timeout=15)
        assert server.wait_open_envs(0) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=15)


@pytest.mark.slow  # two server processes or a server restart: ~10-20 s on 2 loaded cores
def test_server_killed_and_restarted_gives_a_clear_error_then_a_new_session():
    s = start_server("--env", SOKOBAN)
    try:
        env = gym.make("llmgym/Remote-v0", url=s.url, env_id=SOKOBAN, request_timeout_s=20)
        env.reset(seed=3)
        port = s.port
        s.kill()
        t0 = time.monotonic()
        with pytest.raises(RemoteEnvError, match="connection was lost|closed the session|cannot"):
            env.step("<think>.</think><answer>Up</answer>")
        assert time.monotonic() - t0 < 15  # an error, not a hang
        with pytest.raises(gym.error.ResetNeeded):
            env.step("<think>.</think><answer>Up</answer>")
        with pytest.raises(RemoteEnvError, match="cannot open a session"):
            env.reset(seed=3)  # nothing listens now
        s = start_server("--env", SOKOBAN, port=port)
        assert env.reset(seed=3)[0] == gym.make(SOKOBAN).reset(seed=3)[0]  # a new session on the new server
        env.close()
        assert s.wait_open_envs(0) == 0
    finally:
        s.stop()


def _open_room(width: int, height: int, boxes: int) -> str:
    """An XSB level: an empty room, boxes and goals far apart (the solver searches a large space)."""
    rows = (
        [list("#" * width)]
        + [list("#" + " " * (width - 2) + "#") for _ in range(height - 2)]
        + [list("#" * width)]
    )
    rows[1][1] = "@"
    for i in range(boxes):
        rows[3 + 2 * i][3 + i], rows[height - 3 - i][width - 3 - 2 * i] = "$", "."
    return "\n".join("".join(r) for r in rows)


@pytest.mark.slow  # two server processes, each stopped mid-reset: ~15 s
def test_a_stop_is_bounded_while_a_long_reset_runs_and_sessions_hear_why():
    # The operator's solver budget lets a level given in options run for minutes; a stop must not wait for it.
    operator = json.dumps({"solver_max_states": 10_000_000})
    long_reset = {
        "type": "reset",
        "data": {"seed": 1, "env_id": SOKOBAN, "options": {"level": _open_room(40, 40, 5)}},
    }
    for signals, grace, bound in (([signal.SIGTERM], "1", 10.0), ([signal.SIGINT, signal.SIGINT], "60", 5.0)):
        s = start_server("--env", SOKOBAN, "--env_kwargs", operator, "--shutdown_timeout", grace)
        try:
            other = gym.make("llmgym/Remote-v0", url=s.url, env_id=SOKOBAN)
            other.reset(seed=2)
            with _raw_session(s.url) as ws:
                ws.send(json.dumps(long_reset))
                time.sleep(1.5)  # the solver is running in the session's thread
                t0 = time.monotonic()
                for sig in signals:  # one signal: a graceful stop within --shutdown_timeout; two: at once
                    s.proc.send_signal(sig)
                    time.sleep(0.3)
                s.proc.wait(timeout=30)
                assert time.monotonic() - t0 < bound, signals
            if len(signals) == 1:  # a graceful stop closes every session with 1012: clients say so
                with pytest.raises(RemoteEnvError, match="server is stopping or restarting"):
                    other.step("<think>.</think><answer>Up</answer>")
            other.close()
        finally:
            s.kill()


def test_idle_client_is_expired_and_full_server_refuses_clearly():
    with running_server("--env", FL, "--idle_timeout", "1", "--max_sessions", "2") as s:
        a = gym.make("llmgym/Remote-v0", url=s.url, env_id=FL)
        b = gym.make("llmgym/Remote-v0", url=s.url, env_id=FL)
        c = gym.make("llmgym/Remote-v0", url=s.url, env_id=FL)
        a.reset(seed=1)
        b.reset(seed=1)
        with pytest.raises(RemoteEnvError, match="CAPACITY_REACHED|capacity"):
            c.reset(seed=1)
        time.sleep(2.5)  # a and b are idle past the limit: closed by the server
        with pytest.raises(RemoteEnvError, match="idle"):
            a.step("<think>.</think><answer>Up</answer>")
        assert s.wait_open_envs(0) == 0
        assert c.reset(seed=1)[0] == gym.make(FL).reset(seed=1)[0]  # room again
        for e in (a, b, c):
            e.close()
        assert s.wait_open_envs(0) == 0


# ------------------------------------------------------------------------------------ our loops remote
#: What ``llmgym-train --profile ragen2 --env Sokoban`` sends (trainer/profiles/ragen2/sokoban.yaml), max_turns cut
RAGEN_RUN = {
    "max_turns": 2,
    "generator": "ragen",
    "search_depth": 300,
    "observation_format": "grid_coord",
    "observation_style": "ragen",
    "parse_mode": "ragen",
}


@pytest.fixture(scope="module")
def ragen_server():
    """A server set up for RAGEN-2's Sokoban runs: the operator fixes RAGEN's generator (clients may not choose a
    generator or its search depth), and holds 4 sessions."""
    fixed = json.dumps({"generator": "ragen", "search_depth": 300})
    with running_server("--env", f"{SOKOBAN},{FL}", "--env_kwargs", fixed, "--max_sessions", "4") as s:
        yield s


def test_runs_check_kwargs_and_room_on_every_server_before_the_model_loads(ragen_server, server):
    from llm_gym.agent.rollout import rollout
    from llm_gym.serve.client import check_servers

    url = ragen_server.url
    check_servers([url], [SOKOBAN], RAGEN_RUN, sessions=4, command="x")
    check_servers([url, url], [SOKOBAN], RAGEN_RUN, sessions=8, command="x")  # 4 on each
    with pytest.raises(ValueError, match="llmgym serve --max_sessions 5 or more"):
        check_servers([url], [SOKOBAN], RAGEN_RUN, sessions=5, command="x")
    # a run that leaves out what the operator fixed would record kwargs that replay to other episodes
    with pytest.raises(ValueError, match='generator="ragen", search_depth=300') as err:
        check_servers([url], [SOKOBAN], {"max_turns": 2}, sessions=1, command="x")
    assert '--env_kwargs \'{"max_turns": 2, "generator": "ragen", "search_depth": 300}\'' in str(err.value)
    # a server whose operator fixed nothing refuses RAGEN's generator from a client, naming the way out
    with pytest.raises(RemoteRequestError, match="--allow_client_kwargs generator"):
        check_servers([server.url], [SOKOBAN], RAGEN_RUN, sessions=1, command="x")

    def policy(batch):
        return ["<think>.</think><answer>Up || Left</answer>"] * len(batch)

    remote = rollout(SOKOBAN, [5, 6], policy, env_kwargs=RAGEN_RUN, env_url=[url])
    local = rollout(SOKOBAN, [5, 6], policy, env_kwargs=RAGEN_RUN)
    assert [_norm(r.to_dict()) for r in remote] == [_norm(r.to_dict()) for r in local]
    assert ragen_server.wait_open_envs(0) == 0


def test_eval_refuses_a_batch_the_server_cannot_hold_before_the_model_loads(ragen_server, tmp_path, capsys):
    pytest.importorskip("transformers")
    from llm_gym.trainer.evaluate import main

    argv = [
        "--model",
        "m",
        "--env",
        "Sokoban",
        "--env_kwargs",
        json.dumps(RAGEN_RUN),
        "--env_url",
        ragen_server.url,
    ]
    assert (
        main([*argv, "--batch_size", "6", "--num_eval_seeds", "10", "--output_dir", str(tmp_path / "o")]) == 2
    )
    err = capsys.readouterr().err
    assert "plays up to 6 episodes at once" in err and "--max_sessions 6" in err
    assert not (tmp_path / "o").exists()


def test_train_refuses_a_round_the_server_cannot_hold_before_the_model_loads(
    ragen_server, tiny_dir, tmp_path, capsys
):
    from llm_gym.trainer import cli as train_cli

    argv = [
        "--env",
        "Sokoban",
        "--model",
        str(tiny_dir),
        "-o",
        str(tmp_path / "o"),
        "--env_url",
        ragen_server.url,
    ]
    argv += ["--env_kwargs", json.dumps(RAGEN_RUN), "--num_prompts", "2", "--num_generations", "4"]
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "plays up to 8 episodes at once" in err and "--max_sessions 8" in err, err
    assert not (tmp_path / "o").exists()


def test_agent_rollout_records_are_identical_over_several_servers(server):
    from llm_gym.agent.rollout import rollout

    replies = iter(
        ["<think>a</think><answer>Right || Down</answer>", "nope", "<think>b</think><answer>Left</answer>"]
        * 50
    )

    def policy(batch):
        return [next(replies) for _ in batch]

    with running_server("--env", FL) as second:
        urls = [server.url, second.url]
        remote = rollout(FL, [3, 4], policy, group_size=2, env_kwargs={"max_turns": 3}, env_url=urls)
    replies = iter(
        ["<think>a</think><answer>Right || Down</answer>", "nope", "<think>b</think><answer>Left</answer>"]
        * 50
    )
    local = rollout(FL, [3, 4], policy, group_size=2, env_kwargs={"max_turns": 3})
    assert [_norm(r.to_dict()) for r in remote] == [_norm(r.to_dict()) for r in local]


def test_trainer_token_rollouts_are_identical_remote(server):
    pytest.importorskip("transformers")
    from llm_gym.trainer.chat_templates import ChatTemplateTokens
    from llm_gym.trainer.rollouts import play_token_episodes

    from tests._tiny import build_tiny_tokenizer
    from tests.test_trainer_rollouts import ANSWERS, ScriptedGenerate

    template = ChatTemplateTokens(build_tiny_tokenizer("chatml"))
    out = []
    for env_url in (None, [server.url]):
        eps = play_token_episodes(
            "llmgym/FrozenLake-v0",
            [4, 4, 5, 5],
            ScriptedGenerate(template, ANSWERS),
            template,
            max_new_tokens=48,
            max_completion_length=2000,
            env_kwargs={"max_turns": 3},
            group_size=2,
            group_dynamics="independent",
            env_url=env_url,
        )
        out.append([(e.prompt_ids, e.completion_ids, e.env_mask, _norm(e.record.to_dict())) for e in eps])
    assert out[0] == out[1]


def test_eval_cli_accepts_env_url_and_refuses_bad_ones(tmp_path):
    pytest.importorskip("transformers")
    from llm_gym.trainer.evaluate import build_parser

    args = build_parser().parse_args(
        ["--model", "m", "--env_url", "http://127.0.0.1:1", "http://127.0.0.1:2"]
    )
    assert parse_env_urls(args.env_url) == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    from llm_gym.trainer.evaluate import main

    assert main(["--model", "m", "--env_url", "nonsense", "--output_dir", str(tmp_path / "o")]) == 2


# ----------------------------------------------------------------------------------- the guard, in-process
def _drive(guard, scope, incoming):
    """Run ``guard`` on one ASGI connection fed ``incoming`` messages; returns what it sent."""
    import asyncio

    sent = []

    async def run():
        queue = asyncio.Queue()
        for m in incoming:
            queue.put_nowait(m)

        async def receive():
            return await queue.get()

        async def send(m):
            sent.append(m)

        await asyncio.wait_for(guard(scope, receive, send), 10)

    asyncio.run(run())
    return sent


def _guard(app, **kw):
    from llm_gym.serve.server import Guard

    return Guard(app, ServeConfig(env_ids=(FL,), **kw))


def test_guard_bounds_a_slow_request_and_expires_an_idle_session():
    import asyncio

    async def slow_ws_app(scope, receive, send):
        await receive()  # connect
        await send({"type": "websocket.accept"})
        while True:
            m = await receive()
            if m["type"] == "websocket.disconnect":
                return
            await asyncio.sleep(1)  # a reset or step that takes longer than the bound
            await send({"type": "websocket.send", "text": "late"})

    scope = {"type": "websocket", "path": "/ws", "headers": []}
    guard = _guard(slow_ws_app, request_timeout_s=0.2)
    sent = _drive(guard, scope, [{"type": "websocket.connect"}, {"type": "websocket.receive", "text": "{}"}])
    assert sent[0]["type"] == "websocket.accept"
    assert json.loads(sent[1]["text"])["data"]["code"] == "TIMEOUT"
    assert sent[2] == {"type": "websocket.close", "code": 4504, "reason": "request timeout"}
    assert "late" not in [m.get("text") for m in sent]  # the late reply is dropped

    guard = _guard(slow_ws_app, idle_timeout_s=0.2)
    sent = _drive(guard, scope, [{"type": "websocket.connect"}])  # then nothing: idle
    assert sent[-1]["type"] == "websocket.close" and sent[-1]["code"] == 4408

    async def slow_http_app(scope, receive, send):
        await asyncio.sleep(5)

    http = {"type": "http", "path": "/llmgym/describe", "headers": []}
    sent = _drive(
        _guard(slow_http_app, request_timeout_s=0.2), http, [{"type": "http.request", "body": b"{}"}]
    )
    assert sent[0]["status"] == 504


def test_resets_wait_for_a_slot_and_give_up_within_the_request_bound():
    import threading

    from llm_gym.serve.server import _Runtime

    runtime = _Runtime(ServeConfig(env_ids=(FL,), max_concurrent_resets=2, request_timeout_s=0.3))
    inside, peak, lock = [0], [0], threading.Lock()

    def reset():
        with runtime.reset_slot():
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(0.05)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=reset) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert peak[0] == 2  # never more than max_concurrent_resets at once, and every one ran
    with runtime.reset_slot(), runtime.reset_slot():  # both slots taken: the next request waits, then a 503
        t0 = time.monotonic()
        with pytest.raises(RequestError) as err:
            with runtime.reset_slot():
                pass
        assert err.value.status == 503 and 0.25 < time.monotonic() - t0 < 5


def test_guard_refuses_before_the_app_sees_anything():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["path"])

    ws = {"type": "websocket", "path": "/ws", "headers": [(b"authorization", b"Bearer nope")]}
    sent = _drive(_guard(app, token=TOKEN), ws, [{"type": "websocket.connect"}])
    assert sent[0]["type"] in ("websocket.http.response.start", "websocket.close")
    assert sent[0].get("status", 401) == 401
    http = {"type": "http", "path": "/llmgym/status", "headers": [(b"content-length", b"99999999")]}
    assert _drive(_guard(app), http, [{"type": "http.request", "body": b""}])[0]["status"] == 413
    http = {"type": "http", "path": "/mcp", "headers": []}
    assert _drive(_guard(app), http, [{"type": "http.request", "body": b""}])[0]["status"] == 404
    assert seen == []


def test_llm_gym_imports_without_the_serve_extra():
    code = (
        "import sys; sys.modules['openenv'] = None; sys.modules['websockets'] = None\n"
        "import gymnasium as gym, llm_gym\n"
        "from llm_gym.cli import build_parser; build_parser()\n"
        "gym.make('llmgym/FrozenLake-v0').reset(seed=0)\n"
        "try:\n    import llm_gym.serve.server\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'llm-gym[serve]'" in out.stdout


@pytest.mark.slow  # a server and a few hundred sessions: ~15 s
def test_benchmark_quick_mode(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "env_server.py"), "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["server"]["errors"] == 0 and result["server"]["steps"] == 8 * 20
    assert result["churn"]["open_envs_after"] == 0 and "ratios" in run.stdout
    slow = result["slowloris"]  # the load again beside half-sent requests: none starves it
    assert slow["errors"] == 0 and slow["health_errors"] == 0 and slow["steps"] == 8 * 20
    assert slow["health_probes"] > 0 and slow["slow_closed_by_server"] >= 40


@pytest.mark.parametrize("style", ["llmgym", "ragen"])
def test_chat_styles_and_one_shot_format_remote_envs_as_local_ones(server, style):
    from llm_gym.agent.chat import ChatFormat
    from llm_gym.agent.rollout import rollout

    seen = {}

    def policy(batch, generation_prefix=""):
        seen.setdefault("prompts", []).append(batch)
        return [
            "Left || Up</think><answer>Left || Up</answer>" if generation_prefix else "<answer>Up</answer>"
        ] * len(batch)

    out = []
    for env_id in ("llmgym/Sokoban-v0", "llmgym/RagenCoordFrozenLake-v0", "llmgym/Countdown-v0"):
        for env_url in (None, server.url):
            seen.clear()
            records = rollout(
                env_id,
                [1, 2],
                policy,
                env_kwargs={"max_turns": 2},
                chat=ChatFormat(style=style, one_shot=True),
                env_url=env_url,
            )
            out.append((seen["prompts"], [_norm(r.to_dict()) for r in records]))
        assert out[-1] == out[-2], env_id  # the same prompts, turn by turn, and the same records


@pytest.mark.slow  # a tiny model trained two GRPO steps through stock TRL: ~30 s
def test_stock_trl_grpo_trains_through_an_openenv_client_on_the_server(server, tmp_path):
    """TRL's OpenEnv path end to end: stock ``GRPOTrainer`` with an ``environment_factory`` class wrapping a stock
    OpenEnv client (as TRL ``docs/source/openenv.md`` writes them), playing Sokoban on ``llmgym serve``."""
    pytest.importorskip("trl")
    import torch
    from openenv.core import GenericEnvClient
    from trl import GRPOConfig, GRPOTrainer

    from tests._tiny import tiny_trl_kwargs
    from tests.test_integrations_trl import _tool_tokenizer_and_model

    url = server.url

    class SokobanOpenEnv:
        def __init__(self):
            self.client = GenericEnvClient(base_url=url).sync()
            self.reward = 0.0

        def reset(self, **row) -> str:
            self.reward = 0.0
            return self.client.reset(seed=int(row["seed"]), env_id=SOKOBAN).observation["text"]

        def up(self) -> str:
            """Move the player up one cell.

            Returns:
                The new board.
            """
            result = self.client.step({"text": "<think>up</think><answer>Up</answer>"})
            self.reward += result.reward
            return result.observation["text"]

    def reward_func(environments, **kwargs):
        return [env.reward for env in environments]

    tok, model = _tool_tokenizer_and_model()
    scripted = tok.encode(
        '<tool_call>\n{"name": "up", "arguments": {}}\n</tool_call><|im_end|>', add_special_tokens=False
    )
    real_generate = model.generate

    def generate(
        *args, **kwargs
    ):  # half the rows call the tool in their first generation (see test_integrations_trl)
        out = real_generate(*args, **kwargs)
        ids = kwargs["input_ids"]
        if not generate.in_tool_loop:
            new = torch.full((out.size(0), len(scripted)), tok.pad_token_id)
            for b in range(0, out.size(0), 2):
                new[b] = torch.tensor(scripted)
            generate.in_tool_loop = True
            return torch.cat([ids, new], dim=1)
        generate.in_tool_loop = False
        return out

    generate.in_tool_loop = False
    model.generate = generate
    from datasets import Dataset

    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Push the box."}]] * 8, "seed": [4] * 8})
    args = GRPOConfig(
        **tiny_trl_kwargs(
            tmp_path,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=256,
            max_steps=2,
            logging_steps=1,
            max_tool_calling_iterations=2,
            learning_rate=1e-2,
        )
    )
    trainer = GRPOTrainer(
        model=model,
        args=args,
        train_dataset=ds,
        processing_class=tok,
        reward_funcs=reward_func,
        environment_factory=SokobanOpenEnv,
    )
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[k], v) for k, v in model.named_parameters())
    logs = [rec for rec in trainer.state.log_history if "rewards/reward_func/mean" in rec]
    local = gym.make(SOKOBAN)
    local.reset(seed=4)
    up = local.step("<think>up</think><answer>Up</answer>")[1]
    assert logs and logs[0]["rewards/reward_func/mean"] == pytest.approx(up / 2, abs=1e-6)
    assert logs[0]["tools/call_frequency"] > 0


def test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else():
    """M2: a server answering 302 to another origin gets one refusal; the other origin never sees a request."""
    import http.server
    import threading

    from llm_gym.serve.client import RemoteEnvError

    seen: list[dict[str, str]] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            seen.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)

    class Redirector(Elsewhere):
        def do_GET(self):  # noqa: N802
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{other.server_port}{self.path}")
            self.end_headers()

        do_POST = do_GET

    first = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirector)
    for srv in (first, other):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RemoteEnvError, match="redirect .*not followed"):
            gym.make(
                "llmgym/Remote-v0",
                url=f"http://127.0.0.1:{first.server_port}",
                env_id="llmgym/Bandit-v0",
                token=TOKEN,
                connect_timeout_s=5,
                request_timeout_s=5,
            )
        assert seen == []
    finally:
        for srv in (first, other):
            srv.shutdown()
            srv.server_close()
