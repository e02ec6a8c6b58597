"""A two-armed symbolic bandit for LLM agents (RAGEN's "Bi-arm" bandit)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from llm_gym.core import ExpertMove, ParsedResponse, RewardSpec, TextEnv, format_response

#: (low-risk, high-risk) name pairs from RAGEN-2: the name hints at the arm's risk profile.
TRAIN_PAIRS: tuple[tuple[str, str], ...] = (
    ("Teacher", "Trader"),
    ("Nurse", "StartupFounder"),
    ("Librarian", "Investor"),
    ("Accountant", "StockBroker"),
    ("Engineer", "RealEstateAgent"),
    ("Pharmacist", "Musician"),
    ("Clerk", "Freelancer"),
    ("Technician", "Youtuber"),
    ("Planner", "Artist"),
    ("Postman", "Pilot"),
    ("Banker", "VentureCapitalist"),
    ("Gardener", "Cryptominer"),
)
TEST_PAIRS: tuple[tuple[str, str], ...] = (
    ("Receptionist", "Explorer"),
    ("Archivist", "Filmmaker"),
    ("Bookkeeper", "Consultant"),
    ("SocialWorker", "Photographer"),
    ("Mechanic", "GameDesigner"),
    ("Secretary", "Entrepreneur"),
    ("Cashier", "DataScientist"),
    ("CivilServant", "StartupAccelerator"),
)
SPLITS = {"train": TRAIN_PAIRS, "test": TEST_PAIRS}


#: Most arm pairs, and longest arm name (characters), accepted in ``arm_pairs``.
MAX_ARM_PAIRS = 1000
MAX_ARM_NAME_LENGTH = 4096


def _check_pairs(arm_pairs: Any) -> tuple[tuple[str, str], ...]:
    """``arm_pairs`` as a tuple of ``(low, high)`` name pairs, or ``ValueError`` saying what is wrong."""
    shape = (
        "arm_pairs must be a non-empty list of at most "
        f"{MAX_ARM_PAIRS} (low_risk, high_risk) pairs of distinct, non-empty names"
    )
    if isinstance(arm_pairs, (str, bytes)) or not isinstance(arm_pairs, Sequence):
        raise ValueError(shape)
    if not 0 < len(arm_pairs) <= MAX_ARM_PAIRS:
        raise ValueError(f"{shape}, got {len(arm_pairs)} pairs")
    pairs = []
    for pair in arm_pairs:
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(f"{shape}; {pair!r:.60} is not a pair")
        for name in pair:
            # Names are shown in observations and matched against answers: printable, one line, bounded.
            if not isinstance(name, str) or not name.strip() or len(name) > MAX_ARM_NAME_LENGTH:
                raise ValueError(
                    f"arm names must be non-empty strings of at most {MAX_ARM_NAME_LENGTH} characters, "
                    f"got {name!r:.80}"
                )
            if not name.isprintable() or name != name.strip():
                raise ValueError(f"arm names must be printable without surrounding spaces, got {name!r:.80}")
        if pair[0].lower() == pair[1].lower():
            raise ValueError(f"{shape}; the names of {tuple(pair)!r:.80} are the same")
        pairs.append((pair[0], pair[1]))
    return tuple(pairs)


class BanditEnv(TextEnv):
    """Pick one of two arms whose names hint at their risk.

    ## Description
    RAGEN's two-armed symbolic bandit. Each episode draws a (low-risk, high-risk) name pair from the ``split``
    list and shows the two names in a random order. The low-risk arm always pays ``low_risk``; the high-risk arm
    pays ``high_risk`` with probability ``high_risk_prob`` (default 0.25, so 0.25 expected against 0.1), else 0.
    Choosing the high-risk arm is the success criterion: it has the higher expected payoff.

    ## Action
    One arm name (case-insensitive) as the answer. Anything else is invalid and costs ``format_penalty``.

    ## Observation
    The task text naming the two arms; after the pull, ``"<arm>: <reward> points"``.

    ## Starting state
    A (low-risk, high-risk) name pair drawn from the list with ``np_random``, its two names shown in a random
    order; no arm pulled yet.

    ## Rewards
    ``low_risk`` 0.1 for the low-risk arm; ``high_risk`` 1.0 when the high-risk arm pays out; ``format_penalty``
    -0.1 for an invalid answer.

    ## Episode end
    Terminated after one valid pull, or when ``max_turns`` (1) answers are used up without a valid pull.

    ## Information
    ``reset`` adds ``arms`` (the two names in the order shown); every ``info`` adds ``chosen_arm`` (``None``
    until a valid pull) and ``high_risk_arm``.

    ## Arguments
    * ``split``: ``"train"`` (12 pairs, default) or ``"test"`` (8 held-out pairs).
    * ``arm_pairs``: custom pairs, overriding ``split``: at most 1000 pairs of distinct, non-empty, printable
      names of at most 4096 characters.
    * ``high_risk_prob``: the high-risk arm's payout probability, default 0.25.
    * The common ``TextEnv`` arguments (``max_turns`` defaults to 1).

    ## Version history
    * v0: initial version (RAGEN-2 name lists; low-risk payout 0.1 as in RAGEN's code, not the v1 paper's 0.15).
    """

    game_reward_spec = RewardSpec.of(
        ("low_risk", 0.1, "payout of the low-risk arm (always paid)"),
        ("high_risk", 1.0, "payout of the high-risk arm (paid with probability high_risk_prob)"),
    )
    action_sep = None
    turn_limit_terminates = True
    expert_name = "expected-value"
    # arm_pairs (up to 1000 pairs of long names) stays the server operator's
    light_kwargs = ("split", "high_risk_prob")

    def __init__(
        self,
        *,
        split: str = "train",
        arm_pairs: Sequence[Sequence[str]] | None = None,
        high_risk_prob: float = 0.25,
        max_turns: int = 1,
        max_actions_per_turn: int = 1,
        max_actions: int = 1,
        **kwargs: Any,
    ):
        if arm_pairs is None:
            if split not in SPLITS:
                raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
            pairs = SPLITS[split]
        else:
            pairs = _check_pairs(arm_pairs)
        if not 0.0 <= float(high_risk_prob) <= 1.0:
            raise ValueError(f"high_risk_prob must be in [0, 1], got {high_risk_prob!r}")
        self.split = split
        self.arm_pairs = pairs
        names = "".join(n for pair in pairs for n in pair)
        self.glyphs = "".join(sorted({ch for ch in names if not ch.isascii()}))
        self.obs_max_length = 120 + 2 * max(len(n) for pair in pairs for n in pair)
        self.high_risk_prob = float(high_risk_prob)
        super().__init__(
            max_turns=max_turns, max_actions_per_turn=max_actions_per_turn, max_actions=max_actions, **kwargs
        )
        self.low_arm = self.high_arm = ""
        self.arms: tuple[str, str] = ("", "")
        self.chosen: str | None = None
        self.payout = 0.0
        self._last_answer = ""

    def _rules(self) -> str:
        return (
            "You are playing a two-armed bandit. Each arm has a name, and its reward distribution is related to "
            "what the name suggests. Think about what each name means and pull the arm you expect to pay more. "
            "Answer with the arm's name."
        )

    def _reset_game(self, options: dict[str, Any]) -> dict[str, Any]:
        low, high = self.arm_pairs[int(self.np_random.integers(len(self.arm_pairs)))]
        self.low_arm, self.high_arm = low, high
        self.arms = (low, high) if self.np_random.random() < 0.5 else (high, low)
        self.chosen = None
        self.payout = 0.0
        self._last_answer = ""
        return {"arms": list(self.arms)}

    def _parse_actions(self, parsed: ParsedResponse) -> tuple[list[Any], str | None]:
        self._last_answer = parsed.answer
        answer = parsed.answer.strip().strip(".!\"'`*").strip()
        for arm in self.arms:
            if answer.lower() == arm.lower():
                return [arm], None
        shown = answer if len(answer) <= 40 else answer[:37] + "..."
        return [], f"invalid arm {shown!r}; answer with one of: {', '.join(self.arms)}"

    def _apply_action(self, action: str) -> tuple[dict[str, float], bool]:
        self.chosen = action
        if action == self.low_arm:
            self.payout = self.reward_spec["low_risk"]
            return {"low_risk": self.payout}, True
        paid = self.np_random.random() < self.high_risk_prob
        self.payout = self.reward_spec["high_risk"] if paid else 0.0
        return {"high_risk": self.payout}, True

    def _observation(self) -> str:
        if self.chosen is not None:
            return f"{self.chosen}: {self.payout:g} points"
        return f"The two arms are: {self.arms[0]} and {self.arms[1]}. Which arm do you pull?"

    def _is_terminated(self) -> bool:
        return self.chosen is not None

    def _is_success(self) -> bool:
        return self.chosen is not None and self.chosen == self.high_arm

    def _extra_info(self) -> dict[str, Any]:
        return {"chosen_arm": self.chosen, "high_risk_arm": self.high_arm}

    def example_response(self) -> str:
        return format_response(["ArmName"], "...", use_think=self.think)

    # ------------------------------------------------------------------------------- family knowledge
    def _random_answer(self, rng: np.random.Generator, actions_per_turn: int) -> list[str]:
        # One of the two arms shown (one answer per turn, whatever actions_per_turn says).
        if not self.arms[0]:
            raise ValueError("reset the Bandit env before asking for an action")
        return [self.arms[int(rng.integers(len(self.arms)))]]

    def optimum_solves(self, info: Mapping[str, Any]) -> bool | None:
        return True  # a perfect player always picks the high-risk arm

    def expert_move(self) -> ExpertMove | None:
        """The arm with the higher expected payoff (``high_risk_prob * high_risk`` vs ``low_risk``): the
        high-risk arm with the default rewards."""
        spec = self.reward_spec
        high_ev = self.high_risk_prob * spec["high_risk"]
        low_ev = spec["low_risk"]
        best = self.high_arm if high_ev >= low_ev else self.low_arm
        think = (
            f"{self.high_arm} pays {spec['high_risk']:g} with probability {self.high_risk_prob:g} "
            f"({high_ev:g} expected); {self.low_arm} pays {low_ev:g}. {best} has the higher expected payoff."
        )
        return ExpertMove(think, [best])

    def card(self) -> dict[str, str]:
        verdict = ""
        if self.chosen is not None:
            kind = "high-risk" if self.chosen == self.high_arm else "low-risk"
            verdict = f"{kind} arm, {self.payout:g} points"
        elif self._last_answer:
            verdict = "invalid answer"
        question = f"Two arms: {self.arms[0]} and {self.arms[1]}. Which arm do you pull?"
        return {"title": "Bandit", "question": question, "answer": self._last_answer, "verdict": verdict}
