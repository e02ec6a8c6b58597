"""Pay for unique tokens only: one forward over a batch whose rows share prefixes, exactly.

A group's G rollouts start from the same prompt, and TRL's loss pass runs each row in full: the prompt is
encoded (and back-propagated) G times. Here the rows of a forward are laid out as a prefix tree and packed into
one flat sequence with no padding: every shared run of tokens appears once, and each token attends exactly to the
tokens that precede it in its own row. The model runs unchanged (its linear layers, norms, rotary embeddings, LoRA
adapters, gradient checkpointing and DDP hooks see an ordinary one-row batch); only the attention function is
different, and only for a call that carries a :class:`Packing`.

Layout (:func:`plan_packing`):

- rows are sorted; a *node* is a run of tokens that a set of rows shares (a trie of the rows' valid tokens, kept
  only where it saves at least ``min_saved`` token computations); each row's path from the root covers its valid
  tokens exactly once;
- a shared node stops one token short of its rows' longest common prefix: the hidden state of a node's last token
  then predicts a token that every row under it has, and each child starts with the last common token (computed
  once per child) whose hidden state predicts the child's own next token;
- position ids are the tokens' column indices in TRL's padded (B, L) layout, so rotary embeddings see exactly
  the positions of the unshared pass; or, for models whose rotary embedding is static (:func:`relative_rope`),
  counted from each row's first token, so that rows of different groups share their common system text too;
- the attention of a node's tokens: its ancestors' tokens (all visible) and its own (causal), computed per tree
  depth as one ``scaled_dot_product_attention`` call over the nodes of that depth (queries and keys gathered into
  padded rows with a boolean mask);
- the per-token outputs (log-probs, entropies, values) are gathered back to TRL's (B, logits_to_keep) layout:
  the output for token ``t`` of a row is read at the flat position of the row's token ``t - 1``.

The math is that of causal softmax attention over each row, so log-probs and gradients equal the unshared pass up
to float rounding (tests: within 1e-5 in float32). Where it could not be exact the module refuses
(:class:`PrefixSharingUnsupported`): attention backends other than ``sdpa`` (flash attention cannot take this
mask; eager and flex are not wired), sliding-window attention, logit soft-capping, attention sinks, attention
dropout in training, and model families whose attention it does not know.

PrefixGrouper (Liu et al. 2025, arXiv:2506.05433) splits attention the same way for one prefix and its suffixes;
here the split is a tree of any depth over any number of groups, reached through transformers'
``AttentionInterface`` without changing the model's attention implementation.

Generation (:func:`share_prompts`, :func:`generate_shared`): the contexts of a ``generate`` call are clustered by
common prefix; each cluster's prefix is prefilled once and its KV cache expanded to the cluster's rows.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

#: The keyword argument that carries a :class:`Packing` from the model call down to the attention function.
PACKING_KWARG = "llmgym_packing"

#: Model families whose attention module calls the attention interface with plain (q, k, v) after rotary
#: embeddings and nothing else (no position bias, no sinks, no soft-capping).
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "smollm3")

#: Attention implementations the packed layout is exact for.
SUPPORTED_ATTENTION = ("sdpa",)

#: A shared node is kept when (rows sharing it - 1) x its length is at least this many tokens.
MIN_SAVED_TOKENS = 16


class PrefixSharingUnsupported(ValueError):
    """This model or setting cannot run the shared-prefix pass exactly."""


# ------------------------------------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class AttentionLevel:
    """The nodes of one tree depth, as one batched attention call.

    ``q_index`` (R, Q) and ``k_index`` (R, K): flat positions of each node's queries and keys (padding points at
    position 0); ``mask`` (R, 1, Q, K) bool, True where a query attends a key; ``q_take`` (N,) picks the valid
    queries out of the flattened (R * Q) rows.
    """

    q_index: torch.Tensor
    k_index: torch.Tensor
    mask: torch.Tensor
    q_take: torch.Tensor


@dataclass(frozen=True)
class Packing:
    """What the attention function needs for one packed forward: the levels and the permutation that puts the
    levels' query outputs back in flat order."""

    levels: tuple[AttentionLevel, ...]
    order: torch.Tensor  # (T,) position in cat(levels' valid queries) of each flat position
    length: int

    def to(self, device: torch.device | str) -> Packing:
        levels = tuple(
            AttentionLevel(*(t.to(device) for t in (lv.q_index, lv.k_index, lv.mask, lv.q_take)))
            for lv in self.levels
        )
        return Packing(levels, self.order.to(device), self.length)


