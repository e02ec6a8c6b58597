"""SNR top-p filtering: pure functions on hand-made reward tables."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_gym.trainer.batch import episode_rewards, loss_mask, mask_rows, select_rows, trim_completion_columns
from llm_gym.trainer.snr_filter import (
    decide,
    group_scores,
    loss_scale,
    select_groups,
    upstream_top_p,
)


def kept(scores, **kw):
    return np.flatnonzero(select_groups(np.array(scores, dtype=float), **kw)).tolist()


def test_paper_worked_example_keeps_a_and_c():
    # RAGEN-2 Fig. 4: RV = 9, 1, 5; 0.9 * 15 = 13.5 -> keep A (9) and C (5), drop B (1)
    assert kept([9, 1, 5], strategy="top_p", value=0.9) == [0, 2]


def test_group_variance_is_unbiased_and_std_is_its_root():
    r = np.array([0.0, 1.0, 0.0, 0.0, 2.0, 1.0])  # groups of G=3
    np.testing.assert_allclose(group_scores(r, 3), [1 / 3, 1.0])
    np.testing.assert_allclose(group_scores(r, 3, "std"), [math.sqrt(1 / 3), 1.0])
    np.testing.assert_allclose(group_scores(np.array([0.0, 1.0]), 2), [0.5])


def test_variance_and_std_mass_can_keep_different_groups():
    # variances 9, 1, 1, 1: 9+1+1 = 11 >= 0.9*12 - 0.01 keeps three groups;
    # stds 3, 1, 1, 1: 3+1+1 = 5 < 0.9*6 - 0.01, so std mass needs all four
    rewards = np.array([0.0, math.sqrt(18)] + [0.0, math.sqrt(2)] * 3)
    np.testing.assert_allclose(group_scores(rewards, 2), [9.0, 1.0, 1.0, 1.0])
    assert decide(rewards, 2, metric="variance").keep_groups.tolist() == [True, True, True, False]
    assert decide(rewards, 2, metric="std").keep_groups.tolist() == [True, True, True, True]


def test_all_zero_batch_is_skipped_by_every_strategy_but_off():
    zeros = np.zeros(8)
    for strategy in ("top_p", "top_k", "min_p", "softmax_top_p"):
        d = decide(zeros, 2, strategy=strategy, value=0.5)
        assert d.skip, strategy
    assert not decide(zeros, 2, strategy="off").skip
    # include_zero cannot rescue top_p: 0.9 * 0 <= eps rejects the batch
    assert decide(zeros, 2, strategy="top_p", include_zero=True).skip
    assert decide(zeros, 2, strategy="top_k", value=0.5, include_zero=True).keep_groups.sum() == 2


def test_single_group():
    assert decide(np.array([0.0, 1.0]), 2).keep_groups.tolist() == [True]
    assert decide(np.array([1.0, 1.0]), 2).skip


def test_tiny_total_variance_is_rejected_by_eps():
    assert kept([0.005, 0.004], strategy="top_p", value=0.9) == []
    assert kept([0.005, 0.004], strategy="top_p", value=0.9, eps=0.0) == [0, 1]


def test_ties_break_by_group_index():
    assert kept([1, 1, 1, 1], strategy="top_p", value=0.5) == [0, 1]
    assert kept([0, 2, 2, 1], strategy="top_k", value=0.25) == [1]


def test_zero_groups_excluded_unless_included():
    assert kept([4, 0, 4, 0], strategy="top_p", value=1.0) == [0, 2]
    assert kept([4, 0, 4, 0], strategy="top_p", value=1.0, include_zero=True, eps=0.0) == [0, 1, 2, 3]
    assert kept([4, 0, 4, 0], strategy="top_p", value=0.9, include_zero=True, eps=0.0) == [0, 2]
    assert kept([4, 0, 4, 0], strategy="min_p", value=0.0, include_zero=True) == [0, 1, 2, 3]


def test_top_k_min_p_softmax_off():
    assert kept([3, 1, 2, 0], strategy="top_k", value=0.5) == [0, 2]
    assert kept([3, 1, 2, 0], strategy="top_k", value=0.01) == [0]  # at least one
    assert kept([4, 2, 1, 0], strategy="min_p", value=0.5) == [0, 1]
    assert kept([10, 0.1, 0.1], strategy="softmax_top_p", value=0.9) == [0]
    assert kept([1, 1, 1], strategy="softmax_top_p", value=0.9) == [0, 1, 2]
    assert kept([0, 0, 5], strategy="off") == [0, 1, 2]


def test_nan_rewards_are_left_out_of_their_group():
    r = np.array([0.0, 1.0, np.nan, np.nan, np.nan, 1.0, 2.0, np.nan, 0.0])  # G = 3
    np.testing.assert_allclose(group_scores(r, 3), [0.5, 0.0, 2.0])
    assert decide(r, 3).keep_groups.tolist() == [True, False, True]
    assert decide(np.full(4, np.nan), 2).skip


def test_episode_rewards_weights_and_unscorable_rows():
    rpf = torch.tensor([[1.0, 2.0], [np.nan, 1.0], [np.nan, np.nan]])
    out = episode_rewards(rpf, torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(out[:2], torch.tensor([2.0, 0.5]))
    assert torch.isnan(out[2])  # every function returned None: unscorable, as TRL treats it
    torch.testing.assert_close(episode_rewards(torch.tensor([0.5, 1.0])), torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError):
        episode_rewards(rpf, torch.tensor([1.0]))


def test_loss_mask_treats_a_missing_tool_mask_as_ones():
    cm = torch.tensor([[1, 1, 0], [1, 0, 0]])
    tm = torch.tensor([[1, 0, 1], [1, 1, 1]])
    assert loss_mask({"completion_mask": cm}).tolist() == cm.tolist()
    assert loss_mask({"completion_mask": cm, "tool_mask": None}).tolist() == cm.tolist()
    assert loss_mask({"completion_mask": cm, "tool_mask": tm}).tolist() == [[1, 0, 0], [1, 0, 0]]


@pytest.mark.parametrize(
    "call",
    [
        lambda: group_scores(np.array([0.0, np.inf]), 2),
        lambda: group_scores(np.zeros(5), 2),
        lambda: group_scores(np.zeros(4), 1),
        lambda: group_scores(np.zeros(4), 2, metric="range"),
        lambda: select_groups(np.array([1.0]), strategy="top_q"),
        lambda: select_groups(np.array([1.0]), strategy="top_p", value=0.0),
        lambda: select_groups(np.array([1.0]), strategy="top_p", value=1.5),
        lambda: select_groups(np.array([1.0]), strategy="min_p", value=-0.1),
        lambda: select_groups(np.array([1.0]), eps=-1.0),
        lambda: select_groups(np.array([-1.0])),
        lambda: select_groups(np.array([np.nan])),
        lambda: loss_scale(0.5, "cubic"),
    ],
)
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_loss_scale():
    assert loss_scale(0.25, "none") == 1.0
    assert loss_scale(0.25, "linear") == 0.25
    assert loss_scale(0.25, "sqrt") == 0.5


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=12),
    st.floats(0.05, 0.999),
    st.booleans(),
)
def test_top_p_keeps_the_smallest_top_set_reaching_rho(scores, rho, include_zero):
    s = np.array(scores)
    keep = select_groups(s, "top_p", rho, include_zero=include_zero)
    cand = s > 1e-10 if not include_zero else np.ones_like(s, dtype=bool)
    total = s[cand].sum()
    if rho * total <= 0.01:
        assert not keep.any()
        return
    assert keep.any()
    assert (keep <= cand).all()
    # top set: every kept score >= every dropped candidate score
    if (cand & ~keep).any():
        assert s[keep].min() >= s[cand & ~keep].max()
    # reaches the threshold, and is minimal
    assert s[keep].sum() >= rho * total - 0.01 - 1e-9
    assert s[keep].sum() - s[keep].min() < rho * total - 0.01 + 1e-9


def test_top_p_value_one_keeps_every_candidate_group():
    # RAGEN `ragen/trainer/rollout_filter.py`: value >= 1.0 keeps all (non-zero, if excluded) groups,
    # even ones below the eps slack.
    s = np.array([1.0, 0.5, 0.005, 0.0, 0.002])
    assert select_groups(s, "top_p", 1.0).tolist() == [True, True, True, False, True]
    assert select_groups(s, "top_p", 1.0, include_zero=True).all()
    assert select_groups(np.array([0.004, 0.003]), "top_p", 1.0).all()  # below eps, still kept


# --------------------------------------------------------------------------- the upstream rule
def upstream_reference(
    rewards: torch.Tensor,
    group_size: int,
    *,
    top_p: float,
    include_zero: bool,
    selection_eps: float,
    ddof: int,
) -> set:
    """The group selection of RAGEN's authors' reward-variance top-p PRs (huggingface/trl#7242,
    verl-project/verl#7894, NovaSky-AI/SkyRL#2217), transcribed from what the PRs publish: the descriptions (sample
    variance with a configurable ``ddof``, ``include_zero``, the smallest stable prefix of groups by variance
    reaching ``top_p`` of the variance mass, ``selection_eps``) and SkyRL's selection loop as quoted in its review
    thread (candidates ``include_zero or variance > 0``, sorted by variance descending, ``target = top_p *
    total_variance - selection_eps``, add groups while ``target > 0`` until the cumulative variance reaches it).
    The diffs themselves are not in the stored copies; NaN rewards are left out of their group's variance (our
    reading of the PRs' NaN handling)."""
    groups = rewards.double().view(-1, group_size)
    variances = []
    for row in groups:
        finite = row[~torch.isnan(row)]
        variances.append(finite.var(correction=ddof).item() if finite.numel() > max(ddof, 1) else 0.0)
    candidates = [g for g, v in enumerate(variances) if include_zero or v > 0.0]
    candidates.sort(key=lambda g: variances[g], reverse=True)  # Python's sort is stable
    target = top_p * sum(variances) - selection_eps
    selected, cumulative = set(), 0.0
    if target > 0.0:
        for g in candidates:
            selected.add(g)
            cumulative += variances[g]
            if cumulative >= target:
                break
    return selected


