"""Deliveries nobody listed: wrappers made up from a seed (a logging agent's fields, JSON-ish
keys, a host and a counter, a syslog priority) put in front of every line, and SGLang's stamp
cut short at the front of some lines. triage.framing must peel what triage.carriers does not
know; tests/unit/triage/test_metamorphic.py runs every corpus case through several seeds."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from tests.unit.triage.deliveries import Delivery, DeliveryKind, File, per_line

_LEVELS = ("ERROR", "INFO", "WARNING", "DEBUG", "E", "I", "err", "info")
_SEPARATORS = ("] ", "} ", " | ", ": ", "> ", " ")
# SGLang's label at the start of a line: `[2025-06-24 15:38:03(.123)? PP1 TP0]`.
_LABEL = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?P<tokens>(?: [A-Z_]+\d+)*)\]")


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))


def _field(rng: random.Random) -> Callable[[int], str]:
    """One made-up field; `i` (the line number) makes its figures vary line to line."""
    word, key, level = _word(rng), _word(rng), rng.choice(_LEVELS)
    base = rng.randint(10**9, 2 * 10**9)
    shapes: list[Callable[[int], str]] = [
        lambda i: f"[{word}: {level}",
        lambda i: f'{{"{key}": {base + i}, "{word}": "{level}"',
        lambda i: f"{word}-{base % 97} {i:06d}",
        lambda i: f"<{base % 191}>{word}[{base % 9999}]",
        lambda i: f"@{base + 3 * i} {level}",
        lambda i: f"{key}={word} {key}_n={i}",
    ]
    return rng.choice(shapes)


def random_wrapper(seed: int) -> Callable[[int], str]:
    """A wrapper of one to three made-up fields, each closed by a separator; ends in a blank."""
    rng = random.Random(seed)
    fields = [(_field(rng), rng.choice(_SEPARATORS)) for _ in range(rng.randint(1, 3))]

    def wrap(i: int) -> str:
        return "".join(f(i) + sep for f, sep in fields).rstrip(" ") + " "

    return wrap


def cut_stamp(line: str, rng: random.Random) -> str:
    """SGLang's label with its first characters cut (1 up to the whole stamp; a label with no
    rank tokens keeps its `:SS`, the sign that it was a stamp)."""
    m = _LABEL.match(line)
    if m is None:
        return line
    most = m.start("tokens") if m["tokens"] else m.start("tokens") - 3
    return line[rng.randint(1, max(1, most)) :]


def _per_file(fn: Callable[[list[str], random.Random], list[str]], seed: int) -> Delivery:
    def deliver(files: list[File]) -> list[File]:
        out = []
        for k, (name, content) in enumerate(files):
            rng = random.Random(seed * 1000 + k)
            lines = content.decode("utf-8", errors="replace").split("\n")
            tail = lines.pop() if lines and lines[-1] == "" else None
            new = fn(lines, rng)
            out.append((name, ("\n".join(new) + ("\n" if tail is not None else "")).encode()))
        return out

    return deliver


def _wrapped(seed: int) -> Delivery:
    wrap = random_wrapper(seed)
    return _per_file(lambda lines, _rng: [wrap(i) + s for i, s in enumerate(lines)], seed)


def _cut(seed: int) -> Delivery:
    def cut(lines: list[str], rng: random.Random) -> list[str]:
        return [cut_stamp(s, rng) if rng.random() < 0.5 else s for s in lines]

    return _per_file(cut, seed)


def _wrapped_and_cut(seed: int) -> Delivery:
    wrap = random_wrapper(seed)

    def both(lines: list[str], rng: random.Random) -> list[str]:
        cut = [cut_stamp(s, rng) if rng.random() < 0.3 else s for s in lines]
        return [wrap(i) + s for i, s in enumerate(cut)]

    return _per_file(both, seed)


# Editor line numbers in shapes triage.lines' own stage does not list alone: `  12| ` and
# `12:` glued to the text, and numbers in front of a collector's prefix.
EDITOR_NUMBERS = (
    DeliveryKind("numbered-bar-tight", per_line(lambda i, s: f"{i + 1:>4}| {s}")),
    DeliveryKind("numbered-colon", per_line(lambda i, s: f"{i + 1}:{s}")),
    DeliveryKind(
        "numbered-cri",
        per_line(lambda i, s: f"{i + 1:>4}| 2026-06-24T17:38:03.{i:09d}Z stdout F {s}"),
    ),
)


def generated(seeds: range) -> tuple[DeliveryKind, ...]:
    """For each seed: an unknown wrapper, stamps cut at the front, and both together."""
    out: list[DeliveryKind] = []
    for seed in seeds:
        out += [
            DeliveryKind(f"wrapper{seed}", _wrapped(seed)),
            DeliveryKind(f"stamp-cut{seed}", _cut(seed)),
            DeliveryKind(f"wrapper+cut{seed}", _wrapped_and_cut(seed)),
        ]
    return tuple(out)


# --- issue 38: what the user's stack did to the text, generated per seed ---------------------
# Each transform below re-sends a case's files the way a stack nobody listed would; the verdict
# must not change (tests/unit/triage/test_metamorphic.py: test_transforms_keep_the_verdict).

_HOSTS = ("gpu-node-3", "dinov2-giant-nodes.cn-d004", "worker-7f9c.pool-b", "ip-10-0-3-17")
_STREAMS = ("[stderr]", "[stdout]", "stderr", "<stderr>", "(err)")


def random_tag(seed: int) -> Callable[[int], str]:
    """A runner's per-line tag of 1 to 4 blank-separated fields (a host, a stream, a counter,
    a pid, a job id, a time): the fields vary or stay, as a runner writes them."""
    rng = random.Random(seed)
    host, stream, job = rng.choice(_HOSTS), rng.choice(_STREAMS), rng.randint(1000, 99999)
    pid, base = rng.randint(100, 65000), rng.randint(0, 10**6)
    shapes: list[Callable[[int], str]] = [
        lambda i: f"{host}.{_word(rng_tag)}",
        lambda i: stream,
        lambda i: f"{base + i:07d}",
        lambda i: f"[{pid}]",
        lambda i: f"job={job}",
        lambda i: f"{(base + i) % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}.{i % 1000:03d}",
    ]
    rng_tag = random.Random(seed + 1)
    fields = rng.sample(shapes, rng.randint(1, 4))
    first = fields[0](0)  # a host-like field stays the same on every line
    return lambda i: " ".join(first if k == 0 else f(i) for k, f in enumerate(fields)) + " "


def _tagged(seed: int) -> Delivery:
    tag = random_tag(seed)
    return _per_file(lambda lines, _rng: [tag(i) + s for i, s in enumerate(lines)], seed)


def _hard_wrapped(seed: int) -> Delivery:
    """Every line longer than a width picked in 60-200 cut into pieces of that width."""

    def wrap(lines: list[str], rng: random.Random) -> list[str]:
        width = random.Random(seed).randint(60, 200)
        out = []
        for line in lines:
            while len(line) > width:
                out.append(line[:width])
                line = line[width:]
            out.append(line)
        return out

    return _per_file(wrap, seed)


# A record's own start: SGLang's label, torchrun's rank, an RFC 3339 or logging stamp, vLLM's
# level header, a process prefix.
_RECORD = re.compile(
    r"^(?:\[\d{4}-\d\d-\d\d[ T]\d\d:|\[(?:[A-Z]{1,8}(?:_[A-Z]{1,8})?\d{1,5} ?){1,8}\] "
    r"|\[rank\d+\]:|\d{4}-\d\d-\d\d[T ]\d\d:|(?:INFO|WARNING|ERROR|DEBUG) \d\d-\d\d \d\d:"
    r"|\(\w+ pid=\d+[,)])"
)


def _glued(seed: int) -> Delivery:
    """2 to 6 records flattened onto one physical line: the newline before a record that
    starts with its own stamp, label or level marker is lost (two writers on one stream), so
    it follows the record before it (and that record's last line) directly."""

    def glue(lines: list[str], rng: random.Random) -> list[str]:
        out: list[str] = []
        glued = 0  # records glued onto the current line so far
        limit = rng.randint(2, 6)
        for line in lines:
            if out and glued + 1 < limit and _RECORD.match(line):
                out[-1] += line
                glued += 1
                continue
            if _RECORD.match(line):
                glued, limit = 0, rng.randint(2, 6)
            out.append(line)
        return out

    return _per_file(glue, seed)


def _json_shipper(seed: int) -> Delivery:
    """Each line as a JSON object a log shipper writes (docker's json-file, Fluent Bit,
    a Kubernetes fluentd record, GCP's textPayload, a Loki export), colours and all: the
    ANSI escapes of error lines come JSON-escaped (`\\u001b[31m`)."""
    import json

    def ship(lines: list[str], rng: random.Random) -> list[str]:
        shape = random.Random(seed).randrange(5)
        out = []
        for i, s in enumerate(lines):
            if "Error" in s or "Traceback" in s:
                s = f"\x1b[31m{s}\x1b[0m"
            ts = f"2026-06-24T17:38:{i % 60:02d}.{i:06d}Z"
            record = (
                {"log": s + "\n", "stream": "stderr", "time": ts},
                {"date": 1719250683.0 + i, "log": s},
                {"log": s + "\n", "stream": "stdout", "kubernetes": {"pod_name": "sgl-0"}},
                {"textPayload": s, "severity": "ERROR", "timestamp": ts},
                {"line": s, "timestamp": str(1719250683000000000 + i), "labels": {"app": "x"}},
            )[shape]
            out.append(json.dumps(record))
        return out

    return _per_file(ship, seed)


_DUMP_START = re.compile(r"^(?:Fatal Python error|Thread 0x|Current thread 0x|Process \d+: )")


def _interleaved(seed: int) -> Delivery:
    """Two ranks dumping the same stacks at once into one stream (faulthandler writes as it
    goes): the case's first dump block and a second rank's copy of it, interleaved character
    by character, the writers taking turns and now and then one slipping a turn (5%). A
    case without a dump is sent unchanged."""

    def interleave(lines: list[str], rng: random.Random) -> list[str]:
        start = next((k for k, s in enumerate(lines) if _DUMP_START.match(s)), None)
        if start is None:
            return lines
        end = start + 1
        while end < len(lines) and lines[end].strip() and not _RECORD.match(lines[end]):
            end += 1
        block = "\n".join(lines[start:end]) + "\n"
        pos = [0, 0]
        turn, mixed = 0, []
        while pos[0] < len(block) or pos[1] < len(block):
            if rng.random() < 0.05:
                turn ^= 1
            if pos[turn] >= len(block):
                turn ^= 1
            mixed.append(block[pos[turn]])
            pos[turn] += 1
            turn ^= 1
        return lines[:start] + "".join(mixed).rstrip("\n").split("\n") + lines[end:]

    return _per_file(interleave, seed)


def _cr_only(files: list[File]) -> list[File]:
    return [(n, c.replace(b"\n", b"\r")) for n, c in files]


def _nul_hole(seed: int) -> Delivery:
    """A hole of NUL bytes (a file preallocated, or cut by a crash) between two lines."""

    def hole(files: list[File]) -> list[File]:
        rng = random.Random(seed)
        name, content = files[0]
        cuts = [k + 1 for k, b in enumerate(content) if b == 10]
        at = rng.choice(cuts[: max(1, len(cuts) - 1)]) if cuts else 0
        hole_bytes = b"\x00" * rng.randint(512, 4096)
        return [(name, content[:at] + hole_bytes + content[at:]), *files[1:]]

    return hole


_EVIDENCE_WORDS = re.compile(
    r"Traceback|Error|Exception|[Ww]atchdog|Timeout|Timed out|Pyspy|Thread |Process \d|Fatal"
    r"|SIG[A-Z]{3,4}|terminate called|File \"|debug info|cur_batch|Current thread|[Bb]atch[,.]"
    r"|#running-req|fired up|HTTP/1|throughput: |dump signal|flight recorder|checkTimeout"
)


def _front_cut(seed: int) -> Delivery:
    """The first file starts mid-line: a copy taken from a byte offset before any evidence."""

    def cut(files: list[File]) -> list[File]:
        name, content = files[0]
        text = content.decode("utf-8", errors="replace")
        found = _EVIDENCE_WORDS.search(text)
        limit = text.rfind("\n", 0, found.start()) if found else len(text) // 5
        if limit <= 0:
            return files  # evidence on the first line: nothing before it to cut
        at = random.Random(seed).randint(1, limit)
        return [(name, text[at:].encode()), *files[1:]]

    return cut


def transforms(seeds: range = range(2)) -> tuple[DeliveryKind, ...]:
    """Issue 38's metamorphic transforms, per seed (test_metamorphic runs every corpus case
    through each)."""
    out: list[DeliveryKind] = [DeliveryKind("cr-only", _cr_only)]
    for seed in seeds:
        out += [
            DeliveryKind(f"tag{seed}", _tagged(seed)),
            DeliveryKind(f"hard-wrap{seed}", _hard_wrapped(seed)),
            DeliveryKind(f"glued{seed}", _glued(seed)),
            DeliveryKind(f"jsonl{seed}", _json_shipper(seed)),
            DeliveryKind(f"interleaved{seed}", _interleaved(seed)),
            DeliveryKind(f"nul-hole{seed}", _nul_hole(seed)),
            DeliveryKind(f"front-cut{seed}", _front_cut(seed)),
        ]
    return tuple(out)
