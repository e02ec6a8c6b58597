"""Shared helpers for the tests that cover every registered id."""

import llm_gym

#: kwargs needed to build an id offline in tests (MetaMathQA's default loads the hub dataset).
OFFLINE_KWARGS = {
    "llmgym/MetaMathQA-v0": {"dataset": "sample"},
    "llmgym/MetaMathQARetry-v0": {"dataset": "sample"},
}

ALL_IDS = llm_gym.list_envs()


def make_kwargs(env_id: str) -> dict:
    return dict(OFFLINE_KWARGS.get(env_id, {}))
