"""Error-text signatures: the one rule book for crash forms, timeouts, the cascade and noise.

Triage (`triage.logs` / `triage.crash`) and the run classifier (`diagnosis.tracebacks`) both ask
this module what a line means, so they cannot disagree on a text. Forms need their context: the
shape text of form A is PyTorch's generic `view()` error and `pop from empty list` is Python's
generic list error; only inside a PP pipeline (A) or HiCache's ack bookkeeping (B) do they mean
rank divergence. Elsewhere they are crashes of another form (exit 16).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hicache_diag.rules.wait_sites import HICACHE_PROTOCOL_FUNCS, normalize

# PyTorch's view() text (RoPE's `query.view(N, -1, D)`): groups N, D, M.
SHAPE_RE = re.compile(r"shape '\[(\d+), -1, (\d+)\]' is invalid for input of size (\d+)")
SIZE_MISMATCH_RE = re.compile(
    r"Size mismatch for shape#\d+\('\w+'\): expected (\d+) but got (\d+)"
    r"|The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)"
)
# The same view() when the wrong token count happens to divide the buffer: query is a
# non-contiguous slice of qkv, so PyTorch objects to the strides instead (seen on real SGLang
# 0.5.12.post1, PP1's RoPE `forward_native`, in 1 of 6 form-A runs).
VIEW_STRIDE_RE = re.compile(r"view size is not compatible with input tensor's size and stride")
_POP_EMPTY = re.compile(r"pop from (?:an )?empty (?:list|deque)")
# SGLang's own divergence detectors: HiCache/PP-specific by their text alone.
_DIVERGENCE_TEXT = re.compile(
    r"duplicate-reclaim victims diverged|Found rank divergence for \d+ event"
)
# Where HiCache drains acks and in-flight entries (SGLang's HiRadixCache / UnifiedRadixCache
# names and ours), compared without leading underscores.
BOOKKEEPING_FRAMES = frozenset(
    {
        "writing_check",
        "loading_check",
        "finish_write_through_ack",
        "check_hicache_events",
        "drain_ack_prefetch",
        "handle_prefetch_result",
        "check_prefetch_progress",
        "drain_storage_control_queues",
        "drain_storage_control_queues_impl",
    }
)
_HICACHE_FILES = ("hiradix_cache", "unified_radix_cache", "cache_controller", "hicache")
_PP_FILES = ("scheduler_pp_mixin",)
_HICACHE_TEXT = re.compile(r"hierarchical.cache|HiCache|hiradix|HiRadixCache|UnifiedRadixCache")


@dataclass(frozen=True, slots=True)
class Context:
    """What the surrounding evidence shows: a PP pipeline, HiCache at work."""

    pp: bool = False
    hicache: bool = False

    def __or__(self, other: Context) -> Context:
        return Context(self.pp or other.pp, self.hicache or other.hicache)


def frames_context(frames: Sequence[str], files: Sequence[str] = ()) -> Context:
    """Context from a traceback's or stack's function and file names."""
    names = [normalize(f) for f in frames]
    pp = any(n.startswith("pp_") or n == "event_loop_pp" for n in names) or any(
        h in f for f in files for h in _PP_FILES
    )
    hicache = bool(set(names) & (BOOKKEEPING_FRAMES | HICACHE_PROTOCOL_FUNCS)) or any(
        h in f for f in files for h in _HICACHE_FILES
    )
    return Context(pp, hicache)


def text_context(text: str) -> Context:
    """Context a log line gives by naming HiCache (`--enable-hierarchical-cache`, the class)."""
    return Context(False, bool(_HICACHE_TEXT.search(text)))


def crash_form(text: str, frames: Sequence[str], ctx: Context) -> str | None:
    """ "A", "B" or None (a crash of another form) for one exception.

    `frames`: the traceback's function names (empty for a bare exception line); `ctx`: the
    context of the whole evidence (PP rank prefixes, HiCache frames elsewhere in the log)."""
    names = {normalize(f) for f in frames}
    here = frames_context(frames) | ctx
    if SHAPE_RE.search(text) or SIZE_MISMATCH_RE.search(text) or VIEW_STRIDE_RE.search(text):
        return "A" if here.pp else None
    if _DIVERGENCE_TEXT.search(text):
        return "B"
    bookkeeping = bool(names & BOOKKEEPING_FRAMES)
    if _POP_EMPTY.search(text):
        # A bare line (no frames) counts only where the evidence shows HiCache at work.
        return "B" if bookkeeping or (not frames and here.hicache) else None
    # KeyError on the in-flight dicts (ongoing_write_through / ongoing_load_back) is form B too.
    is_key_error = text.split(":", 1)[0].rsplit(".", 1)[-1] == "KeyError"
    return "B" if is_key_error and bookkeeping else None


# --- timeouts: hang evidence -------------------------------------------------------------------

# SGLang's watchdog (utils/watchdog.py): `{debug_name} watchdog timeout (self.watchdog_timeout=
# 300, self.soft=False)`; releases before 0.5 printed `Watchdog timeout (self.watchdog_timeout=
# 300)` from the scheduler only.
# The component name may only start where a word starts (the lookbehind), so a long run of
# letters is scanned once, not once per starting position.
SGLANG_WATCHDOG = re.compile(
    r"(?:(?<![\w])(?P<who>[A-Za-z]\w{0,80}) )?[Ww]atchdog timeout \(self\.watchdog_timeout="
    r"[^,)]{0,40}(?:, self\.soft=(?P<soft>\w{1,10}))?\)"
)
DEBUG_INFO = re.compile(r"^(?P<who>[A-Za-z]\w{0,80}) debug info:\s*$")
# Releases before the `Scheduler debug info:` block printed the stuck batch on the watchdog's
# rank: `self.cur_batch.batch_size()=109, self.cur_batch.reqs=[Req(...)...]`.
CUR_BATCH_DEBUG = re.compile(r"^self\.cur_batch\.batch_size\(\)=\d+")
# The watchdog thread's own functions across releases (scheduler.py `watchdog_thread`,
# utils/watchdog.py `_watchdog_thread` / `_watchdog_once`): a faulthandler dump taken from one
# of them is the watchdog's dump, i.e. the watchdog fired.
WATCHDOG_FUNCS = frozenset({"watchdog_thread", "watchdog_once", "watchdog_loop"})
# Flight Recorder's dump signal: `from this local rank` or `from  rank 13` (the rank whose
# collective timed out, a global rank), releases 2.3-2.15 (`timeout signal` in the oldest).
FLIGHT_RECORDER_SIGNAL = re.compile(
    r"Received a (?:global )?(?:dump|timeout) signal (?:due to a collective timeout )?from"
    r"(?: this local rank|\s+rank (?P<rank>\d{1,7}))"
)
# NCCL's heartbeat monitor: the NCCL watchdog itself made no progress (a hang below it), then
# `Terminating the process after attempting to dump debug info` (F-level) ends the process.
NCCL_HEARTBEAT = re.compile(r"ProcessGroupNCCL's watchdog got stuck for \d+ seconds")
TIMEOUT_PATTERNS = (
    NCCL_HEARTBEAT,
    re.compile(r"Terminating the process after attempting to dump debug info"),
    re.compile(r"Watchdog caught collective operation timeout"),
    re.compile(r"Timed out waiting \d+ ?ms for (?:recv|send)"),
    re.compile(r"Timed out waiting"),  # gloo's other waits (connect, barrier)
    re.compile(r"Exception \(either an error or timeout\) detected by watchdog"),
    re.compile(r"Some NCCL operations have failed or timed out"),
    re.compile(r"DistBackendError.*(?:[Tt]imeout|[Tt]imed out|TIMEOUT)"),
    # NCCL's watchdog found the collective past its limit (`Timeout at NCCL work: 47, last
    # enqueued NCCL work: 47, ...`), or raised from its check (the C++ frames printed without
    # the `Watchdog caught` line: `Exception raised from checkTimeout at ...`).
    re.compile(r"Timeout at NCCL work: \d+"),
    re.compile(r"Exception raised from checkTimeout at "),
    # PyTorch's Flight Recorder: a rank's collective timed out and every rank is asked to dump
    # its trace (the dump signal, from this rank or another through the TCPStore).
    FLIGHT_RECORDER_SIGNAL,
    re.compile(r"Observed flight recorder dump signal from another rank"),
    re.compile(r"ProcessGroupNCCL preparing to dump debug info"),
    re.compile(r"^Timeout \(\d+:\d\d:\d\d\)!$"),  # faulthandler.dump_traceback_later
    # vLLM's executor waiting on its workers' answer to an RPC (`collective_rpc`).
    re.compile(r"RPC call to \w{1,80} timed out"),
)
# vLLM: a worker (or the API server) waited this long for the next shared-memory broadcast:
# a peer hangs, or works long (compilation); progress after it tells which.
PEER_WAIT = re.compile(r"No available shared memory broadcast block found in \d+ seconds")


def is_peer_wait(text: str) -> bool:
    return "shared memory broadcast" in text and PEER_WAIT.search(text) is not None


def watchdog_kind(text: str) -> str | None:
    """'scheduler' for SGLang's scheduler watchdog (hard), 'soft' for a soft one or another
    component's (TokenizerManager, DetokenizerManager: always soft), None if not a watchdog."""
    m = SGLANG_WATCHDOG.search(text)
    if not m:
        return None
    who = m.group("who")
    if m.group("soft") == "True" or (who and who not in ("Scheduler", "Watchdog")):
        return "soft"
    return "scheduler"


