"""NCCL-era stacks for the wait-site rules: a rank under NCCL blocks at a CUDA host sync, later
than the collective it launched.

PUBLIC: lines machine-printed in public threads, kept as printed (the thread's URL beside
them; people's prose left out). Where a paste was cut short the lines stop there.

SGLANG: py-spy text of SGLang 0.5.23's scheduler thread where its code waits on CUDA
(batch_result_processor.py `result.copy_done.synchronize()`, scheduler_pp_mixin.py
`d2h_event.synchronize()`) or in a HiCache gloo collective, with torch 2.13's frames: built from
the two codebases' own source (every SGLang frame's line is checked against 0.5.23 by
test_nccl_wait_sites.py), decorator wrappers left out. No GPU has run them.
"""

from __future__ import annotations

# -- public threads ---------------------------------------------------------------------------

# A training process hung on a CUDA host sync (the thread's title names cudaStreamSynchronize):
# py-spy shows only the Python frame that called it, active; gdb shows the native wait.
RETURNN_1811 = "https://github.com/rwth-i6/returnn/issues/1811"
RETURNN_1811_PYSPY = """\
Thread 367714 (active): "MainThread"
    ctc_loss (torch/nn/functional.py:3086)
    ctc_loss (returnn/returnn/torch/frontend/_backend.py:748)
    ctc_loss (returnn/returnn/frontend/loss.py:98)
    aed_training (denoising_lm_aed_2024/models/aed_v3.py:207)
    _returnn_train_step (i6_experiments/users/zeyer/train_v4.py:248)
    _run_step (returnn/returnn/torch/engine.py:932)
    train_epoch (returnn/returnn/torch/engine.py:465)
    train (returnn/returnn/torch/engine.py:269)
    execute_main_task (returnn/returnn/__main__.py:543)
    main (returnn/returnn/__main__.py:744)
    <module> (returnn/rnn.py:11)
"""
RETURNN_1811_GDB = """\
#0  0x000014e37c579940 in clock_gettime@plt () from /lib64/libcuda.so.1
#1  0x000014e37c724994 in ?? () from /lib64/libcuda.so.1
#2  0x000014e37c63fd8c in ?? () from /lib64/libcuda.so.1
#3  0x000014e37c6ecb42 in ?? () from /lib64/libcuda.so.1
#4  0x000014e37d112375 in ?? () from /lib64/libcuda.so.1
#5  0x000014e37c780e67 in ?? () from /lib64/libcuda.so.1
#6  0x000014e4468293a5 in ?? ()
   from /home/az668407/work/py-envs/py3.12-torch2.7/lib/python3.12/site-packages/torch/lib/../../nvidia/cuda_runtime/lib/libcudart.so.12
#7  0x000014e44688a7d8 in cudaStreamSynchronize ()
"""  # noqa: E501

# Multi-node NCCL training hung at torch.cuda.synchronize(); every rank but one waited in
# cudaDeviceSynchronize, the odd one in `.item()`'s copy of a scalar to the host (gdb).
PYTORCH_95944 = "https://github.com/pytorch/pytorch/issues/95944"
PYTORCH_95944_GDB = """\
#12 0x000014cdd8a4d4f9 in ?? () from /g/data/z00/yxs900/installation/cuda/11.3.0/lib64/libcudart.so.11.0
#13 0x000014cdd8a21f6d in ?? () from /g/data/z00/yxs900/installation/cuda/11.3.0/lib64/libcudart.so.11.0
#14 0x000014cdd8a6cf36 in cudaMemcpyAsync () from /g/data/z00/yxs900/installation/cuda/11.3.0/lib64/libcudart.so.11.0
#15 0x000014cdb53ae194 in at::native::_local_scalar_dense_cuda(at::Tensor const&)::{lambda()#1}::operator()() const [clone .isra.100] ()
"""  # noqa: E501

# NCCL hang in DistributedDataParallel's constructor: `.item()` on the result of the parameter
# check's collective (c10d::verify_params_across_processes), gdb frames as pasted (its pager
# line included).
NCCL_719 = "https://github.com/NVIDIA/nccl/issues/719"
NCCL_719_GDB = """\
#22 0x00007fd2dc558360 in at::_ops::_local_scalar_dense::call(at::Tensor const&) () from /root/anaconda3/envs/test/lib/python3.8/site-packages/torch/lib/libtorch_cpu.so
#23 0x00007fd2dbea01cb in at::native::item(at::Tensor const&) () from /root/anaconda3/envs/test/lib/python3.8/site-packages/torch/lib/libtorch_cpu.so
#24 0x00007fd2dc9f932d in c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoFunctor_<c10::CompileTimeFunctionPointer<c10::Scalar (at::Tensor const&), &at::(anonymous namespace)::(anonymous namespace)::wrapper__item>, c10::Scalar, c10::guts::typelist::typelist<at::Te---Type <return> to continue, or q <return> to quit---
nsor const&> >, c10::Scalar (at::Tensor const&)>::call(c10::OperatorKernel*, c10::DispatchKeySet, at::Tensor const&) () from /root/anaconda3/envs/test/lib/python3.8/site-packages/torch/lib/libtorch_cpu.so
#25 0x00007fd2dc428130 in at::_ops::item::call(at::Tensor const&) () from /root/anaconda3/envs/test/lib/python3.8/site-packages/torch/lib/libtorch_cpu.so
#26 0x00007fd2dcdf9942 in int at::Tensor::item<int>() const () from /root/anaconda3/envs/test/lib/python3.8/site-packages/torch/lib/libtorch_cpu.so
#27 0x00007fd2dea2d50b in c10d::verify_params_across_processes(c10::intrusive_ptr<c10d::ProcessGroup, c10::detail::intrusive_target_default_null_type<c10d::ProcessGroup> > const&, std::vector<at::Tensor, std::all
"""  # noqa: E501