def upstream_rewards(rng: np.random.Generator, groups: int, size: int) -> np.ndarray:
    """0/1 and graded rewards with ties, all-equal groups and unscorable (NaN) samples."""
    kind = rng.integers(5)
    if kind == 0:  # 0/1 success, groups of every difficulty (many all-0 / all-1 groups)
        p = np.repeat(rng.choice([0.0, 0.05, 0.3, 0.5, 0.9, 1.0], groups), size)
        r = (rng.uniform(size=groups * size) < p).astype(float)
    elif kind == 1:  # Sokoban-like graded returns
        r = rng.choice([-1.0, -0.3, -0.1, 0.0, 9.3, 10.9], size=groups * size)
    elif kind == 2:  # Countdown-like: 0, format score 0.1, 1
        r = rng.choice([0.0, 0.1, 1.0], size=groups * size, p=[0.6, 0.3, 0.1])
    elif kind == 3:  # continuous, small or large scale
        r = rng.normal(0, rng.choice([0.01, 0.1, 3.0]), groups * size)
    else:  # coarse grid: many ties
        r = np.round(rng.uniform(0, 1, groups * size), 1)
    r[rng.uniform(size=r.size) < rng.choice([0.0, 0.1])] = np.nan
    return r


@pytest.mark.parametrize(
    ("include_zero", "ddof", "eps", "top_p"),
    [
        (False, 1, 0.01, 0.9),
        (True, 1, 0.01, 0.9),
        (False, 0, 0.01, 0.9),
        (False, 1, 0.0, 1.0),
        (True, 1, 0.05, 0.5),
    ],
)
def test_upstream_rule_matches_a_transcription_of_the_prs_selection(include_zero, ddof, eps, top_p):
    rng = np.random.default_rng(7)
    mismatches = 0
    for _ in range(1200):
        groups, size = int(rng.integers(1, 13)), int(rng.choice([2, 4, 8, 16]))
        r = upstream_rewards(rng, groups, size)
        ours = decide(r, size, "upstream_top_p", top_p, include_zero, eps, metric="variance", ddof=ddof)
        ref = upstream_reference(
            torch.tensor(r), size, top_p=top_p, include_zero=include_zero, selection_eps=eps, ddof=ddof
        )
        # torch's and numpy's variance may differ in the last bit, which can reorder groups whose variance is
        # equal in exact arithmetic: compare the kept variances, so such tied groups are interchangeable
        kept = np.flatnonzero(ours.keep_groups).tolist()
        v = ours.variances
        mismatches += len(kept) != len(ref) or not np.allclose(
            np.sort(v[kept]), np.sort(v[sorted(ref)]), rtol=0, atol=1e-12
        )
    assert mismatches == 0


