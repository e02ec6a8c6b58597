"""Endpoint evaluation (OpenAIPolicy, openai SDK) against a loopback fake server that can misbehave.

The server speaks raw HTTP/1.1 over a socket so that it can trickle, cut replies short, send a garbage status
line, redirect, or send huge and deeply nested bodies. It binds 127.0.0.1 only, serves a bounded number of
connections and stops by itself.
"""

from __future__ import annotations

import gzip
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("openai")

from llm_gym.trainer.evaluate import EPISODES_FILE, SUMMARY_FILE, main  # noqa: E402
from llm_gym.trainer.policies import EndpointError, OpenAIPolicy, SamplingParams  # noqa: E402

from llm_gym.agent.records import read_records  # noqa: E402

GOOD = "<think>go right</think><answer>Right</answer>"
SECRET = "sk-test-SECRET-0123456789"
CHAT = [{"role": "user", "content": "hi"}]


# ------------------------------------------------------------------------------------------------ fake server
def _json(code: int, payload, extra: str = "") -> bytes:
    body = json.dumps(payload).encode()
    head = f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}"
    return head.encode() + b"Connection: close\r\n\r\n" + body


def completion(text: str = GOOD, tokens: int = 9) -> bytes:
    return _json(
        200,
        {
            "id": "c1",
            "object": "chat.completion",
            "created": 0,
            "model": "served-model",
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
            ],
            "usage": {"completion_tokens": tokens, "prompt_tokens": 1, "total_tokens": tokens + 1},
        },
    )


MODELS = _json(200, {"object": "list", "data": [{"id": "served-model", "object": "model"}]})


class FakeServer:
    """Serves scripted replies: ``script(request) -> bytes | callable(conn)``; records every request."""

    def __init__(self, script: Callable[[dict], object], max_connections: int = 64, lifetime: float = 20.0):
        self.script = script
        self.requests: list[dict] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._stop = threading.Event()
        self._max, self._deadline = max_connections, time.monotonic() + lifetime
        self._workers: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        served = 0
        while not self._stop.is_set() and served < self._max and time.monotonic() < self._deadline:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            served += 1
            t = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            t.start()
            self._workers.append(t)
        self._sock.close()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        with conn:
            try:
                data = b""
                while b"\r\n\r\n" not in data and len(data) < 1 << 20:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in lines[1:])}
                while len(body) < int(headers.get("content-length", 0)):
                    body += conn.recv(65536)
                request = {"method": method, "path": path, "headers": headers}
                request["body"] = json.loads(body) if body else None
                self.requests.append(request)
                reply = self.script(request)
                if callable(reply):
                    reply(conn, self._stop)
                else:
                    conn.sendall(reply)
            except OSError:  # the client gave up (deadline, size cap): expected in these tests
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for t in self._workers:
            t.join(timeout=5)


@pytest.fixture
def serve():
    servers: list[FakeServer] = []

    def start(script, **kw) -> FakeServer:
        servers.append(FakeServer(script, **kw))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def openai_like(request: dict) -> bytes:
    if request["method"] == "GET" and request["path"] == "/v1/models":
        return MODELS
    if request["method"] == "POST" and request["path"] == "/v1/chat/completions":
        return completion()
    return _json(404, {"error": "not found"})


def then_good(first: Callable[[dict], object]) -> Callable[[dict], object]:
    """A script whose first chat request misbehaves with ``first`` and the rest are answered well."""
    calls = []

    def script(request: dict):
        if request["path"] == "/v1/chat/completions":
            calls.append(1)
            if len(calls) == 1:
                return first(request)
        return openai_like(request)

    return script


def trickle(head: bytes, total: int, every: float = 0.05) -> Callable:
    """Send ``head`` then one byte every ``every`` seconds (never more than ``total`` bytes)."""

    def send(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head)
        for _ in range(total):
            if stop.wait(every):
                return
            conn.sendall(b" ")

    return send


