"""Rebuild ``tests/data/ragen_chat.json``: the prompt RAGEN's own code builds after a few replies in a few episodes.

Run it by hand against a RAGEN checkout at commit 20daedc (nothing here touches the network)::

    python tests/ragen_chat_fixture.py /path/to/RAGEN

It reads RAGEN's configuration as RAGEN does: the ``custom_envs`` entries of ``config/envs.yaml`` merged with the
per-task run configs (``config/_N_*.yaml``), the ``agent_proxy`` settings of ``config/base.yaml``, and the env
config dataclasses of ``ragen/env/<type>/config.py`` (imported from the checkout). The text assembly is a
transcription, kept minimal, of RAGEN's ``ragen/llm_agent/ctx_manager.py`` at 20daedc:

* the system prompt: ``_init_prefix_lookup`` (lines 120-146, including its merge of only the entry's top-level
  keys into the dataclass defaults, which leaves ``observation_format`` at ``"grid"`` and ``grid_vocab`` at its
  default, so the symbol legend is appended in coordinate mode too) and ``_build_system_content`` (541-545);
* each turn: ``_build_format_prompt`` (531-539), ``_build_turn_state_content`` (616-635) and
  ``_build_infer_multi_turn_messages`` (1325-1348);
* the stored reply: ``_parse_response`` (196-221); the fixture only uses replies it leaves unchanged, since
  llm-gym keeps the sampled text (a documented difference);

and of the turn loop of ``ragen/llm_agent/es_manager.py`` (183-247: valid actions by case-insensitive lookup,
the budget, the reward summed from an int 0, the "no valid action" flag). The game itself is llm-gym's env,
stepped one action at a time as RAGEN's manager steps its env; its parity with RAGEN's games is tested elsewhere.
The test that reads the fixture is ``tests/test_ragen_protocol.py::test_ragen_chat_style_renders_ragens_text``.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import re
import sys
import types
from pathlib import Path

import gymnasium as gym
import yaml

import llm_gym  # noqa: F401  (registers the ids)

FIXTURE = Path(__file__).parent / "data" / "ragen_chat.json"
SPECIAL_TOKENS = ["<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>"]

#: name -> (llm-gym id, RAGEN tag, RAGEN run config, seed, replies)
CASES = {
    "sokoban": (
        "llmgym/Sokoban-v0",
        "SimpleSokoban",
        "_2_sokoban.yaml",
        3,
        ["<think>push</think><answer>Up || Left</answer>", "<think>hm</think><answer>Jump</answer>"],
    ),
    "sokoban_new_vocab": (
        "llmgym/SokobanNewVocab-v0",
        "SokobanDifferentGridVocab",
        "_2_sokoban.yaml",
        3,
        ["<think>push</think><answer>Up || Jump</answer>"],
    ),
    "frozen_lake": (
        "llmgym/FrozenLakeDeterministic-v0",
        "FrozenLake",
        "_3_frozen_lake.yaml",
        3,
        ["<think>go</think><answer>Down || Right</answer>"],
    ),
    "coord_sokoban": (
        "llmgym/RagenCoordSokoban-v0",
        "CoordSokoban",
        "_2_sokoban.yaml",
        3,
        [
            "<think>around</think><answer>Left || Left</answer>",
            "<think>down</think><answer>Down</answer>",
            "<think>hm</think><answer>Jump</answer>",
        ],
    ),
    "coord_frozen_lake": (
        "llmgym/RagenCoordFrozenLake-v1",
        "CoordFrozenLake",
        "_3_frozen_lake.yaml",
        3,
        ["<think>go</think><answer>Right || Up</answer>", "<think>x</think><answer>Left</answer>"],
    ),
    "countdown": (
        "llmgym/Countdown-v0",
        "Countdown",
        "_4_countdown.yaml",
        3,
        [],  # one turn: RAGEN builds only the first prompt
    ),
    "metamathqa": (
        "llmgym/MetaMathQASample-v0",
        "MetamathQA",
        "_5_metamathqa.yaml",
        3,
        ["no tags"],
    ),
}


def _merge(base: dict, over: dict) -> dict:
    """Hydra's deep merge of ``over`` into ``base``, for plain mappings."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _env_config_class(ragen: Path, env_type: str) -> type:
    """RAGEN's ``<Type>EnvConfig`` dataclass, imported from the checkout (``ragen.env.base`` is stubbed: the
    Countdown config imports a name from it that its dataclass does not use)."""
    for name in ("ragen", "ragen.env"):
        sys.modules.setdefault(name, types.ModuleType(name))
    base = sys.modules.setdefault("ragen.env.base", types.ModuleType("ragen.env.base"))
    base.BaseEnvConfig = object
    path = ragen / "ragen" / "env" / env_type / "config.py"
    spec = importlib.util.spec_from_file_location(f"_ragen_{env_type}_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (cls,) = [
        c
        for c in vars(module).values()
        if dataclasses.is_dataclass(c) and isinstance(c, type) and c.__module__ == module.__name__
    ]
    return cls


