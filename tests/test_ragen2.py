"""RAGEN-2 protocol, trainer side: filter parity with RAGEN's selection code, the slack calibration, dual-clip and
per-sequence loss aggregation by hand, Dr.GRPO's entropy scale, the ``ragen2`` profile, ``--dry_run``, the
fewer-optimizer-steps mode, advantages after filtering, the separate critic, the early stops, the chat style."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from llm_gym.trainer.batch import empty_micro_batch, loss_mask, select_rows_copy, split_micro_batches
from llm_gym.trainer.losses import aggregate, clipped_surrogate, policy_loss
from llm_gym.trainer.snr_filter import decide, group_scores, metric_eps

DATA = Path(__file__).parent / "data"
QWEN_3B_CONFIG = (
    Path(__file__).parents[1] / "trainer" / "model_configs" / "Qwen" / "Qwen2.5-3B" / "config.json"
)


# ------------------------------------------------------------------------------------------ filter slack
@pytest.mark.parametrize("metric", ["variance", "std"])
def test_small_rewards_with_signal_are_not_skipped(metric):
    # group 0 has signal (std 0.1, variance 0.01); with the absolute slack 0.01 on the variance this round was
    # skipped (0.9 * 0.01 <= 0.01). The slack is in reward units now, squared for the variance.
    d = decide(np.array([0.1, -0.1, 0.1, 0.1, -0.1, -0.1, -0.1, -0.1]), 4, metric=metric)
    assert d.keep_groups.tolist() == [True, False]


@pytest.mark.parametrize("metric", ["variance", "std"])
def test_tiny_spread_is_still_rejected_at_the_same_reward_scale(metric):
    # std 0.005 per group: below RAGEN's 0.01 slack whichever score ranks the groups
    r = np.array([0.0, 0.01, 0.0, 0.0] * 2) - 0.0025
    assert decide(r, 4, metric=metric).skip
    assert metric_eps(0.01, metric) == pytest.approx(1e-4 if metric == "variance" else 0.01)


# ------------------------------------------------------------------------------------------ filter parity
def ragen_select(
    scores: torch.Tensor, *, value: float, include_zero: bool, mode: str, eps: float = 0.01
) -> set:
    """Written from RAGEN ``ragen/trainer/rollout_filter.py`` (``RolloutFilter._select_top_groups``, strategy
    top_p, filter_type largest), float32 as there; ties sorted stably (the order RAGEN's sort gives on CPU)."""
    scores = scores.float()
    idx = torch.arange(scores.numel())
    if not include_zero:
        nz = scores.abs() > 1e-10
        scores, idx = scores[nz], idx[nz]
        if idx.numel() == 0:
            return set()
    if value >= 1.0:
        return set(idx.tolist())
    if mode == "softmax":
        probs = torch.softmax(scores, dim=0)
        sp, si = torch.sort(probs, descending=True, stable=True)
        k = min(int(torch.searchsorted(torch.cumsum(sp, 0), value).item()) + 1, idx.numel())
        return set(idx[si[:k]].tolist())
    ss, si = torch.sort(scores, descending=True, stable=True)
    threshold = value * scores.sum() - eps
    total, count = 0.0, 0
    for s in ss:
        if total >= threshold:
            break
        if s.item() <= 0:
            break
        total += s.item()
        count += 1
    return set(idx[si[:count]].tolist()) if total >= threshold else set()


def random_rewards(rng: np.random.Generator, groups: int, size: int) -> np.ndarray:
    kind = rng.integers(4)
    if kind == 0:  # Sokoban-like: success bonus, step and format penalties
        return rng.choice([-1.0, -0.3, -0.1, 0.0, 9.3, 10.0], size=groups * size)
    if kind == 1:  # 0/1 success with groups of every difficulty
        p = np.repeat(rng.uniform(0, 1, groups), size)
        return (rng.uniform(size=groups * size) < p).astype(float)
    if kind == 2:  # continuous
        return rng.normal(0, rng.uniform(0.01, 3), groups * size)
    return np.round(rng.uniform(0, 1, groups * size), 1)  # coarse grid: many ties


@pytest.mark.parametrize(
    ("strategy", "mode", "include_zero", "value"),
    [
        ("softmax_top_p", "softmax", True, 0.9),  # the main table's rule
        ("softmax_top_p", "softmax", True, 1.0),  # its no-filter twin
        ("top_p", "linear", True, 0.9),
        ("top_p", "linear", False, 0.9),
        ("softmax_top_p", "softmax", False, 0.7),
    ],
)
def test_filter_selection_matches_ragens_code_on_random_batches(strategy, mode, include_zero, value):
    rng = np.random.default_rng(12)
    mismatches = 0
    for _ in range(1200):
        groups, size = int(rng.integers(1, 13)), int(rng.choice([2, 4, 8, 16]))
        r = random_rewards(rng, groups, size)
        ours = decide(r, size, strategy=strategy, value=value, include_zero=include_zero, metric="std")
        std = torch.tensor(r, dtype=torch.float32).view(groups, size).std(dim=-1)  # RAGEN: rollout_filter.py
        ref = ragen_select(std, value=value, include_zero=include_zero, mode=mode)
        # Groups whose std is equal in exact arithmetic differ by float32 noise in RAGEN's std, which then decides
        # which of the tied groups it keeps: compare the kept scores, so tied groups are interchangeable.
        exact = group_scores(r, size, "std")
        kept = np.flatnonzero(ours.keep_groups).tolist()
        mismatches += len(kept) != len(ref) or not np.allclose(
            np.sort(exact[kept]), np.sort(exact[sorted(ref)]), rtol=0, atol=1e-9
        )
    assert mismatches == 0


def test_group_std_equals_ragens_unbiased_std():
    r = np.random.default_rng(0).normal(size=64)
    ref = torch.tensor(r).view(4, 16).std(dim=-1).numpy()
    np.testing.assert_allclose(group_scores(r, 16, "std"), ref, rtol=1e-12)


# ------------------------------------------------------------------------------------------ loss math
def test_dual_clip_and_per_sequence_aggregation_by_hand():
    # two sequences of 3 tokens, the second with 2 real tokens; clip 0.2 / 0.28, dual-clip c = 3
    ratio = torch.tensor([[1.5, 0.5, 4.0], [1.0, 0.7, 9.9]])
    adv = torch.tensor([[1.0, 1.0, -1.0], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    old = torch.zeros(2, 3)
    new = torch.log(ratio)
    loss, clipped, dual = clipped_surrogate(new, old, adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    # token by token: max(-A r, -A clip(r)), then min(., -A c) where A < 0
    # (0,0) A=1, r=1.5: max(-1.5, -1.28) = -1.28           (clipped high)
    # (0,1) A=1, r=0.5: max(-0.5, -0.8) = -0.5
    # (0,2) A=-1, r=4: max(4, 1.2) = 4 -> min(4, 3) = 3    (dual clip)
    # (1,0) A=-2, r=1: max(2, 2) = 2
    # (1,1) A=-2, r=.7: max(1.4, 1.6) = 1.6                (clipped low)
    expected = torch.tensor([[-1.28, -0.5, 3.0], [2.0, 1.6, 19.8]])
    torch.testing.assert_close(loss[:, :2], expected[:, :2])
    assert loss[0, 2].item() == pytest.approx(3.0)
    assert loss[1, 2].item() == pytest.approx(6.0)  # masked later; dual clip still bounds it at -A c = 6
    assert clipped.tolist()[0][:2] == [True, False] and clipped[1, 1]
    assert dual[0, 2] and not dual[0, 0]
    # per sequence (seq-mean-token-mean): ((-1.28 - 0.5 + 3) / 3 + (2 + 1.6) / 2) / 2
    per_seq = ((-1.28 - 0.5 + 3.0) / 3 + (2.0 + 1.6) / 2) / 2
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(per_seq)
    # token mean over the micro-batch: all five real tokens alike
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx((-1.28 - 0.5 + 3.0 + 2.0 + 1.6) / 5)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx(
        ((-1.28 - 0.5 + 3.0) + 3.6) / 2
    )
    norm = aggregate(loss, mask, "seq-mean-token-sum-norm", norm_length=10).item()
    assert norm == pytest.approx((-1.28 - 0.5 + 3.0 + 3.6) / 20)
    # RAGEN's token-mean with micro-batches of one sequence is the per-sequence mean
    one_by_one = sum(aggregate(loss[i : i + 1], mask[i : i + 1], "token-mean") for i in range(2)) / 2
    assert one_by_one.item() == pytest.approx(per_seq)
    # without dual clip the (0,2) token keeps its unbounded loss 4
    plain, _, none = clipped_surrogate(new, old, adv, clip_low=0.2, clip_high=0.28)
    assert plain[0, 2].item() == pytest.approx(4.0) and not none.any()


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_surrogate(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), clip_low=0.2, clip_high=0.2, dual_clip=1.0
        )


def test_drgrpo_entropy_and_policy_terms_share_the_scale():
    # Dr.GRPO (TRL dr_grpo): the token sum divided by rows x max_completion_length. With every per-token policy
    # loss and entropy equal to 1, the two terms must be equal; TRL's entropy (a per-token mean) would be 1 here
    # while the policy term is L / max_completion_length.
    B, T, L = 3, 40, 7
    mask = torch.zeros(B, T)
    mask[:, :L] = 1
    adv = -torch.ones(B)  # ratio 1: per-token loss -A = 1
    res = policy_loss(
        torch.zeros(B, T),
        torch.zeros(B, T),
        adv,
        mask,
        clip_low=0.2,
        clip_high=0.28,
        agg="seq-mean-token-sum-norm",
        entropies=torch.ones(B, T),
        entropy_coef=0.5,
        norm_length=3200,
    )
    assert res.policy.item() == pytest.approx(L / 3200)
    assert res.entropy.item() == pytest.approx(res.policy.item())
    assert res.total.item() == pytest.approx(res.policy.item() * (1 - 0.5))


def test_unknown_aggregation_and_missing_norm_length_raise():
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "token-sum")
    with pytest.raises(ValueError, match="norm_length"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "seq-mean-token-sum-norm")


# ------------------------------------------------------------------------------------------ batch helpers
def _batch(n=4, c=5):
    return {
        "prompt_ids": torch.arange(n * 3).view(n, 3),
        "prompt_mask": torch.ones(n, 3, dtype=torch.long),
        "completion_ids": torch.arange(n * c).view(n, c),
        "completion_mask": torch.ones(n, c, dtype=torch.long),
        "advantages": torch.arange(1, n + 1, dtype=torch.float),
        "num_items_in_batch": torch.tensor(n * c),
    }


def test_select_rows_copy_pads_with_real_copies_of_kept_rows():
    g = torch.Generator().manual_seed(0)
    out, copies = select_rows_copy(_batch(), torch.tensor([False, True, True, False]), 4, g)
    assert copies == 2 and out["completion_ids"].shape[0] == 4
    assert out["advantages"][:2].tolist() == [2.0, 3.0]
    assert sorted(out["advantages"][2:].tolist()) == [2.0, 3.0]  # without replacement while possible
    assert loss_mask(out).all()  # copies count in the loss, as RAGEN's
    out, copies = select_rows_copy(_batch(), torch.tensor([True, False, False, False]), 3, g)
    assert out["advantages"].tolist() == [1.0, 1.0, 1.0]
    nothing, pad = select_rows_copy(_batch(), torch.zeros(4, dtype=torch.bool), 2, g)
    assert pad == 2 and not loss_mask(nothing).any()  # nothing kept: masked padding
    with pytest.raises(ValueError, match="below"):
        select_rows_copy(_batch(), torch.ones(4, dtype=torch.bool), 2, g)


def test_split_micro_batches_fills_the_rest_with_empty_ones():
    chunks, real = split_micro_batches(_batch(4), 2, 4)
    assert real == 2 and len(chunks) == 4
    assert chunks[1]["advantages"].tolist() == [3.0, 4.0]
    e = chunks[3]
    assert e["completion_ids"].shape == (1, 1) and e["prompt_ids"].shape == (1, 1)
    assert not loss_mask(e).any() and e["advantages"].abs().sum() == 0
    assert empty_micro_batch(_batch())["num_items_in_batch"] == 20
    with pytest.raises(ValueError):
        split_micro_batches(_batch(4), 3, 4)
    with pytest.raises(ValueError):
        split_micro_batches(_batch(4), 1, 2)


# ------------------------------------------------------------------------------------------ early stops
class _Control:
    should_training_stop = False


class _State:
    global_step = 7


def test_reward_std_collapse_stop_follows_ragens_rule():
    from types import SimpleNamespace

    from llm_gym.trainer.callbacks import RewardStdCollapseCallback, StopSignal
    from llm_gym.trainer.signals import RoundDecision

    trainer, stop = SimpleNamespace(last_round=None), StopSignal()
    cb = RewardStdCollapseCallback(trainer, stop, 0.1, 3)
    ctrl = _Control()
    rounds = []

    def round_(std, skip=False):
        rounds.append(std)
        metrics = {"snr/group_std_before": std}
        trainer.last_round = RoundDecision(index=len(rounds) - 1, batch={}, skip=skip, metrics=metrics)
        cb.on_step_end(None, _State(), ctrl)

    for v in (1.0, 2.0, 3.0):  # baseline 2.0
        round_(v)
    round_(0.1)
    round_(0.0, skip=True)  # an empty round does not count
    round_(0.1)
    assert not ctrl.should_training_stop
    round_(0.25)  # not below 0.2: the window of three is not all low
    round_(0.1)
    round_(0.1)
    assert not ctrl.should_training_stop
    round_(0.1)
    assert ctrl.should_training_stop and "collapsed" in stop.reason


def test_low_validation_success_stop():
    from llm_gym.trainer.callbacks import LowSuccessStopCallback, StopSignal

    cb = LowSuccessStopCallback(StopSignal(), 0.01, 2)
    ctrl = _Control()
    # llmgym-train evaluates before train(): RAGEN never counts its validation before training
    for _ in range(3):
        cb.on_evaluate(None, _State(), ctrl, metrics={"eval_env/success": 0.0})
    assert cb.low == 0 and not ctrl.should_training_stop
    cb.on_train_begin(None, _State(), ctrl)
    cb.on_evaluate(None, _State(), ctrl, metrics={"eval_env/success": 0.0})
    cb.on_evaluate(None, _State(), ctrl, metrics={"eval_env/success": 0.5})
    cb.on_evaluate(None, _State(), ctrl, metrics={"eval_env/success": 0.005})
    assert not ctrl.should_training_stop
    cb.on_evaluate(None, _State(), ctrl, metrics={"eval_env/success": 0.0})
    assert ctrl.should_training_stop
    # a resumed run continues the restored count; evaluations after train() do not count either
    resumed = LowSuccessStopCallback(StopSignal(), 0.01, 2)
    resumed.load_state_dict({"low": 1})
    resumed.on_evaluate(None, _State(), _Control(), metrics={"eval_env/success": 0.0})  # before train()
    resumed.on_train_begin(None, _State(), _Control())
    assert resumed.low == 1
    resumed.on_train_end(None, _State(), _Control())
    resumed.on_evaluate(None, _State(), ctrl2 := _Control(), metrics={"eval_env/success": 0.0})
    assert resumed.low == 1 and not ctrl2.should_training_stop


# ------------------------------------------------------------------------------------------ chat style
def _ragen_chat_episode(reply, env_kwargs):
    """The chatml template and one FrozenLakeDeterministic episode (seed 0) in RAGEN's chat style in which the
    model answers ``reply`` every turn."""
    from llm_gym.trainer.chat_templates import ChatTemplateTokens
    from llm_gym.trainer.rollouts import play_token_episodes

    from llm_gym.agent.chat import ChatFormat
    from tests._tiny import build_tiny_tokenizer

    template = ChatTemplateTokens(build_tiny_tokenizer("chatml"))

    def generate(contexts, budgets):
        ids = template.encode(reply) + [template.end_of_turn_id]
        return [ids for _ in contexts], [[-0.5] * len(ids) for _ in contexts]

    (e,) = play_token_episodes(
        "llmgym/FrozenLakeDeterministic-v0",
        [0],
        generate,
        template,
        max_new_tokens=64,
        max_completion_length=4000,
        env_kwargs=env_kwargs,
        chat=ChatFormat(style="ragen"),
    )
    return template, e


def test_ragen_chat_style_puts_think_in_the_prompt_not_in_the_trained_tokens():
    reply = "reason</think><answer>Right</answer>"
    template, e = _ragen_chat_episode(reply, {"max_turns": 2, "parse_mode": "ragen"})
    prefix = template.encode("<think>")
    assert e.prompt_ids[-len(prefix) :] == prefix  # first turn: the prefix ends the prompt
    assert e.record.turns[0].response == "<think>" + reply  # the env parses RAGEN's full reply
    assert e.record.turns[0].info["action_is_valid"]
    # later turns: the prefix closes the untrained between-turn tokens, the reply tokens are trained
    (s, t) = e.turn_spans[1]
    assert e.completion_ids[s - len(prefix) : s] == prefix
    assert all(m == 0 for m in e.env_mask[s - len(prefix) : s]) and all(m == 1 for m in e.env_mask[s:t])
    model_ids = [i for i, m in zip(e.completion_ids, e.env_mask) if m]
    assert model_ids == (template.encode(reply) + [template.end_of_turn_id]) * len(e.record.turns)
    # the rendered conversation is the token sequence (the history holds the full reply)
    rendered = template.encode(template.render(e.conv.messages(window=None), add_generation_prompt=False))
    ours = e.prompt_ids + e.completion_ids
    assert rendered[: len(ours)] == ours


# ------------------------------------------------------------------------------------------ the profile
def _resolve(*argv):
    from llm_gym.trainer.resolve import resolve_config

    return resolve_config(list(argv), gpu=True, log=lambda *_: None, dry_run=True)


RAGEN2_EXPECTED = {
    "learning_rate": 1e-6,
    "weight_decay": 0.01,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "beta": 0.0,
    "entropy_coef": 0.001,
    "epsilon": 0.2,
    "epsilon_high": 0.28,
    "dual_clip": 3.0,
    "loss_agg_mode": "seq-mean-token-mean",
    "num_prompts": 8,
    "num_generations": 16,
    "max_steps": 1600,
    "eval_seed": 123,
    "num_eval_seeds": 512,
    "eval_temperature": 0.5,
    "eval_steps": 40,
    "filter_strategy": "softmax_top_p",
    "filter_metric": "std",
    "filter_include_zero": True,
    "filter_value": 0.9,
    "filter_variance_ddof": 1,
    "filter_update_steps": "proportional",
    "advantages_after_filter": True,
    "filter_empty_stop_steps": 5,
    "early_stop_reward_std_ratio": 0.1,
    "early_stop_min_success": 0.01,
    "critic_model": "separate",
    "value_lr": 1e-5,
    "critic_weight_decay": 0.01,
    "value_clip": 0.5,
    "gae_gamma": 1.0,
    "gae_lambda": 1.0,
    "chat_style": "ragen",
    "group_dynamics": "independent",
    "max_turns": 5,
    "max_actions_per_turn": 2,
    "max_actions": 10,
    "think": True,
    "train_seed": 10000,
    "temperature": 1.0,
    "max_new_tokens": 400,
}


def test_ragen2_profile_sets_the_protocol():
    config, meta = _resolve("--env", "Sokoban", "--profile", "ragen2")
    assert meta["model"] == "Qwen/Qwen2.5-3B" and meta["algo"] == "ppo"
    for key, value in RAGEN2_EXPECTED.items():
        assert getattr(config, key) == value, key
    assert (
        config.per_device_train_batch_size * config.gradient_accumulation_steps == 32
    )  # ppo_mini_batch_size
    assert config.env_kwargs == {
        "generator": "ragen",
        "search_depth": 300,
        "observation_format": "grid_coord",
        "observation_style": "ragen",
        "parse_mode": "ragen",
    }
    assert meta["merged"]["bf16"] is True  # the GPU setting, although this machine builds the config on CPU


def test_ragen2_rows_per_algorithm_and_no_filter_twin():
    config, _ = _resolve("--env", "FrozenLake", "--profile", "ragen2", "--algo", "drgrpo")
    assert config.loss_agg_mode == "seq-mean-token-sum" and config.scale_rewards == "none"
    assert config.loss_type == "dr_grpo" and config.env_kwargs["success_rate"] == 1.0
    assert config.env_kwargs["generator"] == "ragen"  # RAGEN's maps per seed (N8)
    config, _ = _resolve(
        "--env", "Countdown", "--profile", "ragen2", "--algo", "grpo", "--filter_value", "1.0"
    )
    assert config.scale_rewards == "group" and config.max_turns == 1
    assert config.env_kwargs == {"dataset": "ragen", "parse_mode": "ragen", "action_sep": "||"}
    # the no-filter twin keeps every group, as RAGEN's top_p >= 1
    d = decide(
        np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]), 2, strategy="softmax_top_p", value=1.0, include_zero=True
    )
    assert d.keep_groups.all()
    config, _ = _resolve("--env", "MetaMathQA", "--profile", "ragen2")
    assert config.env_kwargs == {"strict": True, "parse_mode": "ragen", "action_sep": "||"}
    assert config.max_turns == 5


