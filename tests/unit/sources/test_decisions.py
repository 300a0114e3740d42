"""Decision rules: how a use finds the scheduling decision it belongs to, across calls,
attributes and queues."""

from __future__ import annotations

from tests.unit.sources.tree import only, scan


def test_a_clock_passed_to_a_reaper_is_a_session_release_decided_in_the_callee(tmp_path):
    inv = scan(
        tmp_path,
        {
            "managers/scheduler.py": """
import time

class Scheduler:
    def process_input_requests(self, reqs):
        now = time.monotonic()
        self.session_controller.maybe_reap(now)
""",
            "session/session_controller.py": """
class SessionController:
    def maybe_reap(self, now, interval=1.0):
        if now - self._last_reap_time > interval:
            self._last_reap_time = now
            self._close_all()
""",
        },
    )
    s = only(inv, function="Scheduler.process_input_requests")
    assert s.decisions == ("session-release",)
    use = s.nearest[0]
    assert use.file == "session/session_controller.py"
    assert use.function == "SessionController.maybe_reap"
    assert s.alignment.mechanism == "none"


def test_a_deadline_stored_on_self_is_followed_to_the_method_that_checks_it(tmp_path):
    inv = scan(
        tmp_path,
        {
            "managers/scheduler_components/flush_wrapper.py": """
import time

class SchedulerFlushWrapper:
    def handle(self, req):
        self._pending = (req, time.monotonic() + req.timeout_s)

    def check_pending(self):
        req, deadline = self._pending
        if time.monotonic() >= deadline:
            self._pending = None
            self._reply(req)
"""
        },
    )
    handle = only(inv, function="SchedulerFlushWrapper.handle")
    check = only(inv, function="SchedulerFlushWrapper.check_pending")
    assert handle.decisions == check.decisions == ("flush",)
    assert handle.nearest[0].function == "SchedulerFlushWrapper.check_pending"
    assert handle.nearest[0].how == "branch"


def test_self_attributes_do_not_join_unrelated_classes(tmp_path):
    inv = scan(
        tmp_path,
        {
            "mem_cache/a.py": """
import time

class Stamper:
    def stamp(self):
        self._pending = time.monotonic()

class Other:
    def evict(self):
        if self._pending:
            self.drop()
"""
        },
    )
    assert inv.sources == ()


def test_an_unlisted_function_takes_its_callers_decision(tmp_path):
    inv = scan(
        tmp_path,
        {
            "mem_cache/cache.py": """
class Cache:
    def _room(self):
        if self.pool_host.available_size() < self.need:
            return False
        return True

    def load_back(self, node):
        if not self._room():
            return None
"""
        },
    )
    s = only(inv, kind="pool-size")
    decided = {u.decided_in for u in s.uses}
    assert s.decisions == ("load-back",) and "Cache.load_back" in decided


def test_a_value_put_on_a_queue_by_a_thread_is_followed_to_its_consumer(tmp_path):
    inv = scan(
        tmp_path,
        {
            "managers/cache_controller.py": """
class Controller:
    def prefetch_thread_func(self):
        op = self.prefetch_queue.get()
        op.hit = self.storage_backend.batch_exists(op.keys)
        self.prefetch_hit_queue.put(op)

    def check_prefetch_progress(self):
        op = self.prefetch_hit_queue.get()
        if op.hit < self.threshold:
            self.revoke(op)
"""
        },
    )
    s = only(inv, kind="storage-exists")
    assert s.classic == "l3-hit"
    assert s.decisions == ("prefetch-termination",)
    assert s.nearest[0].function == "Controller.check_prefetch_progress"


def test_a_branch_that_only_logs_decides_nothing(tmp_path):
    inv = scan(
        tmp_path,
        {
            "managers/scheduler.py": """
class Scheduler:
    def get_next_batch_to_run(self):
        if len(self.waiting_queue) > 100:
            logger.info("long queue")
            self.metrics.observe_queue(len(self.waiting_queue))
"""
        },
    )
    assert inv.sources == ()


def test_an_alloc_result_checked_for_none_is_a_write_back_decision(tmp_path):
    inv = scan(
        tmp_path,
        {
            "mem_cache/cache.py": """
class Cache:
    def write_backup(self, node):
        host = self.cache_controller.mem_pool_host.alloc(len(node.value))
        if host is None:
            return 0
        node.host_value = host
"""
        },
    )
    s = only(inv, kind="alloc-result")
    assert (s.classic, s.decisions) == ("host-alloc", ("write-back",))
    assert s.alignment.mechanism == "none"


def test_scheduler_mixins_share_self_but_scheduler_components_do_not(tmp_path):
    inv = scan(
        tmp_path,
        {
            "managers/scheduler.py": """
import time

class SchedulerPPMixin:
    def stamp(self):
        self._last_step = time.monotonic()

class Scheduler(SchedulerPPMixin):
    def get_next_batch_to_run(self):
        if self._last_step > self._deadline:
            return None

class SchedulerFlushWrapper:
    def handle(self, req):
        self._pending = (req, time.monotonic())

class SchedulerMetricsMixin:
    def flush_cache(self):
        if self._pending:
            self.reset()
"""
        },
    )
    mixin = only(inv, function="SchedulerPPMixin.stamp")
    assert mixin.decisions == ("batch-admission",)
    assert [s.function for s in inv.sources] == ["SchedulerPPMixin.stamp"]


def test_only_the_stored_tuple_element_that_holds_the_value_carries_it(tmp_path):
    code = """
import time

class SchedulerFlushWrapper:
    def handle(self, req):
        self._pending = (req, time.monotonic() + req.timeout_s)

    def check_pending(self):
        req, deadline = self._pending
        if req.rid in self.seen:
            self.drop(req)
        if time.monotonic() >= deadline:
            self._reply(req)
"""
    inv = scan(tmp_path, {"managers/scheduler_components/flush_wrapper.py": code})
    deadline_test = 1 + code.splitlines().index("        if time.monotonic() >= deadline:")
    handle = only(inv, function="SchedulerFlushWrapper.handle")
    assert [u.line for u in handle.uses] == [deadline_test]  # not the `req` test above it
