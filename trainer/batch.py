"""The scored generation batch (TRL's ``_generate_and_score_completions`` output): pure functions on its rows.

A batch is a dict of tensors whose first dimension is the sample (row) axis: ``prompt_ids``/``prompt_mask``
(B, P), ``completion_ids``/``completion_mask`` (B, C), an optional ``tool_mask`` (B, C) that is 0 on tokens the
environment contributed, ``advantages`` (B,) or (B, T), plus 0-d tensors such as ``num_items_in_batch``.

:func:`loss_mask` is the one definition of which tokens carry loss; the row operations serve the SNR filter
(``filter_drop="remove"`` / ``"mask"``) and keep every per-row tensor (including ones a trainer hook added, such
as PPO's returns) aligned with its row.
"""

from __future__ import annotations

import torch


def _gather(batch: dict, index: torch.Tensor, n: int) -> dict:
    """Rows ``index`` of every tensor or list whose first dimension is the ``n`` rows; other values pass through."""
    out: dict = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == n:
            out[key] = value[index.to(value.device)]
        elif isinstance(value, list) and len(value) == n:
            out[key] = [value[i] for i in index.tolist()]
        else:
            out[key] = value
    return out


def loss_mask(batch: dict) -> torch.Tensor:
    """Tokens that carry loss: ``completion_mask * tool_mask``; a missing (or ``None``) ``tool_mask`` is all ones."""
    mask = batch["completion_mask"]
    tool = batch.get("tool_mask")
    return mask if tool is None else mask * tool


# Keys whose first dimension is not the sample axis (images are packed per image/patch).
_NON_ROW_KEYS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "spatial_shapes", "image_sizes")


