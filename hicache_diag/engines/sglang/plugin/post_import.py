"""Run a callback right after a module executes, before anyone else can import names from it.

Patching at import time matters: SGLang modules do `from x import f`, so a function replaced
after its importers ran would be missed. A meta-path finder wraps the real loader's exec_module.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable
from types import ModuleType

logger = logging.getLogger(__name__)

_pending: dict[str, list[Callable[[ModuleType], None]]] = {}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, fullname: str) -> None:
        self._inner, self._fullname = inner, fullname

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        for callback in _pending.pop(self._fullname, []):
            _run(callback, module)


def _run(callback: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        callback(module)
    except Exception:  # a broken patch must be loud but must not kill SGLang's import
        logger.exception("hicache-diag: patching %s failed", module.__name__)


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call `callback(module)` once `name` has executed (now, if it already has)."""
    if name in sys.modules:
        _run(callback, sys.modules[name])
        return
    _pending.setdefault(name, []).append(callback)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def patch_attr(owner: object, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace `owner.name` with `make(original)`, once (a second patch is a no-op)."""
    original = getattr(owner, name)
    if getattr(original, "__hicache_diag_wrapped__", False):
        return
    wrapped = make(original)
    wrapped.__hicache_diag_wrapped__ = True  # type: ignore[attr-defined]
    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(owner, name, wrapped)
