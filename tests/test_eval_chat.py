"""``llmgym-eval`` shows a model the chat it was trained with: the RAGEN generation prefix for local and endpoint
policies, the trainer's stop tokens, and the chat-format flags (defaulting to a trained run's settings)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
from llm_gym.trainer.chat_templates import ChatTemplateTokens, template_stop_ids  # noqa: E402
from llm_gym.trainer.evaluate import EPISODES_FILE, main  # noqa: E402
from llm_gym.trainer.policies import HFPolicy, OpenAIPolicy, SamplingParams  # noqa: E402

from llm_gym.agent.chat import ChatFormat  # noqa: E402
from llm_gym.agent.records import read_records  # noqa: E402
from llm_gym.agent.rollout import rollout  # noqa: E402
from tests._tiny import build_tiny_tokenizer  # noqa: E402

FL_DET = "llmgym/FrozenLakeDeterministic-v0"


class ScriptedModel(torch.nn.Module):
    """A 'causal LM' whose ``generate`` appends fixed ids to every row and records the prompts it saw."""

    def __init__(self, new_ids: list[int]):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.new_ids = new_ids
        self.prompts: list[list[int]] = []
        self.eos_seen: list = []

    def generate(self, input_ids, attention_mask, generation_config):
        self.eos_seen.append(generation_config.eos_token_id)
        for row, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            self.prompts.append([t for t, m in zip(row, mask) if m])
        tail = torch.tensor([self.new_ids] * input_ids.shape[0], dtype=torch.long)
        return torch.cat([input_ids, tail], dim=1)


def _base_style_tokenizer():
    """Qwen2.5 base's configuration: eos is <|endoftext|> while the ChatML template closes turns with <|im_end|>."""
    tok = build_tiny_tokenizer("chatml")
    tok.add_special_tokens(
        {"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}
    )  # as Qwen2.5 lists them
    tok.eos_token = "<|endoftext|>"
    return tok


def test_eval_stops_where_training_stops_with_a_base_style_tokenizer():
    tok = _base_style_tokenizer()
    im_end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    assert tok.eos_token_id == eot != im_end
    train_stops = ChatTemplateTokens(tok).stop_ids
    assert train_stops == template_stop_ids(tok) == sorted({im_end, eot})
    body = tok("<answer>Right</answer>", add_special_tokens=False)["input_ids"]
    model = ScriptedModel([*body, im_end, *tok("junk", add_special_tokens=False)["input_ids"], eot])
    policy = HFPolicy(model, tok, SamplingParams(temperature=0.0, max_new_tokens=50))
    assert policy.stop_ids == train_stops
    (reply,) = policy([[{"role": "user", "content": "hi"}]])
    assert reply == "<answer>Right</answer>"  # cut at the template's <|im_end|>, not run on to eos
    assert model.eos_seen == [train_stops]


@pytest.mark.parametrize("think", [True, False])
def test_hf_policy_under_ragen_style_generates_after_the_prefix(think):
    tok = build_tiny_tokenizer("chatml")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    text = "go</think><answer>Right</answer>" if think else "Right</answer>"
    model = ScriptedModel([*tok(text, add_special_tokens=False)["input_ids"], im_end])
    policy = HFPolicy(model, tok, SamplingParams(temperature=0.0, max_new_tokens=50))
    env_kwargs = {"max_turns": 1, "think": think}
    (rec,) = rollout(FL_DET, [3], policy, chat=ChatFormat(style="ragen"), env_kwargs=env_kwargs)
    prefix = "<think>" if think else "<answer>"
    prompt = tok.decode(model.prompts[0], skip_special_tokens=False)
    assert prompt.endswith(
        "<|im_start|>assistant\n" + prefix
    )  # the template's generation prompt, then the prefix
    assert rec.turns[0].response == prefix + text  # the policy returned only the generated text
    assert rec.turns[0].info["action_is_valid"]


def test_endpoint_policy_under_ragen_style_continues_the_assistant_message():
    from tests.test_endpoint import FakeServer, openai_like

    server = FakeServer(openai_like)
    try:
        policy = OpenAIPolicy(server.url, "served-model", SamplingParams(max_new_tokens=20))
        recs = rollout(FL_DET, [3], policy, chat=ChatFormat(style="ragen"), env_kwargs={"max_turns": 1})
        (chat,) = [r for r in server.requests if r["path"] == "/v1/chat/completions"]
        body = chat["body"]
        assert body["messages"][-1] == {"role": "assistant", "content": "<think>"}
        assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
        assert recs[0].turns[0].response.startswith("<think>")
        policy([[{"role": "user", "content": "hi"}]])  # no prefix: a plain chat completion
        plain = [r for r in server.requests if r["path"] == "/v1/chat/completions"][-1]["body"]
        assert "continue_final_message" not in plain and plain["messages"][-1]["role"] == "user"
    finally:
        server.close()


def test_eval_chat_flags_default_to_the_trained_runs_and_enter_the_fingerprint(tiny_dir, tmp_path, capsys):
    import shutil

    model = tmp_path / "run" / "final"
    shutil.copytree(tiny_dir, model)
    saved = {"env": "llmgym/Bandit-v0", "chat_style": "ragen", "system_prompt": "S.", "reward_feedback": True}
    (model / "llmgym_run.json").write_text(json.dumps({**saved, "one_shot_example": False}))
    out = tmp_path / "ev"
    common = [
        "--model",
        str(model),
        "--env",
        "FrozenLakeDeterministic",
        "--num_eval_seeds",
        "1",
        "--no_progress",
    ]
    common += ["--max_new_tokens", "4", "--env_kwargs", '{"max_turns": 1}', "--output_dir", str(out)]
    assert main(common) == 0
    assert "chat settings of the trained run" in capsys.readouterr().err
    (rec,) = read_records(out / EPISODES_FILE)
    fp = rec.meta["eval"]
    assert fp["chat_style"] == "ragen" and fp["system_prompt"] == "S." and fp["reward_feedback"] is True
    assert rec.turns[0].response.startswith("<think>")  # the ragen style ran
    # a flag wins over the saved setting, and a resume with other chat settings is refused
    assert main([*common, "--resume", "--chat_style", "llmgym"]) == 2
    assert "chat_style" in capsys.readouterr().err
    assert main([*common, "--resume"]) == 0
