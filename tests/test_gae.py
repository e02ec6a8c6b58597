"""GAE, reward placement, whitening and the clipped value loss (pure functions, no model)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_gym.trainer.gae import (
    clipped_value_loss,
    gae,
    last_token_rewards,
    masked_whiten,
    moments_mean_std,
    ppo_targets,
    whiten_moments,
)

# Row layout: model, model, env, env, model, pad.  The 9.0 values sit on non-model tokens and must be ignored.
MASK = torch.tensor([[1, 1, 0, 0, 1, 0]])
VALUES = torch.tensor([[0.5, 0.2, 9.0, 9.0, 0.4, 9.0]])


def test_last_token_rewards_places_score_on_last_model_token():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    r = last_token_rewards(torch.tensor([1.0, -2.0, 5.0]), mask)
    expected = torch.zeros(3, 6)
    expected[0, 4] = 1.0
    expected[1, 2] = -2.0  # row 2 has no model token: its score has nowhere to go
    assert torch.equal(r, expected)


def test_gamma_lambda_one_gives_returns_minus_values():
    rewards = last_token_rewards(torch.tensor([1.0]), MASK)
    adv, ret = gae(rewards, VALUES, MASK, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.8, 0.0, 0.0, 0.6, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]]))
    m = MASK.bool()
    assert torch.allclose(adv[m], ret[m] - VALUES[m])


def test_hand_worked_discounted_gae_skips_env_tokens():
    # Model tokens (values 0.5, 0.2, 0.4), reward 1 on the last; gamma 0.9, lambda 0.5:
    # d3 = 1 - 0.4 = 0.6 -> A3 = 0.6
    # d2 = 0.9*0.4 - 0.2 = 0.16 -> A2 = 0.16 + 0.45*0.6 = 0.43
    # d1 = 0.9*0.2 - 0.5 = -0.32 -> A1 = -0.32 + 0.45*0.43 = -0.1265
    rewards = last_token_rewards(torch.tensor([1.0]), MASK)
    adv, ret = gae(rewards, VALUES, MASK, gamma=0.9, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[-0.1265, 0.43, 0.0, 0.0, 0.6, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.3735, 0.63, 0.0, 0.0, 1.0, 0.0]]), atol=1e-6)


def test_env_tokens_are_transparent():
    """Inserting environment tokens between model tokens changes nothing on the model tokens."""
    compact_mask = torch.tensor([[1, 1, 1]])
    compact_values = torch.tensor([[0.5, 0.2, 0.4]])
    r = last_token_rewards(torch.tensor([1.0]), compact_mask)
    a_compact, _ = gae(r, compact_values, compact_mask, gamma=0.9, lam=0.7)
    a_spread, _ = gae(last_token_rewards(torch.tensor([1.0]), MASK), VALUES, MASK, gamma=0.9, lam=0.7)
    assert torch.allclose(a_spread[MASK.bool()], a_compact[0])
    assert torch.all(a_spread[~MASK.bool()] == 0)


def _reference_gae(rewards, values, mask, gamma, lam):
    """Row by row over the compressed list of model tokens (the textbook recursion)."""
    adv = torch.zeros_like(values)
    for b in range(mask.size(0)):
        idx = mask[b].nonzero(as_tuple=True)[0].tolist()
        running, next_v = 0.0, 0.0
        for t in reversed(idx):
            delta = float(rewards[b, t]) + gamma * next_v - float(values[b, t])
            running = delta + gamma * lam * running
            adv[b, t] = running
            next_v = float(values[b, t])
    return adv


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    rows=st.integers(1, 4),
    cols=st.integers(1, 12),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_gae_matches_reference(data, rows, cols, gamma, lam):
    mask = torch.tensor(
        data.draw(
            st.lists(st.lists(st.integers(0, 1), min_size=cols, max_size=cols), min_size=rows, max_size=rows)
        )
    )
    values = torch.tensor(
        data.draw(
            st.lists(st.lists(st.floats(-5, 5), min_size=cols, max_size=cols), min_size=rows, max_size=rows)
        )
    )
    raw = torch.tensor(
        data.draw(
            st.lists(st.lists(st.floats(-2, 2), min_size=cols, max_size=cols), min_size=rows, max_size=rows)
        )
    )
    rewards = raw * mask  # token-level rewards on model tokens only
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    assert torch.allclose(adv, _reference_gae(rewards, values, mask, gamma, lam), atol=1e-4)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)
    assert torch.allclose(ret[mask == 1], adv[mask == 1] + values[mask == 1], atol=1e-5)


def test_gae_rejects_bad_input():
    with pytest.raises(ValueError, match="non-model"):
        gae(torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2), torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match="shape"):
        gae(torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1, 2))
    with pytest.raises(ValueError, match="gamma"):
        gae(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), gamma=1.5)
    with pytest.raises(ValueError, match="finite"):
        gae(torch.tensor([[float("nan")]]), torch.zeros(1, 1), torch.ones(1, 1))
    with pytest.raises(ValueError, match="scores"):
        last_token_rewards(torch.tensor([1.0, 2.0]), torch.ones(1, 3))


def test_masked_whiten():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    w = masked_whiten(x, mask)
    vals = w[mask.bool()]
    assert torch.all(w[~mask.bool()] == 0)
    assert abs(vals.mean().item()) < 1e-6
    assert abs(vals.std().item() - 1.0) < 1e-5
    single = masked_whiten(torch.tensor([[5.0, 1.0]]), torch.tensor([[1, 0]]))
    assert torch.equal(single, torch.zeros(1, 2))
    assert torch.equal(masked_whiten(x, torch.zeros_like(mask)), torch.zeros_like(x))


def _two_rank_split(x, mask, rows0):
    """Whiten ``x`` as two processes would: each holds some rows, the moments are summed (an all-reduce)."""
    parts = [(x[:rows0], mask[:rows0]), (x[rows0:], mask[rows0:])]
    total = sum(whiten_moments(xi, mi) for xi, mi in parts)
    return torch.cat([masked_whiten(xi, mi, moments=total) for xi, mi in parts])


def test_whitening_with_summed_moments_equals_one_process_whitening():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 6, generator=g) * 3 + 1
    mask = (torch.rand(8, 6, generator=g) > 0.3).long()
    mask[5] = 0  # a padding row (multi-process equal-row padding): out of the statistics
    x[5] = 1e4  # its values must not leak into the mean or the std
    one = masked_whiten(x, mask)
    for rows0 in (1, 4, 6):
        torch.testing.assert_close(_two_rank_split(x, mask, rows0), one, atol=1e-6, rtol=0)
    # the reviewer's case: rank 0's episodes succeed, rank 1's fail; per-process whitening erases the signal
    adv = torch.cat([torch.ones(4, 3), -torch.ones(4, 3)])
    full = torch.ones(8, 3, dtype=torch.long)
    split = _two_rank_split(adv, full, 4)
    torch.testing.assert_close(split, masked_whiten(adv, full), atol=1e-6, rtol=0)
    assert split[:4].mean() > 0.9 and split[4:].mean() < -0.9
    local = torch.cat([masked_whiten(adv[:4], full[:4]), masked_whiten(adv[4:], full[4:])])
    assert local.abs().max() == 0  # the per-process bug: every advantage 0


def test_whiten_moments_and_their_combination():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    m = whiten_moments(x, mask)
    assert m.dtype == torch.float64 and m.tolist() == [4.0, 10.0, 30.0]
    mean, std = moments_mean_std(m)
    assert mean == pytest.approx(2.5) and std == pytest.approx(torch.tensor([1.0, 2, 3, 4]).std().item())
    assert moments_mean_std(torch.tensor([1.0, 5.0, 25.0])) == (5.0, None)  # one entry: no spread
    assert moments_mean_std(torch.zeros(3)) == (0.0, None)
    # a shard with no masked entry while others have some: nothing local to whiten
    assert torch.equal(masked_whiten(x, torch.zeros_like(mask), moments=m), torch.zeros_like(x))
    for bad in ([-1.0, 0.0, 0.0], [2.0, float("nan"), 1.0], [1.0, 2.0]):
        with pytest.raises(ValueError, match="moments"):
            moments_mean_std(torch.tensor(bad))


def test_ppo_targets_whiten_over_all_processes_rows():
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(8, 5, dtype=torch.long)
    mask[:, 2] = 0  # an environment token
    mask[7] = 0  # a padding row
    values = torch.rand(8, 5, generator=g) * 0.1
    scores = torch.tensor([1.0, 1.0, 1.0, 0.5, 0.0, float("nan"), 0.0, 0.0])
    one = ppo_targets(scores, values, mask, gamma=0.9, lam=0.95).advantages
    halves = [slice(0, 4), slice(4, 8)]
    # what each process sends into the all-reduce, then the all-reduce itself
    raw = [ppo_targets(scores[h], values[h], mask[h], whiten=False, gamma=0.9, lam=0.95) for h in halves]
    sent = [whiten_moments(t.advantages, t.mask) for t in raw]
    calls = []

    def all_reduce(t):
        calls.append(t)
        return sent[0] + sent[1]

    split = torch.cat(
        [
            ppo_targets(scores[h], values[h], mask[h], gamma=0.9, lam=0.95, reduce=all_reduce).advantages
            for h in halves
        ]
    )
    torch.testing.assert_close(split, one, atol=1e-6, rtol=0)
    assert len(calls) == 2 and all(torch.equal(c, s) for c, s in zip(calls, sent))  # local moments go in
    assert not torch.allclose(
        torch.cat(
            [ppo_targets(scores[h], values[h], mask[h], gamma=0.9, lam=0.95).advantages for h in halves]
        ),
        one,
        atol=1e-3,
    )


def test_clipped_value_loss():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    ret = torch.tensor([[1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0]])
    v = torch.tensor([[0.5, 1.0, 7.0]])
    plain = clipped_value_loss(v, old, ret, mask, clip=None)
    assert torch.isclose(plain, torch.tensor(0.5 * (0.25 + 0.0) / 2))
    # clip 0.2: V_clip = (0.2, 0.2) -> squared errors 0.64 each; the max picks them.
    clipped = clipped_value_loss(v, old, ret, mask, clip=0.2)
    assert torch.isclose(clipped, torch.tensor(0.5 * (0.64 + 0.64) / 2))
    assert clipped_value_loss(v, old, ret, torch.zeros_like(mask)).item() == 0.0
    with pytest.raises(ValueError, match="clip"):
        clipped_value_loss(v, old, ret, mask, clip=0.0)


def test_ppo_targets_compose_placement_gae_and_whitening():
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 1, 1, 1]])
    values = torch.tensor([[0.1, 0.2, 9.0, 0.3, 9.0], [0.5, 9.0, 0.4, 0.3, 0.2]])
    scores = torch.tensor([1.0, -0.5])
    t = ppo_targets(scores, values, mask, gamma=0.9, lam=0.8, whiten=False)
    rewards = last_token_rewards(scores, mask)
    adv, ret = gae(rewards, values * mask, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(t.advantages, adv)
    torch.testing.assert_close(t.returns, ret)
    assert torch.all(t.values[mask == 0] == 0)  # environment-token values never leak into the targets
    whitened = ppo_targets(scores, values, mask, gamma=0.9, lam=0.8, whiten=True).advantages
    torch.testing.assert_close(whitened, masked_whiten(adv, mask))
    assert set(t.metrics()) == {"value_mean", "return_mean", "explained_variance"}


def test_ppo_targets_drop_unscorable_rows():
    mask = torch.ones(3, 4, dtype=torch.long)
    values = torch.full((3, 4), 0.25)
    t = ppo_targets(torch.tensor([1.0, float("nan"), 0.0]), values, mask)
    assert t.mask[1].sum() == 0 and t.advantages[1].abs().sum() == 0 and t.returns[1].abs().sum() == 0
    assert t.mask[[0, 2]].sum() == 8 and torch.isfinite(t.advantages).all()
    # without the NaN row the other rows' targets are the same as with it
    alone = ppo_targets(torch.tensor([1.0, 0.0]), values[[0, 2]], mask[[0, 2]])
    torch.testing.assert_close(alone.advantages, t.advantages[[0, 2]])
    assert ppo_targets(torch.tensor([float("nan")]), values[:1], mask[:1]).metrics() == {}
    with pytest.raises(ValueError, match="scores for"):
        ppo_targets(torch.tensor([1.0]), values, mask)
