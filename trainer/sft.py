"""``llmgym-sft``: supervised fine-tuning on exported episodes, the warm start before RL.

The data is ``llmgym export`` output (a JSONL file of chat rows or a ``datasets`` folder): each row one episode
(``messages``: system, then user / assistant turns) played by the solver or the random valid-action policy. TRL's
``SFTTrainer`` trains on it with the loss on the episode's own assistant turns only.

**The loss mask.** TRL's ``assistant_only_loss`` needs ``{% generation %}`` markers in the chat template, and
SmolLM2's template (like most) has none; TRL 1.16 ships no training variant for it. So the rows are tokenised
here, by the same token-exact construction as the RL rollouts (:class:`~llm_gym.trainer.chat_templates.
ChatTemplateTokens`): the prompt is the chat up to the first trained reply rendered with the generation prompt;
each reply is its own tokens plus the template's end-of-turn token (loss on both, so the model learns to stop);
the tokens between two replies are the difference of the template rendered with and without the next turn (no
loss). The result is exactly the token sequence an RL rollout produces when the model samples those replies,
with ``assistant_masks`` equal to the rollout's ``env_mask``; TRL turns the mask into labels (``-100`` elsewhere).
Demonstration turns (``one_shot``) before the episode are prompt, never trained: the row's ``num_turns`` last
assistant messages are the episode's.

**Seeds.** Every row names the seed it was played on; rows whose seed lies in the evaluation seeds
(``--eval_seed``, ``--num_eval_seeds``) are refused, so a warm start never sees the boards it is judged on.

**Output** (as ``llmgym-train``): ``output_dir/final`` holds the model (or the LoRA adapter with ``--use_peft``)
and the tokenizer, and ``llmgym_run.json`` with the environment and chat settings of the data, so ``final`` is a
valid ``--model`` for ``llmgym-train`` and ``llmgym-eval`` (which shows the model the chat it was trained on);
``llmgym_sft.json`` records the data (seeds, policies, tokens), the settings and the speed.

Weights stay in float32; ``--bf16 True`` computes in bf16 autocast (the default on a GPU; opt-in on CPU).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from llm_gym._cli import EXIT_CODES_HELP, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, snake_case_options
from llm_gym.core.checks import is_int
from llm_gym.core.parsing import ACTION_SEP, RAGEN_SPECIAL_TOKENS

#: Most rows read from one data set (a warm start uses hundreds).
MAX_ROWS = 1_000_000
#: Most characters of message content in one row.
MAX_ROW_CHARS = 2_000_000
#: Largest data set read, in bytes (the JSONL file, or the Arrow tables of a datasets folder): a warm start's
#: hundreds of episodes take a few MB, and the rows are held in memory.
MAX_DATA_BYTES = 512 * 1024**2
#: Written into output_dir and output_dir/final: the data, settings and speed of the run.
SFT_FILE = "llmgym_sft.json"
#: Written into each checkpoint: the rows, tokens and token hash it was trained on (``--resume`` checks them).
SFT_DATA_FILE = "llmgym_sft_data.json"
_ROLES = ("system", "user", "assistant")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class DataError(ValueError):
    """Training data that cannot be used; the message names the row and what is wrong."""


class WorkerError(RuntimeError):
    """The tokenizer (or the template) failed on a row for a reason not in the data: out of memory, a panicking
    tokenizer thread. The message names the row; ``llmgym-sft`` prints it as one line (exit 1)."""


# ------------------------------------------------------------------------------------------------------ data
class DataRows(Sequence[dict[str, Any]]):
    """Data rows held as their JSON text (one buffer, and where each row ends in it), each parsed when read.

    A parsed row costs far more than its text: a row of two short messages is about 50 bytes of JSON and 1 KB of
    Python objects, so 1,000,000 such rows took gigabytes as a list of dicts. Held this way they take the data's
    own size plus 8 bytes a row; every pass over them (the checks, the tokenisation) parses each row again, a few
    microseconds for a small row. Every read gives a new dict."""

    def __init__(self) -> None:
        self._text = bytearray()
        self._ends = array("q")

    def _append(self, text: bytes) -> None:
        self._text += text
        self._ends.append(len(self._text))

    def _row(self, i: int) -> dict[str, Any]:
        start = self._ends[i - 1] if i else 0
        return json.loads(self._text[start : self._ends[i]])

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._row(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("row index out of range")
        return self._row(i % n)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        start = 0
        for end in self._ends:
            yield json.loads(self._text[start:end])
            start = end


def load_rows(path: str | os.PathLike) -> DataRows:
    """The rows of ``llmgym export`` output: a JSONL file, or a folder written by ``datasets.save_to_disk``, as
    :class:`DataRows` (held as JSON text: memory about the data's size)."""
    p = Path(path)
    rows = DataRows()
    if p.is_dir():
        from llm_gym.cli import check_hf_folder

        try:
            # state.json names the files load_from_disk opens: each must be a file inside the folder
            check_hf_folder(str(p))
        except ValueError as e:
            raise DataError(str(e)) from None
        try:
            from datasets import Dataset, load_from_disk

            data = load_from_disk(str(p))
        except Exception as e:  # noqa: BLE001 - any unreadable folder gets the same one-line explanation
            raise DataError(f"{p}: not a datasets folder written by save_to_disk ({e})") from None
        if not isinstance(data, Dataset):  # a DatasetDict (splits): which split is meant is not ours to guess
            raise DataError(
                f"{p}: a folder of several splits; save the one split to train on (llmgym export)"
            )
        if len(data) > MAX_ROWS:
            raise DataError(f"{p}: {len(data)} rows, more than the {MAX_ROWS} a warm start reads")
        if data.data.nbytes > MAX_DATA_BYTES:  # memory-mapped until the rows are read below
            raise DataError(f"{p}: {data.data.nbytes} bytes of data, more than {MAX_DATA_BYTES}")
        for n, row in enumerate(data):
            try:
                rows._append(json.dumps(row).encode("ascii"))  # ASCII: a lone surrogate stays an escape
            except (TypeError, ValueError) as e:
                raise DataError(f"{p}: row {n} is not plain JSON data ({e})") from None
    elif p.is_file():
        from llm_gym import _jsonl

        if p.stat().st_size > MAX_DATA_BYTES:
            raise DataError(
                f"{p}: {p.stat().st_size} bytes, more than the {MAX_DATA_BYTES} a warm start reads"
            )
        with p.open("rb") as f:  # bounded lines; a bad line is a ValueError naming it
            for number, raw in _jsonl.iter_lines(f, path=str(p), max_total_bytes=MAX_DATA_BYTES):
                if not raw.strip():
                    continue
                try:
                    row = _jsonl.decode_json(raw)
                except ValueError as e:
                    raise ValueError(f"{p}:{number}: {e}") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{p}:{number}: a row must be a JSON object")
                del row  # checked; kept as its text
                rows._append(raw.strip())
                if len(rows) > MAX_ROWS:
                    raise DataError(f"{p}: more than {MAX_ROWS} rows")
    else:
        raise DataError(f"data {str(path)!r} not found (a JSONL file or a datasets folder)")
    if not len(rows):
        raise DataError(f"{p}: no rows")
    return rows


def row_conversation(row: Any, index: int = 0) -> tuple[list[dict[str, str]], int]:
    """The row's messages (validated: an optional system message, then user/assistant turns alternating, ending
    with an assistant message once trailing messages are dropped) and how many of its last assistant messages
    are trained (the row's ``num_turns``, else all). Raises :class:`DataError` naming the row."""
    where = f"row {index}"
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: a row must be a JSON object")
    messages = row.get("messages")
    from llm_gym.agent.export import MAX_ROW_MESSAGES

    if not isinstance(messages, list) or not 0 < len(messages) <= MAX_ROW_MESSAGES:
        raise DataError(f"{where}: 'messages' must be a list of 1 to {MAX_ROW_MESSAGES} chat messages")
    out, chars = [], 0
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: every message needs a role ({', '.join(_ROLES)}) and a string content")
        chars += len(m["content"])
        if chars <= MAX_ROW_CHARS and (bad := _LONE_SURROGATE.search(m["content"])) is not None:
            # JSON escapes can spell one ("\ud800"); a tokenizer takes only valid Unicode text
            raise DataError(
                f"{where}: message {i} holds a lone surrogate (U+{ord(bad.group()):04X} at character {bad.start()}), "
                "which is not Unicode text; fix or drop the row"
            )
        out.append({"role": m["role"], "content": m["content"]})
    if chars > MAX_ROW_CHARS:
        raise DataError(f"{where}: {chars} characters of content, more than {MAX_ROW_CHARS}")
    while out and out[-1]["role"] != "assistant":  # a truncated episode ends before its next state's reply
        out.pop()
    body = out[1:] if out and out[0]["role"] == "system" else out
    if not body or any(m["role"] != ("user", "assistant")[i % 2] for i, m in enumerate(body)):
        raise DataError(
            f"{where}: after an optional system message, user and assistant messages must alternate, starting "
            "with a user message and ending with an assistant message"
        )
    replies = len(body) // 2
    trained = row.get("num_turns", replies)
    if not is_int(trained, numpy=False) or not 1 <= trained <= replies:
        raise DataError(f"{where}: num_turns must be an integer from 1 to its {replies} assistant message(s)")
    return out, trained


def check_rows(rows: Sequence[Any]) -> dict[str, Any]:
    """Validate every row (:func:`row_conversation`) and what the rows share (:func:`data_settings`, returned),
    so that bad data stops a run before any model loads."""
    envs = set()
    for n, row in enumerate(rows):
        row_conversation(row, n)
        env = (row.get("env_id"), row.get("env_kwargs"), row.get("chat"))
        if all(isinstance(v, (str, type(None))) for v in env):  # data_settings names any other
            envs.add(env)
    settings = data_settings(rows)
    # each env the rows name (RAGEN style: made for its think setting), checked now rather than after the model loads
    for env_id, kwargs, chat in envs:
        _prefix(env_id, kwargs, chat)
    return settings


def seed_ranges(seeds: Iterable[int]) -> list[list[int]]:
    """``seeds`` as sorted ``[first, last]`` runs of consecutive integers (a compact, exact record)."""
    out: list[list[int]] = []
    for s in sorted(set(seeds)):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return out


def check_seeds(rows: Sequence[Mapping[str, Any]], eval_seeds: Sequence[int] | range) -> None:
    """Refuse data played on an evaluation seed (:class:`DataError` with how many and which), and data whose rows
    carry no seed when there are evaluation seeds to protect."""
    if not len(eval_seeds):
        return
    lo, hi = min(eval_seeds), max(eval_seeds)
    wanted = set(eval_seeds)
    missing, found = 0, set()
    for r in rows:  # one pass: the rows may be parsed anew on each (DataRows)
        seed = r.get("seed")
        if not is_int(seed, numpy=False):
            missing += 1
        elif lo <= seed <= hi and seed in wanted:
            found.add(seed)
    if missing:
        raise DataError(
            f"{missing} row(s) carry no integer 'seed', so their overlap with the evaluation seeds cannot be "
            "checked; export the data with llmgym export (or pass --num_eval_seeds 0 to train without the check)"
        )
    overlap = sorted(found)
    if overlap:
        shown = ", ".join(map(str, overlap[:5])) + (", ..." if len(overlap) > 5 else "")
        raise DataError(
            f"{len(overlap)} data seed(s) are evaluation seeds ({shown}; evaluation seeds {lo}..{hi}): training on "
            "the boards the model is judged on; export the data from other seeds"
        )


def _one(values: set[Any]) -> Any:
    return next(iter(values)) if len(values) == 1 else None


def data_settings(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the rows share: ``env`` and ``env_kwargs`` (None unless every row names the same), the ``chat``
    settings they were rendered with (config names; :class:`DataError` when rows differ, since one model cannot
    be shown two chats, or when they are not valid settings), the policies and seeds (``policy_seeds``: each
    policy's seeds as ``[first, last]`` runs)."""
    from llm_gym.agent.chat import CHAT_SETTINGS, ChatFormat, chat_format_from_settings

    chats: set[Any] = set()
    envs: set[Any] = set()
    kwargs_texts: set[Any] = set()
    seeds: set[int] = set()
    by_policy: dict[str, set[int]] = {}
    policies: Counter[str] = Counter()
    count = 0
    for n, r in enumerate(rows):  # one pass: the rows may be parsed anew on each (DataRows)
        if not isinstance(r, Mapping):
            raise DataError(f"row {n}: a row must be a JSON object")
        for name in (
            "env_id",
            "env_kwargs",
            "chat",
        ):  # llmgym export writes text (JSON text for the last two)
            if not isinstance(r.get(name), (str, type(None))):
                raise DataError(f"row {n}: {name!r} must be a string, as llmgym export writes it")
        chats.add(r.get("chat"))
        envs.add(r.get("env_id"))
        kwargs_texts.add(r.get("env_kwargs"))
        policy = _policy(r)
        policies[policy] += 1
        if is_int(seed := r.get("seed"), numpy=False):
            seeds.add(seed)
            by_policy.setdefault(policy, set()).add(seed)
        count += 1
    if len(chats) > 1:
        raise DataError(
            "the rows were rendered with different chat settings ('chat'); train on one chat format at a time"
        )
    chat: dict[str, Any] = {}
    text = _one(chats)
    if isinstance(text, str):
        try:
            parsed = json.loads(text)
        except ValueError:
            raise DataError("the rows' 'chat' is not a JSON object") from None
        if not isinstance(parsed, dict):
            raise DataError("the rows' 'chat' is not a JSON object")
        chat = {k: v for k, v in parsed.items() if k in CHAT_SETTINGS}
        defaults = ChatFormat()
        for k, v in chat.items():  # the types ChatFormat holds; then its own checks of the values
            if not isinstance(v, type(getattr(defaults, CHAT_SETTINGS[k]))):
                raise DataError(f"the rows' chat setting {k!r} has the wrong type ({type(v).__name__})")
        try:
            chat_format_from_settings(chat)
        except ValueError as e:
            raise DataError(f"the rows' chat settings: {e}") from None
    env, kwargs_text = _one(envs), _one(kwargs_texts)
    try:
        env_kwargs = json.loads(kwargs_text) if isinstance(kwargs_text, str) else None
    except ValueError:
        env_kwargs = None
    return {
        "env": env if isinstance(env, str) else None,
        "env_kwargs": env_kwargs if isinstance(env_kwargs, dict) else None,
        "chat": chat,
        "rows": count,
        "policies": dict(policies),
        "seeds": [min(seeds), max(seeds)] if seeds else None,
        "num_seeds": len(seeds),
        "policy_seeds": {p: seed_ranges(s) for p, s in sorted(by_policy.items())},
    }


def _policy(row: Mapping[str, Any]) -> str:
    return str(row.get("policy", row.get("expert", "unknown")))[:100]


@functools.lru_cache(maxsize=64)
def _prefix(env_id: Any, env_kwargs_text: Any, chat_text: Any) -> str:
    """The generation prefix of the rows' chat (RAGEN style: ``<think>``, or ``<answer>`` for an env that does
    not think): prompt tokens before each reply, never trained. Empty for the llmgym style."""
    from llm_gym.agent.chat import chat_format_from_settings

    try:
        chat = json.loads(chat_text) if isinstance(chat_text, str) else {}
    except ValueError:
        chat = {}
    if not isinstance(chat, dict) or chat.get("chat_style") != "ragen":
        return ""
    fmt = chat_format_from_settings({k: v for k, v in chat.items() if k == "chat_style"})
    from llm_gym.core.kwargs import foreign_data_kwargs
    from llm_gym.registration import check_trusted_env_id, env_class, env_defaults, make_env, short_repr

    what = "rows in the RAGEN chat style need a usable env_id and env_kwargs"
    try:
        check_trusted_env_id(env_id, "the row")
        kwargs = json.loads(env_kwargs_text) if isinstance(env_kwargs_text, str) else {}
        kwargs = kwargs if isinstance(kwargs, dict) else {}
        # the env is made to read its think setting: a file or data set named by the data is never opened
        foreign = foreign_data_kwargs(env_class(env_id), kwargs, env_defaults(env_id))
        if foreign:
            raise DataError(
                f"{what}: env_kwargs name {foreign[0]}={short_repr(kwargs[foreign[0]], 80)}; file paths and data "
                "sets are not taken from data rows (only bundled data or the id's default); export the rows with "
                "bundled data, or in the llmgym chat style"
            )
        env = make_env(env_id, kwargs)
    except DataError:
        raise
    except ValueError as e:
        raise DataError(f"{what}: {e}") from None
    try:
        think = bool(getattr(env.unwrapped, "think", True))
    finally:
        env.close()
    prefix = fmt.generation_prefix
    return "<answer>" if prefix == "<think>" and not think else prefix


def tokenize_conversation(
    template: Any, messages: Sequence[Mapping[str, str]], trained_turns: int | None = None, prefix: str = ""
) -> dict[str, list[int]]:
    """``input_ids`` and ``assistant_masks`` of one episode, as an RL rollout builds them (module docstring).

    ``template`` is a :class:`~llm_gym.trainer.rollouts.ChatTemplateTokens`; ``messages`` as
    :func:`row_conversation` returns them; the last ``trained_turns`` assistant messages (default all) carry the
    loss, earlier ones (a demonstration) are prompt. ``prefix``: the generation prefix every reply starts with
    (RAGEN style), prompt tokens like the rollout's."""
    replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not replies:
        raise DataError("no assistant message to train on")
    k = len(replies) if trained_turns is None else int(trained_turns)
    if not 1 <= k <= len(replies):
        raise DataError(f"trained_turns must be in 1..{len(replies)}, got {trained_turns!r}")
    trained = replies[len(replies) - k :]
    prefix_ids = template.encode(prefix) if prefix else []
    ids = template.prompt_ids(list(messages[: trained[0]])) + prefix_ids
    mask = [0] * len(ids)
    for j, i in enumerate(trained):
        reply = messages[i]["content"]
        if prefix:
            if not reply.startswith(prefix):
                raise DataError(
                    f"an assistant message does not start with the chat's generation prefix {prefix!r}"
                )
            reply = reply[len(prefix) :]
        turn = template.encode(reply) + [template.end_of_turn_id]
        ids += turn
        mask += [1] * len(turn)
        if j + 1 < len(trained):
            following = messages[i + 1 : trained[j + 1]]
            if len(following) != 1 or following[0]["role"] != "user":
                raise DataError("each trained reply must be followed by exactly one user message")
            between = (
                template.between_turns_ids(list(messages[: i + 1]), following[0]["content"]) + prefix_ids
            )
            ids += between
            mask += [0] * len(between)
    return {"input_ids": ids, "assistant_masks": mask}


def build_dataset(
    rows: Sequence[Mapping[str, Any]], template: Any, max_length: int | None = None
) -> tuple[Any, dict[str, Any]]:
    """A ``datasets.Dataset`` of ``input_ids`` / ``assistant_masks`` (one row per episode) and its statistics
    (rows kept and dropped for ``max_length``, tokens, trained tokens).

    The tokens are gathered in flat arrays (4 bytes a token id, 1 a mask bit) and handed to Arrow as they are:
    lists of Python ints cost about 45 bytes a token. A tokenizer or template failure on a row (a panicking
    tokenizer thread, a ``MemoryError``) is a :class:`WorkerError` naming the row."""
    import numpy as np
    import pyarrow as pa
    from datasets import Dataset
    from datasets.table import InMemoryTable

    ids, masks, ends = array("i"), array("b"), array("q", [0])
    dropped, longest = 0, 0
    for n, row in enumerate(rows):
        messages, trained = row_conversation(row, n)
        prefix = _prefix(row.get("env_id"), row.get("env_kwargs"), row.get("chat"))
        try:
            ex = tokenize_conversation(template, messages, trained, prefix)
        except DataError as e:
            raise DataError(f"row {n}: {e}") from None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - Rust tokenizers panic with a BaseException (PanicException)
            raise WorkerError(f"row {n}: tokenizing failed ({type(e).__name__}: {_short(e)})") from None
        length = len(ex["input_ids"])
        if max_length is not None and length > max_length:
            dropped += 1
            continue
        ids.extend(ex["input_ids"])
        masks.extend(ex["assistant_masks"])
        ends.append(len(ids))
        longest = max(longest, length)
    if len(ends) == 1:
        raise DataError(f"every row is longer than {max_length} tokens (max_length, or the model's context)")
    if len(ids) >= 2**31:  # Arrow list offsets are 32-bit
        raise DataError(f"{len(ids)} tokens in all, more than the {2**31 - 1} one data set holds")
    offsets = pa.array(np.frombuffer(ends, dtype=np.int64).astype(np.int32))
    kept = len(ends) - 1
    stats: dict[str, Any] = {
        "rows": kept,
        "dropped_too_long": dropped,
        "tokens": len(ids),
        "trained_tokens": int(np.frombuffer(masks, dtype=np.int8).sum(dtype=np.int64)),
        "mean_tokens": len(ids) / kept,
        "max_tokens": longest,
    }
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(offsets, pa.array(np.frombuffer(ids, dtype=np.int32))),
            "assistant_masks": pa.ListArray.from_arrays(
                offsets, pa.array(np.frombuffer(masks, dtype=np.int8))
            ),
        }
    )
    # the tokens' own hash as the fingerprint: datasets would otherwise pickle the whole table to hash it
    digest = hashlib.sha256()
    for buffer in (ends, ids, masks):
        digest.update(buffer)
    stats["sha256"] = digest.hexdigest()
    return Dataset(InMemoryTable(table), fingerprint=stats["sha256"][:16]), stats


#: The reply's format markup (the tags and action separator ``llm_gym.core.parsing.format_response`` writes): the
#: tokens ``format_loss_weight`` weighs down, with the end of turn.
FORMAT_TEXTS = (*RAGEN_SPECIAL_TOKENS[:4], f" {ACTION_SEP} ", ACTION_SEP)


def format_token_ids(template: Any) -> frozenset[int]:
    """The token ids of the format markup (each tag encoded alone, and the end-of-turn token) for ``template``
    (a :class:`~llm_gym.trainer.chat_templates.ChatTemplateTokens`). A tokenizer that merges a tag's last
    character into the next word (``>Left``) leaves that token at full weight: content wins a tie."""
    ids = {int(template.end_of_turn_id)}
    for text in FORMAT_TEXTS:
        ids.update(int(i) for i in template.encode(text))
    return frozenset(ids)


def weighted_token_loss(
    logits: Any, labels: Any, format_ids: frozenset[int], weight: float, num_items_in_batch: Any = None
) -> Any:
    """Next-token cross-entropy over the labelled positions (``-100`` elsewhere) with the format tokens'
    positions weighted ``weight`` and the rest 1, normalised by the weights' sum.

    Under gradient accumulation each micro-batch's weighted mean is scaled by its share of the step's labelled
    tokens (``num_items_in_batch``), so with ``weight = 1`` this is exactly TRL's loss (sum over tokens / tokens in
    the step)."""
    import torch

    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    mask = shift_labels != -100
    safe = shift_labels.masked_fill(~mask, 0)
    nll = torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)), safe.reshape(-1), reduction="none"
    ).view_as(safe)
    is_format = torch.isin(safe, torch.tensor(sorted(format_ids), device=safe.device))
    w = torch.where(is_format, torch.as_tensor(float(weight), device=safe.device), 1.0) * mask
    loss = (nll * w).sum() / w.sum().clamp(min=1e-12)
    if num_items_in_batch is not None:
        loss = loss * mask.sum() / torch.as_tensor(num_items_in_batch, device=loss.device).clamp(min=1)
    return loss