def system_prompt(entry: dict, config_cls: type, action_sep: str) -> str:
    # ctx_manager.py:126-146 (_init_prefix_lookup) and 541-545 (_build_system_content)
    merged = dataclasses.asdict(config_cls())
    for k, v in entry.items():
        merged[k] = v
    instruction = merged.get("env_instruction", "")
    observation_format = merged.get("observation_format", "grid")
    if observation_format == "grid" and merged.get("grid_vocab", False):
        instruction += "\nThe meaning of each symbol in the state is:\n" + ", ".join(
            f"{k}: {v}" for k, v in merged["grid_vocab"].items()
        )
    if observation_format == "coord":
        raise NotImplementedError("no fixture case uses the coord-only format")
    if merged.get("action_lookup", False):
        instruction += "\nYour available actions are:\n" + ", ".join(
            f"{v}" for v in merged["action_lookup"].values()
        )
        instruction += (
            f"\nYou can make up to {merged['max_actions_per_traj']} actions, separated by the action separator "
            f'" {action_sep} "\n'
        )
    return "You're a helpful assistant. " + instruction if instruction else "You're a helpful assistant. "


def parse_response(response: str, proxy: dict) -> tuple[str, list[str]]:
    # ctx_manager.py:196-221 (_parse_response)
    think = proxy["enable_think"]
    pattern = r"<think>(.*?)</think>\s*<answer>(.*?)</answer>" if think else r"<answer>(.*?)</answer>"
    match = re.search(pattern, response, re.DOTALL)
    if not match:
        return response, []
    think_content, action_content = (match.group(1), match.group(2)) if think else ("", match.group(1))
    for token in SPECIAL_TOKENS:
        action_content = action_content.replace(token, "").strip()
        think_content = think_content.replace(token, "").strip()
    actions = [a.strip() for a in action_content.split(proxy["action_sep"]) if a.strip()]
    if len(actions) > proxy["max_actions_per_turn"]:
        actions = actions[: proxy["max_actions_per_turn"]]
        action_content = (" " + proxy["action_sep"] + " ").join(actions)
    if think:
        return f"<think>{think_content}</think><answer>{action_content}</answer>", actions
    return f"<answer>{action_content}</answer>", actions


def turn_state_content(turn: dict, number: int, proxy: dict, max_tokens: int) -> str:
    # ctx_manager.py:531-539 (_build_format_prompt) and 616-635 (_build_turn_state_content, include_warning=True)
    fmt = (
        "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
        if proxy["enable_think"]
        else "<answer> [your answer] </answer>"
    )
    length = f"Max response length: {max_tokens} words (tokens)."
    warning = ""
    if turn.get("manager_invalid_action"):
        warning = (
            "No valid action provided previously. Environment state remains the same. Please try again.\n"
        )
    return f"\nTurn {number}:\n" + (
        f"State:\n{turn['state']}\n{warning}"
        f"You have {turn['actions_left']} actions left. Always output: {fmt} "
        f"with no extra text. Strictly follow this format. {length}\n"
    )


