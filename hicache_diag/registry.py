"""A registry of named implementations whose factories import lazily (mini-sglang's
`utils/registry.py` shape): registering costs nothing, `get` imports on first use, so `--help`
and bad-input refusals never import torch or SGLang, and a reader can follow each name to its
factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from hicache_diag.errors import UsageError

T = TypeVar("T")


class Registry(Generic[T]):
    """`@REG.register("name")` on a zero-argument factory; `REG.get("name")` (or `REG["name"]`)
    calls it once and keeps what it made."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[[], T]] = {}
        self._made: dict[str, T] = {}

    def register(self, name: str) -> Callable[[Callable[[], T]], Callable[[], T]]:
        def add(factory: Callable[[], T]) -> Callable[[], T]:
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._factories[name] = factory
            return factory

        return add

    def names(self) -> tuple[str, ...]:
        return tuple(self._factories)

    def get(self, name: str) -> T:
        if name not in self._factories:
            valid = ", ".join(self._factories)
            raise UsageError(f"unknown --{self.kind} {name!r}; valid: {valid}")
        if name not in self._made:
            self._made[name] = self._factories[name]()
        return self._made[name]

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(self._factories)