def format_weighted_loss(template: Any, weight: float) -> Callable[..., Any] | None:
    """``SFTTrainer``'s ``compute_loss_func`` for ``--format_loss_weight``: ``None`` (TRL's loss) at 1."""
    if float(weight) == 1.0:
        return None
    format_ids = format_token_ids(template)

    def loss(outputs: Any, labels: Any, num_items_in_batch: Any = None) -> Any:
        return weighted_token_loss(outputs.logits, labels, format_ids, float(weight), num_items_in_batch)

    return loss


def _short(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split()) or "no message"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------------------ training
def model_context(model: Any) -> int | None:
    """The longest sequence ``model`` has positions for (its config's ``max_position_embeddings``), or None when
    its config names none."""
    config = getattr(model, "config", None)
    n = getattr(getattr(config, "get_text_config", lambda: config)(), "max_position_embeddings", None)
    return n if is_int(n, numpy=False) and n > 0 else None


class _RunSettings:
    """What :func:`llm_gym.trainer.output.write_run_file` reads, from the data's shared settings."""

    def __init__(self, settings: Mapping[str, Any]):
        from llm_gym.agent.chat import ChatFormat, chat_settings

        self.env = settings.get("env")
        self._env_kwargs = settings.get("env_kwargs") or {}
        for name, value in {**chat_settings(ChatFormat()), **settings.get("chat", {})}.items():
            setattr(self, name, value)

    def make_env_kwargs(self) -> dict[str, Any]:
        return dict(self._env_kwargs)


