"""`report RUN --html`: one self-contained page, opened in a real headless browser (Debian's
chromium) and judged from its screenshot's pixels: both ranks' curve colours on the same rows
(one axis, overlaid), and the first-divergence marker drawn where no curve is (beside the data,
never over it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hicache_diag.cli.main import run_cli
from hicache_diag.diagnosis.plots import MARK_COLOUR, RANK_COLOURS

FORM_A = Path(__file__).parents[2] / "samples" / "runs" / "form_a"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _html(tmp_path: Path) -> tuple[Path, str]:
    page = tmp_path / "form_a.html"
    assert run_cli(["report", str(FORM_A), "--html", str(page)]) == 0
    return page, page.read_text()


def test_the_html_report_is_one_self_contained_file(tmp_path, capsys):
    page, text = _html(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["form_a.html"], "one file, no PNGs"
    assert text.count("data:image/png;base64,") == 5  # every plot inline
    assert not re.search(r"<script|<link|src=\"(?!data:)|url\(", text), "nothing outside"
    assert "crash (form A), exit 10" in text and "First divergence: step 19" in text
    assert "None" not in text and "None" not in capsys.readouterr().out


def _pixels(png: Path, colour: str, tol: int = 40) -> np.ndarray:
    image = np.asarray(Image.open(png).convert("RGB")).astype(int)
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    return np.abs(image - rgb).sum(axis=2) < tol


@pytest.mark.process
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_the_html_report_in_headless_chromium_shows_ranks_overlaid_and_the_marker(tmp_path):
    page, _ = _html(tmp_path)
    shot = tmp_path / "shot.png"
    flags = (
        "--headless --no-sandbox --disable-gpu --disable-background-networking "
        "--disable-component-update --disable-sync --no-first-run --hide-scrollbars "
        "--window-size=1000,2000"
    ).split()
    profile, screenshot = f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}"
    argv = [CHROMIUM, *flags, profile, screenshot, page.as_uri()]
    subprocess.run(argv, capture_output=True, timeout=120, check=True)
    rank0, rank1 = (_pixels(shot, c).any(axis=1) for c in RANK_COLOURS[:2])
    marker = _pixels(shot, MARK_COLOUR).any(axis=1)
    # Overlaid on one axis: many pixel rows hold both ranks' colours (one subplot per rank
    # would share only a legend's row or two).
    assert (rank0 & rank1).sum() >= 20, ((rank0 & rank1).sum(), rank0.sum(), rank1.sum())
    assert marker.sum() >= 10, "the first-divergence marker is on the page"
    # Beside the data: the marker's rows hold no curve (a line across the axes would).
    assert (marker & (rank0 | rank1)).sum() <= marker.sum() // 10
