"""The learning tests' verdict and their broken twins, shared by every learning test (Bandit in
``test_learning.py``, FrozenLake in ``test_sample_efficiency.py``): each twin keeps every setting and breaks one
thing a real bug could break, so a learning test that passes on a twin is one that cannot fail."""

from __future__ import annotations

import numpy as np
from llm_gym.trainer import rollouts, snr_filter
from llm_gym.trainer.grpo import LLMGymGRPOTrainer


def verdict(report: dict) -> tuple[bool, str]:
    """Whether the last evaluation's interval lies wholly above random's and the first evaluation's (the warm
    start: the model RL started from) upper bounds, and the best constant answer's where the report has one, with
    the numbers for the failure message."""
    first, last = report["evals"][0]["success"], report["evals"][-1]["success"]
    random_ci = report["baseline"]["random"]["ci"]
    bars = [random_ci[1], first["ci"][1]]
    constants = report.get("constant_actions") or {}
    bars += [c["ci"][1] for c in constants.values()]
    return last["ci"][0] > max(bars), (
        f"after {last['rate']:.3f} {last['ci']} vs warm start {first['rate']:.3f} {first['ci']}, "
        f"random {random_ci}, best constant {max((c['ci'][1] for c in constants.values()), default=None)} "
        f"(n={last['n']})"
    )


def flip_advantages(monkeypatch):
    def flipped(self, batch, rewards):
        return {**batch, "advantages": -batch["advantages"]}

    monkeypatch.setattr(LLMGymGRPOTrainer, "compute_advantages", flipped)


def loss_on_observations(monkeypatch):
    add = rollouts.TokenEpisode.add

    def inverted(self, ids, mask, logprobs=None):
        add(self, ids, 1 - mask, logprobs)

    monkeypatch.setattr(rollouts.TokenEpisode, "add", inverted)


def keep_zero_variance(monkeypatch):
    def zero_only(scores, *args, **kwargs):
        return np.asarray(scores, dtype=np.float64).reshape(-1) <= snr_filter.ZERO_TOL

    monkeypatch.setattr(snr_filter, "select_groups", zero_only)


TWINS = {
    "advantages_sign_flipped": flip_advantages,
    "loss_on_observation_tokens": loss_on_observations,
    "filter_keeps_zero_variance_groups": keep_zero_variance,
}
