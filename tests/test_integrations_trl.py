"""llm_gym.integrations.trl: any llmgym id as a TRL ``environment_factory``, trained by TRL's stock GRPOTrainer."""

from __future__ import annotations

import importlib.resources

import gymnasium as gym
import pytest

import llm_gym  # noqa: F401
from llm_gym.integrations.trl import LLMGymToolEnv, make_environment_factory, make_prompt_dataset, tool_prompt

pytest.importorskip("trl")


# ----------------------------------------------------------------------------------------- the adapter alone
def test_action_env_gets_one_tool_per_action_and_plays_the_seeded_episode():
    cls = make_environment_factory("Sokoban")
    tools = sorted(n for n, v in vars(cls).items() if callable(v) and not n.startswith("_"))
    assert tools == ["down", "left", "right", "up"]
    env = cls()
    first = env.reset(seed=7, prompt="ignored column")
    ref = gym.make("llmgym/Sokoban-v0")
    obs, info = ref.reset(seed=7)
    assert obs in first
    # Play the optimal plan through the tools: the episode is solved and the return is the env's.
    from llm_gym.envs.sokoban.solver import solve

    plan = solve(info["level"]).plan
    for action in plan:
        out = getattr(env, action.lower())()
    assert env.success and env.done and "success" in out
    assert env.get_reward() == pytest.approx(-0.1 * len(plan) + 1.0 + 10.0)
    with pytest.raises(ValueError, match="episode is over"):
        env.up()
    # reset starts afresh for the next rollout.
    env.reset(seed=7)
    assert env.get_reward() == 0.0 and not env.done


def test_answer_env_gets_an_answer_tool_and_rewards_a_correct_answer():
    cls = make_environment_factory("llmgym/Countdown-v0")
    assert issubclass(cls, LLMGymToolEnv) and callable(cls.answer)
    env = cls()
    ref = gym.make("llmgym/Countdown-v0")
    _, info = ref.reset(seed=3)
    env.reset(seed=3)
    env.answer(info["solution"])
    assert env.success and env.get_reward() == 1.0
    env.reset(seed=3)
    env.answer("1 + 1")
    assert not env.success and env.get_reward() == 0.0


def test_bad_seed_column_is_a_clear_error():
    env = make_environment_factory("Bandit")()
    for bad in (-1, "3", 1.5, True):
        with pytest.raises(ValueError, match="seed"):
            env.reset(seed=bad)


def test_tool_schemas_come_from_docstrings():
    from transformers.utils import get_json_schema

    env = make_environment_factory("FrozenLake")()
    schema = get_json_schema(env.left)["function"]
    assert schema["name"] == "left" and "Left" in schema["description"]
    answer = get_json_schema(make_environment_factory("Countdown")().answer)["function"]
    assert answer["parameters"]["required"] == ["text"]


def test_prompt_dataset_has_rules_tools_and_seeds():
    ds = make_prompt_dataset("Sokoban", 5, seed_start=10)
    assert ds["seed"] == [10, 11, 12, 13, 14]
    text = ds[0]["prompt"][-1]["content"]
    assert text == tool_prompt("Sokoban")
    assert "up()" in text and "<answer>" not in text
    with pytest.raises(ValueError):
        make_prompt_dataset("Sokoban", 0)


# ---------------------------------------------------------------------------------- stock TRL GRPOTrainer
def _tool_tokenizer_and_model():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests._tiny import TINY_QWEN2_SHAPE, build_tiny_tokenizer

    tok = build_tiny_tokenizer("chatml")
    # TRL's bundled Qwen2.5 template renders tools and is recognised by its response parser.
    tok.chat_template = (importlib.resources.files("trl") / "chat_templates" / "qwen2_5.jinja").read_text()
    tok.add_special_tokens(
        {"additional_special_tokens": ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]}
    )
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        **TINY_QWEN2_SHAPE,
        max_position_embeddings=4096,  # the tool schemas make long prompts for a 400-token BPE
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return tok, model