@pytest.mark.parametrize("env", ["Sokoban", "FrozenLake", "Countdown", "MetaMathQA"])
def test_ragen2_parses_every_env_with_ragens_parser(env):
    # RAGEN parses every reply with one regex (ctx_manager.py:196-221); the profile's envs must too (N3).
    config, _ = _resolve("--env", env, "--profile", "ragen2")
    assert config.env_kwargs["parse_mode"] == "ragen"
    import gymnasium as gym

    env_id = "llmgym/MetaMathQASample-v0" if env == "MetaMathQA" else f"llmgym/{env}-v0"  # offline data
    made = gym.make(env_id, **{k: v for k, v in config.env_kwargs.items() if k != "dataset"})
    assert made.unwrapped.parse_mode == "ragen"


def test_ragen2_refuses_an_environment_it_does_not_cover():
    from llm_gym.trainer.resolve import ConfigError

    with pytest.raises(ConfigError, match="ragen2"):
        _resolve("--env", "Bandit", "--profile", "ragen2")


def test_recommended_profile_is_unchanged_by_ragen2():
    config, meta = _resolve("--env", "Sokoban")
    assert meta["model"] == "Qwen/Qwen2.5-3B-Instruct" and meta["algo"] == "grpo"
    assert config.loss_agg_mode is None and config.dual_clip is None and config.critic_model == "head"
    assert config.filter_strategy == "top_p" and config.filter_update_steps == "fixed"


