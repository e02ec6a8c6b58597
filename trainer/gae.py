"""Pure tensor functions for PPO on multi-turn token sequences: reward placement, GAE, whitening, value loss.

Layout: one row per trajectory, ``T`` completion positions; ``mask[b, t] = 1`` marks a model (policy) token and
``0`` marks environment tokens (observations, chat template) and padding. Environment tokens are *transparent*:
GAE runs over the model tokens of a row as if they were consecutive, so the turn boundary is simply the next
model token (RAGEN's token-level GAE, RAGEN ``ragen/trainer/core_algos.py``, with gamma = lambda = 1 by default). Values and advantages at non-model
positions are 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def _check_shapes(**tensors: torch.Tensor) -> tuple[int, int]:
    shape = None
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(
                f"{name} must be a 2-D (batch, tokens) tensor, got {getattr(t, 'shape', type(t))}"
            )
        if shape is None:
            shape = tuple(t.shape)
        elif tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
    return shape  # type: ignore[return-value]


def last_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each row's trajectory score on its last model token (RAGEN's default placement), 0 elsewhere.

    Rows without any model token get no reward (there is no token to credit).
    """
    _check_shapes(mask=mask)
    scores = torch.as_tensor(scores, dtype=torch.float32, device=mask.device).reshape(-1)
    if scores.numel() != mask.size(0):
        raise ValueError(f"got {scores.numel()} scores for {mask.size(0)} rows")
    if not torch.isfinite(scores).all():
        raise ValueError("scores must be finite")
    m = mask.bool()
    positions = torch.arange(mask.size(1), device=mask.device).expand_as(mask)
    last = torch.where(m, positions, torch.full_like(positions, -1)).max(dim=1).values
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = (last >= 0).nonzero(as_tuple=True)[0]
    rewards[rows, last[rows]] = scores[rows]
    return rewards


@torch.no_grad()
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over model tokens only.

    For the model tokens ``t_1 < t_2 < ... < t_n`` of a row, with ``V(t_{n+1}) = 0`` (episode end)::

        delta_k = r(t_k) + gamma * V(t_{k+1}) - V(t_k)
        A(t_k)  = delta_k + gamma * lam * A(t_{k+1})
        R(t_k)  = A(t_k) + V(t_k)                      (the value target)

    Args:
        rewards: (B, T) per-token rewards; must be 0 where ``mask`` is 0 (put them on a model token, e.g. with
            :func:`last_token_rewards`).
        values: (B, T) value estimates ``V(s_t)``; ignored where ``mask`` is 0.
        mask: (B, T) 1 for model tokens, 0 for environment tokens and padding.
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1].

    Returns:
        ``(advantages, returns)``, both (B, T) float32 and 0 outside the mask.
    """
    _check_shapes(rewards=rewards, values=values, mask=mask)
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1], got gamma={gamma}, lam={lam}")
    m = mask.bool()
    rewards = rewards.float()
    values = values.detach().float()
    if (rewards[~m] != 0).any():
        raise ValueError("rewards on non-model tokens would be lost: place them on a model token")
    if not (torch.isfinite(rewards).all() and torch.isfinite(values[m]).all()):
        raise ValueError("rewards and values must be finite on model tokens")
    B, T = mask.shape
    advantages = torch.zeros((B, T), dtype=torch.float32, device=mask.device)
    next_value = torch.zeros(B, dtype=torch.float32, device=mask.device)
    running = torch.zeros(B, dtype=torch.float32, device=mask.device)
    # One reverse scan for all rows; at environment tokens the carry passes through unchanged.
    for t in range(T - 1, -1, -1):
        mt = m[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * running
        advantages[:, t] = torch.where(mt, a, torch.zeros_like(a))
        running = torch.where(mt, a, running)
        next_value = torch.where(mt, values[:, t], next_value)
    returns = torch.where(m, advantages + values, torch.zeros_like(advantages))
    return advantages, returns


def whiten_moments(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[count, sum, sum of squares]`` (float64, shape (3,)) of the masked entries of ``x``.

    Moments add up: summed over the processes of a data-parallel batch (an all-reduce) they are the moments of
    the whole batch, which :func:`masked_whiten` takes to whiten every shard with the global mean and std.
    """
    _check_shapes(x=x, mask=mask)
    vals = x[mask.bool()].double()
    return torch.stack([vals.new_tensor(float(vals.numel())), vals.sum(), (vals * vals).sum()]).cpu()


