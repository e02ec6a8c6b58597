"""Environment implementations; import them through ``gymnasium.make`` ids (see ``llm_gym.registration``)."""