# ------------------------------------------------------------------------------------------ --dry_run
def test_dry_run_prints_table_sources_and_memory_on_qwen_3b_config(capsys):
    from llm_gym.trainer.cli import main

    code = main(
        [
            "--env",
            "Sokoban",
            "--profile",
            "ragen2",
            "--dry_run",
            "--learning_rate",
            "2e-6",
            "--gpu_memory_gib",
            "141",
            "--model_config",
            str(QWEN_3B_CONFIG),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(" ")}
    assert "profile ragen2" in rows["dual_clip"] and "dp_actor.py:420" in rows["dual_clip"]
    assert "flag" in rows["learning_rate"] and "2e-06" in rows["learning_rate"]
    assert "preset (--algo ppo)" in rows["loss_type"]
    assert "sh:10,72" in rows["model"]
    assert "3.09B parameters" in out  # Qwen2.5-3B: 3,085,938,688 parameters (tied embeddings)
    # float32 policy + critic with AdamW (16 bytes per parameter each) and 128 rows of HF generate: one H200
    assert "GiB per GPU (1 GPU): fits 141 GiB" in out and "does NOT" not in out
    plan = {
        line.split()[0] + line.split()[1]: line.split()
        for line in out.splitlines()
        if line[:5] in ("FSDP ", "DDP x")
    }
    assert plan["FSDPx2"][-1] == "yes" and plan["DDPx8"][-1] == "yes"


def test_dry_run_memory_with_fsdp_and_a_small_gpu():
    from llm_gym.trainer.dry_run import memory_report

    config, meta = _resolve("--env", "Sokoban", "--profile", "ragen2")
    meta.update(model_config=str(QWEN_3B_CONFIG), gpu_memory_gib=24.0)
    single, fits_single = memory_report(config, meta)
    meta["accelerate_config"] = str(
        Path(__file__).parents[1] / "trainer" / "accelerate_configs" / "fsdp.yaml"
    )
    sharded, _ = memory_report(config, meta)
    assert fits_single is False and "does NOT fit 24 GiB" in single
    assert "FSDP x8, 1 rows" in sharded and "weights float32 -> float32, AdamW on float32" in sharded

    def total(text):
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("total")))

    assert total(sharded) < total(single)
    meta.update(accelerate_config=None, model_config=None)
    text, ok = memory_report(config, {**meta, "model": "no-such-owner/no-such-model"})
    assert ok is None and "--model_config" in text


