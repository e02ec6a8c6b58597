"""MI collapse metrics: math on hand-built cross-score matrices, pair sampling, and the scorer."""

import math

import numpy as np
import pytest
import torch
from llm_gym.trainer.mutual_info import (
    EmaState,
    Episode,
    cached_forwards,
    cross_score,
    cross_score_cached,
    mi_from_scores,
    num_chunks,
    reasoning_span,
    sample_first_turn,
    sample_trajectory,
)

P = 8


def test_prompt_independent_reasoning_gives_zero_mi_and_chance_retrieval():
    # each row has its own likelihood, identical under every prompt: Z carries no information about X
    L = np.repeat(np.linspace(-30, -10, P)[:, None], P, axis=1)
    m = mi_from_scores(L, np.full(P, 10), np.arange(P))
    assert m["mi_est"] == pytest.approx(0, abs=1e-12)
    assert m["mi_seq_est"] == pytest.approx(0, abs=1e-12)
    assert m["retrieval_acc"] == pytest.approx(1 / P)
    assert m["retrieval_chance"] == pytest.approx(1 / P)
    assert m["recall@2"] == pytest.approx(2 / P) and m["recall@4"] == pytest.approx(4 / P)
    assert m["cond_entropy"] == pytest.approx(m["marginal_entropy"])


def test_prompt_specific_reasoning_gives_mi_near_log_p():
    L = np.full((P, P), -200.0)
    np.fill_diagonal(L, -5.0)
    lengths = np.full(P, 10)
    m = mi_from_scores(L, lengths, np.arange(P))
    assert m["retrieval_acc"] == 1.0 and m["recall@2"] == 1.0
    assert m["mi_seq_est"] == pytest.approx(math.log(P), abs=1e-6)
    assert m["mi_est"] == pytest.approx(math.log(P), abs=1e-3)  # RAGEN-code marginal: bounded by log P
    assert m["mi_upper_bound"] == pytest.approx(math.log(P))
    paper = mi_from_scores(L, lengths, np.arange(P), marginal="paper")
    assert paper["mi_est"] == pytest.approx(math.log(P) / 10, abs=1e-6)  # paper marginal: sequence MI / |Z|
    # the decomposition H(Z) = I + H(Z|X) holds per token
    assert m["marginal_entropy"] == pytest.approx(m["mi_est"] + m["cond_entropy"])


def test_mi_grows_with_prompt_dependence():
    values = []
    for gap in (0.0, 1.0, 3.0, 10.0):
        L = np.full((P, P), -20.0 - gap)
        np.fill_diagonal(L, -20.0)
        values.append(mi_from_scores(L, np.full(P, 5), np.arange(P))["mi_seq_est"])
    assert values == sorted(values) and values[0] == pytest.approx(0) and values[-1] < math.log(P)


def test_identical_prompts_are_equivalent_columns():
    # columns 0 and 1 are the same prompt: retrieving either is correct, chance doubles for their rows
    L = np.array(
        [
            [-1.0, -1.0, -9.0, -9.0],
            [-1.0, -1.0, -9.0, -9.0],
            [-9.0, -9.0, -1.0, -9.0],
            [-9.0, -9.0, -9.0, -1.0],
        ]
    )
    cls = np.array([0, 0, 1, 2])
    m = mi_from_scores(L, np.ones(4), np.array([0, 1, 2, 3]), cls)
    assert m["retrieval_acc"] == 1.0
    assert m["retrieval_chance"] == pytest.approx((2 / 4 + 2 / 4 + 1 / 4 + 1 / 4) / 4)
    # without the equivalence the tie between columns 0 and 1 is a coin flip for rows 0 and 1
    plain = mi_from_scores(L, np.ones(4), np.array([0, 1, 2, 3]))
    assert plain["retrieval_acc"] == pytest.approx((0.5 + 0.5 + 1 + 1) / 4)
    assert plain["recall@2"] == 1.0


def test_ema_starts_at_first_sigma_and_decays():
    ema = EmaState()
    rng = np.random.default_rng(0)
    L1, L2 = rng.normal(-20, 3, (P, P)), rng.normal(-20, 1, (P, P))
    m1 = mi_from_scores(L1, np.full(P, 4), np.arange(P), ema=ema, ema_decay=0.9)
    assert m1["marginal_std_ema"] == pytest.approx(m1["marginal_std"])
    assert m1["mi_zscore"] == pytest.approx(m1["mi_zscore_ema"])
    m2 = mi_from_scores(L2, np.full(P, 4), np.arange(P), ema=ema, ema_decay=0.9)
    expected = 0.9 * m1["marginal_std"] + 0.1 * m2["marginal_std"]
    assert m2["marginal_std_ema"] == pytest.approx(expected)
    assert m2["mi_zscore_ema"] == pytest.approx(m2["mi_est"] / (expected + 1e-3))
    assert m2["mi_zscore"] == pytest.approx(m2["mi_est"] / (m2["marginal_std"] + 1e-3))


def test_degenerate_and_bad_input():
    assert mi_from_scores(np.zeros((3, 1)), np.ones(3), np.zeros(3, dtype=int)) == {}
    with pytest.raises(ValueError):
        mi_from_scores(np.zeros((2, 2)), np.array([1, 0]), np.arange(2))
    with pytest.raises(ValueError):
        mi_from_scores(np.full((2, 2), np.nan), np.ones(2), np.arange(2))
    with pytest.raises(ValueError):
        mi_from_scores(np.zeros((2, 2)), np.ones(2), np.array([0, 5]))
    with pytest.raises(ValueError):
        mi_from_scores(np.zeros((2, 2)), np.ones(3), np.arange(2))
    with pytest.raises(ValueError):
        mi_from_scores(np.zeros((2, 2)), np.ones(2), np.arange(2), marginal="exact")