@dataclass(frozen=True)
class PackPlan:
    """One packed forward for ``B`` rows of TRL's (B, L) layout, of which the last ``C`` columns are scored.

    ``input_ids``, ``position_ids`` and ``shift_labels`` are (1, T); ``shift_labels[0, p]`` is the token whose
    log-prob position ``p`` gives (-100 where none is needed). ``src`` (B, C) is the flat position each output
    column is read from and ``valid`` (B, C) where there is one (the unshared pass gives 0 elsewhere).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    shift_labels: torch.Tensor
    packing: Packing
    src: torch.Tensor
    valid: torch.Tensor
    plain_tokens: int

    @property
    def tokens(self) -> int:
        """Tokens this forward processes."""
        return int(self.input_ids.shape[1])

    def model_inputs(self, device: torch.device | str | None = None) -> dict[str, Any]:
        """Keyword arguments of the model call: ids, positions, a 4D placeholder mask (transformers uses a 4D mask
        as given: this one has no room for any query, so a model whose attention is not ours fails loudly instead
        of attending everything), and the packing."""
        device = device if device is not None else self.input_ids.device
        return {
            "input_ids": self.input_ids.to(device),
            "position_ids": self.position_ids.to(device),
            "attention_mask": torch.zeros((1, 1, 0, 0), dtype=torch.bool, device=device),
            PACKING_KWARG: self.packing.to(device),
        }

    def gather(self, flat: torch.Tensor) -> torch.Tensor:
        """(1, T, ...) per-position values -> (B, C, ...) in TRL's layout (0 where ``valid`` is False)."""
        src, valid = self.src.to(flat.device), self.valid.to(flat.device)
        out = flat[0][src]
        shape = valid.shape + (1,) * (out.dim() - 2)
        return out * valid.view(shape).to(out.dtype)


@dataclass
class _Node:
    row: int  # a row whose tokens the node holds
    start: int  # token range [start, end) in that row's valid tokens
    end: int
    parent: _Node | None
    depth: int
    flat: int = 0  # flat position of the node's first token
    keys: list[int] = field(default_factory=list)


