"""Chat formatting and the batched text rollout loop (no torch)."""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import pytest

import llm_gym  # noqa: F401
from llm_gym.agent import (
    ChatFormat,
    Conversation,
    episode_metrics,
    group_seeds,
    rollout,
    system_message,
    turn_text,
)
from llm_gym.agent.chat import answer_format

FL_DET = "llmgym/FrozenLakeDeterministic-v0"
MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def _grid_from_messages(messages: list[dict]) -> list[str]:
    """The FrozenLake grid shown in the last user message (rows between 'State:' and the budget line)."""
    lines = messages[-1]["content"].splitlines()
    start = lines.index("State:") + 1
    rows = []
    for line in lines[start:]:
        if line.startswith(("You have", "Always")):
            break
        rows.append(line)
    return rows


def bfs_moves(grid: list[str]) -> list[str]:
    """Shortest move list from the player to the goal, avoiding holes."""
    n, m = len(grid), len(grid[0])
    start = next((r, c) for r in range(n) for c in range(m) if grid[r][c] == "P")
    prev = {start: None}
    queue = deque([start])
    while queue:
        cur = queue.popleft()
        if grid[cur[0]][cur[1]] == "G":
            path = []
            while prev[cur] is not None:
                cur, move = prev[cur]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in MOVES.items():
            nxt = (cur[0] + dr, cur[1] + dc)
            if 0 <= nxt[0] < n and 0 <= nxt[1] < m and nxt not in prev and grid[nxt[0]][nxt[1]] != "O":
                prev[nxt] = (cur, move)
                queue.append(nxt)
    raise AssertionError("no path")


class BFSPolicy:
    """Solves deterministic FrozenLake from the text it is shown; records each call's batch size."""

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    def __call__(self, batch: list[list[dict]]) -> list[str]:
        self.batch_sizes.append(len(batch))
        out = []
        for messages in batch:
            moves = bfs_moves(_grid_from_messages(messages))[:2]
            out.append(f"<think>shortest path</think><answer>{' || '.join(moves)}</answer>")
        return out


@pytest.fixture
def env():
    e = gym.make(FL_DET)
    e.reset(seed=3)
    yield e
    e.close()


# ------------------------------------------------------------------------------------------------ chat
def test_system_message_holds_prompt_and_instructions(env):
    msg = system_message(env, ChatFormat(system_prompt="Be brief."))
    assert msg["role"] == "system"
    assert msg["content"].startswith("Be brief.")
    assert env.unwrapped.instructions in msg["content"]
    assert (
        env.unwrapped.instructions
        not in system_message(env, ChatFormat(include_instructions=False))["content"]
    )


def test_turn_text_shows_state_budget_and_format(env):
    obs = env.unwrapped._observation()
    text = turn_text(env, obs, turn=1)
    assert text.startswith("Turn 1:")
    assert obs in text
    assert "10 actions and 5 turns left" in text
    assert answer_format(env) in text
    assert "Warning" not in text and "Reward" not in text


def test_invalid_previous_answer_warns_with_error_and_reward_feedback(env):
    obs, reward, _, _, info = env.step("no tags at all")
    assert not info["action_is_valid"]
    text = turn_text(
        env, obs, turn=2, fmt=ChatFormat(reward_feedback=True), prev_reward=reward, prev_info=info
    )
    assert "Warning: your last answer was invalid" in text
    assert info["error"] in text
    assert f"Reward of your last answer: {reward:g}" in text
    assert "4 turns left" in text


def test_conversation_window_keeps_last_turns(env):
    conv = Conversation(env, ChatFormat(history_window=2))
    for k in range(4):
        conv.add_observation(f"state {k}")
        conv.add_reply(f"reply {k}")
    conv.add_observation("state 4")
    windowed = conv.messages()
    # the window counts the pending turn: the previous turn (state 3 + reply) and the current state
    assert [m["role"] for m in windowed] == ["system", "user", "assistant", "user"]
    assert "state 3" in windowed[1]["content"] and "state 4" in windowed[-1]["content"]
    assert "Turn 5:" in windowed[-1]["content"]
    full = conv.messages(window=100)
    assert len(full) == 1 + 2 * 4 + 1
    with pytest.raises(ValueError):
        conv.add_observation("twice")
    with pytest.raises(ValueError):
        ChatFormat(history_window=0)


