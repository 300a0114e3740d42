"""Run a callback right after a module executes, before anyone else can import names from it.

Patching at import time matters: SGLang modules do `from x import f`, so a function replaced
after its importers ran would be missed. A meta-path finder wraps the real loader's exec_module.

In production (`hicache-diag record`) every patch is guarded (`guard_patches`): an exception
that the plugin's own code raises around SGLang's call reaches `on_failure` instead of SGLang,
and SGLang's call is made (or its result returned) as if the plugin were not there. SGLang's
own exceptions pass through untouched.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType

logger = logging.getLogger(__name__)

_pending: dict[str, list[Callable[[ModuleType], None]]] = {}
_before: dict[str, list[Callable[[], None]]] = {}
_on_failure: list[Callable[[str], None]] = []  # production: the one failure callback


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        for callback in _before.pop(fullname, []):  # before `fullname` executes
            try:
                callback()
            except Exception:  # noqa: BLE001 - a broken plugin must not break the import
                logger.exception("hicache-diag: preparing for %s failed", fullname)
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


def before_import(name: str, callback: Callable[[], None]) -> None:
    """Call `callback()` once, when `name` is first looked for (before any of it executes);
    now, if it is imported already."""
    if name in sys.modules:
        callback()
        return
    _before.setdefault(name, []).append(callback)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def guard_patches(on_failure: Callable[[str], None]) -> None:
    """From now on, every patch is guarded; `on_failure(reason)` hears the plugin's failures."""
    _on_failure[:] = [on_failure]


def patch_attr(owner: object, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace `owner.name` with `make(original)`, once (a second patch is a no-op)."""
    original = getattr(owner, name)
    if getattr(original, "__hicache_diag_wrapped__", False):
        return
    if _on_failure:
        wrapped = _guarded(original, make, f"{getattr(owner, '__name__', owner)}.{name}")
    else:
        wrapped = make(original)
    wrapped.__hicache_diag_wrapped__ = True  # type: ignore[attr-defined]
    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(owner, name, wrapped)


_calls = threading.local()  # per thread: the guarded calls in progress, innermost last


def _stack() -> list[list]:
    stack = getattr(_calls, "stack", None)
    if stack is None:
        stack = _calls.stack = []
    return stack


def _guarded(original: Callable, make: Callable[[Callable], Callable], where: str) -> Callable:
    """`make(original)`, run so that the plugin's exceptions never reach SGLang. Each call
    keeps [SGLang's call made, its result, its exception]: an exception that is SGLang's own
    propagates; one of ours reports to `on_failure` and SGLang's result (or call) stands."""

    @functools.wraps(original)
    def sglang_call(*args, **kwargs):
        call = _stack()[-1]
        call[0] = True
        try:
            call[1] = original(*args, **kwargs)
        except BaseException as exc:
            call[2] = exc
            raise
        return call[1]

    inner = make(sglang_call)

    @functools.wraps(original)
    def guarded(*args, **kwargs):
        stack = _stack()
        call = [False, None, None]
        stack.append(call)
        try:
            return inner(*args, **kwargs)
        except Exception as exc:
            if exc is call[2]:
                raise  # SGLang's own
            for on_failure in _on_failure:
                on_failure(f"{where}: {type(exc).__name__}: {exc}")
            if call[2] is not None:  # ours, raised while SGLang's own was on its way
                raise call[2] from None
        finally:
            stack.pop()
        return call[1] if call[0] else original(*args, **kwargs)

    return guarded
