"""``llmgym serve`` options and the server's config (no third-party imports: ``llmgym --help`` works without
the serve extra)."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from llm_gym.core.checks import is_int, is_number
from llm_gym.serve.protocol import (
    ALL_KWARGS,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_ACTION_CHARS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONCURRENT_RESETS,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_WAITING_CONNECTIONS,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    HTTP_MARGIN,
)

# ------------------------------------------------------------------------------------------------ config


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class ServeConfig:
    """Everything ``llmgym serve`` is told; see ``llmgym serve --help`` for each field."""

    env_ids: tuple[str, ...]
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    max_sessions: int = DEFAULT_MAX_SESSIONS
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    max_action_chars: int = DEFAULT_MAX_ACTION_CHARS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    allow_client_kwargs: tuple[str, ...] = ()
    max_concurrent_resets: int = DEFAULT_MAX_CONCURRENT_RESETS
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    max_waiting_connections: int = DEFAULT_MAX_WAITING_CONNECTIONS

    def __post_init__(self) -> None:
        from llm_gym.registration import check_trusted_env_id

        if not self.env_ids:
            raise ValueError("serve at least one environment id")
        self.env_ids = tuple(check_trusted_env_id(e, "--env") for e in self.env_ids)
        self._check_env_kwargs()
        self._check_allowed_kwargs()
        for name in (
            "max_sessions",
            "max_action_chars",
            "max_body_bytes",
            "max_concurrent_resets",
            "max_waiting_connections",
        ):
            v = getattr(self, name)
            if not is_int(v, numpy=False) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not is_int(self.port, numpy=False) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port!r}")
        for name in ("idle_timeout_s", "request_timeout_s", "shutdown_timeout_s", "read_timeout_s"):
            v = getattr(self, name)
            if not is_number(v) or not 0 < v <= 86400:
                raise ValueError(f"{name} must be a number of seconds in (0, 86400], got {v!r}")
        if self.token is not None and len(self.token) < 16:
            raise ValueError(
                "the token must have at least 16 characters (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        if not is_loopback(self.host) and not self.token:
            raise ValueError(
                f"serving on {self.host} (not a loopback address) needs a token: set LLMGYM_SERVE_TOKEN or "
                "--token_file, and give clients the same token"
            )

    def _check_env_kwargs(self) -> None:
        """Each fixed kwarg is taken by a served id: a misspelt one (``datset``) would otherwise be dropped for
        every id, and clients would get the default data (a hub data set) instead of the operator's file."""
        from llm_gym.core.kwargs import constructor_kwargs
        from llm_gym.registration import env_class
        from llm_gym.serve.protocol import SERVER_ONLY_KWARGS

        if not isinstance(self.env_kwargs, dict):
            raise ValueError("--env_kwargs must be a JSON object")
        server_only = sorted(k for k in self.env_kwargs if k in SERVER_ONLY_KWARGS)
        if server_only:
            raise ValueError(f"--env_kwargs cannot set {', '.join(server_only)} (the server never renders)")
        taken = set().union(*(constructor_kwargs(env_class(e)) for e in self.env_ids))
        unknown = sorted(k for k in self.env_kwargs if k not in taken)
        if unknown:
            raise ValueError(
                f"--env_kwargs: no served id takes {', '.join(map(repr, unknown))} "
                f"(they take {', '.join(sorted(taken - set(SERVER_ONLY_KWARGS)))})"
            )

    def _check_allowed_kwargs(self) -> None:
        """``--allow_client_kwargs``: ``all``, or names a served id takes that are neither data nor render_mode
        (a file or hub data set stays the operator's whatever this says)."""
        from llm_gym.core.kwargs import constructor_kwargs, data_kwargs
        from llm_gym.registration import env_class
        from llm_gym.serve.protocol import SERVER_ONLY_KWARGS

        names = tuple(dict.fromkeys(self.allow_client_kwargs))
        if not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"--allow_client_kwargs takes kwarg names, got {names!r}")
        self.allow_client_kwargs = names
        if ALL_KWARGS in names:
            return
        classes = [env_class(e) for e in self.env_ids]
        data = set().union(*(data_kwargs(c) for c in classes)) | set(SERVER_ONLY_KWARGS)
        taken = set().union(*(constructor_kwargs(c) for c in classes)) - data
        refused = sorted(n for n in names if n in data)
        if refused:
            raise ValueError(
                f"--allow_client_kwargs cannot open {', '.join(refused)}: data and rendering stay the operator's "
                "(set them with --env_kwargs)"
            )
        unknown = sorted(n for n in names if n not in taken)
        if unknown:
            raise ValueError(
                f"--allow_client_kwargs: no served id takes {', '.join(map(repr, unknown))} "
                f"(they take {', '.join(sorted(taken))})"
            )

    @property
    def max_http_requests(self) -> int:
        """HTTP requests in the app at once (503 beyond): the sessions and a margin
        (:data:`~llm_gym.serve.protocol.HTTP_MARGIN`)."""
        return self.max_sessions + HTTP_MARGIN

    @property
    def ws_max_bytes(self) -> int:
        """Transport bound on one WebSocket message: the longest action as JSON (``\\uXXXX`` escapes of
        surrogate pairs take 12 bytes per character) plus room for the envelope and a reset's kwargs."""
        return 12 * self.max_action_chars + (64 << 10)

    def limits(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("token")
        out["env_ids"] = list(self.env_ids)
        out["token_required"] = bool(self.token)
        out["ws_max_bytes"] = self.ws_max_bytes
        out["max_http_requests"] = self.max_http_requests
        return out


def token_matches(authorization: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>``, or ``Basic`` with the token as password (what a WebSocket client sends
    for a URL ``ws://any:<token>@host``, so a stock OpenEnv client that sends no headers can still log in)."""
    if not authorization:
        return False
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "basic":
        try:
            _, _, value = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.encode("utf-8"), token.encode("utf-8"))


# --------------------------------------------------------------------------------------------------- CLI
class ServeUsageError(ValueError):
    """The ``llmgym serve`` command line cannot work as given (``llmgym`` exits 2)."""


def add_parser(sub: Any, func: Any) -> None:
    """The ``llmgym serve`` sub-command (``sub``: the ``add_subparsers`` object of ``llmgym``; ``func``: what
    runs it)."""
    p = sub.add_parser(
        "serve",
        help="serve environments over HTTP/WebSocket (OpenEnv protocol)",
        description="Serve llm-gym environments through OpenEnv's server, so OpenEnv clients, TRL's OpenEnv "
        "path and llmgym/Remote-v0 (llmgym-train/llmgym-eval --env_url) can play them. Each WebSocket session "
        "owns its own environment. Binds 127.0.0.1 unless told otherwise; another address needs a token "
        "(LLMGYM_SERVE_TOKEN or --token_file). Limits: docs/serving.md.",
    )
    p.add_argument(
        "--env",
        action="append",
        default=None,
        help="id or short name to serve (repeat for several; the first is a session's default); default: every "
        "id whose data is bundled or generated. An id whose default data is a hub data set (e.g. "
        "MetaMathQA-v0) is served only when named here or given its data with --env_kwargs: any client could "
        "otherwise start that download on the server (the ids left out are printed on start)",
    )
    p.add_argument(
        "--env_kwargs",
        default=None,
        help="JSON object of kwargs fixed for every served id that takes them; clients may repeat them but not "
        "change them. The place for data (dataset, level_file) and for kwargs that scale a reset's work (room "
        "size, boxes, generator, search_depth, solver budget, number ranges, ...)",
    )
    p.add_argument(
        "--allow_client_kwargs",
        action="append",
        default=None,
        metavar="NAME[,NAME]",
        help="let clients also set these constructor kwargs (or 'all'); by default a client sets only an env's "
        "light kwargs (turn and action limits, rewards, think, parse_mode, presentation, answer rules) and may "
        "repeat the server's value of any other. Data kwargs stay the operator's. Opening a work-scaling kwarg "
        "lets a client make one reset take minutes and gigabytes",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed on start)")
    p.add_argument(
        "--token_file", default=None, help="file holding the bearer token (else LLMGYM_SERVE_TOKEN)"
    )
    p.add_argument("--max_sessions", type=int, default=DEFAULT_MAX_SESSIONS, help="sessions open at once")
    p.add_argument(
        "--idle_timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT_S,
        help="seconds before an idle session is closed",
    )
    p.add_argument(
        "--request_timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        help="seconds a reset or step may take before the session is closed with an error",
    )
    p.add_argument(
        "--read_timeout",
        type=float,
        default=DEFAULT_READ_TIMEOUT_S,
        help="seconds an HTTP request (headers and body) may take to arrive before its connection is closed",
    )
    p.add_argument(
        "--max_waiting_connections",
        type=int,
        default=DEFAULT_MAX_WAITING_CONNECTIONS,
        help="connections waiting for a request at once; one more closes the one that has waited longest",
    )
    p.add_argument(
        "--max_action_chars", type=int, default=DEFAULT_MAX_ACTION_CHARS, help="longest action (characters)"
    )
    p.add_argument(
        "--max_concurrent_resets",
        type=int,
        default=DEFAULT_MAX_CONCURRENT_RESETS,
        help="resets (and env builds) run at once; the others wait, within --request_timeout",
    )
    p.add_argument(
        "--shutdown_timeout",
        type=float,
        default=DEFAULT_SHUTDOWN_TIMEOUT_S,
        help="on SIGINT/SIGTERM, seconds to wait for running resets and steps before exiting anyway (a second "
        "signal exits at once)",
    )
    p.set_defaults(func=func)


def _read_token(path: str | None) -> str | None:
    import os

    if path:
        with open(path, encoding="utf-8") as f:
            token = f.read(4097).strip()
        if not token or len(token) > 4096:
            raise ValueError(f"{path} must hold one token of at most 4096 characters")
        return token
    return os.environ.get("LLMGYM_SERVE_TOKEN") or None


def default_env_ids(env_kwargs: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(served, left out)`` when ``llmgym serve`` names no id: every id but those whose default data is not
    bundled (a hub data set) and not given in ``env_kwargs``."""
    from llm_gym.registration import list_envs
    from llm_gym.serve.protocol import external_data

    ids = list_envs()
    left_out = tuple(e for e in ids if external_data(e, env_kwargs))
    return tuple(e for e in ids if e not in left_out), left_out


def _names(values: list[str] | None) -> list[str]:
    return [v.strip() for value in (values or []) for v in value.split(",") if v.strip()]


def config_from_args(args: Any) -> ServeConfig:
    from llm_gym.registration import resolve_env_id

    ids = [resolve_env_id(e) for e in _names(args.env)]
    kwargs = json.loads(args.env_kwargs) if args.env_kwargs else {}
    if not isinstance(kwargs, dict):
        raise ValueError("--env_kwargs must be a JSON object")
    return ServeConfig(
        env_ids=tuple(dict.fromkeys(ids)) or default_env_ids(kwargs)[0],
        env_kwargs=kwargs,
        allow_client_kwargs=tuple(_names(args.allow_client_kwargs)),
        max_concurrent_resets=args.max_concurrent_resets,
        shutdown_timeout_s=args.shutdown_timeout,
        host=args.host,
        port=args.port,
        token=_read_token(args.token_file),
        max_sessions=args.max_sessions,
        idle_timeout_s=args.idle_timeout,
        request_timeout_s=args.request_timeout,
        read_timeout_s=args.read_timeout,
        max_waiting_connections=args.max_waiting_connections,
        max_action_chars=args.max_action_chars,
    )
