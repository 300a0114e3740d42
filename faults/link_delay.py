"""Latency on one rank's outgoing PP link: the `p2p_send` hook point's effect; ours.

A slow link delivers late; it does not stall the sender of an async send. So every
`torch.distributed.isend` / `send` that this rank makes inside a named PP message (`with
message("sync")`: HiCache's `_pp_sync` relay; "reqs", "proxy", "output") asks the `p2p_send`
point for a latency, and a delayed send is posted to one delivery thread that issues the real
send `delay` after it was posted, in posting order (FIFO, so two messages with one tag never
overtake each other; once anything is queued, later sends queue behind it with no extra delay).
`isend` returns at once with a handle whose `wait()` waits for the real send; a blocking `send`
waits for its delivery. Both engines install it in the rank process (docs/faults.md,
`p2p-delay`).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType

    from hicache_diag.faults.hooks import Hooks

_ctx = threading.local()


@contextlib.contextmanager
def message(msg: str) -> Iterator[None]:
    """Name the PP message the sends inside belong to (the `msg` of the `p2p_send` point)."""
    outer = getattr(_ctx, "msg", None)
    _ctx.msg = msg
    try:
        yield
    finally:
        _ctx.msg = outer


class DelayedWork:
    """The handle of a send still on the link: `wait()` waits for the real send's own wait."""

    def __init__(self) -> None:
        self._posted = threading.Event()
        self._work: Any = None
        self.error: BaseException | None = None

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        self._posted.wait()
        if self.error is not None:
            raise self.error
        if self._work is not None:
            self._work.wait(*args, **kwargs)
        return True

    def is_completed(self) -> bool:
        if not self._posted.is_set():
            return False
        return self._work is None or bool(self._work.is_completed())


class Link:
    """One rank's outgoing link: a FIFO of sends, each issued at its `ready_at`."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def busy(self) -> bool:
        return self._pending > 0

    def post(self, send: Callable[[], Any], delay: float) -> DelayedWork:
        work = DelayedWork()
        with self._lock:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="hicache-link", daemon=True)
                self._thread.start()
        self._queue.put((time.monotonic() + max(0.0, delay), send, work))
        return work

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, then end the delivery thread (a process that outlives its
        link, as a test process does, must not keep the thread)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            ready_at, send, work = item
            wait = ready_at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                work._work = send()
            except BaseException as exc:  # noqa: BLE001 - surfaced at the handle's wait()
                work.error = exc
            finally:
                with self._lock:
                    self._pending -= 1
                work._posted.set()


def install(hooks: Hooks, dist: ModuleType) -> Link:
    """Wrap `dist.isend` / `dist.send` of this process (torch.distributed) for `hooks`."""
    link = Link()
    real_isend, real_send = dist.isend, dist.send

    def _delay() -> float:
        msg = getattr(_ctx, "msg", None)
        if msg is None or threading.current_thread().name == "hicache-link":
            return 0.0
        return float(hooks.apply("p2p_send", 0.0, msg=msg))

    def isend(tensor, *args, **kwargs):
        delay = _delay()
        if delay <= 0 and not link.busy():
            return real_isend(tensor, *args, **kwargs)
        return link.post(lambda: real_isend(tensor, *args, **kwargs), delay)

    def send(tensor, *args, **kwargs):
        delay = _delay()
        if delay <= 0 and not link.busy():
            return real_send(tensor, *args, **kwargs)
        link.post(lambda: real_send(tensor, *args, **kwargs), delay).wait()
        return None

    dist.isend, dist.send = isend, send
    return link
