"""SglangOptions -> SglangRunConfig: what only the release and this host can say, checked
before anything starts (the options' own checks ran when they were built: run_options.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_diag.engines.sglang.config import SglangRunConfig
from hicache_diag.engines.sglang.device import DeviceChoice, choose_device
from hicache_diag.engines.sglang.launch_spec import LaunchSpec
from hicache_diag.engines.sglang.options import SglangOptions
from hicache_diag.engines.sglang.patch_overlay import NO_PATCH, PatchOverlay, patch_overlay
from hicache_diag.errors import UsageError
from hicache_diag.faults.validate import validated_faults
from hicache_diag.options.parse import from_command_line
from hicache_diag.options.storage_dir import check_storage_dir
from hicache_diag.options.workloads import WorkloadConfig
from hicache_diag.trials.rundir import check_writable

if TYPE_CHECKING:
    from hicache_diag.engines.sglang.release import SglangInstall

_GIB = 1024**3


def build(options: SglangOptions) -> SglangRunConfig:
    """The sglang engine's `build` (hicache_diag/engines/registry.py): every check before launch."""
    check_writable(options.out)
    faults = validated_faults(options)
    storage_dir = options.hicache_storage_dir
    if storage_dir:
        storage_dir = str(Path(check_storage_dir(storage_dir, before_start=True)).resolve())
    install, device = _sglang_install(options)
    model, vocab = _model(options.model, install, options.pp, options.tp)
    page, notes = _page_size_for(install, options, cpu=device.cpu)
    from hicache_diag.engines.sglang.release import refuse_unhookable

    refuse_unhookable(install, faults)
    overlay = _patch_overlay(options, install)
    spec = _launch_spec(options, install, model, page, storage_dir, cpu=device.cpu)
    if overlay is not None:  # imported before the release's own package, in every process
        spec = replace(spec, pythonpath=(str(overlay.root), *spec.pythonpath))
    workload = WorkloadConfig(
        options.workload, options.requests, options.max_new_tokens, options.seed
    )
    return SglangRunConfig(
        spec=spec,
        workload=workload,
        python=install.python,
        sglang_version=install.version,
        hang_timeout=options.hang_timeout,
        cpu_kernel_names=install.cpu_kernel_names,
        faults=faults,
        seed=options.seed,
        out=options.out,
        vocab_size=vocab,
        package_dir=str(install.package_dir),
        launch_facts=install.launch,
        release={**install.facts(), **({"patch": overlay.facts()} if overlay else {})},
        device=device.facts(),
        notes=device.notes + notes,
        hosts=tuple(h.strip() for h in options.hosts.split(",")) if options.hosts else (),
        ssh_config=options.ssh_config,
    )


def _patch_overlay(options: SglangOptions, install: SglangInstall) -> PatchOverlay | None:
    """--patch: the release with the patch applied (built once per release and patch), or a
    one-line refusal when it does not apply to this release."""
    if options.patch is None or options.patch == NO_PATCH:
        return None
    return patch_overlay(options.patch, install.version, install.package_dir, options.how("patch"))


def _server_args(options: SglangOptions, install: SglangInstall) -> tuple[tuple[str, ...], tuple]:
    """launch_server arguments beyond the spec's own, and the server's environment."""
    env = options.server_env()
    extra = options.sglang_arg
    if options.async_depth:
        extra += ("--pp-async-batch-depth", str(options.async_depth))
    if options.sglang_consensus_checker:
        if not (install.package_dir / "srt" / "utils" / "rank_consensus_checker.py").is_file():
            raise UsageError(
                f"--sglang-consensus-checker: sglang {install.version} has no rank consensus "
                "checker (srt/utils/rank_consensus_checker.py)"
            )
        env += (("SGLANG_ENABLE_RANK_CONSENSUS_CHECKER", "1"),)
    from hicache_diag.engines.sglang.sessions import SESSION_WORKLOADS

    # A scripted workload's launch flags (streaming sessions), unless given already.
    extra += tuple(a for a in SESSION_WORKLOADS.get(options.workload, ()) if a not in extra)
    return extra, env


def _launch_spec(
    options: SglangOptions,
    install: SglangInstall,
    model: Path,
    page: int,
    storage_dir: str | None,
    *,
    cpu: bool,
) -> LaunchSpec:
    extra, env = _server_args(options, install)
    policy_given = "hicache_storage_prefetch_policy" in options.given  # else SGLang's own
    return LaunchSpec(
        model=model,
        pp_size=options.pp,
        tp_size=options.tp,
        page_size=page,
        max_total_tokens=options.max_total_tokens,
        hicache_ratio=options.hicache_ratio,
        hicache_size_gb=options.host_bytes // _GIB,
        hicache_write_policy=options.hicache_write_policy,
        hicache_storage_backend=options.hicache_storage_backend if options.storage else None,
        hicache_storage_dir=storage_dir,
        hicache_storage_prefetch_policy=(
            options.hicache_storage_prefetch_policy if policy_given else None
        ),
        extra_args=extra,
        cpu=cpu,
        env=env,
        nnodes=options.nnodes,
    )


def _page_size_for(
    install: SglangInstall, options: SglangOptions, *, cpu: bool
) -> tuple[int, tuple]:
    """A release whose paged allocator has only a triton path cannot run pages > 1 on CPU
    (launch_facts.py): the default adapts to 1 with a note; a page size the user gave is refused."""
    page = options.page_size
    if not (cpu and page > 1 and install.launch.paged_alloc_needs_triton):
        return page, ()
    why = (
        f"sglang {install.version} allocates pages of more than one token only with a triton "
        "kernel (PagedTokenToKVPoolAllocator.alloc_extend), which has no CPU driver"
    )
    if "page_size" in options.given:
        raise UsageError(
            f"{options.how('page_size')} {page} cannot run on this CPU host: {why}; use 1"
        )
    return 1, (f"page size 1 instead of {page}: {why}",)


def _sglang_install(options: SglangOptions) -> tuple[SglangInstall, DeviceChoice]:
    """The release to launch: --sglang-python, else the scenario's `sglang_python`, else the venv
    holding its `sglang_version`, else our own interpreter. A scenario's [expect] belongs to the
    release it names, so `--check` on another release is refused before anything starts. The
    device is that release's torch's to say (device.py), before its source is read."""
    from hicache_diag.engines.sglang import release as inst

    want, python = options.sglang_version, options.sglang_python
    if python is None and want:
        python = inst.venv_python_for(want)
    install = inst.probe_sglang(python)
    own_pick = from_command_line(options, "sglang_python")
    if want and install.version != want and (options.check or not own_pick):
        where = f"--sglang-python {install.python}" if python else install.python
        raise UsageError(
            f"this scenario replays sglang {want} but {where} has sglang {install.version}; "
            f"hold {want} in ${inst.VENVS_ENV}/sglang-{want}: {inst.release_command(want)}"
        )
    device = choose_device(options, install.python)
    return inst.preflight(install, cpu=device.cpu), device


def _model(path: str | None, install: SglangInstall, pp: int, tp: int) -> tuple[Path, int]:
    """--model, else the tiny model built by (and for) the release's own interpreter; the
    topology is checked against the model's shape first (before any build)."""
    import json
    from dataclasses import asdict

    from hicache_diag.engines.sglang.model import TinyModelSpec, check_model_dir, default_model_dir

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
