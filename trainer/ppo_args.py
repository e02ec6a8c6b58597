"""PPO (critic) settings, mixed into the trainer config next to TRL's ``GRPOConfig`` fields.

Only :class:`trainer.ppo.LLMGymPPOTrainer` reads these; the GRPO-family trainers ignore them. The defaults follow
RAGEN-2's protocol (reference ``ragen.md`` §3.2, §4.5): GAE with gamma = lambda = 1, critic learning rate 1e-5,
value clipping 0.2, advantages whitened over model tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class PPOArguments:
    """Critic (value head) and GAE settings for ``--algo ppo`` / ``--algo dapo``."""

    vf_coef: float = field(
        default=0.5,
        metadata={
            "help": "Weight of the clipped value loss added to the policy loss (PPO only). The value head shares the "
            "policy's backbone, so this also scales the value gradient that reaches the backbone."
        },
    )
    value_lr: float = field(
        default=1e-5,
        metadata={
            "help": "Learning rate of the value head's own optimizer parameter group (PPO only). RAGEN-2 uses 1e-5 "
            "for the critic and 1e-6 for the actor."
        },
    )
    value_clip: float | None = field(
        default=0.2,
        metadata={
            "help": "Clip range of the value update around the values seen at rollout time (PPO-style clipped "
            "value loss). 0 (or None) disables clipping."
        },
    )
    gae_gamma: float = field(
        default=1.0,
        metadata={
            "help": "GAE discount gamma over model tokens (PPO only). Environment tokens are transparent."
        },
    )
    gae_lambda: float = field(
        default=1.0,
        metadata={
            "help": "GAE lambda over model tokens (PPO only). 1.0 gives returns minus values (Monte Carlo)."
        },
    )
    whiten_advantages: bool = field(
        default=True,
        metadata={
            "help": "Whiten the token-level GAE advantages (zero mean, unit std over all model tokens of the "
            "batch) before the policy loss (PPO only)."
        },
    )
    value_head_init_std: float = field(
        default=1e-3,
        metadata={
            "help": "Std of the normal init of the value head's weight (its bias starts at 0), so initial values "
            "are close to 0 (PPO only)."
        },
    )
    value_detach_backbone: bool = field(
        default=False,
        metadata={
            "help": "Stop the value loss's gradient at the backbone's last hidden state, so only the value head "
            "learns from it and the policy weights see the policy loss alone (PPO only)."
        },
    )

    def validate_ppo_args(self) -> None:
        """Raise ``ValueError`` with a clear message when a PPO setting is out of range."""

        def finite(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            return float(value)

        if finite("vf_coef") < 0:
            raise ValueError(f"vf_coef must be >= 0, got {self.vf_coef}")
        if finite("value_lr") <= 0:
            raise ValueError(f"value_lr must be > 0, got {self.value_lr}")
        if self.value_clip is not None and finite("value_clip") < 0:
            raise ValueError(f"value_clip must be >= 0 (0 or None disables clipping), got {self.value_clip}")
        for name in ("gae_gamma", "gae_lambda"):
            if not 0.0 <= finite(name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if finite("value_head_init_std") < 0:
            raise ValueError(f"value_head_init_std must be >= 0, got {self.value_head_init_std}")
        for name in ("whiten_advantages", "value_detach_backbone"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
