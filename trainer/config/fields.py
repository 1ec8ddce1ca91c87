"""Declarative flag fields: one dataclass field is one command-line flag.

A config dataclass declares each flag once, with :func:`flag` (default, help, bounds, help group);
choices come from ``Literal[...]`` annotations, optionality from ``X | None``, comma-separated lists
from ``tuple[str, ...]``, two-number flags (``--flag LOW HIGH``, as OpenRLHF's ``nargs=2``) from
``tuple[float, float]``. Values that are computed from the flags are declared with :func:`derived`.
:func:`flag_specs` turns the fields into :class:`FlagSpec` records that both the argparse builder
(``trainer.config.cli``) and the per-field validation (:func:`check_field`) read, so no flag is
written down twice.

Nothing here knows about particular flags.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

FLAG_KEY = "trainer.flag"
DERIVED_KEY = "trainer.derived"

_Scalar = bool | int | float | str


@dataclass(frozen=True)
class FlagMeta:
    """What :func:`flag` records about a field besides its type and default."""

    help: str
    group: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    const: str | None = None  # value of a bare ``--flag`` for ``X | None`` flags that take an optional value
    metavar: str | tuple[str, ...] | None = None


def flag(
    default: Any,
    help: str,
    *,
    group: str,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    const: str | None = None,
    metavar: str | tuple[str, ...] | None = None,
) -> Any:
    """Declare a config field that is also the command-line flag ``--<field name>``.

    ``ge``/``gt``/``le``/``lt`` are bounds checked by :func:`check_field` (each number of a pair); ``const``
    makes the flag's value optional on the command line (a bare ``--flag`` stores ``const``).
    """
    meta = FlagMeta(help=help, group=group, ge=ge, gt=gt, le=le, lt=lt, const=const, metavar=metavar)
    return field(default=default, metadata={FLAG_KEY: meta})


def derived(default: int | float | bool | str, help: str) -> Any:
    """Declare a value computed during validation (not a flag; not accepted by ``__init__``)."""
    return field(default=default, init=False, metadata={DERIVED_KEY: help})


@dataclass(frozen=True)
class FlagSpec:
    """A flag field with its annotation resolved: the one description of a flag."""

    name: str
    base: type  # bool, int, float or str (the element type for list flags)
    optional: bool  # annotation is ``X | None``
    is_list: bool  # annotation is ``tuple[str, ...]``: comma-separated on the command line
    choices: tuple[Any, ...] | None  # from ``Literal[...]``
    default: Any
    meta: FlagMeta
    is_pair: bool = False  # annotation is ``tuple[float, float]``: two numbers on the command line

    @property
    def cli(self) -> str:
        """The command-line spelling, e.g. ``--train_batch_size``."""
        return "--" + self.name

    def describe_type(self) -> str:
        """Human description of what the flag accepts, for error messages."""
        if self.choices is not None:
            what = "one of " + ", ".join(str(c) for c in self.choices)
        elif self.is_list:
            what = "a comma-separated list of strings"
        elif self.is_pair:
            what = "two numbers (LOW HIGH)"
        else:
            what = {bool: "a boolean switch", int: "an integer", float: "a number", str: "a string"}[
                self.base
            ]
        return what + (" (or None)" if self.optional else "")


def _resolve(name: str, annotation: Any) -> tuple[type, bool, bool, tuple[Any, ...] | None, bool]:
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = typing.get_args(annotation)
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"flag field {name!r}: only 'X | None' unions are supported, got {annotation}")
        optional = len(rest) < len(args)
        annotation = rest[0]
        origin = typing.get_origin(annotation)
    if origin is Literal:
        choices = typing.get_args(annotation)
        bases = {type(c) for c in choices}
        if len(bases) != 1 or not bases <= {int, str}:
            raise TypeError(f"flag field {name!r}: Literal choices must all be int or all be str")
        return bases.pop(), optional, False, choices, False
    if origin is tuple:
        args = typing.get_args(annotation)
        if args == (float, float):
            return float, optional, False, None, True
        if args != (str, Ellipsis):
            raise TypeError(f"flag field {name!r}: only tuple[str, ...] and tuple[float, float] are supported")
        return str, optional, True, None, False
    if annotation in (bool, int, float, str):
        return annotation, optional, False, None, False
    raise TypeError(f"flag field {name!r}: unsupported annotation {annotation!r}")


@functools.cache
def flag_specs(cls: type) -> tuple[FlagSpec, ...]:
    """The :class:`FlagSpec` of every :func:`flag` field of dataclass ``cls``, in declaration order."""
    hints = typing.get_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(FLAG_KEY)
        if meta is None:
            continue
        base, optional, is_list, choices, is_pair = _resolve(f.name, hints[f.name])
        if base is bool and (f.default is not False or optional):
            raise TypeError(
                f"flag field {f.name!r}: boolean flags are store_true switches defaulting to False"
            )
        specs.append(FlagSpec(f.name, base, optional, is_list, choices, f.default, meta, is_pair))
    return tuple(specs)


@functools.cache
def derived_names(cls: type) -> tuple[str, ...]:
    """Names of the :func:`derived` fields of dataclass ``cls``, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(cls) if DERIVED_KEY in f.metadata)


