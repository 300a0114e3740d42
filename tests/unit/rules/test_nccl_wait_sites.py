"""Under NCCL a rank blocks later than the collective: a collective only enqueues a kernel, and
the rank waits at its next CUDA host sync (Event/Stream.synchronize, torch.cuda.synchronize,
`.item()` / `.tolist()` / `.cpu()`). The wait-site table names those waits `cuda-sync`, and the
culprit rule reads them as waits for the collectives a step launched (rules/culprit.py), not as
a rank outside any wait on a peer (the gloo shape). Stacks: tests/unit/rules/nccl_stacks.py."""

from __future__ import annotations

import re

import pytest

from hicache_diag.evidence.ranks import RankId
from hicache_diag.evidence.stacks import Frame, ThreadStack, parse_pyspy_text
from hicache_diag.rules.culprit import Reason
from hicache_diag.rules.wait_sites import WaitKind, classify_thread, normalize
from hicache_diag.triage.hang import RankSamples, analyse_rank, classify_stacks

from . import nccl_stacks as S

_GDB_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(.*)$")


def gdb_thread(text: str) -> ThreadStack:
    """gdb's `bt` lines (a frame may run on over continuation lines) as one thread."""
    frames: list[str] = []
    for line in text.splitlines():
        m = _GDB_FRAME.match(line)
        if m:
            frames.append(m.group(1))
        elif frames:
            frames[-1] += " " + line.strip()
    out = []
    for body in frames:
        name, _, lib = body.rpartition(" from ") if " from " in body else (body, "", "")
        name = name.removesuffix(" ()").strip()
        out.append(Frame(name, lib.strip() or "?", 0))
    return ThreadStack("MainThread", None, tuple(out))


def main(text: str) -> ThreadStack:
    (dump,) = parse_pyspy_text(text.splitlines(), "test")
    return dump.main_thread()


# -- the public stacks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, site, frame",
    [
        (S.RETURNN_1811_GDB, "cuda-synchronize", "cudaStreamSynchronize"),
        (S.PYTORCH_95944_GDB, "scalar-read", "at::native::_local_scalar_dense_cuda"),
        (S.NCCL_719_GDB, "scalar-read", "at::_ops::_local_scalar_dense::call"),
    ],
    ids=["returnn-1811", "pytorch-95944", "nccl-719"],
)
def test_native_frames_of_public_cuda_hangs_name_a_cuda_sync(text, site, frame):
    found = classify_thread(gdb_thread(text))
    assert (found.site, found.kind) == (site, WaitKind.CUDA_SYNC)
    assert found.frame.name.startswith(frame)


def test_without_native_frames_a_cuda_wait_looks_like_the_python_that_called_it():
    """The honest limit: `.item()`, `.tolist()` and the CUDA runtime are no Python frames, so a
    plain py-spy dump shows the caller, active (the host spins). Native frames (triage's
    --native pass, SGLang's own watchdog dumps, which try `py-spy dump --native` first) show
    the wait; the first public case above is this same hang."""
    found = classify_thread(main(S.RETURNN_1811_PYSPY))
    assert (found.site, found.kind) == ("running", WaitKind.COMPUTE)
    assert found.frame.name == "ctc_loss"


def test_aten_dispatcher_frames_name_their_op():
    assert normalize("at::_ops::_local_scalar_dense::call(at::Tensor const&)") == (
        "local_scalar_dense"
    )
    assert normalize("at::_ops::item::redispatch") == "item"
    assert normalize("c10d::ProcessGroupGloo::RecvWork::wait") == "wait"


# -- SGLang 0.5.23's code paths ---------------------------------------------------------------


@pytest.mark.parametrize(
    "frames, site, kind",
    [
        (S.DECODE_COPY_SYNC, "result-copy-sync", WaitKind.CUDA_SYNC),
        (S.PREFILL_COPY_SYNC, "result-copy-sync", WaitKind.CUDA_SYNC),
        (S.PP_D2H_SYNC, "result-copy-sync", WaitKind.CUDA_SYNC),
        (S.DEVICE_SYNC, "cuda-synchronize", WaitKind.CUDA_SYNC),
        (S.HICACHE_WRITE_MIN, "hicache-tp-allreduce", WaitKind.HICACHE_COMM),
        (S.PP_PROXY_RECV, "pp-proxy-recv", WaitKind.P2P),
    ],
    ids=["decode-copy", "prefill-copy", "pp-d2h", "device-sync", "hicache-min", "pp-recv"],
)
def test_sglang_waits_are_named(frames, site, kind):
    found = classify_thread(main(S.tp_dump(0, frames)))
    assert (found.site, found.kind) == (site, kind)


def test_a_synchronize_off_cuda_and_a_hicache_ack_keep_their_gloo_era_names():
    cpu = ThreadStack("MainThread", False, (Frame("synchronize", "torch/cpu/__init__.py", 1),))
    assert classify_thread(cpu).kind is WaitKind.DEVICE
    ack = main(
        S.tp_dump(0, S.DECODE_COPY_SYNC.replace("process_batch_result_decode (", "writing_check ("))
    )
    assert classify_thread(ack).site == "ack-event-synchronize"


