#!/usr/bin/env bash
# Streaming sessions are released on each rank's own reap tick: SGLang 0.5.18, end to end.
# Exported by hicache-diag from run session-close; see REPORT.md.
#   PYTHON  the interpreter with that SGLang (default: python)
#   MODEL   a model directory (REPORT.md says which model the run served)
#   GPU=1   leave out the run's CPU-only flags
# Exit: 1 a scheduler raised (reproduced; its traceback is printed), 0 it did not.
# CPU host whose torchvision wheel does not match torch (`torchvision::nms does not
# exist` at `import sglang`): conftest.py here neutralises it for the unit test only.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python}
MODEL=${MODEL:?set MODEL to a model directory (see REPORT.md)}
PORT=${PORT:-30000}
LOG=${LOG:-$HERE/server.log}
FLAGS=(--pp-size 2 --tp-size 1 --page-size 1 --max-total-tokens 256 --enable-hierarchical-cache --hicache-write-policy write_through --skip-server-warmup --hicache-ratio 2.0 --enable-streaming-session)
CPU_FLAGS=(--device cpu --attention-backend torch_native --disable-cuda-graph --hicache-io-backend direct --hicache-mem-layout layer_first)
if [ "${GPU:-0}" = 1 ]; then CPU_FLAGS=(); else
  export SGLANG_USE_CPU_ENGINE=1
  export SGLANG_CPU_OMP_THREADS_BIND=${SGLANG_CPU_OMP_THREADS_BIND:-0|1}
fi
# This run's workload (session-close) drove sessions or /flush_cache (script.json); requests.json is empty, so this only starts the server with the run's flags.
setsid "$PYTHON" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 \
  --port "$PORT" "${FLAGS[@]}" "${CPU_FLAGS[@]}" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill -- -$SERVER 2>/dev/null || true' EXIT
"$PYTHON" "$HERE/send_requests.py" --url "http://127.0.0.1:$PORT" \
  --requests "$HERE/requests.json" --wave 2 --log "$LOG" --pid "$SERVER"
