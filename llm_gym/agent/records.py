"""Episode records: one JSON object per line, written by evaluation and training, read by replay and the viewer.

A record holds what is needed to rebuild the episode (env id, kwargs, seed, reset options and each turn's raw
response) and what the agent saw and got (observations, parsed actions, rewards, info).
"""

from __future__ import annotations

import json
import math
import warnings
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, SupportsFloat, overload

import numpy as np

from llm_gym import _jsonl
from llm_gym._jsonl import JsonlError, decode_json, iter_lines
from llm_gym.core.checks import is_int, is_number
from llm_gym.core.parsing import RESPONSE_MAX_LENGTH
from llm_gym.registration import check_seed, make_env, short_repr

FORMAT_VERSION = 1


def to_jsonable(value: Any) -> Any:
    """Convert tuples, numpy scalars/arrays and non-finite floats into plain JSON values."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


@dataclass
class TurnRecord:
    """One turn: the model's full response and what the environment answered."""

    response: str
    observation: str
    reward: float
    actions: list[str] = field(default_factory=list)
    reward_components: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_step(
        cls,
        response: str,
        observation: str,
        reward: SupportsFloat,
        terminated: bool,
        truncated: bool,
        info: dict,
    ) -> TurnRecord:
        """The record of one ``env.step(response)`` and what it returned."""
        return cls(
            response=response,
            observation=observation,
            reward=float(reward),
            actions=[str(a) for a in info.get("actions", [])],
            reward_components={str(k): float(v) for k, v in dict(info.get("reward_components", {})).items()},
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=dict(info),
        )


