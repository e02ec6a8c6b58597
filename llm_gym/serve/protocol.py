"""What travels between ``llmgym serve`` and its clients, as plain data (no third-party imports).

Both sides use these functions: the server to check every request field and to describe an environment, the
client (:mod:`llm_gym.serve.client`) to rebuild spaces and attributes. Everything a request carries is data:
an id must be one of llm-gym's own (the :data:`~llm_gym.registration.ENVS` table, never Gymnasium's
``module:Id`` form, which imports ``module``), kwargs must be constructor parameters of that id's class with
JSON values, and a kwarg that names a file or a hub data set, or that scales the work or memory of a reset (room
size, solver budget, generator, ...), is the server operator's choice, not a client's: a client sets only an env's
light kwargs (``TextEnv.light_kwargs``, through :mod:`llm_gym.core.kwargs`) unless the operator allows more.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, cast

import gymnasium as gym

from llm_gym.core.checks import is_int, is_number
from llm_gym.core.env import ACTION_MAX_LENGTH
from llm_gym.core.kwargs import (
    constructor_kwargs,
    data_kwargs,
    light_kwargs,
    names_bundled_data,
    reset_options,
)
from llm_gym.core.spaces import AnyText
from llm_gym.registration import check_seed, check_trusted_env_id, env_class, env_defaults, short_repr

#: Protocol version, reported by ``/llmgym/describe`` and checked by the client (bumped on incompatible changes).
PROTOCOL_VERSION = 1

# ------------------------------------------------------------------------------------------- default limits
#: Longest action (characters) a step accepts: the action space's bound (``AnyText(ACTION_MAX_LENGTH)``).
DEFAULT_MAX_ACTION_CHARS = ACTION_MAX_LENGTH
#: Most sessions (WebSocket connections, each with its own env) open at once.
DEFAULT_MAX_SESSIONS = 256
#: A session with no message for this long is closed and its env freed.
DEFAULT_IDLE_TIMEOUT_S = 300.0
#: Longest a reset or step may take before the server answers with an error and closes the session.
DEFAULT_REQUEST_TIMEOUT_S = 60.0
#: Longest an HTTP request (request line, headers and body) may take to arrive, counted from the connection's
#: opening (or the previous response on a kept-alive connection); a connection still sending one is then closed.
DEFAULT_READ_TIMEOUT_S = 10.0
#: Connections waiting for a request (being read, or idle between two) at once; one more closes the one that has
#: waited longest. Slow clients below this many are closed only by the read deadline, so they never touch a request
#: that arrives at once; the bound keeps their memory and file descriptors in check.
DEFAULT_MAX_WAITING_CONNECTIONS = 1024
#: HTTP requests in the app at once (read in full, not yet answered) beyond the session limit: 503 past it.
HTTP_MARGIN = 64
#: Longest HTTP request body (the stateless OpenEnv endpoints and ``/llmgym/describe``).
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: Resets (and env builds) that run at once; the others wait their turn within the request time bound. A reset
#: is where an env's work and memory go (a Sokoban level given in ``options`` is solved: 2-3 s and ~50 MB at the
#: default solver budget), so this bounds the server's peak memory whatever the number of sessions.
DEFAULT_MAX_CONCURRENT_RESETS = 4
#: On SIGINT / SIGTERM the server closes every session (code 1012) and waits this long for running resets and
#: steps before it exits anyway; a second signal exits at once.
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0
#: Keys of a reset request besides OpenEnv's own ``seed`` and ``episode_id``.
RESET_KEYS = ("env_id", "env_kwargs", "options")
#: ``llmgym serve --allow_client_kwargs all``: clients may set every constructor kwarg but data and render_mode.
ALL_KWARGS = "all"
#: Constructor kwargs a client may never pass (the server never renders).
SERVER_ONLY_KWARGS = ("render_mode",)
#: Longest JSON text of a client's ``env_kwargs`` or ``options``.
MAX_KWARGS_JSON_CHARS = 16384
#: WebSocket close codes the server's guard sends (4000-4999 are the application's range) and the client names.
CLOSE_IDLE = 4408
CLOSE_REQUEST_TIMEOUT = 4504

# Attributes of ``env.unwrapped`` the agent loop and chat formatting read (llm_gym.agent.chat, records); sent at
# reset (static) and after every step (dynamic) so that a remote env formats prompts exactly as a local one.
STATIC_ATTRIBUTES = (
    "instructions",
    "rules",
    "think",
    "action_sep",
    "action_names",
    "max_turns",
    "max_actions_per_turn",
    "max_actions",
    "observation_format",
    "observation_style",
    "vocab",
    "parse_mode",
    "turn_limit_terminates",
)
DYNAMIC_ATTRIBUTES = ("turn", "actions_left", "turns_left", "reset_seed")
#: Zero-argument methods whose result travels as data (a dataclass as its fields), for the client to answer
#: (``ragen_prompt``: RAGEN's own text for ``ChatFormat(style="ragen")``).
STATIC_METHODS = ("example_response", "ragen_prompt")


class RequestError(ValueError):
    """A request the server refuses: an HTTP-style ``status`` (400, 404, 409, 413, 422) and one clear line."""

    def __init__(self, status: int, message: str):
        super().__init__(f"[{status}] {message}")
        self.status = status
        self.message = message


def jsonable(value: Any, *, _depth: int = 0) -> Any:
    """``value`` as JSON data (tuples -> lists, numpy scalars -> Python numbers, mappings -> dicts with str keys).

    ``info`` dicts and env attributes go through this on the server, so what a remote client gets is exactly
    what ``json.loads(json.dumps(...))`` of the local value would be (the form episode records store).
    """
    if _depth > 32:
        raise ValueError("value nested deeper than 32 levels")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"non-finite number {value!r} cannot travel as JSON")
        return float(value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return jsonable(value.item(), _depth=_depth + 1)  # numpy scalar
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, _depth=_depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, _depth=_depth + 1) for v in value]
    raise ValueError(f"{type(value).__name__} is not JSON data")


def _json_size(value: Any) -> int:
    import json

    return len(json.dumps(value))


# --------------------------------------------------------------------------------------------- requests
def _same(a: Any, b: Any) -> bool:
    """Equal as JSON data (a tuple default equals the list a client sends); a default that is not JSON data
    equals nothing a client can send."""
    try:
        return jsonable(a) == jsonable(b)
    except ValueError:
        return False


def operator_kwargs(env_id: str, fixed: Mapping[str, Any] | None) -> dict[str, Any]:
    """The operator's kwargs (``llmgym serve --env_kwargs``) that ``env_id`` takes."""
    taken = constructor_kwargs(env_class(env_id))
    return {k: v for k, v in dict(fixed or {}).items() if k in taken}