def test_dry_run_loads_no_weights(monkeypatch, capsys):
    import transformers

    def boom(*a, **k):
        raise AssertionError("dry run loaded a model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    from llm_gym.trainer.cli import main

    assert (
        main(
            ["--env", "FrozenLake", "--profile", "ragen2", "--dry_run", "--model_config", str(QWEN_3B_CONFIG)]
        )
        == 0
    )
    assert "critic" in capsys.readouterr().out


def test_config_rejects_bad_protocol_options(tmp_path):
    from llm_gym.trainer.config import LLMGymGRPOConfig

    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    with pytest.raises(ValueError, match="dual_clip"):
        LLMGymGRPOConfig(**base, dual_clip=0.5)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        LLMGymGRPOConfig(**base, loss_agg_mode="sum")
    with pytest.raises(ValueError, match="proportional"):
        LLMGymGRPOConfig(**base, filter_update_steps="proportional", filter_drop="mask")
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        LLMGymGRPOConfig(**base, dual_clip=3.0, top_entropy_quantile=0.5)
    with pytest.raises(ValueError, match="critic_model"):
        LLMGymGRPOConfig(**base, critic_model="twin")
    with pytest.raises(ValueError, match="variance"):
        LLMGymGRPOConfig(**base, filter_strategy="upstream_top_p", filter_metric="std")
    with pytest.raises(ValueError, match="filter_variance_ddof"):
        LLMGymGRPOConfig(**base, filter_variance_ddof=-1)


# ------------------------------------------------------------------------------------------ trainer wiring
def _grpo_trainer(tiny_dir, out_dir, reward_funcs=None, **overrides):
    from tests._tiny import make_tiny_trainer, tiny_run_kwargs

    kwargs = tiny_run_kwargs(
        out_dir,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        max_turns=1,
        learning_rate=1e-2,
        beta=0.0,
    )
    kwargs.update(overrides)
    return make_tiny_trainer(tiny_dir, kwargs, reward_funcs=reward_funcs)


def _group0_signal(completions, **_):
    """Rewards 1, 0 for group 0 and 0, 0 for group 1 (rows are group-contiguous)."""
    return [1.0 if i % 4 == 0 else 0.0 for i in range(len(completions))]


def test_proportional_mode_takes_fewer_optimizer_steps_and_skips_the_rest(tiny_dir, tmp_path):
    tr = _grpo_trainer(
        tiny_dir,
        tmp_path,
        reward_funcs=[_group0_signal],
        filter_strategy="top_p",
        filter_update_steps="proportional",
        max_steps=2,
    )
    assert tr.args.steps_per_generation == 2  # one round = two optimizer steps of 2 rows
    before: dict[int, dict[str, torch.Tensor]] = {}

    from transformers import TrainerCallback

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            before[state.global_step] = {n: p.detach().clone() for n, p in tr.model.named_parameters()}

    tr.add_callback(Watch())
    p0 = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()
    log = tr.state.log_history[0]
    assert log["snr/kept_groups"] == 1 and log["snr/update_steps"] == 1
    # step 1 trained on group 0; step 2 had no rows: weights and optimizer state untouched
    assert any(not torch.equal(before[1][n], p0[n]) for n in p0)
    assert all(torch.equal(before[2][n], before[1][n]) for n in p0)
    assert tr.skipped_steps == 1


def test_trainer_loss_with_drgrpo_aggregation_scales_entropy_like_policy(tiny_dir, tmp_path):
    tr = _grpo_trainer(
        tiny_dir, tmp_path, loss_type="dr_grpo", loss_agg_mode="seq-mean-token-sum-norm", entropy_coef=0.1
    )
    tr.current_gradient_accumulation_steps = 1
    tr.model.train()
    b = _batch(2, 5)
    b["completion_mask"][1, 3:] = 0
    b["advantages"] = torch.zeros(2)  # only the entropy term remains
    loss = tr.compute_loss(tr.model, b)
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
    attn = torch.cat([b["prompt_mask"], b["completion_mask"]], 1)
    with torch.no_grad():
        _, ent, _ = tr._get_per_token_logps_and_entropies(tr.model, ids, attn, 5, compute_entropy=True)
    mask = b["completion_mask"].float()
    expected = -0.1 * (ent * mask).sum() / (2 * tr.args.max_completion_length)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)