def select_rows(batch: dict, keep: torch.Tensor, multiple: int = 1) -> tuple[dict, int]:
    """Physically keep only the rows of ``batch`` where ``keep`` is True.

    Every tensor (or list) whose first dimension is the batch size is row-selected, 0-d tensors
    (``num_items_in_batch``) pass through. The result has ``max(multiple, ceil(kept/multiple) *
    multiple)`` rows so TRL's ``split_tensor_dict`` into ``multiple`` micro-batches neither drops
    rows nor produces an empty one; padding rows copy a kept row (or row 0 when nothing is kept)
    with ``tool_mask`` and ``advantages`` zeroed, so they add no loss and no gradient.
    Returns ``(new_batch, num_padding_rows)``. ``num_items_in_batch`` is NOT recomputed here.
    """
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    present = [k for k in _NON_ROW_KEYS if batch.get(k) is not None]
    if present:
        raise ValueError(
            f"row removal does not support multimodal batches (found {present}); use filter_drop='mask'"
        )
    n = batch["completion_ids"].shape[0]
    keep = torch.as_tensor(keep, dtype=torch.bool).reshape(-1).cpu()
    if keep.numel() != n:
        raise ValueError(f"keep mask has {keep.numel()} entries for a batch of {n} rows")
    kept = torch.nonzero(keep).reshape(-1)
    target = max(multiple, -(-kept.numel() // multiple) * multiple)
    n_pad = target - kept.numel()
    src = kept[:1] if kept.numel() else torch.zeros(1, dtype=torch.long)
    index = torch.cat([kept, src.repeat(n_pad)])
    out = _gather(batch, index, n)
    if n_pad:
        if out.get("tool_mask") is None:
            out["tool_mask"] = torch.ones_like(out["completion_mask"])
        else:
            out["tool_mask"] = out["tool_mask"].clone()
        out["tool_mask"][kept.numel() :] = 0
        out["advantages"] = out["advantages"].clone()
        out["advantages"][kept.numel() :] = 0
    return out, n_pad


def select_rows_copy(
    batch: dict, keep: torch.Tensor, target: int, generator: torch.Generator
) -> tuple[dict, int]:
    """Keep the rows where ``keep`` is True, then add random copies of kept rows until there are ``target``.

    RAGEN's ``adjust_batch(mode="copy")`` (``ragen/trainer/agent_trainer.py``): the copies are real samples that
    count in the loss (drawn without replacement while there are enough kept rows). With no kept row the padding
    is masked instead (:func:`select_rows`), so nothing is learned. Returns ``(batch, copies)``.
    """
    keep = torch.as_tensor(keep, dtype=torch.bool).reshape(-1).cpu()
    kept = torch.nonzero(keep).reshape(-1)
    if target < kept.numel():
        raise ValueError(f"target {target} is below the {kept.numel()} kept rows")
    if kept.numel() == 0:
        return select_rows(batch, keep, multiple=max(target, 1))
    to_add = target - kept.numel()
    if to_add <= kept.numel():
        extra = kept[torch.randperm(kept.numel(), generator=generator)[:to_add]]
    else:
        extra = kept[torch.randint(kept.numel(), (to_add,), generator=generator)]
    index = torch.cat([kept, extra])
    present = [k for k in _NON_ROW_KEYS if batch.get(k) is not None]
    if present:
        raise ValueError(f"row copies do not support multimodal batches (found {present})")
    n = batch["completion_ids"].shape[0]
    if keep.numel() != n:
        raise ValueError(f"keep mask has {keep.numel()} entries for a batch of {n} rows")
    return _gather(batch, index, n), to_add


def take_rows(batch: dict, index: torch.Tensor) -> dict:
    """The rows ``index`` of ``batch`` in that order (every tensor or list whose first dimension is the row axis);
    0-d tensors and other values pass through."""
    present = [k for k in _NON_ROW_KEYS if batch.get(k) is not None]
    if present:
        raise ValueError(f"row reordering does not support multimodal batches (found {present})")
    n = batch["completion_ids"].shape[0]
    index = torch.as_tensor(index, dtype=torch.long).reshape(-1).cpu()
    return _gather(batch, index, n)


def empty_micro_batch(batch: dict) -> dict:
    """A one-row micro-batch of the same keys that carries no loss: one prompt and one completion token, every
    mask and advantage zero. Stands in for an optimizer step that takes no update (cheap forward/backward)."""
    n = batch["completion_ids"].shape[0]
    out: dict = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.ndim >= 1 and n and value.shape[0] == n:
            v = value[:1]
            if key in ("prompt_ids", "prompt_mask"):
                v = v[:, -1:]
            elif v.ndim >= 2 and v.shape[1] == batch["completion_ids"].shape[1]:
                v = v[:, :1]
            out[key] = v.clone()
        elif isinstance(value, list) and len(value) == n:
            out[key] = value[:1]
        else:
            out[key] = value
    out["completion_mask"] = torch.zeros_like(out["completion_mask"])
    out["tool_mask"] = torch.zeros_like(out["completion_mask"])
    out["advantages"] = torch.zeros_like(out["advantages"])
    return out


def split_micro_batches(batch: dict, size: int, count: int) -> tuple[list[dict], int]:
    """``count`` micro-batches: consecutive ``size``-row slices of ``batch``, then empty ones
    (:func:`empty_micro_batch`) for the remainder. Returns ``(micro_batches, number_of_real_ones)``."""
    n = batch["completion_ids"].shape[0]
    if size < 1 or n % size:
        raise ValueError(f"{n} rows do not split into micro-batches of {size}")
    real = min(n // size, count)
    if n // size > count:
        raise ValueError(
            f"{n} rows need {n // size} micro-batches of {size}, more than the {count} available"
        )
    chunks = []
    for i in range(real):
        chunk: dict = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == n:
                chunk[key] = value[i * size : (i + 1) * size]
            elif isinstance(value, list) and len(value) == n:
                chunk[key] = value[i * size : (i + 1) * size]
            else:
                chunk[key] = value
        chunks.append(chunk)
    if real < count:
        chunks += [empty_micro_batch(batch)] * (count - real)
    return chunks, real


def mask_rows(batch: dict, keep: torch.Tensor) -> dict:
    """Soft drop: zero the loss mask and advantages of dropped rows, keeping every shape.

    Costs the full forward/backward; kept for multimodal batches and as the benchmark reference.
    """
    keep = torch.as_tensor(keep, dtype=torch.bool).reshape(-1)
    out = dict(batch)
    cm = out["completion_mask"]
    tm = out.get("tool_mask")
    tm = torch.ones_like(cm) if tm is None else tm
    out["tool_mask"] = tm * keep.to(tm.device, tm.dtype).unsqueeze(1)
    adv = out["advantages"]
    k = keep.to(adv.device, adv.dtype)
    out["advantages"] = adv * (k.unsqueeze(1) if adv.ndim == 2 else k)
    return out


def trim_completion_columns(batch: dict) -> tuple[dict, int]:
    """Drop trailing completion columns that are padding in every remaining row.

    Completions are right-padded to the longest one in the original batch; once long trajectories
    are filtered out that width is wasted compute. Causal attention means earlier positions never see
    later ones, so trimming does not change any kept token's log-prob. Every tensor whose second
    dimension is the completion width is cut, except the prompt tensors. Returns ``(batch, removed)``.
    """
    cm = batch["completion_mask"]
    width = cm.shape[1]
    used = torch.nonzero(cm.any(dim=0)).reshape(-1)
    keep = int(used[-1]) + 1 if used.numel() else 1
    if keep >= width:
        return batch, 0
    out = dict(batch)
    for key, value in batch.items():
        if key in ("prompt_ids", "prompt_mask"):
            continue
        if isinstance(value, torch.Tensor) and value.ndim >= 2 and value.shape[1] == width:
            out[key] = value[:, :keep]
    return out, width - keep


def episode_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """One reward per sample: the weighted sum over reward functions, skipping NaN terms; NaN where every
    function returned NaN (``None``), i.e. an unscorable sample, as TRL's ``GRPOTrainer`` treats it.

    Args:
        rewards_per_func: (N, F) or (N,) rewards, NaN where a function returned ``None``.
        weights: (F,) reward weights; ``None`` = all ones.

    Returns a float32 (N,) tensor on the input's device. This is the one reduction of the trainer: the SNR
    filter (NaN rows leave their group's variance) and PPO's GAE (NaN rows get no advantage) both use it.
    """
    r = torch.as_tensor(rewards_per_func).float()
    if r.ndim == 1:
        r = r[:, None]
    if r.ndim != 2:
        raise ValueError(f"rewards_per_func must be 1-D or 2-D, got shape {tuple(r.shape)}")
    w = torch.ones(r.shape[1]) if weights is None else torch.as_tensor(weights).float().reshape(-1)
    if w.numel() != r.shape[1]:
        raise ValueError(f"{w.numel()} weights for {r.shape[1]} reward functions")
    unscorable = torch.isnan(r).all(dim=1)
    total = (r * w.to(r.device).unsqueeze(0)).nansum(dim=1)
    total[unscorable] = torch.nan
    return total


def constant_group_rows(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) bool: rows whose group's scorable rewards are all equal (or all unscorable).

    ``rewards`` is the gathered (B,) episode reward in TRL's order (groups of ``group_size`` consecutive rows,
    NaN for an unscorable sample). Such a group carries no signal, but TRL's float32 group mean of identical
    values can miss them by an ulp, and dividing by ``std + 1e-4`` turns that into advantages of ~1e-4 that
    AdamW then follows at full step size.
    """
    groups = rewards.detach().double().view(-1, group_size)
    finite = ~torch.isnan(groups)
    hi = torch.where(finite, groups, torch.full_like(groups, -torch.inf)).amax(dim=1)
    lo = torch.where(finite, groups, torch.full_like(groups, torch.inf)).amin(dim=1)
    constant = (hi == lo) | ~finite.any(dim=1)
    return constant.repeat_interleave(group_size)