def messages(system: str, history: list[dict], proxy: dict, max_tokens: int) -> list[dict]:
    # ctx_manager.py:1325-1348 (_build_infer_multi_turn_messages, full history)
    out = [{"role": "system", "content": system}, {"role": "user", "content": ""}]
    for idx, content in enumerate(history):
        if "state" in content:
            out[-1]["content"] += turn_state_content(content, idx + 1, proxy, max_tokens)
        if "llm_response" in content:
            out.append({"role": "assistant", "content": content["llm_response"]})
        if "reward" in content:
            out.append({"role": "user", "content": f"Reward:\n{content['reward']}\n"})
    return out


def play(
    env_id: str, seed: int, replies: list[str], entry: dict, config_cls: type, proxy: dict
) -> list[dict]:
    """RAGEN's turn loop (es_manager.py:183-247) over llm-gym's game, stepped one action at a time."""
    # llm-gym's own turn and action limits are lifted: the budget below is RAGEN's
    limits = {"max_turns": 100}
    if gym.make(env_id).unwrapped.action_names:
        limits["max_actions"] = 100
    engine = gym.make(env_id, parse_mode="ragen", **limits).unwrapped
    obs, _ = engine.reset(seed=seed)
    lookup = getattr(config_cls(), "action_lookup", None)
    budget = entry["max_actions_per_traj"]
    num_actions, done = 0, False
    history = [{"state": obs, "actions_left": budget}]
    for reply in replies:
        assert not done, f"{env_id}: the episode ended before the reply {reply!r}"
        llm_response, actions = parse_response(reply, proxy)
        assert llm_response == reply, f"choose replies RAGEN stores unchanged, not {reply!r}"
        if lookup is None:
            valid = actions
        else:
            names = {v.lower(): v for v in lookup.values()}
            valid = [names[a.lower()] for a in actions if a.lower() in names]
        acc_reward, executed = 0, []
        for action in valid[: budget - num_actions]:
            obs, reward, terminated, truncated, info = engine.step(
                f"<think></think><answer>{action}</answer>"
            )
            assert info["action_is_valid"], info
            acc_reward += reward
            executed.append(action)
            if terminated:
                done = True
                break
        num_actions += len(executed)
        history[-1].update({"llm_response": llm_response, "reward": acc_reward})
        history.append({"state": obs, "actions_left": budget - num_actions})
        if not valid:
            history[-1]["manager_invalid_action"] = True
        done = done or num_actions >= budget
    # the fixture holds the next prompt RAGEN builds; a finished episode gets none
    assert not done, f"{env_id}: choose replies that leave the episode running"
    return history


def build(ragen: Path) -> dict:
    config_dir = ragen / "config"
    base = yaml.safe_load((config_dir / "base.yaml").read_text(encoding="utf-8"))
    custom_envs = yaml.safe_load((config_dir / "envs.yaml").read_text(encoding="utf-8"))["custom_envs"]
    out = {}
    for name, (env_id, tag, run_config, seed, replies) in CASES.items():
        run = yaml.safe_load((config_dir / run_config).read_text(encoding="utf-8")) or {}
        proxy = _merge(base["agent_proxy"], run.get("agent_proxy", {}))
        entry = _merge(custom_envs[tag], (run.get("custom_envs") or {}).get(tag, {}))
        config_cls = _env_config_class(ragen, entry["env_type"])
        history = play(env_id, seed, replies, entry, config_cls, proxy)
        out[name] = {
            "env_id": env_id,
            "ragen_tag": tag,
            "seed": seed,
            "replies": replies,
            "messages": messages(
                system_prompt(entry, config_cls, proxy["action_sep"]), history, proxy, entry["max_tokens"]
            ),
            "generation_suffix": "<think>" if proxy["enable_think"] else "<answer>",
        }
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    data = {k: v for k, v in data.items() if k == "coord_end_states"}  # observation cases, kept as they are
    data.update(build(Path(argv[0])))
    FIXTURE.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {FIXTURE} ({len(data) - 1} chat cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
