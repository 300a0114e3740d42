"""The end-to-end half of an export: the run's `sglang.launch_server` flags as a shell script and
its request sequence (regenerated from the manifest's workload and seed), sent by a stdlib-only
client that reports the first scheduler traceback in the server log."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from hicache_diag import evidence as ev
from hicache_diag.errors import RunDirError
from hicache_diag.evidence.files import MAX_JSON_BYTES, read_text
from hicache_diag.export.case import Case

# Flags the harness adds for a CPU host (docs/sglang-engine.md); a GPU host drops them.
CPU_FLAGS = {
    "--device": 1,
    "--attention-backend": 1,
    "--disable-cuda-graph": 0,
    "--hicache-io-backend": 1,
    "--hicache-mem-layout": 1,
}
# Flags the script sets itself.
OWN_FLAGS = {"--model-path": 1, "--host": 1, "--port": 1}


def split_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the run's server flags, its CPU-only flags), without the interpreter, `-m
    sglang.launch_server`, the model path, host and port."""
    try:
        start = argv.index("sglang.launch_server") + 1
    except ValueError:
        start = 0
    flags, cpu, i = [], [], start
    while i < len(argv):
        arg = argv[i]
        takes = CPU_FLAGS.get(arg, OWN_FLAGS.get(arg))
        if arg in CPU_FLAGS:
            cpu += argv[i : i + 1 + takes]
        elif arg not in OWN_FLAGS:
            flags.append(arg)
            takes = 0
        i += 1 + (takes or 0)
    return flags, cpu


def scripted(case: Case) -> bool:
    """The run drove SGLang's session or flush endpoints from a script (`script.json`), which
    the plain-generate client here does not replay."""
    from hicache_diag.options.workloads import _KINDS

    return case.workload.get("workload") not in _KINDS


def requests(case: Case) -> list[dict]:
    from hicache_diag.options.workloads import Pool, Workload, WorkloadConfig

    if scripted(case):
        return []

    spec = _spec(case)
    vocab = int((case.model_config or {}).get("vocab_size") or 512)
    total = int(spec.get("max_total_tokens") or 256)
    fields = {
        k: case.workload[k]
        for k in ("workload", "requests", "max_new_tokens", "seed")
        if k in case.workload
    }
    made = Workload(WorkloadConfig(**fields), Pool(total, total, vocab)).requests
    return [
        {"rid": r.rid, "input_ids": list(r.input_ids), "max_new_tokens": r.max_new_tokens}
        for r in made
    ]


def _spec(case: Case) -> dict:
    """The run's launch spec from its manifest ({} when the manifest lacks one)."""
    try:
        spec = ev.read_record(ev.Manifest, case.run_dir / ev.MANIFEST).config.get("spec")
    except (OSError, ValueError, AttributeError):
        return {}
    return spec if isinstance(spec, dict) else {}


def _storage_dir(case: Case) -> str | None:
    spec = _spec(case)
    return spec.get("hicache_storage_dir") if spec.get("hicache_storage_backend") else None


def _server_env(case: Case) -> list[tuple[str, str]]:
    """The SGLang switches the run set in the server's environment (`--sglang-env`)."""
    return [(str(k), str(v)) for k, v in _spec(case).get("env") or ()]


def _pp_size(flags: list[str]) -> int:
    return int(flags[flags.index("--pp-size") + 1]) if "--pp-size" in flags else 1


_USAGE = (
    "#   PYTHON  the interpreter with that SGLang (default: python)",
    "#   MODEL   a model directory (REPORT.md says which model the run served)",
    "#   GPU=1   leave out the run's CPU-only flags",
    "# Exit: 1 a scheduler raised (reproduced; its traceback is printed), 0 it did not.",
    "# CPU host whose torchvision wheel does not match torch (`torchvision::nms does not",
    "# exist` at `import sglang`): conftest.py here neutralises it for the unit test only.",
    "set -euo pipefail",
    'HERE=$(cd "$(dirname "$0")" && pwd)',
    "PYTHON=${PYTHON:-python}",
    "MODEL=${MODEL:?set MODEL to a model directory (see REPORT.md)}",
    "PORT=${PORT:-30000}",
    "LOG=${LOG:-$HERE/server.log}",
)


def script(case: Case, title: str) -> str:
    flags, cpu = split_flags(case.server_argv)
    q = " ".join(shlex.quote(f) for f in flags)
    cq = " ".join(shlex.quote(f) for f in cpu)
    ranks = _pp_size(flags)
    storage = _storage_dir(case)
    lines = [
        "#!/usr/bin/env bash",
        f"# {title}: SGLang {case.version}, end to end.",
        f"# Exported by hicache-diag from run {case.run_dir.name}; see REPORT.md.",
        *_USAGE,
        f"FLAGS=({q})",
        f"CPU_FLAGS=({cq})",
        'if [ "${GPU:-0}" = 1 ]; then CPU_FLAGS=(); else',
        "  export SGLANG_USE_CPU_ENGINE=1",
        "  export SGLANG_CPU_OMP_THREADS_BIND=${SGLANG_CPU_OMP_THREADS_BIND:-"
        + "|".join(str(r) for r in range(ranks))
        + "}",
        "fi",
    ]
    if scripted(case):
        lines.append(
            f"# This run's workload ({case.workload.get('workload')}) drove sessions or "
            "/flush_cache (script.json); requests.json is empty, so this only starts "
            "the server with the run's flags."
        )
    lines += [f"export {name}={shlex.quote(val)}" for name, val in _server_env(case)]
    if storage:
        lines.append(
            "export SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR="
            "${SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR:-$HERE/l3}"
        )
    lines += [
        'setsid "$PYTHON" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 \\',
        '  --port "$PORT" "${FLAGS[@]}" "${CPU_FLAGS[@]}" >"$LOG" 2>&1 &',
        "SERVER=$!",
        "trap 'kill -- -$SERVER 2>/dev/null || true' EXIT",
        '"$PYTHON" "$HERE/send_requests.py" --url "http://127.0.0.1:$PORT" \\',
        f'  --requests "$HERE/requests.json" --wave {ranks} --log "$LOG" --pid "$SERVER"',
        "",
    ]
    return "\n".join(lines)


def contents(case: Case, title: str) -> dict[str, str]:
    """File name -> text of the launch script, its request sender, the requests and, for a
    scripted workload, the run's own session/flush sequence as it sent it."""
    sender = (Path(__file__).parent / "templates" / "send_requests.py.tmpl").read_text()
    files = {
        "launch.sh": script(case, title),
        "send_requests.py": sender,
        "requests.json": json.dumps(requests(case), indent=None) + "\n",
    }
    if scripted(case) and (case.run_dir / "script.json").is_file():
        path = case.run_dir / "script.json"
        try:
            files["script.json"] = read_text(path, MAX_JSON_BYTES, tail=False)
        except (OSError, ValueError) as exc:
            raise RunDirError(f"{path} is unreadable: {exc}") from None
    return files