@dataclass
class EpisodeRecord:
    """One episode, replayable from ``env_id``, ``env_kwargs``, ``seed``, ``reset_options`` and the responses."""

    env_id: str
    seed: int | None
    initial_observation: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    reset_options: dict[str, Any] | None = None
    instructions: str = ""
    turns: list[TurnRecord] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION

    @classmethod
    def from_reset(
        cls,
        env: Any,
        env_id: str,
        seed: int | None,
        observation: str,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        reset_options: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> EpisodeRecord:
        """The record of an episode just started by ``env.reset(seed=seed, options=reset_options)``.

        The one place records are begun (agent rollouts, trainer rollouts, play, replay), so they all store the
        same things: ``env_kwargs`` without ``render_mode`` (how the episode was shown is not part of it), the
        env's ``instructions``, and copies of the mappings. Append turns with :meth:`TurnRecord.from_step`.
        """
        return cls(
            env_id=env_id,
            seed=None if seed is None else int(seed),
            initial_observation=observation,
            env_kwargs={k: v for k, v in dict(env_kwargs or {}).items() if k != "render_mode"},
            reset_options=None if reset_options is None else dict(reset_options),
            instructions=getattr(env.unwrapped, "instructions", ""),
            meta=dict(meta or {}),
        )

    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def success(self) -> bool:
        return bool(self.turns and self.turns[-1].info.get("success", False))

    def to_dict(self) -> dict[str, Any]:
        d = to_jsonable(asdict(self))
        d["total_reward"] = self.total_reward
        d["success"] = self.success
        return d

    @classmethod
    def from_dict(cls, d: Any) -> EpisodeRecord:
        """The record in a decoded JSON object, checked field by field (records are untrusted input).

        Raises:
            RecordError: (a ``ValueError``) ``bad episode record: <what is wrong>``.
        """
        return cls(**_checked_fields(d))


class RecordError(ValueError):
    """A malformed episode record; ``reason`` says what is wrong (without the ``bad episode record`` prefix)."""

    def __init__(self, reason: str, where: str = "", source: str = ""):
        super().__init__(
            f"{f'{source}: ' if source else ''}bad episode record{f' {where}' if where else ''}: {reason}"
        )
        self.reason = reason


#: Non-finite floats as :func:`to_jsonable` writes them.
_NONFINITE = {
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "infinity": math.inf,
    "-infinity": -math.inf,
}
ENV_ID_MAX_LENGTH = 200
_short_repr = short_repr


def _number(value: Any, what: str) -> float:
    if isinstance(value, str) and value.strip().lower() in _NONFINITE:
        return _NONFINITE[value.strip().lower()]
    if not is_number(value):
        raise RecordError(f"{what} must be a number, got {_short_repr(value)}")
    try:
        return float(value)
    except OverflowError:  # an int too large for a float
        raise RecordError(f"{what} is out of range: {_short_repr(value)}") from None


def _typed(d: dict, key: str, types: type | tuple[type, ...], what: str, default: Any = ...) -> Any:
    if key not in d:
        if default is ...:
            raise RecordError(f"missing {what}")
        return default() if callable(default) else default
    value = d[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise RecordError(f"{what} must be {_type_names(types)}, got {_short_repr(value)}")
    if not isinstance(value, types):
        raise RecordError(f"{what} must be {_type_names(types)}, got {_short_repr(value)}")
    return value


def _type_names(types: type | tuple[type, ...]) -> str:
    names = {str: "a string", dict: "an object", list: "a list", bool: "true or false", int: "an integer"}
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(names.get(t, "null" if t is type(None) else t.__name__) for t in types)


def _string_keys(value: dict, what: str) -> dict:
    for k in value:
        if not isinstance(k, str):
            raise RecordError(f"{what} keys must be strings, got {_short_repr(k)}")
    return value


def _checked_turn(t: Any, i: int) -> TurnRecord:
    what = f"turns[{i}]"
    if not isinstance(t, dict):
        raise RecordError(f"{what} must be an object, got {_short_repr(t)}")
    actions = _typed(t, "actions", list, f"{what}.actions", list)
    if not all(isinstance(a, str) for a in actions):
        raise RecordError(f"{what}.actions must be a list of strings")
    components = _string_keys(_typed(t, "reward_components", dict, f"{what}.reward_components", dict), what)
    return TurnRecord(
        response=_typed(t, "response", str, f"{what}.response"),
        observation=_typed(t, "observation", str, f"{what}.observation"),
        reward=_number(t["reward"], f"{what}.reward")
        if "reward" in t
        else _typed(t, "reward", str, f"{what}.reward"),
        actions=list(actions),
        reward_components={k: _number(v, f"{what}.reward_components[{k!r}]") for k, v in components.items()},
        terminated=_typed(t, "terminated", bool, f"{what}.terminated", False),
        truncated=_typed(t, "truncated", bool, f"{what}.truncated", False),
        info=_string_keys(_typed(t, "info", dict, f"{what}.info", dict), f"{what}.info"),
    )


def _checked_fields(d: Any) -> dict[str, Any]:
    """The constructor arguments of :class:`EpisodeRecord` from a decoded JSON object, or :class:`RecordError`.

    Unknown keys (from newer writers) are ignored so old readers still load the record."""
    if not isinstance(d, dict):
        raise RecordError(f"expected a JSON object, got {type(d).__name__}")
    if "env_id" not in d:
        raise RecordError("expected an object with an 'env_id' key")
    version = _typed(d, "version", int, "version", FORMAT_VERSION)
    if version > FORMAT_VERSION:
        raise RecordError(f"version {version} is newer than this llm-gym ({FORMAT_VERSION})")
    if version < 1:
        raise RecordError(f"version must be an integer >= 1, got {version}")
    env_id = _typed(d, "env_id", str, "env_id")
    if not env_id or len(env_id) > ENV_ID_MAX_LENGTH:
        raise RecordError(f"env_id must be a non-empty string of at most {ENV_ID_MAX_LENGTH} characters")
    try:
        seed = check_seed(_typed(d, "seed", (int, type(None)), "seed"))
    except ValueError as e:
        raise RecordError(str(e)) from None
    turns = _typed(d, "turns", list, "turns", list)
    reset_options = _typed(d, "reset_options", (dict, type(None)), "reset_options", None)
    return {
        "env_id": env_id,
        "seed": seed,
        "initial_observation": _typed(d, "initial_observation", str, "initial_observation"),
        "env_kwargs": dict(_string_keys(_typed(d, "env_kwargs", dict, "env_kwargs", dict), "env_kwargs")),
        "reset_options": None
        if reset_options is None
        else dict(_string_keys(reset_options, "reset_options")),
        "instructions": _typed(d, "instructions", str, "instructions", ""),
        "turns": [_checked_turn(t, i) for i, t in enumerate(turns)],
        "meta": dict(_string_keys(_typed(d, "meta", dict, "meta", dict), "meta")),
        "version": version,
    }


def _dumps(d: dict[str, Any]) -> str:
    """JSON text of ``d`` that UTF-8 can encode: text as UTF-8, or, when a string holds a lone surrogate
    (``"\\ud800"``, which UTF-8 cannot encode: it comes from JSON escapes in a server reply or data file), the
    whole line with ``\\uXXXX`` escapes, which JSON allows."""
    line = json.dumps(d, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(d, ensure_ascii=True)
    return line


def _cut_note(length: int) -> str:
    return f" [cut by llm-gym: the original had {length:,} characters]"


def cut_note(record: EpisodeRecord) -> str:
    """For a replay mismatch: a note that the writer cut this record's texts (``meta["cut"]``), or "". The cut
    texts end in their own note, but a viewer shows only the start of a long text."""
    n = record.meta.get("cut") if isinstance(record.meta, dict) else None
    if not is_int(n) or n <= 0:
        return ""
    return (
        f"; llm-gym cut {n} of this record's texts to fit the {_jsonl.MAX_LINE_BYTES:,}-byte line bound when it "
        "was written, which can change a replay"
    )


def _cut(text: str, keep: int) -> str:
    return text[: max(0, keep)] + _cut_note(len(text))


def _texts(d: dict[str, Any]) -> list[tuple[Any, Any]]:
    """``(container, key)`` of every text a record line may cut: responses, observations, the instructions and
    the string values of each turn's info."""
    out: list[tuple[Any, Any]] = [(d, "initial_observation"), (d, "instructions")]
    for t in d.get("turns", []):
        out += [(t, "response"), (t, "observation")]
        info = t.get("info")
        if isinstance(info, dict):
            out += [(info, k) for k, v in info.items() if isinstance(v, str)]
    return [(c, k) for c, k in out if isinstance(c.get(k), str)]


def _record_line(d: dict[str, Any]) -> str:
    """One JSONL line for the record dict ``d`` that the readers accept: at most ``llm_gym._jsonl.MAX_LINE_BYTES``
    bytes with its newline (the one shared bound; a writer never produces what its own reader refuses).

    1. A reply longer than :data:`~llm_gym.core.parsing.RESPONSE_MAX_LENGTH` characters, which every env refuses
       by its length alone, is always stored as its first ``RESPONSE_MAX_LENGTH + 1`` characters and a note
       (``[cut by llm-gym: the original had N characters]``): the replay is unchanged.
    2. If the line is still too long, the longest texts (replies, observations, instructions, info strings) are
       cut to a common length, each ending in the same note. Such a record no longer replays exactly.

    Either way ``meta["cut"]`` counts the texts cut. Raises ``ValueError`` when even that cannot make the line
    fit (a record whose other fields alone exceed the bound)."""
    originals: dict[tuple[int, Any], tuple[str, int]] = {}  # (container, key) -> (original text, chars kept)

    def cut_to(c: Any, k: Any, keep: int) -> None:
        original, _ = originals.get((id(c), k), (c[k], len(c[k])))
        keep = max(0, min(keep, len(original)))
        originals[(id(c), k)] = (original, keep)
        c[k] = _cut(original, keep)

    for t in d.get("turns", []):
        r = t.get("response")
        if isinstance(r, str) and len(r) > RESPONSE_MAX_LENGTH:
            cut_to(t, "response", RESPONSE_MAX_LENGTH + 1)
    budget = _jsonl.MAX_LINE_BYTES - 1  # the newline
    if originals:
        d.setdefault("meta", {})["cut"] = len(originals)
    line = _dumps(d)
    size = len(line.encode("utf-8"))
    for _ in range(8):
        if size <= budget:
            return line + "\n"
        texts = _texts(d)
        ascii_only = line.isascii()
        sizes = [len(json.dumps(c[k], ensure_ascii=ascii_only).encode("utf-8")) for c, k in texts]
        # Water-filling on encoded sizes: the largest texts shrink to a common size `level` (note included).
        level = _water_level(sizes, size - budget + 64 * len(texts) + 64)
        for (c, k), n in zip(texts, sizes):
            if n > level:
                kept = originals.get((id(c), k), (c[k], len(c[k])))[1]
                cut_to(c, k, int(kept * max(0, level - 64) / n))
        d.setdefault("meta", {})["cut"] = len(originals)
        line = _dumps(d)
        size = len(line.encode("utf-8"))
    raise ValueError(
        f"an episode record would be {size:,} bytes on its line even with its texts cut, more than the "
        f"{_jsonl.MAX_LINE_BYTES:,} bytes records readers accept"
    )


def _water_level(sizes: list[int], need: int) -> int:
    """The largest ``level`` such that cutting every size above it down to it frees at least ``need``."""
    ordered = sorted(sizes, reverse=True)
    freed, level = 0, 0
    for i, n in enumerate(ordered):
        nxt = ordered[i + 1] if i + 1 < len(ordered) else 0
        # lowering the top i + 1 texts from n to nxt frees (i + 1) * (n - nxt)
        if freed + (i + 1) * (n - nxt) >= need:
            return max(0, n - (need - freed + i) // (i + 1))
        freed += (i + 1) * (n - nxt)
        level = nxt
    return level


def _json_line(record: EpisodeRecord) -> str:
    """One JSONL line of ``record`` (see :func:`_record_line` for the size bound). Text is written as UTF-8, or
    with ``\\uXXXX`` escapes when it holds a lone surrogate; either reads back to the same strings, except that a
    high surrogate directly followed by a low one (two code points in Python) reads back as the one character
    the pair encodes: JSON has no way to tell them apart."""
    return _record_line(record.to_dict())


def write_records(path: str | Path, records: Iterable[EpisodeRecord], *, append: bool = True) -> int:
    """Write records as JSON lines; returns how many were written.

    Appending is failure-atomic: if the write fails (a full disk), the file is cut back to its previous size,
    so an error never leaves a torn line. ``append=False`` replaces the file atomically (a temporary file
    renamed over it)."""
    from llm_gym.safe_io import append_text, atomic_write_text

    lines = [_json_line(rec) for rec in records]
    if append:
        append_text(path, "".join(lines))
    else:
        atomic_write_text(path, "".join(lines))
    return len(lines)


class TornRecordWarning(UserWarning):
    """The last line of a records file was cut off (its writer was killed); the line is skipped."""


def _torn_message(path: str | Path, lineno: int, size: int) -> str:
    return (
        f"{path}: ignoring a torn last line (line {lineno}, {size} bytes without a newline: the writer was "
        "interrupted)"
    )


def _is_torn(raw: bytes) -> bool:
    """A line without its newline that is not a complete JSON value: the end of an interrupted write."""
    if raw.endswith(b"\n"):
        return False
    try:
        json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return True
    return False


def repair_torn_tail(path: str | Path) -> int:
    """Before appending to ``path``: cut a torn last line off (returns the bytes removed), or end a complete
    last line that lacks its newline (returns 0), so the next record starts on a line of its own."""
    import os

    from llm_gym.safe_io import check_regular, open_regular

    path = Path(path)
    if not check_regular(path):  # never through a link: the file it points to is not ours to cut
        return 0
    with os.fdopen(open_regular(path, os.O_RDWR), "rb+") as f:
        size = f.seek(0, 2)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # Find the start of the last line, reading backwards in blocks.
        pos, start = size, 0
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            f.seek(pos)
            block = f.read(step)
            i = block.rfind(b"\n")
            if i >= 0:
                start = pos + i + 1
                break
        f.seek(start)
        tail = f.read()
        if _is_torn(tail):
            f.truncate(start)
            return size - start
        f.seek(size)
        f.write(b"\n")
        return 0


def _scan(
    path: str | Path, on_torn: Callable[[str], None] | None, stacklevel: int = 3
) -> Iterator[tuple[int, EpisodeRecord]]:
    """``(byte offset of the line, record)`` for each record of ``path`` (see :func:`iter_records`)."""
    with Path(path).open("rb") as f:
        lines = iter_lines(f, path=str(path))
        while True:
            offset = f.tell()
            try:
                lineno, raw = next(lines)
            except StopIteration:
                return
            except JsonlError as e:  # a line over the length cap: refused before it is read whole
                raise RecordError(e.reason, f"at line {e.lineno}", str(path)) from None
            if not raw.strip():
                continue
            try:
                record = _decode_record(raw)
            except RecordError as e:
                if _is_torn(raw):  # only the last line can lack its newline
                    message = _torn_message(path, lineno, len(raw))
                    if on_torn is not None:
                        on_torn(message)
                    else:
                        warnings.warn(message, TornRecordWarning, stacklevel=stacklevel)
                    return
                raise RecordError(e.reason, f"at line {lineno}", str(path)) from None
            yield offset, record


def _decode_record(raw: bytes) -> EpisodeRecord:
    try:
        data = decode_json(raw)
    except ValueError as e:
        raise RecordError(str(e)) from None
    return EpisodeRecord.from_dict(data)


def iter_records(
    path: str | Path, *, on_torn: Callable[[str], None] | None = None
) -> Iterator[EpisodeRecord]:
    """The records of a JSONL file, one by one.

    Raises ``ValueError`` ``<path>: bad episode record at line N: <why>`` for a line that is not valid UTF-8, not
    JSON (or nested too deeply), or not a well-formed record (see :meth:`EpisodeRecord.from_dict`). A UTF-8 byte
    order mark at the start of the file is skipped. A torn last line (no newline and not complete JSON: the
    writer was killed mid-line) is skipped and reported: ``on_torn(message)``, or a :class:`TornRecordWarning`.
    """
    for _, record in _scan(path, on_torn, stacklevel=4):
        yield record


def read_records(path: str | Path, *, on_torn: Callable[[str], None] | None = None) -> list[EpisodeRecord]:
    """All records in a JSONL file; a malformed line raises ``ValueError`` naming the line (a torn last line
    is skipped and reported, see :func:`iter_records`). Holds every record: :class:`RecordFile` reads one at a
    time."""
    return list(iter_records(path, on_torn=on_torn))


def record_episode(
    env_id: str,
    responses: Iterable[str],
    *,
    seed: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    reset_options: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> EpisodeRecord:
    """Play ``responses`` in a fresh ``env_id`` and return the episode as a record (stops when it ends)."""
    kwargs = dict(env_kwargs or {})
    env = make_env(env_id, kwargs)
    try:
        options = dict(reset_options) if reset_options is not None else None
        obs, _ = env.reset(seed=seed, options=options)
        record = EpisodeRecord.from_reset(
            env, env_id, seed, obs, env_kwargs=kwargs, reset_options=options, meta=meta
        )
        for response in responses:
            obs, reward, terminated, truncated, info = env.step(response)
            record.turns.append(TurnRecord.from_step(response, obs, reward, terminated, truncated, info))
            if terminated or truncated:
                break
    finally:
        env.close()
    return record


class RecordFile(Sequence[EpisodeRecord]):
    """The records of a JSONL file as a sequence read on demand (``llmgym view`` / ``render``).

    Opening checks every line exactly as :func:`iter_records` does (same errors, same torn-last-line handling)
    but keeps only each record's byte offset (8 bytes per record); indexing reads that one line again, and the
    last ``cache`` records read stay in memory. A 2 GB file of 25 MB records costs one record at a time, not
    2 GB. The file must not change while it is open (a changed line reads as a bad record)."""

    def __init__(self, path: str | Path, *, on_torn: Callable[[str], None] | None = None, cache: int = 4):
        self.path = Path(path)
        self._offsets = array("q", (offset for offset, _ in _scan(self.path, on_torn)))
        self._cache: OrderedDict[int, EpisodeRecord] = OrderedDict()
        self._cache_size = max(1, int(cache))

    def __len__(self) -> int:
        return len(self._offsets)

    @overload
    def __getitem__(self, index: int) -> EpisodeRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[EpisodeRecord]: ...

    def __getitem__(self, index: int | slice) -> EpisodeRecord | list[EpisodeRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"record {index} out of range: the file has {n}")
        if i in self._cache:
            self._cache.move_to_end(i)
            return self._cache[i]
        offset = self._offsets[i]
        with self.path.open("rb") as f:
            f.seek(offset)
            raw = f.readline(_jsonl.MAX_LINE_BYTES + 1)
        if offset == 0 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            record = _decode_record(raw)
        except RecordError as e:
            raise RecordError(e.reason, f"at byte {offset} (the file changed?)", str(self.path)) from None
        self._cache[i] = record
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return record
