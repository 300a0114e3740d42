"""Detection rules: which expressions count as reads of a per-rank physical quantity."""

from __future__ import annotations

import ast

import pytest

from hicache_diag.sources.reads import kind_of_call


def _kind(expr: str) -> str | None:
    return kind_of_call(ast.parse(expr, mode="eval").body)


@pytest.mark.parametrize(
    ("expr", "kind"),
    [
        ("time.monotonic()", "clock"),
        ("time.perf_counter()", "clock"),
        ("time.time()", "clock"),
        ("monotonic()", "clock"),
        ("ack.finish_event.query()", "event-ready"),
        ("fut.done()", "event-ready"),
        ("self.stop_event.is_set()", "event-ready"),
        ("self.q.qsize()", "queue-size"),
        ("len(self.waiting_queue)", "logical-state"),  # a list the scheduler fills itself
        ("random.shuffle(waiting_queue)", "random"),
        ("random.random()", "random"),
        ("np.random.randint(0, 10)", "random"),
        ("self.pool_host.available_size()", "pool-size"),
        ("self.pool_host.alloc(8)", "alloc-result"),
        ("self.storage_backend.batch_exists(keys)", "storage-exists"),
        ("self.storage_backend.exists(key)", "storage-exists"),
        ("self.storage_backend.get(key)", "storage-read"),
        ("self.page_get_func(op, keys)", "storage-read"),
        ("self.ack_queue.get_nowait()", "thread-value"),
        ("self.ack_queue.get(block=False)", "thread-value"),
    ],
)
def test_reads_of_per_rank_quantities(expr, kind):
    assert _kind(expr) == kind


@pytest.mark.parametrize(
    "expr",
    [
        "time()",  # a bare time() could be anything
        "self.cache.get(key)",  # a dict, not a storage backend
        "self._storage_wait.get(key)",  # mentions storage but is not a backend
        "envs.SGLANG_X_BACKEND.get()",  # an environment variable
        "event.query(timeout)",  # readiness takes no arguments
        "len(self.requests)",  # not a queue
        "self.exists(path)",  # not on a backend
        "os.path.exists(path)",  # outside a backend's existence check (find_reads decides)
        "self.rng_seed.random_state()",  # not the random module
    ],
)
def test_lookalikes_are_not_reads(expr):
    assert _kind(expr) is None