def train_sft(
    config: Any,
    model_name: str,
    rows: Sequence[Mapping[str, Any]],
    *,
    merge_lora: bool = False,
    callbacks: Sequence[Any] = (),
    resume_from_checkpoint: str | None = None,
    log: Any = print,
) -> dict[str, Any]:
    """Fine-tune ``model_name`` on ``rows`` with ``config`` (an ``LLMGymSFTConfig``); save ``output_dir/final``
    with its ``llmgym_run.json`` and ``llmgym_sft.json``; return the summary written there. ``merge_lora``: with
    ``use_peft``, save the base model with the adapter merged in (a full model, which ``llmgym-train --use_peft``
    can put a new adapter on) instead of the adapter. ``callbacks``: extra ``TrainerCallback`` objects (e.g. an
    evaluation at given steps). ``resume_from_checkpoint``: a complete checkpoint of this run (``llmgym-sft
    --resume``; its data must be these rows, tokenised alike), continued as ``llmgym-train --resume`` does: one at
    ``max_steps`` trains no further step."""
    from llm_gym.trainer.callbacks import CheckpointMarkerCallback
    from llm_gym.trainer.chat_templates import training_template_tokens
    from llm_gym.trainer.lora import peft_config
    from llm_gym.trainer.output import (
        FINAL_DIR,
        FINAL_PARTIAL,
        checkpoint_step,
        load_finished_checkpoint,
        training_finished,
        write_run_file,
    )
    from llm_gym.trainer.precision import load_for_training
    from llm_gym.trainer.resolve import has_gpu
    from trl import SFTTrainer

    from llm_gym.safe_io import atomic_write_text, remove_path, replace_dir

    settings = data_settings(rows)
    check_seeds(rows, range(config.eval_seed, config.eval_seed + config.num_eval_seeds))
    # float32 master weights unless --dtype bfloat16 (bf16=True: autocast), decided as for llmgym-train
    model, tokenizer, _ = load_for_training(model_name, config, gpu=has_gpu(), log=log)
    # The rollouts' template (TRL's training variant when the model's own rewrites history): SFT sequences are
    # then token for token what RL trains on.
    template = training_template_tokens(tokenizer, log=log)
    # without --max_length, an episode longer than the model's context is dropped (and counted) like one longer
    # than --max_length: trained at full length it fills memory, and the model has no positions for it
    max_length = config.max_length if config.max_length is not None else model_context(model)
    dataset, stats = build_dataset(rows, template, max_length)
    stats["max_length"] = max_length
    log(
        f"llmgym-sft: {stats['rows']} episodes ({', '.join(f'{n} {p}' for p, n in settings['policies'].items())}), "
        f"{stats['tokens']} tokens ({stats['trained_tokens']} trained, mean {stats['mean_tokens']:.0f} per "
        f"episode), seeds {settings['seeds']}"
    )
    if stats["dropped_too_long"]:
        log(
            f"llmgym-sft: warning: dropped {stats['dropped_too_long']} episode(s) longer than {max_length} tokens"
            + (" (the model's context; --max_length sets another limit)" if config.max_length is None else "")
        )
    data = {k: stats[k] for k in ("rows", "tokens", "sha256")}  # what the run trains on, in each checkpoint
    if resume_from_checkpoint:
        check_resume_data(resume_from_checkpoint, data)
    start = checkpoint_step(resume_from_checkpoint) if resume_from_checkpoint else 0
    from llm_gym.trainer.deprecations import compute_loss_func_in_trl_1_16, old_checkpointing_names

    marker = CheckpointMarkerCallback({SFT_DATA_FILE: json.dumps(data) + "\n"})
    # TRL's and PEFT's calls use the old names, and --format_loss_weight uses TRL 1.16's compute_loss_func: the
    # user cannot act on either deprecation
    with old_checkpointing_names(), compute_loss_func_in_trl_1_16():
        trainer = SFTTrainer(
            model=model,
            args=config,
            # TRL's own loss unless the format tokens are weighed down (its metrics stay TRL's either way)
            compute_loss_func=format_weighted_loss(template, config.format_loss_weight),
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=peft_config(config),
            callbacks=[marker, *callbacks],
        )
        t0, c0 = time.perf_counter(), time.process_time()
        if resume_from_checkpoint and training_finished(start, config.max_steps):
            # Trainer.train would run one step more before it checks max_steps (as for llmgym-train)
            load_finished_checkpoint(trainer, resume_from_checkpoint, log=log, prog="llmgym-sft")
            training_loss = None
        else:
            training_loss = trainer.train(resume_from_checkpoint=resume_from_checkpoint).training_loss
    # CPU time of this process (one torch thread on CPU): the speed that contention on a shared machine does not hide
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    # final/ is whole or absent (as llmgym-train's): saved beside, completed with the run files, then renamed
    out = Path(config.output_dir)
    final, partial = out / FINAL_DIR, out / FINAL_PARTIAL
    main_process = trainer.is_world_process_zero()
    if main_process and (partial.exists() or partial.is_symlink()):
        remove_path(partial)
    trainer.accelerator.wait_for_everyone()
    if merge_lora and getattr(config, "use_peft", False):
        if main_process:
            merged = trainer.accelerator.unwrap_model(trainer.model).merge_and_unload()
            merged.save_pretrained(str(partial))
            tokenizer.save_pretrained(str(partial))
    else:
        trainer.save_model(str(partial))
    trainer.accelerator.wait_for_everyone()
    history = trainer.state.log_history
    losses = [h["loss"] for h in history if "loss" in h]
    counts = [(h.get("step", 0), h["num_tokens"]) for h in history if "num_tokens" in h]
    # speeds count what this process trained: a resumed run's history holds the killed run's steps too
    before = max((n for step, n in counts if step <= start), default=0)
    tokens = counts[-1][1] - before if counts and counts[-1][0] > start else None
    steps = int(trainer.state.global_step)
    steps_now = steps - start
    summary = {
        "data": {**settings, **stats, "path": str(config.data) if config.data else None},
        "eval_seeds_checked": [config.eval_seed, config.eval_seed + config.num_eval_seeds - 1]
        if config.num_eval_seeds
        else None,
        "model": str(model_name),
        "settings": {
            "learning_rate": config.learning_rate,
            "max_steps": config.max_steps,
            "num_train_epochs": config.num_train_epochs,
            "per_device_train_batch_size": config.per_device_train_batch_size,
            "gradient_accumulation_steps": config.gradient_accumulation_steps,
            "bf16": bool(config.bf16),
            "gradient_checkpointing": bool(config.gradient_checkpointing),
            "use_peft": bool(getattr(config, "use_peft", False)),
            "merged_lora": bool(merge_lora and getattr(config, "use_peft", False)),
            "seed": config.seed,
            "format_loss_weight": float(config.format_loss_weight),
        },
        "steps": steps,
        "resumed_from": str(resume_from_checkpoint) if resume_from_checkpoint else None,
        "resumed_at_step": start,
        "train_seconds": round(wall, 1),
        "train_cpu_seconds": round(cpu, 1),
        "steps_per_second": steps_now / wall if wall > 0 else None,
        "tokens_per_second": float(tokens) / wall if tokens and wall > 0 else None,
        "tokens_per_cpu_second": float(tokens) / cpu if tokens and cpu > 0 else None,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "train_loss": training_loss,
        "loss_curve": [[h["step"], h["loss"]] for h in history if "loss" in h],
    }
    if main_process:
        run_settings = _RunSettings(settings)
        for folder in (out, partial):
            write_run_file(folder, run_settings)
            atomic_write_text(folder / SFT_FILE, json.dumps(summary, indent=1) + "\n")
        replace_dir(partial, final)
    speed, cpu_speed = summary["tokens_per_second"], summary["tokens_per_cpu_second"]
    log(
        f"llmgym-sft: {steps_now} steps in {wall:.0f}s ({steps_now / wall if wall else 0:.3f} steps/s"
        + (
            f", {speed:.0f} tokens/s; {cpu:.0f} CPU-s, {cpu_speed:.0f} tokens per CPU-s"
            if speed and cpu_speed
            else ""
        )
        + f"); loss {_num(summary['loss_first'])} -> {_num(summary['loss_last'])}"
        + (f"; resumed at step {start}, {steps} in all" if resume_from_checkpoint else "")
        + f"; model {final}"
    )
    return summary


