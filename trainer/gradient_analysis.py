"""Gradient decomposition by reward variance (RAGEN-2, Sec. 3 and App. H; RAGEN's ``trainer.gradient_analysis_mode``).

RAGEN-2 bounds the task gradient of a prompt by its reward variance, ``|g_task(x)| <= C * sqrt(Var(R | x))``
(Theorem H.2), and shows (Fig. 3) that the task-gradient norm grows with the reward variance while the entropy and
KL gradients stay flat, so low-variance prompts give updates that the regularisers dominate. This module measures
that in a training round without changing it:

1. the round's groups are put into buckets by their reward variance (:func:`bucket_groups`, RAGEN's two modes);
2. for each bucket and for ``all`` (every group), each term of the policy loss is back-propagated on its own:
   ``task`` (the clipped surrogate at the sampling policy, where the ratio is 1: the policy gradient
   ``-A * grad log pi``), ``entropy`` (``-entropy_coef * H``, when ``entropy_coef != 0``) and ``kl``
   (``beta * KL`` to the reference, TRL's k3 estimator, when ``beta != 0``); each term is aggregated over the
   bucket's rows as one batch, with the run's aggregation (``loss_agg_mode``, else the one TRL's ``loss_type``
   uses; the entropy as TRL takes it, a token mean, unless ``loss_agg_mode`` is set);
3. the norms are logged as ``grad_analysis/<bucket>/<term>_norm``, beside the bucket's reward variance
   (``grad_analysis/<bucket>/sqrt_reward_var`` = sqrt of the mean Var(R|X) of its groups, the bound's abscissa).

Nothing the run does next changes: the gradients go to buffers of this module (each parameter's ``.grad`` is put
back as it was, the same tensor), the optimizer is never touched, and the random streams the forwards could draw
from (dropout: torch's CPU and CUDA generators; Python's ``random`` and NumPy's global one for good measure) are
restored afterwards. ``tests/test_gradient_analysis.py`` trains with and without it and compares the weights, the
optimizer state and the next round's samples bitwise.

The metrics, for bucket ``b`` in ``all``, ``bucket_1`` .. ``bucket_N`` (``bucket_1``: lowest variance):

- ``task_norm``, ``entropy_norm``, ``kl_norm``: each term's gradient norm (over the trainable parameters, before
  clipping; a term that is off is not logged); ``reg_norm``: the norm of the entropy and KL gradients' sum (the
  paper's ``g_reg``);
- ``groups``, ``rows``, ``tokens``: the bucket's size;
- ``reward_var_mean``, ``reward_var_min``, ``reward_var_max``, ``sqrt_reward_var``: its groups' reward variance
  (with ``filter_variance_ddof``);

and ``grad_analysis/seconds``, the time the analysis took (also printed each time).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from llm_gym.trainer import compat
from llm_gym.trainer import snr_filter as snr
from llm_gym.trainer.batch import loss_mask
from llm_gym.trainer.defaults import GRADIENT_ANALYSIS_BUCKET_MODES
from llm_gym.trainer.losses import TRL_LOSS_TYPE_AGG, clipped_surrogate, split_aggregate

from llm_gym.core.checks import is_int

#: Metric prefix of the analysis.
PREFIX = "grad_analysis"
#: RAGEN's ``fixed_rv`` edges, on the groups' reward *std* (``ragen/trainer/rollout_filter.py``,
#: ``split_into_buckets``): [0, 1), [1, 2), ..., [4, 5), [5, inf).
FIXED_STD_EDGES = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
#: The loss terms, in the order they are back-propagated.
TERMS = ("task", "entropy", "kl")
#: TRL loss types whose policy term is the clipped surrogate (the others reweigh it: cispo, sapo, vespo, luspo).
SURROGATE_LOSS_TYPES = (*TRL_LOSS_TYPE_AGG, "dapo")


def bucket_groups(
    variances: np.ndarray, num_buckets: int = 6, mode: str = "quantile"
) -> dict[str, np.ndarray]:
    """``bucket name -> indices of its groups`` (ascending), ``all`` first.

    - ``quantile`` (RAGEN's default): the groups sorted by reward variance, ascending (ties by group index), cut
      into ``min(num_buckets, groups)`` buckets of ``groups // buckets`` groups each, the remainder going to the
      last one; ``bucket_1`` holds the lowest variances;
    - ``fixed_rv`` (RAGEN's): by the groups' reward std in :data:`FIXED_STD_EDGES`; ``bucket_i`` holds std in
      ``[i - 1, i)`` and ``bucket_6`` std >= 5; empty buckets are left out.

    Either way the buckets partition the groups.
    """
    if mode not in GRADIENT_ANALYSIS_BUCKET_MODES:
        raise ValueError(f"bucket mode must be one of {GRADIENT_ANALYSIS_BUCKET_MODES}, got {mode!r}")
    if not (isinstance(num_buckets, int) and num_buckets >= 1):
        raise ValueError(f"num_buckets must be a positive integer, got {num_buckets!r}")
    v = np.asarray(variances, dtype=np.float64).reshape(-1)
    if np.isnan(v).any() or (v < 0).any():
        raise ValueError("group variances must be finite and non-negative")
    n = v.size
    out: dict[str, np.ndarray] = {"all": np.arange(n)}
    if mode == "quantile":
        k = min(num_buckets, n)
        if k == 0:
            return out
        order = np.argsort(v, kind="stable")
        per, rest = divmod(n, k)
        start = 0
        for i in range(k):
            size = per + (rest if i == k - 1 else 0)
            out[f"bucket_{i + 1}"] = np.sort(order[start : start + size])
            start += size
        return out
    std = np.sqrt(v)
    for i, low in enumerate(FIXED_STD_EDGES):
        high = FIXED_STD_EDGES[i + 1] if i + 1 < len(FIXED_STD_EDGES) else math.inf
        idx = np.flatnonzero((std >= low) & (std < high))
        if idx.size:
            out[f"bucket_{i + 1}"] = idx
    return out


def term_matrices(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    entropies: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-token (B, T) matrices of the loss terms at the sampling policy: ``task`` (the clipped surrogate with
    the old log-probs equal to ``logps``, so the ratio is 1 and its gradient is ``-A * grad log pi``, times the
    importance ``weights`` when given), ``entropy`` (when ``entropies`` is given) and ``kl`` (TRL's k3,
    ``exp(ref - logp) - (ref - logp) - 1``, when ``ref_logps`` is given). Coefficients are not applied."""
    task, _, _ = clipped_surrogate(logps, logps.detach(), advantages, clip_low=clip_low, clip_high=clip_high)
    out = {"task": task if weights is None else task * weights}
    if entropies is not None:
        out["entropy"] = entropies
    if ref_logps is not None:
        diff = ref_logps - logps
        out["kl"] = torch.exp(diff) - diff - 1
    return out


def group_rows(groups: np.ndarray, group_size: int) -> np.ndarray:
    """The row indices of ``groups`` (groups are ``group_size`` consecutive rows, TRL's order)."""
    g = np.asarray(groups, dtype=np.int64).reshape(-1)
    return (g[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore torch's CPU and (initialised) CUDA generators, Python's ``random`` and NumPy's global generator on
    exit: forwards in training mode draw dropout masks from torch's generators."""
    cpu = torch.get_rng_state()
    cuda = (
        torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    )
    py, npy = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py)
        np.random.set_state(npy)


@contextlib.contextmanager
def stashed_grads(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """Set every ``.grad`` to None for the block, then put each original back (the same tensor or None)."""
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, g in zip(params, saved):
            p.grad = g


def _norm(tensors: list[torch.Tensor | None], scale: float = 1.0) -> float:
    total = sum(float(t.double().pow(2).sum()) for t in tensors if t is not None)
    return abs(scale) * math.sqrt(total)


def _add(acc: list[torch.Tensor | None], grads: list[torch.Tensor | None], scale: float = 1.0) -> None:
    for i, g in enumerate(grads):
        if g is None:
            continue
        a = acc[i]
        acc[i] = g * scale if a is None else a.add_(g, alpha=scale)  # a copy first: never alias the caller's


def _reg_norm(parts: list[tuple[list[torch.Tensor | None], float]]) -> float:
    """Norm of ``sum(scale * grads)`` over the (grads, scale) parts."""
    acc: list[torch.Tensor | None] = [None] * len(parts[0][0])
    for grads, scale in parts:
        _add(acc, grads, scale)
    return _norm(acc)


def analyse_round(trainer: Any, batch: dict, rewards: np.ndarray, index: int) -> dict[str, float]:
    """The round's gradient decomposition (``grad_analysis/...`` metrics; see the module docstring).

    ``batch`` is the round's scored batch with its advantages, before the SNR filter; ``rewards`` its (B,) episode
    rewards (one process). Reads the trainer's ``args``, ``model``, ``accelerator``, ``num_generations`` and TRL's
    public loss settings (``beta``, ``entropy_coef``, ``epsilon_low`` / ``epsilon_high``, ``loss_type``,
    ``max_completion_length``, ``use_vllm``)."""
    start = time.perf_counter()
    args = trainer.args
    if trainer.accelerator.num_processes > 1:
        raise RuntimeError(
            "gradient analysis runs on one process (gradient_analysis_every needs a single process)"
        )
    G = int(trainer.num_generations)
    n = int(batch["completion_ids"].shape[0])
    if np.asarray(rewards).size != n:
        raise RuntimeError(f"{np.asarray(rewards).size} rewards for a batch of {n} rows")
    variances = snr.group_scores(rewards, G, "variance", args.filter_variance_ddof)
    buckets = bucket_groups(variances, args.gradient_analysis_buckets, args.gradient_analysis_bucket_mode)
    agg = args.loss_agg_mode or TRL_LOSS_TYPE_AGG.get(trainer.loss_type, "token-mean")
    aggs = {"task": agg, "entropy": "token-mean" if args.loss_agg_mode is None else agg, "kl": agg}
    coefs = {"task": 1.0}
    if float(trainer.entropy_coef) != 0.0:
        coefs["entropy"] = -float(trainer.entropy_coef)
    if float(trainer.beta) != 0.0:
        coefs["kl"] = float(trainer.beta)
    terms = [t for t in TERMS if t in coefs]
    weights = None
    if getattr(trainer, "use_vllm", False) and args.vllm_importance_sampling_correction:
        weights = batch["importance_sampling_ratio"]
    model = trainer.model
    params = [p for p in model.parameters() if p.requires_grad]
    chunk = int(args.per_device_train_batch_size)
    mask_all = loss_mask(batch)
    width = int(batch["completion_ids"].shape[1])
    norm_length = int(trainer.max_completion_length or width)

    # unnormalised gradients (of the numerators) of the whole round, summed over the buckets that partition it
    total: dict[str, list[torch.Tensor | None]] = {t: [None] * len(params) for t in terms}
    total_den = dict.fromkeys(terms, 0.0)
    metrics: dict[str, float] = {}

    def record(name: str, grads: dict, dens: dict, groups: np.ndarray, rows: np.ndarray) -> None:
        scales = {t: coefs[t] / max(dens[t], 1.0) for t in terms}
        out = {f"{t}_norm": _norm(grads[t], scales[t]) for t in terms}
        reg = [(grads[t], scales[t]) for t in terms if t != "task"]
        if reg:
            out["reg_norm"] = _reg_norm(reg)
        v = variances[groups]
        out.update(
            groups=float(groups.size),
            rows=float(rows.size),
            tokens=float(mask_all[torch.as_tensor(rows)].sum()) if rows.size else 0.0,
            reward_var_mean=float(v.mean()) if v.size else math.nan,
            reward_var_min=float(v.min()) if v.size else math.nan,
            reward_var_max=float(v.max()) if v.size else math.nan,
            sqrt_reward_var=math.sqrt(float(v.mean())) if v.size else math.nan,
        )
        metrics.update({f"{PREFIX}/{name}/{k}": float(val) for k, val in out.items()})

    with preserved_rng(), stashed_grads(params):
        for name, groups in buckets.items():
            if name == "all":
                continue
            rows = group_rows(groups, G)
            grads: dict[str, list[torch.Tensor | None]] = {t: [None] * len(params) for t in terms}
            dens = dict.fromkeys(terms, 0.0)
            for lo in range(0, rows.size, chunk):
                idx = torch.as_tensor(rows[lo : lo + chunk])
                ids = torch.cat([batch["prompt_ids"][idx], batch["completion_ids"][idx]], dim=1)
                attn = torch.cat([batch["prompt_mask"][idx], batch["completion_mask"][idx]], dim=1)
                logps, entropies, _ = compat.per_token_logps_and_entropies(
                    trainer,
                    model,
                    ids,
                    attn,
                    width,
                    batch_size=idx.numel(),
                    compute_entropy="entropy" in coefs,
                )
                mats = term_matrices(
                    logps,
                    batch["advantages"][idx],
                    clip_low=float(trainer.epsilon_low),
                    clip_high=float(trainer.epsilon_high),
                    entropies=entropies,
                    ref_logps=batch["ref_per_token_logps"][idx] if "kl" in coefs else None,
                    weights=None if weights is None else weights[idx],
                )
                mask = mask_all[idx]
                # zero advantages (a constant group) give an exactly zero task gradient: no backward for it
                needed = [t for t in terms if t != "task" or bool(batch["advantages"][idx].any())]
                for t in terms:
                    num, den = split_aggregate(mats[t], mask, aggs[t], norm_length=norm_length)
                    dens[t] += float(den)
                    if t not in needed:
                        continue
                    num.backward(retain_graph=t != needed[-1])
                    _add(grads[t], [p.grad for p in params])
                    for p in params:
                        p.grad = None
            record(name, grads, dens, groups, rows)
            for t in terms:
                _add(total[t], grads[t])
                total_den[t] += dens[t]
        record("all", total, total_den, buckets["all"], group_rows(buckets["all"], G))
    seconds = time.perf_counter() - start
    metrics[f"{PREFIX}/seconds"] = seconds
    if trainer.accelerator.is_main_process:
        print(
            f"llmgym-train: gradient analysis, round {index}: {len(buckets) - 1} buckets of {variances.size} groups "
            f"({n} rows, terms {', '.join(terms)}) in {seconds:.2f}s",
            flush=True,
        )
    return metrics


def check_setup(config: Any) -> None:
    """Raise ``ValueError`` where the analysis cannot measure what the run trains (called by the config)."""
    every = config.gradient_analysis_every
    if not (is_int(every) and every >= 0):
        raise ValueError(f"gradient_analysis_every must be an integer >= 0, got {every!r}")
    buckets = config.gradient_analysis_buckets
    if not (is_int(buckets) and buckets >= 1):
        raise ValueError(f"gradient_analysis_buckets must be a positive integer, got {buckets!r}")
    if config.gradient_analysis_bucket_mode not in GRADIENT_ANALYSIS_BUCKET_MODES:
        raise ValueError(
            f"gradient_analysis_bucket_mode must be one of {GRADIENT_ANALYSIS_BUCKET_MODES}, "
            f"got {config.gradient_analysis_bucket_mode!r}"
        )
    if not every:
        return
    loss_type = getattr(config, "loss_type", "dapo")
    if getattr(config, "loss_agg_mode", None) is None and loss_type not in SURROGATE_LOSS_TYPES:
        raise ValueError(
            f"gradient_analysis_every: loss_type {loss_type!r} is not a clipped surrogate; the analysis supports "
            f"{', '.join(SURROGATE_LOSS_TYPES)} (or any loss_type with loss_agg_mode set)"
        )
    if getattr(config, "advantages_after_filter", False):
        raise ValueError(
            "gradient_analysis_every analyses the round before the SNR filter, whose advantages "
            "advantages_after_filter=True computes only after it; set advantages_after_filter=False"
        )
    if float(getattr(config, "top_entropy_quantile", 1.0)) < 1.0:
        raise ValueError(
            "gradient_analysis_every does not model top_entropy_quantile < 1 (TRL's entropy mask)"
        )
    if (
        int(getattr(config, "world_size", 1)) > 1
        or getattr(config, "fsdp", None)
        or getattr(config, "deepspeed", None)
    ):
        raise ValueError("gradient_analysis_every runs on one process, without FSDP or DeepSpeed")


__all__ = [
    "FIXED_STD_EDGES",
    "PREFIX",
    "TERMS",
    "analyse_round",
    "bucket_groups",
    "check_setup",
    "group_rows",
    "preserved_rng",
    "stashed_grads",
    "term_matrices",
]
