"""SNR filtering and MI metrics through the real ``LLMGymGRPOTrainer`` on a tiny offline model.

Rewards are set by a test reward function (groups are contiguous, G rows each), so we know which
groups carry variance and must reach the loss.
"""

import json
import os

import llm_gym.trainer.grpo as grpo_module
import numpy as np
import pytest
import torch
from llm_gym.trainer.batch import loss_mask
from llm_gym.trainer.signals import SignalState, decide_round, mi_metrics

from tests._tiny import make_tiny_trainer, tiny_run_kwargs

G = 2


def rewards_with_variance_in(groups):
    def reward(prompts, completions, **_):
        return [float(i % G) if (i // G) in groups else 0.5 for i in range(len(prompts))]

    return reward


class Spy:
    """Records every batch before/after ``decide_round`` and every batch that reaches the loss."""

    def __init__(self, tr):
        self.before, self.after, self.loss_inputs = [], [], []
        self.tr = tr
        compute_loss = tr.compute_loss

        def spy_loss(model, inputs, *a, **k):
            self.loss_inputs.append(
                {k2: v.detach().clone() for k2, v in inputs.items() if torch.is_tensor(v)}
            )
            return compute_loss(model, inputs, *a, **k)

        tr.compute_loss = spy_loss

    def decide_round(self, trainer, out, rewards, state):
        self.before.append({k: v.clone() for k, v in out.items() if torch.is_tensor(v)})
        decision = decide_round(trainer, out, rewards, state)
        self.after.append(decision.batch)
        return decision


def make(tiny_dir, tmp_path, monkeypatch, reward, **overrides):
    kwargs = tiny_run_kwargs(
        tmp_path / "out",
        num_prompts=3,
        num_generations=G,
        per_device_train_batch_size=2,
        max_steps=3,
        learning_rate=1e-2,
        mi_reasoning="turn",
    )
    kwargs.update(overrides)
    tr = make_tiny_trainer(tiny_dir, kwargs, reward_funcs=[reward])
    spy = Spy(tr)
    monkeypatch.setattr(grpo_module, "decide_round", spy.decide_round)
    return tr, spy


def rows(batch):
    """Each row as a hashable (prompt, completion) token tuple, padding included."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    return [tuple(r) for r in ids.tolist()]


def weights(tr):
    return [p.detach().clone() for p in tr.model.parameters()]


def test_dropped_groups_never_reach_the_loss_and_mi_follows_its_cadence(tiny_dir, tmp_path, monkeypatch):
    # 3 groups, only group 1 has reward variance; 6 rows per round split into 3 micro-batches
    tr, spy = make(
        tiny_dir,
        tmp_path,
        monkeypatch,
        rewards_with_variance_in({1}),
        max_steps=9,
        mi_every=2,
        mi_num_samples=4,
    )
    w0 = weights(tr)
    tr.train()
    assert len(spy.before) == 3  # 3 generation rounds of 3 optimizer steps
    for r, (before, after) in enumerate(zip(spy.before, spy.after)):
        all_rows = rows(before)
        kept_rows = all_rows[2:4]  # group 1
        assert after["completion_ids"].shape[0] == 3  # 2 kept rows + 1 masked padding row (3 micro-batches)
        losses = spy.loss_inputs[3 * r : 3 * r + 3]
        assert all(b["completion_ids"].shape[0] == 1 for b in losses)  # dropped rows cost no forward/backward
        trained = [row for b in losses for row, m in zip(rows(b), b["tool_mask"].sum(1).tolist()) if m > 0]
        width = len(trained[0])  # trailing all-padding completion columns may have been trimmed
        assert width <= len(kept_rows[0])
        assert sorted(trained) == sorted(r[:width] for r in kept_rows)
        padded = [b for b in losses if b["tool_mask"].sum() == 0]
        assert len(padded) == 1 and padded[0]["advantages"].abs().sum() == 0
        mask = after["completion_mask"] * after["tool_mask"]
        assert int(after["num_items_in_batch"]) == int(mask.sum())
    assert any(not torch.equal(a, b) for a, b in zip(w0, weights(tr)))  # the kept group trains

    logs = {h["step"]: h for h in tr.state.log_history if "loss" in h}
    assert logs[1]["snr/kept_groups"] == 1 and logs[1]["snr/num_groups"] == 3
    assert logs[1]["snr/padding_rows"] == 1 and logs[1]["snr/skipped"] == 0
    assert logs[1]["frac_reward_zero_std"] == pytest.approx(2 / 3)
    # Std(RV) and Std(RV)/Mean(RV) (RAGEN-2 Table 8's predictor) on every round: variances 0, 0.5, 0 -> 0.236, 1.41
    rounds = {s: h for s, h in logs.items() if "snr/num_groups" in h}
    assert sorted(rounds) == [1, 4, 7]
    for h in rounds.values():
        assert h["snr/group_var_std"] == pytest.approx(np.std([0, 0.5, 0]))
        assert h["snr/group_var_cv"] == pytest.approx(np.sqrt(2))
    mi_steps = sorted(s for s, h in logs.items() if "mi/first_turn/mi_est" in h)
    assert mi_steps == [1, 7]  # rounds 0 and 2 of mi_every=2; round 1 (step 4) has none
    assert "mi/trajectory/mi_zscore_ema" in logs[1] and "mi/first_turn/retrieval_chance" in logs[1]

    # the KV-cached scorer and TRL's full-sequence scorer agree on the last round's batch
    results = {}
    for scorer in ("cached", "trl"):
        tr.args.mi_scorer = scorer
        state = SignalState(rng=np.random.default_rng(0))
        metrics = mi_metrics(tr, dict(spy.before[-1]), state)
        results[scorer] = {k: v for k, v in metrics.items() if not k.endswith("seconds")}
    assert results["cached"].keys() == results["trl"].keys() and "mi/trajectory/mi_est" in results["trl"]
    for key, value in results["trl"].items():
        assert results["cached"][key] == pytest.approx(value, abs=1e-3), key

    report = os.path.join(tr.args.output_dir, "collapse.jsonl")
    lines = [json.loads(line) for line in open(report)]
    assert [line["step"] for line in lines if "snr/kept_frac" in line] == [1, 4, 7]
    assert [line["step"] for line in lines if "mi/trajectory/mi_est" in line] == [1, 7]


def test_skipped_step_leaves_weights_bitwise_equal_and_stops_training(
    tiny_dir, tmp_path, monkeypatch, capsys
):
    # no group has reward variance; one round per optimizer step
    tr, spy = make(
        tiny_dir,
        tmp_path,
        monkeypatch,
        rewards_with_variance_in(set()),
        per_device_train_batch_size=6,
        max_steps=5,
        filter_empty_stop_steps=2,
    )
    w0 = weights(tr)
    tr.train()
    assert tr.state.global_step == 2  # stopped after 2 consecutive empty rounds, not max_steps=5
    assert all(torch.equal(a, b) for a, b in zip(w0, weights(tr)))
    assert tr.skipped_steps == 2
    for b in spy.loss_inputs:  # only one masked dummy row per micro-batch reaches the loss
        assert b["completion_ids"].shape[0] == 1 and b["tool_mask"].sum() == 0
    logs = [h for h in tr.state.log_history if "loss" in h]
    assert [h["snr/skipped"] for h in logs] == [1, 1]
    assert [h["snr/consecutive_empty"] for h in logs] == [1, 2]
    assert all(h.get("entropy") is None for h in logs)  # dummy-row loss metrics are dropped, not logged as 0
    assert "consecutive rounds had no group" in capsys.readouterr().out


def test_a_group_of_equal_rewards_gets_exactly_zero_advantage(tiny_dir, tmp_path, monkeypatch):
    # 8 equal rewards of -0.1: TRL's float32 group mean misses them by an ulp, and dividing by std + 1e-4 made
    # advantages of ~7e-5 that AdamW followed at full step size (a measured collapse towards invalid answers)
    def reward(prompts, completions, **_):
        return [-0.1 if i < 8 else float(i % 2) for i in range(len(prompts))]

    tr, spy = make(
        tiny_dir,
        tmp_path,
        monkeypatch,
        reward,
        num_prompts=2,
        num_generations=8,
        per_device_train_batch_size=8,
        max_steps=1,
        filter_strategy="off",
    )
    tr.train()
    adv = spy.before[0]["advantages"]
    assert adv.shape == (16,)
    assert torch.equal(adv[:8], torch.zeros(8))
    assert adv[8:].abs().min() > 0.5


def test_constant_group_rows():
    from llm_gym.trainer.batch import constant_group_rows

    nan = float("nan")
    rewards = torch.tensor([-0.1] * 4 + [0, 1, 0, 1] + [nan] * 4 + [nan, 0.5, 0.5, nan] + [nan, 0, 1, nan])
    got = constant_group_rows(rewards, 4).view(-1, 4)[:, 0].tolist()
    assert got == [True, False, True, True, False]
    assert constant_group_rows(rewards, 4).shape == (20,)


def test_evaluation_plays_episodes_without_a_loss_pass(tiny_dir, tmp_path, monkeypatch):
    """evaluate() rolls out and logs the env metrics, but computes no policy loss (it has no meaning for a
    sampled evaluation batch and would cost a forward pass per trajectory): no loss call, no eval_loss."""
    tr, spy = make(
        tiny_dir, tmp_path, monkeypatch, rewards_with_variance_in({0}), num_eval_seeds=4,
        per_device_eval_batch_size=2,
    )  # fmt: skip
    metrics = tr.evaluate()
    assert spy.loss_inputs == []
    assert "eval_loss" not in metrics
    assert 0.0 <= metrics["eval_env/success"] <= 1.0 and "eval_env/valid_action_rate" in metrics


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_masking_equals_removal_under_token_count_normalisation(tiny_dir, tmp_path, monkeypatch, loss_type):
    """The upstream PRs mask filtered groups' loss and leave them out of the token count; we can also remove them
    from the batch. With TRL's token-mean (``dapo``: token sum / tokens of the update batch) and one optimizer step
    per round, the two give the same update. With a per-sequence mean (``grpo``) a masked row still counts in its
    micro-batch's row mean, so masking halves this update (2 rows per micro-batch, one of them masked)."""
    deltas = {}
    for drop in ("remove", "mask"):
        tr, spy = make(
            tiny_dir,
            tmp_path / drop,
            monkeypatch,
            rewards_with_variance_in({1}),
            max_steps=1,
            gradient_accumulation_steps=3,  # 6 rows = 3 micro-batches of 2 = one optimizer step
            filter_strategy="upstream_top_p",
            filter_drop=drop,
            loss_type=loss_type,
            optim="sgd",  # the update is -lr * gradient, so its scale shows (AdamW's first step would hide it)
            learning_rate=1.0,
            max_grad_norm=0.0,
        )
        w0 = weights(tr)
        tr.train()
        (after,) = spy.after
        kept = after["completion_ids"].shape[0]
        assert kept == (3 if drop == "remove" else 6)  # 2 kept rows (+1 padding row) vs every row
        assert int(after["num_items_in_batch"]) == int(loss_mask(after).sum())  # filtered tokens not counted
        deltas[drop] = torch.cat([(w1 - w).flatten() for w, w1 in zip(w0, weights(tr))])
    assert deltas["remove"].abs().max() > 0
    expected = deltas["remove"] if loss_type == "dapo" else 0.5 * deltas["remove"]
    torch.testing.assert_close(deltas["mask"], expected, rtol=1e-4, atol=1e-7)


# NeMo-RL #4158: a per-rollout mask on the rewards [0] + [0.95] * 7 dropped the lone loser and left seven equal
# winners with zero advantage. A group is kept or dropped whole.
LONE_LOSER = [0.0] + [0.95] * 7
WHOLE_GROUPS = (LONE_LOSER, [0.0, 1.0] * 4, [0.5] * 8)  # variances 0.113, 0.286, 0 (ddof 1)


def _whole_group_reward(prompts, completions, **_):
    return [WHOLE_GROUPS[(i // 8) % 3][i % 8] for i in range(len(prompts))]


@pytest.mark.parametrize(
    "strategy, value, extra, kept",
    [
        ("top_p", 0.9, {}, {0, 1}),
        ("top_p", 0.9, {"filter_update_steps": "proportional"}, {0, 1}),
        ("top_k", 0.34, {}, {1}),
        ("min_p", 0.5, {}, {1}),
        ("softmax_top_p", 0.9, {"filter_metric": "std"}, {0, 1}),
        ("upstream_top_p", 0.9, {}, {0, 1}),
        ("upstream_top_p", 0.9, {"filter_drop": "mask"}, {0, 1}),
        ("off", 0.9, {}, {0, 1, 2}),
    ],
    ids=[
        "top_p",
        "top_p-proportional",
        "top_k",
        "min_p",
        "softmax_top_p",
        "upstream",
        "upstream-mask",
        "off",
    ],
)
def test_every_filter_rule_keeps_or_drops_a_group_whole_in_the_rows_the_loss_sees(
    tiny_dir, tmp_path, monkeypatch, strategy, value, extra, kept
):
    from llm_gym.trainer import snr_filter as snr

    tr, spy = make(
        tiny_dir,
        tmp_path,
        monkeypatch,
        _whole_group_reward,
        env="Bandit",
        max_turns=1,
        num_generations=8,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=3,  # 3 groups of 8 = one optimizer step of 3 micro-batches
        max_steps=1,
        filter_strategy=strategy,
        filter_value=value,
        **extra,
    )
    decide = spy.decide_round

    def tag_rows(trainer, out, rewards, state):  # each row carries its index through the filter to the loss
        out["row_id"] = torch.arange(out["completion_ids"].shape[0])
        return decide(trainer, out, rewards, state)

    monkeypatch.setattr(grpo_module, "decide_round", tag_rows)
    tr.train()
    (before,) = spy.before
    assert bool((loss_mask(before).sum(1) > 0).all())  # every rollout has tokens the loss would train
    rewards = np.array([r for g in WHOLE_GROUPS for r in g])
    decision = snr.decide(rewards, 8, strategy, value, metric=extra.get("filter_metric", "variance"))
    assert set(np.flatnonzero(decision.keep_groups)) == kept  # the pure rule's choice, by hand above
    trained: dict[int, list[int]] = {}
    advantage: dict[int, float] = {}
    for b in spy.loss_inputs:
        for row, tokens, adv in zip(
            b["row_id"].tolist(), loss_mask(b).sum(1).tolist(), b["advantages"].tolist()
        ):
            if tokens > 0:
                trained.setdefault(row // 8, []).append(row)
                advantage[row] = adv
    assert set(trained) == kept
    for group, rows in trained.items():  # all eight rollouts of a kept group, each once (copies may add more)
        assert set(rows) == set(range(8 * group, 8 * group + 8)), group
        if extra.get("filter_update_steps") != "proportional":
            assert len(rows) == 8
    if 0 in kept:  # the lone loser trains beside its winners, and the winners keep a non-zero advantage
        assert advantage[0] < 0 and all(advantage[r] > 0 for r in range(1, 8))
    (log,) = [h for h in tr.state.log_history if "loss" in h]
    assert log["snr/kept_groups"] == len(kept)
    std, cv = snr.variance_spread(decision.variances)
    assert log["snr/group_var_std"] == pytest.approx(std) and log["snr/group_var_cv"] == pytest.approx(cv)
