"""Records of the inventory: a source read, each decision it reaches, and its alignment there."""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEMA = "hicache-diag/sources/v1"
DIFF_SCHEMA = "hicache-diag/sources-diff/v1"


@dataclass(frozen=True, slots=True)
class SyncStep:
    """One cross-rank operation a value goes through before the decision uses it."""

    kind: str  # all_reduce | pp_relay | broadcast | gather
    op: str | None  # MIN | MAX | SUM for all_reduce; None when not an all_reduce or unknown
    groups: tuple[str, ...]  # e.g. ("attn_cp", "attn_tp", "tp"); ("pp",) for a PP relay
    via: str  # the function that performs it (ours to name, SGLang's qualname)

    def to_json(self) -> dict:
        return {"kind": self.kind, "op": self.op, "groups": list(self.groups), "via": self.via}


State = tuple[SyncStep, ...]  # the steps a value has been through on its way; () = raw


@dataclass(frozen=True, slots=True)
class Alignment:
    """How ranks are made to agree on a value before a decision reads it (as the code shows)."""

    mechanism: str  # min | max | sum | all-reduce | leader-relay | min+leader-relay | ...
    steps: tuple[SyncStep, ...] = ()
    covers_pp: bool | None = None  # None: unknown
    covers_tp: bool | None = None

    @property
    def text(self) -> str:
        if not self.steps:
            return self.mechanism
        parts = []
        for s in self.steps:
            groups = "|".join(s.groups) or "?"
            if s.kind == "all_reduce":
                parts.append(f"{s.op or '?'} over {groups} ({s.via})")
            elif s.kind == "pp_relay":
                parts.append(f"relayed down PP from PP0 ({s.via})")
            else:
                parts.append(f"{s.kind} over {groups} ({s.via})")
        return "; ".join(dict.fromkeys(parts))

    def to_json(self) -> dict:
        return {
            "mechanism": self.mechanism,
            "text": self.text,
            "covers_pp": self.covers_pp,
            "covers_tp": self.covers_tp,
            "steps": [s.to_json() for s in self.steps],
        }


NONE = Alignment("none", (), False, False)
LOGICAL = Alignment("logical", (), True, True)


@dataclass(frozen=True, slots=True)
class Use:
    """Where a source's value (or one derived from it) decides something."""

    file: str
    line: int
    function: str
    decision: str  # a DECISIONS category, or "unknown"
    decided_in: str | None  # the function the category came from (may be a caller)
    alignment: Alignment
    how: str  # branch | count-loop | call-arg | returned
    depth: int = 0  # function hops from the read (calls, returns, attributes, queues)

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "decision": self.decision,
            "decided_in": self.decided_in,
            "alignment": self.alignment.to_json(),
            "how": self.how,
            "depth": self.depth,
        }


@dataclass(frozen=True, slots=True)
class BranchMode:
    """An `if`/`else` whose branches align the value differently: each mode's alignment, and
    the flags (or the test's text) that select the `if` branch."""

    file: str
    line: int
    condition: str  # the `if` test as written
    flags: tuple[str, ...]  # server flags the test reads (`--hicache-host-memory-mode buffer_only`)
    then: Alignment
    orelse: Alignment

    @property
    def selector(self) -> str:
        return ", ".join(self.flags) or self.condition

    def to_json(self) -> dict:
        return {
            "file": self.file,
            "line": self.line,
            "condition": self.condition,
            "flags": list(self.flags),
            "then": self.then.to_json(),
            "else": self.orelse.to_json(),
        }