def _valid_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[list[int], list[list[int]]] | None:
    """Each row's first valid column and its valid tokens; None when a row's valid tokens are not one contiguous
    run (the unshared pass is the reference there)."""
    ids, mask = input_ids.tolist(), attention_mask.bool().tolist()
    starts, tokens = [], []
    for row_ids, row_mask in zip(ids, mask):
        cols = [j for j, m in enumerate(row_mask) if m]
        if cols and cols[-1] - cols[0] + 1 != len(cols):
            return None
        starts.append(cols[0] if cols else -1)
        tokens.append([row_ids[j] for j in cols])
    return starts, tokens


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def plan_packing(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    *,
    min_saved: int = MIN_SAVED_TOKENS,
    relative_positions: bool = False,
) -> PackPlan | None:
    """The packed layout of a (B, L) batch scored on its last ``logits_to_keep`` columns, or None when the layout
    is one the unshared pass must handle (a row whose valid tokens are not contiguous, or whose first scored token
    has no valid token before it: TRL scores that one from a padding position; or no valid token at all)."""
    B, L = input_ids.shape
    C = int(logits_to_keep)
    if B == 0 or not 0 < C <= L:
        return None
    rows = _valid_rows(input_ids, attention_mask)
    if rows is None:
        return None
    starts, tokens = rows
    first_scored = L - C
    for s, t in zip(starts, tokens):
        if t and s >= first_scored:
            return None

    # Sort rows so that rows sharing a prefix are adjacent. With column positions rows share only with the same
    # first column (equal position ids); with relative positions (each row counts from 0) any rows may share.
    base = [0 if relative_positions else s for s in starts]
    order = sorted((b for b in range(B) if tokens[b]), key=lambda b: (base[b], tokens[b]))
    if not order:  # every row fully masked: nothing to pack (the unshared pass gives zeros)
        return None
    adj = [_lcp(tokens[a], tokens[b]) if base[a] == base[b] else 0 for a, b in zip(order, order[1:])]
    nodes: list[_Node] = []
    leaf: dict[int, _Node] = {}

    def add(row: int, start: int, end: int, parent: _Node | None) -> _Node:
        node = _Node(row, start, end, parent, 0 if parent is None else parent.depth + 1)
        nodes.append(node)
        return node

    # Iterative version of: build(lo, hi, a, parent) over the sorted rows order[lo:hi], which share tokens [0, a)
    stack: list[tuple[int, int, int, _Node | None]] = [(0, len(order), 0, None)]
    while stack:
        lo, hi, a, parent = stack.pop()
        if hi - lo == 1:
            b = order[lo]
            leaf[b] = add(b, a, len(tokens[b]), parent)
            continue
        c = min(adj[lo : hi - 1])
        if c - 1 > a and (hi - lo - 1) * (c - 1 - a) >= min_saved:
            parent = add(order[lo], a, c - 1, parent)
            a = c - 1
        parts, s = [], lo
        for i in range(lo, hi - 1):
            if adj[i] == c:
                parts.append((s, i + 1))
                s = i + 1
        parts.append((s, hi))
        for p_lo, p_hi in reversed(parts):  # stack: keep depth-first order, parents before children
            stack.append((p_lo, p_hi, a, parent))

    # Flat layout in creation order (depth first, parents first).
    flat_ids: list[int] = []
    flat_pos: list[int] = []
    for node in nodes:
        node.flat = len(flat_ids)
        flat_ids.extend(tokens[node.row][node.start : node.end])
        flat_pos.extend(range(base[node.row] + node.start, base[node.row] + node.end))
        own = list(range(node.flat, node.flat + node.end - node.start))
        node.keys = (node.parent.keys if node.parent is not None else []) + own
    T = len(flat_ids)
    labels = [-100] * T

    # Where each scored token's log-prob is read: the flat position of the row's previous token.
    src = torch.zeros((B, C), dtype=torch.long)
    valid = torch.zeros((B, C), dtype=torch.bool)
    for b, node in leaf.items():
        path = []
        n: _Node | None = node
        while n is not None:
            path.append(n)
            n = n.parent
        path.reverse()
        flat_of: list[int] = []  # flat position of each of the row's tokens
        for n in path:
            flat_of.extend(range(n.flat, n.flat + n.end - n.start))
        toks, s0 = tokens[b], starts[b]
        for u in range(max(1, first_scored - s0), len(toks)):
            p = flat_of[u - 1]
            labels[p] = toks[u]
            src[b, s0 + u - first_scored] = p
            valid[b, s0 + u - first_scored] = True

    # One attention call per depth: queries are the node's tokens, keys its ancestors' tokens and its own.
    by_depth: dict[int, list[_Node]] = {}
    for node in nodes:
        by_depth.setdefault(node.depth, []).append(node)
    levels = []
    taken: list[int] = []
    for depth in sorted(by_depth):
        group = by_depth[depth]
        Q = max(n.end - n.start for n in group)
        K = max(len(n.keys) for n in group)
        q_index = torch.zeros((len(group), Q), dtype=torch.long)
        k_index = torch.zeros((len(group), K), dtype=torch.long)
        mask = torch.zeros((len(group), 1, Q, K), dtype=torch.bool)
        take: list[int] = []
        for r, n in enumerate(group):
            q, k = n.end - n.start, len(n.keys)
            q_index[r, :q] = torch.arange(n.flat, n.flat + q)
            k_index[r, :k] = torch.tensor(n.keys)
            mask[r, 0, :q, : k - q] = True  # ancestors: all visible
            mask[r, 0, :q, k - q : k] = torch.ones(q, q, dtype=torch.bool).tril()
            mask[r, 0, q:, 0] = True  # padding queries attend one key (no NaN); their output is dropped
            take.extend(range(r * Q, r * Q + q))
            taken.extend(range(n.flat, n.flat + q))
        levels.append(AttentionLevel(q_index, k_index, mask, torch.tensor(take, dtype=torch.long)))
    inverse = torch.empty(T, dtype=torch.long)
    inverse[torch.tensor(taken, dtype=torch.long)] = torch.arange(T)
    return PackPlan(
        input_ids=torch.tensor([flat_ids], dtype=torch.long),
        position_ids=torch.tensor([flat_pos], dtype=torch.long),
        shift_labels=torch.tensor([labels], dtype=torch.long),
        packing=Packing(tuple(levels), inverse, T),
        src=src,
        valid=valid,
        plain_tokens=B * L,
    )


