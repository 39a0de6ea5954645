"""A name → object registry that refuses duplicates and answers typos with a suggestion."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Generic, TypeVar

from clbench.errors import ClbenchError

T = TypeVar("T")


def did_you_mean(name: str, known) -> str:
    """ " (did you mean 'x'?)" for the closest of known to a mistyped name, or "" where none is close."""
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T) -> T:
        if name in self._items:
            raise ClbenchError(f"duplicate {self.kind} name {name!r}")
        self._items[name] = item
        return item

    def get(self, name: str) -> T:
        if name in self._items:
            return self._items[name]
        hint = did_you_mean(name, self._items)
        raise ClbenchError(f"unknown {self.kind} {name!r}{hint}; known: {', '.join(sorted(self._items))}")

    def names(self) -> list[str]:
        return sorted(self._items)

    def registered(self) -> list[T]:
        """Every item, in the order registered (names() sorts)."""
        return list(self._items.values())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def resolve(self, spec: str) -> list[str]:
        """'a,b' or 'all' → validated names, in the order given."""
        names = [s.strip() for s in spec.split(",") if s.strip()]
        if not names:
            raise ClbenchError(f"empty {self.kind} list {spec!r}")
        if names == ["all"]:
            return self.names()
        for name in names:
            self.get(name)
        if len(set(names)) != len(names):
            raise ClbenchError(f"{self.kind} list {spec!r} names one {self.kind} twice")
        return names
