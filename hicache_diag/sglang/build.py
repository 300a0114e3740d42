"""Flags (+ scenario options) -> SglangRunConfig, every check done before anything starts."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_diag.errors import UsageError
from hicache_diag.harness.request import RunRequest
from hicache_diag.limits import check_async_depth, check_seconds, check_seed
from hicache_diag.runtime.server_args import (
    PREFETCH_POLICIES,
    STORAGE_BACKENDS,
    WRITE_POLICIES,
    WorkloadConfig,
    parse_size,
)
from hicache_diag.sglang.config import SglangRunConfig
from hicache_diag.sglang.defaults import DEFAULTS
from hicache_diag.sglang.server import LaunchSpec

if TYPE_CHECKING:
    from hicache_diag.sglang.install import SglangInstall

# Builtin-only flags: SGLang's protocol is whatever its release contains (docs/design.md §8).
_BUILTIN_ONLY = {"protocol": "--protocol", "fix": "--fix"}
_GIB = 1024**3


def _refuse_builtin_only(flags: dict[str, Any], scenario: dict[str, Any]) -> None:
    for key, flag in _BUILTIN_ONLY.items():
        if flags.get(key) or scenario.get(key):
            raise UsageError(
                f"{flag} is a builtin-engine switch; with --engine sglang the protocol is the "
                "one the installed SGLang release contains (pick a release with --sglang-python)"
            )


def _hicache_size_gb(text: Any) -> int:
    """SGLang's --hicache-size is whole gigabytes per rank; ours is bytes with a unit."""
    size = parse_size(text or "0")
    if size == 0:
        return 0
    if size % _GIB:
        raise UsageError(
            f"--hicache-size {text}: with --engine sglang the host pool is sized in whole GiB "
            "(SGLang's unit); use e.g. 1GiB, or --hicache-ratio for smaller pools"
        )
    return size // _GIB


