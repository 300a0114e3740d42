"""Outputs against a reference, worded for the verdict (both engines: the builtin engine's
no-cache recompute, builtin/reference.py; SGLang's weights through transformers,
sglang/reference.py). Each reference token carries its top-2 logit gap, so greedy ties are
tolerated (GAP_TOLERANCE)."""

from __future__ import annotations

from typing import Any

from hicache_diag.diagnosis.outputs import DEFAULT_TIE_TOLERANCE
from hicache_diag.diagnosis.outputs import compare_outputs as mismatches

# The runtime sums in another order than the reference (batched matmuls, KV reused from earlier
# batches, TP partial sums): float32 logits then differ by ~1e-6..1e-5. A greedy choice can flip
# only where the reference's top-2 logits are closer than that. 1e-3 leaves two orders of
# magnitude of margin; past a tolerated flip the rest of that request legitimately differs, so
# comparison of that request stops there.
GAP_TOLERANCE = DEFAULT_TIE_TOLERANCE  # one tie rule: diagnosis/outputs.py


def compare_outputs(outputs: dict[str, list[int]], reference: dict[str, Any]) -> list[str]:
    """Mismatch lines (empty when equal within the tie tolerance): diagnosis/outputs.py's rule,
    worded for the verdict."""
    lines = []
    for m in mismatches(outputs or {}, reference or {}) or []:
        got = (outputs or {}).get(m.rid)
        if got is None:
            lines.append(f"{m.rid}: no output")
        elif m.got is None or m.want is None:
            lines.append(f"{m.rid}: {len(got)} tokens, reference {len(reference[m.rid]['tokens'])}")
        else:
            lines.append(f"{m.rid}: token {m.position} is {m.got}, reference {m.want}")
    return lines
