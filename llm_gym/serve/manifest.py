"""OpenEnv's description of a served id (``openenv.yaml`` with its RFC 008 ``validation:`` block), from the registry.

OpenEnv's validator (``openenv validate``, RFC 008 "environment auto-validation", huggingface/OpenEnv#778) reads a
package folder whose ``openenv.yaml`` declares the reward range, the resources, the capabilities and the type tags
of one environment, and, for its runtime level, a data-only runtime plan (``validation/runtime.json``: one reset
and the actions to play). Nothing here is written by hand: each value comes from the id's registered class and
kwargs, the server's limits and the family's expert:

* :func:`reward_range`: the bounds of one step's reward, from the id's :class:`~llm_gym.core.rewards.RewardSpec`
  (each game component fires at most once per executed action, ``format_penalty`` only on a turn that executes
  nothing);
* :func:`openenv_manifest`: the ``openenv.yaml`` mapping (``GET /llmgym/openenv.yaml?env_id=...`` serves it);
* :func:`runtime_plan`: one episode the family's expert plays (the random valid-action policy where it has none);
* :func:`write_package`: the folder ``openenv validate DIR`` reads.

Data only: no OpenEnv import, so the core package can build it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import numpy as np

from llm_gym.registration import ENVS, check_trusted_env_id, env_family, make_env

#: Where the runtime plan lies in a package (OpenEnv's default ``validation.execution.probe_path``).
PROBE_PATH = "validation/runtime.json"
#: Seed and episode id of the runtime plan's episode.
PLAN_SEED = 0
#: OpenEnv's ceiling on a plan's actions (``openenv.validation.runtime.contracts.MAX_PLAN_ACTIONS``).
MAX_PLAN_ACTIONS = 100
#: The severity policy's smallest ``floor_margin`` and largest ``episode_timeout_s`` (OpenEnv's
#: ``validation/policies/severity-v2.json`` bounds).
POLICY_MIN_FLOOR_MARGIN = 0.1
POLICY_MAX_EPISODE_TIMEOUT_S = 3600.0
#: Declared budget of one ``llmgym serve`` process (its measured RSS is ~115 MiB; docs/serving.md "Benchmark").
CPU, MEMORY_MB, DISK_MB = 1.0, 1024, 1024


def llm_gym_version() -> str:
    try:
        return metadata.version("llm-gym")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0.0.0"


def reward_range(env: Any) -> tuple[float, float]:
    """``(low, high)`` bounds of one step's reward for a made env: at most ``k`` actions a turn (the per-turn and
    episode action limits), each adding every game component at most once, or ``format_penalty`` alone."""
    base = env.unwrapped
    spec = dict(base.reward_spec.as_dict())
    penalty = spec.pop("format_penalty", 0.0)
    k = max(1, min(int(base.max_actions_per_turn), int(base.max_actions)))
    low = min(0.0, penalty, k * sum(v for v in spec.values() if v < 0))
    high = max(0.0, penalty, k * sum(v for v in spec.values() if v > 0))
    if high <= low:  # every value 0 (rewards overridden away): OpenEnv needs a strictly increasing range
        high = low + 1.0
    return float(low), float(high)


def openenv_manifest(
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    request_timeout_s: float | None = None,
    execution: bool = False,
) -> dict[str, Any]:
    """The ``openenv.yaml`` mapping of ``env_id`` made with ``env_kwargs`` (the server's kwargs). ``execution``
    adds the runtime binding (``validation.execution``) that a package folder has (:func:`write_package`)."""
    from llm_gym.serve.protocol import DEFAULT_REQUEST_TIMEOUT_S

    env_id = check_trusted_env_id(env_id, "the manifest request")
    entry = next(e for e in ENVS if e.id == env_id)
    env = make_env(env_id, dict(env_kwargs or {}))
    try:
        low, high = reward_range(env)
        turns = int(cast(Any, env.unwrapped).max_turns)
    finally:
        env.close()
    per_request = DEFAULT_REQUEST_TIMEOUT_S if request_timeout_s is None else float(request_timeout_s)
    family = env_family(env_id)
    validation: dict[str, Any] = {
        "reward": {"range": [low, high], "oracle_tolerance": 0.0, "floor_margin": POLICY_MIN_FLOOR_MARGIN},
        "resources": {
            "cpu": CPU,
            "memory_mb": MEMORY_MB,
            "disk_mb": DISK_MB,
            # a reset and every turn, each within the server's request bound
            "episode_timeout_s": min(POLICY_MAX_EPISODE_TIMEOUT_S, per_request * (turns + 1)),
        },
        # the id's version pins its episodes (registration.py's version policy)
        "task_distribution": {"dataset_version": env_id},
        "network": {"mode": "public"},
        "capabilities": {"verifier": {"kind": "reward_channel"}},
        "types": {"tags": ["llm-gym", family]},
    }
    if execution:
        validation["execution"] = {"kind": "openenv_ws", "probe_path": PROBE_PATH, "dockerfile": "Dockerfile"}
    return {
        "spec_version": 1,
        "name": env_id.split("/", 1)[1].lower(),
        "version": llm_gym_version(),
        "description": entry.description,
        "type": "space",
        "runtime": "fastapi",
        "port": 8000,
        "validation": validation,
    }


def runtime_plan(
    env_id: str, env_kwargs: Mapping[str, Any] | None = None, seed: int = PLAN_SEED
) -> dict[str, Any]:
    """OpenEnv's runtime plan (``plan_schema_version`` 1): a reset of ``env_id`` with ``seed`` and the replies the
    family's expert gives until the episode ends (the random valid-action policy, drawn from ``seed``, where the
    expert has no plan or the family none)."""
    env_id = check_trusted_env_id(env_id, "the plan request")
    env = make_env(env_id, dict(env_kwargs or {}))
    base: Any = env.unwrapped
    rng = np.random.default_rng(seed)
    actions: list[dict[str, str]] = []
    try:
        env.reset(seed=seed)
        done = False
        while not done and len(actions) < MAX_PLAN_ACTIONS:
            reply = base.expert_reply() if getattr(base, "expert_name", None) else None
            if reply is None:
                reply = base.sample_valid_action(rng, reasoning="")
            actions.append({"text": reply})
            _, _, terminated, truncated, _ = env.step(reply)
            done = terminated or truncated
    finally:
        env.close()
    episode = f"{env_id.split('/', 1)[1].lower()}-seed-{seed}"
    reset_options: dict[str, Any] = {"env_id": env_id}
    if env_kwargs:
        reset_options["env_kwargs"] = dict(env_kwargs)
    return {
        "plan_schema_version": "1",
        "reset": {"episode_id": episode, "seed": seed, "options": reset_options},
        "actions": actions,
    }


def write_package(
    directory: str | Path,
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    request_timeout_s: float | None = None,
) -> Path:
    """Write the folder ``openenv validate DIR`` reads for ``env_id``: ``openenv.yaml`` (with the runtime
    binding) and ``validation/runtime.json``. Returns the folder. No ``Dockerfile``: the subject is the installed
    ``llmgym serve`` (:mod:`llm_gym.serve.validate` starts it), not an image OpenEnv's Docker provider builds."""
    import yaml

    root = Path(directory)
    (root / "validation").mkdir(parents=True, exist_ok=True)
    manifest = openenv_manifest(env_id, env_kwargs, request_timeout_s=request_timeout_s, execution=True)
    (root / "openenv.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False), encoding="utf-8")
    plan = runtime_plan(env_id, env_kwargs)
    (root / PROBE_PATH).write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")
    return root


__all__ = [
    "PROBE_PATH",
    "openenv_manifest",
    "reward_range",
    "runtime_plan",
    "write_package",
]