# --------------------------------------------------------------------------------------------- rollout
def test_bfs_policy_solves_deterministic_frozenlake_in_one_call_per_turn():
    policy = BFSPolicy()
    seeds = [0, 1, 2]
    recs = rollout(FL_DET, seeds, policy, group_size=2, meta={"who": "bfs"})
    assert len(recs) == 6
    assert [r.seed for r in recs] == [0, 0, 1, 1, 2, 2]
    assert [r.meta["group_index"] for r in recs] == [0, 1] * 3
    assert all(r.meta["who"] == "bfs" for r in recs)
    assert all(r.success for r in recs)
    assert all(r.total_reward == pytest.approx(1.0) for r in recs)
    # members of a group share the seed, hence the map
    assert recs[0].initial_observation == recs[1].initial_observation
    # one policy call per turn, with every active env in it, shrinking as episodes end
    assert len(policy.batch_sizes) == max(len(r.turns) for r in recs)
    assert policy.batch_sizes[0] == 6
    assert policy.batch_sizes == sorted(policy.batch_sizes, reverse=True)
    m = episode_metrics(recs)
    assert m["success"] == 1.0 and m["valid_action_rate"] == 1.0 and m["episode_reward"] == pytest.approx(1.0)


def test_invalid_policy_is_truncated_and_penalised():
    recs = rollout(FL_DET, [5], lambda b: ["nonsense"] * len(b), group_size=1, env_kwargs={"max_turns": 3})
    (rec,) = recs
    assert len(rec.turns) == 3 and rec.turns[-1].truncated and not rec.success
    assert rec.total_reward == pytest.approx(-0.3)
    assert "invalid" in rec.turns[0].info["error"] or rec.turns[0].info["error"]
    assert episode_metrics(recs)["valid_action_rate"] == 0.0


def test_rollout_is_deterministic_for_a_deterministic_policy():
    a = rollout("llmgym/FrozenLake-v0", [7, 8], BFSPolicy(), group_size=2)
    b = rollout("llmgym/FrozenLake-v0", [7, 8], BFSPolicy(), group_size=2)
    assert [r.to_dict() for r in a] == [r.to_dict() for r in b]


def test_rollout_rejects_bad_input():
    with pytest.raises(ValueError, match="cannot make .llmgym/Nope-v0.: unknown environment"):
        rollout("llmgym/Nope-v0", [0], BFSPolicy())
    with pytest.raises(ValueError, match="group_size"):
        rollout(FL_DET, [0], BFSPolicy(), group_size=0)
    with pytest.raises(ValueError, match="seeds"):
        rollout(FL_DET, [-1], BFSPolicy())
    with pytest.raises(ValueError, match="policy must return a list of 2"):
        rollout(FL_DET, [0, 1], lambda b: ["x"])


def test_group_seeds_follow_ragen():
    assert group_seeds(10000, 0, 8) == list(range(10000, 10008))
    assert group_seeds(10000, 3, 8)[0] == 10024
    with pytest.raises(ValueError):
        group_seeds(0, -1, 8)


def test_one_shot_example_of_a_directly_built_env_keeps_its_arguments():
    from llm_gym.envs.sokoban.env import REMAPPED_VOCAB, SokobanEnv

    env = SokobanEnv(vocab="remapped")
    env.reset(seed=0)
    before = env.board()
    user = Conversation(env, ChatFormat(one_shot=True)).example[0]["content"]
    state = user.split("State:\n", 1)[1].split("\nYou have", 1)[0]
    assert REMAPPED_VOCAB["wall"] in state and "#" not in state  # remapped symbols, not the default ones
    assert env.board() == before  # the demonstration did not touch the env
    from llm_gym.envs.metamathqa.env import MetaMathQAEnv

    math = MetaMathQAEnv(dataset="sample")  # offline: the demo must not fall back to the hub dataset
    assert Conversation(math, ChatFormat(one_shot=True)).example[1]["content"] == math.example_response()


def test_one_shot_example_comes_from_a_fixed_other_seed(env):
    conv = Conversation(env, ChatFormat(one_shot=True))
    conv.add_observation(env.unwrapped._observation())
    msgs = conv.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2]["content"] == env.unwrapped.example_response()
    assert msgs[1]["content"].startswith("Turn 1:") and "State:" in msgs[1]["content"]
    again = Conversation(env, ChatFormat(one_shot=True))
    assert again.example == conv.example  # deterministic demonstration
    assert len(Conversation(env).messages()) == 1  # off by default