def split_list(value: str) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``: the comma-separated list convention of list flags."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


#: The words that mean None for a flag that may be None (``X | None``), in any case.
NONE_WORDS = ("none", "null", "~")
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def from_text(spec: FlagSpec, text: str) -> Any:
    """The value a flag's text means, in the flag's type: the one reading of flag text, for the trainer's command
    line (:mod:`trainer.config.cli`), rlrun's ``--set`` and a preset's strings (``rlrun/presets/__init__.py``) and text
    given to :class:`TrainerConfig` for a list or a two-number flag.

    A flag that may be None takes ``none``, ``null`` or ``~`` (any case) for None, unless that word is one of its
    choices; a list flag takes comma-separated items (:func:`split_list`); a two-number flag ``LOW,HIGH`` or
    ``LOW HIGH``; a boolean true / false, yes / no, on / off, 1 / 0. Raises ValueError naming what the flag takes
    (bounds and choices are :func:`check_field`'s)."""
    word = text.strip()
    if spec.optional and word.lower() in NONE_WORDS and (spec.choices is None or word not in spec.choices):
        return None
    if spec.is_list:
        return split_list(text)
    if spec.is_pair:
        parts = word.replace(",", " ").split()
        try:
            if len(parts) == 2:
                return float(parts[0]), float(parts[1])
        except ValueError:
            pass
    elif spec.base is bool:
        if word.lower() in _TRUE + _FALSE:
            return word.lower() in _TRUE
    elif spec.base is str:
        return text
    else:
        try:
            return spec.base(word)
        except ValueError:
            pass
    raise ValueError(f"{text!r} is not {spec.describe_type()}")


def _coerce(spec: FlagSpec, value: Any) -> Any:
    """Normalise harmless representation differences (int for float, list for tuple, "a,b" for lists)."""
    if isinstance(value, str) and (spec.is_list or spec.is_pair):
        try:
            return from_text(spec, value)
        except ValueError:
            return value
    if spec.is_list and isinstance(value, Sequence):
        return tuple(value)
    if spec.is_pair and value is not None:
        if isinstance(value, Sequence) and len(value) == 2:
            try:
                return tuple(float(p) if not isinstance(p, bool) else p for p in value)
            except (TypeError, ValueError):
                return value
        return value
    if spec.base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _type_ok(spec: FlagSpec, value: Any) -> bool:
    if value is None:
        return spec.optional
    if spec.is_list:
        return isinstance(value, tuple) and all(isinstance(v, str) for v in value)
    if spec.is_pair:
        return isinstance(value, tuple) and len(value) == 2 and all(type(v) is float for v in value)
    if spec.base is bool:
        return isinstance(value, bool)
    if spec.base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, spec.base)


def _bounds_text(meta: FlagMeta) -> str:
    parts = []
    if meta.ge is not None:
        parts.append(f">= {meta.ge:g}")
    if meta.gt is not None:
        parts.append(f"> {meta.gt:g}")
    if meta.le is not None:
        parts.append(f"<= {meta.le:g}")
    if meta.lt is not None:
        parts.append(f"< {meta.lt:g}")
    return " and ".join(parts)


def check_field(spec: FlagSpec, value: Any) -> tuple[Any, str | None]:
    """Coerce ``value`` for ``spec`` and check type, choices and bounds.

    Returns ``(value, None)`` when it is fine, else ``(value, problem)`` where the problem names the flag,
    the value given and what was expected.
    """
    value = _coerce(spec, value)
    if not _type_ok(spec, value):
        return value, f"{spec.cli} {value!r}: expected {spec.describe_type()}"
    if value is None or spec.base is bool or spec.is_list:
        return value, None
    if spec.choices is not None and value not in spec.choices:
        return value, f"{spec.cli} {value!r}: expected one of {', '.join(str(c) for c in spec.choices)}"
    meta = spec.meta
    for number in value if spec.is_pair else (value,):
        if isinstance(number, int | float):
            out_of_bounds = (
                (meta.ge is not None and not number >= meta.ge)
                or (meta.gt is not None and not number > meta.gt)
                or (meta.le is not None and not number <= meta.le)
                or (meta.lt is not None and not number < meta.lt)
            )
            if out_of_bounds:
                shown = " ".join(f"{v:g}" for v in value) if spec.is_pair else f"{value:g}"
                return value, f"{spec.cli} {shown}: {'each number ' if spec.is_pair else ''}must be {_bounds_text(meta)}"
    return value, None
