"""bisect's release axis: the releases to compare (`--sglang-python PY1,PY2` or
`--sglang-version V1,V2` through $HICACHE_DIAG_SGLANG_VENVS), through the engine that runs
releases (engines/registry.py `release_engine`), and their labels in the table."""

from __future__ import annotations

from hicache_diag.errors import UsageError
from hicache_diag.trials.bisect import parse_values


def venv_python(version: str) -> str:
    import os

    from hicache_diag.engines.registry import release_engine

    releases = release_engine().releases
    VENVS_ENV = releases.venvs_env
    root = os.environ.get(VENVS_ENV)
    if not root:
        raise UsageError(
            f"--sglang-version {version}: set ${VENVS_ENV} to the directory that "
            "holds one venv per release (sglang-<version>/)"
        )
    python = releases.venv_python(version)
    if python is None:
        raise UsageError(
            f"--sglang-version {version}: no {root}/sglang-{version}/bin/python; "
            f"create it with: {releases.install_command(version)}"
        )
    return python


def release_pythons(python: str | None, version: str | None, engine: str) -> tuple[list[str], dict]:
    """The releases to compare, as interpreters, and their versions where the flag gave them
    (--sglang-version: resolved through $HICACHE_DIAG_SGLANG_VENVS)."""
    if python is None and version is None:
        return [], {}
    if python is not None and version is not None:
        raise UsageError("--sglang-python and --sglang-version both name the releases: give one")
    from hicache_diag.engines.registry import require_releases

    require_releases(engine, "--sglang-python/--sglang-version")
    if version is not None:
        versions = parse_values("--sglang-version", version)
        pythons = [venv_python(v) for v in versions]
        return pythons, dict(zip(pythons, versions, strict=True))
    return list(parse_values("--sglang-python", python)), {}


def release_labels(pythons: tuple[str, ...], known: dict[str, str]) -> dict[str, str]:
    """Each interpreter's SGLang version (probed when the flag gave paths); the path is added
    where two interpreters hold the same version."""
    from hicache_diag.engines.registry import release_engine

    probe = release_engine().releases.probe
    found = {p: known.get(p) or probe(p, "--sglang-python") for p in pythons}
    versions = list(found.values())
    return {p: v if versions.count(v) == 1 else f"{v} ({p})" for p, v in found.items()}
