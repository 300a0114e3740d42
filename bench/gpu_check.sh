#!/usr/bin/env bash
# The GPU checks of issue 37 (part 5), one script for one GPU, from a fresh checkout of this repo:
#   setup      pip install this repo and SGLang (the normal way) unless already there
#   gpu        what torch sees (and nvidia-smi)
#   record     the recorder on a real CUDA SGLang PP1 + HiCache server the user launches:
#              hicache-diag record --dir D -- python -m sglang.launch_server ..., a few requests
#   triage     hicache-diag triage --discover --json on that live server (its recording too)
#   dma-delay  a delayed copy on the real copy stream: run --engine sglang --device cuda
#              --fault dma-delay (PP1, load-backs late on rank 0); the verdict must say cuda
# One summary line per check ("gpu-check: NAME: ok|FAIL|skipped: ..."), the lines in
# summary.txt, every output under $OUT (default ./gpu-check-out): files to commit. Each step is
# bounded (timeout) and started in its own process group, reaped on every path (exit, error,
# Ctrl-C). The checks fit in GPU_CHECK_BUDGET_S (470 s) once SGLang is installed; a fresh
# install adds up to SETUP_TIMEOUT_S (300 s).
#
# Usage: bash bench/gpu_check.sh [--dry-run | --cpu] [--wheels DIR]
#   --dry-run    the plumbing on a CPU host: no install, a stand-in server (python -m
#                http.server) through the same launch, readiness, triage and reaping code, and
#                `run --device cuda`, which this host must refuse (exit 2, JSON)
#   --cpu        a rehearsal of the real path on a CPU host: the same server, recorder, triage
#                and dma-delay run with SGLang on the CPU (its CPU flags, the plugin's shims)
#   --wheels DIR install from a wheelhouse (pip --no-index --find-links DIR): a GPU host that
#                reaches no package index
# Environment: OUT, PYTHON (default python3), SGLANG_VERSION (0.5.23), GPU_CHECK_BUDGET_S,
#   GPU_CHECK_READY_S (the server's start-up bound: 180 s; 420 with --cpu), SETUP_TIMEOUT_S.
set -u -o pipefail