def test_upstream_rule_differs_from_ours_where_the_prs_say_so():
    # eps in variance units, not squared: std 0.1 (variance 0.01) groups are rejected upstream, kept by top_p
    small = np.array([0.1, -0.1, 0.1, 0.1, -0.1, -0.1, -0.1, -0.1])
    assert decide(small, 4, "upstream_top_p").skip
    assert not decide(small, 4, "top_p").skip
    # no special case at top_p = 1: the slack still drops the smallest group
    assert upstream_top_p(np.array([1.0, 0.5, 0.005]), 1.0).tolist() == [True, True, False]
    assert select_groups(np.array([1.0, 0.5, 0.005]), "top_p", 1.0).all()
    # zero means exactly zero; ties keep the lower index; an all-zero batch is skipped even with include_zero
    assert upstream_top_p(np.array([1e-12, 1.0]), 0.9, selection_eps=0.0).tolist() == [False, True]
    assert upstream_top_p(np.array([1e-12, 1.0]), 1.0, selection_eps=0.0).tolist() == [True, True]
    assert upstream_top_p(np.array([2.0, 2.0, 2.0]), 0.5).tolist() == [True, True, False]
    assert not upstream_top_p(np.zeros(3), 0.9, include_zero=True).any()
    # ddof: population variance of (0, 1) is 0.25, the sample variance 0.5
    np.testing.assert_allclose(group_scores(np.array([0.0, 1.0]), 2, ddof=0), [0.25])
    np.testing.assert_allclose(decide(np.array([0.0, 1.0]), 2, "upstream_top_p", ddof=0).variances, [0.25])
    with pytest.raises(ValueError, match="variance"):
        decide(small, 4, "upstream_top_p", metric="std")
    with pytest.raises(ValueError, match="ddof"):
        group_scores(small, 4, ddof=-1)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 16), st.lists(st.integers(0, 2**16 - 1), min_size=8, max_size=8))
