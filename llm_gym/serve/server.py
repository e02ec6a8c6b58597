"""``llmgym serve``: llm-gym environments behind OpenEnv's server (``openenv``, the ``serve`` extra).

The app is OpenEnv's own (``create_fastapi_app`` with typed ``Action`` / ``Observation`` / ``State`` models), so a
stock OpenEnv client (``GenericEnvClient``, an ``EnvClient`` subclass) and TRL's OpenEnv path work against it
unchanged: one WebSocket session (``/ws``) per client, each owning its own environment. What we add sits around
it, not inside its protocol:

* :class:`LLMGymEnvironment` (the OpenEnv ``Environment`` of one session): ``reset`` takes ``seed``, ``env_id``,
  ``env_kwargs`` and ``options`` (``dynamics_seed`` included), every field checked as data
  (:mod:`llm_gym.serve.protocol`); observations carry the text, ``terminated`` / ``truncated``, the ``info`` of the
  env contract, the instructions (on reset) and the attributes prompt formatting reads;
* ``POST /llmgym/describe`` (spaces and attributes of an id, for :class:`llm_gym.serve.client.RemoteEnv`),
  ``GET /llmgym/status`` (open environments, limits) and ``GET /llmgym/openenv.yaml`` (the OpenEnv manifest of a
  served id, :mod:`llm_gym.serve.manifest`);
* ``POST /mcp`` answered statelessly (no tools; :func:`llm_gym.serve.openenv_compat.mcp_reply`) in place of
  OpenEnv's MCP routes;
* :class:`Guard`, an ASGI layer in front of the app: bearer token, HTTP body size, per-request time bound, idle
  session expiry, and no MCP WebSocket or sub-routes (our environments have no tools);
* reset slots (at most ``max_concurrent_resets`` env builds and resets at once) and a bounded stop
  (``shutdown_timeout_s``, then the process exits without waiting for env threads; a second signal at once).

Limits and what a client sees when it hits one are listed on the docs page ``docs/serving.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from llm_gym.serve.config import ServeConfig, ServeUsageError, config_from_args, token_matches
from llm_gym.serve.protocol import (
    CLOSE_IDLE,
    CLOSE_REQUEST_TIMEOUT,
    PROTOCOL_VERSION,
    RequestError,
    changed_kwargs,
    check_action,
    check_reset_request,
    describe,
    dynamic_surface,
    jsonable,
    static_surface,
)

INSTALL_HINT = "llmgym serve needs the serve extra: pip install 'llm-gym[serve]' (openenv)"


def _require_openenv():
    try:
        from openenv.core.env_server import interfaces, types  # noqa: F401
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from None


_require_openenv()

from fastapi import Request  # noqa: E402 (FastAPI resolves the endpoints' annotations from this module)
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402
from pydantic import Field  # noqa: E402


# ---------------------------------------------------------------------------------------- OpenEnv models
class LLMGymAction(Action):
    """One LLM turn: the raw response text, parsed by the environment (e.g. ``<answer>Up || Left</answer>``)."""

    text: str = Field(..., description="The raw LLM response; the environment parses it.")


class LLMGymObservation(Observation):
    """What a reset or step returns; ``done`` is ``terminated or truncated``, ``reward`` the step reward."""

    text: str = Field(default="", description="The observation text (board, question, feedback).")
    terminated: bool = Field(default=False, description="The game ended (solved, failed, answered).")
    truncated: bool = Field(default=False, description="A turn or action limit ended the episode.")
    info: dict[str, Any] = Field(
        default_factory=dict,
        description="The env's info: success, action_is_valid, actions, reward_components, turn, error, ...",
    )
    env_id: str = Field(default="", description="The llm-gym id this session plays.")
    instructions: str | None = Field(
        default=None, description="The task text an LLM needs (rules, symbols, answer format); on reset only."
    )
    attributes: dict[str, Any] = Field(
        default_factory=dict,
        description="Env attributes prompt formatting reads (all on reset; turn and budget after a step).",
    )


class LLMGymState(State):
    """The session's episode: id, seed and budget left."""

    env_id: str | None = Field(default=None, description="The llm-gym id, once reset.")
    seed: int | None = Field(default=None, description="The seed of the last reset.")
    done: bool = Field(default=False, description="Whether the episode has ended.")
    attributes: dict[str, Any] = Field(default_factory=dict, description="turn, actions_left, turns_left.")


