"""Load task records for dataset-backed environments (Countdown data mode, MetaMathQA).

A source is either a local file (``.json``: a list of objects; ``.jsonl``: one object per line; ``.parquet``) or
a Hugging Face dataset id loaded with ``datasets.load_dataset`` (imported lazily: ``llm_gym`` itself needs only
gymnasium and numpy). Loaded sources are cached per process, so many env instances share one copy.

Local files are untrusted input: a UTF-8 byte order mark is skipped, invalid UTF-8 and invalid or too deeply
nested JSON raise ``ValueError`` naming the file and line, and lone surrogates (``"\\ud800"`` escapes) in strings
are replaced by U+FFFD. Memory is bounded: at most :data:`MAX_ROWS` records, of which only the fields an env
reads are kept (a row of many small fields costs the same as one of two), ``.jsonl`` read line by line,
``.json`` (parsed whole) at most :data:`MAX_JSON_FILE_BYTES`, ``.parquet`` checked by its row count and
uncompressed size before it is read.

A hub dataset that fails to load (offline and not cached: ``datasets`` waits about 24 s before it gives up) is
remembered as failed for the rest of the process, so a thousand records or rows naming it cost one wait, not a
thousand (:func:`clear_cache` forgets it).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from llm_gym._jsonl import MAX_FILE_BYTES, decode_json, iter_lines
from llm_gym.core.checks import is_int

#: File suffixes read as local files.
LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet")
#: Most records read from a local file (MetaMathQA has 395k, Countdown-Tasks-3to4 490k). Each costs about 500
#: bytes of Python objects besides its text (measured: 1,000,000 two-field rows, 68 MB of JSONL, 511 MB RSS).
MAX_ROWS = 1_000_000
#: Largest ``.json`` file (bytes): it is parsed whole, at up to ~10x its size in Python objects; use ``.jsonl``
#: (read line by line, up to ``MAX_FILE_BYTES``) for larger data.
MAX_JSON_FILE_BYTES = 64 * 1024**2

_CACHE: dict[tuple[str, str, frozenset[str] | None], Any] = {}
_FAILED: dict[tuple[str, str, frozenset[str] | None], str] = {}
_LOCK = threading.Lock()


class DatasetUnavailableError(RuntimeError, ValueError, gym.error.DependencyNotInstalled):
    """A hub dataset could not be loaded (no network and not cached, or ``datasets`` missing).

    Also Gymnasium's ``DependencyNotInstalled``: an id whose default data is a hub dataset cannot be built
    offline, and tools that walk the registry (Gymnasium's env suite) skip it as they skip a missing extra.

    Also a ``ValueError``: like a bad file, it is a data source that cannot be used, and callers that report bad
    input (``llmgym render`` of a record naming a hub dataset) catch ``ValueError``."""


def is_local_source(source: str | os.PathLike) -> bool:
    """Whether ``source`` names a local file rather than a hub dataset id."""
    text = os.fspath(source)
    return text.lower().endswith(LOCAL_SUFFIXES) or os.path.isfile(text)


def _project(row: Any, keep: frozenset[str] | None) -> Any:
    """Only the fields an env reads (a row is a dict; anything else is left for the field check to refuse)."""
    if keep is None or not isinstance(row, dict):
        return row
    return {k: v for k, v in row.items() if k in keep}


def _too_many(path: Path) -> ValueError:
    return ValueError(f"{path}: more than {MAX_ROWS:,} records (llm_gym.envs.task_data.MAX_ROWS)")


def _read_local(path: Path, keep: frozenset[str] | None = None) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ValueError(f"dataset file not found: {str(path)!r}")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ValueError("reading .parquet files needs pyarrow: pip install pyarrow") from e
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"{path}: file larger than {MAX_FILE_BYTES:,} bytes")
        try:
            meta = pq.ParquetFile(path).metadata
            # compressed columns can hold far more than the file's size: check what reading would unpack
            unpacked = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        except Exception as e:  # noqa: BLE001 - pyarrow raises its own types for a corrupt file
            raise ValueError(
                f"{path}: not a readable Parquet file ({type(e).__name__}: {str(e)[:200]})"
            ) from None
        if meta.num_rows > MAX_ROWS:
            raise _too_many(path)
        if unpacked > MAX_FILE_BYTES:
            raise ValueError(f"{path}: more than {MAX_FILE_BYTES:,} bytes of data once uncompressed")
        names = meta.schema.to_arrow_schema().names
        columns = None if keep is None else [c for c in names if c in keep]
        return [_sanitize(row) for row in pq.read_table(path, columns=columns).to_pylist()]
    if suffix == ".jsonl":
        # The one bounded JSONL reader: each line and the whole file are capped before they are read.
        rows: list[Any] = []
        with path.open("rb") as f:
            for lineno, raw in iter_lines(f, path=str(path), max_total_bytes=MAX_FILE_BYTES):
                if raw.strip():
                    if len(rows) >= MAX_ROWS:
                        raise _too_many(path)
                    rows.append(_project(_loads(raw, f"{path}:{lineno}"), keep))
        return rows
    with path.open("rb") as f:
        raw = f.read(MAX_JSON_FILE_BYTES + 1)  # bounded: a huge file must not fill memory
    if len(raw) > MAX_JSON_FILE_BYTES:
        raise ValueError(
            f"{path}: file larger than {MAX_JSON_FILE_BYTES:,} bytes (a .json file is parsed whole; "
            "write larger data as .jsonl, one record per line)"
        )
    try:
        text = raw.decode("utf-8-sig")  # a UTF-8 byte order mark (Windows editors write one) is skipped
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{line}: not valid UTF-8 (byte {e.start} of the file)") from None
    data = _loads(text, str(path))
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of objects (or {{'data': [...]}})")
    if len(data) > MAX_ROWS:
        raise _too_many(path)
    return [_project(row, keep) for row in data]


def _loads(text: str | bytes, where: str) -> Any:
    try:
        return _sanitize(decode_json(text))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _sanitize(value: Any) -> Any:
    """``value`` with lone surrogates in its strings replaced by U+FFFD.

    JSON escapes such as ``"\\ud800"`` decode to lone surrogates, which no tokenizer or UTF-8 writer accepts (they
    crashed training far from the file). Replacing them keeps the item usable and shows where text was broken.
    Containers nest only as deep as ``json`` could parse them."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {_sanitize(k): _sanitize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_sanitize(v) for v in value]
    return value


def _load_hub(name: str, split: str, hint: str) -> Any:
    try:
        import datasets
    except ImportError as e:
        raise DatasetUnavailableError(
            f"loading the hub dataset {name!r} needs the `datasets` package (pip install datasets). {hint}"
        ) from e
    try:
        return datasets.load_dataset(name, split=split)
    except Exception as e:  # noqa: BLE001 - datasets raises many types (ConnectionError, FileNotFoundError, ...)
        raise DatasetUnavailableError(
            f"could not load the dataset {name!r} (split {split!r}): {type(e).__name__}: {e}. "
            f"It is not cached and the hub is unreachable (or HF_DATASETS_OFFLINE=1). {hint}"
        ) from e


def load_records(
    source: str | os.PathLike,
    *,
    split: str = "train",
    fields: Sequence[str],
    optional: Sequence[str] = (),
    hint: str = "",
) -> Sequence[dict[str, Any]]:
    """The records of ``source`` (a local file or a hub id), cached per process.

    Each record must have every name in ``fields``; of a local file's records only ``fields`` and ``optional``
    are kept. The result supports ``len()`` and integer indexing. Raises ``ValueError`` for a bad file and
    :class:`DatasetUnavailableError` when a hub dataset cannot be loaded (also for every later call in this
    process: the failure is remembered); ``hint`` is appended to the latter (how to get by offline).
    """
    local = is_local_source(source)
    keep = frozenset([*fields, *optional])
    # a local file is kept projected on the fields asked for: other fields, another cache entry
    key = (str(Path(source).resolve()), split, keep) if local else (os.fspath(source), split, None)
    with _LOCK:
        data = _CACHE.get(key)
        if data is None:
            if key in _FAILED:
                raise DatasetUnavailableError(
                    f"{_FAILED[key]} (remembered from an earlier attempt in this process)"
                )
            if local:
                data = _read_local(Path(source), keep)
            else:
                try:
                    data = _load_hub(os.fspath(source), split, hint)
                except DatasetUnavailableError as e:
                    _FAILED[key] = str(e)
                    raise
            _check_fields(data, fields, os.fspath(source))
            _CACHE[key] = data
    return data


def _check_fields(data: Any, fields: Sequence[str], name: str) -> None:
    if len(data) == 0:
        raise ValueError(f"dataset {name!r} has no records")
    columns = getattr(data, "column_names", None)
    if columns is not None:
        missing = [f for f in fields if f not in columns]
        if missing:
            raise ValueError(f"dataset {name!r} lacks the field(s) {missing}; it has {list(columns)}")
        return
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise ValueError(f"dataset {name!r}: record {i} is not an object")
        missing = [f for f in fields if f not in row]
        if missing:
            raise ValueError(f"dataset {name!r}: record {i} lacks the field(s) {missing}")


def pick_index(rng: np.random.Generator, n: int, index: Any = None) -> int:
    """``index`` validated against ``n`` items, or one drawn from ``rng`` when it is ``None``."""
    if index is None:
        return int(rng.integers(n))
    if not is_int(index) or not 0 <= index < n:
        raise ValueError(f"options['index'] must be an integer in [0, {n}), got {index!r}")
    return int(index)


def clear_cache() -> None:
    """Forget every loaded source (tests, or to reload a file that changed)."""
    with _LOCK:
        _CACHE.clear()
        _FAILED.clear()
