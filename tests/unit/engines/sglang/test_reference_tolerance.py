"""SGLang runs get their own tie tolerance (its options' `tie_tolerance`, by the manifest's
engine through the registry): the 0.5.19 flips at reference gaps of 0.00115 and 0.0019 are ties
there, a flip at a clear gap is still a wrong output, and our runtime keeps 1e-3."""

from __future__ import annotations

from hicache_diag.diagnosis.outputs import compare_outputs
from hicache_diag.engines.registry import tie_tolerance
from hicache_diag.engines.sglang.options import SglangOptions

SGLANG, BUILTIN = tie_tolerance("sglang"), tie_tolerance(None)  # a builtin manifest names none

# r0038 of a 0.5.19 PP2 run (SGLANG_REQ_WAITING_TIMEOUT, no L3): token 5 flipped at gap 0.00115.
REF = {
    "r0038": {
        "tokens": [449, 390, 366, 136, 469, 390, 366, 390],
        "top2_gap": [0.0849, 0.1378, 0.0066, 0.0236, 0.0831, 0.00115, 0.2265, 0.0106],
    }
}
GOT = {"r0038": [449, 390, 366, 136, 469, 367, 367, 367]}


def test_a_flip_at_a_near_tie_is_a_tie_for_sglang_and_wrong_for_our_runtime() -> None:
    assert SglangOptions.tie_tolerance > 0.0019
    assert compare_outputs(GOT, REF, SGLANG) == []
    assert [(m.rid, m.position) for m in compare_outputs(GOT, REF, BUILTIN)] == [("r0038", 5)]
    assert compare_outputs(GOT, REF) == compare_outputs(GOT, REF, tie_tolerance("builtin"))


def test_a_flip_at_a_clear_gap_is_still_wrong_for_sglang() -> None:
    got = {"r0038": [449, 390, 366, 136, 1, 390, 366, 390]}  # token 4: gap 0.0831
    assert [(m.rid, m.position) for m in compare_outputs(got, REF, SGLANG)] == [("r0038", 4)]