def test_every_sglang_frame_is_where_0_5_23_has_that_function():
    from .test_names_in_sglang import _innermost, _spans

    seen = 0
    for frames in S.SGLANG_FRAMES:
        for frame in main(S.tp_dump(0, frames)).frames:
            rel = frame.filename.partition("/sglang/")[2]
            if not rel:
                continue
            seen += 1
            assert _innermost(_spans(rel), frame.line) == frame.name, (frame, rel)
    assert seen >= 25


# -- the culprit ------------------------------------------------------------------------------


def _judge(stacks: dict[RankId, str | tuple[str, ...]], samples: int = 2, hint: bool = False):
    """Each rank's dump `samples` times (or its own dumps, one per sample). A rank at a CUDA sync
    spins (a core busy); a gloo wait sleeps (no CPU)."""
    reports = []
    for rank, texts in stacks.items():
        texts = (texts,) * samples if isinstance(texts, str) else texts
        dumps = [d for t in texts for d in parse_pyspy_text(t.splitlines(), "t")]
        for d in dumps:
            d.rank = rank
        cpu = 1.0 if "/torch/cuda/" in texts[-1] else 0.0
        rs = RankSamples(rank, dumps[0].pid, dumps[0].title, dumps, cpu_fraction=cpu)
        reports.append(analyse_rank(rs, pp_size=max(r.pp for r in stacks) + 1, tp_size=4))
    return classify_stacks(reports, hint), reports


def _tp(*frames: str) -> dict[RankId, str]:
    return {RankId(0, tp): S.tp_dump(tp, f) for tp, f in enumerate(frames)}


def test_every_tp_rank_at_the_copy_sync_is_a_hang_not_a_busy_server():
    """SGLang #26454's shape (all TP ranks in copy_done.synchronize): the host spins (CPU busy)
    on a stream that does not move. Gloo-shaped rules read the CPU as progress (busy)."""
    found, reports = _judge(_tp(*[S.DECODE_COPY_SYNC] * 4))
    assert [r.state for r in reports] == ["blocked"] * 4
    assert (found.kind, found.cause, found.culprits) == ("hang", None, [])
    text = " ".join(found.evidence)
    assert "every rank waits on its CUDA stream (result-copy-sync)" in text
    assert "Flight Recorder" in text


def test_one_snapshot_at_the_copy_sync_is_a_step_in_flight():
    found, _ = _judge(_tp(*[S.DECODE_COPY_SYNC] * 4), samples=1)
    assert found.kind == "busy" and not found.culprits


def test_a_rank_syncing_a_prefill_while_its_peers_sync_a_decode_is_the_odd_one():
    found, _ = _judge(_tp(S.DECODE_COPY_SYNC, S.DECODE_COPY_SYNC, S.PREFILL_COPY_SYNC))
    assert (found.kind, found.cause, found.reason) == ("hang", "protocol-deadlock", Reason.MISMATCH)
    assert [r.rank.label for r in found.culprits] == ["PP0 TP2"]


def test_the_tp_rank_missing_from_the_collective_is_named_not_the_ranks_waiting_for_it():
    """#22607's shape under NCCL: TP0 in the HiCache write-ack MIN (gloo), TP1-3 launched their
    forward and wait at the copy sync for its NCCL all-reduce, which needs TP0. Gloo-shaped
    rules called it busy (the syncing hosts spin) or, without the spin, named TP1-3 (outside
    any wait on a peer) as stragglers holding TP0 up."""
    found, _ = _judge(_tp(S.HICACHE_WRITE_MIN, *[S.DECODE_COPY_SYNC] * 3))
    assert (found.kind, found.cause) == ("hang", "protocol-deadlock")
    assert found.reason is Reason.NCCL_ABSENT
    assert [r.rank.label for r in found.culprits] == ["PP0 TP0"]
    assert "PP0 TP0 at hicache-tp-allreduce" in found.evidence[1]


def test_a_stage_on_its_cuda_stream_holds_up_the_next_stage_waiting_in_gloo():
    """Across PP stages the syncing stage is the one waited for (its outputs never left)."""
    stacks = {
        RankId(0, 0): S.pp_dump(0, S.PP_D2H_SYNC),
        RankId(1, 0): S.pp_dump(1, S.PP_PROXY_RECV, "idle"),
    }
    found, _ = _judge(stacks)
    assert (found.kind, found.cause, found.reason) == ("hang", "straggler", Reason.OUTSIDE)
    assert [r.rank.label for r in found.culprits] == ["PP0 TP0"]


def test_a_tp_peer_that_moves_between_samples_makes_a_busy_server():
    """A rank that progressed while its peer syncs: a GPU server at work, no hang."""
    stacks = _tp(S.DECODE_COPY_SYNC, S.DECODE_COPY_SYNC)
    stacks[RankId(0, 1)] = (S.tp_dump(1, S.HICACHE_WRITE_MIN), S.tp_dump(1, S.DECODE_COPY_SYNC))
    found, _ = _judge(stacks)
    assert found.kind == "busy" and not found.culprits