# ------------------------------------------------------------------------------------------------ happy path
def test_openai_policy_end_to_end(serve, tmp_path, capsys):
    server = serve(openai_like)
    out_dir = tmp_path / "ev"
    args = ["--endpoint", server.url, "--model", "served-model", "--env", "FrozenLakeDeterministic", "Bandit"]
    args += [
        "--num_eval_seeds",
        "2",
        "-n",
        "2",
        "--output_dir",
        str(out_dir),
        "--no_progress",
        "--api_key",
        "k",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "FrozenLakeDeterministic-v0" in printed and "Bandit-v0" in printed
    summary = json.loads((out_dir / SUMMARY_FILE).read_text())
    assert summary["temperature"] == 0.5 and set(summary["envs"]) == {
        "llmgym/FrozenLakeDeterministic-v0",
        "llmgym/Bandit-v0",
    }
    fl = summary["envs"]["llmgym/FrozenLakeDeterministic-v0"]
    assert fl["episodes"] == 4 and fl["valid_action_rate"] == 1.0 and "pass@2" in fl
    records = read_records(out_dir / EPISODES_FILE)
    assert len(records) == 8 and all(t.response == GOOD for r in records for t in r.turns)
    chats = [r for r in server.requests if r["path"] == "/v1/chat/completions"]
    first = chats[0]
    assert first["body"]["model"] == "served-model" and first["body"]["temperature"] == 0.5
    assert first["body"]["max_tokens"] == 400 and first["body"]["top_p"] == 1.0
    assert first["body"]["messages"][0]["role"] == "system"
    assert first["headers"]["authorization"] == "Bearer k"
    assert len(chats) == sum(len(r.turns) for r in records)


def test_concurrent_batch_and_token_count(serve):
    server = serve(openai_like)
    policy = OpenAIPolicy(server.url, "served-model", SamplingParams(max_new_tokens=7), concurrency=4)
    assert policy([CHAT] * 6) == [GOOD] * 6
    assert policy.generated_tokens == 6 * 9
    assert all(r["body"]["max_tokens"] == 7 for r in server.requests)


def test_no_key_sends_no_authorization(serve, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server = serve(openai_like)
    assert OpenAIPolicy(server.url, "served-model")([CHAT]) == [GOOD]
    assert "authorization" not in server.requests[0]["headers"]
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    OpenAIPolicy(server.url, "served-model")([CHAT])
    assert server.requests[-1]["headers"]["authorization"] == "Bearer from-env"


def test_probe_errors(serve):
    server = serve(openai_like)
    with pytest.raises(EndpointError, match="not served"):
        OpenAIPolicy(server.url, "other-model").probe()
    assert OpenAIPolicy(server.url, "served-model").probe() == ["served-model"]
    denied = serve(lambda r: _json(401, {"error": "bad key"}))
    with pytest.raises(EndpointError, match="401.*api_key"):
        OpenAIPolicy(denied.url, "served-model").probe()
    odd = serve(lambda r: _json(200, {"object": "list"}))
    with pytest.raises(EndpointError, match="no 'data' array"):
        OpenAIPolicy(odd.url, "served-model").probe()
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with pytest.raises(EndpointError, match="cannot reach"):
        OpenAIPolicy(dead, "m", timeout=2).probe()


@pytest.mark.parametrize(
    "url",
    ["localhost:8000", "ftp://h/v1", "http:///v1", "http://user:pw-SECRET@h/v1", "http://h/v1?key=SECRET"],
)
def test_bad_urls_are_refused_without_echoing_them(url):
    with pytest.raises(EndpointError) as e:
        OpenAIPolicy(url, "m")
    assert "SECRET" not in str(e.value) and "http" in str(e.value)


def test_missing_sdk_gives_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "openai", None)  # import openai -> ImportError
    with pytest.raises(EndpointError, match=r"pip install 'llm-gym\[openai\]'"):
        OpenAIPolicy("http://127.0.0.1:1/v1", "m")


# ------------------------------------------------------------------------------------------------ deadlines
@pytest.mark.parametrize(
    "where",
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n", id="body"
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nX-Slow: ", id="headers"),
    ],
)
def test_trickling_server_hits_the_total_deadline(serve, where):
    # One byte every 50 ms never trips a per-read timeout; the 1 s deadline is for the whole request.
    server = serve(then_good(lambda r: trickle(where, total=400)))
    policy = OpenAIPolicy(server.url, "served-model", timeout=1.0, retries=0)
    start = time.monotonic()
    with pytest.raises(EndpointError, match="1 s deadline"):
        policy([CHAT])
    assert time.monotonic() - start < 2.0
    # The next request opens a fresh connection and succeeds.
    assert policy([CHAT]) == [GOOD]