class _Runtime:
    """State shared by the sessions of one app: the config, live counters (thread-safe) and the reset slots."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self._lock = threading.Lock()
        self._reset_slots = threading.BoundedSemaphore(config.max_concurrent_resets)
        self.open_envs = 0
        self.sessions_opened = 0

    @contextlib.contextmanager
    def reset_slot(self) -> Iterator[None]:
        """Hold one of ``max_concurrent_resets`` slots while an env is built or reset. A request that waits past
        the request time bound gets a 503 and does no work: its reply would be dropped anyway."""
        t = self.config.request_timeout_s
        start = time.monotonic()
        if not self._reset_slots.acquire(timeout=t):
            raise RequestError(503, f"the server is busy: every reset slot was taken for {t:g} s; try again")
        try:
            if time.monotonic() - start >= t:
                raise RequestError(503, f"the server is busy: no reset slot within {t:g} s; try again")
            yield
        finally:
            self._reset_slots.release()

    def opened(self) -> None:
        with self._lock:
            self.open_envs += 1
            self.sessions_opened += 1

    def closed(self) -> None:
        with self._lock:
            self.open_envs -= 1


# ------------------------------------------------------------------------------------------ environment
class LLMGymEnvironment(Environment):
    """One session's environment: a gymnasium env made at the first reset (and again when the id or kwargs of a
    later reset differ), stepped with the raw response text."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, runtime: _Runtime):
        super().__init__()
        self._runtime = runtime
        self._env: Any = None
        self._key: tuple[str, str] | None = None
        self._env_id: str | None = None
        self._seed: int | None = None
        self._steps = 0
        self._episode_id: str | None = None
        self._done = False
        self._closed = False
        runtime.opened()

    def _make(self, env_id: str, kwargs: dict[str, Any]) -> None:
        from llm_gym.registration import make_env

        key = (env_id, json.dumps(kwargs, sort_keys=True))
        if key == self._key and self._env is not None:
            return
        if self._env is not None:
            self._env.close()
            self._env = None
        try:
            self._env = make_env(env_id, kwargs)
        except ValueError as e:
            raise RequestError(422, str(e)) from None
        self._key, self._env_id = key, env_id

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **request: Any
    ) -> LLMGymObservation:
        cfg = self._runtime.config
        env_id, kwargs, seed, options = check_reset_request(
            {"seed": seed, **request},
            served=cfg.env_ids,
            fixed_kwargs=cfg.env_kwargs,
            allow=cfg.allow_client_kwargs,
        )
        with self._runtime.reset_slot():
            self._make(env_id, kwargs)
            try:
                obs, info = self._env.reset(seed=seed, options=options)
            except ValueError as e:  # an option the env refuses (a dynamics_seed out of range, ...)
                raise RequestError(422, f"reset failed: {e}") from None
        self._seed, self._steps, self._done = seed, 0, False
        self._episode_id = None if episode_id is None else str(episode_id)[:255]
        attributes = {**static_surface(self._env), **dynamic_surface(self._env)}
        return LLMGymObservation(
            text=obs,
            info=jsonable(info),
            env_id=env_id,
            instructions=attributes.get("instructions"),
            attributes=attributes,
            done=False,
            reward=None,
        )

    def step(self, action: LLMGymAction, timeout_s: float | None = None, **kwargs: Any) -> LLMGymObservation:
        text = check_action(getattr(action, "text", None), self._runtime.config.max_action_chars)
        if self._env is None:
            raise RequestError(
                409,
                "no episode in this session: reset first (HTTP /step is stateless in OpenEnv; use the /ws session)",
            )
        obs, reward, terminated, truncated, info = self._env.step(text)
        self._steps += 1
        self._done = bool(terminated or truncated)
        return LLMGymObservation(
            text=obs,
            reward=float(reward),
            done=self._done,
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=jsonable(info),
            env_id=self._env_id or "",
            attributes=dynamic_surface(self._env),
        )

    @property
    def state(self) -> LLMGymState:
        return LLMGymState(
            episode_id=self._episode_id,
            step_count=self._steps,
            env_id=self._env_id,
            seed=self._seed,
            done=self._done,
            attributes=dynamic_surface(self._env) if self._env is not None else {},
        )

    def get_metadata(self):
        from openenv.core.env_server.types import EnvironmentMetadata

        ids = ", ".join(self._runtime.config.env_ids)
        return EnvironmentMetadata(
            name="llm-gym",
            description=f"llm-gym text environments for LLM agents (llmgym serve; docs/serving.md): {ids}",
            version=str(PROTOCOL_VERSION),
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._env is not None:
            self._env.close()
            self._env = None
        self._runtime.closed()


# ------------------------------------------------------------------------------------------------- guard
def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class Guard:
    """ASGI layer in front of OpenEnv's app: token, body size, request time bound, idle expiry, no MCP."""

    def __init__(self, app: Any, config: ServeConfig):
        self.app = app
        self.config = config
        #: HTTP requests in the app now (read in full, not yet answered): at most max_http_requests
        self.http_in_app = 0

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if self.config.token and not token_matches(_header(scope, b"authorization"), self.config.token):
            return await self._deny(
                kind, receive, send, 401, "missing or wrong token: send 'Authorization: Bearer <token>'"
            )
        if (path == "/mcp" and (kind, scope.get("method")) != ("http", "POST")) or path.startswith("/mcp/"):
            return await self._deny(
                kind, receive, send, 404, "MCP is not served: llm-gym environments have no tools"
            )
        if kind == "http":
            return await self._http(scope, receive, send)
        return await self._websocket(scope, receive, send)

    async def _deny(self, kind: str, receive, send, status: int, message: str) -> None:
        body = json.dumps({"detail": message, "code": status}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="llmgym"'))
        if kind == "http":
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()  # websocket.connect
        try:  # ASGI's WebSocket denial response, where the server supports it: the client sees the status
            await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        except Exception:  # noqa: BLE001 (no denial-response extension: a plain refusal, HTTP 403)
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})

    async def _http(self, scope, receive, send):
        limit = self.config.max_body_bytes
        length = _header(scope, b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return await self._deny("http", receive, send, 413, f"request body over {limit} bytes")
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await self._deny("http", receive, send, 413, f"request body over {limit} bytes")
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if self.http_in_app >= self.config.max_http_requests:
            return await self._deny(
                "http",
                receive,
                send,
                503,
                f"the server is busy: {self.http_in_app} requests running; try again",
            )
        self.http_in_app += 1
        try:
            await self._http_app(scope, receive, send, body)
        finally:
            self.http_in_app -= 1

    async def _http_app(self, scope, receive, send, body: bytes) -> None:
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        started = False

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await asyncio.wait_for(self.app(scope, replay, tracked_send), self.config.request_timeout_s)
        except asyncio.TimeoutError:
            if not started:
                t = self.config.request_timeout_s
                await self._deny("http", receive, send, 504, f"the request took longer than {t:g} s")

    async def _websocket(self, scope, receive, send):
        cfg = self.config
        lock = asyncio.Lock()
        state: dict[str, Any] = {"closed": False, "timer": None}

        async def close(code: int, reason: str, error: str | None = None) -> None:
            async with lock:
                if state["closed"]:
                    return
                state["closed"] = True
                if error is not None:
                    payload = {"type": "error", "data": {"message": error, "code": "TIMEOUT"}}
                    await send({"type": "websocket.send", "text": json.dumps(payload)})
                await send({"type": "websocket.close", "code": code, "reason": reason[:120]})

        async def request_timer() -> None:
            await asyncio.sleep(cfg.request_timeout_s)
            t = cfg.request_timeout_s
            await close(
                CLOSE_REQUEST_TIMEOUT,
                "request timeout",
                f"the request took longer than {t:g} s; the session is closed",
            )

        def cancel_timer() -> None:
            if state["timer"] is not None:
                state["timer"].cancel()
                state["timer"] = None

        async def guarded_receive():
            if state["closed"]:
                return {"type": "websocket.disconnect", "code": 1000}
            try:
                message = await asyncio.wait_for(receive(), cfg.idle_timeout_s)
            except asyncio.TimeoutError:
                await close(CLOSE_IDLE, f"idle for more than {cfg.idle_timeout_s:g} s")
                return {"type": "websocket.disconnect", "code": CLOSE_IDLE}
            if message["type"] == "websocket.receive":
                cancel_timer()
                state["timer"] = asyncio.ensure_future(request_timer())
            elif message["type"] == "websocket.disconnect":
                cancel_timer()
                state["closed"] = True  # the app's own close after this would fail: the peer is gone
            return message

        async def guarded_send(message):
            if message["type"] == "websocket.send":
                cancel_timer()
            async with lock:
                if state["closed"]:
                    return
                if message["type"] == "websocket.close":
                    state["closed"] = True
                try:
                    await send(message)
                except Exception:  # noqa: BLE001 (uvicorn's ClientDisconnected, OSError: the peer left)
                    # A reply to a client that has gone: the session ends as at a disconnect, and the app's
                    # next receive says so; a traceback per disconnect would let any client fill the log
                    state["closed"] = True

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except asyncio.CancelledError:
            # the server is stopping and this session's reset or step outlived --shutdown_timeout: uvicorn has
            # said so in one line, and the traceback of the cancelled wait would add nothing
            return
        finally:
            cancel_timer()


# --------------------------------------------------------------------------------------------------- app
def create_app(config: ServeConfig):
    """OpenEnv's FastAPI app for ``config.env_ids``, our endpoints, wrapped in :class:`Guard`."""
    from fastapi.responses import JSONResponse, Response
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.types import ConcurrencyConfig

    from llm_gym.serve.openenv_compat import app_options, mcp_reply

    runtime = _Runtime(config)
    factory = functools.partial(LLMGymEnvironment, runtime)
    app = create_fastapi_app(
        factory,
        LLMGymAction,
        LLMGymObservation,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=config.max_sessions, session_timeout=None),
        **app_options(create_fastapi_app, LLMGymState),
    )
    app.title = "llm-gym environment server (OpenEnv)"
    # OpenEnv's /mcp routes open sessions over plain HTTP that nothing bounds; ours answers without state
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/mcp"]

    @app.post("/mcp", tags=["MCP"])
    async def mcp(request: Request):
        """JSON-RPC 2.0 (MCP): llm-gym environments have no tools, so ``tools/list`` is empty."""
        reply = mcp_reply(await request.body())
        return Response(status_code=202) if reply is None else JSONResponse(reply)

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError):
        return JSONResponse({"detail": exc.message, "code": exc.status}, status_code=exc.status)

    @app.post("/llmgym/describe", tags=["Environment Info"])
    async def describe_env(request: Request):
        """Spaces and attributes of an id with the given kwargs (what ``llmgym/Remote-v0`` builds itself from)."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RequestError(400, "the body must be a JSON object") from None
        except RecursionError:  # Python's JSON reader recurses once per nesting level
            raise RequestError(400, "the body is JSON nested too deeply") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        unknown = sorted(str(k) for k in body if k not in ("env_id", "env_kwargs"))
        if unknown:
            raise RequestError(400, f"describe takes env_id and env_kwargs, not {', '.join(unknown)}")
        env_id, kwargs, _, _ = check_reset_request(
            body, served=config.env_ids, fixed_kwargs=config.env_kwargs, allow=config.allow_client_kwargs
        )

        def build() -> dict[str, Any]:
            from llm_gym.registration import make_env

            with runtime.reset_slot():
                try:
                    env = make_env(env_id, kwargs)
                except ValueError as e:
                    raise RequestError(422, str(e)) from None
            try:
                out = describe(env_id, env)
            finally:
                env.close()
            out["env_kwargs"] = kwargs
            # what the operator set differently from the id's defaults: a run that does not pass these would
            # record kwargs that replay to other episodes (llmgym-train / llmgym-eval refuse it)
            out["fixed_kwargs"] = changed_kwargs(env_id, config.env_kwargs)
            out["limits"] = {"max_action_chars": config.max_action_chars, "ws_max_bytes": config.ws_max_bytes}
            return out

        return await asyncio.to_thread(build)

    @app.get("/llmgym/status", tags=["Health"])
    async def status():
        """Served ids, limits and live counters (open environments, sessions opened since start)."""
        return {
            "protocol": PROTOCOL_VERSION,
            "served": list(config.env_ids),
            "open_envs": runtime.open_envs,
            "sessions_opened": runtime.sessions_opened,
            "limits": config.limits(),
        }

    @app.get("/llmgym/openenv.yaml", tags=["Environment Info"])
    async def openenv_yaml(env_id: str | None = None):
        """The OpenEnv manifest (``openenv.yaml`` with its RFC 008 ``validation:`` block) of a served id, generated
        from the registry and this server's kwargs and limits (:func:`llm_gym.serve.manifest.openenv_manifest`)."""
        request = {} if env_id is None else {"env_id": env_id}
        env_id, kwargs, _, _ = check_reset_request(
            request, served=config.env_ids, fixed_kwargs=config.env_kwargs, allow=config.allow_client_kwargs
        )

        def build() -> str:
            import yaml

            from llm_gym.serve.manifest import openenv_manifest

            with runtime.reset_slot():
                try:
                    manifest = openenv_manifest(env_id, kwargs, request_timeout_s=config.request_timeout_s)
                except ValueError as e:
                    raise RequestError(422, str(e)) from None
            return yaml.safe_dump(manifest, sort_keys=False)

        return Response(await asyncio.to_thread(build), media_type="application/yaml")

    return Guard(app, config)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (``port`` 0: a free port, read back with ``getsockname``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    return sock


def _exit_now(code: int) -> None:
    """End the process without waiting for env threads: a reset or step runs in a worker thread that nothing can
    interrupt, and the interpreter would otherwise join it at exit (OpenEnv's per-session executors)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 (a closed pipe)
            pass
    os._exit(code)


def _uvicorn_server(uv_config: Any, shutdown_timeout_s: float, *, hard_exit: bool) -> Any:
    """uvicorn's server with a bounded stop. The first SIGINT/SIGTERM starts uvicorn's graceful shutdown: new
    connections refused, every session closed (code 1012), ``shutdown_timeout_s`` for running requests, then
    their tasks cancelled. With ``hard_exit`` (the ``llmgym serve`` process) a watchdog ends the process if that
    has not happened ``shutdown_timeout_s`` + 5 s later, and a second signal ends it at once."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if hard_exit and self.should_exit:
                print(f"llmgym serve: second signal {sig}: exiting now", file=sys.stderr)
                _exit_now(128 + sig)
            if hard_exit and not self.should_exit:
                watchdog = threading.Timer(shutdown_timeout_s + 5.0, _exit_now, (128 + sig,))
                watchdog.daemon = True
                watchdog.start()
            super().handle_exit(sig, frame)

    return Server(uv_config)


def _raise_file_limit(config: ServeConfig) -> None:
    """Enough file descriptors for every bound at once (sessions, waiting connections, requests in the app): the
    soft limit is raised toward the hard one, else a warning says which limit a flood reaches first."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return
    need = 2 * config.max_sessions + config.max_waiting_connections + config.max_http_requests + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
        if soft < need:
            print(
                f"llmgym serve: warning: {soft} open files allowed (ulimit -n), fewer than the {need} the limits "
                "can hold at once; lower --max_waiting_connections or --max_sessions, or raise ulimit -n",
                file=sys.stderr,
                flush=True,
            )


def serve(
    config: ServeConfig, *, sock: socket.socket | None = None, announce: bool = True, hard_exit: bool = False
) -> None:
    """Run the server until interrupted (Ctrl-C / SIGTERM). ``sock``: an already bound socket; ``hard_exit``: the
    process is the server's alone, so a stop may end it without waiting for env threads (:func:`cmd_serve`)."""
    import uvicorn

    from llm_gym.serve.connections import PendingPool, bounded_h11_protocol, quiet_client_faults

    quiet_client_faults()
    app = create_app(config)
    pool = PendingPool(config.max_waiting_connections, config.read_timeout_s)
    _raise_file_limit(config)
    sock = sock or bind_socket(config.host, config.port)
    host, port = sock.getsockname()[:2]
    uv = uvicorn.Config(
        app,
        log_level="warning",
        ws_max_size=config.ws_max_bytes,
        ws_ping_interval=20.0,
        ws_ping_timeout=20.0,
        # uvicorn's limit_concurrency counts half-sent requests too (a slowloris made every request a 503): the
        # pool bounds connections waiting for a request, Guard the requests in the app, OpenEnv the sessions
        http=bounded_h11_protocol(pool),
        timeout_keep_alive=5,
        timeout_graceful_shutdown=math.ceil(config.shutdown_timeout_s),  # uvicorn takes whole seconds
        lifespan="on",
    )
    server = _uvicorn_server(uv, config.shutdown_timeout_s, hard_exit=hard_exit)
    if announce:
        shown = f"[{host}]" if ":" in host else host
        print(f"llmgym serve: {', '.join(config.env_ids)} on http://{shown}:{port}", flush=True)
    server.run(sockets=[sock])


def _worker_threads() -> list[threading.Thread]:
    """Threads the interpreter would join at exit (OpenEnv's executor workers, one of them maybe mid-reset)."""
    return [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]


def cmd_serve(args: Any) -> int:
    """``llmgym serve``: check the options, bind, serve until interrupted (:class:`ServeUsageError` for a
    command line that cannot work)."""
    from llm_gym.serve.config import default_env_ids

    try:
        config = config_from_args(args)
    except (ValueError, json.JSONDecodeError) as e:
        raise ServeUsageError(str(e)) from None
    if not args.env:
        left_out = default_env_ids(config.env_kwargs)[1]
        if left_out:
            print(
                f"llmgym serve: not serving {', '.join(left_out)}: their default data is a hub data set (name "
                "them with --env, or give their data with --env_kwargs)",
                flush=True,
            )
    from llm_gym.serve.openenv_compat import distribution_problem

    problem = distribution_problem()
    if problem:
        print(f"llmgym serve: warning: {problem}", file=sys.stderr, flush=True)
    try:
        sock = bind_socket(config.host, config.port)
    except OSError as e:
        raise ServeUsageError(f"cannot listen on {config.host}:{config.port}: {e}") from None
    try:
        serve(config, sock=sock, hard_exit=True)
    except KeyboardInterrupt:
        pass
    if _worker_threads():  # an env thread may still run a reset or step: do not wait for it at exit
        _exit_now(0)
    return 0


__all__ = [
    "LLMGymAction",
    "LLMGymEnvironment",
    "LLMGymObservation",
    "LLMGymState",
    "create_app",
    "serve",
]
