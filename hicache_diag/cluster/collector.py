"""The node-side collector: shipped as this one file through an executor's stdin (a
`python3 -c` bootstrap reads it, base.py), run on each node, prints one JSON document, exits.

Stdlib only and imported by nothing of ours: a node needs Python and, when present, py-spy.
It finds the scheduler processes by their titles (`sglang::scheduler_PP1_TP0`), waits for the
agreed wall-clock instant (`--at`, so every node samples together), then takes each process's
stack through a fallback chain and names every link it tried: py-spy dump; py-spy dump
--nonblocking; pystack; /proc (state, wchan, kernel stack: a stopped `T` or D-state process is
itself evidence). It never signals a target; its own children die with it (--budget, or when
its launcher goes away). A scheduler that records (`hicache-diag record`) is asked for an
in-process dump, and its recording comes back bounded and compressed (`recordings`).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib

SCHEMA = "hicache-diag/collector/v1"
MARKER = "--hicache-diag-collector"  # in our argv, so a leftover collector can be found
TITLE_PREFIXES = ("sglang::scheduler", "hicache-diag::scheduler")  # hicache_diag/evidence/ranks.py
_NODE_RANK = re.compile(r"--node[-_]rank[= ](\d+)")
_PYSTACK_FRAME = re.compile(r'File "(.+?)", line (\d+), in (\S+)')
_CHILDREN: set[subprocess.Popen] = set()
_LOCK = threading.Lock()


def _read(path: str, raw: bool = False):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data if raw else data.decode(errors="replace")


def _cmdline(pid: int) -> str:
    raw = _read(f"/proc/{pid}/cmdline") or ""
    # setproctitle pads the title with spaces and NULs: strip them.
    return " ".join(p for p in raw.split("\0") if p).strip()


def _ppid(pid: int) -> int:
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0


def _node_rank(pid: int) -> tuple[int | None, str | None]:
    """SGLang's `--node-rank` from the process or the launcher above it (schedulers are spawned
    children whose own cmdline is the title)."""
    seen = 0
    while pid > 1 and seen < 8:
        cmd = _cmdline(pid)
        if m := _NODE_RANK.search(cmd):
            return int(m.group(1)), cmd[:400]
        pid, seen = _ppid(pid), seen + 1
    return None, None


def discover() -> list[dict]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        title = _cmdline(int(name))
        if title.startswith(TITLE_PREFIXES):
            node_rank, launch = _node_rank(int(name))
            found.append(
                {"pid": int(name), "title": title, "node_rank": node_rank, "launch": launch}
            )
    return sorted(found, key=lambda p: p["title"])


def proc_facts(pid: int) -> dict:
    """Kernel facts that need no ptrace: state, wchan, CPU ticks, kernel stack (root only)."""
    status = _read(f"/proc/{pid}/status")
    if status is None:
        return {"state": "gone"}
    lines = [ln.split(None, 1) for ln in status.splitlines() if ln.startswith("State:")]
    state = lines[0][1] if lines and len(lines[0]) > 1 else "?"
    stat = (_read(f"/proc/{pid}/stat") or "").rsplit(")", 1)[-1].split()
    ticks = int(stat[11]) + int(stat[12]) if len(stat) > 12 else None
    stack = _read(f"/proc/{pid}/stack")
    facts = {
        "state": state.strip(),
        "wchan": (_read(f"/proc/{pid}/wchan") or "").strip() or None,
        "kernel_stack": stack.strip().splitlines()[:16] if stack else None,
        "cpu_ticks": ticks,
    }
    if state.startswith("Z") and stat:
        # A zombie's wait status is stat's last field (Linux >= 3.5): its exit code or signal.
        facts["wait_status"] = int(stat[-1]) if stat[-1].lstrip("-").isdigit() else None
    return facts


def _run(cmd: list[str], timeout: float) -> tuple[int | None, str, str]:
    """A child we own, killed at the timeout (never the process it inspects)."""
    try:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    except OSError as exc:
        return None, "", str(exc)
    with _LOCK:
        _CHILDREN.add(proc)
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.1))
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, "", f"timed out after {timeout:.1f} s"
    finally:
        with _LOCK:
            _CHILDREN.discard(proc)


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "").removeprefix("Error: ")


def _pyspy(binary: str | None, pid: int, nonblocking: bool, timeout: float) -> tuple:
    if binary is None:
        return None, "not installed"
    cmd = [binary, "dump", "--json", "--pid", str(pid)] + (["--nonblocking"] if nonblocking else [])
    rc, out, err = _run(cmd, timeout)
    if rc != 0:
        return None, _first_line(err) or f"exit status {rc}"
    try:
        threads = json.loads(out)
    except ValueError as exc:
        return None, f"unreadable output: {exc}"
    return (threads, None) if isinstance(threads, list) else (None, "not a thread list")


def _pystack(binary: str | None, pid: int, timeout: float) -> tuple:
    """pystack's text, as py-spy's JSON thread list (pystack prints outermost frame first)."""
    if binary is None:
        return None, "not installed"
    rc, out, err = _run([binary, "remote", str(pid), "--no-block"], timeout)
    if rc != 0:
        return None, _first_line(err) or f"exit status {rc}"
    threads, frames = [], None
    for line in out.splitlines():
        if line.startswith("Traceback for thread"):
            tid = re.search(r"thread (\d+)", line)
            frames = []
            name = "MainThread" if not threads else None
            tid_value = int(tid.group(1)) if tid else None
            threads.append({"thread_name": name, "os_thread_id": tid_value, "frames": frames})
        elif frames is not None and (m := _PYSTACK_FRAME.search(line)):
            frames.insert(0, {"name": m.group(3), "filename": m.group(1), "line": int(m.group(2))})
    return (threads, None) if threads else (None, "no Python frames in its output")


def capture(pid: int, tools: dict, timeout: float) -> dict:
    """One sample of one process through the fallback chain; every link tried is named."""
    t0, links = time.time(), []
    facts = proc_facts(pid)
    state = facts["state"][:1]
    threads = None
    if state in ("T", "t", "D"):
        links.append({"link": "py-spy", "ok": False, "error": f"skipped: state {facts['state']}"})
    else:
        threads, error = _pyspy(tools["py-spy"], pid, False, timeout)
        links.append({"link": "py-spy", "ok": threads is not None, "error": error})
    for name, get in (
        ("py-spy --nonblocking", lambda: _pyspy(tools["py-spy"], pid, True, timeout)),
        ("pystack", lambda: _pystack(tools["pystack"], pid, timeout)),
    ):
        if threads is None:
            threads, error = get()
            links.append({"link": name, "ok": threads is not None, "error": error})
    links.append({"link": "/proc", "ok": facts["state"] != "gone", "error": None})
    elapsed = round(time.time() - t0, 3)
    return {"t": t0, "elapsed_s": elapsed, "threads": threads, "links": links, "proc": facts}


def _sample_all(procs: list[dict], tools: dict, timeout: float) -> float:
    """One sample of every process in parallel; returns when the sample began (wall clock)."""
    started = time.time()
    results: dict[int, dict] = {}

    def one(p: dict) -> None:
        results[p["pid"]] = capture(p["pid"], tools, timeout)

    threads = [threading.Thread(target=one, args=(p,), daemon=True) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p["samples"].append(results[p["pid"]])
    return started


def _tools() -> dict:
    """py-spy and pystack on PATH, or where pip --user / a venv next to python3 puts them."""
    extra = [os.path.dirname(sys.executable), os.path.expanduser("~/.local/bin"), "/usr/local/bin"]
    path = os.pathsep.join([os.environ.get("PATH", ""), *extra])
    return {name: shutil.which(name, path=path) for name in ("py-spy", "pystack")}


# -- production recordings (`hicache-diag record`, evidence/recording.py's files) -------------
SESSION_ENV, RECORD_DIR_ENV = "HICACHE_DIAG_RECORD_SESSION", "HICACHE_DIAG_RECORD_DIR"
# Each rank's newest bytes shipped, per kind: (name after `rank{r}.`, cap, record size, newest
# first by reversed name order: digest segments count up, the lines' older half is `.1`)
SHIP = {"jsonl": (2 << 20, 0, False), "blocks.jsonl": (2 << 20, 0, False)}
SHIP["digest"] = (4 << 20, 8, True)  # 512K steps a rank; the blocks reach further back
_QUIET = ("T", "t", "D", "Z", "X", "g")  # stopped, in the kernel, dead, gone: it answers nothing


def _json(path: str) -> dict:
    try:
        doc = json.loads(_read(path) or "{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _metas(place: str) -> list:
    """(session, meta file) of a session folder, or of every session in a record dir."""
    subs = filter(os.path.isdir, [place, *(os.path.join(place, d) for d in os.listdir(place))])
    return [(s, n) for s in subs for n in os.listdir(s) if n.endswith(".meta.json")]


def _recorded(pid: int, cur: int = 0, depth: int = 8) -> list | None:
    """[session, rank] whose rank meta names `pid`, in a session or record dir the environment
    of `pid` or an ancestor names (a scheduler's own is blank once setproctitle ran)."""
    env = (_read(f"/proc/{cur or pid}/environ") or "").split("\0")
    keys = (SESSION_ENV + "=", RECORD_DIR_ENV + "=")
    places = [kv.split("=", 1)[1] for kv in env if kv.startswith(keys)]
    for session, name in (m for place in filter(os.path.isdir, places) for m in _metas(place)):
        if _json(os.path.join(session, name)).get("pid") == pid:
            return [session, int(name[4:].split(".")[0])]
    parent = _ppid(cur or pid)
    return _recorded(pid, parent, depth - 1) if depth and parent > 1 else None


def _ask(sessions: set, rid: str) -> None:
    """dump-request.json, written whole: every rank's dumper thread answers a new id once."""
    for session in sessions:
        tmp = os.path.join(session, f".dump-request.json.{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(json.dumps({"id": rid, "at": time.time()}))
            os.replace(tmp, os.path.join(session, "dump-request.json"))


def _answers(session: str, rank: int, rids: list) -> list:
    names = [n for n in os.listdir(session) if n.startswith(f"rank{rank}.dump-")]
    return [n for n in names if _json(os.path.join(session, n)).get("request") in rids]


def _tail(session: str, names: list, cap: int, step: int = 0) -> dict:
    """The newest `cap` bytes of `names` (newest first), cut at a line or a `step`-byte record
    (a record torn at a file's end dropped; past the cap, empty), zlib-compressed, base64'd."""
    out = {}
    for name in names:
        data = _read(os.path.join(session, name), raw=True) or b""
        data = data[: len(data) - len(data) % step] if step else data
        if len(data) > cap:
            data = data[len(data) - cap + cap % max(step, 1) :]
            data = data if step else data[data.find(b"\n") + 1 :]
        out[name], cap = base64.b64encode(zlib.compress(data, 6)).decode(), cap - len(data)
    return out


def ship(session: str, rids: list) -> dict:
    """One session's files, bounded: metas whole, each rank's newest lines, blocks and digests
    up to SHIP, its dumps answering `rids` and its newest; zlib + base64 each."""
    names = set(os.listdir(session)) - {"dump-request.json"}
    files = _tail(session, sorted(n for n in names if n.endswith(".meta.json")), 1 << 20)
    for r in {int(n[4:].split(".")[0]) for n in files}:
        mine = {n.split(".", 1)[1]: n for n in names if n.startswith(f"rank{r}.")}
        for kind, (cap, step, back) in SHIP.items():
            got = sorted((k for k in mine if k.startswith(kind + ".") or k == kind), reverse=back)
            files |= _tail(session, [mine[k] for k in got], cap, step)
        dumps = sorted((k for k in mine if k.startswith("dump-")), key=lambda k: int(k[5:-5]))
        asked = {*_answers(session, r, rids), *(mine[k] for k in dumps[-1:])}
        files |= _tail(session, sorted(asked), 4 << 20)
    return {"session": session, "name": os.path.basename(session), "files": files, "asked": rids}


def _record(procs: list, rids: list, deadline: float) -> list:
    """Wait (to `deadline`) for the answers of the ranks that can answer, then ship."""
    mine = [p for p in procs if p["recorded"]]
    live = [p for p in mine if p["samples"][-1]["proc"].get("state", "g")[:1] not in _QUIET]
    while time.time() < deadline and not all(_answers(*p["recorded"], rids[-1:]) for p in live):
        time.sleep(0.05)
    return [ship(session, rids) for session in sorted({p["recorded"][0] for p in mine})]


def collect(args: argparse.Namespace) -> dict:
    tools = _tools()
    procs = [dict(p, samples=[], recorded=_recorded(p["pid"])) for p in discover()]
    sessions, rids = {p["recorded"][0] for p in procs if p["recorded"]}, []
    doc = {"schema": SCHEMA, "node": args.node, "hostname": socket.gethostname(), "at": args.at}
    doc |= {"python": sys.version.split()[0], "tools": tools, "started": time.time()}
    doc |= {"processes": procs, "samples_at": []}
    for n in range(args.samples):
        due = args.at + n * args.interval
        time.sleep(max(0.0, due - time.time()))
        unread = any(not p["samples"][-1]["threads"] for p in procs if p["recorded"] and n)
        if sessions and (n == 0 or unread):
            rids.append(f"triage-{args.at:.3f}-s{n}")  # another where py-spy could not read
            _ask(sessions, rids[-1])
        doc["samples_at"].append(_sample_all(procs, tools, args.deadline))
    if sessions:
        doc["recordings"] = _record(procs, rids, time.time() + args.deadline)
    doc["finished"] = time.time()
    return doc


def watch(args: argparse.Namespace) -> None:
    """`--watch SECONDS`: one JSON line per interval, every scheduler's kernel facts (no
    stacks, no ptrace), until our launcher is gone: a run's eyes on a node it cannot see."""
    while True:
        procs = [dict(p, proc=proc_facts(p["pid"])) for p in discover()]
        line = {"schema": SCHEMA, "node": args.node, "hostname": socket.gethostname()}
        line.update(t=time.time(), processes=procs)
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
        time.sleep(args.watch)


def _kill_children() -> None:
    with _LOCK:
        for proc in list(_CHILDREN):
            proc.kill()


def _guard(budget: float, lifeline: bool) -> None:
    """Never outlive the command that started us: a hard budget, and exit when our launcher
    (sshd's session, srun's step, kubectl exec) is gone, taking our py-spy children along."""
    parent, end = os.getppid(), time.monotonic() + budget

    def watch() -> None:
        while time.monotonic() < end and os.getppid() == parent:
            time.sleep(0.2)
        _kill_children()
        os._exit(3)

    def stdin_closed() -> None:
        # The bootstrap left stdin open (hicache_diag/cluster/base.py): EOF means our
        # launcher is gone.
        while sys.stdin.buffer.read(1) != b"":
            pass
        _kill_children()
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()
    if lifeline:
        threading.Thread(target=stdin_closed, daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: (_kill_children(), os._exit(3)))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="collector")
    parser.add_argument(MARKER, dest="marker", action="store_true")
    parser.add_argument("--node", required=True)
    parser.add_argument("--at", type=float, required=True, help="wall-clock time of sample 0")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--deadline", type=float, default=5.0, help="seconds per link")
    parser.add_argument("--budget", type=float, default=60.0, help="hard limit on our life")
    parser.add_argument("--lifeline", action="store_true", help="exit when stdin ends")
    parser.add_argument("--watch", type=float, help="print the processes' facts every SECONDS")
    args = parser.parse_args(argv)
    _guard(args.budget, args.lifeline)
    if args.watch:
        watch(args)
    try:
        doc = collect(args)
    except Exception as exc:  # noqa: BLE001 - one JSON document, whatever happened
        doc = {"schema": SCHEMA, "node": args.node, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
    _kill_children()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