def check_resume_data(checkpoint: str | os.PathLike, data: Mapping[str, Any]) -> None:
    """Refuse to resume ``checkpoint`` on other data than it was trained on (:data:`SFT_DATA_FILE`: the rows'
    count, tokens and the tokens' hash, so another file, another model's tokenizer or template differ too)."""
    path = Path(checkpoint) / SFT_DATA_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8")) if path.stat().st_size < 4096 else None
    except (OSError, ValueError):
        saved = None
    if not isinstance(saved, dict):
        raise DataError(f"--resume: {path} is missing or unreadable; cannot check the data is the run's")
    if {k: saved.get(k) for k in data} != dict(data):
        raise DataError(
            f"--resume: the data ({data['rows']} rows, {data['tokens']} tokens) is not what {Path(checkpoint).name} "
            f"was trained on ({saved.get('rows')} rows, {saved.get('tokens')} tokens, another token hash); resume "
            "with the same --data and --model, or start afresh with --overwrite_output_dir"
        )


def _num(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) else "n/a"


# ------------------------------------------------------------------------------------------------------ CLI
#: ``--help`` sections in order (the titles ``llmgym-train`` uses where they mean the same): title -> what they hold.
HELP_GROUPS = {
    "model": "The model trained, LoRA and precision.",
    "data": "The exported episodes trained on, and the evaluation seeds they must not overlap.",
    "algorithm": "Steps, batch, optimiser and schedule.",
    "output": "The output folder: final/, checkpoints, logs and trackers.",
    "distributed": "Devices, processes and sharding.",
    "other": "Every other TRL and transformers option.",
}
#: Flags listed first in their ``--help`` section, in this order.
COMMON = (
    "model",
    "dtype",
    "bf16",
    "use_peft",
    "merge_lora",
    "data",
    "format_loss_weight",
    "max_length",
    "eval_seed",
    "num_eval_seeds",
    "max_steps",
    "num_train_epochs",
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "output_dir",
    "resume",
    "overwrite_output_dir",
    "save_strategy",
    "save_steps",
    "report_to",
    "logging_steps",
    "use_cpu",
)
USAGE = (
    "%(prog)s --data DATA [--model MODEL] [--max_steps N | --num_train_epochs N] [-o OUTPUT_DIR]\n"
    "                  [--use_peft] [--resume [RESUME] | --overwrite_output_dir] [--FIELD VALUE ...]"
)


