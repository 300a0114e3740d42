"""Every regex the rule book and the log reader use runs in linear time on adversarial lines.

Complexity, not speed: each pattern is run on an input and on one 8x longer; a linear scan
takes ~8x as long, a quadratic one ~64x. The threshold sits between the two, and only times
long enough to measure are compared (CPU time, min of several runs: a busy machine cannot
fail it).
"""

from __future__ import annotations

import importlib
import re
import time

import pytest

MODULES = (
    "hicache_diag.rules.signatures",
    "hicache_diag.rules.wait_sites",
    "hicache_diag.rules.process_fate",
    "hicache_diag.rules.rank_labels",
    "hicache_diag.logs.parse",
    "hicache_diag.logs.handlers",
    "hicache_diag.logs.prefix",
    "hicache_diag.logs.speakers",
    "hicache_diag.logs.chunks",
    "hicache_diag.logs.paste",
    "hicache_diag.rules.engine_stats",
    "hicache_diag.logs.lines",
    "hicache_diag.logs.carriers",
    "hicache_diag.logs.framing",
    "hicache_diag.logs.emitters",
    "hicache_diag.logs.dumps",
    "hicache_diag.logs.tracebacks",
    "hicache_diag.logs.triggers",
    "hicache_diag.evidence.stacks",
    "hicache_diag.logs.crash",
)

# Shapes that make backtracking regexes go quadratic: runs of one class, repeated separators,
# an opening that never closes.
ADVERSARIAL = {
    "letters": lambda n: "a" * n,
    "capitals": lambda n: "A" * n,
    "mixed": lambda n: "Aa_." * (n // 4),
    "dotted": lambda n: "a." * (n // 2),
    "digits": lambda n: "1" * n,
    "spaces": lambda n: " " * n,
    "words": lambda n: "ab " * (n // 3),
    "pairs": lambda n: "(" + "a=b " * (n // 4),
    "colons": lambda n: "Exception in thread " + ":" * n,
    "quote": lambda n: 'File "' + "x" * n,
    "tokens": lambda n: "[2024-01-01 00:00:00 " + "TP1 " * (n // 4),
    "brackets": lambda n: "[" * n,
    "frames": lambda n: 'File "a.py", line 1, in f ' * (n // 26),
    "pipe": lambda n: "a" * n + " |",
}


def _patterns() -> list[tuple[str, re.Pattern[str]]]:
    found = []
    for name in MODULES:
        mod = importlib.import_module(name)
        for attr, value in vars(mod).items():
            values = value if isinstance(value, tuple) else (value,)
            for i, pat in enumerate(values):
                if isinstance(pat, re.Pattern) and pat.pattern:
                    found.append((f"{name.rsplit('.', 1)[-1]}.{attr}[{i}]", pat))
    return found


PATTERNS = _patterns()


def _cost(pat: re.Pattern[str], text: str) -> float:
    best = float("inf")
    for _ in range(5):  # CPU time of this process: another process's load does not count
        t0 = time.process_time()
        pat.search(text)
        pat.match(text)
        best = min(best, time.process_time() - t0)
    return best


def test_the_scan_finds_the_rule_books_patterns():
    names = {n for n, _ in PATTERNS}
    assert len(PATTERNS) > 60
    assert any(n.startswith("signatures.SGLANG_WATCHDOG") for n in names)


@pytest.mark.parametrize("shape", sorted(ADVERSARIAL))
def test_every_pattern_is_linear_on(shape):
    make = ADVERSARIAL[shape]
    small, big = make(5_000), make(40_000)
    slow = []
    for name, pat in PATTERNS:
        t_small, t_big = _cost(pat, small), _cost(pat, big)
        # Quadratic: 64x. Linear: 8x, up to ~20x with noise. Below 50 ms there is nothing to see
        # (a quadratic pattern on 40k characters takes a second or more).
        if t_big > 0.05 and t_big > 30 * max(t_small, 1e-4):
            slow.append(f"{name}: {t_small * 1e3:.1f} ms -> {t_big * 1e3:.1f} ms")
    assert not slow, slow


def test_a_long_letter_run_line_parses_in_one_pass():
    # A 2M-letter token: the old watchdog regex took minutes here (quadratic); linear is ~ms.
    from hicache_diag.logs.parse import parse_log_lines

    ev = parse_log_lines(["[2024-01-01 00:00:00 TP0] " + "x" * 2_000_000], "long.log")
    assert ev.lines == 1 and not ev.exceptions
