"""SNR-aware group filtering (RAGEN-2): pure functions from per-group rewards to the groups kept.

A group is the G rollouts of one prompt (one env seed). Its score is the spread of its episode
rewards; groups with little spread carry little task gradient and mostly regulariser noise, so the
filter keeps the high-spread groups and skips the update when nothing carries signal.

Strategies (``select_groups``):

* ``top_p``: RAGEN-2's rule. Sort scores descending and keep the smallest prefix whose cumulative
  score reaches ``value * total - eps``; when ``value * total <= eps`` the batch is rejected.
  ``eps`` is in reward units, the unit of RAGEN's std score: :func:`decide` squares it for the variance
  score (see :func:`metric_eps`), so a small reward scale does not reject groups that carry signal.
* ``top_k``: keep ``max(1, floor(value * num_groups))`` best groups.
* ``min_p``: keep groups with ``score >= value * max_score``.
* ``softmax_top_p``: nucleus cut on ``softmax(scores)`` (RAGEN ``ragen/trainer/rollout_filter.py``
  ``top_p_prob_mode=softmax``, the rule RAGEN-2's main table ran, with the std score and zero groups
  included); ``value >= 1`` keeps every candidate, as RAGEN does.
* ``upstream_top_p``: the rule RAGEN's authors proposed to TRL, veRL and SkyRL (huggingface/trl#7242,
  verl-project/verl#7894, NovaSky-AI/SkyRL#2217; :func:`upstream_top_p`): linear top-p over the reward
  *variance* mass, ``eps`` in variance units as given (not squared), no special case at ``value = 1``,
  and a group counts as zero only at exactly 0. Variance score only.
* ``off``: keep every group, never skip.

With ``include_zero=False`` zero-score groups are never candidates, so an all-zero batch is
skipped by every strategy except ``off``. Ties are broken by group index (earlier first), so the
result is deterministic. ``ddof`` sets the variance's delta degrees of freedom (1: unbiased, RAGEN's std and
the upstream rule's default).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llm_gym.core.checks import is_int

STRATEGIES = ("top_p", "top_k", "min_p", "softmax_top_p", "upstream_top_p", "off")
METRICS = ("variance", "std")
ZERO_TOL = 1e-10  # a group score at or below this counts as zero signal (RAGEN uses the same bound)


def group_scores(
    rewards: np.ndarray, num_generations: int, metric: str = "variance", ddof: int = 1
) -> np.ndarray:
    """Per-group spread of rewards laid out group-contiguously (``num_groups * G`` samples).

    The sample variance (``metric="variance"``, the paper) or its square root (``"std"``, RAGEN's code), with
    ``ddof`` delta degrees of freedom (1: unbiased). NaN rewards (unscorable samples) are left out of their
    group; a group with at most ``ddof`` finite rewards (and always one with fewer than two) scores 0 (no
    signal). Infinite rewards raise.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if not is_int(ddof) or ddof < 0:
        raise ValueError(f"ddof must be an integer >= 0, got {ddof!r}")
    if num_generations < 2:
        raise ValueError(f"num_generations must be >= 2 to measure a group's spread, got {num_generations}")
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if r.size % num_generations:
        raise ValueError(f"{r.size} rewards is not a multiple of num_generations={num_generations}")
    if np.isinf(r).any():
        raise ValueError("rewards contain inf; a finite reward (or NaN for unscorable) is required")
    groups = r.reshape(-1, num_generations)
    finite = ~np.isnan(groups)
    n = finite.sum(axis=1)
    safe = np.where(finite, groups, 0.0)
    mean = safe.sum(axis=1) / np.maximum(n, 1)
    sq = (np.where(finite, groups - mean[:, None], 0.0) ** 2).sum(axis=1)
    var = np.where((n >= 2) & (n > ddof), sq / np.maximum(n - ddof, 1), 0.0)
    return np.sqrt(var) if metric == "std" else var


def metric_eps(eps: float, metric: str) -> float:
    """The top_p slack ``eps`` (given in reward units, like RAGEN's std score) in the units of ``metric``.

    RAGEN's absolute slack 0.01 was made for the std; on the variance (reward units squared) the same number
    rejects whole batches whose rewards are small (std 0.1 -> variance 0.01 <= 0.01 / 0.9). Squaring keeps the
    slack at the same reward scale for both metrics.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    return float(eps) ** 2 if metric == "variance" else float(eps)


def upstream_top_p(
    variances: np.ndarray, top_p: float, include_zero: bool = False, selection_eps: float = 0.01
) -> np.ndarray:
    """Keep-mask of the reward-variance top-p rule RAGEN's authors proposed upstream (huggingface/trl#7242,
    verl-project/verl#7894, NovaSky-AI/SkyRL#2217), from the PRs' stated rule.

    Candidates are the groups with a variance above exactly 0 (every group with ``include_zero``). With
    ``target = top_p * total_variance - selection_eps`` (``selection_eps`` in variance units), an empty mask when
    ``target <= 0`` or no group is a candidate; otherwise the candidates sorted by variance, descending and
    stable (ties: lower index first), up to and including the first whose cumulative variance reaches
    ``target`` (all of them if none does). The PRs apply the mask to the loss instead of removing the rows.
    """
    v = np.asarray(variances, dtype=np.float64).reshape(-1)
    keep = np.zeros(v.size, dtype=bool)
    cand = np.arange(v.size) if include_zero else np.flatnonzero(v > 0.0)
    target = top_p * v.sum() - selection_eps
    if cand.size == 0 or not target > 0.0:
        return keep
    order = cand[np.argsort(-v[cand], kind="stable")]
    k = int(np.searchsorted(np.cumsum(v[order]), target, side="left")) + 1
    keep[order[: min(k, order.size)]] = True
    return keep


def _order(scores: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Candidate indices sorted by score descending, ties by index ascending."""
    return idx[np.lexsort((idx, -scores[idx]))]


def select_groups(
    scores: np.ndarray,
    strategy: str = "top_p",
    value: float = 0.9,
    include_zero: bool = False,
    eps: float = 0.01,
) -> np.ndarray:
    """Boolean keep-mask over groups. An all-False mask means: skip this update."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    validate_filter(strategy, value, eps)
    if np.isnan(s).any() or (s < 0).any():
        raise ValueError("group scores must be finite and non-negative")
    keep = np.zeros(s.size, dtype=bool)
    if strategy == "off":
        keep[:] = True
        return keep
    if strategy == "upstream_top_p":
        return upstream_top_p(s, value, include_zero, eps)
    cand = np.arange(s.size) if include_zero else np.flatnonzero(s > ZERO_TOL)
    if cand.size == 0:
        return keep
    order = _order(s, cand)
    if strategy == "top_p":
        if value >= 1.0:  # rho = 1 means no filtering (RAGEN-2, Sec. 4); eps would drop the smallest groups
            keep[cand] = True
            return keep
        total = s[cand].sum()
        if value * total <= eps:
            return keep  # the threshold cannot be reached: no signal in this batch
        cum = np.cumsum(s[order])
        k = int(np.searchsorted(cum, value * total - eps, side="left")) + 1
        keep[order[: min(k, order.size)]] = True
    elif strategy == "top_k":
        k = max(1, int(np.floor(value * s.size + 1e-9)))
        keep[order[:k]] = True
    elif strategy == "min_p":
        keep[cand[s[cand] >= value * s[cand].max() - ZERO_TOL]] = True
    elif strategy == "softmax_top_p":
        if value >= 1.0:  # RAGEN returns every candidate at top_p >= 1 (its "no filter" runs)
            keep[cand] = True
            return keep
        z = s[order] - s[order].max()
        probs = np.exp(z) / np.exp(z).sum()
        k = int(np.searchsorted(np.cumsum(probs), value - 1e-12, side="left")) + 1
        keep[order[: min(k, order.size)]] = True
    return keep


def validate_filter(strategy: str, value: float, eps: float) -> None:
    """Raise ValueError for an unknown strategy or an out-of-range value."""
    if strategy not in STRATEGIES:
        raise ValueError(f"filter strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "off":
        return
    if strategy == "min_p":
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"min_p filter value must be in [0, 1], got {value}")
    elif not 0.0 < value <= 1.0:
        raise ValueError(f"{strategy} filter value must be in (0, 1], got {value}")
    if not eps >= 0.0:
        raise ValueError(f"filter eps must be >= 0, got {eps}")


def variance_spread(variances: np.ndarray) -> tuple[float, float]:
    """``(std, std / mean)`` of one batch's per-group reward variances: Std(RV)/Mean(RV), RAGEN-2's predictor of
    whether filtering helps (Table 8: 1.16 and 1.29 where the filter helped, 0.33 where it hurt; a high ratio means
    a bimodal RV). Over every group, zero-variance ones included; the std is the population one (ddof 0) across
    groups. ``(nan, nan)`` for no group; the ratio is NaN when the mean is zero (no group carries signal)."""
    v = np.asarray(variances, dtype=np.float64).reshape(-1)
    if v.size == 0:
        return float("nan"), float("nan")
    mean, std = float(v.mean()), float(v.std())
    return std, (std / mean if mean > ZERO_TOL else float("nan"))


def loss_scale(kept_ratio: float, mode: str) -> float:
    """Advantage multiplier for the kept-group ratio: ``none`` 1, ``linear`` ratio, ``sqrt`` sqrt(ratio)."""
    if mode == "none":
        return 1.0
    if mode == "linear":
        return float(kept_ratio)
    if mode == "sqrt":
        return float(np.sqrt(kept_ratio))
    raise ValueError(f"loss scaling must be none, linear or sqrt, got {mode!r}")


@dataclass(frozen=True)
class FilterDecision:
    """What the filter decided for one generation batch."""

    keep_groups: np.ndarray  # (num_groups,) bool
    scores: np.ndarray  # (num_groups,) the ranking statistic
    variances: np.ndarray  # (num_groups,) reward variance (with ddof), for logging

    @property
    def skip(self) -> bool:
        return not bool(self.keep_groups.any())

    @property
    def kept_frac(self) -> float:
        return float(self.keep_groups.mean()) if self.keep_groups.size else 0.0

    def keep_rows(self, num_generations: int) -> np.ndarray:
        """Per-sample keep mask (groups are contiguous)."""
        return np.repeat(self.keep_groups, num_generations)


def decide(
    rewards: np.ndarray,
    num_generations: int,
    strategy: str = "top_p",
    value: float = 0.9,
    include_zero: bool = False,
    eps: float = 0.01,
    metric: str = "variance",
    ddof: int = 1,
) -> FilterDecision:
    """Score the groups of one batch of episode rewards and select the ones to train on.

    ``eps`` is the top_p slack in reward units, converted to the metric's units (:func:`metric_eps`); for
    ``upstream_top_p`` it is the PRs' ``selection_eps``, in variance units as given.
    """
    if strategy == "upstream_top_p" and metric != "variance":
        raise ValueError(
            "filter strategy 'upstream_top_p' ranks groups by the reward variance; use metric 'variance'"
        )
    variances = group_scores(rewards, num_generations, "variance", ddof)
    scores = variances if metric == "variance" else group_scores(rewards, num_generations, metric, ddof)
    slack = eps if strategy == "upstream_top_p" else metric_eps(eps, metric)
    keep = select_groups(scores, strategy, value, include_zero, slack)
    return FilterDecision(keep_groups=keep, scores=scores, variances=variances)
