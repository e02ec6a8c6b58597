"""Algorithms (--algo) and PPO argument validation."""

import dataclasses

import pytest
from llm_gym.trainer.algorithms import ALGORITHMS, algorithm_overrides, get_algorithm, trainer_class
from llm_gym.trainer.config import PPOArguments


def test_names_and_rows_of_ragen2_table():
    assert set(ALGORITHMS) == {"ppo", "grpo", "dapo", "drgrpo"}
    ppo, dapo, grpo, dr = (algorithm_overrides(n) for n in ("ppo", "dapo", "grpo", "drgrpo"))
    # token-mean for the critic algorithms, seq-mean-token-mean for GRPO, seq-mean-token-sum for Dr.GRPO
    assert ppo["loss_type"] == dapo["loss_type"] == "dapo"
    assert grpo["loss_type"] == "grpo" and grpo["scale_rewards"] == "group"
    assert dr["loss_type"] == "dr_grpo" and dr["scale_rewards"] == "none"
    assert (dapo["epsilon"], dapo["epsilon_high"]) == (0.2, 0.28)
    assert ppo["epsilon_high"] == 0.2
    assert grpo["epsilon_high"] == dr["epsilon_high"] == 0.28  # RAGEN-2 App. B.2 protocol
    assert ppo["gae_gamma"] == ppo["gae_lambda"] == 1.0
    for o in (ppo, dapo, grpo, dr):
        assert o["beta"] == 0.0 and o["entropy_coef"] == 0.001
    assert get_algorithm("ppo").uses_critic and get_algorithm("dapo").uses_critic
    assert not get_algorithm("grpo").uses_critic and not get_algorithm("drgrpo").uses_critic


def test_overrides_are_valid_config_fields_and_fresh():
    from trl import GRPOConfig

    known = {f.name for f in dataclasses.fields(GRPOConfig)} | {
        f.name for f in dataclasses.fields(PPOArguments)
    }
    for name in ALGORITHMS:
        o = algorithm_overrides(name)
        assert set(o) <= known, set(o) - known
        o["beta"] = 1.0
        assert algorithm_overrides(name)["beta"] == 0.0


def test_overrides_build_a_grpo_config(tmp_path):
    from trl import GRPOConfig

    grpo_keys = {f.name for f in dataclasses.fields(GRPOConfig)}
    for name in ALGORITHMS:
        kw = {k: v for k, v in algorithm_overrides(name).items() if k in grpo_keys}
        cfg = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **kw)
        assert cfg.loss_type == kw["loss_type"]


def test_aliases_and_unknown_names():
    assert get_algorithm("Dr.GRPO").name == "drgrpo"
    assert get_algorithm("dr_grpo").name == "drgrpo"
    with pytest.raises(ValueError, match="valid names: ppo, dapo, grpo, drgrpo"):
        algorithm_overrides("reinforce")
    with pytest.raises(ValueError):
        trainer_class("sac")
    with pytest.raises(ValueError):
        get_algorithm(3)


def test_trainer_class():
    from llm_gym.trainer.ppo import LLMGymPPOTrainer

    assert trainer_class("ppo") is LLMGymPPOTrainer
    assert trainer_class("dapo") is LLMGymPPOTrainer
    grpo_cls = trainer_class("grpo")
    assert grpo_cls.__name__ == "LLMGymGRPOTrainer"
    assert trainer_class("drgrpo") is grpo_cls
    assert issubclass(LLMGymPPOTrainer, grpo_cls)


def test_ppo_args_defaults_and_help():
    args = PPOArguments()
    args.validate_ppo_args()
    assert (args.value_lr, args.value_clip, args.gae_gamma, args.gae_lambda) == (1e-5, 0.2, 1.0, 1.0)
    assert args.whiten_advantages is True
    for f in dataclasses.fields(PPOArguments):
        assert f.metadata.get("help"), f.name


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("vf_coef", -1.0, "vf_coef"),
        ("vf_coef", float("nan"), "vf_coef"),
        ("value_lr", 0.0, "value_lr"),
        ("value_clip", -0.1, "value_clip"),
        ("gae_gamma", 1.5, "gae_gamma"),
        ("gae_lambda", -0.1, "gae_lambda"),
        ("value_head_init_std", -1.0, "value_head_init_std"),
        ("whiten_advantages", "yes", "whiten_advantages"),
        ("value_lr", "1e-5", "value_lr"),
    ],
)
def test_ppo_args_validation(field, value, match):
    args = dataclasses.replace(PPOArguments(), **{field: value})
    with pytest.raises(ValueError, match=match):
        args.validate_ppo_args()


def test_value_clip_off_is_allowed():
    dataclasses.replace(PPOArguments(), value_clip=None).validate_ppo_args()
    dataclasses.replace(PPOArguments(), value_clip=0.0).validate_ppo_args()
