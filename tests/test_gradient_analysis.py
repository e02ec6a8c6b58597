"""The gradient split by reward variance (``gradient_analysis_every``): the pure pieces, then the real trainer on
the tiny model: the analysis leaves the run bitwise unchanged, and its ``all`` norms are the update's gradient."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch

pytest.importorskip("trl")

import llm_gym.trainer.grpo as grpo_module  # noqa: E402
from llm_gym.trainer import gradient_analysis as ga  # noqa: E402
from llm_gym.trainer.losses import AGG_MODES, aggregate, split_aggregate  # noqa: E402
from llm_gym.trainer.signals import decide_round  # noqa: E402

from tests._tiny import make_tiny_trainer, tiny_run_kwargs  # noqa: E402

G = 4
#: Per-group rewards by group index (mod 3): no variance, variance 1/3, variance 1/4 (ddof 1).
PATTERNS = ([0.5] * 4, [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0])


def patterned_reward(prompts, completions, **_):
    return [PATTERNS[(i // G) % 3][i % G] for i in range(len(prompts))]


# ------------------------------------------------------------------------------------------ pure pieces
def test_quantile_buckets_cut_the_sorted_groups_into_equal_counts_with_the_rest_last():
    v = np.array([0.5, 0.0, 0.2, 0.2, 1.0, 0.0, 0.3])
    b = ga.bucket_groups(v, 3, "quantile")
    assert list(b) == ["all", "bucket_1", "bucket_2", "bucket_3"]
    # ascending variance, ties by group index; 7 groups in 3 buckets: 2, 2 and the last 3
    assert [b[k].tolist() for k in ("bucket_1", "bucket_2", "bucket_3")] == [[1, 5], [2, 3], [0, 4, 6]]
    assert b["all"].tolist() == list(range(7))
    # fewer groups than buckets: one group each (RAGEN lowers the bucket count)
    b = ga.bucket_groups(np.array([0.3, 0.1]), 6)
    assert list(b) == ["all", "bucket_1", "bucket_2"] and b["bucket_1"].tolist() == [1]


def test_fixed_buckets_use_ragens_std_edges_and_leave_out_empty_ones():
    std = np.array([0.5, 1.5, 5.0, 4.99, 0.0, 1.0])
    b = ga.bucket_groups(std**2, mode="fixed_rv")
    assert {k: v.tolist() for k, v in b.items() if k != "all"} == {
        "bucket_1": [0, 4],
        "bucket_2": [1, 5],
        "bucket_5": [3],
        "bucket_6": [2],
    }
    for bad in (dict(mode="linear"), dict(num_buckets=0)):
        with pytest.raises(ValueError):
            ga.bucket_groups(std, **bad)
    with pytest.raises(ValueError, match="non-negative"):
        ga.bucket_groups(np.array([0.1, np.nan]))


def test_buckets_partition_the_groups():
    rng = np.random.default_rng(0)
    for mode in ("quantile", "fixed_rv"):
        for n in (1, 5, 13):
            v = rng.exponential(3.0, n) * (rng.random(n) > 0.3)
            b = ga.bucket_groups(v, 6, mode)
            parts = np.concatenate([g for k, g in b.items() if k != "all"])
            assert sorted(parts.tolist()) == list(range(n)), (mode, n)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_split_aggregate_over_chunks_equals_the_aggregate_of_the_whole(mode):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(7, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(7, 5, generator=g) > 0.4).double()
    mask[3] = 0  # a row without loss tokens
    num, den = split_aggregate(loss, mask, mode, norm_length=9)
    whole = aggregate(loss, mask, mode, norm_length=9)
    torch.testing.assert_close(num / den.clamp(min=1.0), whole)
    parts = [split_aggregate(loss[a:b], mask[a:b], mode, norm_length=9) for a, b in ((0, 2), (2, 3), (3, 7))]
    total = sum(p[0] for p in parts) / sum(p[1] for p in parts).clamp(min=1.0)
    torch.testing.assert_close(total, whole)
    with pytest.raises(ValueError):
        split_aggregate(loss, mask, "sum")


def test_the_task_term_at_ratio_one_is_the_policy_gradient_and_kl_has_no_gradient_at_the_reference():
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    adv = torch.tensor([0.7, -1.3])
    mats = ga.term_matrices(logps, adv, clip_low=0.2, clip_high=0.28, ref_logps=logps.detach().clone())
    assert set(mats) == {"task", "kl"}
    (g_task,) = torch.autograd.grad(mats["task"].sum(), logps, retain_graph=True)
    torch.testing.assert_close(g_task, -adv[:, None].expand(2, 2))  # -A * d log pi, not clipped at ratio 1
    (g_kl,) = torch.autograd.grad(mats["kl"].sum(), logps)
    assert torch.equal(mats["kl"].detach(), torch.zeros(2, 2)) and torch.equal(g_kl, torch.zeros(2, 2))


def test_rows_of_groups_and_restored_random_streams_and_gradients():
    assert ga.group_rows(np.array([2, 0]), 3).tolist() == [6, 7, 8, 0, 1, 2]
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    with ga.preserved_rng():
        torch.rand(3), random.random(), np.random.rand()
    assert torch.equal(before[0], torch.get_rng_state()) and before[1] == random.getstate()
    assert np.array_equal(before[2], np.random.get_state()[1])
    p = torch.nn.Parameter(torch.ones(2))
    g = torch.full((2,), 3.0)
    p.grad = g
    with ga.stashed_grads([p]):
        assert p.grad is None
        (p * 2).sum().backward()
    assert p.grad is g and torch.equal(g, torch.full((2,), 3.0))


def test_std_over_mean_of_the_group_reward_variance():
    from llm_gym.trainer.snr_filter import variance_spread

    assert variance_spread(np.array([0.0, 4.0])) == (2.0, 1.0)  # population std across groups
    std, cv = variance_spread(np.array([0.36, 0.72, 0.54]))  # a narrow spread, FrozenLake-like
    assert std == pytest.approx(np.std([0.36, 0.72, 0.54])) and cv == pytest.approx(std / 0.54)
    assert variance_spread(np.array([0.5, 0.5])) == (0.0, 0.0)
    std, cv = variance_spread(np.zeros(3))
    assert std == 0.0 and np.isnan(cv)  # no group carries signal: no ratio
    assert all(np.isnan(x) for x in variance_spread(np.array([])))


@pytest.mark.parametrize(
    "setting, match",
    [
        ({"gradient_analysis_every": -1}, "integer >= 0"),
        ({"gradient_analysis_buckets": 0}, "positive integer"),
        ({"gradient_analysis_bucket_mode": "linear"}, "one of"),
        ({"loss_type": "sapo"}, "not a clipped surrogate"),
        ({"advantages_after_filter": True}, "advantages_after_filter"),
        ({"top_entropy_quantile": 0.5}, "top_entropy_quantile"),
    ],
)
def test_config_refuses_what_the_analysis_cannot_measure(tmp_path, setting, match):
    from llm_gym.trainer.config import LLMGymGRPOConfig

    every = {} if "gradient_analysis_every" in setting else {"gradient_analysis_every": 1}
    with pytest.raises(ValueError, match=match):
        LLMGymGRPOConfig(**tiny_run_kwargs(tmp_path, **every, **setting))
    # the same settings with the analysis off are accepted (except the analysis's own fields)
    if (
        every
        and "gradient_analysis_bucket_mode" not in setting
        and "gradient_analysis_buckets" not in setting
    ):
        LLMGymGRPOConfig(**tiny_run_kwargs(tmp_path, **setting))


def test_the_flags_reach_the_config():
    from llm_gym.trainer.cli import resolve_config

    argv = [
        "--env",
        "Bandit",
        "--gradient_analysis_every",
        "50",
        "--gradient_analysis_bucket_mode",
        "fixed_rv",
    ]
    config, _ = resolve_config(argv, gpu=False, log=lambda *_: None)
    assert (config.gradient_analysis_every, config.gradient_analysis_bucket_mode) == (50, "fixed_rv")
    assert config.gradient_analysis_buckets == 6


# ------------------------------------------------------------------------------------------ through the trainer
def _make(tiny_dir, out_dir, *, every, dropout=0.0, reward=patterned_reward, **overrides):
    """A trainer on the tiny model: 3 groups of 4 (the PATTERNS), one optimizer step of 12 rows per round."""
    kwargs = tiny_run_kwargs(
        out_dir,
        num_prompts=3,
        num_generations=G,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=3,
        max_steps=3,
        learning_rate=1e-2,
        beta=0.04,
        entropy_coef=0.01,
        gradient_analysis_every=every,
        gradient_analysis_buckets=3,
    )
    kwargs.update(overrides)
    tr = make_tiny_trainer(tiny_dir, kwargs, reward_funcs=[reward])
    if dropout:  # the analysis forwards then draw dropout masks from torch's generator, as training's do
        for m in tr.model.modules():
            if hasattr(m, "attention_dropout"):
                m.attention_dropout = dropout
    return tr


def _train(tr, monkeypatch):
    """Train; returns each round's sampled completion ids."""
    samples = []

    def spy(trainer, batch, rewards, state):
        samples.append(batch["completion_ids"].clone())
        return decide_round(trainer, batch, rewards, state)

    monkeypatch.setattr(grpo_module, "decide_round", spy)
    tr.train()
    return samples