@pytest.mark.parametrize("env_name", ["Sokoban", "Countdown"])
def test_stock_grpo_trainer_trains_two_steps_on_the_adapter(tmp_path, env_name):
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from tests._tiny import tiny_trl_kwargs

    tok, model = _tool_tokenizer_and_model()
    seed = 4
    ref = gym.make(llm_gym.resolve_env_id(env_name))
    _, info = ref.reset(seed=seed)
    if env_name == "Sokoban":
        call = {"name": "up", "arguments": {}}
    else:
        call = {"name": "answer", "arguments": {"text": info["solution"]}}
    import json

    scripted = f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"
    # A random model almost never emits a tool call: script the first generation of every rollout round so
    # that half the rows call the tool (the loop, the env and its reward run for real; rewards then differ).
    real_generate = model.generate

    def generate(*args, **kwargs):
        out = real_generate(*args, **kwargs)
        ids = kwargs["input_ids"]
        if ids.shape[1] > 0 and not generate.in_tool_loop:
            tc = tok.encode(scripted, add_special_tokens=False)
            new = torch.full((out.size(0), len(tc)), tok.pad_token_id)
            for b in range(0, out.size(0), 2):
                new[b] = torch.tensor(tc)
            generate.in_tool_loop = True
            return torch.cat([ids, new], dim=1)
        generate.in_tool_loop = False
        return out

    generate.in_tool_loop = False
    model.generate = generate

    factory = make_environment_factory(env_name)
    ds = make_prompt_dataset(env_name, 8)
    ds = ds.map(lambda row: {"seed": seed})  # one seed: every group plays the scripted episode
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
        model=model, args=args, train_dataset=ds, processing_class=tok, environment_factory=factory
    )
    assert {f.__name__ for f in trainer.tools} >= ({"up"} if env_name == "Sokoban" else {"answer"})
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer.train()
    changed = any(not torch.equal(before[k], v) for k, v in model.named_parameters())
    assert changed, "two GRPO steps on env rewards left every weight unchanged"
    logs = [rec for rec in trainer.state.log_history if f"rewards/{factory.__name__}/mean" in rec]
    assert logs, trainer.state.log_history
    expected = -0.05 if env_name == "Sokoban" else 0.5  # half the rows called the tool once
    assert logs[0][f"rewards/{factory.__name__}/mean"] == pytest.approx(expected, abs=1e-6)
    assert logs[0]["tools/call_frequency"] > 0


# ------------------------------------------------------------------------- review: group dynamics and ids
def _slippery_runs(cls, rows, moves=("right", "down", "right", "down", "right", "down")):
    runs = []
    for row in rows:
        env = cls()  # TRL pools one instance per concurrent rollout
        trace = [env.reset(**row)]
        for move in moves:
            if env.done:
                break
            trace.append(getattr(env, move)())
        runs.append(tuple(trace))
    return runs


def test_rollouts_of_one_row_get_independent_dynamics_by_default():
    cls = make_environment_factory("FrozenLakeSlippery")
    assert cls.group_dynamics == "independent"
    runs = _slippery_runs(cls, [{"seed": 5}] * 8)
    assert len({r[0] for r in runs}) == 1  # one start state per row
    assert len(set(runs)) > 1  # the slips differ across the group
    shared = _slippery_runs(
        make_environment_factory("FrozenLakeSlippery", group_dynamics="shared"), [{"seed": 5}] * 8
    )
    assert len(set(shared)) == 1
    # A dynamics_seed column makes a rollout reproducible.
    pinned = _slippery_runs(cls, [{"seed": 5, "dynamics_seed": 3}] * 2)
    assert pinned[0] == pinned[1]
    with pytest.raises(ValueError, match="group_dynamics"):
        make_environment_factory("FrozenLakeSlippery", group_dynamics="per-row")


def test_only_llm_gym_ids_and_seeds_below_2_64_are_accepted():
    with pytest.raises(ValueError, match="not an llm-gym id"):
        make_environment_factory("CartPole-v1")
    with pytest.raises(ValueError, match="not an llm-gym id"):
        tool_prompt("CartPole-v1")
    env = make_environment_factory("Bandit")()
    with pytest.raises(ValueError, match=r"\[0, 2\*\*64\)"):
        env.reset(seed=2**64)
    with pytest.raises(ValueError, match="last seed"):
        make_prompt_dataset("Bandit", 2, seed_start=2**64 - 1)
