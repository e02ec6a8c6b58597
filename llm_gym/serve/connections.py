"""HTTP connection bounds for ``llmgym serve``: a request must arrive within a deadline, and connections still
waiting for one are a bounded pool whose oldest member makes room for a new one.

uvicorn bounds a connection's idle time only between requests (``timeout_keep_alive``), not while a request's
headers or body arrive, and its ``limit_concurrency`` counts every open connection: a few hundred connections each
holding half a request (slowloris) made every other HTTP request a 503, without a token, for as long as they were
held. Here, instead:

* every connection reading a request (its request line, headers and body), or idle between two, must finish that
  request within ``read_timeout_s`` of its first byte (of the connection, for the first one): else it is closed;
* at most ``max_pending`` (``--max_waiting_connections``) connections read or wait at once; one more closes the
  one that has waited longest. Below that bound slow clients are closed only by the deadline and never touch a
  request that arrives at once; past it, a request that arrives at once is still never the oldest unless slow
  clients reconnect faster than it is read (a connection flood, which only a per-address limit in front stops);
* once a request has arrived, the app's time is bounded by :class:`llm_gym.serve.server.Guard` (request time and
  the number of requests in the app at once), not here.

This is the one place that subclasses uvicorn's h11 protocol (its ``conn`` (the h11 connection), ``transport`` and
``loop`` attributes; pinned by ``tests/test_hardening_serve.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

#: h11 states of the peer in which a request is still arriving (or none has started yet).
_READING = (h11.IDLE, h11.SEND_BODY)


class PendingPool:
    """Connections waiting for (the rest of) a request, oldest first; one app's pool, shared by its protocols."""

    def __init__(self, max_pending: int, read_timeout_s: float):
        self.max_pending = max_pending
        self.read_timeout_s = read_timeout_s
        self.members: OrderedDict[Any, None] = OrderedDict()
        self.evicted = 0
        self.expired = 0

    def add(self, protocol: Any) -> None:
        self.members[protocol] = None
        while len(self.members) > self.max_pending:
            oldest, _ = self.members.popitem(last=False)
            self.evicted += 1
            oldest.drop_pending()

    def discard(self, protocol: Any) -> None:
        self.members.pop(protocol, None)


def bounded_h11_protocol(pool: PendingPool) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a request-read deadline and a place in ``pool`` while it waits for a request."""

    class BoundedH11Protocol(H11Protocol):
        _read_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._read_timer is None:
                self._read_timer = self.loop.call_later(pool.read_timeout_s, self._read_expired)
                pool.add(self)

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None
            pool.discard(self)

        def _read_expired(self) -> None:
            self._read_timer = None
            pool.discard(self)
            if self.conn.their_state in _READING:
                pool.expired += 1
                self.transport.close()

        def drop_pending(self) -> None:
            """Evicted from the pool to make room: close, unless the request arrived meanwhile."""
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None
            if self.conn.their_state in _READING:
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE:
                self._arm()  # a request starts (a no-op when the deadline of this one is already running)
            super().data_received(data)
            if self.conn.their_state not in _READING:
                self._disarm()  # the request has arrived (or the connection was upgraded / refused)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state in _READING:
                # idle between requests, or a pipelined request still arriving: in the pool too, with a deadline
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return BoundedH11Protocol


#: Exceptions a client can cause at will (invalid UTF-8 in a text frame, a disconnect mid-reply): logged as the
#: one line uvicorn writes, without the traceback (6 KB each: any client could grow the log at will).
CLIENT_FAULTS: tuple[type[BaseException], ...] = (UnicodeDecodeError, ConnectionError)


class ClientFaultLogFilter(logging.Filter):
    """Drops the traceback of a log record whose exception is one of :data:`CLIENT_FAULTS`; keeps the line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0] if record.exc_info else None
        if exc is not None and issubclass(exc, CLIENT_FAULTS):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_client_faults(logger_name: str = "uvicorn.error") -> None:
    """Install :class:`ClientFaultLogFilter` on uvicorn's error log (once)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, ClientFaultLogFilter) for f in logger.filters):
        logger.addFilter(ClientFaultLogFilter())