def _optimizer_tensors(tr):
    return [v for s in tr.optimizer.state_dict()["state"].values() for v in s.values() if torch.is_tensor(v)]


def test_the_analysis_leaves_weights_optimizer_random_streams_and_next_samples_bitwise_equal(
    tiny_dir, tmp_path, monkeypatch
):
    runs = {}
    for every in (0, 1):
        torch.manual_seed(0), random.seed(0), np.random.seed(0)
        # dropout: the packed shared-prefix pass has none, so TRL's own forwards
        tr = _make(
            tiny_dir, tmp_path / str(every), every=every, dropout=0.1, use_prefix_sharing=False, max_steps=2
        )
        samples = _train(tr, monkeypatch)
        runs[every] = (tr, samples, torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    (off, off_samples, *off_rng), (on, on_samples, *on_rng) = runs[0], runs[1]
    logs = [h for h in on.state.log_history if "loss" in h]
    assert len(logs) == 2 and all("grad_analysis/all/task_norm" in h for h in logs)  # it ran every round
    assert all(
        h["grad_analysis/bucket_3/task_norm"] > 0 and h["grad_analysis/all/kl_norm"] >= 0 for h in logs
    )
    assert not any(k.startswith("grad_analysis/") for h in off.state.log_history for k in h)
    # every round's samples (round 2 comes after an analysed round), weights and AdamW state
    assert len(on_samples) == len(off_samples) == 2
    assert all(torch.equal(a, b) for a, b in zip(on_samples, off_samples))
    assert all(torch.equal(a, b) for a, b in zip(on.model.parameters(), off.model.parameters()))
    on_opt, off_opt = _optimizer_tensors(on), _optimizer_tensors(off)
    assert len(on_opt) == len(off_opt) > 0 and all(torch.equal(a, b) for a, b in zip(on_opt, off_opt))
    assert torch.equal(on_rng[0], off_rng[0]) and on_rng[1] == off_rng[1]
    assert np.array_equal(on_rng[2], off_rng[2])
    assert [h["loss"] for h in logs] == [h["loss"] for h in off.state.log_history if "loss" in h]


def _constant_reward(prompts, completions, **_):
    return [0.5] * len(prompts)


@pytest.mark.parametrize(
    "term, loss_type, ga_steps, per_device",
    [("task", "dapo", 3, 4), ("task", "grpo", 1, 12), ("entropy", "grpo", 1, 12)],
    ids=["task-dapo-3-micro", "task-grpo-1-micro", "entropy-grpo-1-micro"],
)
def test_the_all_bucket_norm_is_the_norm_of_the_update(
    tiny_dir, tmp_path, monkeypatch, capsys, term, loss_type, ga_steps, per_device
):
    """SGD at lr 1 without clipping: the update is minus the round's gradient, whose norm the ``all`` bucket
    reports: the task term's with no regulariser (TRL's dapo normalises by the round's tokens across micro-batches,
    grpo by the rows of its one micro-batch), the entropy term's when every reward is equal (no task gradient)."""
    entropy = term == "entropy"
    tr = _make(
        tiny_dir,
        tmp_path,
        every=1,
        reward=_constant_reward if entropy else patterned_reward,
        max_steps=1,
        beta=0.0,
        entropy_coef=0.5 if entropy else 0.0,
        loss_type=loss_type,
        gradient_accumulation_steps=ga_steps,
        per_device_train_batch_size=per_device,
        filter_strategy="off",
        optim="sgd",
        learning_rate=1.0,
        max_grad_norm=0.0,
    )
    before = [p.detach().clone() for p in tr.model.parameters()]
    _train(tr, monkeypatch)
    delta = torch.cat([(p.detach() - b).flatten() for p, b in zip(tr.model.parameters(), before)])
    (log,) = [h for h in tr.state.log_history if "loss" in h]
    assert float(delta.norm()) > 0
    assert log[f"grad_analysis/all/{term}_norm"] == pytest.approx(float(delta.norm()), rel=1e-4)
    assert "grad_analysis/all/kl_norm" not in log  # beta 0: the term is off
    if entropy:
        assert log["grad_analysis/all/task_norm"] == 0.0 and log[
            "grad_analysis/all/reg_norm"
        ] == pytest.approx(log["grad_analysis/all/entropy_norm"])
        return
    assert "grad_analysis/all/entropy_norm" not in log
    assert (
        log["grad_analysis/bucket_1/task_norm"] == 0.0
    )  # the constant group: zero advantage, no task gradient
    assert log["grad_analysis/bucket_2/sqrt_reward_var"] == pytest.approx(0.5)
    assert log["grad_analysis/bucket_3/sqrt_reward_var"] == pytest.approx(np.sqrt(1 / 3))
    assert log["grad_analysis/all/sqrt_reward_var"] == pytest.approx(np.sqrt((0 + 1 / 3 + 1 / 4) / 3))
    assert log["grad_analysis/all/groups"] == 3 and log["grad_analysis/all/rows"] == 12
    assert log["grad_analysis/seconds"] > 0
    # its cost is printed, the same seconds as logged
    printed = re.search(
        r"gradient analysis, round 0: 3 buckets of 3 groups \(12 rows, terms task\) in ([0-9.]+)s",
        capsys.readouterr().out,
    )
    assert printed and float(printed.group(1)) == pytest.approx(log["grad_analysis/seconds"], abs=0.006)
