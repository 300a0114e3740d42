"""Who printed a block of log text, and what its death means.

A traceback is judged only after it is attributed to its emitter, from its own frames and
framing: the line that announced it (`Scheduler hit an exception`, `Exception in ASGI
application`, `Exception in thread Thread-3 (backup_thread_func):`), the files its frames run
in, its rank label. Only the death of a process or thread the serving loop needs is a crash:
a scheduler rank's loop, one of its HiCache threads, the tokenizer / detokenizer. An error a
request handler raised (uvicorn / FastAPI / the OpenAI adapter / an asyncio task) was answered
by the server, which served on: evidence at that level. A client program's traceback
(bench_serving, an OpenAI client with no server frame) is not the server's at all.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass


class Emitter(str, enum.Enum):
    SCHEDULER = "scheduler"  # a scheduler rank's loop (its main thread), or vLLM's engine core
    SCHEDULER_THREAD = "scheduler-thread"  # one of a scheduler's background threads
    TOKENIZER = "tokenizer"  # the tokenizer manager or the detokenizer
    HTTP = "http-server"  # uvicorn / FastAPI / the OpenAI adapter / the asyncio layer
    CLIENT = "client"  # a client program: bench_serving, an OpenAI / aiohttp / requests client
    LAUNCHER = "launcher"  # the launcher: start-up, its subprocess watchdog
    UNKNOWN = "unknown"


class ThreadRole(str, enum.Enum):
    """A scheduler's background threads (SGLang's cache_controller names their functions)."""

    BACKUP = "backup"  # backup_thread_func: host -> storage writes, acked on ack_backup_queue
    PREFETCH = "prefetch"  # prefetch_thread_func / prefetch_sync_thread_func
    STORAGE_IO = "storage-io"  # prefetch_io_aux_func / _page_transfer: storage reads
    LOAD = "load"  # load-back from host (hicache-load-enqueue, load_thread_func)
    WATCHDOG = "watchdog"  # the scheduler watchdog's thread
    OTHER = "other"


# What the loop loses when the thread dies: each of these keeps the scheduler waiting.
_STOPS = {
    ThreadRole.BACKUP: "HiCache backups are never written nor acked: the scheduler's writes "
    "wait for acks that never come (a hang ahead) and their host memory is never released",
    ThreadRole.PREFETCH: "HiCache prefetches never complete: requests waiting on storage hits "
    "stall until their timeout (a hang ahead under a wait-complete policy)",
    ThreadRole.STORAGE_IO: "storage reads never complete: every prefetch ends in its timeout "
    "or waits forever",
    ThreadRole.LOAD: "load-backs from host never finish: the batch that needs them waits",
}
_ROLE_WORDS = (
    (ThreadRole.BACKUP, ("backup_thread_func", "backup")),
    (ThreadRole.STORAGE_IO, ("prefetch_io_aux_func", "_page_transfer", "io_aux")),
    (ThreadRole.PREFETCH, ("prefetch_thread_func", "prefetch_sync_thread_func", "prefetch")),
    (ThreadRole.LOAD, ("load_thread_func", "hicache-load", "load_back", "load")),
    (ThreadRole.WATCHDOG, ("watchdog",)),
)
# The header a line printed right before a traceback: who is speaking.
HEADER = re.compile(
    r"(?P<http>Exception in ASGI application|Task exception was never retrieved"
    r"|Exception in callback|Error in ASGI|Unhandled exception in (?:the )?(?:request|endpoint))"
    r"|(?P<tok>(?:Detokenizer|Tokenizer)Manager hit an exception|TokenizerManager failed)"
    r"|(?P<sched>Scheduler hit an exception|EngineCore encountered a fatal error)"
)
# A request handler's frames: the ASGI stack a request runs under (SGLang's http_server.py alone
# also runs the launcher's warm-up, which is no request handler).
_HTTP_FILES = ("uvicorn/", "starlette/", "fastapi/")
_CLIENT_FILES = (
    # SGLang's frontend language (`sgl.function`, its stream executor) runs in the client's
    # program, and SGLang's examples are client programs
    "sglang/lang/",
    "/examples/",
    "bench_serving",
    "benchmark_serving",
    "bench_one_batch_server",
    "/benchmark/",
    "openai/_base_client",
    "openai/resources",
    "aiohttp/client",
    "aiohappyeyeballs",
    "requests/",
    "urllib3/",
    "httpx/",
)
_SERVER_FILES = ("sglang/srt/", "vllm/", "sglang/launch_server")
# What a benchmark client prints of its own (sglang.bench_serving, vLLM's benchmark_serving):
# a log with these and no server line is a client's; its tracebacks are the client's.
CLIENT_STARTS = (
    "#Input tokens: ",
    "#Output tokens: ",
    "Starting initial single prompt test run",
    "Starting warmup with ",
    "Warmup completed with ",
    "benchmark_args=Namespace(",
    "Namespace(backend=",
    "============ Serving Benchmark Result",
    "Initial test run completed",
)
_TOKENIZER_FILES = ("tokenizer_manager", "detokenizer_manager")
_SCHEDULER_FUNCS = ("run_scheduler_process", "event_loop", "run_engine_core", "run_busy_loop")
_LAUNCHER_FILES = ("launch_server", "engine.py", "server_args.py")


@dataclass(frozen=True, slots=True)
class Attribution:
    """Who printed a traceback: the emitter, the thread and its role, what told us."""

    emitter: Emitter
    thread: str | None = None
    role: ThreadRole | None = None
    why: str = ""

    @property
    def survived(self) -> bool:
        """The server answered this error and went on (a request handler), or it is not the
        server's at all (a client program)."""
        return self.emitter in (Emitter.HTTP, Emitter.CLIENT)

    def stops(self) -> str | None:
        """What a dead thread of this role no longer delivers."""
        return _STOPS.get(self.role) if self.role else None

    @property
    def label(self) -> str:
        if self.emitter is Emitter.SCHEDULER_THREAD:
            role = (self.role or ThreadRole.OTHER).value
            return f"scheduler thread {self.thread or '?'} ({role})"
        return self.emitter.value