# -- SGLang 0.5.23's own code paths -----------------------------------------------------------

_SRT = "/usr/local/lib/python3.12/dist-packages/sglang/srt"
_TORCH = "/usr/local/lib/python3.12/dist-packages/torch"
_LOOP_TAIL = f"""\
    _dispatch_event_loop_once ({_SRT}/managers/scheduler.py:{{once}})
    dispatch_event_loop ({_SRT}/managers/scheduler.py:6215)
    run_event_loop ({_SRT}/managers/scheduler.py:2010)
    run_scheduler_process ({_SRT}/managers/scheduler.py:6368)
"""


def _dump(pid: int, title: str, frames: str, state: str = "active") -> str:
    return f'Process {pid}: {title}\n\nThread {pid} ({state}): "MainThread"\n{frames}\n'


# The overlap loop's TP rank waiting for the previous step's sampled tokens: the copy that
# follows the step's forward on the CUDA stream (its TP all-reduces are NCCL kernels there).
DECODE_COPY_SYNC = (
    f"""\
    synchronize ({_TORCH}/cuda/streams.py:254)
    process_batch_result_decode ({_SRT}/managers/scheduler_components/batch_result_processor.py:958)
    process_batch_result ({_SRT}/managers/scheduler.py:5092)
    pop_and_process ({_SRT}/managers/scheduler.py:2071)
    event_loop_overlap ({_SRT}/managers/scheduler.py:2120)
"""
    + _LOOP_TAIL.format(once=6231)
).rstrip("\n")

# The same loop's prefill result (a rank whose batch differs from its TP peers' decode).
PREFILL_COPY_SYNC = (
    DECODE_COPY_SYNC.replace("process_batch_result_decode (", "process_batch_result_prefill (")
    .replace("batch_result_processor.py:958", "batch_result_processor.py:268")
    .replace("scheduler.py:5092", "scheduler.py:5099")
)

# A TP rank in UnifiedRadixCache's write-ack MIN over the TP group (a gloo all_reduce on the
# CPU group), before the step's forward is launched.
HICACHE_WRITE_MIN = (
    f"""\
    all_reduce ({_TORCH}/distributed/distributed_c10d.py:3252)
    wrapper ({_TORCH}/distributed/c10d_logger.py:83)
    _all_reduce_attn_groups ({_SRT}/mem_cache/unified_radix_cache.py:362)
    _all_reduce ({_SRT}/mem_cache/unified_radix_cache.py:386)
    writing_check ({_SRT}/mem_cache/unified_radix_cache.py:3503)
    check_hicache_events ({_SRT}/mem_cache/unified_radix_cache.py:3682)
    _process_hicache_events ({_SRT}/managers/scheduler.py:3889)
    get_next_batch_to_run ({_SRT}/managers/scheduler.py:3898)
    event_loop_overlap ({_SRT}/managers/scheduler.py:2084)
"""
    + _LOOP_TAIL.format(once=6231)
).rstrip("\n")

# The PP loop: a stage waiting for its micro-batch's outputs to reach the host, and the next
# stage waiting (gloo) for the proxy tensors' metadata from it.
PP_D2H_SYNC = (
    f"""\
    synchronize ({_TORCH}/cuda/streams.py:254)
    event_loop_pp ({_SRT}/managers/scheduler_pp_mixin.py:192)
"""
    + _LOOP_TAIL.format(once=6227)
).rstrip("\n")
PP_PROXY_RECV = (
    f"""\
    recv_object ({_SRT}/distributed/parallel_state.py:1684)
    recv_tensor_dict ({_SRT}/distributed/parallel_state.py:1862)
    _pp_recv_typed_dict ({_SRT}/managers/scheduler_pp_mixin.py:908)
    _pp_recv_proxy_tensors ({_SRT}/managers/scheduler_pp_mixin.py:931)
    event_loop_pp ({_SRT}/managers/scheduler_pp_mixin.py:158)
"""
    + _LOOP_TAIL.format(once=6227)
).rstrip("\n")

# torch.cuda.synchronize() (a device-wide wait: the NCCL stream's kernels too), at start-up.
DEVICE_SYNC = f"""\
    synchronize ({_TORCH}/cuda/__init__.py:1219)
    compute_post_capture_kv_resize ({_SRT}/model_executor/model_runner_components/kv_pool_runtime.py:68)"""  # noqa: E501

SGLANG_FRAMES = (
    DECODE_COPY_SYNC,
    PREFILL_COPY_SYNC,
    HICACHE_WRITE_MIN,
    PP_D2H_SYNC,
    PP_PROXY_RECV,
    DEVICE_SYNC,
)


def tp_dump(tp: int, frames: str, state: str = "active") -> str:
    return _dump(1000 + tp, f"sglang::scheduler_TP{tp}", frames, state)


def pp_dump(pp: int, frames: str, state: str = "active") -> str:
    return _dump(2000 + pp, f"sglang::scheduler_PP{pp}", frames, state)
