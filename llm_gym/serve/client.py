"""``llmgym/Remote-v0``: a ``gymnasium.Env`` that plays an llm-gym environment served by ``llmgym serve``.

::

    env = gym.make("llmgym/Remote-v0", url="http://127.0.0.1:8000", env_id="llmgym/Sokoban-v0")
    obs, info = env.reset(seed=7)          # the same observation as gym.make("llmgym/Sokoban-v0") gives
    obs, reward, terminated, truncated, info = env.step("<answer>Up</answer>")

Construction asks the server to describe the id (``POST /llmgym/describe``: spaces and attributes; unknown ids
and bad kwargs fail here with the server's 4xx message); the first ``reset`` opens the session (one WebSocket,
speaking OpenEnv's protocol); ``close`` ends it and frees the server's env. Observations, rewards,
``terminated`` / ``truncated`` and ``info`` are the server env's, so the same seeds give the same episodes as the
local env. Attributes that prompt formatting reads (``instructions``, ``think``, ``action_names``,
``actions_left`` ...) are mirrored on this env.

Every wait is bounded as a whole, not per read: connecting (``connect_timeout_s``) and each reply
(``request_timeout_s``; describe gets both together). Replies are untrusted input: at most 8 MiB, JSON nested at
most 64 levels, finite numbers, observations inside the described space and attributes of their JSON type, else a
:class:`RemoteEnvError` (the session dropped). A lost connection (server stopped or restarted, session expired) raises :class:`RemoteEnvError` naming the cause; the
episode is gone, and the next ``reset`` opens a new session.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import gymnasium as gym

from llm_gym.core.checks import is_int, is_number
from llm_gym.registration import check_seed, check_trusted_env_id, resolve_env_id
from llm_gym.serve.protocol import (
    CLOSE_IDLE,
    CLOSE_REQUEST_TIMEOUT,
    DYNAMIC_ATTRIBUTES,
    PROTOCOL_VERSION,
    STATIC_ATTRIBUTES,
    check_surface,
    parse_env_urls,
    space_from_json,
)

INSTALL_HINT = "llmgym/Remote-v0 needs the websockets package: pip install 'llm-gym[serve]'"
#: Longest reply read from a server (a describe answer or one WebSocket message).
MAX_REPLY_BYTES = 8 << 20
#: Deepest nesting of a server's JSON reply (ours nest a few levels; Python's reader recurses once per level).
MAX_REPLY_DEPTH = 64


class RemoteEnvError(ConnectionError):
    """The server could not be reached, refused the session, or the session was lost (an ``OSError``: command
    lines report it as an I/O failure, in one line)."""


class RemoteRequestError(ValueError):
    """The server refused a request as invalid (an HTTP-style 4xx ``status``): unknown id, bad kwargs, an action
    over the size limit ... Nothing was executed."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _split_url(url: str) -> tuple[str, str | None, bool]:
    """``(base http(s) URL without credentials, password from the URL or None, is loopback)``."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("url must be the server's address, e.g. http://127.0.0.1:8000")
    parse_env_urls(url, allow_credentials=True)
    parts = urllib.parse.urlsplit(url.strip())
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url must look like http://HOST:PORT (or ws://, https://, wss://), got {url!r}")
    host = parts.hostname
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    base = urllib.parse.urlunsplit((scheme, netloc, parts.path.rstrip("/"), "", ""))
    from llm_gym.serve.config import is_loopback

    return base, parts.password, is_loopback(host)


def _finite_numbers(value: Any) -> bool:
    """Whether every number in a decoded JSON value is finite (iterative: the depth is the caller's check)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return False
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def _depth(value: Any) -> int:
    """How deep a decoded JSON value nests (iterative)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def _decode(raw: bytes | str) -> Any:
    """A server's JSON reply, else ``ValueError`` saying why: not JSON, nested deeper than
    :data:`MAX_REPLY_DEPTH` (Python's reader recurses once per level and raises ``RecursionError`` past ~1,000),
    or holding NaN or an infinite number (Python's reader accepts ``NaN``, ``Infinity`` and ``1e999``)."""
    too_deep = f"the reply is JSON nested deeper than {MAX_REPLY_DEPTH} levels"
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(too_deep) from None
    except ValueError:
        raise ValueError("the reply is not JSON") from None
    if _depth(value) > MAX_REPLY_DEPTH:
        raise ValueError(too_deep)
    if not _finite_numbers(value):
        raise ValueError("the reply holds NaN or an infinite number")
    return value


def _error_text(body: bytes | bytearray) -> str:
    try:
        data = _decode(body.decode("utf-8", "replace"))
    except ValueError:
        return body[:300].decode("utf-8", "replace")
    if isinstance(data, dict):
        detail = data.get("detail", data)
        return detail if isinstance(detail, str) else json.dumps(detail)[:300]
    return str(data)[:300]


def _status_of(message: str) -> int | None:
    """The ``[4xx]`` tag a server's request error starts with (``RequestError``), if any."""
    if message.startswith("[") and message[4:5] == "]" and message[1:4].isdigit():
        return int(message[1:4])
    return None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """``llmgym serve`` never redirects: a redirect is not followed, so the bearer token never goes elsewhere."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        return None  # urllib then raises the 3xx as an HTTPError


class _Deadline:
    """One request's time bound as a whole: when it passes, the request's sockets are shut down, which ends any
    read blocked on them (``urlopen``'s timeout bounds each read, so a server sending a byte a second held a
    describe for days)."""

    def __init__(self, seconds: float):
        self.expired = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.append(sock)
            if self.expired:
                self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            pass

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._socks:
                self._shut(sock)

    def cancel(self) -> None:
        self._timer.cancel()


def _deadline_handlers(deadline: _Deadline) -> list[Any]:
    """urllib handlers whose connections are watched by ``deadline`` (a proxy's connection too)."""

    class Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()
            deadline.watch(self.sock)

    class TLSConn(http.client.HTTPSConnection):
        def connect(self) -> None:
            super().connect()
            deadline.watch(self.sock)

    class Handler(urllib.request.HTTPHandler):
        def http_open(self, req):  # noqa: ANN001 - urllib's signature
            return self.do_open(Conn, req)

    class TLSHandler(urllib.request.HTTPSHandler):
        def __init__(self) -> None:
            self.tls_context = ssl.create_default_context()
            super().__init__(context=self.tls_context)

        def https_open(self, req):  # noqa: ANN001 - urllib's signature
            return self.do_open(TLSConn, req, context=self.tls_context)

    return [Handler(), TLSHandler()]


def _http_json(
    base: str, path: str, body: dict[str, Any] | None = None, *, token: str | None, timeout_s: float
) -> dict[str, Any]:
    """``GET`` (or ``POST body``) ``base + path`` and the JSON object it answers, all within ``timeout_s``; every
    failure is a :class:`RemoteEnvError` (unreachable, 401, 5xx, not JSON, no whole reply in time) or a
    :class:`RemoteRequestError` (another 4xx)."""
    from llm_gym.serve.config import is_loopback

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    req = urllib.request.Request(base + path, data=data, headers=headers, method="POST" if data else "GET")
    host = urllib.parse.urlsplit(base).hostname or ""
    deadline = _Deadline(timeout_s)
    handlers: list[Any] = [_NoRedirects(), *_deadline_handlers(deadline)]
    if is_loopback(host):
        handlers.append(urllib.request.ProxyHandler({}))
    opener = urllib.request.build_opener(*handlers)
    late = RemoteEnvError(f"{base}{path}: no complete reply within {timeout_s:g} s")
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            raw = resp.read(MAX_REPLY_BYTES + 1)
    except urllib.error.HTTPError as e:
        if deadline.expired:
            raise late from None
        if 300 <= e.code < 400:
            where = str(e.headers.get("Location", "?"))[:200] if e.headers else "?"
            raise RemoteEnvError(
                f"{base}{path} answered a redirect (HTTP {e.code} to {where}); not followed: llmgym serve never "
                "redirects, and the token is sent only to the URL given"
            ) from None
        try:
            text = _error_text(e.read(1 << 16))
        except (OSError, http.client.HTTPException):
            text = "(the body could not be read)"
        finally:
            deadline.cancel()
        if e.code == 401:
            raise RemoteEnvError(f"{base} refused the token (HTTP 401): {text}") from None
        if 400 <= e.code < 500:
            raise RemoteRequestError(e.code, f"{base}: {text}") from None
        raise RemoteEnvError(f"{base}{path} failed (HTTP {e.code}): {text}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        if deadline.expired:
            raise late from None
        reason = getattr(e, "reason", e)
        raise RemoteEnvError(
            f"cannot reach the env server at {base}: {reason} (is llmgym serve running?)"
        ) from None
    finally:
        deadline.cancel()
    if deadline.expired:  # a body cut short by the deadline
        raise late
    if len(raw) > MAX_REPLY_BYTES:
        raise RemoteEnvError(f"{base}{path}: reply over {MAX_REPLY_BYTES} bytes")
    try:
        out = _decode(raw)
    except ValueError as e:
        raise RemoteEnvError(f"{base}{path}: {e}") from None
    if not isinstance(out, dict):
        raise RemoteEnvError(f"{base}{path}: the reply is not a JSON object")
    return out


class RemoteEnv(gym.Env[str, str]):
    """An llm-gym environment played on a server (``llmgym serve``) through one WebSocket session.

    Args:
        url: the server, ``http://HOST:PORT`` (``ws://`` and ``https://`` work too; a password in the URL is
            taken as the token).
        env_id: the llm-gym id to play (short names resolve as on the command line).
        env_kwargs: constructor kwargs, checked by the server against the id's constructor.
        token: bearer token (default: the URL's password, else ``LLMGYM_SERVE_TOKEN``).
        connect_timeout_s: bound on opening a connection.
        request_timeout_s: bound on each whole reply; past it the session is dropped and :class:`RemoteEnvError`
            raised.
        render_mode: only ``None`` (the server never renders).
    """

    metadata: dict[str, Any] = {"render_modes": [], "render_fps": 4}

    def __init__(
        self,
        url: str | None = None,
        env_id: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        *,
        token: str | None = None,
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 120.0,
        render_mode: str | None = None,
    ):
        if url is None or env_id is None:
            # Gymnasium's convention for an id that cannot be built from defaults: tools that walk the registry
            # (its env test suite, env checkers) skip ids raising MissingArgument, as they skip missing extras
            raise gym.error.MissingArgument(
                "llmgym/Remote-v0 plays an env served by `llmgym serve` and needs url= and env_id=, e.g. "
                "gym.make('llmgym/Remote-v0', url='http://127.0.0.1:8000', env_id='llmgym/FrozenLake-v0')"
            )
        if render_mode is not None:
            raise ValueError(
                "llmgym/Remote-v0 does not render (render_mode must be None); replay its records"
            )
        self.url, url_token, self._loopback = _split_url(url)
        self.env_id = check_trusted_env_id(resolve_env_id(env_id), "env_id")
        self.env_kwargs = dict(env_kwargs or {})
        self._token = token or url_token or os.environ.get("LLMGYM_SERVE_TOKEN") or None
        for name, v in (("connect_timeout_s", connect_timeout_s), ("request_timeout_s", request_timeout_s)):
            if not is_number(v) or not 0 < v <= 86400:
                raise ValueError(f"{name} must be a number of seconds in (0, 86400], got {v!r}")
        self.connect_timeout_s = float(connect_timeout_s)
        self.request_timeout_s = float(request_timeout_s)
        self.render_mode = None
        self._ws: Any = None
        self._has_reset = False
        desc = self._describe()
        try:
            if desc.get("protocol") != PROTOCOL_VERSION:
                raise ValueError(f"protocol {desc.get('protocol')!r}, this client speaks {PROTOCOL_VERSION}")
            self.observation_space = space_from_json(desc["observation_space"])
            self.action_space = space_from_json(desc["action_space"])
            attrs = check_surface(desc.get("attributes"))
            limits = desc.get("limits") or {}
            if not isinstance(limits, dict):
                raise ValueError("limits must be an object")
            ws_max = limits.get("ws_max_bytes", 1 << 20)
            if not is_int(ws_max, numpy=False) or not 1 <= ws_max <= MAX_REPLY_BYTES:
                raise ValueError(
                    f"limits.ws_max_bytes must be an integer in [1, {MAX_REPLY_BYTES}], got {ws_max!r:.40}"
                )
            self._ws_max_bytes = min(ws_max * 4, MAX_REPLY_BYTES)
            fixed = desc.get("fixed_kwargs", {})
            if not isinstance(fixed, dict):
                raise ValueError("fixed_kwargs must be an object")
        except (KeyError, TypeError, ValueError) as e:
            raise RemoteEnvError(f"{self.url} gave a describe reply this client cannot use: {e}") from None
        self._attrs: dict[str, Any] = dict(attrs)
        #: kwargs the server's operator fixed for this id to values other than its defaults: the episodes are
        #: those of ``env_id`` made with these too (whatever ``env_kwargs`` says).
        self.server_kwargs: dict[str, Any] = dict(fixed)

    # ------------------------------------------------------------------------------------------ transport
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _describe(self) -> dict[str, Any]:
        return _http_json(
            self.url,
            "/llmgym/describe",
            {"env_id": self.env_id, "env_kwargs": self.env_kwargs},
            token=self._token,
            timeout_s=self.connect_timeout_s + self.request_timeout_s,
        )

    def _connect(self) -> None:
        try:
            from websockets.exceptions import InvalidHandshake, InvalidStatus
            from websockets.sync.client import connect
        except ImportError as e:
            raise ImportError(f"{INSTALL_HINT} ({e})") from None
        ws_url = "ws" + self.url[4:] + "/ws"
        try:
            self._ws = connect(
                ws_url,
                additional_headers=self._headers(),
                open_timeout=self.connect_timeout_s,
                close_timeout=2.0,
                max_size=self._ws_max_bytes,
                proxy=None if self._loopback else True,
            )
            self._ws.__enter__()  # the context-manager protocol (websockets >= 17 warns without it)
        except InvalidStatus as e:
            status = e.response.status_code
            text = _error_text(e.response.body or b"")
            if status == 401:
                raise RemoteEnvError(f"{self.url} refused the token (HTTP 401): {text}") from None
            raise RemoteEnvError(f"{self.url} refused the session (HTTP {status}): {text}") from None
        except (InvalidHandshake, OSError, TimeoutError) as e:
            raise RemoteEnvError(
                f"cannot open a session at {ws_url}: {e} (is llmgym serve running?)"
            ) from None

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        self._has_reset = False
        if ws is not None:
            try:
                ws.close()
            except Exception:  # noqa: BLE001 (already broken)
                pass

    def _lost(self, e: Exception) -> RemoteEnvError:
        from websockets.exceptions import ConnectionClosed

        why = str(e) or type(e).__name__
        if isinstance(e, ConnectionClosed):
            rcvd = e.rcvd
            if rcvd is not None and rcvd.code == CLOSE_IDLE:
                why = f"the server closed the idle session ({rcvd.reason})"
            elif rcvd is not None and rcvd.code == CLOSE_REQUEST_TIMEOUT:
                why = f"the server closed the session: a request took too long ({rcvd.reason})"
            elif rcvd is not None and rcvd.code == 1009:
                why = "the server closed the session: a message was over its size limit"
            elif rcvd is not None and rcvd.code in (
                1001,
                1012,
            ):  # going away, service restart: a graceful stop
                why = f"the server is stopping or restarting (it closed the session, code {rcvd.code})"
            elif rcvd is None:
                why = "the connection was lost (server stopped or restarted?)"
            else:
                why = f"the server closed the session (code {rcvd.code}{': ' + rcvd.reason if rcvd.reason else ''})"
        self._drop()
        return RemoteEnvError(f"{self.url}: {why}; this episode is gone, reset() opens a new session")

    def _over_size(self) -> str | None:
        """The error to report when this client closed the session for a reply over its size bound (close code
        1009 sent by us), else ``None``."""
        sent = getattr(getattr(self._ws, "protocol", None), "close_sent", None)
        if sent is not None and getattr(sent, "code", None) == 1009:
            return (
                f"{self.url}: a reply was over this client's limit of {self._ws_max_bytes} bytes (4 x the server's "
                "ws_max_bytes); the session was closed"
            )
        return None

    def _recv(self) -> str | bytes:
        """The next message within ``request_timeout_s``, waited for in slices: a reply this client refused for
        its size (close 1009 sent) is reported at once, not after the whole wait (``TimeoutError`` otherwise)."""
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                return self._ws.recv(timeout=max(0.0, min(0.25, left)))
            except TimeoutError:
                if left <= 0.25 or self._over_size():
                    raise

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        try:
            try:
                self._ws.send(json.dumps(message))
            except ConnectionClosed:
                # The server may have said why before closing (a full server, an expired session): read it.
                raw = self._ws.recv(timeout=1.0)
            else:
                raw = self._recv()
        except TimeoutError:
            over = self._over_size()
            self._drop()
            if over:  # the reply was refused for its size; the peer did not finish the close handshake
                raise RemoteEnvError(over) from None
            raise RemoteEnvError(
                f"{self.url}: no reply within {self.request_timeout_s:g} s; the session was closed"
            ) from None
        except (ConnectionClosed, OSError) as e:
            over = self._over_size()
            if over:
                self._drop()
                raise RemoteEnvError(over) from None
            raise self._lost(e) from None
        try:
            reply = _decode(raw)
        except ValueError as e:
            self._drop()
            raise RemoteEnvError(f"{self.url}: {e}; the session was closed") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("data"), dict):
            self._drop()
            raise RemoteEnvError(f"{self.url}: the reply is not an OpenEnv message")
        if reply.get("type") == "error":
            data = reply["data"]
            text = str(data.get("message", "unknown error"))[:2000]
            status = _status_of(text)
            if status is not None:
                raise RemoteRequestError(status, f"{self.url}: {text[6:]}")
            if data.get("code") == "VALIDATION_ERROR":
                raise RemoteRequestError(
                    422, f"{self.url}: invalid message: {json.dumps(data.get('errors'))[:500]}"
                )
            self._drop()
            raise RemoteEnvError(f"{self.url}: server error ({data.get('code')}): {text}")
        return reply["data"]

    def _observation(self, data: dict[str, Any]) -> tuple[str, float | None, bool, bool, dict[str, Any]]:
        obs = data.get("observation")
        if not isinstance(obs, dict):
            raise RemoteEnvError(f"{self.url}: the reply has no observation")
        text, info, attrs = obs.get("text"), obs.get("info"), obs.get("attributes")
        terminated, truncated = obs.get("terminated"), obs.get("truncated")
        reward = data.get("reward")
        if not (
            isinstance(text, str)
            and isinstance(info, dict)
            and isinstance(attrs, dict)
            and isinstance(terminated, bool)
            and isinstance(truncated, bool)
            and (reward is None or is_number(reward))
        ):
            self._drop()
            raise RemoteEnvError(f"{self.url}: the reply's observation does not have the llm-gym fields")
        # Python's JSON reader accepts NaN and Infinity: a non-finite number must never reach the agent
        if not (reward is None or math.isfinite(reward)) or not _finite_numbers(info):
            self._drop()
            raise RemoteEnvError(f"{self.url}: the reply's reward or info holds NaN or an infinite number")
        # what describe announced is what a local env guarantees: the observation in its space, typed attributes
        if not self.observation_space.contains(text):
            self._drop()
            raise RemoteEnvError(
                f"{self.url}: the reply's observation ({len(text)} characters) is not in the observation space "
                f"described ({self.observation_space}); the session was closed"
            )
        try:
            attrs = check_surface(attrs)
        except ValueError as e:
            self._drop()
            raise RemoteEnvError(f"{self.url}: the reply's {e}; the session was closed") from None
        self._attrs.update(attrs)
        return text, None if reward is None else float(reward), terminated, truncated, info

    # ------------------------------------------------------------------------------------------ gymnasium
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)  # np_random is unused here; the server env draws the episode
        check_seed(seed)
        data: dict[str, Any] = {"env_id": self.env_id, "env_kwargs": self.env_kwargs}
        if seed is not None:
            data["seed"] = int(seed)
        if options is not None:
            data["options"] = options
        if self._ws is None:
            self._connect()
        try:
            reply = self._call({"type": "reset", "data": data})
        except RemoteRequestError:
            self._has_reset = False
            raise
        text, _, _, _, info = self._observation(reply)
        self._has_reset = True
        return text, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if not self._has_reset or self._ws is None:
            raise gym.error.ResetNeeded("call reset() before step() (a lost session needs a new reset too)")
        if not isinstance(action, str):
            raise TypeError(f"the action must be a string (the LLM's response), got {type(action).__name__}")
        reply = self._call({"type": "step", "data": {"text": action}})
        text, reward, terminated, truncated, info = self._observation(reply)
        return text, 0.0 if reward is None else reward, terminated, truncated, info

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.send(json.dumps({"type": "close"}))
            except Exception:  # noqa: BLE001 (the session may already be gone)
                pass
        self._drop()

    # ------------------------------------------------------------------------------- mirrored attributes
    def __getattr__(self, name: str) -> Any:
        # Only called for names not found normally: the env attributes the server sent.
        if name.startswith("_") or name not in (*STATIC_ATTRIBUTES, *DYNAMIC_ATTRIBUTES):
            raise AttributeError(name)
        attrs = self.__dict__.get("_attrs", {})
        if name not in attrs:
            raise AttributeError(f"{self.env_id} on {self.__dict__.get('url')} has no attribute {name!r}")
        value = attrs[name]
        return tuple(value) if name == "action_names" and isinstance(value, list) else value

    @property
    def reward_spec(self):
        from llm_gym.core.rewards import RewardComponent, RewardSpec

        rows = self._attrs.get("reward_spec") or []
        return RewardSpec(tuple(RewardComponent(str(n), float(v), str(d)) for n, v, d in rows))

    def example_response(self) -> str:
        """The env's example of a well-formed answer (as the server env gives it)."""
        try:
            return str(self._attrs["methods"]["example_response"])
        except (KeyError, TypeError):
            raise AttributeError(f"{self.env_id} has no example_response") from None

    def ragen_prompt(self):
        """The server env's RAGEN prompt text (``ChatFormat(style="ragen")``), or ``None`` when it has none."""
        data = (self._attrs.get("methods") or {}).get("ragen_prompt")
        if not isinstance(data, dict):
            return None
        from llm_gym.core.env import RagenPrompt

        return RagenPrompt(**data)

    def __repr__(self) -> str:
        return f"<RemoteEnv {self.env_id} at {self.url}>"


# ------------------------------------------------------------------------------------- before a run starts
def server_status(url: str, *, token: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """A server's ``GET /llmgym/status``: served ids, limits (``max_sessions`` ...) and live counters."""
    base, url_token, _ = _split_url(url)
    token = token or url_token or os.environ.get("LLMGYM_SERVE_TOKEN") or None
    return _http_json(base, "/llmgym/status", token=token, timeout_s=timeout_s)


def sessions_per_server(sessions: int, servers: int) -> int:
    """The most sessions one server holds when ``sessions`` episodes played at once use ``servers`` servers in
    turn (:func:`llm_gym.registration.pick_env_url`)."""
    return -(-max(0, sessions) // max(1, servers))


def check_servers(
    urls: list[str], env_ids: list[str], env_kwargs: dict[str, Any], *, sessions: int, command: str
) -> None:
    """What ``llmgym-train`` / ``llmgym-eval --env_url`` check before the model loads, so that a run does not fail
    at its first round or halfway through:

    * every server serves each id with ``env_kwargs`` (the server's 4xx otherwise: :class:`RemoteRequestError`);
    * no server fixes a kwarg the run does not set (its episodes would not be those of a local run with the run's
      settings, and the records, which store the run's kwargs, would not replay to them);
    * every server allows the sessions the run opens at once: ``sessions`` episodes spread over ``urls`` in turn,
      at most ``max_sessions`` each (a full server refuses a session mid-run with ``CAPACITY_REACHED``).

    Raises:
        ValueError: a usage error naming what to change (``RemoteRequestError`` is one).
        RemoteEnvError: a server cannot be reached or refused the token.
    """
    need = sessions_per_server(sessions, len(urls))
    for url in urls:
        for env_id in env_ids:
            env = RemoteEnv(url, env_id, env_kwargs)  # describes the id: nothing is opened on the server
            env.close()
            extra = {k: v for k, v in env.server_kwargs.items() if k not in env_kwargs}
            if extra:
                fixed = ", ".join(f"{k}={json.dumps(v)}" for k, v in extra.items())
                raise ValueError(
                    f"{url} plays {env_id} with {fixed} (its operator's --env_kwargs), which this run does not "
                    "set: the episodes would differ from a local run with the same settings and the records would "
                    f"not replay. Set the same in the run: --env_kwargs '{json.dumps({**env_kwargs, **extra})}'"
                )
        status = server_status(url)
        limits = status.get("limits")
        limit = limits.get("max_sessions") if isinstance(limits, dict) else None
        if not isinstance(limit, int) or not is_int(limit, numpy=False):  # JSON data: an int, not a bool
            raise RemoteEnvError(f"{url}/llmgym/status does not say its max_sessions")
        if need > limit:
            spread = f" ({need} on each of {len(urls)} servers)" if len(urls) > 1 else ""
            raise ValueError(
                f"{command} plays up to {sessions} episodes at once{spread}, but {url} allows {limit} sessions "
                f"(a full server refuses the next one mid-run): start it with llmgym serve --max_sessions {need} "
                "or more, or spread the run over more servers (--env_url URL URL ...)"
            )
        open_now = status.get("open_envs")
        if isinstance(open_now, int) and is_int(open_now, numpy=False) and need > limit - open_now:
            print(
                f"{command}: warning: {url} has {open_now} of its {limit} sessions open now; this run needs {need} "
                "at once and fails mid-run if the others stay open",
                file=sys.stderr,
            )