def test_make_env_is_the_one_friendly_gym_make():
    from llm_gym.agent import make_env
    from llm_gym.registration import make_env as canonical

    assert make_env is canonical
    env = make_env(FL_DET, {"max_turns": 2})
    assert env.spec.id == FL_DET and env.unwrapped.max_turns == 2
    env.close()
    with pytest.raises(ValueError, match=r"cannot make 'llmgym/Sokobn-v0': .*did you mean 'Sokoban'"):
        make_env("llmgym/Sokobn-v0")
    # A command-line short name is not an id; the error names the id it would be.
    with pytest.raises(ValueError, match=r"not a registered id; did you mean 'llmgym/Sokoban-v0'"):
        make_env("Sokoban")
    with pytest.raises(ValueError, match=r"cannot make 'llmgym/Sokoban-v0' with kwargs \['no_such_kwarg'\]"):
        make_env("llmgym/Sokoban-v0", {"no_such_kwarg": 1})
    with pytest.raises(ValueError, match="cannot make None"):
        make_env(None)


class _PrefixPolicy:
    """A fake HF-style policy: renders each prompt as template + generation prompt + prefix (as RAGEN does) and
    continues it; records what it was given."""

    def __init__(self, continuation: str):
        self.continuation = continuation
        self.prompts: list[str] = []

    def __call__(self, batch, generation_prefix=""):
        from llm_gym.agent import generation_prompt

        class Template:  # the shape of a HF tokenizer's apply_chat_template
            @staticmethod
            def apply_chat_template(messages, add_generation_prompt, tokenize):
                assert add_generation_prompt and not tokenize
                return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<assistant>"

        self.prompts += [generation_prompt(Template, m, generation_prefix) for m in batch]
        return [self.continuation] * len(batch)


def test_ragen_generation_prefix_ends_the_prompt_and_starts_the_reply():
    """Issue 11 item 7: RAGEN forces "<think>" after the generation prompt; the env sees "<think>" + generated."""
    policy = _PrefixPolicy("go</think><answer>Down</answer>")
    (rec,) = rollout(FL_DET, [3], policy, chat=ChatFormat(style="ragen"), env_kwargs={"max_turns": 2})
    assert policy.prompts and all(p.endswith("<assistant><think>") for p in policy.prompts)
    full = "<think>go</think><answer>Down</answer>"
    assert [t.response for t in rec.turns] == [full] * len(rec.turns)
    assert all(t.info["action_is_valid"] for t in rec.turns)  # the env parsed the prefixed text
    # The history shows the full reply too: the second prompt holds the first reply as the assistant message.
    assert f"<assistant>{full}</assistant>" in policy.prompts[1]
    # Without the prefix, the same continuation is not a valid RAGEN-format reply.
    (plain,) = rollout(
        FL_DET,
        [3],
        lambda b: [policy.continuation] * len(b),
        env_kwargs={"max_turns": 1, "parse_mode": "ragen"},
    )
    assert not plain.turns[0].info["action_is_valid"]


def test_ragen_generation_prefix_is_answer_without_thinking():
    policy = _PrefixPolicy("Down</answer>")
    (rec,) = rollout(
        FL_DET, [3], policy, chat=ChatFormat(style="ragen"), env_kwargs={"max_turns": 1, "think": False}
    )
    assert policy.prompts[0].endswith("<assistant><answer>")
    assert rec.turns[0].response == "<answer>Down</answer>" and rec.turns[0].info["action_is_valid"]


def test_default_style_calls_the_policy_without_a_prefix():
    seen = []

    def policy(batch, **kwargs):
        seen.append(kwargs)
        return ["<think>x</think><answer>Down</answer>"] * len(batch)

    (rec,) = rollout(FL_DET, [3], policy, env_kwargs={"max_turns": 1})
    assert seen == [{}] and rec.turns[0].response == "<think>x</think><answer>Down</answer>"


def test_a_policy_that_cannot_take_the_prefix_is_a_clear_error():
    with pytest.raises(ValueError, match="generation_prefix"):
        rollout(FL_DET, [3], lambda batch: ["x"] * len(batch), chat=ChatFormat(style="ragen"))
