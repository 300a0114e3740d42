"""The workload over HTTP: `/generate` with input ids, greedy, our request ids (ours).

Requests go out in waves of `wave` at a time, in the workload's arrival order, and a wave waits
for the previous one: earlier requests finish (and enter the tree) before later ones arrive,
which is what makes prefix reuse, eviction and host load-back happen, as in the builtin engine.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ClientResult:
    outputs: dict[str, list[int]] = field(default_factory=dict)
    cached: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # no answer: the run cannot decide
    # Answered with an abort the server decided (its waiting timeout: 503): a reply, no output.
    aborted: dict[str, str] = field(default_factory=dict)
    latency_s: dict[str, float] = field(default_factory=dict)
    completed_at: float = 0.0  # time of the last completion (progress for the hang watch)
    done: bool = False


# The scheduler's own abort of a turn whose session is gone (reaped on its timeout) or closing:
# `set_finish_with_abort` in handle_generate_request (0.5.23 scheduler.py:3094-3110), answered
# as HTTP 400. A session-timeout workload sends turns after the timeout on purpose.
_SESSION_ABORTS = ("Invalid request: session id ", "Invalid request: close was requested")


def abort_message(status: int, text: str) -> str | None:
    """The server's own abort of a request, from its reply, else None. SGLang answers an abort
    it decided (SGLANG_REQ_WAITING_TIMEOUT, a client abort) with the finish reason `abort` and
    its status code, 503 for the timeouts (scheduler.py `_abort_on_waiting_timeout`)."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        finish = (data.get("meta_info") or {}).get("finish_reason") or {}
        if isinstance(finish, dict) and finish.get("type") == "abort":
            return f"HTTP {status}: {finish.get('message')}"
        err = data.get("error")
        message = err.get("message") if isinstance(err, dict) else data.get("message")
        if status == 503 and message:
            return f"HTTP 503: {message}"
        if isinstance(message, str) and message.startswith(_SESSION_ABORTS):
            return f"HTTP {status}: {message}"
    return "HTTP 503: Service Unavailable" if status == 503 else None


def generate_one(
    url: str, rid: str, input_ids: Sequence[int], max_new_tokens: int, timeout_s: float
) -> dict[str, Any]:
    body = {
        "rid": rid,
        "input_ids": list(input_ids),
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        },
    }
    req = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


class WorkloadClient:
    """Runs the workload on a thread so the harness can watch the ranks meanwhile."""

    def __init__(self, url: str, requests: list[Any], wave: int, timeout_s: float) -> None:
        self.url, self.requests, self.wave, self.timeout_s = url, requests, wave, timeout_s
        self.result = ClientResult()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hicache-diag-client", daemon=True)

    def start(self) -> None:
        self.result.completed_at = time.time()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def outstanding(self) -> bool:
        return not self.result.done

    def _one(self, req: Any) -> None:
        t0 = time.time()
        try:
            data = generate_one(
                self.url, req.rid, req.input_ids, req.max_new_tokens, self.timeout_s
            )
            self.result.outputs[req.rid] = list(data.get("output_ids") or [])
            meta = data.get("meta_info") or {}
            self.result.cached[req.rid] = {
                "cached_tokens": meta.get("cached_tokens"),
                "details": meta.get("cached_tokens_details"),
            }
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            why = abort_message(exc.code, text)
            if why is not None:
                self.result.aborted[req.rid] = why
            else:
                self.result.errors[req.rid] = f"HTTP {exc.code}: {text.strip()[:200]}"
        except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
            self.result.errors[req.rid] = f"{type(exc).__name__}: {exc}"
        self.result.latency_s[req.rid] = round(time.time() - t0, 3)
        self.result.completed_at = time.time()

    def _run(self) -> None:
        try:
            with ThreadPoolExecutor(max_workers=self.wave) as pool:
                for i in range(0, len(self.requests), self.wave):
                    if self._stop.is_set():
                        break
                    list(pool.map(self._one, self.requests[i : i + self.wave]))
        finally:
            self.result.done = True