def build_parser() -> Any:
    """``llmgym-sft``'s parser: every :class:`~llm_gym.trainer.config.LLMGymSFTConfig` field, ``--model``,
    ``--merge_lora`` and the output options it shares with ``llmgym-train`` and ``llmgym-eval``
    (:mod:`llm_gym.trainer.options`), with ``--help`` in the :data:`HELP_GROUPS` sections."""
    from llm_gym.trainer.config import LLMGymSFTConfig, LoRAArguments, ModelArguments, SFTDataArguments
    from llm_gym.trainer.flags import help_group_of, negated_flag_help
    from llm_gym.trainer.options import OutputOptions, add_alias, add_field_options, into_sections
    from transformers import HfArgumentParser
    from transformers.hf_argparser import DataClassType

    parser = HfArgumentParser(
        DataClassType(LLMGymSFTConfig),
        prog="llmgym-sft",
        usage=USAGE,
        description="Supervised fine-tuning (the warm start before RL) on llmgym export output, with the loss on "
        "the episodes' assistant turns only. output_dir/final is a valid --model for llmgym-train and llmgym-eval. "
        "Options are grouped by topic, the common ones first in each group.",
        epilog=EXIT_CODES_HELP,
    )
    sections = {title: parser.add_argument_group(title, text) for title, text in HELP_GROUPS.items()}
    sections["model"].add_argument(
        "--model",
        default="smollm2",
        help="Hub id, local folder, 'smollm2' (offline SmolLM2-135M; default) or an organism.",
    )
    sections["model"].add_argument(
        "--merge_lora",
        action="store_true",
        help="With --use_peft: save the model with the adapter merged in instead of the adapter.",
    )
    add_field_options(sections["output"], OutputOptions)
    add_alias(parser, "output_dir", "-o")
    own = {ModelArguments: "model", SFTDataArguments: "data", LoRAArguments: "model"}
    group_of = help_group_of(LLMGymSFTConfig, own)
    group_of = {name: title if title in sections else "other" for name, title in group_of.items()}
    group_of["seed"] = "algorithm"
    into_sections(parser, sections, group_of, COMMON)
    negated_flag_help(parser)
    return snake_case_options(parser)


