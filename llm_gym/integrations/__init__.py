"""Adapters that let other training loops use llm-gym environments.

* :mod:`llm_gym.integrations.trl`: TRL's own ``GRPOTrainer`` through its ``environment_factory`` (tool calling).

Each adapter imports its framework lazily, so ``import llm_gym`` never needs it.
"""