def changed_kwargs(env_id: str, fixed: Mapping[str, Any] | None) -> dict[str, Any]:
    """The operator's kwargs for ``env_id`` whose values differ from the id's own defaults: a client that does not
    pass them plays episodes that a local env made with the client's kwargs would not give."""
    defaults = env_defaults(env_id)
    return {
        k: v
        for k, v in operator_kwargs(env_id, fixed).items()
        if k not in defaults or not _same(v, defaults[k])
    }


def external_data(env_id: str, fixed: Mapping[str, Any] | None = None) -> list[str]:
    """The data kwargs of ``env_id`` whose default reads data llm-gym does not bundle (MetaMathQA-v0's hub data
    set) and that the operator did not set: serving the id would let any client start that download."""
    cls = env_class(env_id)
    defaults, given = env_defaults(env_id), operator_kwargs(env_id, fixed)
    return [
        k
        for k, bundled in data_kwargs(cls).items()
        if k not in given and defaults.get(k) is not None and defaults.get(k) not in bundled
    ]


def client_settable(env_id: str, allow: tuple[str, ...] = ()) -> frozenset[str]:
    """The kwargs of ``env_id`` a client may set to any value: the class's light kwargs (which do not scale a reset's
    work or memory), plus those the operator allowed (``--allow_client_kwargs``; ``all``: every kwarg but data and
    ``render_mode``)."""
    cls = env_class(env_id)
    taken = constructor_kwargs(cls) - set(data_kwargs(cls)) - set(SERVER_ONLY_KWARGS)
    widened = taken if ALL_KWARGS in allow else taken & set(allow)
    return light_kwargs(cls) | widened


