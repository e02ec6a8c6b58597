"""Token-level multi-turn rollouts: ids match the chat template, masks, budget, templates, determinism."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_gym.trainer.chat_templates import ChatTemplateError, ChatTemplateTokens  # noqa: E402
from llm_gym.trainer.rollouts import (  # noqa: E402
    HFGenerate,
    parse_seed_prompt,
    play_token_episodes,
    rollout_output,
    seed_prompt,
)

from tests._tiny import CHAT_TEMPLATES, build_tiny_tokenizer  # noqa: E402

FL_DET = "llmgym/FrozenLakeDeterministic-v0"
STYLES = sorted(CHAT_TEMPLATES)


@pytest.fixture(scope="module")
def tokenizers():
    return {style: build_tiny_tokenizer(style) for style in STYLES}


class ScriptedGenerate:
    """A 'model' that answers with canonical token ids of fixed texts, cycling, ending with end-of-turn."""

    def __init__(self, template: ChatTemplateTokens, texts: list[str], *, end: bool = True):
        self.template, self.texts, self.end = template, texts, end
        self.calls: list[int] = []
        self.k = 0

    def __call__(self, contexts, budgets):
        self.calls.append(len(contexts))
        out = []
        for _ in contexts:
            ids = self.template.encode(self.texts[self.k % len(self.texts)])
            self.k += 1
            out.append(ids + ([self.template.end_of_turn_id] if self.end else []))
        return out, [[-0.5] * len(r) for r in out]


ANSWERS = [
    "<think>go right</think><answer>Right || Down</answer>",
    "<think>down</think><answer>Down</answer>",
    "no tags",  # invalid turn: exercises the warning line
    "<think>left</think><answer>Left || Up</answer>",
]


@pytest.mark.parametrize("style", STYLES)
def test_trajectory_ids_equal_template_rendering(tokenizers, style):
    tok = tokenizers[style]
    template = ChatTemplateTokens(tok)
    gen = ScriptedGenerate(template, ANSWERS)
    eps = play_token_episodes(
        FL_DET,
        [0, 1],
        gen,
        template,
        max_new_tokens=64,
        max_completion_length=4000,
        env_kwargs={"max_turns": 4},
        group_size=2,
    )
    for e in eps:
        messages = e.conv.messages(window=None)
        assert messages[-1]["role"] == "assistant"  # the episode ended after a reply
        rendered = template.encode(template.render(messages, add_generation_prompt=False))
        ours = e.prompt_ids + e.completion_ids
        # identical up to our last end-of-turn token; the template may add its after-turn text ("\n")
        assert rendered[: len(ours)] == ours
        assert tok.decode(rendered[len(ours) :]) == template.after_turn_text
        assert ours[-1] == template.end_of_turn_id
        # model tokens (mask 1) are exactly the replies and their end-of-turn tokens
        model_ids = [t for t, m in zip(e.completion_ids, e.env_mask) if m == 1]
        expected = []
        for turn in e.record.turns:
            expected += template.encode(turn.response) + [template.end_of_turn_id]
        assert model_ids == expected
        assert len(e.turn_spans) == len(e.record.turns)
        for (s, t), turn in zip(e.turn_spans, e.record.turns):
            assert all(m == 1 for m in e.env_mask[s:t])
            assert tok.decode(e.completion_ids[s:t], skip_special_tokens=True) == turn.response
        assert e.logprobs[e.turn_spans[0][0]] == -0.5 and 0.0 in e.logprobs  # sampler vs env placeholders


def test_invalid_turn_shows_warning_in_observation_tokens(tokenizers):
    template = ChatTemplateTokens(tokenizers["chatml"])
    gen = ScriptedGenerate(template, ["nonsense", "<think>a</think><answer>Up</answer>"])
    (e,) = play_token_episodes(
        FL_DET, [3], gen, template, max_new_tokens=32, max_completion_length=4000, env_kwargs={"max_turns": 2}
    )
    env_text = template.tokenizer.decode([t for t, m in zip(e.completion_ids, e.env_mask) if m == 0])
    assert "Warning: your last answer was invalid" in env_text
    assert "Turn 2:" in env_text


def test_budget_is_enforced_and_turns_end_with_end_of_turn(tokenizers):
    template = ChatTemplateTokens(tokenizers["chatml"])
    gen = ScriptedGenerate(template, ["<think>" + "x " * 50 + "</think><answer>Up</answer>"], end=False)
    for budget in (40, 150, 300):
        (e,) = play_token_episodes(
            FL_DET,
            [0],
            gen,
            template,
            max_new_tokens=30,
            max_completion_length=budget,
            env_kwargs={"max_turns": 5},
        )
        assert len(e.completion_ids) <= budget
        assert len(e.env_mask) == len(e.completion_ids) == len(e.logprobs)
        assert e.completion_ids[-1] == template.end_of_turn_id
        assert e.env_mask[-1] == 0  # our forced end-of-turn token is not a model token
        for s, t in e.turn_spans:
            assert t - s <= 30
        assert e.stop_reason == "budget", budget


def test_lockstep_pads_generation_batches(tokenizers):
    template = ChatTemplateTokens(tokenizers["chatml"])
    gen = ScriptedGenerate(template, ANSWERS[:2])
    eps = play_token_episodes(
        FL_DET,
        [0, 1],
        gen,
        template,
        max_new_tokens=32,
        max_completion_length=4000,
        env_kwargs={"max_turns": 3},
        lockstep=lambda n: 4 if n else 0,
    )
    assert set(gen.calls) == {4}
    assert len(eps) == 2 and all(len(e.record.turns) >= 1 for e in eps)


def test_non_prefix_preserving_template_fails_clearly(tokenizers):
    tok = build_tiny_tokenizer("chatml")
    # Drops the content of every assistant message but the last, like templates that strip old reasoning.
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
        "{{ '<|im_start|>assistant\n<|im_end|>\n' }}{% else %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    # Detected when the template is set up, before any rollout, training or evaluation.
    with pytest.raises(ChatTemplateError, match="not prefix-preserving"):
        ChatTemplateTokens(tok)


def test_vllm_missing_logprobs_become_nan_not_zero():
    import math

    from llm_gym.trainer.rollouts import VLLMGenerate

    class FakeVLLM:
        max_completion_length = 99

        def generate(self, prompts, images, num_generations):
            assert self.max_completion_length == 3  # the largest budget, restored afterwards
            return None, [[5, 6, 7], [8]], [[[-0.5], [None], []], [[-1.25]]], None

    vllm = FakeVLLM()
    ids, lps = VLLMGenerate(vllm)([[1], [2]], [3, 2])
    assert ids == [[5, 6, 7], [8]] and vllm.max_completion_length == 99
    assert lps[0][0] == -0.5 and math.isnan(lps[0][1]) and math.isnan(lps[0][2]) and lps[1] == [-1.25]


def test_vllm_turns_stop_at_the_template_stop_ids_and_the_kwargs_are_restored():
    from llm_gym.trainer.chat_templates import template_stop_ids
    from llm_gym.trainer.rollouts import VLLMGenerate

    tok = build_tiny_tokenizer("chatml")
    tok.add_special_tokens({"extra_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|endoftext|>"  # a base model: eos is not the end-of-turn token
    stop = template_stop_ids(tok)
    assert tok.convert_tokens_to_ids("<|im_end|>") in stop and tok.eos_token_id in stop

    class FakeVLLM:
        max_completion_length = 99
        generation_kwargs = {"repetition_penalty": 1.1}

        def generate(self, prompts, images, num_generations):
            # TRL builds SamplingParams(**generation_kwargs) from these in colocate and server mode
            assert self.generation_kwargs == {"repetition_penalty": 1.1, "stop_token_ids": stop}
            return None, [[5]], [[[-0.5]]], None

    vllm = FakeVLLM()
    VLLMGenerate(vllm, stop)([[1]], [4])
    assert vllm.generation_kwargs == {"repetition_penalty": 1.1} and vllm.max_completion_length == 99


def test_template_without_end_token_or_missing_fails():
    tok = build_tiny_tokenizer("chatml")
    tok.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatTemplateTokens(tok)
    tok.chat_template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="end-of-turn"):
        ChatTemplateTokens(tok)


def test_seed_prompts_round_trip():
    assert parse_seed_prompt(seed_prompt(10042)) == 10042
    with pytest.raises(ValueError, match="seed prompt"):
        parse_seed_prompt("hello")
    with pytest.raises(ValueError):
        seed_prompt(-1)


def test_greedy_rollouts_with_a_real_model_are_reproducible(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_dir
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    template = ChatTemplateTokens(tok)
    cfg = model.generation_config
    cfg.do_sample = False

    def run(seeds):
        gen = HFGenerate(model, tok, cfg, template.stop_ids, torch.device("cpu"))
        eps = play_token_episodes(
            FL_DET,
            seeds,
            gen,
            template,
            max_new_tokens=12,
            max_completion_length=400,
            env_kwargs={"max_turns": 2},
            group_size=2,
        )
        return eps, rollout_output(eps)

    eps_a, out_a = run([4, 4, 9, 9])
    eps_b, out_b = run([4, 4, 9, 9])
    assert out_a == out_b
    assert out_a["completion_ids"][0] == out_a["completion_ids"][1]  # same seed + greedy = same trajectory
    assert eps_a[0].record.initial_observation != eps_a[2].record.initial_observation
    assert all(len(c) <= 400 for c in out_a["completion_ids"])
    assert set(out_a) >= {"prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward"}


PIECES = [*"abc XYZ_\n<>/|", "<think>", "</think>", "<answer>", "</answer>", "Up", "||"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(
        st.lists(st.sampled_from(PIECES), max_size=30).map("".join).filter(lambda t: "<|" not in t),
        min_size=1,
        max_size=4,
    ),
    budget=st.integers(min_value=8, max_value=600),
    max_new=st.integers(min_value=1, max_value=40),
    end=st.booleans(),
)
def test_rollout_invariants_for_arbitrary_replies(tokenizers, texts, budget, max_new, end):
    template = ChatTemplateTokens(tokenizers["chatml"])
    gen = ScriptedGenerate(template, texts, end=end)
    (e,) = play_token_episodes(
        FL_DET,
        [2],
        gen,
        template,
        max_new_tokens=max_new,
        max_completion_length=budget,
        env_kwargs={"max_turns": 4},
    )
    assert len(e.completion_ids) == len(e.env_mask) == len(e.logprobs) <= budget
    assert e.completion_ids[-1] == template.end_of_turn_id
    assert 1 <= len(e.record.turns) == len(e.turn_spans) <= 4
    for (s, t), turn in zip(e.turn_spans, e.record.turns):
        assert t - s <= max_new and all(m == 1 for m in e.env_mask[s:t])
        assert (
            template.tokenizer.decode(
                [i for i in e.completion_ids[s:t] if i not in template.stop_ids], skip_special_tokens=True
            )
            == turn.response
        )
    assert e.episode_reward == pytest.approx(sum(t.reward for t in e.record.turns))


@pytest.mark.parametrize("mode", ["independent", "shared"])
def test_group_dynamics_seeds_each_member_or_none(tokenizers, mode):
    # independent: member i of a group resets with dynamics_seed=i (same start state, own transitions, RAGEN).
    template = ChatTemplateTokens(tokenizers["chatml"])
    gen = ScriptedGenerate(template, ["<think>a</think><answer>Down || Right</answer>"])
    eps = play_token_episodes(
        "llmgym/FrozenLake-v0",
        [4, 4, 4, 4],
        gen,
        template,
        max_new_tokens=32,
        max_completion_length=4000,
        env_kwargs={"max_turns": 1},
        group_size=4,
        group_dynamics=mode,
    )
    options = [e.record.reset_options for e in eps]
    if mode == "independent":
        assert [o["dynamics_seed"] for o in options] == [0, 1, 2, 3]
    else:
        assert options == [None] * 4
    assert len({e.prompt_ids and tuple(e.prompt_ids) for e in eps}) == 1  # identical start states


def test_ragen_style_without_thinking_prefixes_answer_per_episode(tokenizers):
    from llm_gym.agent.chat import ChatFormat

    template = ChatTemplateTokens(tokenizers["chatml"])
    reply = "Right</answer>"

    def generate(contexts, budgets):
        ids = template.encode(reply) + [template.end_of_turn_id]
        return [ids for _ in contexts], [[-0.5] * len(ids) for _ in contexts]

    (e,) = play_token_episodes(
        FL_DET,
        [0],
        generate,
        template,
        max_new_tokens=64,
        max_completion_length=4000,
        env_kwargs={"max_turns": 2, "think": False},
        chat=ChatFormat(style="ragen"),
    )
    answer = template.encode("<answer>")
    assert e.prefix == "<answer>" and e.prefix_ids == answer
    assert e.prompt_ids[-len(answer) :] == answer  # the first prompt ends in <answer>, not <think>
    assert all(t.response == "<answer>" + reply for t in e.record.turns)
    assert e.record.turns[0].info["action_is_valid"]  # the env parsed "<answer>Right</answer>"
    s, _ = e.turn_spans[1]
    assert e.completion_ids[s - len(answer) : s] == answer  # between-turn ids end in <answer>, untrained
    assert not any(e.env_mask[s - len(answer) : s])
