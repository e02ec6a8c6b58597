"""What ``llmgym serve`` needs to know about the installed OpenEnv release (no import of it here).

OpenEnv is published as ``openenv`` (0.10, huggingface/OpenEnv; what the ``serve`` extra installs and TRL 1.16's
async GRPO harness imports, ``openenv.core.harness``). The older ``openenv-core`` (0.3) installs the same
``openenv`` package folder: the two distributions overwrite each other's files, so only one may be installed.

* :func:`app_options`: the keyword arguments of ``create_fastapi_app`` this release takes (0.10 publishes the
  state model in ``/schema`` and reads the server mode from ``OPENENV_MODE`` unless it is given; 0.3 takes
  neither);
* :func:`distribution_problem`: one line when both distributions are installed;
* :func:`mcp_reply`: the answer to ``POST /mcp``. OpenEnv's validator (``openenv validate URL``) requires that
  route to answer JSON-RPC 2.0; OpenEnv's own handler also opens server-side sessions over plain HTTP
  (``openenv/session/create``), with no WebSocket to bound their life, so ours answers statelessly instead:
  llm-gym environments have no tools, ``tools/list`` is empty and every other method is "not found".
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from importlib import metadata
from typing import Any

from llm_gym.core.checks import is_int

#: The server's name for OpenEnv's Task API routes (``GET /list_environments``).
ENV_NAME = "llmgym"
#: JSON-RPC 2.0 error codes (https://www.jsonrpc.org/specification#error_object).
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND = -32700, -32600, -32601
NO_TOOLS = "llm-gym environments have no tools (tools/list is empty); play them over /ws"


def app_options(create_fastapi_app: Callable[..., Any], state_cls: type) -> dict[str, Any]:
    """The options of ``create_fastapi_app`` that the installed release takes: the state model (``/schema``,
    ``/state``), the Task API name and the simulation mode (fixed here, so an ``OPENENV_MODE=production`` in the
    server's environment cannot drop ``/reset``, ``/step`` and ``/state``)."""
    wanted = {"state_cls": state_cls, "env_name": ENV_NAME, "mode": "simulation"}
    params = inspect.signature(create_fastapi_app).parameters
    return {k: v for k, v in wanted.items() if k in params}


def distribution_problem() -> str | None:
    """One line when ``openenv`` and ``openenv-core`` are both installed (their files overwrite each other)."""
    found = {}
    for name in ("openenv", "openenv-core"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    if len(found) < 2:
        return None
    return (
        f"openenv {found['openenv']} and openenv-core {found['openenv-core']} are both installed and share the "
        "'openenv' package folder; run: pip uninstall -y openenv-core openenv && pip install 'llm-gym[serve]'"
    )


def _error(code: int, message: str, request_id: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def mcp_reply(body: bytes) -> dict[str, Any] | None:
    """The JSON-RPC 2.0 answer to a ``POST /mcp`` body; ``None`` for a notification (no ``id``: no answer)."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):  # JSONDecodeError and bad UTF-8 are ValueErrors
        return _error(PARSE_ERROR, "Parse error: the body is not JSON")
    if not isinstance(request, dict):
        return _error(INVALID_REQUEST, "Invalid Request: one JSON-RPC request object (no batches)")
    request_id = request.get("id")
    if request_id is not None and not (isinstance(request_id, str) or is_int(request_id, numpy=False)):
        return _error(INVALID_REQUEST, "Invalid Request: id must be a string, an integer or null")
    method = request.get("method")
    if request.get("jsonrpc") != "2.0" or not isinstance(method, str):
        return _error(INVALID_REQUEST, 'Invalid Request: needs "jsonrpc": "2.0" and a "method"', request_id)
    if "id" not in request:
        return None
    if method == "tools/list":
        return {"jsonrpc": "2.0", "id": request_id, "result": {"tools": []}}
    if method == "ping":
        return {"jsonrpc": "2.0", "id": request_id, "result": {}}
    return _error(METHOD_NOT_FOUND, f"Method not found: {method[:80]!r}; {NO_TOOLS}", request_id)


__all__ = ["ENV_NAME", "NO_TOOLS", "app_options", "distribution_problem", "mcp_reply"]
