"""Send an exported request sequence to an SGLang server, in waves, and report whether a
scheduler raised (the first traceback in the server log). Standard library only."""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def _get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _first_traceback(log):
    try:
        lines = open(log, errors="replace").read().splitlines()
    except OSError:
        return []
    for i, line in enumerate(lines):
        if "Scheduler hit an exception" in line or "Traceback (most recent call last)" in line:
            out = [line]
            for nxt in lines[i + 1 :]:
                out.append(nxt)
                if not nxt.startswith(" "):
                    break
            return out
    return []


def _one(url, req):
    body = {"rid": req["rid"], "input_ids": req["input_ids"],
            "sampling_params": {"max_new_tokens": req["max_new_tokens"], "temperature": 0.0,
                                "ignore_eos": True}}
    data = urllib.request.Request(url + "/generate", json.dumps(body).encode(),
                                  {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(data, timeout=300) as resp:
            return req["rid"], "ok", len(json.loads(resp.read()).get("output_ids") or [])
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return req["rid"], f"{type(exc).__name__}: {exc}", 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--requests", required=True)
    ap.add_argument("--wave", type=int, default=1)
    ap.add_argument("--log", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--ready-timeout", type=float, default=900)
    a = ap.parse_args()
    deadline = time.time() + a.ready_timeout
    while True:
        try:
            if _get(a.url + "/health") == 200:
                break
        except (urllib.error.URLError, OSError):
            pass
        if not _alive(a.pid) or time.time() > deadline:
            print("server did not become ready; log:", a.log, file=sys.stderr)
            print("\n".join(_first_traceback(a.log)), file=sys.stderr)
            return 2
        time.sleep(1)
    reqs = json.load(open(a.requests))
    with ThreadPoolExecutor(max_workers=a.wave) as pool:
        for i in range(0, len(reqs), a.wave):
            for rid, status, n in pool.map(lambda r: _one(a.url, r), reqs[i : i + a.wave]):
                print(f"{rid} {status} {n} tokens", flush=True)
            if _first_traceback(a.log):
                break
    time.sleep(2)
    tb = _first_traceback(a.log)
    if tb:
        print("reproduced: a scheduler raised", file=sys.stderr)
        print("\n".join(tb), file=sys.stderr)
        return 1
    print("not reproduced: every request was served and no scheduler raised", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
