"""The one bounded reader for untrusted JSON-lines files: episode records, exported rows and task data files.

Every line is read with a length cap (``readline(limit)``), so a 100 MB line or ``/dev/zero`` costs at most the
cap in memory before a clear error, and a file may be given a total-size cap. Decoding turns every way a line can
be bad (invalid UTF-8, invalid JSON, nesting too deep for the parser, an integer over Python's 4,300-digit
conversion limit) into a ``ValueError`` with a short reason. Callers wrap the reason in their own error type
with the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

#: Longest line accepted (bytes, newline included). A record of many long turns stays far below it.
MAX_LINE_BYTES = 32 * 1024**2
#: Largest data file read (bytes): every row is held in memory.
MAX_FILE_BYTES = 1024**3

_BOM = b"\xef\xbb\xbf"


class JsonlError(ValueError):
    """A bad line: ``reason`` (what is wrong) at ``lineno`` (1-based; 0 for the file as a whole)."""

    def __init__(self, reason: str, lineno: int = 0, path: str = ""):
        self.reason, self.lineno, self.path = reason, lineno, path
        where = f"{path}:{lineno}" if lineno else path
        super().__init__(f"{where}: {reason}" if where else reason)


def iter_lines(
    f: IO[bytes],
    *,
    path: str = "",
    max_line_bytes: int | None = None,
    max_total_bytes: int | None = None,
) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)`` for each line of the binary file ``f`` (the newline kept; a UTF-8 byte order mark
    at the start dropped). Raises :class:`JsonlError` for a line over ``max_line_bytes`` (default
    :data:`MAX_LINE_BYTES`) or, with ``max_total_bytes``, a file larger than that, before reading further."""
    if max_line_bytes is None:
        max_line_bytes = MAX_LINE_BYTES
    total = 0
    lineno = 0
    while True:
        raw = f.readline(max_line_bytes + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > max_line_bytes:
            raise JsonlError(f"line longer than {max_line_bytes:,} bytes", lineno, path)
        total += len(raw)
        if max_total_bytes is not None and total > max_total_bytes:
            raise JsonlError(f"file larger than {max_total_bytes:,} bytes", 0, path)
        if lineno == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM) :]
        yield lineno, raw


def decode_json(raw: bytes | str) -> Any:
    """The JSON value of one line (or a whole text); ``ValueError`` with a short reason for anything invalid."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"not valid UTF-8 (byte {e.start + 1} of the line)") from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as e:  # e.g. an integer over the 4,300-digit conversion limit
        raise ValueError(f"invalid JSON value ({str(e)[:120]})") from None
