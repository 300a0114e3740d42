"""Name where a thread waits, from a table of call-chain signatures (the one wait-site table:
triage and the run classifier both read it).

The table covers SGLang 0.5.23's real chains (HiRadixCache and UnifiedRadixCache,
scheduler_pp_mixin, parallel_state, utils/common) and hicache-diag's own runtime names; every
name is either defined in SGLang 0.5.23, or listed in BUILTIN_NAMES (our runtime only),
LIBRARY_NAMES (Python, torch, zmq) or NATIVE_NAMES (C/C++ frames of `py-spy --native`), and
tests/unit/rules/test_names_in_sglang.py checks each against the source. Frame names are matched
without leading underscores, so `_pp_sync` (SGLang) and `pp_sync` (ours) are one signature.
Contextual rules (named functions) win over generic ones (a bare `recv` or `get`), searched from
the innermost frame outwards, so the nearest meaningful caller names the site.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hicache_diag.evidence.stacks import Frame, ThreadStack


class WaitKind(str, enum.Enum):
    HICACHE_LOCAL = "hicache-local"  # scheduler thread waits on its own DMA / storage thread
    HICACHE_COMM = "hicache-comm"  # a HiCache sync point: pp_sync relay or TP/CP MIN
    P2P = "p2p"  # PP stage-to-stage tensors or objects
    REQUEST = "request"  # waiting for the next requests (normal when idle)
    COLLECTIVE = "collective"  # a collective outside HiCache (forward all-reduce, NCCL)
    DEVICE = "device"  # device/stream synchronize on a non-CUDA device, outside HiCache
    # The host waits on a CUDA stream, event or device: Event/Stream.synchronize,
    # torch.cuda.synchronize, the D2H copy of `.item()` / `.tolist()` / `.cpu()`. NCCL collectives
    # only enqueue a kernel, so under NCCL this is where a rank waits for the collectives it
    # launched (rules/culprit.py reads it so); seen on a CUDA frame only.
    CUDA_SYNC = "cuda-sync"
    IDLE = "idle"  # idle loop, polling
    COMPUTE = "compute"  # running the model or other work
    OTHER = "other"


COMM_KINDS = frozenset({WaitKind.HICACHE_COMM, WaitKind.P2P, WaitKind.REQUEST, WaitKind.COLLECTIVE})
HICACHE_KINDS = frozenset({WaitKind.HICACHE_LOCAL, WaitKind.HICACHE_COMM})


@dataclass(frozen=True, slots=True)
class Signature:
    site: str
    kind: WaitKind
    names: frozenset[str]  # this frame's (normalized) function name
    outer: frozenset[str] = frozenset()  # if set, one caller further out must be one of these
    file_hint: str = ""  # if set, the frame's file name must contain it
    caller: frozenset[str] = frozenset()  # if set, the frame's own caller must be one of these

    def matches(self, frames: list[str], files: list[str], i: int) -> bool:
        if frames[i] not in self.names or self.file_hint not in files[i]:
            return False
        if self.caller and (i + 1 >= len(frames) or frames[i + 1] not in self.caller):
            return False
        return not self.outer or any(name in self.outer for name in frames[i + 1 :])


def _s(*names: str) -> frozenset[str]:
    return frozenset(names)


_ACK_CHECKS = _s(
    "writing_check",
    "loading_check",
    "check_hicache_events",
    "is_load_back_event_done",
    "finish_write_back",  # ours
)
_HICACHE_SYNCS = _ACK_CHECKS | _s(
    "can_terminate_prefetch",
    "check_prefetch_progress",
    "drain_storage_control_queues",
    "drain_storage_control_queues_impl",
    "query_storage_hit_length",
)
_OUTPUT_RECV = _s(
    "pp_recv_dict_from_prev_stage",
    "pp_send_recv_and_preprocess_output_tensors",
    "pp_commit_send_output_work_and_preprocess_output_tensors",
    "pp_exchange_outputs",
)
_PROXY_RECV = _s("recv_tensor_dict", "pp_recv_typed_dict", "pp_recv_proxy_tensors")
_REQUESTS = _s(
    "recv_requests",
    "recv_reqs",
    "pull_raw_reqs",
    "pp_recv_pyobj_from_prev_stage",
    "recv_pyobj_from_prev",
)
_STORAGE_THREADS = _s(
    "prefetch_thread_func",
    "prefetch_io_aux_func",
    "prefetch_sync_thread_func",
    "backup_thread_func",
)

# SGLang 0.5.23's scheduler waits for a step's sampled tokens on the CUDA stream that ran the
# step (`result.copy_done.synchronize()` in batch_result_processor.py, `d2h_event.synchronize()`
# in scheduler_pp_mixin.py); that stream holds the step's TP collectives.
_RESULT_SYNCS = _s(
    "process_batch_result_prefill",
    "process_batch_result_decode",
    "process_batch_result_idle",
    "advance_grammar_fsm",
    "event_loop_pp",
    "event_loop_pp_disagg_prefill",
    "event_loop_pp_disagg_decode",
)
# Native frames (`py-spy dump --native`, SGLang's watchdog dumps) of a host blocked on CUDA:
# the runtime and driver calls, and c10's wrappers around them (c10/cuda/CUDAFunctions.h).
_CUDA_HOST_SYNCS = _s(
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaDeviceSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuCtxSynchronize",
    "memcpy_and_sync",
    "stream_synchronize",
    "device_synchronize",
)
_CUDA = "torch/cuda"  # torch/cuda/streams.py (Event, Stream), torch/cuda/__init__.py

K = WaitKind
CONTEXT_RULES: tuple[Signature, ...] = (
    # PP0 relays its counts down the chain (isend); PPn receives them (recv).
    Signature("hicache-pp-sync-send", K.HICACHE_COMM, _s("isend", "send"), _s("pp_sync")),
    Signature("hicache-pp-sync-recv", K.HICACHE_COMM, _s("pp_sync")),
    Signature("hicache-pp-sync-drain", K.HICACHE_COMM, _s("drain_async_work")),
    Signature("hicache-tp-allreduce", K.HICACHE_COMM, _s("all_reduce_attn_groups")),
    Signature("hicache-tp-allreduce", K.HICACHE_COMM, _s("all_reduce_tp")),
    Signature("hicache-pp-allreduce", K.HICACHE_COMM, _s("all_reduce_pp")),
    Signature("l3-thread-allreduce", K.HICACHE_COMM, _s("all_reduce_thread_group")),
    Signature("hicache-tp-allreduce", K.HICACHE_COMM, _s("sync_hicache_ready_counts")),
    Signature("hicache-tp-allreduce", K.HICACHE_COMM, _s("all_reduce"), _HICACHE_SYNCS),
    Signature("hicache-host-alloc-vote", K.HICACHE_COMM, _s("apply_vote")),
    Signature("l3-hit-allreduce", K.HICACHE_COMM, _s("all_reduce"), _s("prefetch_thread_func")),
    Signature("l3-progress-allreduce", K.HICACHE_COMM, _s("reduce_prefetch_ack")),
    Signature("l3-progress-allreduce", K.HICACHE_COMM, _s("all_reduce"), _STORAGE_THREADS),
    Signature("ack-event-synchronize", K.HICACHE_LOCAL, _s("synchronize"), _ACK_CHECKS),
    Signature(
        "result-copy-sync", K.CUDA_SYNC, _s("synchronize"), file_hint=_CUDA, caller=_RESULT_SYNCS
    ),
    Signature("layer-load-wait", K.HICACHE_LOCAL, _s("wait_until")),
    Signature("storage-queue-get", K.HICACHE_LOCAL, _s("drain_queue")),
    Signature("storage-queue-get", K.HICACHE_LOCAL, _s("get"), _HICACHE_SYNCS, "queue"),
    Signature("storage-thread-idle", K.IDLE, _s("get"), _STORAGE_THREADS, "queue"),
    Signature("pp-output-recv", K.P2P, _s("recv_tensor_dict", "recv_object"), _OUTPUT_RECV),
    Signature("pp-output-recv", K.P2P, _s("pp_recv_typed_dict"), _OUTPUT_RECV),
    Signature("pp-output-recv", K.P2P, _s("pp_recv_dict_from_prev_stage")),
    Signature("pp-proxy-recv", K.P2P, _s("recv_tensor_dict", "pp_recv_typed_dict")),
    Signature("pp-proxy-recv", K.P2P, _s("pp_recv_proxy_tensors")),
    Signature("pp-proxy-recv", K.P2P, _s("recv_object"), _PROXY_RECV),
    Signature("pp-send", K.P2P, _s("send_tensor_dict", "send_object")),
    Signature("pp-send", K.P2P, _s("pp_send_dict_to_next_stage")),
    Signature("pp-send", K.P2P, _s("pp_commit_comm_work", "pp_send_pyobj_to_next_stage")),
    Signature("pp-send", K.P2P, _s("commit"), _s("pp_loop_step", "event_loop_pp")),
    Signature("request-broadcast", K.REQUEST, _s("broadcast_pyobj", "attn_cp_tp_broadcast_pyobj")),
    Signature("request-broadcast", K.REQUEST, _s("broadcast_reqs_across_ranks")),
    Signature("request-recv", K.REQUEST, _s("point_to_point_pyobj"), _REQUESTS),
    Signature("pp-pyobj-p2p", K.P2P, _s("point_to_point_pyobj")),
    Signature("idle-loop", K.IDLE, _s("on_idle", "maybe_sleep_on_idle")),
    Signature("request-poll", K.IDLE, _s("recv_pyobj", "recv_multipart", "poll"), _REQUESTS),
)

GENERIC_RULES: tuple[Signature, ...] = (
    Signature("nccl-collective", K.COLLECTIVE, _s("all_reduce", "all_gather", "reduce_scatter")),
    Signature("nccl-collective", K.COLLECTIVE, _s("broadcast", "barrier", "all_to_all_single")),
    Signature("nccl-collective", K.COLLECTIVE, _s("all_gather_into_tensor", "all_to_all")),
    Signature("p2p-recv", K.P2P, _s("recv", "irecv", "waitRecv")),
    Signature("p2p-send", K.P2P, _s("send", "isend", "waitSend")),
    Signature("comm-wait", K.P2P, _s("wait"), frozenset(), "distributed"),
    Signature("cuda-synchronize", K.CUDA_SYNC, _s("synchronize"), frozenset(), _CUDA),
    Signature("cuda-synchronize", K.CUDA_SYNC, _CUDA_HOST_SYNCS),
    # `.item()` that does not return: ATen's copy of one scalar from the device to the host
    # (a CPU tensor's returns at once)
    Signature("scalar-read", K.CUDA_SYNC, _s("local_scalar_dense_cuda", "local_scalar_dense")),
    Signature("device-synchronize", K.DEVICE, _s("synchronize")),
    Signature("queue-get", K.OTHER, _s("get"), frozenset(), "queue"),
    Signature("sleep", K.OTHER, _s("sleep")),
    Signature("lock-wait", K.OTHER, _s("wait", "acquire"), frozenset(), "threading"),
)

# Last: a forward that waits inside a collective must be named by the collective above.
FALLBACK_RULES: tuple[Signature, ...] = (
    Signature("forward", K.COMPUTE, _s("forward_extend", "forward_decode", "run_batch")),
    Signature("forward", K.COMPUTE, _s("forward_batch_generation", "pp_launch_batch", "forward")),
)


def normalize(name: str) -> str:
    """`Class.method` -> `method`, `_pp_sync` -> `pp_sync`; native `a::b::c(args)` -> `c`, and
    an ATen dispatcher frame `at::_ops::<op>::call` -> `<op>`."""
    if not name.startswith("<"):
        name = name.split("(", 1)[0]
    parts = name.split("::")
    if len(parts) >= 3 and parts[-3] == "_ops" and parts[-1] in ("call", "redispatch"):
        return parts[-2].lstrip("_")
    return parts[-1].rsplit(".", 1)[-1].lstrip("_")


@dataclass(frozen=True, slots=True)
class WaitSite:
    site: str
    kind: WaitKind
    frame: Frame | None  # the frame that named it
    path: tuple[str, ...] = ()  # normalized names from that frame outwards (the call path)

    @property
    def in_comm(self) -> bool:
        return self.kind in COMM_KINDS


UNKNOWN_SITE = WaitSite("unknown", WaitKind.OTHER, None)


def _nccl_native(frames: tuple[Frame, ...]) -> Frame | None:
    for frame in frames:
        if "nccl" in frame.name.lower() or "nccl" in frame.filename.lower():
            return frame
    return None


def classify_thread(thread: ThreadStack | None) -> WaitSite:
    """The wait site of one thread (innermost meaningful frame first)."""
    if thread is None or not thread.frames:
        return UNKNOWN_SITE
    names = [normalize(f.name) for f in thread.frames]
    files = [f.filename for f in thread.frames]
    for rules in (CONTEXT_RULES, GENERIC_RULES, FALLBACK_RULES):
        for i in range(len(names)):
            for rule in rules:
                if rule.matches(names, files, i):
                    return WaitSite(rule.site, rule.kind, thread.frames[i], tuple(names[i:]))
        if rules is CONTEXT_RULES and (frame := _nccl_native(thread.frames)):
            return WaitSite("nccl-collective", WaitKind.COLLECTIVE, frame, tuple(names))
    if thread.active:
        return WaitSite("running", WaitKind.COMPUTE, thread.frames[0], tuple(names))
    return WaitSite("local-wait", WaitKind.OTHER, thread.frames[0], tuple(names))


# Functions of a HiCache protocol wait, SGLang's and ours (its sync points): the run
# classifier names a hung rank by the innermost of these on its main thread.
HICACHE_PROTOCOL_FUNCS = _s(
    "check_hicache_events",
    "writing_check",
    "loading_check",
    "pp_sync",
    "drain_async_work",
    "check_prefetch_progress",
)
RECEIVE_FUNCS = _s("recv", "irecv", "recv_bytes", "recv_object", "recv_tensor_dict")

# A main thread in these is a process on its way out (interpreter shutdown, SGLang's SIGQUIT
# handler killing its tree): a post-mortem picture, never a live sample.
EXIT_FUNCS = _s(
    "shutdown",  # threading._shutdown: the interpreter joins its threads on exit
    "kill_process_tree",
    "launch_phase_sigquit_handler",
    "running_phase_sigquit_handler",
)

# Where each name of the tables comes from when SGLang 0.5.23 does not define it (a test scans
# SGLang's source and our runtime's for every other name).
BUILTIN_NAMES = _s(
    "all_reduce_pp",
    "all_reduce_tp",
    "all_reduce_thread_group",
    "apply_vote",
    "pp_exchange_outputs",
    "pp_loop_step",
    "recv_pyobj_from_prev",
    "finish_write_back",
)
LIBRARY_NAMES = _s(  # Python's stdlib, torch.distributed, pyzmq
    "all_to_all",
    "irecv",
    "recv_bytes",
    "recv_multipart",
    "sleep",
    "acquire",
    "shutdown",
)
NATIVE_NAMES = _s(  # C/C++ frames printed by `py-spy dump --native` (gloo, CUDA, ATen, c10)
    "waitRecv",
    "waitSend",
    *_CUDA_HOST_SYNCS,
    "local_scalar_dense_cuda",
    "local_scalar_dense",  # at::_ops::_local_scalar_dense::call (normalize)
)


def table_names() -> frozenset[str]:
    """Every function name the wait-site rules match on."""
    names: set[str] = set()
    for rule in CONTEXT_RULES + GENERIC_RULES + FALLBACK_RULES:
        names |= rule.names | rule.outer | rule.caller
    return frozenset(names | HICACHE_PROTOCOL_FUNCS | RECEIVE_FUNCS | EXIT_FUNCS)


def is_exiting(thread: ThreadStack | None) -> bool:
    """The thread is inside interpreter shutdown (`threading._shutdown`) or SGLang's exit
    path (its SIGQUIT handlers, kill_process_tree)."""
    if thread is None:
        return False
    for frame in thread.frames:
        name = normalize(frame.name)
        if name in EXIT_FUNCS and (name != "shutdown" or "threading" in frame.filename):
            return True
    return False
