"""Where each dotted key of a layered recipe was written (`Sources`), so an error names the file a bad key
is in: an overlay or one of its bases, not only the file the user named."""

from __future__ import annotations

from typing import Any


class Sources:
    """Which file each dotted key came from, so an error names the file the bad key is written in (an overlay or
    one of its bases), not only the file the user named."""

    def __init__(self, default: str):
        self.default = default  # for keys no file wrote (a missing required field): the file the user named
        self.origins: dict[str, str] = {}  # in the order written: see `latest`
        # key -> keys recorded below it, so replacing a section forgets its keys without scanning every key (which
        # made a file of many keys quadratic). May still name keys replaced since: those are popped harmlessly.
        self._below: dict[str, set[str]] = {}

    def at(self, where: str) -> str:
        key = where
        while key:
            if key in self.origins:
                return self.origins[key]
            key = _parent_key(key)
        return self.default

    def latest(self, where: str) -> str:
        """The file that last wrote `where` or anything below it: for an error about a whole section (a check across
        its fields), the layer that changed it last is the one to look at."""
        below = [k for k in self.origins if k == where or k.startswith((f"{where}.", f"{where}["))]
        return self.origins[below[-1]] if below and where else self.at(where)

    def record(self, where: str, value: Any, origin: str) -> None:
        """`where` (and everything below it) now comes from `origin`; what an earlier file put below it is gone."""
        for key in self._below.pop(where, ()):
            self.origins.pop(key, None)
        self.touch(where, origin)
        if isinstance(value, dict):
            for key, item in value.items():
                self.record(f"{where}.{key}", item, origin)

    def touch(self, where: str, origin: str) -> None:
        """`where` itself now comes from `origin` and is the latest key written (what is below it stays)."""
        self.origins.pop(where, None)
        self.origins[where] = origin
        parent = _parent_key(where)
        while parent:
            self._below.setdefault(parent, set()).add(where)
            parent = _parent_key(parent)


Source = str | Sources


def source_of(source: Source, where: str) -> str:
    return source.at(where) if isinstance(source, Sources) else source


def _parent_key(key: str) -> str:
    """`a.b[2]` -> `a.b` -> `a` -> ``."""
    cut = key.rfind("[") if key.endswith("]") else key.rfind(".")
    return key[:cut] if cut > 0 else ""
