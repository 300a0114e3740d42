"""The collector's recording part (cluster/collector.py), run on this machine through the local
executor as `triage --live --via local` runs it: the sessions found from the schedulers'
environment (their own, or the launcher's above them when setproctitle blanked theirs), the
dump request written, each rank's files shipped bounded and compressed; and the merge
(triage/cluster_recorded.py) that reads them as a local recording."""

from __future__ import annotations

import base64
import json
import time
import zlib

import pytest

from hicache_diag.cluster import collector
from hicache_diag.cluster.base import Sampling
from hicache_diag.cluster.fanout import fan_out
from hicache_diag.cluster.local import LocalExecutor
from hicache_diag.evidence import recording as rec
from hicache_diag.triage.cluster_live import judge
from hicache_diag.triage.cluster_merge import merge
from tests.unit.triage.recorded_ranks import RecordedRanks
from tests.unit.triage.recordings import record, small


def _only(results, pids: list[int]):
    """This test's ranks only: other schedulers may run on a shared machine."""
    for res in results:
        doc = res.doc or {}
        doc["processes"] = [p for p in doc.get("processes") or [] if p["pid"] in pids]
        mine = {p["recorded"][0] for p in doc["processes"] if p.get("recorded")}
        doc["recordings"] = [r for r in doc.get("recordings") or [] if r["session"] in mine]
    return results


def _collect(pids: list[int]):
    sampling = Sampling(time.time() + 0.3, samples=2, interval=0.3, deadline=5.0, budget=60.0)
    return _only(fan_out(LocalExecutor(), LocalExecutor().resolve(), sampling, 60.0), pids)


@pytest.mark.process
@pytest.mark.parametrize("own_env", [True, False], ids=["own-environ", "launcher-environ"])
def test_the_collector_ships_each_session_and_triage_reads_it(tmp_path, own_env):
    session = tmp_path / "s"
    with RecordedRanks(session, (100, 100), part=30, own_env=own_env) as ranks:
        [res] = _collect(ranks.pids)
        request = json.loads((session / rec.DUMP_REQUEST).read_text())
    assert res.ok, res.error
    procs = {p["pid"]: p for p in res.doc["processes"]}
    assert {pid: procs[pid]["recorded"] for pid in ranks.pids} == {
        ranks.pids[0]: [str(session), 0],
        ranks.pids[1]: [str(session), 1],
    }
    [shipped] = res.doc["recordings"]
    assert request["id"] == shipped["asked"][0]  # the request the ranks were asked
    assert {"rank0.meta.json", "rank0.jsonl", "rank0.digest.000000"} <= set(shipped["files"])
    assert any(n.startswith("rank1.dump-") for n in shipped["files"])  # its answer came back
    report = judge(merge([res]), 2, None, None)
    data = report.to_json()
    first = data["first_divergence"]
    assert (first["step"], first["field"], first["values"]) == (30, "extend_num_tokens", {
        "0": 8,
        "1": 5,
    })  # fmt: skip
    assert [(r["label"], r["last_step"], r["node"]) for r in data["recorded"]] == [
        ("local PP0 TP0", 100, "local"),
        ("local PP1 TP0", 100, "local"),
    ]


def _unpacked(files: dict, name: str) -> bytes:
    return zlib.decompress(base64.b64decode(files[name]))


def test_shipping_is_bounded_and_keeps_the_newest(tmp_path, monkeypatch):
    """Caps per kind: the newest whole lines, the newest whole 8-byte digests."""
    limits = small(lines_bytes=1 << 20, digest_segment_bytes=800)
    record(tmp_path, 1, 2000, limits=limits)  # 2000 steps: 16 kB of digests in 20 segments
    monkeypatch.setitem(collector.SHIP, "jsonl", (3000, 0, False))
    monkeypatch.setitem(collector.SHIP, "digest", (1000, 8, True))
    files = collector.ship(str(tmp_path), [])["files"]
    lines = _unpacked(files, "rank0.jsonl").decode().splitlines()
    assert 0 < len("\n".join(lines)) <= 3000 and json.loads(lines[-1])["step"] == 2000
    assert all(json.loads(ln) for ln in lines)  # cut at a line: every line whole
    digests = b"".join(_unpacked(files, n) for n in sorted(n for n in files if ".digest." in n))
    assert len(digests) == 1000 and len(digests) % 8 == 0
    steps = [rec.DIGEST.unpack_from(digests, i)[0] for i in range(0, len(digests), 8)]
    assert steps == list(range(2000 - 125 + 1, 2001))  # the newest 125 steps, in order
