"""Algorithms (``llmgym-train --algo``): RAGEN-2's main-table settings mapped onto TRL's loss options.

An *algorithm* fixes how advantages are estimated and the loss aggregated; a *profile* (``trainer/profiles/``,
``llmgym-train --profile``) holds per-environment settings. The two are chosen independently.

RAGEN-2 (arXiv 2604.06268, App. B.2; RAGEN `scripts/runs/run_main_table_diff_algo.sh`) runs four algorithms through veRL:

| name   | advantage          | loss aggregation     | other                  |
|--------|--------------------|----------------------|------------------------|
| ppo    | GAE (critic)       | token-mean           |                        |
| dapo   | GAE (critic)       | token-mean           | clip 0.2/0.28, no KL   |
| grpo   | group, std-scaled  | seq-mean-token-mean  |                        |
| drgrpo | group, mean only   | seq-mean-token-sum   |                        |

and all share no KL loss and an entropy bonus of 0.001. These presets are llm-gym's own reading of that table, not
RAGEN-2's protocol: in RAGEN's code every row, PPO included, clips at 0.2/0.28 (``config/base.yaml`` lines 38-39)
with dual-clip 3, and its micro-batches of one sequence make "token-mean" a per-sequence mean. The ``ragen2``
profile (``trainer/profiles/ragen2/``, ``--profile ragen2``) sets those; here ``ppo`` keeps the symmetric 0.2 so that
``dapo`` (= PPO + clip-higher) stays a distinct row, and the critic-free ``grpo`` / ``drgrpo`` use 0.2/0.28. In TRL's terms: token-mean is ``loss_type="dapo"``
(normalised by active tokens of the batch), seq-mean-token-mean is ``"grpo"``, seq-mean-token-sum is
``"dr_grpo"`` (TRL divides the token sum by ``max_completion_length``, a constant factor). Note that RAGEN-2's
"DAPO" keeps the critic: it is PPO with clip-higher, not the critic-free DAPO paper recipe.

Every algorithm works with or without SNR filtering: the filter is configured separately and acts on the groups'
reward variance, which every algorithm still samples (``num_generations`` rollouts per seed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: how advantages are estimated and which config values it sets."""

    name: str
    description: str
    advantage: str  # "gae" (critic) or "group" (GRPO-style, no critic)
    loss_aggregation: str  # RAGEN / veRL loss_agg_mode name, for the docs
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def uses_critic(self) -> bool:
        return self.advantage == "gae"


# Shared by every algorithm (RAGEN-2 App. B.2): no KL term, entropy bonus 0.001, lower clip 0.2.
_COMMON: dict[str, Any] = {"beta": 0.0, "entropy_coef": 0.001, "epsilon": 0.2}
_GAE: dict[str, Any] = {"gae_gamma": 1.0, "gae_lambda": 1.0, "whiten_advantages": True}

ALGORITHMS: dict[str, Algorithm] = {
    "ppo": Algorithm(
        "ppo",
        "PPO with a value head and GAE over model tokens; token-mean loss",
        "gae",
        "token-mean",
        # scale_rewards only affects TRL's group advantages, which PPO replaces; "none" keeps them unscaled.
        {**_COMMON, **_GAE, "loss_type": "dapo", "scale_rewards": "none", "epsilon_high": 0.2},
    ),
    "dapo": Algorithm(
        "dapo",
        "PPO (critic, GAE) with clip-higher 0.2/0.28 and no KL; token-mean loss (RAGEN-2's DAPO row)",
        "gae",
        "token-mean",
        {**_COMMON, **_GAE, "loss_type": "dapo", "scale_rewards": "none", "epsilon_high": 0.28},
    ),
    "grpo": Algorithm(
        "grpo",
        "GRPO: group-mean baseline divided by the group std; seq-mean-token-mean loss",
        "group",
        "seq-mean-token-mean",
        {**_COMMON, "loss_type": "grpo", "scale_rewards": "group", "epsilon_high": 0.28},
    ),
    "drgrpo": Algorithm(
        "drgrpo",
        "Dr. GRPO: group-mean baseline without std normalisation; seq-mean-token-sum loss",
        "group",
        "seq-mean-token-sum",
        {**_COMMON, "loss_type": "dr_grpo", "scale_rewards": "none", "epsilon_high": 0.28},
    ),
}


def _canonical(name: str) -> str:
    if not isinstance(name, str):
        raise ValueError(f"algorithm name must be a string, got {type(name).__name__}")
    key = name.strip().lower().replace("-", "").replace("_", "").replace(".", "")
    if key not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; valid names: {', '.join(ALGORITHMS)}")
    return key


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name`` (case, ``-``, ``_`` and ``.`` ignored, so ``Dr.GRPO`` works)."""
    return ALGORITHMS[_canonical(name)]


def algorithm_overrides(name: str) -> dict[str, Any]:
    """Config values (TRL ``GRPOConfig`` fields and our PPO fields) that the algorithm ``name`` sets.

    Returns a fresh dict each call, so callers may edit it.
    """
    return dict(get_algorithm(name).overrides)


def trainer_class(name: str) -> type:
    """The trainer class for algorithm ``name``: the PPO trainer for critic algorithms, else the GRPO trainer."""
    if get_algorithm(name).uses_critic:
        from llm_gym.trainer.ppo import LLMGymPPOTrainer

        return LLMGymPPOTrainer
    from llm_gym.trainer.grpo import LLMGymGRPOTrainer

    return LLMGymGRPOTrainer
