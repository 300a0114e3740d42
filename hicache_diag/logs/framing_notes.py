"""What reading a log undid to get at its lines, for the report: the collectors we know that
were peeled, the prefix learned from the file itself, paste damage (editor numbers, a
terminal's wrap), records glued onto one line and split again, JSON lines decoded, writers
interleaved and separated, line endings, NUL holes and blank floods. One per log; the report
says it in its framing line (`stripped a 3-field prefix from 98% of lines`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hicache_diag.logs.prefix import LearnedPrefix


@dataclass(slots=True)
class FramingNotes:
    carriers: list[str] = field(default_factory=list)  # collectors we know, as found
    peeled: int = 0  # lines a known collector's prefix was taken off
    learned: LearnedPrefix | None = None
    stripped: int = 0  # lines the learned (or a label-found) wrapper was taken off
    numbered: bool = False
    wrap_width: int | None = None
    joined: int = 0  # wrapped pieces joined back onto their line
    glued: int = 0  # records split off a line they were glued onto
    json_shipper: str | None = None
    json_lines: int = 0
    interleaved: int = 0  # regions of two writers' characters separated
    cr_only: bool = False
    nul_bytes: int = 0
    blank_runs: int = 0
    blank_lines: int = 0

    def describe(self, lines: int) -> list[str]:
        """One line per thing undone; `lines`: the lines read, for the shares."""
        out: list[str] = []
        share = (lambda n: f"{100 * n / lines:.0f}%") if lines else (lambda n: f"{n} lines")
        if self.json_shipper:
            out.append(f"decoded {self.json_lines} JSON lines of a {self.json_shipper} shipper")
        if self.carriers:
            names = ", ".join(self.carriers)
            out.append(f"peeled known collector prefixes ({names}) from {share(self.peeled)}")
        if self.learned is not None and self.stripped:
            out.append(
                f"stripped a {self.learned.fields}-field prefix nobody listed "
                f"(`{self.learned.example.strip()}`) from {share(self.stripped)} of lines"
            )
        elif self.stripped:
            out.append(f"stripped wrappers found before SGLang's label from {share(self.stripped)}")
        if self.numbered:
            out.append("removed editor line numbers")
        if self.wrap_width or self.joined:
            width = f" at {self.wrap_width} columns" if self.wrap_width else ""
            out.append(f"rejoined {self.joined} hard-wrapped line pieces{width}")
        if self.glued:
            out.append(f"split {self.glued} records glued onto the line before them")
        if self.interleaved:
            out.append(f"separated {self.interleaved} regions two writers interleaved")
        if self.cr_only:
            out.append("read CR-only line endings")
        if self.nul_bytes:
            out.append(f"dropped {self.nul_bytes} NUL bytes (a hole in the file)")
        if self.blank_runs:
            out.append(f"skipped {self.blank_lines} blank lines in {self.blank_runs} runs")
        return out
