"""Declared reward specifications.

Each environment declares its reward as named components with default values. Users override values with
``gym.make(id, rewards={"name": value})``; each step reports the components in ``info["reward_components"]`` and
the step reward is their sum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

#: Largest allowed magnitude of a reward component value: sums over turns, groups and batches stay finite
#: (1e308 + 1e308 is inf, and one inf turns every advantage into NaN).
REWARD_MAX_ABS = 1e9


@dataclass(frozen=True)
class RewardComponent:
    """One named part of an environment's reward; ``value`` is its default."""

    name: str
    value: float
    description: str


@dataclass(frozen=True)
class RewardSpec:
    """An ordered set of reward components with their (possibly overridden) values."""

    components: tuple[RewardComponent, ...]

    if TYPE_CHECKING:  # set by __post_init__, not dataclass fields (the runtime class never sees these lines)
        _names: tuple[str, ...] = field(init=False)
        _values: dict[str, float] = field(init=False)

    def __post_init__(self):
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate reward component names: {names}")
        for c in self.components:
            if not math.isfinite(c.value):
                raise ValueError(f"reward component {c.name!r} has non-finite default {c.value}")
        # Cached because every env step asks for them.
        object.__setattr__(self, "_names", tuple(names))
        object.__setattr__(self, "_values", {c.name: c.value for c in self.components})

    @classmethod
    def of(cls, *components: RewardComponent | tuple[str, float, str]) -> RewardSpec:
        return cls(tuple(c if isinstance(c, RewardComponent) else RewardComponent(*c) for c in components))

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def __getitem__(self, name: str) -> float:
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(
                f"unknown reward component {name!r}; valid names: {', '.join(self.names)}"
            ) from None

    def as_dict(self) -> dict[str, float]:
        return dict(self._values)

    def extend(self, components: Iterable[RewardComponent]) -> RewardSpec:
        return RewardSpec(self.components + tuple(components))

    def with_overrides(self, overrides: Mapping[str, float] | None) -> RewardSpec:
        """A copy with some values replaced; unknown names and values that are not finite or exceed
        :data:`REWARD_MAX_ABS` in magnitude raise ``ValueError``."""
        if not overrides:
            return self
        if not isinstance(overrides, Mapping):
            raise ValueError(
                f"rewards must be a mapping of component name to value, got {type(overrides).__name__}"
            )
        unknown = sorted(set(overrides) - set(self.names))
        if unknown:
            raise ValueError(f"unknown reward component(s) {unknown}; valid names: {', '.join(self.names)}")
        new = []
        for c in self.components:
            if c.name in overrides:
                v = overrides[c.name]
                try:
                    v = float(v)
                except (TypeError, ValueError):
                    raise ValueError(f"reward component {c.name!r} must be a number, got {v!r}") from None
                if not math.isfinite(v) or abs(v) > REWARD_MAX_ABS:
                    raise ValueError(
                        f"reward component {c.name!r} must be a finite number in "
                        f"[-{REWARD_MAX_ABS:g}, {REWARD_MAX_ABS:g}], got {v}"
                    )
                c = RewardComponent(c.name, v, c.description)
            new.append(c)
        return RewardSpec(tuple(new))

    def zeros(self) -> dict[str, float]:
        return dict.fromkeys(self._names, 0.0)

    def markdown_table(self) -> str:
        rows = ["| component | default | meaning |", "|---|---|---|"]
        rows += [f"| `{c.name}` | {c.value:g} | {c.description} |" for c in self.components]
        return "\n".join(rows)


FORMAT_PENALTY = RewardComponent(
    "format_penalty", -0.1, "added once per turn whose response is unparsable or names an invalid action"
)