def _choice(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise UsageError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")


def build(request: RunRequest) -> SglangRunConfig:
    """The sglang engine's `build(request)` (harness/engine.py): every check before launch."""
    from hicache_diag.harness.builtin import validated_faults
    from hicache_diag.harness.no_effect import refuse_no_effect
    from hicache_diag.harness.rundir import check_writable

    defaults = DEFAULTS
    check_writable(request.flags.get("out"))
    if request.given("max_steps") is not None:  # SGLang's server runs until its requests end
        raise UsageError("--max-steps applies to --engine builtin only")
    pp, tp = int(request.value("pp", defaults)), int(request.value("tp", defaults))
    faults = validated_faults(request, pp, tp)
    storage = request.value("hicache_storage_backend", defaults) != "none"
    refuse_no_effect(request.given_all(), faults, storage)
    return build_sglang_config(dict(request.flags), dict(request.scenario), faults,
                               lambda name: request.value(name, defaults))  # fmt: skip


def build_sglang_config(
    flags: dict[str, Any],
    scenario: dict[str, Any],
    faults: tuple[str, ...],
    value: Callable[[str], Any],
) -> SglangRunConfig:
    """`value(name)`: command line, then scenario, then the sglang engine's default."""
    _refuse_builtin_only(flags, scenario)
    env = _server_env(flags.get("sglang_env"), scenario.get("sglang_env"))

    ratio = float(value("hicache_ratio"))
    if not math.isfinite(ratio) or ratio <= 0:
        raise UsageError(f"--hicache-ratio must be a finite number > 0 (got {ratio})")
    backend = value("hicache_storage_backend")
    _choice("storage backend", backend, STORAGE_BACKENDS)
    _choice("write policy", value("hicache_write_policy"), WRITE_POLICIES)
    storage_dir = value("hicache_storage_dir")
    if storage_dir is not None and not str(storage_dir).strip():
        raise UsageError("--hicache-storage-dir '' is empty; give a path")
    if storage_dir and backend == "none":
        raise UsageError("--storage-dir does nothing without --storage-backend file")
    if storage_dir:
        from hicache_diag.runtime.mem_cache.hicache_storage import check_storage_dir

        check_storage_dir(storage_dir)
        storage_dir = str(Path(storage_dir).resolve())
    policy = flags.get("hicache_storage_prefetch_policy") or scenario.get(
        "hicache_storage_prefetch_policy"
    )
    if policy:
        _choice("prefetch policy", policy, PREFETCH_POLICIES)
    hang_timeout = float(value("hang_timeout"))
    check_seconds("--hang-timeout", hang_timeout)
    pp, tp, page = int(value("pp")), int(value("tp")), int(value("page_size"))
    max_total = int(value("max_total_tokens"))
    for name, v in (("--pp", pp), ("--tp", tp), ("--page-size", page)):
        if v < 1:
            raise UsageError(f"{name} must be >= 1 (got {v})")
    if max_total < 64 * page:
        raise UsageError(
            f"--max-total-tokens {max_total} is too small for SGLang (use >= {64 * page})"
        )
    device = value("device")
    install = _sglang_install(flags, scenario, cpu=device == "cpu")
    model, vocab = _model(flags.get("model") or scenario.get("model"), install, pp, tp)
    page, notes = _page_size_for(install, page, explicit=(flags.get("page_size") or
                                                          scenario.get("page_size")) is not None,
                                 cpu=device == "cpu")  # fmt: skip
    from hicache_diag.sglang.install import refuse_unhookable

    refuse_unhookable(install, faults)
    depth = int(value("async_depth") or 0)
    check_async_depth(depth)
    extra = tuple(flags.get("sglang_arg") or scenario.get("sglang_arg") or ()) + (
        ("--pp-async-batch-depth", str(depth)) if depth else ()
    )
    if flags.get("sglang_consensus_checker"):
        if not (install.package_dir / "srt" / "utils" / "rank_consensus_checker.py").is_file():
            raise UsageError(f"--sglang-consensus-checker: sglang {install.version} has no rank "
                             "consensus checker (srt/utils/rank_consensus_checker.py)")  # fmt: skip
        env += (("SGLANG_ENABLE_RANK_CONSENSUS_CHECKER", "1"),)
    from hicache_diag.sglang.sessions import SESSION_WORKLOADS

    # A scripted workload's launch flags (streaming sessions), unless given already.
    extra += tuple(a for a in SESSION_WORKLOADS.get(str(value("workload")), ()) if a not in extra)
    spec = LaunchSpec(
        model=model, pp_size=pp, tp_size=tp, page_size=page, max_total_tokens=max_total,
        hicache_ratio=ratio, hicache_size_gb=_hicache_size_gb(value("hicache_size")),
        hicache_write_policy=value("hicache_write_policy"),
        hicache_storage_backend=None if backend == "none" else backend,
        hicache_storage_dir=storage_dir, hicache_storage_prefetch_policy=policy,
        extra_args=extra, cpu=device == "cpu", env=env,
    )  # fmt: skip
    seed = int(value("seed"))
    check_seed(seed)
    workload = WorkloadConfig(value("workload"), int(value("requests")),
                              int(value("max_new_tokens")), seed)  # fmt: skip
    return SglangRunConfig(spec, workload, install.python, install.version,
                           install.cpu_kernel_names, faults, seed, flags.get("out"),
                           hang_timeout, vocab, str(install.package_dir), install.launch,
                           install.facts(), notes)  # fmt: skip


def _page_size_for(install: SglangInstall, page: int, *, explicit: bool,
                   cpu: bool) -> tuple[int, tuple]:  # fmt: skip
    """A release whose paged allocator has only a triton path cannot run pages > 1 on CPU
    (launch_facts.py): the default adapts to 1 with a note; an explicit --page-size is refused."""
    if not (cpu and page > 1 and install.launch.paged_alloc_needs_triton):
        return page, ()
    why = (f"sglang {install.version} allocates pages of more than one token only with a triton "
           "kernel (PagedTokenToKVPoolAllocator.alloc_extend), which has no CPU driver")
    if explicit:
        raise UsageError(f"--page-size {page} cannot run on this CPU host: {why}; use 1")
    return 1, (f"page size 1 instead of {page}: {why}",)


def _sglang_install(flags: dict[str, Any], scenario: dict[str, Any], *, cpu: bool) -> SglangInstall:
    """The release to launch: --sglang-python, else the scenario's `sglang_python`, else the venv
    holding its `sglang_version`, else our own interpreter. A scenario's [expect] belongs to the
    release it names, so `--check` on another release is refused before anything starts."""
    from hicache_diag.sglang import install as inst

    want = scenario.get("sglang_version")
    if want is not None and not isinstance(want, str):
        raise UsageError(f'scenario key sglang_version must be a string, e.g. "0.5.23" ({want!r})')
    python = flags.get("sglang_python") or scenario.get("sglang_python")
    if python is not None and not isinstance(python, str):
        raise UsageError(f"scenario key sglang_python must be a path string ({python!r})")
    if python is None and want:
        python = inst.venv_python_for(want)
    install = inst.probe_sglang(python)
    if want and install.version != want and (flags.get("check") or not flags.get("sglang_python")):
        where = f"--sglang-python {install.python}" if python else install.python
        raise UsageError(
            f"this scenario replays sglang {want} but {where} has sglang {install.version}; "
            f"hold {want} in ${inst.VENVS_ENV}/sglang-{want}: {inst.release_command(want)}"
        )
    return inst.preflight(install, cpu=cpu)


def _model(path: str | None, install: SglangInstall, pp: int, tp: int) -> tuple[Path, int]:
    """--model, else the tiny model built by (and for) the release's own interpreter; the
    topology is checked against the model's shape first (before any build)."""
    import json
    from dataclasses import asdict

    from hicache_diag.sglang.model import TinyModelSpec, check_model_dir, default_model_dir

    if path:
        model = check_model_dir(path)
        config = json.loads((model / "config.json").read_text())
        _check_topology(config, pp, tp)
        return model, int(config.get("vocab_size") or 512)
    spec = TinyModelSpec()
    _check_topology(asdict(spec), pp, tp)
    return default_model_dir(install.python, install.transformers, spec), spec.vocab_size


def _check_topology(config: dict[str, Any], pp: int, tp: int) -> None:
    layers = int(config.get("num_hidden_layers") or 0)
    heads = int(config.get("num_attention_heads") or 0)
    if layers and pp > layers:
        raise UsageError(f"--pp {pp} exceeds the model's {layers} layers")
    if heads and heads % tp:
        raise UsageError(f"--tp {tp} does not divide the model's {heads} attention heads")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _server_env(given: list[str] | None, table: dict | None) -> tuple[tuple[str, str], ...]:
    """--sglang-env NAME=VALUE pairs (else the scenario's `sglang_env` table): the server's
    own switches, recorded in the manifest with the launch."""
    pairs: list[tuple[str, str]] = []
    for item in given or ():
        name, sep, val = item.partition("=")
        if not sep or not _ENV_NAME.fullmatch(name):
            raise UsageError(f"--sglang-env {item!r}: expected NAME=VALUE, e.g. "
                             "SGLANG_REQ_WAITING_TIMEOUT=1.5")  # fmt: skip
        pairs.append((name, val))
    if not given:
        for name, val in (table or {}).items():
            if not _ENV_NAME.fullmatch(str(name)):
                raise UsageError(f"scenario sglang_env: {name!r} is not a variable name")
            pairs.append((str(name), str(val)))
    return tuple(pairs)
