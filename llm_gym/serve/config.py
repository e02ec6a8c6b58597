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
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_ACTION_CHARS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_REQUEST_TIMEOUT_S,
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

    def __post_init__(self) -> None:
        from llm_gym.registration import check_trusted_env_id

        if not self.env_ids:
            raise ValueError("serve at least one environment id")
        self.env_ids = tuple(check_trusted_env_id(e, "--env") for e in self.env_ids)
        self._check_env_kwargs()
        for name in ("max_sessions", "max_action_chars", "max_body_bytes"):
            v = getattr(self, name)
            if not is_int(v, numpy=False) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not is_int(self.port, numpy=False) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port!r}")
        for name in ("idle_timeout_s", "request_timeout_s"):
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
        from llm_gym.serve.protocol import SERVER_ONLY_KWARGS, constructor_parameters

        if not isinstance(self.env_kwargs, dict):
            raise ValueError("--env_kwargs must be a JSON object")
        server_only = sorted(k for k in self.env_kwargs if k in SERVER_ONLY_KWARGS)
        if server_only:
            raise ValueError(f"--env_kwargs cannot set {', '.join(server_only)} (the server never renders)")
        taken = set().union(*(constructor_parameters(e)[0] for e in self.env_ids))
        unknown = sorted(k for k in self.env_kwargs if k not in taken)
        if unknown:
            raise ValueError(
                f"--env_kwargs: no served id takes {', '.join(map(repr, unknown))} "
                f"(they take {', '.join(sorted(taken - set(SERVER_ONLY_KWARGS)))})"
            )

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
        help="id or short name to serve (repeat for several; the first is a session's default); default: all",
    )
    p.add_argument(
        "--env_kwargs", default=None, help="JSON object of kwargs fixed for every served id that takes them"
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
        "--max_action_chars", type=int, default=DEFAULT_MAX_ACTION_CHARS, help="longest action (characters)"
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


def config_from_args(args: Any) -> ServeConfig:
    from llm_gym.registration import list_envs, resolve_env_id

    ids = [resolve_env_id(e.strip()) for name in (args.env or []) for e in name.split(",") if e.strip()]
    kwargs = json.loads(args.env_kwargs) if args.env_kwargs else {}
    if not isinstance(kwargs, dict):
        raise ValueError("--env_kwargs must be a JSON object")
    return ServeConfig(
        env_ids=tuple(dict.fromkeys(ids)) or tuple(list_envs()),
        env_kwargs=kwargs,
        host=args.host,
        port=args.port,
        token=_read_token(args.token_file),
        max_sessions=args.max_sessions,
        idle_timeout_s=args.idle_timeout,
        request_timeout_s=args.request_timeout,
        max_action_chars=args.max_action_chars,
    )