@dataclass(frozen=True, slots=True)
class Source:
    """One read of a per-rank quantity that reaches at least one decision."""

    file: str
    line: int
    function: str
    kind: str  # a rules.READ_KINDS key
    expr: str
    classic: str | None  # dma-ack-count | l3-hit | l3-progress | host-alloc | lru-clock | None
    uses: tuple[Use, ...]
    modes: tuple[BranchMode, ...] = ()  # alignment per code branch, where it differs

    @property
    def key(self) -> str:
        """Stable across releases (no line numbers): what `--diff` matches on."""
        return f"{self.file}::{self.function}::{self.kind}::{self.expr}"

    @property
    def nearest(self) -> tuple[Use, ...]:
        """The uses of a known decision closest to the read (fewest hops); all uses if none
        is known. Farther uses exist because the walk over-approximates (docs/sources.md)."""
        known = [u for u in self.uses if u.decision != "unknown"] or list(self.uses)
        if not known:
            return ()
        depth = min(u.depth for u in known)
        return tuple(u for u in known if u.depth == depth)

    @property
    def decisions(self) -> tuple[str, ...]:
        """The nearest decisions (see `nearest`)."""
        return tuple(dict.fromkeys(u.decision for u in self.nearest))

    @property
    def alignment(self) -> Alignment:
        """How the value is made to agree: the alignment at its nearest aligned use (the
        strongest there), or "none" when every decision reads it raw. Decisions taken on the
        raw value anyway are counted apart (`raw_uses`)."""
        if not self.uses:
            return Alignment("unknown")
        # What aligns the value on its way to its nearest decisions: a collective no deeper
        # than them (the controller thread's MIN before the scheduler decides), or in their
        # categories. A MAX over TP in another decision the walk reaches farther on (PD
        # decode's offload, from HiCacheController.write's alloc) does not align this one.
        nearest = self.nearest
        near = nearest[0].depth if nearest else 0
        decided = {u.decision for u in nearest}
        uses = [u for u in self.uses if u.depth <= near or u.decision in decided]
        aligned = [u for u in uses if u.alignment.mechanism not in ("none", "unknown")]
        if not aligned:
            return min((u.alignment for u in uses), key=_strength)
        depth = min(u.depth for u in aligned)
        return max((u.alignment for u in aligned if u.depth == depth), key=_strength)

    @property
    def raw_uses(self) -> int:
        """Nearest decisions (see `nearest`) that read the value before any alignment."""
        return sum(
            1 for u in self.nearest if u.alignment.mechanism == "none" and u.decision != "unknown"
        )

    @property
    def known(self) -> bool:
        return any(u.decision != "unknown" for u in self.uses)

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "kind": self.kind,
            "expr": self.expr,
            "classic": self.classic,
            "decisions": list(self.decisions),
            "all_decisions": sorted({u.decision for u in self.uses}),
            "alignment": self.alignment.to_json(),
            "raw_uses": self.raw_uses,
            "modes": [m.to_json() for m in self.modes],
            "uses": [u.to_json() for u in self.uses],
        }


def _strength(a: Alignment) -> tuple[int, int]:
    if a.mechanism == "none":
        rank = 0
    elif a.mechanism == "unknown":
        rank = 1
    elif a.covers_pp is False or a.covers_tp is False:
        rank = 2
    else:
        rank = 3
    return rank, len(a.steps)


@dataclass(frozen=True, slots=True)
class Release:
    engine: str  # sglang | builtin
    version: str
    root: str  # the scanned package dir

    def to_json(self) -> dict:
        return {"engine": self.engine, "version": self.version, "root": self.root}


@dataclass(frozen=True, slots=True)
class Inventory:
    release: Release
    files: tuple[str, ...]
    sources: tuple[Source, ...]
    reads_without_decision: int  # reads seen whose value reached no decision (metrics, logs)
    notes: tuple[str, ...] = field(default=())
    # logical per-rank state (rules.LOGICAL_KINDS) that reaches a decision: not sources
    logical: tuple[Source, ...] = field(default=())

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "release": self.release.to_json(),
            "files_scanned": len(self.files),
            "reads_without_decision": self.reads_without_decision,
            "notes": list(self.notes),
            "sources": [s.to_json() for s in self.sources],
            "logical_state": [s.to_json() for s in self.logical],
        }
