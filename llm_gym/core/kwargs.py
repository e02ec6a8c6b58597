"""What an environment class's constructor keywords are, and which of them someone other than the user may set.

Two places take kwargs from a party they do not fully trust: replay (a record's kwargs) and ``llmgym serve`` (a
client's). Both ask the class through these functions, never a name list of their own:

* :func:`constructor_kwargs`: the keyword names ``cls(...)`` takes, following ``**kwargs`` up the bases;
* :func:`kwarg_defaults`: their default values;
* :func:`data_kwargs`: the kwargs that name a file or a hub data set (``TextEnv.data_kwargs``), each with the
  values that name data bundled with llm-gym;
* :func:`light_kwargs`: the kwargs that do not change how much work or memory a reset or step takes
  (``TextEnv.light_kwargs``);
* :func:`reset_options`: the ``reset(options=...)`` keys the env understands (``TextEnv.reset_options``).

A class lists only its own names in those class attributes; its bases' count too.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

#: Constructor kwargs that name a file or a data set in every family that takes them, declared or not: a family
#: that forgets ``data_kwargs`` still never reads a path from a record or a client (nothing bundled).
ALWAYS_DATA_KWARGS = ("dataset", "level_file")


def _init_chain(cls: type) -> list[inspect.Parameter]:
    """The ``__init__`` parameters of ``cls`` and, while they end in ``**kwargs``, of its bases (nearest first)."""
    params: list[inspect.Parameter] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        own = list(inspect.signature(init).parameters.values())
        params += [p for p in own if p.name != "self"]
        if not any(p.kind is p.VAR_KEYWORD for p in own):
            break
    return params


@functools.cache
def constructor_kwargs(cls: type) -> frozenset[str]:
    """The keyword names ``cls(...)`` takes: its ``__init__`` parameters and, through ``**kwargs``, its bases'."""
    return frozenset(p.name for p in _init_chain(cls) if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


@functools.cache
def _defaults(cls: type) -> tuple[tuple[str, Any], ...]:
    out: dict[str, Any] = {}
    for p in _init_chain(cls):  # nearest class first: a subclass's default wins over its base's
        if p.default is not p.empty and p.name not in out:
            out[p.name] = p.default
    return tuple(out.items())


def kwarg_defaults(cls: type) -> dict[str, Any]:
    """The default value of each constructor keyword that has one (the nearest class's, as a call would get)."""
    return dict(_defaults(cls))


def _union(cls: type, attribute: str) -> list[Any]:
    out: list[Any] = []
    for klass in reversed(cls.__mro__):
        out += list(klass.__dict__.get(attribute, ()))
    return out


@functools.cache
def _data(cls: type) -> tuple[tuple[str, tuple[str, ...]], ...]:
    taken = constructor_kwargs(cls)
    out = {k: () for k in ALWAYS_DATA_KWARGS if k in taken}
    for klass in reversed(cls.__mro__):
        declared = klass.__dict__.get("data_kwargs")
        if isinstance(declared, Mapping):
            out.update({str(k): tuple(v) for k, v in declared.items()})
    return tuple(out.items())


def data_kwargs(cls: type) -> dict[str, tuple[str, ...]]:
    """The constructor kwargs of ``cls`` that name a file or a hub data set, each with the values that name data
    bundled with llm-gym (``TextEnv.data_kwargs``, plus :data:`ALWAYS_DATA_KWARGS` with nothing bundled)."""
    return dict(_data(cls))


@functools.cache
def light_kwargs(cls: type) -> frozenset[str]:
    """The constructor kwargs of ``cls`` that do not scale the work or memory of a reset or step
    (``TextEnv.light_kwargs`` of the class and its bases; never a data kwarg)."""
    return (frozenset(_union(cls, "light_kwargs")) & constructor_kwargs(cls)) - set(data_kwargs(cls))


@functools.cache
def reset_options(cls: type) -> frozenset[str]:
    """The ``reset(options=...)`` keys ``cls`` understands (``TextEnv.reset_options`` of the class and its bases)."""
    return frozenset(_union(cls, "reset_options"))


def names_bundled_data(value: Any, bundled: tuple[str, ...], default: Any) -> bool:
    """Whether ``value`` of a data kwarg reads nothing a user did not choose: ``None``, a value that names bundled
    data, or the id's own default (what leaving the kwarg out gives)."""
    if value is None:
        return True
    if isinstance(value, str) and value in bundled:
        return True
    return type(value) is type(default) and value == default


def foreign_data_kwargs(cls: type, kwargs: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """The keys of ``kwargs`` (from untrusted input: a record, a data row) that name a file or a data set the user
    did not choose: a data kwarg of ``cls`` (:func:`data_kwargs`) whose value is neither bundled data nor the
    default in ``defaults`` (:func:`names_bundled_data`). Such a value must come from the user, never from data."""
    data = data_kwargs(cls)
    return [k for k, v in kwargs.items() if k in data and not names_bundled_data(v, data[k], defaults.get(k))]
