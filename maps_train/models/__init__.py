"""Model resolution: hub ids, local folders, and `builtin:` models materialised offline from installed packages."""

from maps_train.models.resolve import BUILTINS, resolve_model

__all__ = ["BUILTINS", "resolve_model"]
