"""Mutual-information collapse metrics (RAGEN-2): in-batch cross-scoring of reasoning under prompts.

Template collapse is reasoning whose entropy stays high while it stops depending on the input:
H(Z|X) high, I(X;Z) low. Entropy alone cannot see it, so we score every sampled reasoning Z_i
under every prompt X_j of the batch with the current policy,

    L[i, j] = log p(Z_i | X_j)      (sum over Z_i's tokens, teacher forced),

and ask how well Z_i identifies its own prompt. Three layers, each usable alone:

* ``mi_from_scores``: pure math on the matrix L (retrieval accuracy, MI estimates, z-scores, entropies).
* ``reasoning_span`` / ``sample_first_turn`` / ``sample_trajectory``: which (X, Z) pairs to score.
* ``cross_score``: fills L with any ``logps_fn`` (the trainer passes TRL's per-token log-prob function).

Per-token marginal: we follow RAGEN's code, ``marginal_i = logmeanexp_j(L[i, j] / |Z_i|)``, by
default (``marginal="code"``); the paper's ``logmeanexp_j(L[i, j]) / |Z_i|`` is ``marginal="paper"``.
The code form is a contrastive bound on per-token scores that stays in [0, log M] whatever the
reasoning length, which is the scale of every MI number RAGEN-2 published; the paper form shrinks
as 1/|Z| and is exactly the sequence estimate divided by length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

RECALL_KS = (2, 4, 8)
MARGINALS = ("code", "paper")


@dataclass
class EmaState:
    """Running EMA of the marginal std (token and sequence level), one per metric namespace."""

    token: float | None = None
    seq: float | None = None


def _logmeanexp(x: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return (np.log(np.mean(np.exp(x - m), axis=axis)) + np.squeeze(m, axis=axis)).astype(np.float64)


def _hit_probability(row: np.ndarray, is_target: np.ndarray, k: int) -> float:
    """P(some target column is in the top-k) when ties are broken uniformly at random."""
    best = row[is_target].max()
    above = int((row[~is_target] > best).sum())
    if above >= k:
        return 0.0
    slots = k - above
    tied_target = int((row[is_target] == best).sum())
    tied_other = int((row[~is_target] == best).sum())
    if slots > tied_other:
        return 1.0
    return 1.0 - math.comb(tied_other, slots) / math.comb(tied_other + tied_target, slots)


def _chance(num_columns: int, num_target: int, k: int) -> float:
    """P(some target column is in k uniformly drawn columns)."""
    if k >= num_columns:
        return 1.0
    return 1.0 - math.comb(num_columns - num_target, k) / math.comb(num_columns, k)


def mi_from_scores(
    scores: np.ndarray,
    lengths: np.ndarray,
    target: np.ndarray,
    column_class: np.ndarray | None = None,
    *,
    marginal: str = "code",
    std_eps: float = 1e-3,
    ema: EmaState | None = None,
    ema_decay: float = 0.9,
    ks: Sequence[int] = RECALL_KS,
) -> dict[str, float]:
    """MI proxies from a cross-score matrix.

    Args:
        scores: (N, M) ``L[i, j] = log p(Z_i | X_j)``, summed over Z_i's tokens.
        lengths: (N,) token count of each Z_i (> 0).
        target: (N,) column index of Z_i's own prompt.
        column_class: (M,) equivalence id per column; columns with the same id have identical
            prompts, so retrieving any of them counts as correct. Default: all distinct.
        marginal: ``"code"`` (RAGEN code) or ``"paper"`` per-token marginal, see module docstring.
        std_eps, ema, ema_decay: z-score denominator ``sigma + eps``; ``ema`` (updated in place)
            tracks sigma across calls, starting from the first observed value.
        ks: Recall@k cut-offs; those >= M are skipped (trivially 1).

    Returns an empty dict when M < 2 (nothing to retrieve). Keys: ``retrieval_acc``,
    ``retrieval_chance``, ``retrieval_above_chance``, ``recall@k`` and ``recall@k_chance``,
    ``mi_est``, ``mi_seq_est``, ``mi_zscore``, ``mi_zscore_ema``, ``mi_seq_zscore``,
    ``mi_seq_zscore_ema``, ``cond_entropy``, ``marginal_entropy`` (per token, nats),
    ``matched_logp``, ``marginal_logp``, ``marginal_std``, ``marginal_std_ema``, ``mi_upper_bound``
    (log M), ``num_samples``, ``num_columns``.
    """
    L = np.asarray(scores, dtype=np.float64)
    if L.ndim != 2:
        raise ValueError(f"scores must be a 2-D (samples x columns) matrix, got shape {L.shape}")
    n, m = L.shape
    lengths = np.asarray(lengths, dtype=np.float64).reshape(-1)
    target = np.asarray(target, dtype=np.int64).reshape(-1)
    cls = np.arange(m) if column_class is None else np.asarray(column_class).reshape(-1)
    if lengths.shape != (n,) or target.shape != (n,) or cls.shape != (m,):
        raise ValueError(
            f"shape mismatch: scores {L.shape}, lengths {lengths.shape}, target {target.shape}, "
            f"column_class {cls.shape}"
        )
    if marginal not in MARGINALS:
        raise ValueError(f"marginal must be one of {MARGINALS}, got {marginal!r}")
    if n == 0 or m < 2:
        return {}
    if (lengths <= 0).any():
        raise ValueError("every reasoning must have at least one token")
    if ((target < 0) | (target >= m)).any():
        raise ValueError("target column index out of range")
    if np.isnan(L).any() or np.isposinf(L).any():
        raise ValueError("scores must be log-probabilities (no NaN or +inf)")

    rows = np.arange(n)
    matched_seq = L[rows, target]
    marginal_seq = _logmeanexp(L, axis=1)
    matched = matched_seq / lengths
    if marginal == "code":
        marg = _logmeanexp(L / lengths[:, None], axis=1)
    else:
        marg = marginal_seq / lengths
    diff, diff_seq = matched - marg, matched_seq - marginal_seq
    sigma, sigma_seq = float(marg.std()), float(marginal_seq.std())  # population std, as RAGEN

    if ema is None:
        ema = EmaState()
    ema.token = sigma if ema.token is None else ema_decay * ema.token + (1 - ema_decay) * sigma
    ema.seq = sigma_seq if ema.seq is None else ema_decay * ema.seq + (1 - ema_decay) * sigma_seq

    is_target = cls[None, :] == cls[target][:, None]  # (N, M)
    class_size = is_target.sum(axis=1)
    out: dict[str, float] = {
        "retrieval_acc": float(np.mean([_hit_probability(L[i], is_target[i], 1) for i in rows])),
        "retrieval_chance": float(np.mean(class_size / m)),
    }
    out["retrieval_above_chance"] = out["retrieval_acc"] - out["retrieval_chance"]
    for k in ks:
        if k < m:
            out[f"recall@{k}"] = float(np.mean([_hit_probability(L[i], is_target[i], k) for i in rows]))
            out[f"recall@{k}_chance"] = float(np.mean([_chance(m, int(c), k) for c in class_size]))
    out.update(
        mi_est=float(diff.mean()),
        mi_seq_est=float(diff_seq.mean()),
        mi_zscore=float((diff / (sigma + std_eps)).mean()),
        mi_zscore_ema=float((diff / (ema.token + std_eps)).mean()),
        mi_seq_zscore=float((diff_seq / (sigma_seq + std_eps)).mean()),
        mi_seq_zscore_ema=float((diff_seq / (ema.seq + std_eps)).mean()),
        cond_entropy=float(-matched.mean()),
        marginal_entropy=float(-marg.mean()),
        matched_logp=float(matched.mean()),
        marginal_logp=float(marg.mean()),
        marginal_std=sigma,
        marginal_std_ema=float(ema.token),
        mi_upper_bound=math.log(m),
        num_samples=float(n),
        num_columns=float(m),
    )
    return out


# --------------------------------------------------------------------------- which pairs to score


def reasoning_span(token_texts: Sequence[str], mode: str = "think") -> tuple[int, int] | None:
    """Token range [a, b) of a turn's reasoning, relative to the turn; None if there is none.

    ``mode="think"``: the tokens lying fully between ``<think>`` and ``</think>`` (tags excluded; a
    missing opener means the opener was in the prompt, so reasoning starts at the turn start). A
    turn without ``</think>`` has no reasoning. ``mode="turn"``: the whole turn (envs without
    thinking, or tests with random models).
    """
    if mode == "turn":
        return (0, len(token_texts)) if len(token_texts) else None
    if mode != "think":
        raise ValueError(f"reasoning mode must be 'think' or 'turn', got {mode!r}")
    starts, pos = [], 0
    for t in token_texts:
        starts.append(pos)
        pos += len(t)
    text = "".join(token_texts)
    close = text.find("</think>")
    if close < 0:
        return None
    opener = text.rfind("<think>", 0, close)
    begin = opener + len("<think>") if opener >= 0 else 0
    inside = [i for i, s in enumerate(starts) if s >= begin and s + len(token_texts[i]) <= close]
    if not inside:
        return None
    return inside[0], inside[-1] + 1


@dataclass
class Episode:
    """One local sample: unpadded prompt ids, completion ids, the model-token span of each turn,
    the reasoning span (absolute in completion ids) of each turn or None, and its group."""

    prompt_ids: list[int]
    completion_ids: list[int]
    reasoning: list[tuple[int, int] | None]
    group: int


@dataclass
class PairSet:
    """Inputs of one cross-scoring: rows (Z), columns (X), targets and column classes."""

    contexts: list[list[int]]
    reasonings: list[list[int]]
    target: np.ndarray
    column_class: np.ndarray
    num_total: int
    num_valid: int


def _classes(contexts: list[list[int]]) -> np.ndarray:
    seen: dict[tuple[int, ...], int] = {}
    return np.array([seen.setdefault(tuple(c), len(seen)) for c in contexts], dtype=np.int64)


def _span(ep: Episode, turn: int) -> tuple[int, int]:
    span = ep.reasoning[turn]
    assert span is not None  # the samplers only pick turns with reasoning
    return span


def _context(ep: Episode, turn: int) -> list[int]:
    a, _ = _span(ep, turn)
    return ep.prompt_ids + ep.completion_ids[:a]


def _reason(ep: Episode, turn: int) -> list[int]:
    a, b = _span(ep, turn)
    return ep.completion_ids[a:b]


def sample_first_turn(episodes: Sequence[Episode], num_samples: int, rng: np.random.Generator) -> PairSet:
    """First-turn pairs: up to ``num_samples`` episodes with first-turn reasoning, drawn without
    replacement; one column per group (its first sampled episode's context)."""
    valid = [i for i, ep in enumerate(episodes) if ep.reasoning and ep.reasoning[0] is not None]
    pick = sorted(rng.choice(len(valid), size=min(num_samples, len(valid)), replace=False).tolist())
    chosen = [episodes[valid[i]] for i in pick]
    col_of_group: dict[int, int] = {}
    contexts: list[list[int]] = []
    for ep in chosen:
        if ep.group not in col_of_group:
            col_of_group[ep.group] = len(contexts)
            contexts.append(_context(ep, 0))
    return PairSet(
        contexts=contexts,
        reasonings=[_reason(ep, 0) for ep in chosen],
        target=np.array([col_of_group[ep.group] for ep in chosen], dtype=np.int64),
        column_class=_classes(contexts),
        num_total=len(episodes),
        num_valid=len(valid),
    )


def sample_trajectory(episodes: Sequence[Episode], num_samples: int, rng: np.random.Generator) -> PairSet:
    """Trajectory pairs: ``num_samples`` draws (with replacement) of an episode uniformly, then one
    of its turns with reasoning uniformly; each draw is its own column (X = everything before it)."""
    valid = [i for i, ep in enumerate(episodes) if any(r is not None for r in ep.reasoning)]
    contexts, reasonings = [], []
    if valid:
        for e in rng.integers(0, len(valid), size=num_samples):
            ep = episodes[valid[int(e)]]
            turns = [t for t, r in enumerate(ep.reasoning) if r is not None]
            t = turns[int(rng.integers(0, len(turns)))]
            contexts.append(_context(ep, t))
            reasonings.append(_reason(ep, t))
    return PairSet(
        contexts=contexts,
        reasonings=reasonings,
        target=np.arange(len(contexts), dtype=np.int64),
        column_class=_classes(contexts),
        num_total=len(episodes),
        num_valid=len(valid),
    )


# --------------------------------------------------------------------------- the policy scorer

LogpsFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def num_chunks(num_pairs: int, batch_size: int) -> int:
    """Forward passes ``cross_score`` makes for ``num_pairs`` pairs."""
    return -(-num_pairs // batch_size)


@torch.no_grad()
def cross_score(
    logps_fn: LogpsFn,
    contexts: Sequence[Sequence[int]],
    reasonings: Sequence[Sequence[int]],
    *,
    pad_id: int,
    device: torch.device | str = "cpu",
    batch_size: int = 32,
    min_chunks: int = 0,
) -> np.ndarray:
    """``L[i, j] = sum_t log p(reasonings[i]_t | contexts[j], reasonings[i]_<t)`` for all pairs.

    Sequences are laid out as TRL lays out training rows: context left-padded, reasoning
    right-padded, concatenated. ``logps_fn(input_ids, attention_mask, logits_to_keep)`` returns the
    per-token log-probs of the last ``logits_to_keep`` positions. Pairs are length-sorted to cut
    padding. ``min_chunks`` adds dummy forward passes so every process runs the same number
    (sharded models deadlock otherwise).
    """
    n, m = len(reasonings), len(contexts)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    pairs = [(i, j) for i in range(n) for j in range(m)]
    pairs.sort(key=lambda p: len(contexts[p[1]]) + len(reasonings[p[0]]))
    scores = np.zeros((n, m), dtype=np.float64)
    chunks: list[list[tuple[int, int]] | None] = [
        pairs[s : s + batch_size] for s in range(0, len(pairs), batch_size)
    ]
    dummy = [(0, 0)] if n and m else None
    while len(chunks) < min_chunks:
        chunks.append(None)
    for chunk in chunks:
        if chunk is None:
            if dummy is None:
                ids = torch.full((1, 2), pad_id, dtype=torch.long, device=device)
                logps_fn(ids, torch.ones_like(ids), 1)
                continue
            chunk, real = dummy, False
        else:
            real = True
        cmax = max(len(contexts[j]) for _, j in chunk)
        zmax = max(len(reasonings[i]) for i, _ in chunk)
        ids = torch.full((len(chunk), cmax + zmax), pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        zmask = torch.zeros((len(chunk), zmax), dtype=torch.float32)
        for r, (i, j) in enumerate(chunk):
            c, z = contexts[j], reasonings[i]
            ids[r, cmax - len(c) : cmax] = torch.tensor(c, dtype=torch.long)
            ids[r, cmax : cmax + len(z)] = torch.tensor(z, dtype=torch.long)
            attn[r, cmax - len(c) : cmax + len(z)] = 1
            zmask[r, : len(z)] = 1
        logps = logps_fn(ids.to(device), attn.to(device), zmax).float().cpu()
        if real:
            seq = (logps * zmask).sum(-1)
            for r, (i, j) in enumerate(chunk):
                scores[i, j] = float(seq[r])
    return scores


def _cache_name() -> str:
    """transformers renamed ``past_key_values`` to ``cache`` (argument and output field) during 5.x."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


_CACHE = _cache_name()


@torch.no_grad()
def cross_score_cached(
    model: torch.nn.Module,
    contexts: Sequence[Sequence[int]],
    reasonings: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    pad_id: int = 0,
    device: torch.device | str = "cpu",
    batch_size: int = 32,
    min_forwards: int = 0,
) -> tuple[np.ndarray, int]:
    """Same matrix as ``cross_score``, but each context is encoded once and its KV cache reused for
    every reasoning: ``M * |X| + N * M * |Z|`` tokens instead of ``N * M * (|X| + |Z|)``, a large
    saving when contexts (whole trajectories) are much longer than reasoning.

    Calls ``model`` directly (a causal LM returning ``logits`` and ``past_key_values``); logits are
    divided by ``temperature`` as TRL does. Returns ``(scores, forwards)``; ``min_forwards`` pads with
    dummy forwards so every process runs the same number.
    """
    import copy

    n, m = len(reasonings), len(contexts)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scores = np.zeros((n, m), dtype=np.float64)
    order = sorted(range(n), key=lambda i: len(reasonings[i]))
    forwards = 0
    for j, ctx in enumerate(contexts):
        if not n:
            break
        if not len(ctx):
            raise ValueError("every context must have at least one token")
        x = torch.tensor([list(ctx)], dtype=torch.long, device=device)
        out = model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=True)
        prefix: Any = getattr(out, _CACHE, None)
        forwards += 1
        first = torch.log_softmax(out.logits[0, -1].float() / temperature, -1).cpu()
        for s in range(0, n, batch_size):
            rows = order[s : s + batch_size]
            zmax = max(len(reasonings[i]) for i in rows)
            z = torch.full((len(rows), zmax), pad_id, dtype=torch.long)
            zmask = torch.zeros((len(rows), zmax), dtype=torch.float32)
            for r, i in enumerate(rows):
                z[r, : len(reasonings[i])] = torch.tensor(list(reasonings[i]), dtype=torch.long)
                zmask[r, : len(reasonings[i])] = 1
            seq = first[z[:, 0]].double()
            if zmax > 1:
                cache = copy.deepcopy(prefix)
                cache.batch_repeat_interleave(len(rows))
                attn = torch.cat([torch.ones(len(rows), len(ctx)), zmask], 1).long().to(device)
                pos = torch.arange(len(ctx), len(ctx) + zmax, device=device).expand(len(rows), -1)
                logits = model(
                    input_ids=z.to(device),
                    attention_mask=attn,
                    position_ids=pos,
                    **{_CACHE: cache},
                    use_cache=True,
                ).logits[:, :-1]
                forwards += 1
                lp = torch.log_softmax(logits.float() / temperature, -1).gather(-1, z[:, 1:, None].to(device))
                seq = seq + (lp.squeeze(-1).cpu().double() * zmask[:, 1:]).sum(-1)
            for r, i in enumerate(rows):
                scores[i, j] = float(seq[r])
    while forwards < min_forwards:
        ids = torch.full((1, 1), pad_id, dtype=torch.long, device=device)
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
        forwards += 1
    return scores, forwards


def cached_forwards(contexts: Sequence[Sequence[int]], num_reasonings: int, batch_size: int) -> int:
    """Upper bound of the forwards ``cross_score_cached`` makes (for lockstep padding)."""
    if not num_reasonings:
        return 0
    return len(contexts) * (1 + num_chunks(num_reasonings, batch_size))
