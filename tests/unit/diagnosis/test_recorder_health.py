"""A blind recorder cannot back `ok`: counted errors, and ranks with no prefill recorded while
the server answered requests."""

from __future__ import annotations

import pandas as pd

from hicache_diag.diagnosis.recorder_health import (
    blind_recorder_reason,
    recorder_errors,
)


def _frames(rows):
    return pd.DataFrame(rows)


def test_errors_are_summed_per_rank():
    frames = _frames(
        [
            {"rank": 0, "step": 0, "recorder_error": "TypeError: x", "recorder_errors": 1},
            {"rank": 0, "step": 9, "recorder_error": "TypeError: x", "recorder_errors": 40},
            {"rank": 1, "step": 3, "extend_num_tokens": 5},
        ]
    )
    assert recorder_errors(frames) == {"0": 41}


def test_a_rank_with_no_prefill_while_requests_were_answered_is_blind():
    frames = _frames(
        [
            {"rank": 0, "step": 1, "extend_num_tokens": 12},
            {
                "rank": 1,
                "step": 0,
                "recorder_error": "RuntimeError: Boolean value of Tensor with no "
                "values is ambiguous",
                "recorder_errors": 1,
            },
        ]
    )
    reason = blind_recorder_reason(frames, [0, 1], {"r0": [1, 2]})
    assert reason is not None and "rank 1" in reason and "rank 0" not in reason
    assert "Boolean value of Tensor" in reason


def test_no_answered_request_or_every_rank_seen_is_not_blind():
    frames = _frames(
        [
            {"rank": 0, "step": 1, "extend_num_tokens": 12},
            {"rank": 1, "step": 1, "extend_num_tokens": 12},
        ]
    )
    assert blind_recorder_reason(frames, [0, 1], {"r0": [1]}) is None
    assert blind_recorder_reason(_frames([{"rank": 0, "step": 0}]), [0, 1], {}) is None