def test_ppo_advantages_after_filter_are_whitened_over_kept_rows(tiny_dir, tmp_path):
    from tests.test_ppo import make_trainer

    tr = make_trainer(
        tiny_dir,
        tmp_path,
        filter_strategy="top_p",
        filter_include_zero=False,
        advantages_after_filter=True,
        per_device_train_batch_size=2,
        num_prompts=2,
        max_steps=1,
        trainer_kwargs={"reward_funcs": [_group0_signal]},
    )
    captured = {}
    orig = tr.compute_advantages

    def spy(batch, rewards):
        out = orig(batch, rewards)
        captured["adv"], captured["mask"] = out["advantages"].clone(), loss_mask(out).clone()
        captured["rows"] = out["completion_ids"].shape[0]
        return out

    tr.compute_advantages = spy
    tr.train()
    assert captured["rows"] == 2  # the kept group only
    m = captured["mask"].bool()
    assert captured["adv"][m].mean().abs().item() < 1e-5  # whitened over what the loss sees


def test_separate_critic_trains_saves_and_keeps_out_of_policy_weights(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    from tests.test_ppo import make_trainer

    tr = make_trainer(tiny_dir, tmp_path, critic_model="separate", critic_weight_decay=0.01, max_steps=1)
    critic0 = {n: p.detach().clone() for n, p in tr.critic.named_parameters()}
    # a full copy of the backbone, not shared with the policy
    policy_ids = {id(p) for n, p in tr.model.named_parameters() if not n.startswith("critic.")}
    assert not policy_ids & {id(p) for p in tr.critic.parameters()}
    tr.train()
    group = [g for g in tr.optimizer.param_groups if any(p is tr.value_head.weight for p in g["params"])][0]
    assert group["weight_decay"] == 0.01 and group["initial_lr"] == tr.args.value_lr
    assert len(group["params"]) == len(critic0)
    assert any(not torch.equal(p, critic0[n]) for n, p in tr.critic.named_parameters())
    tr.save_model(str(tmp_path / "final"))
    files = os.listdir(tmp_path / "final")
    assert "critic.safetensors" in files
    weights = load_file(str(tmp_path / "final" / "model.safetensors"))
    assert not any(k.startswith("critic.") for k in weights)
    saved = load_file(str(tmp_path / "final" / "critic.safetensors"))
    assert set(saved) == set(tr.critic.state_dict())


# ------------------------------------------------------------------------------------------ slow: Qwen2.5-3B shape
@pytest.mark.slow
def test_one_ragen2_sokoban_step_on_a_one_layer_qwen_3b_shaped_model(tmp_path):
    """One real update of the ragen2 Sokoban profile (PPO, separate critic, dual-clip, per-sequence aggregation,
    softmax/std filter, proportional steps, RAGEN chat) on a random model of Qwen2.5-3B's shape but 1 layer:
    hidden 2048, 16 heads, 2 KV heads, intermediate 11008, vocabulary 151936. The tokenizer is the tiny test
    tokenizer (a few hundred ids): the embedding keeps Qwen's 151936 rows, so every shape but depth is Qwen's.

    Saved in bfloat16 like Qwen's checkpoint and loaded the way ``llmgym-train`` loads it on a GPU (float32 master
    weights); actor, critic, gradients and AdamW state are 12.4 GB, so one layer to fit a 16 GB CI machine. The
    learning rates are the profile's (1e-6 actor, 1e-5 critic): one step changes nearly every trainable element
    of both. Every other setting is the profile's GPU setting (``use_cpu`` runs its bf16 autocast on the CPU)."""
    from llm_gym.trainer.algorithms import trainer_class
    from llm_gym.trainer.precision import changed_fraction, load_for_training
    from llm_gym.trainer.resolve import resolve_config
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests._tiny import build_tiny_tokenizer

    cfg = json.loads(QWEN_3B_CONFIG.read_text())
    cfg.update(num_hidden_layers=1, max_window_layers=1, torch_dtype="bfloat16")
    tok = build_tiny_tokenizer("chatml")
    cfg.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config = AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    folder = tmp_path / "qwen3b-2layer"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    args, meta = resolve_config(
        [
            "--env",
            "Sokoban",
            "--profile",
            "ragen2",
            "--model",
            str(folder),
            "-o",
            str(tmp_path / "run"),
            # CPU-sized lengths and batch: 1 group x 2 rollouts, 1 turn of 4 tokens, one optimizer step
            "--set",
            "num_prompts=1",
            "--set",
            "num_generations=2",
            "--set",
            "per_device_train_batch_size=1",
            "--set",
            "gradient_accumulation_steps=2",
            "--set",
            "max_steps=1",
            "--set",
            "max_turns=1",
            "--set",
            "max_new_tokens=4",
            "--set",
            "max_completion_length=16",
            "--set",
            "num_eval_seeds=0",
            "--set",
            "mi_every=0",
            "--set",
            "save_strategy=no",
            "--set",
            "gradient_checkpointing=false",
            "--set",
            "eval_strategy=no",
            "--set",
            "use_cpu=true",  # the profile's bf16=true then runs as CPU bf16 autocast
        ],
        gpu=True,
        log=lambda *_: None,
    )
    assert args.use_cpu and args.think and args.temperature == 1.0
    for key in (
        "dual_clip",
        "loss_agg_mode",
        "critic_model",
        "filter_strategy",
        "chat_style",
        "filter_update_steps",
    ):
        assert getattr(args, key) == RAGEN2_EXPECTED[key], key
    assert (args.learning_rate, args.value_lr) == (1e-6, 1e-5) and args.bf16
    model, tok, precision = load_for_training(str(folder), args, gpu=True, environ={}, log=None)
    assert precision.load == "float32" and precision.keeps_updates
    assert model.config.vocab_size == 151936 and model.get_input_embeddings().weight.shape == (151936, 2048)
    tr = trainer_class(meta["algo"])(model=model, args=args, processing_class=tok)
    assert tr.critic is not None
    assert {p.dtype for p in tr.model.parameters()} == {torch.float32}
    # the decoder layer of each model (77M elements; a full snapshot would add 3 GB to the 12.4 GB of states)
    policy0 = {
        n: t.detach().clone() for n, t in tr.model.named_parameters() if n.startswith("model.layers.0.")
    }
    critic0 = {
        n: t.detach().clone() for n, t in tr.critic.named_parameters() if n.startswith("body.layers.0.")
    }
    embedding0 = tr.model.get_input_embeddings().weight[:4096].detach().clone()
    tr.train()
    assert tr.state.global_step == 1
    log = tr.state.log_history[0]
    assert "ppo/value_loss" in log and "snr/kept_frac" in log and "clip_ratio/dual_mean" in log
    assert math.isfinite(log["loss"])
    assert tr.last_rollout.records[0].turns[0].response.startswith("<think>")
    assert changed_fraction(tr.model, policy0) > 0.9
    assert changed_fraction(tr.critic, critic0) > 0.9
    assert (tr.model.get_input_embeddings().weight[:4096] != embedding0).float().mean() > 0.9


def test_separate_critic_checkpoint_round_trip(tiny_dir, tmp_path):
    from llm_gym.trainer.ppo import CRITIC_FILE, load_critic

    from tests.test_ppo import make_trainer

    tr = make_trainer(tiny_dir, tmp_path / "out", critic_model="separate")
    ckpt = tmp_path / "ckpt"
    tr._save(str(ckpt))
    assert (ckpt / CRITIC_FILE).is_file()
    saved = {n: p.detach().clone() for n, p in tr.critic.named_parameters()}
    with torch.no_grad():
        for p in tr.critic.parameters():
            p.add_(1.0)
    tr._load_from_checkpoint(str(ckpt))
    assert all(torch.equal(p, saved[n]) for n, p in tr.critic.named_parameters())
    assert not load_critic(tr.critic, str(tmp_path))  # no file: a warning, the critic keeps its weights


def test_ragen_chat_style_without_thinking_prefixes_answer():
    template, e = _ragen_chat_episode(
        "Right</answer>", {"max_turns": 1, "think": False, "parse_mode": "ragen"}
    )
    assert e.prompt_ids[-len(template.encode("<answer>")) :] == template.encode("<answer>")
    assert e.record.turns[0].response == "<answer>Right</answer>"
    assert e.record.turns[0].info["action_is_valid"]


def _set_grads(params, norm, seed):
    """Random gradients on ``params`` with total L2 norm ``norm``."""
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(p.shape, generator=g) for p in params]
    total = torch.sqrt(sum((x.double() ** 2).sum() for x in grads)).item()
    for p, x in zip(params, grads):
        p.grad = (x * (norm / total)).to(p.dtype)


