"""The record a recipe is (which run it matches, its test template, the mechanism's steps, the
upstream threads and status), apart from the recipes themselves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hicache_diag.export.source_lines import Step

_PULL = "https://github.com/sgl-project/sglang/pull/"
_ISSUE = "https://github.com/sgl-project/sglang/issues/"


@dataclass(frozen=True, slots=True)
class Related:
    ref: str  # "#29109"
    url: str
    state: str  # as found in the public tracker when the recipe was written
    why: str


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    forms: tuple[str, ...]  # the verdict's crash form (any one)
    functions: tuple[str, ...] | None  # where the failing rank stopped (any one; None: any)
    file: str | None  # the basename in the traceback (None: any)
    follower: bool | None  # the failing rank is a PP stage > 0 (None: either)
    storage: bool  # the run had an L3 storage backend
    template: str  # under hicache_diag/export/templates/
    test_file: str
    error: str  # what the exported test fails with on an affected release
    title: str
    invariant: str
    steps: tuple[Step, ...]
    related: tuple[Related, ...]

    # Matched on the release's code rather than the crash line: a run with no fault on a
    # release whose source has every step (the divergence is upstream of where ranks stop).
    by_source: bool = False
    # Matched on the run's evidence (evidence_tags.run_tags: a `sources` probe name) before any
    # crash-line recipe: the mechanism that made the ranks part, wherever they then stopped.
    evidence: tuple[str, ...] = ()
    # REPORT.md: whether production reaches the state (apart from the code fact), the upstream
    # status as found in SGLang's tracker, and the committed non-fix the test rejects.
    reachable: str = ""
    upstream: str = ""
    nonfix: str = ""
    # The committed candidate fix (samples/exports/<finding>/fix.patch): its idea and cost.
    fix: str = ""
    # What the exported test fails with for this run's evidence values (None: `error`).
    error_for: Callable[[dict[str, object]], str] | None = None
    # The tree cache class the test drives; a run of another class is refused (None: any).
    cache_class: str | None = None

    def matches(
        self,
        form: str | None,
        function: str | None,
        file: str | None,
        pp: int | None,
        storage: bool,
    ) -> bool:
        return (
            form in self.forms
            and (self.functions is None or function in self.functions)
            and (self.file is None or file == self.file)
            and (self.follower is None or ((pp or 0) > 0) == self.follower)
            and storage == self.storage
        )

    def describe(self) -> str:
        if self.evidence:
            return f"{'/'.join(self.evidence)} apart in the run's evidence"
        where = (
            "with no fault, on a release with this code"
            if self.by_source
            else f"in {'/'.join(self.functions or ())} ({self.file}) on "
            f"{'a PP follower' if self.follower else 'PP0'}"
        )
        l3 = "with" if self.storage else "without"
        return f"form {'/'.join(self.forms)} {where}, {l3} L3"
