"""The options llmgym-train, llmgym-eval and llmgym-sft share: declared once (trainer/options.py), one name per
meaning, grouped --help with --model on the first screen, and ``llmgym list``."""

from __future__ import annotations

import dataclasses
import re

import pytest

pytest.importorskip("trl")

from llm_gym.trainer import evaluate, flags, options, sft  # noqa: E402

from llm_gym import registration  # noqa: E402
from llm_gym.cli import main as llmgym  # noqa: E402

#: The shared option groups and the fields each command offers from them.
SHARED = {
    options.ModelArguments: {"train": ["dtype"], "sft": ["dtype"], "eval": ["dtype"]},
    options.EnvArguments: {"train": "all", "eval": "all"},
    options.PromptArguments: {"train": "all", "eval": list(options.CHAT_SETTINGS)},
    options.EvalSeedArguments: {"train": "all", "sft": "all", "eval": "all"},
    options.OutputOptions: {"train": "all", "sft": "all", "eval": "all"},
}


@pytest.fixture(scope="module")
def parsers():
    return {"train": flags.build_parser(), "sft": sft.build_parser(), "eval": evaluate.build_parser()}


def _action(parser, name):
    return parser._option_string_actions[f"--{name}"]


def _first_sentence(text: str) -> str:
    return " ".join(text.split()).split(". ")[0]


def test_shared_options_are_declared_once_with_one_help(parsers):
    """Each shared field reaches every command that offers it under its own name, with the declaration's help
    (a command may add a sentence after it, never replace it)."""
    seen = 0
    for cls, by_command in SHARED.items():
        declared = {f.name: f for f in dataclasses.fields(cls)}
        for command, names in by_command.items():
            for name in declared if names == "all" else names:
                action = _action(parsers[command], name)
                assert action.dest == name, (command, name)
                help_text = " ".join(str(action.help).split())
                assert help_text.startswith(_first_sentence(declared[name].metadata["help"])), (command, name)
                seen += 1
    assert seen > 30


def test_one_name_per_meaning_across_the_commands(parsers):
    """The names llmgym-eval used for shared meanings are gone from --help (kept only as hidden aliases)."""
    listed = {
        c: set(re.findall(r"^  (--[a-z0-9_]+)(?=[ ,]|$)", p.format_help(), flags=re.M))
        for c, p in parsers.items()
    }
    for old, new in options.DEPRECATED["llmgym-eval"].items():
        assert old not in listed["eval"] and new in listed["eval"]
        assert old not in listed["train"] | listed["sft"]
    for name in ("--eval_seed", "--num_eval_seeds", "--resume", "--overwrite_output_dir", "--dtype"):
        assert all(name in names for names in listed.values()), name
    for c in ("train", "sft", "eval"):
        assert "-o" in _action(parsers[c], "output_dir").option_strings


@pytest.mark.parametrize("command", ["train", "sft", "eval"])
def test_help_is_grouped_with_model_on_the_first_screen(parsers, command):
    out = parsers[command].format_help()
    lines = out.splitlines()
    assert lines.index("") <= 3, lines[:6]  # a short usage line, not TRL's hundred-line block
    assert any(line.startswith("  --model MODEL") for line in lines[:24]), lines[:24]
    headings = [line[:-1] for line in lines if re.fullmatch(r"[A-Za-z][A-Za-z ]*:", line)]
    assert headings[0] == "options" and "model" in headings and "output" in headings
    assert len(headings) >= 5
    listed = re.findall(r"^  (--[a-z0-9_]+)(?=[ ,]|$)", out, flags=re.M)
    assert len(listed) == len(set(listed))  # each flag once
    options_section = out.split("\n\n")[2]
    assert options_section.startswith("options:") and "--output_dir" not in options_section


def test_sft_help_lists_every_config_field_in_a_section(parsers):
    from llm_gym.trainer.config import LLMGymSFTConfig

    out = parsers["sft"].format_help()
    listed = set(re.findall(r"^  (--[a-z0-9_]+)(?=[ ,]|$)", out, flags=re.M))
    assert {f"--{f.name}" for f in dataclasses.fields(LLMGymSFTConfig) if f.init} <= listed
    data = out[out.index("\ndata:\n") :].split("\n\n", 2)[1]
    assert "--data DATA" in data and "--eval_seed" in data and "--format_loss_weight" in data


def test_env_help_names_the_registered_families(parsers, monkeypatch):
    for command in ("train", "eval"):
        help_text = " ".join(str(_action(parsers[command], "env").help).split())
        assert "Families: " + ", ".join(registration.family_names()) + "." in help_text
    extra = registration.EnvEntry("llmgym/Corridor-v0", "somewhere.corridor:CorridorEnv", "a corridor")
    monkeypatch.setattr(registration, "ENVS", (*registration.ENVS, extra))
    assert "Corridor." in " ".join(str(_action(evaluate.build_parser(), "env").help).split())


def test_sft_takes_o_and_the_shared_output_options(parsers):
    config, opts = parsers["sft"].parse_args_into_dataclasses(
        ["--data", "d.jsonl", "-o", "out", "--resume", "--use_cpu", "True"]
    )
    assert config.output_dir == "out" and opts.resume == "latest" and opts.overwrite_output_dir is False


def test_field_options_follow_the_field_types():
    import argparse

    parser = argparse.ArgumentParser()
    options.add_field_options(parser, options.EnvArguments)
    options.add_field_options(parser, options.OutputOptions)
    ns = parser.parse_args(["--max_turns", "3", "--think", "false", "--env_url", "a", "b", "--resume"])
    assert ns.max_turns == 3 and ns.think is False and ns.env_url == ["a", "b"] and ns.resume == "latest"
    assert parser.parse_args(["--think"]).think is True
    with pytest.raises(SystemExit):
        parser.parse_args(["--max_turns", "x"])
    assert options.env_kwargs_of({"max_turns": 3, "env_kwargs": '{"max_turns": 2, "size": 5}'}) == {
        "max_turns": 2,
        "size": 5,
    }
    with pytest.raises(ValueError, match="max_actions must be a positive integer"):
        options.env_kwargs_of({"max_actions": 0})


# ------------------------------------------------------------------------------------------------ llmgym list
def test_llmgym_list_prints_every_id_its_description_and_baselines(capsys):
    from llm_gym.agent.baselines import baseline_success, format_baseline

    assert llmgym(["list", "--num_eval_seeds", "6"]) == 0
    out = capsys.readouterr().out
    for entry in registration.ENVS:
        assert re.search(rf"^{re.escape(entry.id)} +{re.escape(entry.description)}$", out, flags=re.M), (
            entry.id
        )
    line = out.split("llmgym/Bandit-v0 ", 1)[1].splitlines()[1].strip()
    assert (
        line == f"{format_baseline(baseline_success('llmgym/Bandit-v0', range(123, 129)))} (seeds 123..128)"
    )
    # an id whose default data is a hub data set: no baselines, and no download attempted
    hub = out.split("llmgym/MetaMathQA-v0 ", 1)[1].splitlines()[1]
    assert "n/a" in hub and "hub data set" in hub


def test_llmgym_list_without_baselines_and_bad_seeds(capsys):
    assert llmgym(["list", "--num_eval_seeds", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(registration.ENVS) and lines[0].startswith(registration.ENVS[0].id)
    assert llmgym(["list", "--eval_seed", "-1"]) == 2
    assert "--eval_seed" in capsys.readouterr().err