def _grad_norm(params):
    return torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params if p.grad is not None)).item()


def _separate_critic_trainer(tiny_dir, tmp_path):
    """A PPO trainer with a separate critic and gradient clipping at 1; its actor and critic parameters, and
    the critic parameters' ids."""
    from tests.test_ppo import make_trainer

    tr = make_trainer(tiny_dir, tmp_path, critic_model="separate", max_grad_norm=1.0)
    critic = list(tr.critic.parameters())
    ids = {id(p) for p in critic}
    actor = [p for p in tr.model.parameters() if id(p) not in ids]
    return tr, actor, critic, ids


def test_separate_critic_gradients_are_clipped_apart_from_the_actors(tiny_dir, tmp_path):
    tr, actor, critic, ids = _separate_critic_trainer(tiny_dir, tmp_path)
    # the reviewer's norms: jointly clipped, the actor would be scaled to 3.867 / 40.17 = 0.096
    _set_grads(actor, 3.867, seed=0)
    _set_grads(critic, 39.987, seed=1)
    directions = [p.grad.clone() for p in actor + critic]
    norm = tr._clip_grad_norm(tr.model)
    assert float(norm) == pytest.approx(3.867, rel=1e-4)  # the logged grad_norm is the actor's own
    assert _grad_norm(actor) == pytest.approx(1.0, rel=1e-4)
    assert _grad_norm(critic) == pytest.approx(1.0, rel=1e-4)
    for p, d in zip(actor + critic, directions):  # clipping only rescales each model's gradient
        torch.testing.assert_close(
            p.grad, d * (1.0 / 3.867 if id(p) not in ids else 1.0 / 39.987), rtol=1e-4, atol=0
        )
    assert tr._metrics["train"]["ppo/critic_grad_norm"][-1] == pytest.approx(39.987, rel=1e-4)
    # below the limit nothing moves
    _set_grads(actor, 0.5, seed=2)
    _set_grads(critic, 0.25, seed=3)
    assert float(tr._clip_grad_norm(tr.model)) == pytest.approx(0.5, rel=1e-4)
    assert _grad_norm(actor) == pytest.approx(0.5, rel=1e-4) and _grad_norm(critic) == pytest.approx(
        0.25, rel=1e-4
    )


