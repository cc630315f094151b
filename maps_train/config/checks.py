"""The recipe's field validators, in one place: what a field's annotation cannot say (a bound, a finite number).

A field names its validator as `metadata={"help": ..., "check": check_x}`; the loader runs it on the value it read
(`maps_train.config.typed`), naming the file and the dotted field, and `check_fields` runs the same validators on a
section built in code or on a mapping of its fields (`rl.role_reward`). A validator returns the value (possibly normalised) or raises `FieldError`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from maps_train.config.typed import FieldError


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_positive(value: int) -> int:
    """A count of at least 1 (ranks, generations, tokens)."""
    if value < 1:
        raise FieldError("", f"must be at least 1, got {value}")
    return value


def check_positive_or_null(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or value < 1):
        raise FieldError("", f"must be >= 1 or null, got {value!r}")
    return value


def check_count(value: int) -> int:
    """A number of things (GPUs): 0 or more."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FieldError("", f"must be an integer >= 0, got {value!r}")
    return value


def check_fraction(value: float | None) -> float | None:
    """A share of a GPU's memory, or null."""
    if value is not None and not 0 < value <= 1:
        raise FieldError("", f"must be a fraction of the GPU in (0, 1], got {value}")
    return value


def check_gigabytes(value: float) -> float:
    """An amount of memory: finite and above 0 (NaN, infinity and negative sizes are not sizes)."""
    if not _number(value) or not 0 < value < math.inf:
        raise FieldError("", f"must be a finite number of gigabytes > 0, got {value!r}")
    return value


def check_weight(value: float) -> float:
    """A reward part's weight: finite and 0 or more (a negative weight would reward what it means to cost)."""
    if not _number(value) or not 0 <= value < math.inf:
        raise FieldError("", f"must be a finite number >= 0, got {value!r}")
    return value


def check_finite_positive(value: float) -> float:
    if not _number(value) or not 0 < value < math.inf:
        raise FieldError("", f"must be a finite number > 0, got {value!r}")
    return value


def check_fields(section: Any, values: dict[str, Any] | None = None) -> None:
    """Run every field's validator of dataclass `section` (a class or an instance) on `values` (default: the
    instance's own values, for a section built in code); a refusal is `FieldError(field, message)`."""
    for item in dataclasses.fields(section):
        check = item.metadata.get("check")
        if check is None or (values is not None and item.name not in values):
            continue
        try:
            check(values[item.name] if values is not None else getattr(section, item.name))
        except FieldError as err:
            raise FieldError(item.name, err.message) from None
