# ruff: noqa: E501, W291 - machine-printed lines are kept as printed: long, some padded
"""Log text from public SGLang and vLLM issue threads that the corpus (samples/corpus) does not
cite, one case per emitter kind: the machine-printed lines as printed (a title or excerpt cut
where the thread cut it), with provenance beside them. Left out: people's prose, the commands
they typed, and the code lines Python prints under each frame (source, not log)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PublicCase:
    repo: str
    number: int
    url: str
    emitter: str  # the emitter triage must name (triage.emitters.Emitter value)
    kind: str  # the verdict's kind
    text: str
    note: str = ""


HTTP_ASGI_SGLANG = PublicCase(
    "sgl-project/sglang",
    7083,
    "https://github.com/sgl-project/sglang/issues/7083",
    "http-server",
    "unknown",
    """\
[2025-06-11 06:19:30] INFO:     172.20.0.1:40106 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error
[2025-06-11 06:19:30] ERROR:    Exception in ASGI application
Traceback (most recent call last):
  File "/root/anaconda3/envs/sglang/lib/python3.12/site-packages/uvicorn/protocols/http/h11_impl.py", line 403, in run_asgi
  File "/root/anaconda3/envs/sglang/lib/python3.12/site-packages/uvicorn/middleware/proxy_headers.py", line 60, in __call__
""",
    "the excerpt ends inside the traceback",
)

HTTP_ASGI_UVICORN = PublicCase(
    "sgl-project/sglang",
    499,
    "https://github.com/sgl-project/sglang/issues/499",
    "http-server",
    "unknown",
    """\
ERROR:    Exception in ASGI application
Traceback (most recent call last):
  File "/usr/local/lib/python3.10/dist-packages/uvicorn/protocols/http/httptools_impl.py", line 399, in run_asgi
  File "/usr/local/lib/python3.10/dist-packages/uvicorn/middleware/proxy_headers.py", line 70, in __call__
  File "/usr/local/lib/python3.10/dist-packages/fastapi/applications.py", line 1054, in __call__
  File "/usr/local/lib/python3.10/dist-packages/starlette/applications.py", line 123, in __call__
  File "/usr/local/lib/python3.10/dist-packages/starlette/middleware/errors.py", line 186, in __call__
  File "/usr/local/lib/python3.10/dist-packages/starlette/middleware/errors.py", line 164, in __call__
  File "/usr/local/lib/python3.10/dist-packages/starlette/middleware/exceptions.py", line 65, in __call__
  File "/usr/local/lib/python3.10/dist-packages/starlette/_exception_handler.py", line 64, in wrapped_app
""",
    "uvicorn's own format, no SGLang prefix; the excerpt ends inside the traceback",
)

SERVED_ON_SGLANG = PublicCase(
    "sgl-project/sglang",
    2431,
    "https://github.com/sgl-project/sglang/issues/2431",
    "scheduler",
    "healthy",
    """\
[2024-12-10 21:23:37 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=20.45 GB
[2024-12-10 21:23:37 TP0] Memory pool end. avail mem=1.66 GB
[2024-12-10 21:23:37 TP0] Capture cuda graph begin. This can take up to several minutes.
[2024-12-10 21:23:38 TP0] max_total_num_tokens=578385, max_prefill_tokens=16384, max_running_requests=2260, context_len=131072
[2024-12-10 21:23:39] INFO:     Started server process [2393459]
[2024-12-10 21:23:39] INFO:     Waiting for application startup.
[2024-12-10 21:23:39] INFO:     Application startup complete.
[2024-12-10 21:23:39] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)
[2024-12-10 21:23:39] INFO:     127.0.0.1:37630 - "GET /v1/models HTTP/1.1" 200 OK
[2024-12-10 21:23:40] INFO:     127.0.0.1:37642 - "GET /get_model_info HTTP/1.1" 200 OK
[2024-12-10 21:23:40 TP0] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, cache hit rate: 0.00%, token usage: 0.00, #running-req: 0, #queue-req: 0
[2024-12-10 21:23:40] INFO:     127.0.0.1:37646 - "POST /generate HTTP/1.1" 200 OK
[2024-12-10 21:23:40] The server is fired up and ready to roll!
[2024-12-10 21:23:44] INFO:     127.0.0.1:37648 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error
[2024-12-10 21:23:44] ERR
""",
    "the OpenAI adapter answered 500 and the server served on; the excerpt ends mid-line",
)

DETOKENIZER_SGLANG = PublicCase(
    "sgl-project/sglang",
    9329,
    "https://github.com/sgl-project/sglang/issues/9329",
    "tokenizer",
    "crash",
    """\
2025-08-15 14:25:48] DetokenizerManager hit an exception: Traceback (most recent call last):
  File "/nvme1/zhouxinyu/miniconda3/envs/sglang-intern/lib/python3.10/site-packages/sglang/srt/managers/detokenizer_manager.py", line 275, in run_detokenizer_process
  File "/nvme1/zhouxinyu/miniconda3/envs/sglang-intern/lib/python3.10/site-packages/sglang/srt/managers/detokenizer_manager.py", line 110, in event_loop
  File "/nvme1/zhouxinyu/miniconda3/envs/sglang-intern/lib/python3.10/site-packages/sglang/utils.py", line 479, in __call__
