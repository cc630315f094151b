"""Method name -> engine class. `agent.method` picks one; every engine has the same `run_batch` interface.

An engine registers itself with `@register_method("name")` in its module. MAPS lives in `maps_train.agents.maps`;
baselines live in `maps_train.agents.baselines` (its `__init__` imports each baseline module so that importing the
package registers them all). Both are imported lazily on the first lookup.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TypeVar

from maps_train.errors import MapsTrainError

E = TypeVar("E")

_ENGINES: dict[str, type] = {}
_ENGINE_PACKAGES = ("maps_train.agents.maps", "maps_train.agents.baselines")


def register_method(name: str) -> Callable[[type[E]], type[E]]:
    def decorate(cls: type[E]) -> type[E]:
        if name in _ENGINES and _ENGINES[name] is not cls:
            raise ValueError(f"method '{name}' is registered twice ({_ENGINES[name].__name__}, {cls.__name__})")
        cls.method = name  # type: ignore[attr-defined]
        _ENGINES[name] = cls
        return cls

    return decorate


def _load_engines() -> None:
    for module in _ENGINE_PACKAGES:
        importlib.import_module(module)


def available_methods() -> list[str]:
    _load_engines()
    return sorted(_ENGINES)


def method_roles(name: str) -> tuple[str, ...]:
    """The roles (routes) a method's calls take: its engine's `roles`."""
    return tuple(engine_class(name).roles)


def engine_class(name: str) -> type:
    if name not in _ENGINES:
        _load_engines()
    if name not in _ENGINES:
        known = ", ".join(sorted(_ENGINES)) or "none"
        raise MapsTrainError(f"agent.method: no engine for '{name}' (available: {known})")
    return _ENGINES[name]
