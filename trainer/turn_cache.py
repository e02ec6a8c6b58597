"""Pay for each token once per episode: carry every live episode's KV cache from one turn to the next, exactly.

Multi-turn rollouts call HF ``generate`` once per turn on the contexts of the live episodes. Without a cache
carried across turns, every call prefills each episode's whole history again: the prompt, every earlier reply and
every earlier observation. Here the KV cache that ``generate`` finished a turn with is kept, and the next turn's
call continues from it: each row prefills only the tokens its episode added since (the rest of its reply, the
next observation and its chat-template tokens).

How a turn runs (:func:`generate_continued`):

- each new context is matched to the carried row whose tokens share its longest prefix (:func:`match_rows`); a
  row's carried tokens are its previous context plus the tokens it generated whose keys and values are in the
  cache. Matching by tokens, not by bookkeeping, makes a wrong reuse impossible: a carried entry is used only for
  the very tokens it was computed from, at the same positions;
- the matched rows' cache columns are gathered into a fresh left-padded cache (:func:`gather_layers`), and
  ``generate`` gets ``[cached tokens | new tokens]`` (each part left-padded) with the attention mask over both, so
  that it prefills only the new part. Position ids are counted over the mask's real tokens, as ``generate``
  counts them for a plain left-padded batch: every token keeps the position it has in the plain batch. When the
  rows' new parts differ so much in length that left padding would add more than :data:`MAX_PADDING` of their
  tokens (an observation with a warning line beside one without), they are first fed in forwards over buckets of
  similar length (:func:`prefill_rows`), and ``generate`` prefills one token a row;
- the cache ``generate`` finished with becomes the next turn's carried state (:func:`carried_from`), unless it is
  over the memory budget: then the next turn re-prefills (today's path), and the choice is logged.

The first turn is today's path (prefix-shared generation, :func:`~llm_gym.trainer.prefix_sharing.generate_shared`,
when it shares: a group's prompt prefilled once and forked to its members), and its cache is carried on.

Exactness: every attention score is that of the plain batched call (the same tokens at the same positions; padding
masked out), so the logits agree to float rounding and, with the same seed, ``generate`` samples the same tokens
(the same number of rows and steps draw the same random numbers). Tests check every step's logits. Where that
cannot hold the turn cache is refused (:func:`check_model`): sliding-window attention (its cache drops tokens),
attention dropout, attention implementations other than ``sdpa`` / ``eager``, model families whose cache or
positions are not the plain ones; and per call (:func:`config_obstacle`) generation settings that read the
padded input ids (a repetition penalty) or bring their own cache class.

The carried state lives for one rollout round (one :func:`~llm_gym.trainer.rollouts.play_token_episodes` call)
and never outlives a weight update: the round releases it at its end. A row whose episode ended is not gathered
into the next turn's cache, so its memory goes with the previous turn's cache.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from llm_gym.trainer import prefix_sharing
from llm_gym.trainer.defaults import TURN_CACHE_BUDGET_MIB

logger = logging.getLogger(__name__)

#: Attention implementations whose masked attention over a padded cache is the plain batch's.
SUPPORTED_ATTENTION = ("sdpa", "eager")

_HINT = "; pass --use_turn_cache false to generate without it"


class TurnCacheUnsupported(ValueError):
    """This model or setting cannot carry the KV cache across turns exactly."""


# ------------------------------------------------------------------------------------------ pure pieces
def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists (slice comparisons run in C)."""
    a, b = list(a), list(b)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def match_rows(carried: Sequence[Sequence[int]], contexts: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """For each context, ``(row, usable)``: the carried row whose tokens share the longest prefix with it and how
    many of its cached tokens the context can use (that prefix, less at least the context's last token, whose
    logits ``generate`` must compute); ``(-1, 0)`` when none shares a token. Several contexts may use one row.

    The longest common prefix with any of a sorted set of sequences is reached at a neighbour of the query's
    insertion point, so each context costs one binary search and two prefix comparisons."""
    order = sorted(range(len(carried)), key=lambda i: list(carried[i]))
    keys = [list(carried[i]) for i in order]
    out: list[tuple[int, int]] = []
    for context in contexts:
        c = list(context)
        j = bisect.bisect_left(keys, c)
        best = (-1, 0)
        for k in (j - 1, j):
            if 0 <= k < len(keys):
                usable = min(common_prefix(keys[k], c), len(c) - 1)
                if usable > best[1]:
                    best = (order[k], usable)
        out.append(best)
    return out


@dataclass(frozen=True)
class Carried:
    """The KV cache one ``generate`` call finished with, and what each of its rows holds.

    ``layers``: per model layer the (keys, values) tensors, each (rows, kv heads, columns, head dim);
    ``tokens[r]``: the tokens of row ``r`` whose keys and values are in the cache, in order; ``columns[r]``: the
    cache column of each of them (padding columns hold nothing of use)."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    tokens: list[list[int]]
    columns: list[list[int]]

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)

    def drop_layer(self, layer: int) -> None:
        """Free one layer's tensors (the state is then used up: only :attr:`tokens` and :attr:`columns` stay)."""
        k, v = self.layers[layer]
        self.layers[layer] = (k.new_zeros((0,)), v.new_zeros((0,)))


def carried_from(
    layers: list[tuple[torch.Tensor, torch.Tensor]],
    attention_mask: torch.Tensor,
    contexts: Sequence[Sequence[int]],
    fed_ids: torch.Tensor,
) -> Carried | None:
    """What a call that read ``attention_mask`` (rows, width: 1 on each row's context tokens, in order) and then fed
    ``fed_ids`` (rows, F: the sampled tokens ``generate`` fed back, all but the last it sampled) leaves in its
    cache: each row's context at its masked columns, then its fed tokens. None when the cache does not have that
    shape (a cache class or a ``generate`` that does not keep every fed token)."""
    rows, width = attention_mask.shape
    expected = width + int(fed_ids.shape[1])
    for k, v in layers:
        if k.dim() != 4 or k.shape[0] != rows or k.shape[2] != expected or v.shape[:3] != k.shape[:3]:
            return None
    mask = attention_mask.bool().tolist()
    fed = fed_ids.tolist()
    tokens, columns = [], []
    for r in range(rows):
        cols = [j for j, m in enumerate(mask[r]) if m]
        if len(cols) != len(contexts[r]):
            return None
        tokens.append(list(contexts[r]) + fed[r])
        columns.append(cols + list(range(width, expected)))
    return Carried(layers, tokens, columns)


def gather_layers(
    carried: Carried, matches: Sequence[tuple[int, int]], width: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A left-padded (rows, kv heads, ``width``, head dim) cache per layer: row ``j`` holds the first ``usable``
    cached tokens of carried row ``matches[j] = (row, usable)`` in its last ``usable`` columns (padding columns
    hold copies of some cached entry; the attention mask hides them)."""
    return gather_from([carried], [(0, row, usable) for row, usable in matches], width)


def gather_from(
    sources: Sequence[Carried], picks: Sequence[tuple[int, int, int]], width: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`gather_layers` over several carried caches: row ``j`` holds the first ``usable`` cached tokens of row
    ``row`` of ``sources[source]``, for ``picks[j] = (source, row, usable)``."""
    return list(iter_gathered(sources, picks, width))


def iter_gathered(
    sources: Sequence[Carried], picks: Sequence[tuple[int, int, int]], width: int, *, consume: bool = False
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`gather_from`, one layer at a time; ``consume``: each source layer is dropped once gathered, so that
    old and new caches never both stay whole in memory (:meth:`Carried.drop_layer`)."""
    plans = []
    for s, src in enumerate(sources):
        dest = [j for j, (source, row, usable) in enumerate(picks) if source == s and row >= 0 and usable > 0]
        if not dest:
            continue
        index_rows = torch.tensor([picks[j][1] for j in dest], dtype=torch.long)
        index_cols = torch.zeros((len(dest), width), dtype=torch.long)
        for i, j in enumerate(dest):
            _, row, usable = picks[j]
            index_cols[i, width - usable :] = torch.tensor(src.columns[row][:usable], dtype=torch.long)
        plans.append((src, torch.tensor(dest, dtype=torch.long), index_rows[:, None], index_cols))
    for layer, (k0, v0) in enumerate(sources[0].layers):
        k_out = k0.new_zeros((len(picks), k0.shape[1], width, k0.shape[3]))
        v_out = v0.new_zeros((len(picks), v0.shape[1], width, v0.shape[3]))
        for src, at, r, c in plans:
            k, v = src.layers[layer]
            dev = k.device
            # k[r, :, c] is (rows, width, heads, dim): advanced indices first, then the sliced heads and dim
            k_out[at.to(dev)] = k[r.to(dev), :, c.to(dev)].transpose(1, 2)
            v_out[at.to(dev)] = v[r.to(dev), :, c.to(dev)].transpose(1, 2)
        if consume:
            for src in sources:
                src.drop_layer(layer)
        yield k_out, v_out


def prefill_buckets(lengths: Sequence[int], max_padding: float) -> list[list[int]]:
    """Rows (indices into ``lengths``, those with tokens to prefill) grouped into forwards so that left padding
    adds at most ``max_padding`` of the real tokens: sorted by length, the groups are split where a split saves the
    most padding until the bound holds (or every group has one length)."""
    rows = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: lengths[i])
    if not rows:
        return []
    real = sum(lengths[i] for i in rows)

    def cost(group: list[int]) -> int:  # rows x the longest (sorted: the last)
        return len(group) * lengths[group[-1]]

    buckets = [rows]
    while sum(cost(b) for b in buckets) > (1 + max_padding) * real:
        best: tuple[int, int, int] | None = None
        for bi, b in enumerate(buckets):
            for k in range(1, len(b)):
                if lengths[b[k - 1]] != lengths[b[k]]:
                    saved = cost(b) - cost(b[:k]) - cost(b[k:])
                    if best is None or saved > best[0]:
                        best = (saved, bi, k)
        if best is None:
            break
        _, bi, k = best
        buckets[bi : bi + 1] = [buckets[bi][:k], buckets[bi][k:]]
    return buckets


def continued_inputs(
    contexts: Sequence[Sequence[int]], matches: Sequence[tuple[int, int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """``generate``'s input for rows continuing from ``matches``: ``[cached tokens | new tokens]``, each part
    left-padded (to W = the most cached tokens, and S = the most new ones), and its attention mask. Returns (ids,
    mask, W, S)."""
    usable = [u for _, u in matches]
    W = max(usable, default=0)
    S = max(len(c) - u for c, u in zip(contexts, usable))
    ids = torch.full((len(contexts), W + S), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for j, (c, u) in enumerate(zip(contexts, usable)):
        c = list(c)
        if u:
            ids[j, W - u : W] = torch.tensor(c[:u], dtype=torch.long)
            mask[j, W - u : W] = 1
        ids[j, W + S - (len(c) - u) :] = torch.tensor(c[u:], dtype=torch.long)
        mask[j, W + S - (len(c) - u) :] = 1
    return ids, mask, W, S


def config_obstacle(generation_config: Any) -> str | None:
    """Why a carried cache cannot be used with this generation config (None: it can): a repetition penalty or
    n-gram ban reads the padded input ids, whose padding differs between the two layouts; a config that picks its
    own cache class or turns the cache off cannot be handed one."""
    penalty = getattr(generation_config, "repetition_penalty", None)
    if penalty is not None and float(penalty) != 1.0:
        return f"repetition_penalty={penalty} reads the padded input ids"
    if getattr(generation_config, "no_repeat_ngram_size", None):
        return "no_repeat_ngram_size reads the padded input ids"
    impl = getattr(generation_config, "cache_implementation", None)
    if impl is not None:
        return f"cache_implementation={impl!r} brings its own cache"
    if getattr(generation_config, "use_cache", True) is False:
        return "use_cache=False"
    return None


# ------------------------------------------------------------------------------------------ the model side
def check_model(model: torch.nn.Module) -> None:
    """Raise :class:`TurnCacheUnsupported` (one line, with the way out) when ``model``'s cache cannot be carried
    exactly: attention other than ``sdpa`` / ``eager``, sliding windows (their cache drops tokens), attention
    dropout, or a model family outside :data:`~llm_gym.trainer.prefix_sharing.SUPPORTED_MODEL_TYPES` (plain
    rotary positions counted from the attention mask, a plain ``DynamicCache``)."""
    try:
        prefix_sharing.check_model(model, feature="the turn cache", attention=SUPPORTED_ATTENTION, hint=_HINT)
    except prefix_sharing.PrefixSharingUnsupported as e:
        raise TurnCacheUnsupported(str(e)) from None


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The (keys, values) of every layer of a transformers ``DynamicCache`` made of plain ``DynamicLayer`` layers
    (public attributes), or None for any other cache (sliding-window, quantised, offloaded, linear layers)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        return None
    out = []
    for layer in cache.layers:
        if type(layer) is not DynamicLayer or layer.keys is None or layer.values is None:
            return None
        out.append((layer.keys, layer.values))
    return out


def new_cache(layers: Iterable[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
    """A transformers ``DynamicCache`` holding ``layers`` (or empty), filled one layer at a time through its public
    ``update`` (which copies each; a generator's previous layer is freed meanwhile)."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(layers or ()):
        cache.update(k, v, i)
    return cache


def prefill_rows(
    model: Any,
    contexts: Sequence[Sequence[int]],
    carried: Carried | None,
    matches: Sequence[tuple[int, int]],
    pad_id: int,
    device: Any,
    max_padding: float,
) -> tuple[list[Carried], list[tuple[int, int, int]], int]:
    """Feed each row's uncached tokens but its last into its cache, one forward per bucket of rows of similar length
    (:func:`prefill_buckets`), so that padding stays within ``max_padding``. Position ids are counted over the
    attention mask's real tokens, as ``generate`` counts them. Returns the caches (``carried`` first, then one per
    bucket), each context's ``(source, row, usable)`` in them (every token but the last cached), and the tokens
    the forwards processed."""
    sources: list[Carried] = [carried] if carried is not None else []
    picks = [(0, row, usable) if carried is not None else (0, -1, 0) for row, usable in matches]
    counts = [len(c) - u - 1 for c, (_, u) in zip(contexts, matches)]
    processed = 0
    for bucket in prefill_buckets(counts, max_padding):
        sub = [list(contexts[j])[: matches[j][1] + counts[j]] for j in bucket]
        sub_matches = [matches[j] for j in bucket]
        ids, mask, W, S = continued_inputs(sub, sub_matches, pad_id)
        cache = new_cache(gather_layers(carried, sub_matches, W) if carried is not None and W > 0 else None)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            model(
                input_ids=ids[:, W:].to(device),
                attention_mask=mask.to(device),
                position_ids=positions[:, W:].to(device),
                use_cache=True,
                logits_to_keep=1,
                **{prefix_sharing.cache_kwarg(): cache},
            )
        layers = cache_layers(cache)
        part = carried_from(layers, mask, sub, ids[:, :0]) if layers else None
        if part is None:
            raise TurnCacheUnsupported(f"the model's cache ({type(cache).__name__}) cannot be extended")
        processed += len(bucket) * S
        sources.append(part)
        for i, j in enumerate(bucket):
            picks[j] = (len(sources) - 1, i, len(contexts[j]) - 1)
    return sources, picks, processed


#: Left padding a later turn's prefill may add, as a fraction of its real tokens, before its rows are prefilled
#: in forwards over buckets of similar length (one extra forward each) instead of inside ``generate``.
MAX_PADDING = 0.05


def generate_continued(
    model: Any,
    contexts: Sequence[Sequence[int]],
    carried: Carried | None,
    generation_config: Any,
    pad_id: int,
    device: Any,
    max_padding: float = MAX_PADDING,
) -> tuple[torch.Tensor, Any, torch.Tensor, int]:
    """``model.generate`` on ``contexts``, continuing each from the carried row that shares most of its tokens
    (:func:`match_rows`; none: prefilled from its first token, the plain path). When ``generate``'s left-padded
    prefill of the new tokens would add more than ``max_padding`` of padding, they are first fed in buckets of
    similar length (:func:`prefill_rows`) and ``generate`` prefills one token a row. Returns (new tokens (rows,
    N), the cache ``generate`` finished with, the attention mask of its input, prefill tokens processed)."""
    matches = match_rows(carried.tokens, contexts) if carried is not None else [(-1, 0)] * len(contexts)
    new = [len(c) - u for c, (_, u) in zip(contexts, matches)]
    prefilled = 0
    if len(contexts) * max(new) > (1 + max_padding) * sum(new) and max(new) > 1:
        sources, picks, prefilled = prefill_rows(
            model, contexts, carried, matches, pad_id, device, max_padding
        )
        matches = [(j, len(c) - 1) for j, c in enumerate(contexts)]
        ids, mask, W, S = continued_inputs(contexts, matches, pad_id)
        cache = new_cache(iter_gathered(sources, picks, W, consume=True))
    else:
        ids, mask, W, S = continued_inputs(contexts, matches, pad_id)
        picks = [(0, row, usable) for row, usable in matches]
        gathered = iter_gathered([carried], picks, W, consume=True) if carried is not None and W > 0 else None
        cache = new_cache(gathered)
    with torch.no_grad():
        gen = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            generation_config=generation_config,
            **{prefix_sharing.cache_kwarg(): cache},
        )
    return gen[:, W + S :], cache, mask, prefilled + len(contexts) * S


# ------------------------------------------------------------------------------------------ the run's state
@dataclass
class TurnCacheStats:
    """Generation prefill tokens (padded widths, what the forwards compute) with the turn cache, with today's path
    (prefix-shared generation where it shares, else plain) and plain; turns whose cache went over the budget."""

    prefill: int = 0
    today: int = 0
    plain: int = 0
    over_budget: int = 0
    peak_mib: float = 0.0

    def add(self, prefill: int, today: int, plain: int) -> None:
        self.prefill += int(prefill)
        self.today += int(today)
        self.plain += int(plain)


class TurnCache:
    """The trainer's setting and counts; each rollout round carries its own state (:class:`TurnSession`)."""

    def __init__(self, budget_mib: float = TURN_CACHE_BUDGET_MIB):
        if not budget_mib >= 0:
            raise ValueError(f"turn_cache_budget_mib must be >= 0, got {budget_mib!r}")
        self.budget_mib = float(budget_mib)
        self.stats = TurnCacheStats()
        self._warned: set[str] = set()

    def note(self, reason: str, level: int = logging.WARNING) -> None:
        """Log why a turn did not continue from its cache: the first time at ``level``, later ones at debug."""
        first = reason not in self._warned
        self._warned.add(reason)
        logger.log(level if first else logging.DEBUG, "turn cache: %s", reason)


class TurnSession:
    """One rollout round's carried cache: :meth:`keep` after each turn's ``generate``, :meth:`release` at the
    end of the round."""

    def __init__(self, turn_cache: TurnCache):
        self.turn_cache = turn_cache
        self.carried: Carried | None = None
        self.calls = 0

    def keep(
        self,
        cache: Any,
        attention_mask: torch.Tensor,
        contexts: Sequence[Sequence[int]],
        new_ids: torch.Tensor,
    ) -> None:
        """Carry the cache ``generate`` finished with into the next turn, if it is a plain cache of the expected
        shape and within the budget (else the next turn re-prefills; logged)."""
        self.carried = None
        layers = cache_layers(cache)
        fed = new_ids[:, :-1].cpu()  # the last sampled token was never fed
        carried = carried_from(layers, attention_mask.cpu(), contexts, fed) if layers else None
        if carried is None:
            self.turn_cache.note(
                f"generate returned a cache it cannot extend ({type(cache).__name__}); re-prefilling"
            )
            return
        mib = carried.nbytes / 2**20
        stats = self.turn_cache.stats
        if mib > self.turn_cache.budget_mib:
            stats.over_budget += 1
            self.turn_cache.note(
                f"the carried cache ({mib:.0f} MiB) is over turn_cache_budget_mib="
                f"{self.turn_cache.budget_mib:g}; the next turn re-prefills",
                logging.INFO,
            )
            return
        stats.peak_mib = max(stats.peak_mib, mib)
        self.carried = carried

    def release(self) -> None:
        self.carried = None
        self.calls = 0


def from_setting(
    setting: bool | None, model: torch.nn.Module, budget_mib: float = TURN_CACHE_BUDGET_MIB
) -> TurnCache | None:
    """The trainer's :class:`TurnCache` for the config's ``use_turn_cache``: ``False`` -> None; ``True`` -> on, or
    :class:`TurnCacheUnsupported`; ``None`` (default) -> on where :func:`check_model` allows it, else None with one
    log line saying why."""
    if setting is False:
        return None
    try:
        check_model(model)
    except TurnCacheUnsupported as e:
        if setting:
            raise
        logger.warning("turn cache is off: %s", str(e).split(";")[0])
        return None
    return TurnCache(budget_mib)


def summary_line(turn_cache: TurnCache) -> str:
    """The run summary's line: generation prefill tokens with the turn cache vs today's path and plain."""
    s = turn_cache.stats
    if not s.plain:
        return "turn cache: no generation ran"
    line = (
        f"turn cache: generation prefill {s.prefill:,} tokens vs {s.today:,} without it "
        f"({s.today / max(1, s.prefill):.2f}x fewer; {s.plain:,} plain), carried cache peak {s.peak_mib:.0f} MiB"
    )
    if s.over_budget:
        line += f"; {s.over_budget} turns re-prefilled over the {turn_cache.budget_mib:g} MiB budget"
    return line


__all__ = [
    "SUPPORTED_ATTENTION",
    "Carried",
    "TurnCache",
    "TurnCacheStats",
    "TurnCacheUnsupported",
    "TurnSession",
    "cache_layers",
    "carried_from",
    "check_model",
    "common_prefix",
    "config_obstacle",
    "continued_inputs",
    "from_setting",
    "MAX_PADDING",
    "gather_from",
    "iter_gathered",
    "gather_layers",
    "prefill_buckets",
    "prefill_rows",
    "generate_continued",
    "match_rows",
    "new_cache",
    "summary_line",
]
