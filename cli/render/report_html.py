"""A RunReport as one self-contained HTML page: the same content as report.md, the plots inline
as base64 PNG, no script and no link to anything outside the file (it opens from a mail or an
issue attachment as it does here)."""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path

import pandas as pd

from hicache_diag.cli.render.report import _cell, _verdict_lines, ranks_frame
from hicache_diag.diagnosis.report import RunReport

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; padding: 0 1.5em; max-width: 64em;
       color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #ccc; padding: .2em .6em; text-align: right; }
th { background: #f4f4f4; } .verdict { font-size: 1.05em; } code { background: #f4f4f4; }
td.t { text-align: left; } img { max-width: 100%; display: block; margin: .8em 0; }
"""


def _td(value) -> str:
    text = _cell(value)
    left = isinstance(value, str) and text != "-"  # words read from the left, numbers right
    return f'<td class="t">{html.escape(text)}</td>' if left else f"<td>{html.escape(text)}</td>"


def _table(df: pd.DataFrame, index_name: str) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in [index_name, *df.columns])
    rows = []
    for idx, row in df.iterrows():
        cells = "".join(_td(v) for v in row)
        rows.append(f"<tr><th>{html.escape(str(idx))}</th>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _items(lines: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>"


def _divergence(report: RunReport) -> list[str]:
    fd = report.verdict.first_divergence
    if fd is None:
        return []
    out = [
        f"<h2>First divergence: step {fd.step}, <code>{html.escape(fd.field)}</code> "
        f"({html.escape(fd.source.value)})</h2>"
    ]
    if not report.window.empty:
        out.append(_table(report.window.rename(columns=lambda r: f"rank {r}"), "step"))
    return out


def html_report(report: RunReport, path: Path, files: list[Path]) -> str:
    """The page; `files`: every file this report writes (listed, as in report.md)."""
    v = report.verdict
    title = html.escape(f"hicache-diag report: {report.run.run_dir}")
    body = [f"<h1>{title}</h1>", '<div class="verdict">', _items(_verdict_lines(v)), "</div>"]
    body += _divergence(report)
    body += ["<h2>Ranks</h2>", _table(ranks_frame(v), "rank")]
    body += ["<h2>Evidence</h2>", _items(list(v.evidence))]
    if report.notes:
        body += ["<h2>Notes</h2>", _items(report.notes)]
    if report.images:
        body.append("<h2>Timelines</h2>")
    for plot in report.images:
        data = base64.b64encode(plot.png).decode()
        alt = html.escape(plot.title)
        body.append(f'<img alt="{alt}" title="{alt}" src="data:image/png;base64,{data}">')
    rel = [html.escape(os.path.relpath(f, path.parent)) for f in files]
    body += ["<h2>Files</h2>", "<ul>" + "".join(f"<li>{r}</li>" for r in rel) + "</ul>"]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}'
        f"</title><style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