def is_watchdog_debug(msg: str) -> bool:
    """`Scheduler debug info:` (the hard watchdog's block) or the older `self.cur_batch` line."""
    text = msg.strip()
    if text.startswith("self.cur_batch"):
        return bool(CUR_BATCH_DEBUG.match(text))
    m = DEBUG_INFO.match(text) if text.endswith(":") else None
    return bool(m) and m["who"] == "Scheduler"


def is_watchdog_thread(frames: Sequence[str]) -> bool:
    """A thread whose stack runs one of the watchdog's own functions."""
    return any(normalize(f) in WATCHDOG_FUNCS for f in frames)


def is_timeout(text: str) -> bool:
    """A collective / p2p / scheduler timeout: the text of a hang, whatever raised it."""
    return watchdog_kind(text) == "scheduler" or any(p.search(text) for p in TIMEOUT_PATTERNS)


# --- the cascade: consequences of a failure elsewhere ------------------------------------------

CASCADE_PATTERNS = (
    re.compile(r"Connection closed by peer"),
    re.compile(r"Connection reset by peer"),
    re.compile(r"Broken pipe"),
    re.compile(r"ECONNRESET|Socket closed"),
    re.compile(r"NCCL communicator was aborted"),
    re.compile(r"Received sigquit from a child process"),
    re.compile(r"SIGQUIT received"),
    re.compile(r"kill_process_tree called"),
    re.compile(r"Subprocess .+ crashed with exit code"),  # the parent noticing, not the cause
)
SIGNAL_EXITS = frozenset({"KeyboardInterrupt", "SystemExit"})
# SGLang's launcher (TokenizerManager's SIGQUIT handler) on a child's SIGQUIT: it then SIGKILLs
# its whole process tree, so every scheduler death after this line is its teardown.
LAUNCHER_TEARDOWN_RE = re.compile(r"SIGQUIT received\..*one child failed")