DRY=0
CPU=0
WHEELS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --cpu) CPU=1 ;;
        --wheels)
            [ $# -ge 2 ] || { echo "gpu_check: --wheels needs a directory" >&2; exit 2; }
            WHEELS=$2
            shift
            ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown argument '$1' (--dry-run, --cpu, --wheels DIR)" >&2; exit 2 ;;
    esac
    shift
done

[ "$DRY$CPU" = 11 ] && { echo "gpu_check: --dry-run or --cpu, not both" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT_DIR=${OUT:-./gpu-check-out}
mkdir -p "$OUT_DIR" || exit 2
OUT_DIR=$(cd "$OUT_DIR" && pwd)
# Run from the output folder: `python -m` puts the working directory first on sys.path, and a
# checkout's hicache_diag/ there would shadow the installed package's own mapping.
cd "$OUT_DIR" || exit 2
PY=${PYTHON:-python3}
HD=("$PY" -m hicache_diag.cli.main)
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
BUDGET=${GPU_CHECK_BUDGET_S:-470}
READY_S=${GPU_CHECK_READY_S:-180} # launch to /health_generate
SETUP_TIMEOUT=${SETUP_TIMEOUT_S:-300}
DEVICE=cuda
CUDA_RUN_ARGS=(--sglang-arg=--attention-backend=triton --sglang-arg=--disable-cuda-graph)
# How SGLang runs on each device: the tiny model's head size suits triton's kernels on CUDA
# (graph capture off: start-up time); on the CPU the flags `run` itself passes (launch_spec.py).
SGLANG_DEVICE_ARGS=(--attention-backend triton --disable-cuda-graph)
if [ "$CPU" = 1 ]; then
    DEVICE=cpu
    SGLANG_DEVICE_ARGS=(--device cpu --attention-backend torch_native --disable-cuda-graph
        --hicache-io-backend direct --hicache-mem-layout layer_first)
    CUDA_RUN_ARGS=()
    BUDGET=${GPU_CHECK_BUDGET_S:-900} # a shared 2-core box starts SGLang in minutes
    READY_S=${GPU_CHECK_READY_S:-420}
fi
SUMMARY="$OUT_DIR/summary.txt"
: >"$SUMMARY"
GROUPS_STARTED=()
STARTED=""
FAILED=0
CHECK_T0=$SECONDS
T0=$SECONDS

# -- bookkeeping ----------------------------------------------------------------------------

say() { # NAME STATUS DETAIL: the check's one summary line
    local line="gpu-check: $1: $2: $3 ($((SECONDS - CHECK_T0)) s)"
    echo "$line" | tee -a "$SUMMARY"
    [ "$2" = FAIL ] && FAILED=$((FAILED + 1))
    CHECK_T0=$SECONDS
}

left() { echo $((BUDGET - (SECONDS - T0))); }

bound() { # N: N seconds, or what is left of the budget
    local n=$1 l
    l=$(left)
    [ "$l" -lt "$n" ] && n=$l
    [ "$n" -lt 1 ] && n=1
    echo "$n"
}

reap_group() { # PGID: TERM, up to 10 s, then KILL, for the whole group
    local pgid=$1 _
    kill -0 -- "-$pgid" 2>/dev/null || return 0
    kill -TERM -- "-$pgid" 2>/dev/null
    for _ in $(seq 1 20); do
        kill -0 -- "-$pgid" 2>/dev/null || return 0
        sleep 0.5
    done
    kill -KILL -- "-$pgid" 2>/dev/null
    sleep 0.5
}

cleanup() {
    local pgid
    for pgid in ${GROUPS_STARTED[@]+"${GROUPS_STARTED[@]}"}; do reap_group "$pgid"; done
}
trap cleanup EXIT
trap 'echo "gpu-check: interrupted" | tee -a "$SUMMARY"; exit 130' INT TERM

start_group() { # LOG CMD...: CMD in a session of its own, in the background; its pid in
    # STARTED (not printed: a $(...) subshell would lose the group from the list cleanup reaps)
    local log=$1
    shift
    setsid "$@" >"$log" 2>&1 </dev/null &
    STARTED=$!
    disown "$STARTED" # reaped by group (reap_group), never waited for: no job-status noise
    GROUPS_STARTED+=("$STARTED")
}

run_bounded() { # SECS STDOUT STDERR CMD...: bounded, in its own group, reaped; its exit code
    local secs=$1 out=$2 err=$3 pid rc
    shift 3
    setsid timeout -k 15 -s INT "$secs" "$@" >"$out" 2>"$err" </dev/null &
    pid=$!
    GROUPS_STARTED+=("$pid")
    wait "$pid"
    rc=$?
    reap_group "$pid"
    return "$rc"
}

json_get() { # FILE KEY: one fact of a JSON file the checks write, or empty
    "$PY" - "$1" "$2" <<'EOF' 2>/dev/null
import json, sys
FACTS = {
    "count": lambda d: d["count"],
    "torch": lambda d: d["torch"],
    "names": lambda d: "".join(", " + n for n in d["names"]),
    "kind": lambda d: d.get("kind"),
    "ranks": lambda d: len(d.get("ranks") or []),
    "error": lambda d: d.get("error"),
    "outcome": lambda d: d.get("outcome"),
    "device": lambda d: d.get("device"),
    "faults": lambda d: "; ".join(e for e in d.get("evidence") or [] if "fault" in e)[:200],
    "recorded": lambda d: ", ".join(
        f"{r['label']} to step {r['last_step']}" + (f" (blind: {r['blind']})" if r.get("blind")
        else "") for r in d.get("recorded") or []) or "none",
}
try:
    value = FACTS[sys.argv[2]](json.load(open(sys.argv[1])))
    print("" if value is None else value)
except Exception:
    pass
EOF
}

wait_ready() { # URL SECS PID: 0 once URL answers 200, 1 when PID dies or time runs out
    "$PY" - "$1" "$2" "$3" <<'EOF'
import os, sys, time, urllib.request
url, secs, pid = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
end = time.time() + secs
while time.time() < end:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(1)
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            if r.status == 200:
                sys.exit(0)
    except Exception:
        pass
    time.sleep(1)
sys.exit(1)
EOF
}

free_port() {
    "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# -- the checks -----------------------------------------------------------------------------

check_setup() {
    local log="$OUT_DIR/setup.log" pip=("$PY" -m pip install -q) have
    [ -n "$WHEELS" ] && pip+=(--no-index --find-links "$WHEELS")
    have=$("$PY" -c 'import importlib.metadata as m; print(m.version("sglang"))' 2>/dev/null)
    if [ "$DRY" = 1 ]; then
        {
            echo "would run: ${pip[*]} sglang==$SGLANG_VERSION (here: sglang ${have:-none})"
            echo "would run: ${pip[*]} -e $REPO"
        } >"$log"
        say setup ok "dry run: no install (sglang ${have:-none} here)"
        return
    fi
    if [ "$have" != "$SGLANG_VERSION" ]; then
        run_bounded "$SETUP_TIMEOUT" "$log" "$log.err" "${pip[@]}" "sglang==$SGLANG_VERSION" || {
            say setup FAIL "pip install sglang==$SGLANG_VERSION failed: $(tail -n1 "$log.err")"
            return 1
        }
    fi
    if ! "$PY" -c 'import hicache_diag' 2>/dev/null; then
        run_bounded 180 "$log.tool" "$log.tool.err" "${pip[@]}" -e "$REPO" || {
            say setup FAIL "pip install -e $REPO failed: $(tail -n1 "$log.tool.err")"
            return 1
        }
    fi
    have=$("$PY" -c 'import importlib.metadata as m; print(m.version("sglang"))' 2>/dev/null)
    say setup ok "sglang $have, hicache-diag from $REPO"
}

check_gpu() {
    local probe='import json, torch
n = torch.cuda.device_count() if torch.version.cuda else 0
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "count": n,
                  "names": [torch.cuda.get_device_name(i) for i in range(n)]}))'
    run_bounded "$(bound 120)" "$OUT_DIR/gpu.json" "$OUT_DIR/gpu.err" "$PY" -c "$probe"
    timeout 20 nvidia-smi >"$OUT_DIR/nvidia-smi.txt" 2>&1
    {
        date -u +%Y-%m-%dT%H:%M:%SZ
        uname -srm
        "$PY" --version
        git -C "$REPO" rev-parse HEAD 2>/dev/null
        timeout 60 "$PY" -m pip list 2>/dev/null |
            grep -i -E '^(torch|sglang|sgl-kernel|flashinfer|nvidia-nccl|triton|py-spy) '
    } >"$OUT_DIR/env.txt" 2>&1
    GPUS=$(json_get "$OUT_DIR/gpu.json" count)
    local what
    what="torch $(json_get "$OUT_DIR/gpu.json" torch) sees ${GPUS:-?} GPU(s)"
    what+=$(json_get "$OUT_DIR/gpu.json" names)
    if [ "$DRY" = 1 ]; then
        say gpu ok "dry run: $what"
    elif [ "$CPU" = 1 ]; then
        say gpu skipped "CPU rehearsal: $what"
    elif [ "${GPUS:-0}" -ge 1 ] 2>/dev/null; then
        say gpu ok "$what"
    else
        say gpu FAIL "$what: $(tail -n1 "$OUT_DIR/gpu.err" 2>/dev/null)"
        return 1
    fi
}

