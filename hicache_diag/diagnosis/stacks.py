"""A rank's saved stack (parsed by triage.dumps) -> where its main thread waits, for the verdict."""

from __future__ import annotations

from hicache_diag.evidence.stacks import Frame, RankDump
from hicache_diag.rules.wait_sites import HICACHE_PROTOCOL_FUNCS as HICACHE_WAIT
from hicache_diag.rules.wait_sites import RECEIVE_FUNCS as _RECEIVES
from hicache_diag.rules.wait_sites import normalize

# The HiCache protocol functions and receives come from the one wait-site table (rules), compared
# without leading underscores (`_pp_sync` is SGLang's `pp_sync`).
# Where a scheduler step's own code lives (ours and SGLang's): the caller worth naming.
_STEP_DIRS = ("/managers/", "/mem_cache/")
_HELPERS = ("_commit",)  # waits on a list of sends: its caller says which


def _main_frames(dump: RankDump) -> tuple[Frame, ...]:
    """Innermost first."""
    main = dump.main_thread()
    return main.frames if main else ()


def _is_step(frame: Frame) -> bool:
    name = frame.name.rsplit(".", 1)[-1]
    return any(d in frame.filename for d in _STEP_DIRS) and name not in _HELPERS


# Library frames as py-spy prints them (paths shortened to the package): never the answer to
# "where does this rank wait" when a frame of the serving code sits above them.
_LIBRARY_PREFIXES = ("torch/", "multiprocessing/", "concurrent/", "asyncio/", "importlib/")
_LIBRARY_FILES = (
    "threading.py",
    "queue.py",
    "selectors.py",
    "subprocess.py",
    "socket.py",
    "distributed_c10d.py",
    "_contextlib.py",
    "module.py",
    "<string>",
)


def _is_ours(frame: Frame) -> bool:
    """Serving code: ours or SGLang's. py-spy shortens SGLang's paths (`scheduler.py`,
    `utils/watchdog.py`), so anything that is not a known library file and is Python counts.
    The sglang plugin's own wrappers are transparent, unless they are all there is."""
    name = frame.filename
    if "sglang_plugin" in name:
        return False
    if "hicache_diag" in name or "sglang" in name:
        return True
    if not name.endswith(".py") or name.startswith(_LIBRARY_PREFIXES):
        return False
    return name.rsplit("/", 1)[-1] not in _LIBRARY_FILES and "site-packages" not in name


def _fmt(frame: Frame) -> str:
    return f"{frame.name} ({frame.filename.rsplit('/', 1)[-1]}:{frame.line})"


def where(dump: RankDump) -> str | None:
    """The innermost frame of our own code (else the innermost frame) as 'func (file:line)', then
    the scheduler or cache step it serves when that is another frame, e.g. `_recv_bytes
    (parallel_state.py:62) <- recv_requests (scheduler.py:58)`."""
    frames = _main_frames(dump)
    if not frames:
        return None
    ours = [f for f in frames if _is_ours(f)]
    first = (ours or frames)[0]
    step = next((f for f in ours if _is_step(f)), None)
    if step is None or step == first:
        return _fmt(first)
    return f"{_fmt(first)} <- {_fmt(step)}"


def hicache_wait(dump: RankDump) -> str | None:
    """The HiCache protocol function this rank is blocked under, if any, as the stack names it
    (py-spy qualifies methods: `HiRadixCache.writing_check` -> `writing_check`)."""
    for frame in _main_frames(dump):
        if normalize(frame.name) in HICACHE_WAIT:
            return frame.name.rsplit(".", 1)[-1]
    return None


def is_receiving(dump: RankDump) -> bool:
    """Blocked in a receive (p2p recv, recv_tensor_dict, point_to_point_pyobj on the recv side)."""
    return any(normalize(f.name) in _RECEIVES for f in _main_frames(dump)[:6])