def is_cascade(text: str) -> bool:
    return any(p.search(text) for p in CASCADE_PATTERNS)


# --- lines that end a rank without a Python traceback ------------------------------------------

FATAL_PATTERNS = (
    re.compile(r"Found rank divergence for \d+ event"),  # the consensus checker, then os._exit
    re.compile(r"Subprocess .+ crashed with exit code"),  # SGLang's SubprocessWatchdog
    # vLLM's executor: a worker process died without a word (killed, OOM, a signal)
    re.compile(r"Worker proc \S{1,80} died unexpectedly"),
)
FATAL_PYTHON = re.compile(r"^Fatal Python error: (?P<what>.+)$")
# py-spy could not stop the process to read it: stopped (SIGSTOP, a debugger) or in the kernel.
PYSPY_FAILED = re.compile(
    r"All pyspy dump attempts failed for PID (?P<pid>\d+)|Failed to suspend process"
)

# --- benign noise: SGLang and its libraries print these on healthy servers ---------------------

NOISE_PATTERNS = (
    re.compile(r"Ignore import error when loading"),
    # The HTTP server's post-warmup POST /freeze_gc races its own start-up; SGLang logs the
    # handled requests/urllib3 ConnectionError chain and serves on (seen on 0.5.23).
    re.compile(r"post-warmup freeze_gc failed"),
    re.compile(r"^nanobind: (?:leaked|this is likely)"),
    re.compile(r"^ ?- leaked (?:type|instance|function)"),
)


def is_noise(text: str) -> bool:
    return any(p.search(text) for p in NOISE_PATTERNS)


# A request the HTTP server answered (uvicorn's access line): the server serves. Weak alone
# (health checks answer during a hang too), so it only decides when nothing else does.
SERVED = re.compile(r'"(?:GET|POST|PUT|DELETE|PATCH) /[^" ]{0,2000} HTTP/\d(?:\.\d)?" [23]\d\d\b')
PROGRESS = re.compile(
    r"(?:Prefill|Decode) batch[,.]|#running-req|gen throughput|The server is fired up"
    # an engine's periodic stats line (rules.engine_stats reads its numbers: busy or idle)
    r"|Avg generation throughput: [\d.]+ tokens/s",
    re.I,
)


# --- every pattern the log reader asks of a line: the fast path's words derive from these -----

LINE_SIGNATURES = (
    *TIMEOUT_PATTERNS,
    *CASCADE_PATTERNS,
    *FATAL_PATTERNS,
    *NOISE_PATTERNS,
    SGLANG_WATCHDOG,
    FATAL_PYTHON,
    PYSPY_FAILED,
    PEER_WAIT,
    DEBUG_INFO,
    CUR_BATCH_DEBUG,
)