# --------------------------------------------------------------------------- reasoning spans and sampling


def test_reasoning_span_between_think_tags():
    toks = ["<th", "ink>", "go ", "left", "</think>", "<answer>L</answer>"]
    assert reasoning_span(toks) == (2, 4)
    assert reasoning_span(["go", " left", "</", "think>", "<answer>"]) == (0, 2)  # opener was in the prompt
    assert reasoning_span(["<think>", "no close"]) is None
    assert reasoning_span(["<think>", "</think>"]) is None
    assert reasoning_span(["a", "b"], "turn") == (0, 2)
    with pytest.raises(ValueError):
        reasoning_span(["a"], "words")


def _episodes():
    eps = []
    for g in range(3):
        for k in range(2):
            comp = [100 + g, 200 + k, 201, 9, 300, 301, 302, 9]
            reasoning = [(1, 3), (5, 7)] if (g, k) != (2, 1) else [None, (5, 7)]
            eps.append(Episode(prompt_ids=[g, g], completion_ids=comp, reasoning=reasoning, group=g))
    return eps


def test_sample_first_turn_uses_one_column_per_group():
    ps = sample_first_turn(_episodes(), 64, np.random.default_rng(0))
    assert ps.num_total == 6 and ps.num_valid == 5 and len(ps.reasonings) == 5
    assert len(ps.contexts) == 3
    assert sorted(map(tuple, ps.contexts)) == [(0, 0, 100), (1, 1, 101), (2, 2, 102)]
    for z, t in zip(ps.reasonings, ps.target):
        assert ps.contexts[t][-1] == 100 + ps.contexts[t][0]
        assert z[1] == 201
    small = sample_first_turn(_episodes(), 2, np.random.default_rng(1))
    assert len(small.reasonings) == 2


def test_sample_trajectory_draws_turns_each_its_own_column():
    eps = _episodes()
    ps = sample_trajectory(eps, 20, np.random.default_rng(0))
    assert len(ps.contexts) == len(ps.reasonings) == 20
    assert ps.target.tolist() == list(range(20))
    for x, z in zip(ps.contexts, ps.reasonings):
        if len(x) == 3:  # first turn: prompt (2 ids) + completion[:1]
            assert z in ([200, 201], [201, 201]) and x[2] == 100 + x[0]
        else:  # second turn: prompt + completion[:5]
            assert len(x) == 7 and z == [301, 302]
    # identical contexts share a class
    for i, j in [(i, j) for i in range(20) for j in range(20)]:
        assert (ps.column_class[i] == ps.column_class[j]) == (ps.contexts[i] == ps.contexts[j])
    assert sample_trajectory([], 5, np.random.default_rng(0)).contexts == []


# --------------------------------------------------------------------------- the scorer


@pytest.fixture(scope="module")
def tiny_lm():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    )
    return Qwen2ForCausalLM(cfg).eval()


def _logps_fn(model, calls):
    def fn(ids, attn, keep):
        calls.append(ids.shape[0])
        logits = model(input_ids=ids, attention_mask=attn).logits[:, -keep - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -keep:, None]).squeeze(-1)

    return fn


def test_cross_score_matches_direct_unpadded_scoring(tiny_lm):
    contexts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    reasonings = [[10, 11], [12, 13, 14, 15], [16]]
    calls: list[int] = []
    L = cross_score(_logps_fn(tiny_lm, calls), contexts, reasonings, pad_id=0, batch_size=4)
    assert L.shape == (3, 3) and len(calls) == num_chunks(9, 4) == 3
    for i, z in enumerate(reasonings):
        for j, x in enumerate(contexts):
            ids = torch.tensor([x + z])
            with torch.no_grad():
                logp = torch.log_softmax(tiny_lm(input_ids=ids).logits[0, :-1], -1)
            direct = logp[len(x) - 1 :].gather(-1, torch.tensor(z)[:, None]).sum().item()
            assert L[i, j] == pytest.approx(direct, abs=1e-4)


def test_cross_score_pads_forward_count_for_lockstep(tiny_lm):
    calls: list[int] = []
    L = cross_score(_logps_fn(tiny_lm, calls), [[1, 2]], [[3]], pad_id=0, batch_size=4, min_chunks=3)
    assert L.shape == (1, 1) and len(calls) == 3
    calls.clear()
    cross_score(_logps_fn(tiny_lm, calls), [], [], pad_id=0, batch_size=4, min_chunks=2)
    assert len(calls) == 2


def test_cached_scorer_matches_the_padded_scorer(tiny_lm):
    contexts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11]]
    reasonings = [[10, 11], [12, 13, 14, 15], [16], [17, 18, 19]]
    calls: list[int] = []
    padded = cross_score(_logps_fn(tiny_lm, calls), contexts, reasonings, pad_id=0, batch_size=5)
    cached, forwards = cross_score_cached(tiny_lm, contexts, reasonings, batch_size=2)
    np.testing.assert_allclose(cached, padded, atol=1e-4)
    assert forwards <= cached_forwards(contexts, len(reasonings), 2)
    _, padded_forwards = cross_score_cached(tiny_lm, contexts, reasonings, batch_size=2, min_forwards=20)
    assert padded_forwards == 20
    hot, _ = cross_score_cached(tiny_lm, contexts, reasonings, temperature=2.0)
    assert not np.allclose(hot, cached)
