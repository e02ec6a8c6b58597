"""Environments over the network: ``llmgym serve`` and the ``llmgym/Remote-v0`` client.

* :mod:`llm_gym.serve.server`: the server, OpenEnv's own (``openenv``, the ``serve`` extra) with llm-gym's
  typed models, request checks and limits around it;
* :mod:`llm_gym.serve.client`: :class:`~llm_gym.serve.client.RemoteEnv`, a ``gymnasium.Env`` over one server
  session, registered as ``llmgym/Remote-v0`` (``gym.make("llmgym/Remote-v0", url=..., env_id=...)``); it needs
  only ``websockets``;
* :mod:`llm_gym.serve.protocol`: what travels between them, checked as data on both sides.

Nothing here is imported by ``import llm_gym``; the server and the client import their dependencies lazily and
name the extra to install when one is missing.
"""

from llm_gym.registration import REMOTE_ID

__all__ = ["REMOTE_ID"]