def check_env_kwargs(
    env_id: str,
    env_kwargs: Any,
    *,
    fixed: Mapping[str, Any] | None = None,
    allow: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A client's ``env_kwargs`` for ``env_id``, checked, else :class:`RequestError` (422, 413 when too long).

    Every key must be a constructor parameter and every value JSON data. A client may set the id's light kwargs
    (and those in ``allow``) to any value; every other kwarg only to the value the server uses anyway (``fixed``,
    the operator's ``llmgym serve --env_kwargs``, else the id's default), so no request makes the server's work
    or memory grow; a data kwarg may also name data the family bundles (``"sample"``)."""
    if env_kwargs is None:
        return {}
    if not isinstance(env_kwargs, Mapping):
        raise RequestError(422, f"env_kwargs must be a JSON object, got {type(env_kwargs).__name__}")
    try:
        kwargs = jsonable(env_kwargs)
    except ValueError as e:
        raise RequestError(422, f"env_kwargs must be JSON data: {e}") from None
    if _json_size(kwargs) > MAX_KWARGS_JSON_CHARS:
        raise RequestError(413, f"env_kwargs is longer than {MAX_KWARGS_JSON_CHARS} characters of JSON")
    cls = env_class(env_id)
    known = constructor_kwargs(cls)
    unknown = sorted(k for k in kwargs if k not in known)
    if unknown:
        raise RequestError(
            422,
            f"{env_id} does not take {', '.join(map(repr, unknown))}; its constructor takes "
            f"{', '.join(sorted(known - set(SERVER_ONLY_KWARGS)))}",
        )
    fixed = operator_kwargs(env_id, fixed)
    data = data_kwargs(cls)
    free = client_settable(env_id, allow)
    defaults = env_defaults(env_id)
    for key, value in kwargs.items():
        if key in SERVER_ONLY_KWARGS:
            raise RequestError(422, f"{key} cannot be set by a client (the server never renders)")
        if key in fixed:
            if not _same(fixed[key], value):
                raise RequestError(422, f"{key} is fixed by the server to {short_repr(fixed[key])}")
        elif key in data:
            if not names_bundled_data(value, data[key], defaults.get(key)):
                bundled = " or ".join(map(repr, data[key])) or "nothing (none is bundled)"
                raise RequestError(
                    422,
                    f"{key} names a file or data set on the server; a client may only ask for {bundled}, or the "
                    "server's own (the operator chooses others: llmgym serve --env_kwargs)",
                )
        elif key not in free and not _same(value, defaults.get(key)):
            raise RequestError(
                422,
                f"{key} sets how much work or memory {env_id}'s resets take, so it is the server operator's: this "
                f"server uses {short_repr(defaults.get(key))} (the operator sets it with llmgym serve --env_kwargs, "
                f"or lets clients choose with --allow_client_kwargs {key}); clients may set "
                f"{', '.join(sorted(free))}",
            )
    return kwargs


def check_options(env_id: str, options: Any) -> dict[str, Any] | None:
    """A client's reset ``options`` for ``env_id``: a JSON object of the keys the env understands
    (``TextEnv.reset_options``), else :class:`RequestError`: an env ignores an unknown key, so a misspelt
    ``dynamics_sed`` would quietly play every group member alike."""
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise RequestError(422, f"options must be a JSON object, got {type(options).__name__}")
    try:
        options = jsonable(options)
    except ValueError as e:
        raise RequestError(422, f"options must be JSON data: {e}") from None
    if _json_size(options) > MAX_KWARGS_JSON_CHARS:
        raise RequestError(413, f"options is longer than {MAX_KWARGS_JSON_CHARS} characters of JSON")
    known = reset_options(env_class(env_id))
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise RequestError(
            422,
            f"{env_id}'s reset does not take the option {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(sorted(known))}",
        )
    return options


def check_reset_request(
    request: Mapping[str, Any],
    *,
    served: tuple[str, ...],
    fixed_kwargs: Mapping[str, Any] | None = None,
    allow: tuple[str, ...] = (),
) -> tuple[str, dict[str, Any], int | None, dict[str, Any] | None]:
    """``(env_id, env_kwargs, seed, options)`` of a reset request, checked, else :class:`RequestError`.

    ``request`` holds ``seed`` and the :data:`RESET_KEYS`; any other key is refused (a stock OpenEnv server would
    drop it silently, which is how a misspelt ``sed=`` becomes an unseeded episode). ``env_id`` defaults to the
    first served id; ``env_kwargs`` are the operator's ``fixed_kwargs`` with the client's checked ones
    (:func:`check_env_kwargs`).
    """
    unknown = sorted(str(k) for k in request if k not in ("seed", *RESET_KEYS))
    if unknown:
        raise RequestError(
            400,
            f"reset does not take {', '.join(map(repr, unknown))}; it takes seed, episode_id, {', '.join(RESET_KEYS)}",
        )
    env_id = request.get("env_id") or served[0]
    try:
        env_id = check_trusted_env_id(env_id, "the request")
    except ValueError as e:
        raise RequestError(404, str(e)) from None
    if env_id not in served:
        raise RequestError(404, f"{env_id} is not served here (served: {', '.join(served)})")
    fixed = operator_kwargs(env_id, fixed_kwargs)
    kwargs = {**fixed, **check_env_kwargs(env_id, request.get("env_kwargs"), fixed=fixed, allow=allow)}
    try:
        seed = check_seed(request.get("seed"), "seed")
    except ValueError as e:
        raise RequestError(422, str(e)) from None
    return env_id, kwargs, seed, check_options(env_id, request.get("options"))


def check_action(text: Any, max_chars: int) -> str:
    """``text`` if it is a string of at most ``max_chars`` characters, else :class:`RequestError` (422 / 413)."""
    if not isinstance(text, str):
        raise RequestError(422, f"the action must be a string, got {type(text).__name__}")
    if len(text) > max_chars:
        raise RequestError(
            413,
            f"the action has {len(text)} characters, more than this server's max_action_chars={max_chars}; "
            "nothing was executed",
        )
    return text


# -------------------------------------------------------------------------------------- env descriptions
def space_to_json(space: gym.Space) -> dict[str, Any]:
    """A text space as data (``AnyText`` or ``Text``; other spaces are not served)."""
    if isinstance(space, AnyText):
        return {"type": "AnyText", "max_length": space.max_length, "min_length": space.min_length}
    if isinstance(space, gym.spaces.Text):
        return {
            "type": "Text",
            "max_length": space.max_length,
            "min_length": space.min_length,
            "charset": "".join(sorted(space.character_set)),
        }
    raise ValueError(f"only text spaces can be served, got {space!r}")


def space_from_json(data: Any) -> gym.Space:
    """The space :func:`space_to_json` described (checked: a server reply is untrusted input)."""
    if not isinstance(data, Mapping) or data.get("type") not in ("AnyText", "Text"):
        raise ValueError(f"not a text space description: {str(data)[:80]!r}")
    max_length, min_length = data.get("max_length"), data.get("min_length", 0)
    for name, v in (("max_length", max_length), ("min_length", min_length)):
        if not is_int(v, numpy=False) or not 0 <= v <= 1 << 24:
            raise ValueError(f"space {name} must be an integer in [0, 2**24], got {v!r}")
    max_length = cast(int, max_length)  # checked above
    if data["type"] == "AnyText":
        return AnyText(max_length, min_length=min_length)
    charset = data.get("charset")
    if not isinstance(charset, str) or not charset or len(charset) > 1 << 16:
        raise ValueError("a Text space needs a non-empty charset string")
    return gym.spaces.Text(max_length, min_length=min_length, charset=charset)


def _attribute(base: Any, name: str) -> tuple[bool, Any]:
    try:
        value = getattr(base, name)
    except Exception:  # noqa: BLE001 (a property that needs a reset first, ...)
        return False, None
    try:
        return True, jsonable(value)
    except ValueError:
        return False, None


def static_surface(env: gym.Env) -> dict[str, Any]:
    """The env's attributes that formatting reads and that do not change within an episode, as data."""
    base = env.unwrapped
    out: dict[str, Any] = {}
    for name in STATIC_ATTRIBUTES:
        ok, value = _attribute(base, name)
        if ok:
            out[name] = value
    spec = getattr(base, "reward_spec", None)
    if spec is not None and hasattr(spec, "components"):
        out["reward_spec"] = [[c.name, float(c.value), str(c.description)] for c in spec.components]
    methods: dict[str, Any] = {}
    for name in STATIC_METHODS:
        method = getattr(base, name, None)
        if callable(method):
            try:
                value = method()
                if dataclasses.is_dataclass(value) and not isinstance(value, type):
                    value = dataclasses.asdict(value)
                methods[name] = jsonable(value)
            except Exception:  # noqa: BLE001 (not available for this env)
                continue
    out["methods"] = methods
    return out


def dynamic_surface(env: gym.Env) -> dict[str, Any]:
    """The env's attributes that change with every step (turn and action budget), as data."""
    base = env.unwrapped
    out = {}
    for name in DYNAMIC_ATTRIBUTES:
        ok, value = _attribute(base, name)
        if ok:
            out[name] = value
    return out


def _kind(value: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return is_int(value, numpy=False)
    if kind == "names":  # action_names
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "vocab":
        return isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values())
    if kind == "reward_spec":
        return isinstance(value, list) and all(
            isinstance(row, list)
            and len(row) == 3
            and isinstance(row[0], str)
            and is_number(row[1])
            and math.isfinite(row[1])
            and isinstance(row[2], str)
            for row in value
        )
    if kind == "methods":
        prompt = value.get("ragen_prompt") if isinstance(value, Mapping) else None
        return (
            isinstance(value, Mapping)
            and isinstance(value.get("example_response", ""), str)
            and (
                prompt is None
                or isinstance(prompt, Mapping)
                and isinstance(prompt.get("instruction"), str)
                and (prompt.get("legend") is None or isinstance(prompt.get("legend"), str))
                and is_int(prompt.get("max_tokens"), numpy=False)
                and set(prompt) == {"instruction", "legend", "max_tokens"}
            )
        )
    raise AssertionError(kind)


#: The JSON type of every attribute a server sends (:func:`static_surface`, :func:`dynamic_surface`); ``None`` is
#: allowed for each (an attribute the env has not set yet).
SURFACE_TYPES = {
    **dict.fromkeys(
        ("instructions", "rules", "observation_format", "observation_style", "parse_mode"), "str"
    ),
    "action_sep": "str",
    **dict.fromkeys(("think", "turn_limit_terminates"), "bool"),
    "action_names": "names",
    **dict.fromkeys(("max_turns", "max_actions_per_turn", "max_actions", *DYNAMIC_ATTRIBUTES), "int"),
    "vocab": "vocab",
    "reward_spec": "reward_spec",
    "methods": "methods",
}


def check_surface(attributes: Any) -> dict[str, Any]:
    """A server's attributes (a reply is untrusted input): the known ones, each of its JSON type, else
    ``ValueError`` naming the first that is not; unknown names are dropped (nothing reads them)."""
    if not isinstance(attributes, Mapping):
        raise ValueError("attributes must be a JSON object")
    out = {}
    for name, kind in SURFACE_TYPES.items():
        if name not in attributes:
            continue
        value = attributes[name]
        if value is not None and not _kind(value, kind):
            raise ValueError(f"attribute {name!r} is not a {kind} value: {short_repr(value)}")
        out[name] = value
    return out


def describe(env_id: str, env: gym.Env) -> dict[str, Any]:
    """What a client needs before its first reset: spaces, render modes, attributes (``/llmgym/describe``)."""
    base = env.unwrapped
    return {
        "protocol": PROTOCOL_VERSION,
        "env_id": env_id,
        "observation_space": space_to_json(base.observation_space),
        "action_space": space_to_json(base.action_space),
        "class": type(base).__name__,
        "attributes": static_surface(env),
    }


def parse_env_urls(value: Any, *, allow_credentials: bool = False) -> list[str] | None:
    """``--env_url`` as a list of server addresses (one string, comma-separated, or a list), each an
    ``http(s)://`` or ``ws(s)://`` URL with a host; ``None`` or empty: play locally.

    A token in a URL (``http://user:token@host``) is refused unless ``allow_credentials``: a run's settings are
    saved with its checkpoints and sent to trackers, so the token goes in ``LLMGYM_SERVE_TOKEN`` instead."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"env_url must be a URL or a list of URLs, got {type(value).__name__}")
    urls = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"env_url must hold URLs, got {item!r}")
        urls += [u.strip() for u in item.split(",") if u.strip()]
    import urllib.parse

    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
            raise ValueError(f"env_url must look like http://HOST:PORT, got {url!r}")
        if not allow_credentials and (parts.username or parts.password):
            shown = urllib.parse.urlunsplit(
                (parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", "")
            )
            raise ValueError(
                f"env_url must not carry a user or token ({shown} with credentials): the run's settings are saved "
                "with its checkpoints and sent to trackers; set LLMGYM_SERVE_TOKEN instead"
            )
    return urls or None
