"""Which of a release's requirements a CPU host installs, decided from metadata.

A release's wheel names its requirements (`Requires-Dist`); the package index answers for each
one what it is (its own metadata, through pip's `--report`) and whether it can be had here (a
source distribution that fails to build, no distribution for this platform). From that, and no
list of names:

- `torch` is held at the CPU build already installed (every release pins a CUDA build);
  `torchvision` is installed as the build matched to that torch;
- a requirement is **CUDA-only** when its metadata says so: it names a CUDA variant (`[cu13]`,
  `-cu12`), it is one of NVIDIA's CUDA distributions (the `nvidia-` and `cuda-` namespaces),
  its classifiers declare `Environment :: GPU`, or it requires such a distribution itself;
- a requirement is **not installable here** when pip cannot prepare it: its source distribution
  fails to build (placeholders whose build downloads the real wheel from outside the index), or
  the index has no distribution of it for this platform.
Each dropped requirement keeps its reason; the installer records them beside the release.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

HELD_TORCH = "torch"
MATCHED = ("torchvision",)  # installed --no-deps as the build of the held torch
_CUDA_VARIANT = re.compile(r"(^|[-_.])cu\d{2,3}($|[-_.])", re.IGNORECASE)
_CUDA_NAMESPACE = re.compile(r"^(nvidia|cuda)-", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Dropped:
    name: str
    reason: str


@dataclass
class RequirementPlan:
    """What to install from a release's requirements, and what was left out and why."""

    install: list[str] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)

    def drop(self, name: str, reason: str) -> bool:
        """Drop the requirement named `name` (canonical match); False when it is not one."""
        key = canonicalize_name(name)
        for req in self.install:
            if canonicalize_name(Requirement(req).name) == key:
                self.install.remove(req)
                self.dropped.append(Dropped(Requirement(req).name, reason))
                return True
        return False

    def dropped_names(self) -> set[str]:
        return {canonicalize_name(d.name) for d in self.dropped}


def requires_dist(metadata: str) -> list[str]:
    """The `Requires-Dist` values of a METADATA text."""
    return [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def applies(req: Requirement, env: dict[str, str] | None) -> bool:
    """A requirement of the base install (no extra) whose marker holds on this platform."""
    if req.marker is None:
        return True
    return req.marker.evaluate({**(env or default_environment()), "extra": ""})


def cuda_named(req: Requirement) -> str | None:
    """Why the requirement itself names a CUDA build, or None."""
    if _CUDA_NAMESPACE.match(req.name):
        return f"one of NVIDIA's CUDA distributions ({req.name})"
    if _CUDA_VARIANT.search(req.name):
        return f"a CUDA variant by name ({req.name})"
    variants = [x for x in req.extras if _CUDA_VARIANT.search(x) or x.lower() == "cuda"]
    if variants:
        return f"asked for as its CUDA variant [{','.join(sorted(variants))}]"
    return None


def plan_requirements(requires: list[str], env: dict[str, str] | None = None) -> RequirementPlan:
    """The first cut, from the release's own metadata alone."""
    plan = RequirementPlan()
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if not applies(req, env):
            continue
        name = canonicalize_name(req.name)
        if name == HELD_TORCH:
            plan.dropped.append(Dropped(req.name, f"held at the CPU build (release asks {text})"))
            continue
        if name in MATCHED:
            plan.dropped.append(Dropped(req.name, "installed as the build matched to CPU torch"))
            continue
        why = cuda_named(req)
        if why:
            plan.dropped.append(Dropped(req.name, f"CUDA-only: {why}"))
            continue
        req.marker = None  # evaluated above, for the target interpreter
        plan.install.append(str(req))
    return plan


def gpu_only_by_metadata(meta: dict, env: dict[str, str] | None = None) -> str | None:
    """Why a resolved package (pip `--report` metadata) is CUDA-only, or None."""
    gpu = [c for c in meta.get("classifier") or [] if c.startswith("Environment :: GPU")]
    if gpu:
        return f"its metadata declares {gpu[0]!r}"
    for text in meta.get("requires_dist") or []:
        try:
            dep = Requirement(text)
        except InvalidRequirement:
            continue
        if applies(dep, env):
            why = cuda_named(dep)
            if why:
                return f"it requires {dep.name}: {why}"
    return None


# pip's words for a requirement it could not prepare, in the order it prints them.
_COLLECTING = re.compile(r"^Collecting (?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?P<rest>.*)$")
_FROM = re.compile(r"\(from (?P<parent>[A-Za-z0-9][A-Za-z0-9._-]*)")
_NO_DIST = re.compile(r"No matching distribution found for (?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)")
_HINT = re.compile(r"--extra-index-url\s+(\S+)")


@dataclass(frozen=True, slots=True)
class PipFailure:
    package: str  # what pip could not prepare
    parents: tuple[str, ...]  # who asked for it, nearest first (empty: a direct requirement)
    reason: str


def parse_pip_failure(output: str) -> PipFailure | None:
    """The package a failed `pip install` could not prepare, and why; None when the failure is
    of another kind (a conflict, the network)."""
    lines = output.splitlines()
    parents: dict[str, str] = {}
    last = None
    for line in lines:
        m = _COLLECTING.match(line.strip())
        if m:
            last = canonicalize_name(m.group("name"))
            p = _FROM.search(m.group("rest"))
            if p and not p.group("parent").startswith("-r"):
                parents[last] = canonicalize_name(p.group("parent"))
    text = "\n".join(lines)
    build_failed = "metadata-generation-failed" in text or "Failed to build" in text
    if build_failed and last:
        hint = _HINT.search(text)
        why = "its source distribution does not build here"
        if hint:
            why += f" (its build fetches from another index, {hint.group(1)})"
        return PipFailure(last, _chain(last, parents), why)
    m = _NO_DIST.search(text)
    if m:
        name = canonicalize_name(m.group("name"))
        return PipFailure(
            name, _chain(name, parents), "the index has no distribution of it for this platform"
        )
    return None


def _chain(name: str | None, parents: dict[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    while name in parents and parents[name] not in out and len(out) < 16:
        name = parents[name]
        out.append(name)
    return tuple(out)
