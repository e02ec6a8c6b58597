"""Hardening, round four: ``llmgym serve`` against slow and abrupt clients, and ``llmgym/Remote-v0`` against a
hostile server (deadlines over whole replies, deep JSON, bad limits, replies outside the described spaces).

Servers and fake servers bind 127.0.0.1 only; every connection count, wait and reply size is bounded.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llm_gym.serve.config import ServeConfig
from tests._serve import running_server

pytest.importorskip("openenv.core.env_server", reason="the serve extra (openenv) is not installed")
pytest.importorskip("websockets")

from llm_gym.serve.client import RemoteEnvError  # noqa: E402

FL = "llmgym/FrozenLake-v0"


def _get(url: str, timeout: float = 5.0, token: str | None = None) -> tuple[int, float]:
    """``(status, seconds)`` of a GET, with no proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    t0 = time.monotonic()
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, time.monotonic() - t0
    except urllib.error.HTTPError as e:
        return e.code, time.monotonic() - t0


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (a reply it sent first, such as a 401, is read and dropped)."""
    sock.settimeout(0.01)
    try:
        while True:
            if sock.recv(65536) == b"":
                return True
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


# ------------------------------------------------------------------------------------- M1: slow HTTP clients
@pytest.mark.parametrize(
    "token",
    [None, pytest.param("t0ken-for-the-tests-0123456789", marks=pytest.mark.slow)],  # ~10 s each
    ids=["open", "token"],
)
def test_half_sent_requests_neither_starve_others_nor_stay_open(token):
    """Slowloris against 127.0.0.1 (M1): 80 connections holding half a request (more than the old connection
    limit of sessions + 64 = 68, at which every HTTP request was a 503), each dripping a byte a second. Other
    requests are answered at once the whole time; with 68 waiting connections allowed the oldest are closed to make
    room for the newest, and every one is closed by the request-read deadline. With a token the slow clients,
    which send none (the token is checked once the headers are in), still made requests with it a 503."""
    read_timeout = 3.0
    args = ("--max_sessions", "4", "--read_timeout", str(read_timeout), "--max_waiting_connections", "68")
    with running_server("--env", "FrozenLake", *args, env={"LLMGYM_SERVE_TOKEN": token or ""}) as srv:
        socks = []
        for i in range(80):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            if i % 2:  # headers cut off
                s.sendall(b"POST /llmgym/describe HTTP/1.1\r\nHost: x\r\n")
            else:  # headers complete, the body cut off
                s.sendall(b"POST /llmgym/describe HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            socks.append(s)
        t0 = time.monotonic()
        time.sleep(0.3)
        # 68 may wait: the 12 oldest made room, the newest still wait
        assert all(_closed_by_peer(s) for s in socks[:12])
        assert not any(_closed_by_peer(s) for s in socks[-20:])
        # a kept-alive connection: one request answered, then half of the next
        kept = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n")
        assert kept.recv(4096).startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        socks.append(kept)
        while time.monotonic() - t0 < read_timeout - 1.0:
            for path in ("/health", "/llmgym/status"):
                status, took = _get(srv.url + path, token=token)
                assert status == 200 and took < 2.0, (path, status, took)
            for s in socks[12:]:
                try:
                    s.sendall(b"x")  # a byte at a time: each read is quick, the request never ends
                except OSError:
                    pass
            time.sleep(0.5)
        deadline = t0 + read_timeout + 5.0
        while time.monotonic() < deadline and not all(_closed_by_peer(s) for s in socks):
            time.sleep(0.2)
        assert all(_closed_by_peer(s) for s in socks), "a half-sent request outlived the read deadline"
        for s in socks:
            s.close()
        assert _get(srv.url + "/health", token=token)[0] == 200


def test_a_request_in_flight_past_the_limit_is_a_503_and_others_run():
    """Guard bounds the HTTP requests in the app at once (max_sessions + 64): one more is a 503, not a queue."""
    from llm_gym.serve.server import Guard

    config = ServeConfig(env_ids=(FL,), max_sessions=1)
    release = asyncio.Event()
    running = []

    async def app(scope, receive, send):
        running.append(scope["path"])
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard = Guard(app, config)

    async def one(path: str) -> int:
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(m):
            sent.append(m)

        await guard({"type": "http", "path": path, "headers": []}, receive, send)
        return sent[0]["status"]

    async def run() -> list[int]:
        limit = config.max_http_requests
        held = [asyncio.ensure_future(one("/held")) for _ in range(limit)]
        while len(running) < limit:
            await asyncio.sleep(0.01)
        refused = await asyncio.wait_for(one("/one-more"), 5)
        release.set()
        return [refused, *await asyncio.wait_for(asyncio.gather(*held), 5)]

    statuses = asyncio.run(run())
    assert statuses[0] == 503 and set(statuses[1:]) == {200}
    assert guard.http_in_app == 0 and "/one-more" not in running


# ------------------------------------------------------------------------------------- L4, L5: server log
def _rst(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0): the peer is gone before the server's reply."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _ws_frame(text: bytes) -> bytes:
    """One masked client text frame (RFC 6455), written by hand so that it may carry invalid UTF-8."""
    mask = b"\x01\x02\x03\x04"
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(text))
    length = (
        bytes([0x80 | len(text)]) if len(text) < 126 else bytes([0x80 | 126]) + struct.pack("!H", len(text))
    )
    return b"\x81" + length + mask + body


def _ws_open(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(4096)
        assert chunk, "the handshake was refused"
        got += chunk
    assert b" 101 " in got.split(b"\r\n", 1)[0]
    return s


def test_abrupt_disconnects_and_deep_describe_bodies_log_no_traceback():
    """L4: a client that resets its connection before the server's reply (10 times, mid-reset) and one sending
    invalid UTF-8 leave no traceback in the server's log; L5: a describe body nested 100,000 deep is a 400,
    not a 500 with a RecursionError."""
    rows = [list("#" * 30)] + [list("#" + " " * 28 + "#") for _ in range(28)] + [list("#" * 30)]
    rows[1][1] = "@"
    for i in range(4):  # boxes far from their goals: the solver works a while before the reply
        rows[3 + 2 * i][3 + i], rows[26 - i][26 - 2 * i] = "$", "."
    level = "\n".join("".join(r) for r in rows)
    with running_server("--env", "Sokoban,FrozenLake", "--max_sessions", "16") as srv:
        for i in range(10):
            s = _ws_open(srv.port)
            data = {"env_id": "llmgym/Sokoban-v0", "options": {"level": level}} if i % 2 else {"env_id": FL}
            s.sendall(_ws_frame(json.dumps({"type": "reset", "data": data}).encode()))
            time.sleep(0.05)
            _rst(s)
        s = _ws_open(srv.port)
        s.sendall(_ws_frame(b'{"type": "\xff\xfe"}'))
        time.sleep(0.5)
        s.close()
        assert srv.wait_open_envs(0) == 0
        time.sleep(0.5)
        log = srv.output()
        assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]
        body = b"[" * 100_000 + b"]" * 100_000
        req = urllib.request.Request(
            srv.url + "/llmgym/describe", data=body, headers={"Content-Type": "application/json"}
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with pytest.raises(urllib.error.HTTPError) as err:
            opener.open(req, timeout=10)
        assert err.value.code == 400 and b"nested too deeply" in err.value.read()
        time.sleep(0.3)
        log = srv.output()
    assert "Traceback" not in log and "RecursionError" not in log, log[-3000:]


# ------------------------------------------------------------------------ a fake server for the client's side
class _Fake:
    """A hostile ``llmgym serve`` on 127.0.0.1: ``handler(request_handler)`` writes whatever it likes."""

    def __init__(self, handler: Callable[[BaseHTTPRequestHandler], None]):
        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                handler(self)

            do_POST = do_GET  # noqa: N815

            def log_message(self, *a):  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextmanager
def fake_server(handler: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    fake = _Fake(handler)
    try:
        yield fake.url
    finally:
        fake.close()


def _drip(
    data: bytes, every_s: float = 0.25, for_s: float = 10.0
) -> Callable[[BaseHTTPRequestHandler], None]:
    """A byte of ``data`` every ``every_s``, for at most ``for_s`` (then the connection is closed: a client with
    no deadline over the whole reply fails the test late instead of hanging it)."""

    def handler(h: BaseHTTPRequestHandler) -> None:
        if h.command == "POST":
            h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            for b in data[: int(for_s / every_s)]:
                h.wfile.write(bytes([b]))
                h.wfile.flush()
                time.sleep(every_s)
        except OSError:
            pass

    return handler


def _describe_reply(**limits) -> dict:
    import gymnasium as gym

    from llm_gym.serve.protocol import describe

    env = gym.make(FL)
    out = describe(FL, env)
    env.close()
    out.update(
        env_kwargs={}, fixed_kwargs={}, limits={"max_action_chars": 16384, "ws_max_bytes": 1 << 18, **limits}
    )
    return out


def _reply_json(h: BaseHTTPRequestHandler, payload: bytes | str) -> None:
    body = payload.encode() if isinstance(payload, str) else payload
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def _server_frame(payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        head = bytes([0x81, n])
    elif n < 1 << 16:
        head = bytes([0x81, 126]) + struct.pack("!H", n)
    else:
        head = bytes([0x81, 127]) + struct.pack("!Q", n)
    return head + payload


def _read_client_frame(rfile) -> bytes:
    b1, b2 = rfile.read(2)
    n = b2 & 0x7F
    if n == 126:
        n = struct.unpack("!H", rfile.read(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", rfile.read(8))[0]
    mask = rfile.read(4)
    return bytes(b ^ mask[i % 4] for i, b in enumerate(rfile.read(n)))


def _observation(text: str = "", reward=None, **fields) -> dict:
    obs = {"text": text, "info": {}, "attributes": {}, "terminated": False, "truncated": False, **fields}
    return {"type": "observation", "data": {"observation": obs, "reward": reward, "done": False}}


def _hostile(describe: dict | bytes, on_step: Callable[[], bytes | None]) -> Callable:
    """A fake server: ``describe`` answers /llmgym/describe; on /ws, a valid reset reply, then ``on_step()``'s
    text for the step (``None``: nothing, the connection held open)."""
    import base64
    import hashlib

    def handler(h: BaseHTTPRequestHandler) -> None:
        if h.path == "/llmgym/describe":
            h.rfile.read(int(h.headers.get("Content-Length") or 0))
            return _reply_json(h, describe if isinstance(describe, bytes) else json.dumps(describe))
        key = h.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(
            hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
        )
        h.wfile.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        try:
            _read_client_frame(h.rfile)  # reset
            h.wfile.write(_server_frame(json.dumps(_observation("FFF\n")).encode()))
            _read_client_frame(h.rfile)  # step
            payload = on_step()
            if payload is not None:
                h.wfile.write(_server_frame(payload))
            time.sleep(8)  # never finish a close handshake
        except (OSError, ValueError):
            pass

    return handler


def _make_remote(url: str, **kw):
    import gymnasium as gym

    return gym.make(
        "llmgym/Remote-v0",
        url=url,
        env_id=FL,
        connect_timeout_s=kw.pop("connect_timeout_s", 1.0),
        request_timeout_s=kw.pop("request_timeout_s", 3.0),
        disable_env_checker=True,
        **kw,
    )


# ----------------------------------------------------------------------------------- M3: deadlines as a whole
@pytest.mark.parametrize("part", ["body", "headers"])
def test_describe_and_status_have_a_deadline_over_the_whole_reply(part):
    """M3: a server answering a byte every 0.25 s (each read is quick, the reply takes minutes) fails gym.make and
    server_status within their time bound, not per read."""
    from llm_gym.serve.client import server_status

    body = json.dumps(_describe_reply()).encode()
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    )

    def handler(h: BaseHTTPRequestHandler) -> None:
        if part == "body":
            h.wfile.write(head)
            h.wfile.flush()
        _drip(head + body if part == "headers" else body)(h)

    with fake_server(handler) as url:
        t0 = time.monotonic()
        with pytest.raises(RemoteEnvError, match="no complete reply within 3 s"):
            _make_remote(url, connect_timeout_s=1.0, request_timeout_s=2.0)
        assert time.monotonic() - t0 < 6.0
        t0 = time.monotonic()
        with pytest.raises(RemoteEnvError, match="no complete reply within 2 s"):
            server_status(url, timeout_s=2.0)
        assert time.monotonic() - t0 < 5.0


# ------------------------------------------------------------------- L1, L2: describe replies and their limits
@pytest.mark.parametrize(
    "reply, message",
    [
        (b"[" * 1_000_000, "nested deeper than 64"),  # L1: Python's reader would raise RecursionError
        (
            json.dumps(
                {**_describe_reply(), "fixed_kwargs": {"a": json.loads("[" * 500 + "]" * 500)}}
            ).encode(),
            "nested deeper than 64",
        ),
        (json.dumps(_describe_reply(ws_max_bytes=float("inf"))).encode(), "NaN or an infinite"),  # L2
        (json.dumps(_describe_reply(ws_max_bytes=-5)).encode(), "ws_max_bytes must be an integer"),  # L2
        (json.dumps(_describe_reply(ws_max_bytes=1.5)).encode(), "ws_max_bytes must be an integer"),
        (
            json.dumps({**_describe_reply(), "attributes": {"action_names": 5}}).encode(),
            "'action_names' is not a names value",
        ),
    ],
    ids=["deep", "deep-fixed-kwargs", "ws-max-inf", "ws-max-negative", "ws-max-float", "attributes-type"],
)
def test_a_describe_reply_that_cannot_be_used_is_one_error(reply, message):
    with fake_server(_hostile(reply, lambda: None)) as url:
        with pytest.raises(RemoteEnvError, match=message):
            _make_remote(url)


# --------------------------------------------------------------------- L1, L3, M4: WebSocket replies checked
@pytest.mark.parametrize(
    "step_reply, message",
    [
        (b"[" * 1_000_000, "nested deeper than 64"),  # L1 (a 1 MB reply within the client's bound)
        (json.dumps(_observation("x" * 100_000, 0.0)).encode(), "not in the observation space"),  # L3
        (
            json.dumps(_observation("FFF\n", 0.0, attributes={"action_names": 5})).encode(),
            "action_names",
        ),  # L3
        (json.dumps(_observation("FFF\n", float("nan"))).encode(), "NaN or an infinite"),  # M4 over the wire
        (json.dumps(_observation("FFF\n", 1e308)).replace("1e+308", "1e999").encode(), "NaN or an infinite"),
        (
            json.dumps(_observation("y" * 3_000_000, 0.0)).encode(),
            "over this client's limit of 1048576 bytes",
        ),
    ],
    ids=["deep", "obs-over-space", "attribute-type", "nan-reward", "1e999-reward", "over-size"],
)
def test_a_websocket_reply_outside_what_describe_announced_is_one_error_and_drops_the_session(
    step_reply, message
):
    import gymnasium as gym

    with fake_server(_hostile(_describe_reply(), lambda: step_reply)) as url:
        env = _make_remote(url)
        assert env.reset(seed=0)[0] == "FFF\n"
        t0 = time.monotonic()
        with pytest.raises(RemoteEnvError, match=message):
            env.step("<answer>Up</answer>")
        assert time.monotonic() - t0 < 2.5  # reported as what it is, not as a time-out after 3 s
        with pytest.raises(gym.error.ResetNeeded):  # the session was dropped
            env.step("<answer>Up</answer>")
        env.close()


def test_the_open_file_limit_is_raised_toward_what_the_bounds_hold_or_a_warning_says_so(monkeypatch, capsys):
    """Sessions, waiting connections and requests in the app all hold a file descriptor: with ulimit -n below
    their sum a flood would hit EMFILE first (asyncio then stops accepting for a second at a time)."""
    import resource

    from llm_gym.serve.server import _raise_file_limit

    config = ServeConfig(env_ids=(FL,), max_sessions=10, max_waiting_connections=100)
    need = 2 * 10 + 100 + (10 + 64) + 256
    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: (64, 300))
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: calls.append(limits))
    _raise_file_limit(config)
    assert (
        calls == [(300, 300)] and f"fewer than the {need}" in capsys.readouterr().err
    )  # capped by the hard one
    calls.clear()
    monkeypatch.setattr(resource, "getrlimit", lambda which: (64, 100_000))
    _raise_file_limit(config)
    assert calls == [(need, 100_000)] and capsys.readouterr().err == ""