#: What ``--overwrite_output_dir`` removes (other files stay).
_OUTPUTS = ("final", ".final.partial", SFT_FILE, "llmgym_run.json", "README.md")


def prepare_output_dir(
    output_dir: str | os.PathLike, overwrite: bool, resume: str | None = None, log: Any = print
) -> str | None:
    """Check the output folder (the caller holds its lock) and return the checkpoint to resume from. A non-empty
    folder needs ``resume`` (``"latest"`` or a checkpoint folder: continue its run, as ``llmgym-train --resume``;
    the killed run's half-saved ``final/`` is removed) or ``overwrite`` (its SFT output and checkpoints are removed
    first)."""
    from llm_gym.trainer.output import FINAL_PARTIAL, WRITTEN_IN_PLACE, resolve_resume

    from llm_gym.safe_io import LOCK_FILE, check_regular, remove_path

    out = Path(output_dir)
    if resume and overwrite:
        raise ValueError("--resume and --overwrite_output_dir exclude each other")
    if resume:
        if resume == "latest" and not out.is_dir():
            raise ValueError(f"--resume: output folder {out} does not exist")
        for name in WRITTEN_IN_PLACE:  # before anything changes: a planted README.md -> ~/file is refused
            check_regular(out / name)
        folder = resolve_resume(out, resume, log, prog="llmgym-sft")
        for p in [out / FINAL_PARTIAL, *sorted(out.glob(".final.old-*"))]:  # a save of final/ cut short
            if p.exists() or p.is_symlink():
                remove_path(p)
        return str(folder)
    entries = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE) if out.is_dir() else []
    if entries and not overwrite:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ValueError(
            f"output folder {out} is not empty ({shown}); pass --resume to continue its run from its last "
            "checkpoint or --overwrite_output_dir to replace it"
        )
    for name in entries:
        p = out / name
        if (
            name in _OUTPUTS
            or name.startswith(".final.old-")
            or (p.is_dir() and name.startswith("checkpoint-"))
        ):
            remove_path(p)  # a link is removed itself, never what it points to
    return None


