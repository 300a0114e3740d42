"""Crash form A/B detection, shape decoding, and root vs cascade ordering."""

from __future__ import annotations

from hicache_diag.evidence.ranks import RankId
from hicache_diag.logs.crash import crash_form, decode_shape, find_crash
from hicache_diag.logs.parse import LogException
from hicache_diag.rules.signatures import Context

GLOO = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [x]:1"


def exc(ts, exc_type, msg, pp=0, frames=()):
    return LogException(RankId(pp=pp), ts, "l", 1, exc_type, msg, list(frames))


PP_HICACHE = Context(pp=True, hicache=True)


def test_forms():
    a = exc("t", "RuntimeError", "shape '[65, -1, 64]' is invalid for input of size 827392")
    assert crash_form(a, PP_HICACHE) == "A"
    assert crash_form(exc("t", "IndexError", "pop from empty list"), PP_HICACHE) == "B"
    assert crash_form(exc("t", "KeyError", "17", frames=["writing_check"])) == "B"
    assert crash_form(exc("t", "KeyError", "17", frames=["tokenize"])) is None
    assert crash_form(exc("t", "ValueError", "bad")) is None


def test_decode_shape_with_and_without_heads():
    text = "shape '[3013, -1, 128]' is invalid for input of size 8192000"
    assert "1000 upstream tokens x 64 heads (local - upstream = 2013)" in decode_shape(text, 64)
    assert "M/D=64000" in decode_shape(text, None)
    assert decode_shape("other", 64) is None


def test_root_is_first_non_cascade_even_if_cascade_logged_first():
    cascade = exc("2026-01-01 00:00:01", "RuntimeError", GLOO, pp=0)
    root = exc("2026-01-01 00:00:02", "IndexError", "pop from empty list", pp=1)
    finding = find_crash([cascade, root], None, PP_HICACHE)
    assert finding.root is root and finding.form == "B"
    assert finding.secondary == [cascade]
    assert any("secondary (cascade)" in e for e in finding.evidence)


def test_only_cascades_and_timeouts():
    only = find_crash([exc("t", "RuntimeError", GLOO)], None)
    assert only.form is None and "root crash is elsewhere" in only.evidence[0]
    timeout = exc("t", "RuntimeError", "Timed out waiting 1800000ms for recv operation")
    assert find_crash([timeout], None) is None


def test_more_shape_and_bookkeeping_texts():
    a = exc(
        "t", "RuntimeError", "The size of tensor a (3013) must match the size of tensor b (1000)"
    )
    assert crash_form(a, PP_HICACHE) == "A"
    assert crash_form(exc("t", "IndexError", "pop from an empty deque"), PP_HICACHE) == "B"


def test_forms_need_their_context():
    """PyTorch's view() text and Python's empty pop are generic: without a PP pipeline or
    HiCache's ack bookkeeping they are crashes of another form (exit 16)."""
    a = exc("t", "RuntimeError", "shape '[65, -1, 64]' is invalid for input of size 827392")
    assert crash_form(a) is None
    assert crash_form(a, Context(pp=True)) == "A"
    in_pp = exc("t", "RuntimeError", a.message, frames=["event_loop_pp", "forward"])
    assert crash_form(in_pp) == "A"
    assert crash_form(exc("t", "IndexError", "pop from empty list")) is None
    assert crash_form(exc("t", "IndexError", "pop from empty list"), Context(hicache=True)) == "B"
    elsewhere = exc("t", "IndexError", "pop from empty list", frames=["collate", "pop"])
    assert crash_form(elsewhere, PP_HICACHE) is None
    in_ack_check = exc("t", "IndexError", "pop from empty list", frames=["writing_check"])
    assert crash_form(in_ack_check) == "B"


def test_signal_exits_are_never_the_root():
    quit_ = exc("2026-01-01 00:00:01", "KeyboardInterrupt", "")
    root = exc("2026-01-01 00:00:02", "ValueError", "bad", pp=1)
    assert find_crash([quit_, root], None).root is root
    assert find_crash([quit_], None) is None  # interrupted, not crashed