def moments_mean_std(moments: torch.Tensor) -> tuple[float, float | None]:
    """Mean and unbiased std from :func:`whiten_moments` ``[count, sum, sum of squares]``; the std is None
    with fewer than two entries. Raises on moments that no batch can have (negative or non-finite)."""
    m = torch.as_tensor(moments, dtype=torch.float64).reshape(-1)
    if m.numel() != 3 or not torch.isfinite(m).all() or m[0] < 0 or m[2] < 0:
        raise ValueError(f"moments must be finite [count >= 0, sum, sum of squares >= 0], got {m.tolist()}")
    n, s, ss = (float(v) for v in m)
    if n == 0:
        return 0.0, None
    mean = s / n
    if n < 2:
        return mean, None
    var = max(ss - s * mean, 0.0) / (n - 1)  # float64: cancellation is negligible at advantage scales
    return mean, var**0.5


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, moments: torch.Tensor | None = None
) -> torch.Tensor:
    """(x - mean) / std over the masked entries (unbiased std); 0 outside the mask.

    ``moments`` (:func:`whiten_moments` summed over processes) gives the mean and std of the whole batch when
    ``x`` is one process's shard of it (veRL whitens once over the global batch); without it they are ``x``'s
    own. With fewer than two entries there is no spread to normalise by: the result is centred only.
    """
    _check_shapes(x=x, mask=mask)
    m = mask.bool()
    out = torch.zeros_like(x, dtype=torch.float32)
    if not m.any():
        return out
    vals = x[m].float()
    mean: torch.Tensor | float
    std: torch.Tensor | float | None
    if moments is None:
        n = vals.numel()
        mean = vals.mean()
        std = vals.std(unbiased=True) if n > 1 else None
    else:
        mean, std = moments_mean_std(moments)
    centred = vals - mean
    if std is not None:
        centred = centred / (std + eps)
    out[m] = centred.float()
    return out


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.2,
    *,
    agg: str = "token-mean",
    norm_length: int | None = None,
) -> torch.Tensor:
    """PPO's clipped value loss: ``0.5 * masked_mean(max((V - R)^2, (V_clip - R)^2))``.

    ``agg`` aggregates the per-token loss like the policy loss (:func:`llm_gym.trainer.losses.aggregate`; veRL's
    critic uses the actor's ``loss_agg_mode``); the default is the token mean over the batch.

    ``V_clip = V_old + clamp(V - V_old, -clip, clip)`` keeps the critic near the values seen at rollout time;
    ``clip=None`` gives the plain squared error. Returns a scalar (0 when the mask is empty).
    """
    _check_shapes(values=values, old_values=old_values, returns=returns, mask=mask)
    if clip is not None and not clip > 0:
        raise ValueError(f"clip must be > 0 or None, got {clip}")
    m = mask.to(values.dtype)
    loss = (values - returns) ** 2
    if clip is not None:
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        loss = torch.maximum(loss, (v_clipped - returns) ** 2)
    if agg == "token-mean":
        return 0.5 * (loss * m).sum() / m.sum().clamp(min=1.0)
    from llm_gym.trainer.losses import aggregate

    return 0.5 * aggregate(loss, m, agg, norm_length=norm_length)


@dataclass(frozen=True)
class PPOTargets:
    """What PPO trains on for one batch: all (B, T) float tensors, 0 outside ``mask``."""

    advantages: torch.Tensor  # GAE advantages (whitened if asked)
    returns: torch.Tensor  # value targets
    values: torch.Tensor  # rollout-time values V_old
    mask: torch.Tensor  # model tokens of scorable rows: where the value loss applies

    def metrics(self) -> dict[str, float]:
        """Mean value, mean return and the critic's explained variance over ``mask`` (empty if no token)."""
        m = self.mask.bool()
        if not m.any():
            return {}
        values, returns = self.values[m], self.returns[m]
        out = {"value_mean": values.mean().item(), "return_mean": returns.mean().item()}
        var_r = returns.var(unbiased=False)
        if var_r > 1e-8:  # undefined when every return is the same
            out["explained_variance"] = (1.0 - (returns - values).var(unbiased=False) / var_r).item()
        return out


@torch.no_grad()
def ppo_targets(
    scores: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> PPOTargets:
    """Advantages and value targets of a batch of trajectories from their episode scores.

    The score goes on the last model token (:func:`last_token_rewards`), GAE runs over model tokens
    (:func:`gae`) and the advantages are whitened over all model tokens of the batch (:func:`masked_whiten`).
    A NaN score marks an unscorable sample (every reward function returned ``None``): its row leaves the mask,
    so it gets no advantage and no value loss, as TRL gives it no advantage in GRPO.

    Args:
        scores: (B,) episode reward per row (NaN = unscorable).
        values: (B, T) rollout-time value estimates.
        mask: (B, T) 1 on model tokens (the loss mask), 0 elsewhere.
        reduce: sums a tensor over the processes that hold the other rows of the batch (an all-reduce); the
            whitening then uses the whole batch's mean and std (:func:`whiten_moments`). Every process must call
            it. None: this batch is the whole batch.
    """
    _check_shapes(values=values, mask=mask)
    scores = torch.as_tensor(scores, dtype=torch.float32).reshape(-1).to(mask.device)
    if scores.numel() != mask.size(0):
        raise ValueError(f"got {scores.numel()} scores for {mask.size(0)} rows")
    scorable = ~torch.isnan(scores)
    mask = mask * scorable.unsqueeze(1).to(mask.dtype)
    values = values.float() * mask
    rewards = last_token_rewards(torch.nan_to_num(scores, nan=0.0), mask)
    advantages, returns = gae(rewards, values, mask, gamma=gamma, lam=lam)
    if whiten:
        moments = None if reduce is None else reduce(whiten_moments(advantages, mask))
        advantages = masked_whiten(advantages, mask, moments=moments)
    return PPOTargets(advantages=advantages, returns=returns, values=values, mask=mask.float())


__all__ = [
    "PPOTargets",
    "clipped_value_loss",
    "gae",
    "last_token_rewards",
    "masked_whiten",
    "moments_mean_std",
    "ppo_targets",
    "whiten_moments",
]
