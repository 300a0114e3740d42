"""Score an inventory against a hand-checked list of a release's per-rank reads
(tests/data/sources_truth_<version>.toml): recall on the list, and precision on the rows the
list judges (its reads, and the logical state that must not be listed as a source)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as the tomli package
    import tomli as tomllib

from hicache_diag.sources.model import Inventory, Source


@dataclass(frozen=True, slots=True)
class TruthRead:
    file: str
    line: int
    function: str
    kind: str
    decision: str
    alignment: str
    pp: bool
    modes: tuple[tuple[str, str, bool], ...]  # (selected_by, alignment, pp)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class Truth:
    version: str
    reads: tuple[TruthRead, ...]
    logical: tuple[tuple[str, int], ...]  # (file, line)


def load_truth(path: Path) -> Truth:
    data = tomllib.loads(path.read_text())
    reads = tuple(_read(r) for r in data.get("read", ()))
    logical = tuple((e["file"], e["line"]) for e in data.get("logical", ()))
    return Truth(data["version"], reads, logical)


def _read(r: dict) -> TruthRead:
    modes = tuple((m["selected_by"], m["alignment"], m["pp"]) for m in r.get("modes", ()))
    where = (r["file"], r["line"], r["function"], r["kind"])
    return TruthRead(*where, r["decision"], r["alignment"], r["pp"], modes)


@dataclass(slots=True)
class Score:
    found: list[TruthRead] = field(default_factory=list)  # at file:line, kind right
    aligned: list[TruthRead] = field(default_factory=list)  # and alignment and modes right
    decided: list[TruthRead] = field(default_factory=list)  # and the decision right
    missed: list[TruthRead] = field(default_factory=list)
    wrong: list[tuple[TruthRead, str]] = field(default_factory=list)  # found, what differs
    logical_as_source: list[str] = field(default_factory=list)  # file:line
    logical_missing: list[str] = field(default_factory=list)  # not in the logical list
    total: int = 0

    @property
    def recall(self) -> float:
        return len(self.aligned) / self.total if self.total else 1.0

    @property
    def precision(self) -> float:
        """Of the judged rows `sources` lists as physical sources, the share that are."""
        judged = len(self.found) + len(self.logical_as_source)
        return len(self.found) / judged if judged else 1.0


def score(inv: Inventory, truth: Truth) -> Score:
    by_line = {(s.file, s.line, s.kind): s for s in inv.sources}
    out = Score(total=len(truth.reads))
    for t in truth.reads:
        s = by_line.get((t.file, t.line, t.kind))
        if s is None:
            out.missed.append(t)
            continue
        out.found.append(t)
        if problem := _differs(t, s):
            out.wrong.append((t, problem))
            continue
        out.aligned.append(t)
        if t.decision in s.decisions:
            out.decided.append(t)
    physical = {(s.file, s.line) for s in inv.sources}
    logical = {(s.file, s.line) for s in inv.logical}
    for file, line in truth.logical:
        if (file, line) in physical:
            out.logical_as_source.append(f"{file}:{line}")
        if (file, line) not in logical:
            out.logical_missing.append(f"{file}:{line}")
    return out


def _differs(t: TruthRead, s: Source) -> str:
    a = s.alignment
    if (a.mechanism, a.covers_pp) != (t.alignment, t.pp):
        return f"alignment {a.mechanism} (PP {a.covers_pp}), expected {t.alignment} (PP {t.pp})"
    modes = {(m.selector, m.then.mechanism, m.then.covers_pp) for m in s.modes}
    for mode in t.modes:
        if mode not in modes:
            return f"no mode {mode[0]} -> {mode[1]} (PP {mode[2]}); has {sorted(modes)}"
    return ""