# ------------------------------------------------------------------------------------------ the attention
def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    packing: Packing,
    *,
    scaling: float | None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of a packed one-row batch: ``query`` (1, H, T, d), ``key``/``value`` (1, H_kv, T, d) after rotary
    embeddings. Returns (1, T, H, d) like transformers' attention functions."""
    if dropout:
        raise PrefixSharingUnsupported(
            "attention dropout in training cannot be reproduced by the packed pass"
        )
    for name in ("sliding_window", "softcap", "s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise PrefixSharingUnsupported(f"the packed pass does not support attention with {name}")
    if query.shape[0] != 1 or query.shape[2] != packing.length:
        raise PrefixSharingUnsupported(
            f"packed attention expects one row of {packing.length} tokens, got {tuple(query.shape)}"
        )
    q_all, k_all, v_all = query[0], key[0], value[0]  # (H, T, d), (H_kv, T, d)
    H, _, d = q_all.shape
    H_kv = k_all.shape[0]
    groups = H // H_kv
    outs = []
    for lv in packing.levels:
        R, Q = lv.q_index.shape
        K = lv.k_index.shape[1]
        q = q_all[:, lv.q_index.reshape(-1)].view(H, R, Q, d).transpose(0, 1)
        k = k_all[:, lv.k_index.reshape(-1)].view(H_kv, R, K, d).transpose(0, 1)
        v = v_all[:, lv.k_index.reshape(-1)].view(H_kv, R, K, d).transpose(0, 1)
        if groups > 1:  # grouped-query attention: query head h reads key/value head h // groups
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=lv.mask, scale=scaling)  # (R, H, Q, d)
        outs.append(o.transpose(0, 1).reshape(H, R * Q, d)[:, lv.q_take])
    out = torch.cat(outs, dim=1)[:, packing.order]  # (H, T, d) in flat order
    return out.transpose(0, 1).unsqueeze(0), None


_DISPATCH_MARK = "_llmgym_prefix_dispatch"