def cpu_arguments(argv: Sequence[str], gpu: bool) -> list[str]:
    """Without a GPU: ``--use_cpu True`` and float32 compute (``--bf16 False``) unless given."""
    if gpu:
        return []
    given = {a.split("=", 1)[0].lstrip("-").replace("-", "_") for a in argv if a.startswith("--")}
    extra = [] if "use_cpu" in given else ["--use_cpu", "True"]
    return extra + ([] if "bf16" in given else ["--bf16", "False"])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``llmgym-sft``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    # one text at a time gains nothing from the tokenizer's thread pool, and a panic in a pool thread hung the run
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "-h" in argv or "--help" in argv:
        build_parser().print_help()
        return EXIT_OK
    from llm_gym.trainer.models import ModelError, check_model
    from llm_gym.trainer.resolve import has_gpu

    from llm_gym.safe_io import OutputLock, OutputLockedError

    lock = None
    try:
        config, opts = build_parser().parse_args_into_dataclasses([*argv, *cpu_arguments(argv, has_gpu())])
        rows = load_rows(config.data)
        settings = check_rows(
            rows
        )  # malformed rows, or rows that cannot share one chat, fail before the model
        from llm_gym.trainer.organism import materialize

        # an organism is built for the data's env (its tokenizer learns that env's texts) and the run's seed
        opts.model = materialize(opts.model, settings["env"], settings["env_kwargs"], seed=config.seed)
        check_model(opts.model)
        check_seeds(rows, range(config.eval_seed, config.eval_seed + config.num_eval_seeds))
        lock = OutputLock(config.output_dir, "SFT run").acquire()
        resume = prepare_output_dir(config.output_dir, opts.overwrite_output_dir, opts.resume)
        train_sft(config, opts.model, rows, merge_lora=opts.merge_lora, resume_from_checkpoint=resume)
        from accelerate import PartialState

        PartialState().destroy_process_group()  # as llmgym-train: none left to interpreter shutdown (gloo aborts)
    except (DataError, ModelError, OutputLockedError, ValueError) as e:
        print(f"llmgym-sft: error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, WorkerError) as e:
        print(f"llmgym-sft: error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_RUNTIME
    except MemoryError:
        print("llmgym-sft: error: out of memory", file=sys.stderr)
        return EXIT_RUNTIME
    finally:
        if lock is not None:
            lock.release()
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
