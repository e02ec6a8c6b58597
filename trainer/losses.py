"""Policy-loss math for the RAGEN-2 protocol (pure torch functions, no trainer).

TRL's ``GRPOTrainer`` computes its clipped surrogate and aggregates it by ``loss_type``; two things RAGEN-2's
runs (through veRL) do differently are not among TRL's options:

- **dual-clip** (Ye et al. 2020, arXiv:1912.09729; veRL ``compute_policy_loss``, ``clip_ratio_c`` 3.0): for a
  negative advantage the clipped loss is further bounded by ``-A * c``, so one very unlikely-now token cannot
  produce an unbounded loss;
- **aggregation of every term alike**: veRL aggregates the policy loss, the entropy and the KL with the same
  ``loss_agg_mode`` (RAGEN ``ragen/workers/actor/dp_actor.py``), while TRL takes the entropy as a per-token mean
  whatever the policy normaliser (with ``dr_grpo`` the policy term is divided by ``max_completion_length`` and the
  entropy is not, so the entropy bonus weighs thousands of times more than intended).

Aggregation modes (:data:`AGG_MODES`), each over the rows of one micro-batch (the trainer divides by gradient
accumulation, so an optimizer step averages its micro-batches):

- ``token-mean``: sum over the masked tokens / their number (veRL ``token-mean`` over a micro-batch);
- ``seq-mean-token-mean``: each row's token mean, then the mean over rows. This is also what veRL's
  ``token-mean`` becomes with RAGEN's micro-batch of one sequence (``config/base.yaml`` line 12,
  ``micro_batch_size_per_gpu: 1``), i.e. per-sequence aggregation;
- ``seq-mean-token-sum``: each row's token sum, then the mean over rows (veRL; RAGEN's Dr.GRPO row);
- ``seq-mean-token-sum-norm``: token sum over the micro-batch / (rows x ``norm_length``) (TRL's ``dr_grpo``, with
  ``norm_length = max_completion_length``).

Rows with no masked token count as zero in the row means (as TRL and veRL's micro-batch of one do), so padding
rows dilute exactly as a masked row does in TRL.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

#: The ``loss_agg_mode`` that reproduces TRL's policy-term normaliser for each ``loss_type`` we support.
TRL_LOSS_TYPE_AGG = {
    "grpo": "seq-mean-token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "bnpo": "token-mean",
}


def aggregate(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, *, norm_length: int | None = None
) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar over the tokens where ``mask`` is 1 (see :data:`AGG_MODES`)."""
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} differ in shape")
    m = mask.to(loss_mat.dtype)
    summed = (loss_mat * m).sum(-1)
    if mode == "token-mean":
        return summed.sum() / m.sum().clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        return (summed / m.sum(-1).clamp(min=1.0)).mean()
    if mode == "seq-mean-token-sum":
        return summed.mean()
    if mode == "seq-mean-token-sum-norm":
        if not norm_length or norm_length < 1:
            raise ValueError("seq-mean-token-sum-norm needs a positive norm_length (max_completion_length)")
        return summed.sum() / (loss_mat.shape[0] * norm_length)
    raise ValueError(f"loss_agg_mode must be one of {AGG_MODES}, got {mode!r}")


def split_aggregate(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, *, norm_length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`aggregate` as ``(numerator, denominator)``: sums over rows, so the aggregate of a batch cut into
    chunks is ``sum(numerators) / sum(denominators)`` (clamped to at least 1, as :func:`aggregate` does).

    The numerator carries the gradient; the denominator (token or row count) does not depend on the weights."""
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} differ in shape")
    m = mask.to(loss_mat.dtype)
    summed = (loss_mat * m).sum(-1)
    rows = torch.tensor(float(loss_mat.shape[0]), dtype=loss_mat.dtype, device=loss_mat.device)
    if mode == "token-mean":
        return summed.sum(), m.sum()
    if mode == "seq-mean-token-mean":
        return (summed / m.sum(-1).clamp(min=1.0)).sum(), rows
    if mode == "seq-mean-token-sum":
        return summed.sum(), rows
    if mode == "seq-mean-token-sum-norm":
        if not norm_length or norm_length < 1:
            raise ValueError("seq-mean-token-sum-norm needs a positive norm_length (max_completion_length)")
        return summed.sum(), rows * norm_length
    raise ValueError(f"loss_agg_mode must be one of {AGG_MODES}, got {mode!r}")


def clipped_surrogate(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss ``max(-A r, -A clip(r, 1 - low, 1 + high))``, bounded by ``-A c`` where ``A < 0`` when
    ``dual_clip = c`` is set (c > 1).

    Returns ``(per_token_loss, clipped, dual_clipped)``: the loss and two bool masks (the token's loss came
    from the clipped ratio; the dual-clip bound applied). ``advantages`` is (B, T) or (B,) (broadcast over T).
    """
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (veRL's clip_ratio_c), got {dual_clip}")
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    # veRL clamps the log-ratio to +-20 before exp (compute_policy_loss), so a stale token cannot overflow
    ratio = torch.exp(torch.clamp(logps - old_logps, -20.0, 20.0))
    loss1 = -adv * ratio
    loss2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss1, loss2)
    clipped = loss2 > loss1
    if dual_clip is None:
        return loss, clipped, torch.zeros_like(clipped)
    bound = -adv * dual_clip
    dual = (adv < 0) & (loss > bound)
    loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    return loss, clipped, dual


@dataclass(frozen=True)
class PolicyLoss:
    """One micro-batch's loss terms, each aggregated with the same mode (scalars)."""

    total: torch.Tensor  # policy - entropy_coef * entropy + beta * kl
    policy: torch.Tensor
    entropy: torch.Tensor
    kl: torch.Tensor | None
    clip_frac: torch.Tensor
    dual_clip_frac: torch.Tensor


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg: str,
    dual_clip: float | None = None,
    entropies: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    kl: torch.Tensor | None = None,
    beta: float = 0.0,
    norm_length: int | None = None,
    weights: torch.Tensor | None = None,
) -> PolicyLoss:
    """The clipped (optionally dual-clipped) policy loss, entropy bonus and KL penalty of one micro-batch, every
    term aggregated by ``agg`` (veRL / RAGEN: ``loss = pg - entropy_coef * H + beta * KL``, all with one mode).

    ``weights`` (B, T) multiply the per-token policy loss (TRL's vLLM importance-sampling correction).
    """
    per_token, clipped, dual = clipped_surrogate(
        logps, old_logps, advantages, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    if weights is not None:
        per_token = per_token * weights
    pol = aggregate(per_token, mask, agg, norm_length=norm_length)
    total = pol
    ent = torch.zeros((), dtype=pol.dtype, device=pol.device)
    if entropies is not None:
        ent = aggregate(entropies, mask, agg, norm_length=norm_length)
        total = total - entropy_coef * ent
    kl_term = None
    if kl is not None:
        kl_term = aggregate(kl, mask, agg, norm_length=norm_length)
        total = total + beta * kl_term
    with torch.no_grad():
        m = mask.bool()
        n = m.sum().clamp(min=1)
        clip_frac = (clipped & m).sum() / n
        dual_frac = (dual & m).sum() / n
    return PolicyLoss(total, pol, ent, kl_term, clip_frac.float(), dual_frac.float())


__all__ = [
    "AGG_MODES",
    "TRL_LOSS_TYPE_AGG",
    "PolicyLoss",
    "aggregate",
    "clipped_surrogate",
    "policy_loss",
    "split_aggregate",
]
