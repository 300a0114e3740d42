"""SGLang-only scripted workloads: sessions and deferred flushes over HTTP (ours).

The plain workloads send `/generate` waves. These three drive the per-rank wall clocks SGLang
0.5.23 still reads (docs/sources.md): the session reap tick and the deferred-flush deadline.
- `session-timeout`: streaming sessions opened with `timeout`; each sends its second turn at a
  different delay around the timeout, so some arrive between two ranks' reap ticks (one rank has
  closed the session, the other appends to it).
- `session-close`: a streaming session is closed while its turn is in flight (a deferred close,
  `close_on_finish`); as the turn finishes, plain requests arrive that fit in the device pool
  only once that session's KV is freed, which each rank does on its own reap tick.
- `flush-timeout`: a long request is in flight when `/flush_cache?timeout=T` arrives, with T
  swept across the request's remaining time; each rank flushes when idle or gives up at its own
  deadline; then shared-prefix requests show whether the ranks' trees still agree.
Every turn whose full context is known is added to `requests` (its full token context), so the
no-cache reference checks its output like any plain request.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from hicache_diag.engines.sglang.client import WorkloadClient, abort_message
from hicache_diag.options.workloads import TokenizedGenerateReqInput

# name -> launch_server flags the workload needs
SESSION_WORKLOADS: dict[str, tuple[str, ...]] = {
    "session-timeout": ("--enable-streaming-session",),
    "session-close": ("--enable-streaming-session",),
    "flush-timeout": (),
    # One request served at a time, so open-loop arrivals queue up (override with --sglang-arg).
    "overload": ("--max-running-requests=1",),
}
SESSION_TIMEOUT_S = 2.0  # the sessions' `timeout` (session-timeout)
SWEEP_S = (-0.4, 1.4)  # second-turn delays after the timeout, spread over more than one tick
FLUSH_AFTER_S = 0.2  # the flush arrives this long after the long request
FLUSH_SWEEP_S = (-1.5, 0.5)  # deadline offsets around the long request's expected end
# overload: one new request this often, whatever is still unanswered, and at least twice as
# fast as the server answers one request alone (measured on the first), so that the queue grows
# on a fast box too: at 0.28 s a request, a 0.25 s gap built no queue and no wait met the timeout.
OVERLOAD_GAP_S = 0.25
OVERLOAD_RATIO = 2.0
# session-close: the close is sent this far into the turn (the previous turn's length measured,
# a guess for the first), within these bounds.
CLOSE_FIRST_S, CLOSE_AT, CLOSE_MIN_S, CLOSE_MAX_S = 0.1, 0.5, 0.05, 0.3
_ERRORS = (urllib.error.URLError, OSError, TimeoutError, ValueError)


def _post(url: str, path: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url + path, data, {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:  # SGLang answers refusals with 400 and a message
        return exc.code, exc.read().decode(errors="replace")


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(1, vocab) for _ in range(n)]


class ScriptedClient(WorkloadClient):
    """A WorkloadClient whose `_run` follows one script of SESSION_WORKLOADS. `requests` is the
    trial's list: the scripted turns are appended to it with their full contexts as they finish."""

    def __init__(
        self,
        url: str,
        requests: list[Any],
        name: str,
        *,
        count: int,
        max_new_tokens: int,
        vocab: int,
        seed: int,
        timeout_s: float,
    ) -> None:
        super().__init__(url, requests, 1, timeout_s)
        self.name, self.count, self.max_new = name, max(1, count), max_new_tokens
        self.vocab = vocab
        self.rng = random.Random(f"{name}:{seed}")
        self._lock = threading.Lock()
        self.events: list[dict[str, Any]] = []  # what the script did, when (requests.json)

    # -- one HTTP call each ------------------------------------------------------------------
    def _event(self, what: str, **detail: Any) -> None:
        with self._lock:
            self.events.append({"t": round(time.time(), 3), "what": what, **detail})

    def _generate(
        self, rid: str, input_ids: Sequence[int], max_new: int, session: str | None = None
    ) -> dict[str, Any] | None:
        body: dict[str, Any] = {
            "rid": rid,
            "input_ids": list(input_ids),
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True},
        }
        if session is not None:
            body["session_params"] = {"id": session}
        t0 = time.time()
        self._event("generate", rid=rid, session=session, tokens=len(input_ids))
        try:
            status, text = _post(self.url, "/generate", body, self.timeout_s)
            data = json.loads(text) if status == 200 else None
            aborted = abort_message(status, text)
            if aborted is not None:  # the server's own abort: a reply without output
                self.result.aborted[rid] = aborted
                data = None
            elif data is None:
                self.result.errors[rid] = f"HTTP {status}: {text.strip()[:200]}"
            else:
                meta = data.get("meta_info") or {}
                self.result.outputs[rid] = list(data.get("output_ids") or [])
                self.result.cached[rid] = {
                    "cached_tokens": meta.get("cached_tokens"),
                    "details": meta.get("cached_tokens_details"),
                }
        except _ERRORS as exc:
            self.result.errors[rid] = f"{type(exc).__name__}: {exc}"
            data = None
        self.result.latency_s[rid] = round(time.time() - t0, 3)
        self.result.completed_at = time.time()
        why = self.result.errors.get(rid) or self.result.aborted.get(rid)
        self._event("done", rid=rid, ok=data is not None, error=why)
        return data

    def _reference_turn(self, rid: str, context: Sequence[int], max_new: int) -> None:
        with self._lock:
            self.requests.append(TokenizedGenerateReqInput(rid, tuple(context), max_new))

    def _open(self, sid: str, timeout: float | None) -> bool:
        body: dict[str, Any] = {"capacity_of_str_len": 65536, "session_id": sid, "streaming": True}
        if timeout is not None:
            body["timeout"] = timeout
        try:
            status, _ = _post(self.url, "/open_session", body, self.timeout_s)
        except _ERRORS:
            status = 0
        self._event("open_session", session=sid, status=status, timeout=timeout)
        return status == 200

    def _close(self, sid: str) -> None:
        try:
            status, _ = _post(self.url, "/close_session", {"session_id": sid}, self.timeout_s)
        except _ERRORS:
            status = 0
        self._event("close_session", session=sid, status=status)

    def _flush(self, timeout: float) -> None:
        query = urllib.parse.urlencode({"timeout": f"{timeout:.3f}"})
        try:
            status, text = _post(self.url, f"/flush_cache?{query}", None, self.timeout_s)
        except _ERRORS as exc:
            status, text = 0, str(exc)
        self._event("flush_cache", timeout=timeout, status=status, answer=text.strip()[:120])

    # -- the scripts -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            {
                "session-timeout": self._session_timeout,
                "session-close": self._session_close,
                "flush-timeout": self._flush_timeout,
                "overload": self._overload,
            }[self.name]()
        finally:
            self.result.done = True

    def _session_timeout(self) -> None:
        lo, hi = SWEEP_S
        n = self.count
        delays = [lo + (hi - lo) * i / max(1, n - 1) for i in range(n)]
        prompts = [_tokens(self.rng, 40, self.vocab) for _ in range(n)]
        seconds = [_tokens(self.rng, 12, self.vocab) for _ in range(n)]

        def one(i: int) -> None:
            time.sleep(0.37 * i)  # staggered, so the second turns meet the ticks at many phases
            sid = f"s{i:03d}"
            if self._stop.is_set() or not self._open(sid, SESSION_TIMEOUT_S):
                return
            first = self._generate(f"{sid}-t1", prompts[i], self.max_new, sid)
            if first is None:
                return
            out1 = list(first.get("output_ids") or [])
            self._reference_turn(f"{sid}-t1", prompts[i], self.max_new)
            time.sleep(max(0.0, SESSION_TIMEOUT_S + delays[i]))
            if self._stop.is_set():
                return
            if self._generate(f"{sid}-t2", seconds[i], self.max_new, sid) is not None:
                self._reference_turn(f"{sid}-t2", prompts[i] + out1 + seconds[i], self.max_new)
            self._close(sid)

        self._threads(one, n)

    def _session_close(self) -> None:
        lasted = None  # the previous turn's length, client side
        for i in range(self.count):
            if self._stop.is_set():
                return
            sid = f"c{i:03d}"
            if not self._open(sid, None):
                continue
            prompt = _tokens(self.rng, 96, self.vocab)
            burst = [_tokens(self.rng, 96, self.vocab) for _ in range(2)]
            turn = threading.Thread(
                target=self._generate,
                name="hicache-diag-turn",
                args=(f"{sid}-t1", prompt, self.max_new, sid),
                daemon=True,
            )
            # Mid-turn, however fast this box serves one: a close after the turn ended is no
            # deferral (released at once on every rank, in the same step), and a fixed 0.3 s
            # came after the whole turn once each rank had its share of the cores (0.28 s).
            close_after = CLOSE_FIRST_S if lasted is None else lasted * CLOSE_AT
            close_after = min(CLOSE_MAX_S, max(CLOSE_MIN_S, close_after))
            t0 = time.time()
            turn.start()
            time.sleep(close_after)
            self._event("close_after", session=sid, s=round(close_after, 3))
            self._close(sid)  # in flight: SGLang defers it to the turn's end (close_on_finish)
            turn.join(self.timeout_s)
            lasted = time.time() - t0
            if f"{sid}-t1" in self.result.outputs:
                self._reference_turn(f"{sid}-t1", prompt, self.max_new)
            # Arrive as the session's KV waits for each rank's reap tick.
            self._wave([(f"{sid}-b{j}", p) for j, p in enumerate(burst)])
            time.sleep(1.2)  # past every rank's tick: the next round starts from agreement

    def _flush_timeout(self) -> None:
        prefix = _tokens(self.rng, 64, self.vocab)
        lasted = None  # how long the previous long request took, client side
        for i in range(self.count):
            if self._stop.is_set():
                return
            self._wave([(f"f{i:03d}-a", prefix + _tokens(self.rng, 16, self.vocab))])
            long_rid = f"f{i:03d}-long"
            prompt = _tokens(self.rng, 24, self.vocab)
            long_new = max(self.max_new, 48)
            turn = threading.Thread(
                target=self._generate,
                name="hicache-diag-long",
                args=(long_rid, prompt, long_new),
                daemon=True,
            )
            t0 = time.time()
            turn.start()
            time.sleep(FLUSH_AFTER_S)
            # The deadline is swept across the moment the long request should end (the last
            # one's length; a short guess in the first round), so that some round's ranks meet
            # it about when they go idle.
            expected = (lasted - FLUSH_AFTER_S) if lasted else 0.1
            lo, hi = FLUSH_SWEEP_S
            offset = lo + (hi - lo) * (i - 1) / max(1, self.count - 2) if i else 0.0
            self._flush(max(0.05, expected + offset))
            turn.join(self.timeout_s)
            lasted = time.time() - t0  # (its output is not referenced: 48 steps cost minutes)
            self._wave([(f"f{i:03d}-b", prefix + _tokens(self.rng, 16, self.vocab))])

    def _overload(self) -> None:
        """Open-loop arrivals faster than one-at-a-time service: the waiting queue holds requests
        of every age, so a waiting timeout (SGLANG_REQ_WAITING_TIMEOUT) keeps meeting a request
        right at its deadline on each rank's own clock, as under a production overload."""
        threads = []
        gap = OVERLOAD_GAP_S
        for i in range(self.count):
            if self._stop.is_set():
                break
            ids = _tokens(self.rng, 32, self.vocab)
            if i == 0:  # alone: how fast this server answers one request
                t0 = time.time()
                self._turn(f"o{i:03d}", ids)
                gap = min(OVERLOAD_GAP_S, (time.time() - t0) / OVERLOAD_RATIO)
                self._event("overload_gap", gap_s=round(gap, 3))
                continue
            turn = threading.Thread(
                target=self._turn,
                args=(f"o{i:03d}", ids),
                name="hicache-diag-overload",
                daemon=True,
            )
            turn.start()
            threads.append(turn)
            time.sleep(gap)
        for turn in threads:
            turn.join(self.timeout_s)

    # -- helpers -----------------------------------------------------------------------------
    def _turn(self, rid: str, ids: list[int]) -> None:
        if self._generate(rid, ids, self.max_new) is not None:
            self._reference_turn(rid, ids, self.max_new)

    def _wave(self, reqs: list[tuple[str, list[int]]]) -> None:
        def one(k: int) -> None:
            self._turn(*reqs[k])

        self._threads(one, len(reqs))

    def _threads(self, fn, n: int) -> None:
        threads = [threading.Thread(target=fn, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def make_client(cfg: Any, url: str, requests: list[Any], timeout_s: float) -> WorkloadClient:
    """The client of `cfg.workload`: a plain wave client, or a scripted one."""
    wl = cfg.workload
    if wl.workload not in SESSION_WORKLOADS:
        return WorkloadClient(url, requests, cfg.spec.pp_size, timeout_s)
    return ScriptedClient(
        url,
        requests,
        wl.workload,
        count=wl.requests,
        max_new_tokens=wl.max_new_tokens,
        vocab=cfg.vocab_size,
        seed=wl.seed,
        timeout_s=timeout_s,
    )