def test_ragens_main_table_rule_keeps_seven_or_eight_of_eight_groups_on_0_1_rewards(size, bits):
    # A group std on 0/1 rewards is at most sqrt(G / (4 (G - 1))) <= 0.71, so the softmax probabilities of 8
    # groups differ by at most e^0.71 ~ 2.03x: six groups hold at most 12.2 / 14.2 = 0.86 < 0.9 of the mass.
    rewards = np.array([[(b >> i) & 1 for i in range(size)] for b in bits], dtype=float).reshape(-1)
    d = decide(rewards, size, "softmax_top_p", 0.9, include_zero=True, metric="std")
    assert d.keep_groups.sum() >= 7


def test_filter_rules_benchmark_quick_run():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run(
        [sys.executable, os.path.join(root, "benchmarks", "filter_rules.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith("| ") and "/" in line]
    assert len(rows) == 8 and all(line.count("%") == 6 for line in rows)
    zero_one = [float(line.split("|")[2].split()[0]) for line in rows[:3]]
    assert all(7.0 <= k <= 8.0 for k in zero_one)  # the main-table rule on 0/1 rewards


# --------------------------------------------------------------------------- row removal


def _batch(n=6, t=4):
    return {
        "prompt_ids": torch.arange(n).unsqueeze(1).repeat(1, 3),
        "prompt_mask": torch.ones(n, 3, dtype=torch.long),
        "completion_ids": torch.arange(n * t).view(n, t),
        "completion_mask": torch.ones(n, t, dtype=torch.long),
        "advantages": torch.linspace(-1, 1, n),
        "old_per_token_logps": torch.randn(n, t),
        "num_items_in_batch": torch.tensor(n * t),
        "rows_as_list": list(range(n)),
    }


def test_select_rows_keeps_rows_in_order_and_pads_to_the_split_multiple():
    b = _batch()
    keep = torch.tensor([True, False, False, True, True, False])
    out, n_pad = select_rows(b, keep, multiple=2)
    assert n_pad == 1
    assert out["prompt_ids"][:, 0].tolist() == [0, 3, 4, 0]
    assert out["rows_as_list"] == [0, 3, 4, 0]
    assert out["old_per_token_logps"].shape == (4, 4)
    assert torch.equal(out["old_per_token_logps"][:3], b["old_per_token_logps"][[0, 3, 4]])
    assert out["tool_mask"][:3].eq(1).all() and out["tool_mask"][3].eq(0).all()
    assert out["advantages"][3] == 0 and out["advantages"][0] == b["advantages"][0]
    assert out["num_items_in_batch"] is b["num_items_in_batch"]


def test_select_rows_without_padding_and_with_nothing_kept():
    b = _batch()
    out, n_pad = select_rows(b, torch.tensor([True, True, False, False, False, False]), multiple=2)
    assert n_pad == 0 and "tool_mask" not in out and out["prompt_ids"].shape[0] == 2
    out, n_pad = select_rows(b, torch.zeros(6, dtype=torch.bool), multiple=3)
    assert n_pad == 3 and out["prompt_ids"].shape[0] == 3
    assert out["tool_mask"].sum() == 0 and out["advantages"].abs().sum() == 0


def test_select_rows_rejects_multimodal_and_bad_masks():
    b = _batch()
    with pytest.raises(ValueError):
        select_rows(b, torch.ones(5, dtype=torch.bool))
    with pytest.raises(ValueError):
        select_rows({**b, "pixel_values": torch.zeros(10, 3)}, torch.ones(6, dtype=torch.bool))
    with pytest.raises(ValueError):
        select_rows(b, torch.ones(6, dtype=torch.bool), multiple=0)


def test_mask_rows_keeps_shapes_and_zeroes_dropped_rows():
    b = _batch()
    b["tool_mask"] = torch.ones(6, 4, dtype=torch.long)
    b["tool_mask"][0, 0] = 0
    keep = torch.tensor([True, False, True, False, True, False])
    out = mask_rows(b, keep)
    assert out["tool_mask"].shape == (6, 4)
    assert (
        out["tool_mask"][1::2].sum() == 0 and out["tool_mask"][0, 0] == 0 and out["tool_mask"][2].sum() == 4
    )
    assert out["advantages"][1::2].abs().sum() == 0
    adv2d = mask_rows({**b, "advantages": torch.ones(6, 4)}, keep)["advantages"]
    assert adv2d[1::2].sum() == 0 and adv2d[::2].sum() == 12


def test_trim_completion_columns_cuts_shared_right_padding_only():
    b = _batch(n=3, t=4)  # prompt width 3 != 4; make one prompt-shaped tensor share the width below
    b["completion_mask"] = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]])
    b["prompt_ids"] = torch.zeros(3, 4, dtype=torch.long)  # same width as completions: must stay
    b["prompt_mask"] = torch.ones(3, 4, dtype=torch.long)
    b["importance_sampling_ratio"] = torch.ones(3, 1)
    out, removed = trim_completion_columns(b)
    assert removed == 2
    assert out["completion_ids"].shape == (3, 2) and out["old_per_token_logps"].shape == (3, 2)
    assert torch.equal(out["completion_ids"], b["completion_ids"][:, :2])
    assert out["prompt_ids"].shape == (3, 4) and out["importance_sampling_ratio"].shape == (3, 1)
    same, none = trim_completion_columns(out)
    assert none == 0 and same is out