def test_separate_clipping_unscales_fp16_gradients_once(tiny_dir, tmp_path, monkeypatch):
    """fp16 AMP's GradScaler unscales once per step and raises on a second call: both models' norms must be
    taken on the gradients unscaled by that one call (a GPU-free stand-in for the scaler)."""
    tr, actor, critic, ids = _separate_critic_trainer(tiny_dir, tmp_path)
    scale = 1024.0
    _set_grads(actor, 3.0 * scale, seed=0)
    _set_grads(critic, 2.0 * scale, seed=1)
    calls = []

    def unscale_gradients(optimizer=None):
        if calls:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        calls.append(optimizer)
        for p in actor + critic:
            p.grad /= scale

    monkeypatch.setattr(tr.accelerator, "unscale_gradients", unscale_gradients)
    assert float(tr._clip_grad_norm(tr.model)) == pytest.approx(3.0, rel=1e-4)
    assert len(calls) == 1
    assert tr._metrics["train"]["ppo/critic_grad_norm"][-1] == pytest.approx(2.0, rel=1e-4)
    assert _grad_norm(actor) == pytest.approx(1.0, rel=1e-4) and _grad_norm(critic) == pytest.approx(
        1.0, rel=1e-4
    )


def test_value_head_on_the_shared_backbone_is_clipped_jointly(tiny_dir, tmp_path):
    from tests.test_ppo import make_trainer

    tr = make_trainer(tiny_dir, tmp_path, critic_model="head", max_grad_norm=1.0)
    head = list(tr.value_head.parameters())
    ids = {id(p) for p in head}
    policy = [p for p in tr.model.parameters() if id(p) not in ids]
    _set_grads(policy, 3.0, seed=0)
    _set_grads(head, 4.0, seed=1)
    # the backbone's gradient holds both losses', so one norm covers all (documented in docs/ragen2.md)
    assert float(tr._clip_grad_norm(tr.model)) == pytest.approx(5.0, rel=1e-4)
    assert _grad_norm(policy + head) == pytest.approx(1.0, rel=1e-4)
    assert _grad_norm(policy) == pytest.approx(3.0 / 5.0, rel=1e-4)
    assert "ppo/critic_grad_norm" not in tr._metrics["train"]


