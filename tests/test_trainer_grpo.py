"""LLMGymGRPOTrainer end to end on tiny offline models: training moves weights, metrics appear, and
environment tokens receive no gradient."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from llm_gym.trainer.config import LLMGymGRPOConfig  # noqa: E402
from llm_gym.trainer.defaults import EPISODES_FILE  # noqa: E402
from llm_gym.trainer.grpo import LLMGymGRPOTrainer, train_seeds  # noqa: E402
from llm_gym.trainer.rollouts import env_reward, seed_prompt  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from llm_gym.agent.records import read_records  # noqa: E402
from tests._tiny import tiny_config_kwargs  # noqa: E402


def length_reward(completions, **_):
    """Dense shaping so a random model gets reward variance (the env reward alone is constant for it)."""
    return [len(c) / 100.0 for c in completions]


def make_trainer(tiny_dir, tmp_path, env, **overrides):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    kwargs = tiny_config_kwargs(
        tmp_path / "out",
        env=env,
        num_prompts=2,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=256,
        max_new_tokens=24,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        filter_strategy="off",
        collapse_report="",
        episode_records=EPISODES_FILE,  # the first test reads them
    )
    kwargs.update(overrides)
    args = LLMGymGRPOConfig(**kwargs)
    trainer = LLMGymGRPOTrainer(
        model=model, args=args, processing_class=tok, reward_funcs=[env_reward, length_reward]
    )
    return trainer, model


@pytest.mark.parametrize("env", ["FrozenLake", "Bandit"])
def test_two_steps_move_weights_and_log_env_metrics(tiny_dir, tmp_path, env):
    trainer, model = make_trainer(
        tiny_dir, tmp_path, env, env_kwargs={"max_turns": 2} if env == "FrozenLake" else None
    )
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    changed = sum(not torch.equal(before[k], v) for k, v in model.named_parameters())
    assert changed > len(before) // 2
    logs = {k for rec in trainer.state.log_history for k in rec}
    for key in (
        "reward",
        "frac_reward_zero_std",
        "env/success",
        "env/episode_reward",
        "env/turns",
        "env/valid_action_rate",
        "env/effective_action_rate",
        "rewards/env_reward/mean",
    ):
        assert key in logs, key
    roll = trainer.last_rollout
    n = 8
    assert all(
        len(getattr(roll, k)) == n
        for k in ("turn_spans", "episode_reward", "success", "seed", "group_index", "records")
    )
    assert roll.group_index == [0, 1, 2, 3] * 2
    assert len(set(roll.seed[:4])) == 1 and roll.seed[0] != roll.seed[4]
    recs = read_records(tmp_path / "out" / "episodes.jsonl")
    assert len(recs) >= n and recs[0].env_id.startswith("llmgym/")


def test_seed_rows_follow_ragen_order(tiny_dir, tmp_path):
    args = LLMGymGRPOConfig(
        output_dir=str(tmp_path),
        num_prompts=8,
        num_generations=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        max_steps=3,
        use_cpu=True,
        bf16=False,
        train_seed=10000,
    )
    seeds = train_seeds(args)
    # round s, group g -> 10000 + s * 8 + g; enough rows for every round
    assert seeds[:8] == list(range(10000, 10008)) and seeds[8] == 10008
    assert len(seeds) >= 8 * 3


def test_environment_tokens_get_no_gradient(tiny_dir, tmp_path):
    """Backpropagate TRL's loss to the final hidden states: every position that predicts an environment token
    (env_mask 0) must get exactly zero gradient, while model-token positions get some."""
    trainer, model = make_trainer(
        tiny_dir,
        tmp_path,
        "FrozenLake",
        max_steps=1,
        env_kwargs={"max_turns": 3},
        use_prefix_sharing=False,  # the hook reads TRL's (B, L) layout; tests/test_prefix_sharing.py covers sharing
    )
    model.train()
    trainer.current_gradient_accumulation_steps = 1  # normally set by the training loop
    inputs = [{"prompt": seed_prompt(s)} for s in (5, 5, 5, 5, 6, 6, 6, 6)]
    batch = trainer._generate_and_score_completions(inputs)
    tool_mask = batch["tool_mask"]
    assert (tool_mask == 0).any() and (tool_mask == 1).any()  # multi-turn: both kinds present
    batch["advantages"] = torch.linspace(-1.0, 1.0, tool_mask.size(0))  # non-zero signal on every row

    def hidden_grads(b):
        captured = {}

        def hook(_module, _inp, out):
            out.retain_grad()
            captured["h"] = out

        handle = model.model.norm.register_forward_hook(hook)
        try:
            model.zero_grad()
            loss = trainer.compute_loss(model, b)
            loss.backward()
        finally:
            handle.remove()
        return captured["h"].grad  # (B, prompt_width + completion_width, hidden)

    grad = hidden_grads(batch)
    p_width = batch["prompt_ids"].size(1)
    # completion token j is predicted from position p_width + j - 1
    pred = grad[:, p_width - 1 : p_width - 1 + tool_mask.size(1)].abs().sum(-1)
    env_positions = (tool_mask == 0) & (batch["completion_mask"] == 1)
    model_positions = (tool_mask == 1) & (batch["completion_mask"] == 1)
    assert env_positions.any()
    assert pred[env_positions].max().item() == 0.0
    assert pred[model_positions].max().item() > 0.0

    # the check can fail: without the env mask, environment positions do receive gradient
    unmasked = dict(batch)
    unmasked.pop("tool_mask")
    unmasked["num_items_in_batch"] = batch["completion_mask"].sum()
    grad2 = hidden_grads(unmasked)
    pred2 = grad2[:, p_width - 1 : p_width - 1 + tool_mask.size(1)].abs().sum(-1)
    assert pred2[env_positions].max().item() > 0.0