tiny_model() { # the tool's tiny random Llama, built by this interpreter (cached)
    timeout "$(bound 120)" "$PY" - <<'EOF'
import importlib.metadata as md, sys
from hicache_diag.engines.sglang.model import default_model_dir
print(default_model_dir(sys.executable, md.version("transformers")))
EOF
}

drive() { # PORT N: N /generate requests sharing a prefix (HiCache's prefix reuse); prints done
    timeout "$(bound 120)" "$PY" - "$1" "$2" <<'EOF'
import json, sys, urllib.request
port, n, done = sys.argv[1], int(sys.argv[2]), 0
prefix = " ".join(["the cache keeps every page of this prompt"] * 12)
for i in range(n):
    body = {"text": f"{prefix} request {i % 4}", "sampling_params": {"max_new_tokens": 8,
            "temperature": 0}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            done += r.status == 200
    except Exception as exc:
        print(f"request {i}: {exc}", file=sys.stderr)
print(done)
EOF
}

check_record_and_triage() {
    local rec="$OUT_DIR/record" port pid model served cmd=() via rc kind ranks error
    local triage_args=()
    mkdir -p "$rec/sessions"
    port=$(free_port)
    via=()
    if "${HD[@]}" record --help >/dev/null 2>&1; then
        via=(record --dir "$rec/sessions")
        [ "$CPU" = 1 ] && via+=(--cpu-shims)
        via+=(--)
    fi
    if [ "$DRY" = 1 ]; then
        mkdir -p "$rec/stand-in" && : >"$rec/stand-in/health_generate"
        cmd=("$PY" -m http.server --bind 127.0.0.1 "$port" --directory "$rec/stand-in")
    else
        if [ ${#via[@]} -eq 0 ]; then
            say record FAIL "this tree has no 'hicache-diag record'"
            say triage skipped "no recorded server"
            return 1
        fi
        model=$(tiny_model 2>"$rec/model.err") || {
            say record FAIL "building the tiny model failed: $(tail -n1 "$rec/model.err")"
            say triage skipped "no recorded server"
            return 1
        }
        cmd=("$PY" -m sglang.launch_server --model-path "$model" --host 127.0.0.1
            --port "$port" --pp-size 1 --tp-size 1 --page-size 4 --max-total-tokens 512
            --enable-hierarchical-cache --hicache-ratio 2 --skip-server-warmup
            --watchdog-timeout 60 "${SGLANG_DEVICE_ARGS[@]}")
    fi
    if [ "$CPU" = 1 ]; then # what a user sets to run SGLang on the CPU (server.py does so)
        export SGLANG_USE_CPU_ENGINE=1 OMP_NUM_THREADS=1 SGLANG_CPU_OMP_THREADS_BIND=0
    fi
    if [ ${#via[@]} -gt 0 ]; then
        start_group "$rec/server.log" "${HD[@]}" "${via[@]}" "${cmd[@]}"
    else
        start_group "$rec/server.log" "${cmd[@]}"
    fi
    unset SGLANG_USE_CPU_ENGINE SGLANG_CPU_OMP_THREADS_BIND
    pid=$STARTED
    echo "$pid" >"$rec/server.pid"
    if ! wait_ready "http://127.0.0.1:$port/health_generate" "$(bound "$READY_S")" "$pid"; then
        say record FAIL "the server never answered /health_generate: $(tail -n1 "$rec/server.log")"
        say triage skipped "no live server"
        reap_group "$pid"
        return 1
    fi
    if [ "$DRY" = 1 ]; then
        served="dry run: a stand-in server (no requests)"
        [ ${#via[@]} -gt 0 ] && served+=" launched through 'record'"
    else
        served=$(drive "$port" 12 2>"$rec/requests.err")
        local sessions=("$rec"/sessions/*)
        served="$served/12 requests served; ${#sessions[@]} recording session(s)"
    fi
    say record ok "$served"
    if "${HD[@]}" triage --help 2>/dev/null | grep -q -- --record-dir; then
        triage_args=(--record-dir "$rec/sessions")
    fi
    run_bounded "$(bound 90)" "$rec/triage.json" "$rec/triage.err" \
        "${HD[@]}" triage --discover --parent "$pid" --json ${triage_args[@]+"${triage_args[@]}"}
    rc=$?
    kind=$(json_get "$rec/triage.json" kind)
    ranks=$(json_get "$rec/triage.json" ranks)
    error=$(json_get "$rec/triage.json" error)
    if [ "$DRY" = 1 ] && [ -n "$kind$error" ]; then
        say triage ok "dry run: exit $rc, ${kind:+kind $kind, }${error:-$ranks rank(s)}"
    elif [ "$rc" -eq 0 ] && [ "${ranks:-0}" -ge 1 ] 2>/dev/null; then
        say triage ok "exit 0, kind $kind, $ranks rank(s); recorded: $(json_get \
            "$rec/triage.json" recorded)"
    else
        say triage FAIL "exit $rc, kind ${kind:-?}: $(tail -n1 "$rec/triage.err")"
    fi
    reap_group "$pid"
}

check_dma_delay() {
    local run="$OUT_DIR/dma-delay" rc outcome device error
    mkdir -p "$run"
    run_bounded "$(bound 200)" "$run/run.json" "$run/run.err" \
        "${HD[@]}" run --engine sglang --device "$DEVICE" --pp 1 --requests 16 \
        --hang-timeout 60 --fault dma-delay:rank=0,ms=200,dir=load --out "$run/run" --json \
        ${CUDA_RUN_ARGS[@]+"${CUDA_RUN_ARGS[@]}"}
    rc=$?
    outcome=$(json_get "$run/run.json" outcome)
    device=$(json_get "$run/run.json" device)
    error=$(json_get "$run/run.json" error)
    if [ "$DRY" = 1 ]; then
        if [ "$rc" -eq 2 ] && [ -n "$error" ]; then
            say dma-delay ok "dry run: refused on this host (exit 2): $error"
        else
            say dma-delay FAIL "dry run: expected a refusal (exit 2, JSON), got exit $rc"
        fi
    elif [ "$device" = "$DEVICE" ] && [ -n "$outcome" ] && [ "$outcome" != undecided ] &&
        [ "$outcome" != interrupted ]; then
        say dma-delay ok "exit $rc, outcome $outcome on $device; $(json_get "$run/run.json" faults)"
    else
        say dma-delay FAIL "exit $rc, outcome ${outcome:-?}, device ${device:-?}:" \
            "${error:-$(tail -n1 "$run/run.err")}"
    fi
}

# -- the run --------------------------------------------------------------------------------

MODE=""
[ "$DRY" = 1 ] && MODE=" (dry run)"
[ "$CPU" = 1 ] && MODE=" (CPU rehearsal)"
echo "gpu-check: results in $OUT_DIR$MODE"
if check_setup && check_gpu; then
    check_record_and_triage
    if [ "$(left)" -gt 30 ]; then
        check_dma_delay
    else
        say dma-delay skipped "out of time ($(left) s left of $BUDGET)"
    fi
else
    for name in record triage dma-delay; do say "$name" skipped "setup or GPU failed"; done
fi
CHECK_T0=$T0
say total "$([ "$FAILED" = 0 ] && echo ok || echo FAIL)" "$FAILED check(s) failed"
[ "$FAILED" = 0 ]