@pytest.mark.parametrize(("algo", "after"), [("ppo", True), ("ppo", False), ("grpo", True)])
def test_filter_loss_scaling_multiplies_the_final_advantages(tiny_dir, tmp_path, algo, after):
    from tests.test_ppo import make_trainer

    settings = dict(
        filter_strategy="top_p",
        filter_include_zero=False,
        advantages_after_filter=after,
        filter_loss_scaling="linear",
        max_steps=1,
    )
    if algo == "ppo":
        tr = make_trainer(
            tiny_dir,
            tmp_path,
            per_device_train_batch_size=2,
            num_prompts=2,
            trainer_kwargs={"reward_funcs": [_group0_signal]},
            **settings,
        )
    else:
        tr = _grpo_trainer(tiny_dir, tmp_path, reward_funcs=[_group0_signal], **settings)
    captured = {}
    hook, score = tr.compute_advantages, tr._generate_and_score_completions

    def spy_hook(batch, rewards):
        out = hook(batch, rewards)
        captured["hook"] = out["advantages"].clone()
        return out

    def spy_score(inputs):
        out = score(inputs)
        captured["final"] = out["advantages"].clone()
        return out

    tr.compute_advantages, tr._generate_and_score_completions = spy_hook, spy_score
    tr.train()
    assert tr.last_round.loss_scale == 0.5  # one of two groups kept
    final = captured["final"]
    assert final.shape[0] == 2  # the kept group; group 0 comes first in either timing
    hook_adv = captured["hook"][:2, : final.shape[1]] if final.dim() == 2 else captured["hook"][:2]
    assert hook_adv.abs().max() > 0.1
    torch.testing.assert_close(final, 0.5 * hook_adv)  # once: neither lost nor applied twice


def test_proportional_mode_round_with_nothing_kept_takes_no_step(tiny_dir, tmp_path):
    tr = _grpo_trainer(
        tiny_dir,
        tmp_path,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        filter_strategy="top_p",
        filter_update_steps="proportional",
        max_steps=2,
    )
    p0 = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()
    assert tr.state.log_history[0]["snr/update_steps"] == 0
    assert tr.skipped_steps == 2
    assert all(torch.equal(p, p0[n]) for n, p in tr.model.named_parameters())