""",
    "the paste lost the stamp's `[`; the excerpt ends inside the traceback",
)

BENCH_CLIENT_CUT = PublicCase(
    "sgl-project/sglang",
    4161,
    "https://github.com/sgl-project/sglang/issues/4161",
    "client",
    "unknown",
    """\
#Input tokens: 468000
#Output tokens: 216000
Starting initial single prompt test run...
Traceback (most recent call last):
  File "<frozen r
""",
    "sglang.bench_serving's output (its Namespace line left out); the excerpt ends mid-frame",
)

BENCH_CLIENT_FRAMES = PublicCase(
    "sgl-project/sglang",
    6497,
    "https://github.com/sgl-project/sglang/issues/6497",
    "client",
    "unknown",
    """\
#Input tokens: 964
#Output tokens: 40
Starting warmup with 1 sequences...
Warmup completed with 1 sequences. Starting main benchmark run...
100%|███████████████████████████████████████████████████████████████████████████████████████████████████████████████████████| 4/4 [00:00<00:00,  6.27it/s]
Traceback (most recent call last):
  File "/sgl-workspace/sglang/./python/sglang/bench_serving.py", line 2503, in <module>
""",
    "the excerpt ends inside the traceback",
)

VLLM_SHM_WAIT = PublicCase(
    "vllm-project/vllm",
    27313,
    "https://github.com/vllm-project/vllm/issues/27313",
    "scheduler",
    "hang",
    """\
(EngineCore_DP0 pid=77352) INFO 10-22 09:43:49 [shm_broadcast.py:466] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or d
""",
    "the line as the issue's title quotes it (cut at GitHub's title length)",
)

VLLM_SHM_WAIT_SERVING = PublicCase(
    "vllm-project/vllm-omni",
    2928,
    "https://github.com/vllm-project/vllm-omni/issues/2928",
    "scheduler",
    "hang",
    """\
(APIServer pid=81599) INFO:     127.0.0.1:56038 - "GET /v1/videos/video_gen_de253511289c4d00ab6fd40c7e341522 HTTP/1.1" 200 OK
(APIServer pid=81599) INFO 04-18 01:08:52 [shm_broadcast.py:681] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).
(APIServer pid=81599) INFO:     127.0.0.1:56038 - "GET /v1/videos/video_gen_de253511289c4d00ab6fd40c7e341522 HTTP/1.1" 200 OK
(APIServer pid=81599) INFO:     127.0.0.1:56038 - "GET /v1/videos/video_gen_de253511289c4d00ab6fd40c7e341522 HTTP/1.1" 200 OK
(APIServer pid=81599) INFO:     127.0.0.1:56038 - "GET /v1/videos/video_gen_de253511289c4d00ab6fd40c7e341522 HTTP/1.1" 200 OK
""",
    "after a 14 h run: the status polls are answered while the work waits",
)

VLLM_RPC_TIMEOUT = PublicCase(
    "vllm-project/vllm",
    21899,
    "https://github.com/vllm-project/vllm/issues/21899",
    "scheduler",
    "hang",
    """\
ERROR 08-28 06:06:54 [core.py:502]   File "/home/user/miniconda/envs/vlm/lib/python3.10/site-packages/vllm/v1/engine/core.py", line 207, in execute_model     
RROR 08-28 06:06:54 [core.py:502]   File "/home/user/miniconda/envs/vlm/lib/python3.10/site-packages/vllm/v1/executor/multiproc_executor.py", line 158, in ex
ecute_model                              
ERROR 08-28 06:06:54 [core.py:502]   File "/home/user/miniconda/envs/vlm/lib/python3.10/site-packages/vllm/v1/executor/multiproc_executor.py", line 221, in co
llective_rpc                             
ERROR 08-28 06:06:54 [core.py:502] TimeoutError: RPC call to execute_model timed out.                                                                                
Process EngineCore_0:                    
Traceback (most r
""",
    "terminal-wrapped and padded as pasted, one level name cut to `RROR`",
)

VLLM_ENGINE_CORE_FATAL = PublicCase(
    "vllm-project/vllm",
    19668,
    "https://github.com/vllm-project/vllm/issues/19668",
    "scheduler",
    "crash",
    """\
ERROR 06-15 13:57:57 [core.py:517] EngineCore encountered a fatal error.
ERROR 06-15 13:57:57 [core.py:517] Traceback (most recent call last):
ERROR 06-15 13:57:57 [core.py:517]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/multiproc_executor.py", line 220, in collective_rpc
""",
    "the excerpt ends inside the traceback",
)

# SGLang's HiCache thread as py-spy named it in a public dump (sglang#12076: `Thread 12814
# (idle): "Thread-8 (backup_thread_func)"`); no public thread shows its death, so the header
# below is Python's threading.excepthook wording around that name.
BACKUP_THREAD_NAME = "Thread-8 (backup_thread_func)"

CASES = (
    HTTP_ASGI_SGLANG,
    HTTP_ASGI_UVICORN,
    SERVED_ON_SGLANG,
    DETOKENIZER_SGLANG,
    BENCH_CLIENT_CUT,
    BENCH_CLIENT_FRAMES,
    VLLM_SHM_WAIT,
    VLLM_SHM_WAIT_SERVING,
    VLLM_RPC_TIMEOUT,
    VLLM_ENGINE_CORE_FATAL,
)