def _register_dispatch() -> None:
    """Wrap transformers' ``sdpa`` attention function once: calls that carry a packing go to
    :func:`packed_attention`, every other call to the original function, unchanged (so other models in the process
    are not affected)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    current = ALL_ATTENTION_FUNCTIONS["sdpa"]
    if getattr(current, _DISPATCH_MARK, False):
        return
    original = current

    def sdpa_or_packed(module, query, key, value, attention_mask, *args, **kwargs):
        packing = kwargs.pop(PACKING_KWARG, None)
        if packing is None:
            return original(module, query, key, value, attention_mask, *args, **kwargs)
        return packed_attention(module, query, key, value, packing, **kwargs)

    setattr(sdpa_or_packed, _DISPATCH_MARK, True)
    AttentionInterface.register("sdpa", sdpa_or_packed)


def _configs(model: torch.nn.Module) -> list[Any]:
    seen, out = set(), []
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "model_type") and id(cfg) not in seen:
            seen.add(id(cfg))
            out.append(cfg)
    return out


def check_model(
    model: torch.nn.Module,
    *,
    feature: str = "prefix sharing",
    attention: Sequence[str] = SUPPORTED_ATTENTION,
    hint: str = "; pass --use_prefix_sharing false to train without it",
) -> None:
    """Raise :class:`PrefixSharingUnsupported` (one line, with the way out) when ``model``'s attention cannot run
    the packed pass exactly: an attention implementation other than ``sdpa``, a model family not in
    :data:`SUPPORTED_MODEL_TYPES`, sliding-window layers or attention dropout. ``feature``, ``attention`` and
    ``hint``: the same checks for another exact mechanism (the turn cache, :mod:`llm_gym.trainer.turn_cache`)."""
    for cfg in _configs(model):
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        mtype = getattr(text, "model_type", None)
        if mtype not in SUPPORTED_MODEL_TYPES:
            raise PrefixSharingUnsupported(
                f"{feature} supports model types {', '.join(SUPPORTED_MODEL_TYPES)}, not {mtype!r}{hint}"
            )
        impl = getattr(text, "_attn_implementation", None)
        if impl not in attention:
            need = " or ".join(f"{a!r}" for a in attention)
            raise PrefixSharingUnsupported(
                f"{feature} needs attn_implementation={need} (not exact with {impl!r}: it cannot apply the "
                f"attention mask this layout needs){hint}"
            )
        layer_types = getattr(text, "layer_types", None) or []
        # Mistral passes config.sliding_window to every layer (4096 by default); Qwen2/Qwen3 set it only when used
        if (
            getattr(text, "use_sliding_window", False)
            or getattr(text, "sliding_window", None) is not None
            or "sliding_attention" in layer_types
        ):
            raise PrefixSharingUnsupported(f"{feature} does not support sliding-window attention{hint}")
        if float(getattr(text, "attention_dropout", 0.0) or 0.0) > 0.0:
            raise PrefixSharingUnsupported(f"{feature} cannot reproduce attention dropout{hint}")


def enable(model: torch.nn.Module) -> None:
    """Check ``model`` (:func:`check_model`) and route packed calls to :func:`packed_attention`."""
    check_model(model)
    _register_dispatch()


# ------------------------------------------------------------------------------------------ the runner
@dataclass
class TokenCount:
    """Tokens the forwards processed, and what unshared forwards of the same rows would have processed."""

    processed: int = 0
    plain: int = 0

    def add(self, processed: int, plain: int) -> None:
        self.processed += int(processed)
        self.plain += int(plain)

    @property
    def saving(self) -> float:
        """plain / processed (1.0 before any forward)."""
        return self.plain / self.processed if self.processed else 1.0


def chunk_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    batch_size: int | None,
    relative_positions: bool = False,
    lockstep: bool = False,
) -> list[list[int]]:
    """Row chunks for forwards of at most ``batch_size`` rows' worth of tokens (``batch_size * L``, what one
    unshared chunk processes): rows sorted so that those sharing a prefix sit together, then cut greedily by their
    packed size. ``None``: one chunk. ``lockstep``: exactly as many chunks as the unshared pass (``ceil(B /
    batch_size)``, the largest split in halves), so that every process runs the same number of forwards whatever
    its rows share (sharded models gather their weights in each forward, a collective)."""
    chunks = _greedy_chunks(input_ids, attention_mask, batch_size, relative_positions)
    if lockstep and batch_size is not None:
        target = -(-input_ids.shape[0] // max(1, int(batch_size)))
        while len(chunks) < target:  # fewer than target <= B chunks: the largest has two rows or more
            i = max(range(len(chunks)), key=lambda j: len(chunks[j]))
            half = len(chunks[i]) // 2
            chunks[i : i + 1] = [chunks[i][:half], chunks[i][half:]]
    return chunks


def _greedy_chunks(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    batch_size: int | None,
    relative_positions: bool,
) -> list[list[int]]:
    B, L = input_ids.shape
    if batch_size is None or batch_size >= B:
        return [list(range(B))]
    rows = _valid_rows(input_ids, attention_mask)
    if rows is None:
        return [list(range(s, min(s + batch_size, B))) for s in range(0, B, batch_size)]
    starts, tokens = rows
    if relative_positions:
        starts = [0] * B
    order = sorted(range(B), key=lambda b: (starts[b], tokens[b]))
    budget = batch_size * L
    chunks: list[list[int]] = []
    cost, prev = 0, None
    for b in order:
        new = len(tokens[b]) - (
            _lcp(tokens[prev], tokens[b]) if prev is not None and starts[prev] == starts[b] else 0
        )
        if chunks and cost + new <= budget:
            chunks[-1].append(b)
            cost += new
        else:
            chunks.append([b])
            cost = len(tokens[b])
        prev = b
    return chunks


class PrefixSharing:
    """Runs forwards of TRL-layout batches through packed plans and keeps the token count.

    ``min_saved`` is the plan's node threshold (:data:`MIN_SAVED_TOKENS`). :attr:`tokens` counts every packed
    forward; :attr:`last` holds the latest call's ``(rows, plan)`` chunks so that values captured by a hook during
    that call can be mapped to TRL's layout (:meth:`unpack`).
    """

    def __init__(
        self, min_saved: int = MIN_SAVED_TOKENS, relative_positions: bool = False, lockstep: bool = False
    ):
        self.min_saved = int(min_saved)
        #: Several processes: chunked forwards keep the unshared pass's count (:func:`chunk_rows`).
        self.lockstep = bool(lockstep)
        #: Count positions from each row's first token, so rows of different groups share their common system
        #: text and instructions too (:func:`plan_packing`); only for models whose positions are relative.
        self.relative_positions = bool(relative_positions)
        #: Loss-pass forwards (log-probs, entropies, values).
        self.tokens = TokenCount()
        #: Generation prefill (prompts and later turns' contexts).
        self.generation = TokenCount()
        self.last: list[tuple[list[int], PackPlan]] | None = None

    def plans(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
    ) -> list[tuple[list[int], PackPlan]] | None:
        """``(rows, plan)`` chunks covering every row once, or None when the batch's layout needs the unshared
        pass (:func:`plan_packing`)."""
        out = []
        for rows in chunk_rows(
            input_ids, attention_mask, batch_size, self.relative_positions, lockstep=self.lockstep
        ):
            index = torch.tensor(rows, dtype=torch.long, device=input_ids.device)
            plan = plan_packing(
                input_ids.index_select(0, index).cpu(),
                attention_mask.index_select(0, index).cpu(),
                logits_to_keep,
                min_saved=self.min_saved,
                relative_positions=self.relative_positions,
            )
            if plan is None:
                return None
            out.append((rows, plan))
        return out

    def run(
        self,
        forward: Callable[[PackPlan], torch.Tensor],
        chunks: list[tuple[list[int], PackPlan]],
        batch_size: int,
    ) -> torch.Tensor:
        """``forward(plan)`` -> (1, T, ...) per-position values for each chunk, gathered to (B, C, ...) in the
        original row order."""
        parts, rows_all = [], []
        for rows, plan in chunks:
            parts.append(plan.gather(forward(plan)))
            rows_all.extend(rows)
            self.tokens.add(plan.tokens, plan.plain_tokens)
        self.last = chunks
        out = torch.cat(parts, dim=0)
        if rows_all != list(range(batch_size)):
            index = torch.empty(batch_size, dtype=torch.long)
            index[torch.tensor(rows_all, dtype=torch.long)] = torch.arange(batch_size)
            out = out[index.to(out.device)]
        return out

    def unpack(self, captured: list[torch.Tensor]) -> torch.Tensor:
        """Per-position tensors a hook captured during the latest :meth:`run` (one (1, T, ...) per chunk, in
        order) -> (B, C, ...) in TRL's layout: the value at token ``t``'s column is the one at the position of the
        row's token ``t - 1`` (the state before the token)."""
        if self.last is None or len(captured) != len(self.last):
            raise RuntimeError(
                f"captured {len(captured)} packed forwards, the latest call ran "
                f"{0 if self.last is None else len(self.last)}"
            )
        parts, rows_all = [], []
        for (rows, plan), flat in zip(self.last, captured):
            parts.append(plan.gather(flat))
            rows_all.extend(rows)
        out = torch.cat(parts, dim=0)
        index = torch.empty(len(rows_all), dtype=torch.long)
        index[torch.tensor(rows_all, dtype=torch.long)] = torch.arange(len(rows_all))
        return out[index.to(out.device)]