def thread_role(thread: str | None, frames: Sequence[str] = ()) -> ThreadRole:
    """The role of a thread from its name (`Thread-3 (backup_thread_func)`) or its frames."""
    text = " ".join([thread or "", *frames])
    for role, words in _ROLE_WORDS:
        if any(w in text for w in words):
            return role
    return ThreadRole.OTHER


def header_kind(text: str) -> str | None:
    """'http', 'tok' or 'sched' for a line that announces a traceback, else None ('client' is
    set by the reader on a log that is a client's own)."""
    m = HEADER.search(text) if "xception" in text or "hit an" in text or "fatal" in text else None
    return next((k for k, v in m.groupdict().items() if v), None) if m else None


def attribute(
    *,
    header: str | None,
    thread: str | None,
    frames: Sequence[str],
    files: Sequence[str],
    ranked: bool,
    scheduler: bool = False,
) -> Attribution:
    """The emitter of one traceback (or fatal line) from its announcing line (`header`, a
    header_kind), its thread, its frames and files, and whether a rank label framed it."""
    if thread and thread != "MainThread":
        role = thread_role(thread, frames)
        if role is ThreadRole.OTHER and _any(files, _HTTP_FILES + _CLIENT_FILES):
            emitter = Emitter.HTTP if _any(files, _SERVER_FILES) else Emitter.CLIENT
            return Attribution(emitter, thread, None, "a thread of the HTTP / client side")
        return Attribution(Emitter.SCHEDULER_THREAD, thread, role, f"thread {thread}")
    if scheduler or header == "sched":
        return Attribution(Emitter.SCHEDULER, why="announced as the scheduler's exception")
    if header == "http":
        return Attribution(Emitter.HTTP, why="announced by the HTTP server / asyncio layer")
    if header == "client" and not _any(files, _SERVER_FILES):
        return Attribution(Emitter.CLIENT, why="a benchmark client's log, no server line")
    if header == "tok" or (not ranked and _any(files, _TOKENIZER_FILES) and not _http(files)):
        return Attribution(Emitter.TOKENIZER, why="the tokenizer / detokenizer manager")
    if files and not _any(files, _SERVER_FILES) and _any(files, _CLIENT_FILES):
        return Attribution(Emitter.CLIENT, why="client frames and no server frame")
    if _http(files) and not any(f.startswith(_SCHEDULER_FUNCS) for f in frames):
        return Attribution(Emitter.HTTP, why="request-handler frames (uvicorn / FastAPI)")
    if ranked or any(f.startswith(_SCHEDULER_FUNCS) for f in frames):
        return Attribution(Emitter.SCHEDULER, why="a scheduler rank's frames or label")
    if files and _any(files, _LAUNCHER_FILES):
        return Attribution(Emitter.LAUNCHER, why="the launcher's frames")
    return Attribution(Emitter.UNKNOWN)


def _any(files: Sequence[str], words: tuple[str, ...]) -> bool:
    return any(w in f for f in files for w in words)


def _http(files: Sequence[str]) -> bool:
    return _any(files, _HTTP_FILES)
