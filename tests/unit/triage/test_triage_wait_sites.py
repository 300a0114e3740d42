"""The signature table names wait sites for SGLang's chains (Hi and Unified trees) and ours."""

from __future__ import annotations

import pytest

from hicache_diag.evidence.stacks import Frame, ThreadStack
from hicache_diag.rules.wait_sites import WaitKind, classify_thread

C10D = "torch/distributed/distributed_c10d.py"


def stack(*names: str, active: bool = False) -> ThreadStack:
    """Innermost first; `name@file` sets a file name."""
    frames = []
    for n in names:
        name, _, path = n.partition("@")
        frames.append(Frame(name, path or "x.py", 1))
    return ThreadStack("MainThread", active, tuple(frames))


PREFILL = ("_get_new_batch_prefill_raw", "get_next_batch_to_run", "event_loop_pp")

CASES = [
    # SGLang UnifiedRadixCache: PPn receives PP0's relayed counts
    (
        (
            "recv@" + C10D,
            "wrapper",
            "_pp_sync",
            "_all_reduce",
            "_sync_hicache_ready_counts",
            "check_hicache_events",
            *PREFILL,
        ),
        "hicache-pp-sync-recv",
        WaitKind.HICACHE_COMM,
    ),
    # SGLang 0.5.23 PP0 relaying its counts (captured on CPU): isend inside _pp_sync
    (
        (
            "isend@" + C10D,
            "_pp_sync",
            "_all_reduce",
            "_sync_hicache_ready_counts",
            "check_hicache_events",
            "_process_hicache_events",
            "get_next_batch_to_run",
        ),
        "hicache-pp-sync-send",
        WaitKind.HICACHE_COMM,
    ),
    # PP0 backpressure: last round's isend not consumed yet
    (
        ("wait", "_drain_async_work", "check_hicache_events", *PREFILL),
        "hicache-pp-sync-drain",
        WaitKind.HICACHE_COMM,
    ),
    # HiRadixCache TP deadlock (#27489)
    (
        (
            "all_reduce@" + C10D,
            "wrapper",
            "_all_reduce_attn_groups",
            "writing_check",
            "check_hicache_events",
            *PREFILL,
        ),
        "hicache-tp-allreduce",
        WaitKind.HICACHE_COMM,
    ),
    # prefetch termination vote (#22607 comment)
    (
        ("all_reduce@" + C10D, "can_terminate_prefetch", "check_prefetch_progress", *PREFILL),
        "hicache-tp-allreduce",
        WaitKind.HICACHE_COMM,
    ),
    # Unified PPn waiting on its own storage thread
    (
        (
            "wait@threading.py",
            "get@queue.py",
            "_drain_queue",
            "_drain_storage_control_queues_impl",
            "check_hicache_events",
            *PREFILL,
        ),
        "storage-queue-get",
        WaitKind.HICACHE_LOCAL,
    ),
    # DMA completion on this rank
    (
        ("synchronize", "writing_check", "check_hicache_events"),
        "ack-event-synchronize",
        WaitKind.HICACHE_LOCAL,
    ),
    # our runtime's names
    (
        ("recv@" + C10D, "pp_sync", "all_reduce_pp_chain", "check_hicache_events"),
        "hicache-pp-sync-recv",
        WaitKind.HICACHE_COMM,
    ),
    (
        ("all_reduce@" + C10D, "all_reduce_tp", "writing_check"),
        "hicache-tp-allreduce",
        WaitKind.HICACHE_COMM,
    ),
    (
        ("wait", "drain_async_work", "check_hicache_events"),
        "hicache-pp-sync-drain",
        WaitKind.HICACHE_COMM,
    ),
    # PP transport
    (
        (
            "recv@" + C10D,
            "recv_object",
            "recv_tensor_dict",
            "_pp_recv_typed_dict",
            "_pp_recv_proxy_tensors",
            "event_loop_pp",
        ),
        "pp-proxy-recv",
        WaitKind.P2P,
    ),
    (
        (
            "recv@" + C10D,
            "recv_object",
            "recv_tensor_dict",
            "_pp_recv_typed_dict",
            "_pp_recv_dict_from_prev_stage",
            "_pp_send_recv_and_preprocess_output_tensors",
        ),
        "pp-output-recv",
        WaitKind.P2P,
    ),
    (("send@" + C10D, "send_object", "send_tensor_dict"), "pp-send", WaitKind.P2P),
    # requests
    (
        ("broadcast@" + C10D, "broadcast_pyobj", "_broadcast_reqs_across_ranks", "recv_requests"),
        "request-broadcast",
        WaitKind.REQUEST,
    ),
    (
        ("recv@" + C10D, "point_to_point_pyobj", "_pull_raw_reqs", "recv_requests"),
        "request-recv",
        WaitKind.REQUEST,
    ),
    # a collective inside the forward is named by the collective, not the forward
    (
        ("all_reduce@" + C10D, "tensor_model_parallel_all_reduce", "forward", "run_batch"),
        "nccl-collective",
        WaitKind.COLLECTIVE,
    ),
    (
        ("ncclKernel_AllReduce@libnccl.so", "forward", "run_batch"),
        "nccl-collective",
        WaitKind.COLLECTIVE,
    ),
    (("forward_extend", "run_batch", "event_loop_pp"), "forward", WaitKind.COMPUTE),
    (("on_idle", "event_loop_pp"), "idle-loop", WaitKind.IDLE),
    (("get@queue.py", "prefetch_thread_func", "run"), "storage-thread-idle", WaitKind.IDLE),
    (("all_reduce@" + C10D, "prefetch_thread_func"), "l3-hit-allreduce", WaitKind.HICACHE_COMM),
    (
        ("all_reduce@" + C10D, "_reduce_prefetch_ack", "prefetch_sync_thread_func"),
        "l3-progress-allreduce",
        WaitKind.HICACHE_COMM,
    ),
]


@pytest.mark.parametrize(("names", "site", "kind"), CASES, ids=[c[1] for c in CASES])
def test_signature_table(names, site, kind):
    found = classify_thread(stack(*names))
    assert (found.site, found.kind) == (site, kind)


def test_class_qualified_and_native_names_normalise():
    qualified = stack("ProcessGroupGloo::RecvWork::wait", "UnifiedRadixCache._pp_sync")
    assert classify_thread(qualified).site == "hicache-pp-sync-recv"


def test_unknown_stacks_fall_back_on_activity():
    assert classify_thread(stack("mystery", active=True)).site == "running"
    assert classify_thread(stack("mystery")).kind is WaitKind.OTHER
    assert classify_thread(None).site == "unknown"


def test_native_names_with_argument_lists():
    native = "c10d::ProcessGroupGloo::RecvWork::wait(std::chrono::duration<long, std::ratio<1l> >)"
    thread = stack(native, "recv@" + C10D, "_pp_sync")
    assert classify_thread(thread).site == "hicache-pp-sync-recv"