def test_silent_server_times_out_and_retries(serve):
    def silent(conn, stop):  # accepts the request, never answers
        stop.wait(5)

    server = serve(lambda r: silent if r["path"].endswith("completions") else MODELS)
    policy = OpenAIPolicy(server.url, "served-model", timeout=0.5, retries=1)
    start = time.monotonic()
    with pytest.raises(EndpointError, match="deadline"):
        policy([CHAT])
    assert time.monotonic() - start < 0.5 * 2 + 0.6 + 0.5  # two attempts, one backoff wait, slack
    assert len(server.requests) == 2


# ------------------------------------------------------------------------------------------------ retries
@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(
            b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{"choi',
            id="incomplete-read",
        ),
        pytest.param(b"garbage\r\n\r\n", id="bad-status-line"),
        pytest.param(b"", id="closed-without-reply"),
        pytest.param(_json(503, {"error": "busy"}), id="http-503"),
        pytest.param(_json(429, {"error": "slow down"}, "Retry-After: 3600\r\n"), id="429-retry-after-hour"),
    ],
)
def test_transient_failures_are_retried(serve, broken):
    server = serve(then_good(lambda r: broken))
    start = time.monotonic()
    assert OpenAIPolicy(server.url, "served-model", retries=1)([CHAT]) == [GOOD]
    assert time.monotonic() - start < 3.0  # a server's hour-long Retry-After is not obeyed
    assert len(server.requests) == 2


def test_exhausted_retries_and_client_errors_are_clear(serve):
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{"
    server = serve(lambda r: cut)
    with pytest.raises(EndpointError, match="no usable reply from .* after 2 attempts"):
        OpenAIPolicy(server.url, "served-model", retries=1)([CHAT])
    assert len(server.requests) == 2
    bad = serve(lambda r: _json(400, {"error": "context too long"}))
    with pytest.raises(EndpointError, match="HTTP 400.*context too long"):
        OpenAIPolicy(bad.url, "served-model", retries=3)([CHAT])
    assert len(bad.requests) == 1  # a client error is not retried


# ------------------------------------------------------------------------------------------------ redirects
@pytest.mark.parametrize("code", [301, 302, 307, 308])
def test_key_never_follows_a_redirect_to_another_origin(serve, code):
    other = serve(openai_like)
    target = f"{other.url}/chat/completions"
    server = serve(
        lambda r: f"HTTP/1.1 {code} Moved\r\nLocation: {target}\r\nContent-Length: 0\r\n\r\n".encode()
    )
    policy = OpenAIPolicy(server.url, "served-model", api_key=SECRET, retries=0)
    with pytest.raises(EndpointError, match=f"HTTP {code}.*redirect") as e:
        policy([CHAT])
    assert other.requests == []  # nothing at all reached the other origin
    assert SECRET not in str(e.value)
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"


# ------------------------------------------------------------------------------------------------ hostile bodies
def test_reply_size_is_capped(serve):
    declared = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 999999999\r\n\r\n{"
    server = serve(lambda r: declared)
    with pytest.raises(EndpointError, match="larger than"):
        OpenAIPolicy(server.url, "served-model", retries=3)([CHAT])
    assert len(server.requests) == 1  # not retried: it would be as large again

    def endless(conn, stop):  # no Content-Length: the body runs until the connection closes
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        for _ in range(200):
            if stop.is_set():
                return
            conn.sendall(b"[" * 1000)

    stream = serve(lambda r: endless)
    with pytest.raises(EndpointError, match="larger than the 50,000-byte limit"):
        OpenAIPolicy(stream.url, "served-model", max_reply_bytes=50_000)([CHAT])
    # A reply just under the cap still works.
    ok = serve(openai_like)
    assert OpenAIPolicy(ok.url, "served-model", max_reply_bytes=len(completion()))([CHAT]) == [GOOD]


def test_compressed_replies_are_refused(serve):
    body = gzip.compress(json.dumps({"choices": [{"message": {"content": GOOD}}]}).encode())
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: {len(body)}"
    server = serve(lambda r: head.encode() + b"\r\n\r\n" + body)
    with pytest.raises(EndpointError, match="compressed"):
        OpenAIPolicy(server.url, "served-model")([CHAT])
    assert server.requests[0]["headers"]["accept-encoding"] == "identity"


def test_deeply_nested_json_is_a_clear_error(serve):
    deep = b"[" * 100_000 + b"]" * 100_000
    raw = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(deep) + deep
    )
    server = serve(lambda r: raw)
    with pytest.raises(EndpointError, match="nested too deeply"):
        OpenAIPolicy(server.url, "served-model")([CHAT])
    with pytest.raises(EndpointError, match="nested too deeply"):
        OpenAIPolicy(server.url, "served-model").probe()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)