def per_token_logps(
    sharing: PrefixSharing,
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    *,
    batch_size: int | None = None,
    compute_entropy: bool = False,
    autocast: Callable[[], Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """TRL's per-token log-probs (and entropies) of the last ``logits_to_keep`` tokens of each row, through packed
    forwards of a model patched with TRL's fused LM head (``model(..., shift_labels=..., fused_lm_head=True)``).
    Returns None when the layout needs the unshared pass."""
    chunks = sharing.plans(input_ids, attention_mask, logits_to_keep, batch_size)
    if chunks is None:
        return None
    device = input_ids.device

    def forward(plan: PackPlan) -> torch.Tensor:
        with autocast() if autocast is not None else contextlib.nullcontext():
            out = model(
                **plan.model_inputs(device), shift_labels=plan.shift_labels.to(device), fused_lm_head=True
            )
        if compute_entropy:
            return torch.stack([out.log_probs, out.entropy], dim=-1)
        return out.log_probs

    res = sharing.run(forward, chunks, input_ids.shape[0])
    if compute_entropy:
        return res[..., 0], res[..., 1]
    return res, None


__all__ = [
    "MIN_SAVED_TOKENS",
    "PACKING_KWARG",
    "SUPPORTED_ATTENTION",
    "SUPPORTED_MODEL_TYPES",
    "AttentionLevel",
    "PackPlan",
    "Packing",
    "PrefixSharing",
    "PrefixSharingUnsupported",
    "PromptSharing",
    "TokenCount",
    "check_model",
    "chunk_rows",
    "enable",
    "from_setting",
    "cache_kwarg",
    "generate_shared",
    "generate_shared_with_cache",
    "group_order",
    "packed_attention",
    "per_token_logps",
    "plan_packing",
    "relative_rope",
    "share_prompts",
    "summary_line",
    "vllm_prefix_caching",
]


def group_order(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """A row permutation that replaces TRL's row shuffle before a round is split into micro-batches: the groups
    (rows with the same prompt) in random order (the global torch generator, as TRL's shuffle), each group's rows
    together, so that a micro-batch holds whole groups, or consecutive rows of one group, and shares their prompt."""
    ids, mask = prompt_ids.tolist(), prompt_mask.bool().tolist()
    keys = [tuple(t for t, m in zip(r, k) if m) for r, k in zip(ids, mask)]
    first: dict[tuple[int, ...], int] = {}
    for key in keys:
        first.setdefault(key, len(first))
    rank = torch.randperm(len(first)).tolist()
    return torch.tensor(sorted(range(len(keys)), key=lambda b: (rank[first[keys[b]]], b)), dtype=torch.long)


# ------------------------------------------------------------------------------------------ generation
@dataclass(frozen=True)
class PromptSharing:
    """How a batch of generation contexts shares its prompts: ``prefixes`` (the distinct shared prefixes, prefilled
    once each), ``row_prefix`` (which prefix each row continues) and ``suffixes`` (each row's remaining tokens, at
    least one: generation needs the last token's logits per row)."""

    prefixes: list[list[int]]
    row_prefix: list[int]
    suffixes: list[list[int]]

    @property
    def shares(self) -> bool:
        """Whether some prefix serves two or more rows."""
        return len(self.prefixes) < len(self.suffixes)

    def tokens(self) -> tuple[int, int]:
        """(prefill tokens with sharing, without): padded widths, as a batched forward computes them."""
        width_p = max(len(p) for p in self.prefixes)
        width_s = max(len(s) for s in self.suffixes)
        plain = max(len(self.prefixes[i]) + len(s) for i, s in zip(self.row_prefix, self.suffixes))
        n = len(self.suffixes)
        return len(self.prefixes) * width_p + n * width_s, n * plain


def share_prompts(
    contexts: Sequence[Sequence[int]], min_shared: int = MIN_SAVED_TOKENS
) -> PromptSharing | None:
    """Cluster generation contexts by shared prefix: the contexts are sorted and cut into consecutive clusters that
    maximise the tokens saved, sum over clusters of (rows - 1) x common prefix (a cluster shares its rows' common
    prefix, minus at least the last token of its shortest row; a common prefix under ``min_shared`` tokens is not
    shared). So a round's groups each share their whole prompt, or all rows share the system text, whichever
    saves more. None when a context has fewer than two tokens."""
    if not contexts or any(len(c) < 2 for c in contexts):
        return None
    order = sorted(range(len(contexts)), key=lambda i: list(contexts[i]))
    n = len(order)
    adj = [_lcp(contexts[order[i]], contexts[order[i + 1]]) for i in range(n - 1)]
    lengths = [len(contexts[i]) for i in order]

    def shared(lo: int, hi: int) -> int:  # tokens the cluster order[lo:hi] prefills once
        if hi - lo < 2:
            return 0
        k = min(min(adj[lo : hi - 1]), min(lengths[lo:hi]) - 1)
        return k if k >= min_shared else 0

    # best[j]: the most tokens saved by clusters covering order[:j]; cut[j]: where its last cluster starts
    best = [0] * (n + 1)
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        best[j], cut[j] = best[j - 1], j - 1
        k = None
        for i in range(j - 2, -1, -1):  # cluster order[i:j]; its common prefix only shrinks as i decreases
            k = adj[i] if k is None else min(k, adj[i])
            if k < min_shared:
                break
            gain = best[i] + (j - i - 1) * shared(i, j)
            if gain > best[j]:
                best[j], cut[j] = gain, i
    clusters: list[list[int]] = []
    j = n
    while j > 0:
        clusters.append(order[cut[j] : j])
        j = cut[j]
    clusters.reverse()
    prefixes: list[list[int]] = []
    row_prefix = [0] * n
    suffixes: list[list[int]] = [[] for _ in contexts]
    for members in clusters:
        k = min(len(contexts[i]) for i in members) - 1
        first = list(contexts[members[0]])
        for i in members[1:]:
            k = min(k, _lcp(first, contexts[i]))
        prefixes.append(first[:k])
        for i in members:
            row_prefix[i] = len(prefixes) - 1
            suffixes[i] = list(contexts[i][k:])
    return PromptSharing(prefixes, row_prefix, suffixes)


def cache_kwarg() -> str:
    """transformers renamed ``past_key_values`` to ``cache`` (argument and output field) during 5.x."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def generate_shared(
    model: Any, sharing: PromptSharing, generation_config: Any, pad_id: int, device: Any
) -> torch.Tensor:
    """``model.generate`` continuing each row from its prefix's KV cache: the distinct prefixes are prefilled once
    (left-padded, position ids counted over real tokens as ``generate`` counts them), the cache is expanded to the
    rows, and ``generate`` runs the rows' suffixes (left-padded after the prefix) and samples. Returns the new
    tokens (rows, new). The sampled distribution is the unshared one: same positions, same attended tokens."""
    return generate_shared_with_cache(model, sharing, generation_config, pad_id, device)[0]


def generate_shared_with_cache(
    model: Any, sharing: PromptSharing, generation_config: Any, pad_id: int, device: Any
) -> tuple[torch.Tensor, Any, torch.Tensor]:
    """:func:`generate_shared`, also returning the KV cache ``generate`` finished with and the (rows, width)
    attention mask of its input (the columns of each row's context in that cache), so that the next turn can
    continue from it (:mod:`llm_gym.trainer.turn_cache`)."""
    name = cache_kwarg()
    wp = max(len(p) for p in sharing.prefixes)
    ws = max(len(s) for s in sharing.suffixes)
    pid = torch.full((len(sharing.prefixes), wp), pad_id, dtype=torch.long)
    pmask = torch.zeros_like(pid)
    for i, p in enumerate(sharing.prefixes):
        pid[i, wp - len(p) :] = torch.tensor(p, dtype=torch.long)
        pmask[i, wp - len(p) :] = 1
    sid = torch.full((len(sharing.suffixes), ws), pad_id, dtype=torch.long)
    smask = torch.zeros_like(sid)
    for i, s in enumerate(sharing.suffixes):
        sid[i, ws - len(s) :] = torch.tensor(s, dtype=torch.long)
        smask[i, ws - len(s) :] = 1
    rows = torch.tensor(sharing.row_prefix, dtype=torch.long)
    pid, pmask = pid.to(device), pmask.to(device)
    with torch.no_grad():
        out = model(
            input_ids=pid,
            attention_mask=pmask,
            position_ids=(pmask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
        )
        cache = getattr(out, name)
        cache.batch_select_indices(rows.to(device))
        ids = torch.cat([pid[rows.to(device)], sid.to(device)], dim=1)
        attn = torch.cat([pmask[rows.to(device)], smask.to(device)], dim=1)
        gen = model.generate(
            input_ids=ids, attention_mask=attn, generation_config=generation_config, **{name: cache}
        )
    return gen[:, wp + ws :], cache, attn


def vllm_prefix_caching(vllm_generation: Any) -> bool | None:
    """Whether TRL's colocated vLLM engine caches prompt prefixes (vLLM's automatic prefix caching, on by default
    in its V1 engine; TRL passes no setting): the vLLM counterpart of prefix-shared generation. None when it cannot
    be read (server mode: the server's ``--enable-prefix-caching`` decides)."""
    engine = getattr(getattr(vllm_generation, "llm", None), "llm_engine", None)
    for owner in (engine, getattr(engine, "vllm_config", None)):
        cache_config = getattr(owner, "cache_config", None)
        value = getattr(cache_config, "enable_prefix_caching", None)
        if value is not None:
            return bool(value)
    return None


def summary_line(sharing: PrefixSharing) -> str:
    """The run summary's line: tokens the shared-prefix forwards processed vs what plain forwards would have."""
    parts = []
    for name, count in (("loss pass", sharing.tokens), ("generation prefill", sharing.generation)):
        if count.processed:
            parts.append(
                f"{name} {count.processed:,} tokens vs {count.plain:,} plain ({count.saving:.2f}x fewer)"
            )
    return "prefix sharing: " + ("; ".join(parts) if parts else "no forward ran")


def from_setting(
    setting: bool | None, model: torch.nn.Module, *, lockstep: bool = False
) -> PrefixSharing | None:
    """The trainer's :class:`PrefixSharing` for the config's ``use_prefix_sharing``: ``False`` -> None; ``True`` ->
    on, or :class:`PrefixSharingUnsupported`; ``None`` (default) -> on where :func:`check_model` allows it, else None
    with one log line saying why. ``lockstep``: several processes train together (:func:`chunk_rows`)."""
    if setting is False:
        return None
    try:
        enable(model)
    except PrefixSharingUnsupported as e:
        if setting:
            raise
        logger.warning("prefix sharing is off: %s", str(e).split(";")[0])
        return None
    return PrefixSharing(relative_positions=relative_rope(model), lockstep=lockstep)


#: Rotary-embedding types whose angles depend only on the position (not on the sequence length): attention then
#: depends only on the distance between positions, so a row may count its positions from 0.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def relative_rope(model: torch.nn.Module) -> bool:
    """Whether every config in ``model`` uses a static rotary embedding (:data:`STATIC_ROPE_TYPES`)."""
    for cfg in _configs(model):
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
        rope_type = (
            params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else None
        )
        if rope_type not in STATIC_ROPE_TYPES:
            return False
    return True