replies = st.one_of(
    json_values,
    st.fixed_dictionaries({"choices": json_values}),
    st.fixed_dictionaries(
        {
            "choices": st.lists(st.fixed_dictionaries({"message": json_values}), max_size=2),
            "usage": json_values,
        }
    ),
    st.fixed_dictionaries(
        {"choices": st.just([{"message": {"role": "assistant", "content": None}}]), "usage": json_values}
    ),
)


@pytest.fixture(scope="module")
def echo_server():
    """One server for all examples: it answers with whatever ``box[0]`` holds."""
    box: list = [None]
    server = FakeServer(lambda r: _json(200, box[0]), max_connections=200, lifetime=60)
    yield box, OpenAIPolicy(server.url, "served-model", retries=0)
    server.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=replies)
def test_any_json_reply_gives_text_or_a_clear_error(echo_server, payload):
    box, policy = echo_server
    box[0] = payload
    try:
        out = policy([CHAT])
    except EndpointError:
        return
    assert isinstance(out[0], str) and policy.generated_tokens >= 0


# ------------------------------------------------------------------------------------------------ the key
def test_api_key_is_never_printed_logged_or_recorded(serve, tmp_path, capsys, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)  # the SDK's and httpx's debug logs too
    monkeypatch.setenv("OPENAI_LOG", "debug")
    echo = {"error": {"message": f"Incorrect API key provided: {SECRET}"}}
    server = serve(then_good(lambda r: _json(401, echo)))
    policy = OpenAIPolicy(server.url, "served-model", api_key=SECRET)
    with pytest.raises(EndpointError, match="401") as e:  # the server echoes the key in its error
        policy([CHAT])
    assert SECRET not in str(e.value) and "***" in str(e.value)
    assert SECRET not in repr(policy) and SECRET not in str(vars(policy))
    out_dir = tmp_path / "ev"
    args = ["--endpoint", server.url, "--model", "served-model", "--env", "Bandit", "--num_eval_seeds", "2"]
    assert main([*args, "--output_dir", str(out_dir), "--no_progress", "--api_key", SECRET]) == 0
    captured = capsys.readouterr()
    texts = [captured.out, captured.err, caplog.text] + [
        p.read_text() for p in out_dir.rglob("*") if p.is_file()
    ]
    assert all(SECRET not in t for t in texts)
    assert any("/chat/completions" in t for t in (caplog.text,))  # the logs were really captured
    assert server.requests[-1]["headers"]["authorization"] == f"Bearer {SECRET}"


def test_cli_endpoint_errors_are_one_line(serve, tmp_path, capsys):
    base = ["--env", "FrozenLake", "--num_eval_seeds", "1", "--output_dir", str(tmp_path), "--no_progress"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    assert main(["--endpoint", dead, "--model", "m", "--timeout", "2", *base]) == 2
    err = capsys.readouterr().err
    assert "cannot reach" in err and "Traceback" not in err
    assert main(["--endpoint", dead, "--model", "m", "--timeout", "0", *base]) == 2
    assert "timeout" in capsys.readouterr().err
    assert not (tmp_path / EPISODES_FILE).exists()
