"""`hicache-diag timeline`: run a short prefill-heavy workload with host hits, then print the
load/write ack latencies measured from its records, with the formula beside them."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
from pathlib import Path

import typer

from hicache_diag.cli.params import flag
from hicache_diag.cli.render.console import err_console, print_json
from hicache_diag.engines.registry import DEFAULT_ENGINE, build, run_options, run_trial
from hicache_diag.errors import HicacheDiagError, UsageError
from hicache_diag.options.params import Param, field_param
from hicache_diag.options.run_options import RunOptions
from hicache_diag.trials.engine import EngineConfig

# Small device pool so shared prefixes are evicted to host and hit there; one new token per
# request so each prefill's insert (and its write-through) happens in its own result slot.
# The `l2` preset is the protocol merged upstream, the one the seed's table describes; with
# `host-alloc=two-phase` writes would wait for a vote and show that delay instead.
DEVICE_TOKENS = 128
PROTOCOL = "l2"
# shared-prefix cycles 4 prefixes (trials/workload.py): requests 0-3 all miss, the 5th is the
# first that can hit the host; the 6th is a second sample when a busy machine delays the
# first's write copy past the run's end. Fewer can never measure anything: refused up front.
MIN_REQUESTS = 6


def build_config(
    pp: int, async_depth: int, requests: int, seed: int, out: Path | None
) -> EngineConfig:
    """The measuring run: a `run` request of the builtin engine, built (and checked) by it."""
    if requests < MIN_REQUESTS:
        raise UsageError(
            f"--requests must be >= {MIN_REQUESTS} to produce host hits (got {requests}): the "
            "workload's first 4 requests have 4 different prefixes"
        )
    options = run_options(
        engine=DEFAULT_ENGINE,  # the builtin runtime: its `l2` preset is what is measured
        pp=pp,
        async_depth=async_depth,
        max_total_tokens=DEVICE_TOKENS,
        protocol=PROTOCOL,
        workload="shared-prefix",
        requests=requests,
        max_new_tokens=1,
        seed=seed,
        out=None if out is None else str(out),
    )
    return build(options)


def _run(cfg: EngineConfig):
    from hicache_diag.evidence.verdict import Outcome

    result = run_trial(cfg, ["hicache-diag", *sys.argv[1:]])
    if result.verdict.outcome is Outcome.INTERRUPTED:
        raise KeyboardInterrupt  # ranks reaped, verdict written; the CLI exits 130
    if result.verdict.outcome != Outcome.OK:
        raise HicacheDiagError(
            f"the timeline run ended {result.verdict.outcome.value}: "
            f"{result.verdict.signature} (run dir {result.run_dir})"
        )


EXAMPLES = """\b
Examples:
  hicache-diag timeline       # PP2 + 1 slot: load_ack +1, write_ack +3
  hicache-diag timeline --pp 3 --async-depth 2 --json

Exit: 0 table printed, 130 interrupted, 2 bad input, 1 internal error (also
when the measuring run itself does not end ok: a bug of the tool)."""


# The run options it sets, by their own flags (its defaults are its own: [default: ...]).
Pp = flag(field_param(RunOptions, "pp"), int, 2)
AsyncDepth = flag(field_param(RunOptions, "async_depth"), int, 1)
Requests = flag(field_param(RunOptions, "requests"), int, 12)
Seed = flag(field_param(RunOptions, "seed"), int, 0)
Json = flag(Param("--json", "Print only the JSON table."), bool)
Out = flag(Param("--out", "Keep the run directory here.", "DIR"), str | None)


def register(app: typer.Typer) -> None:
    @app.command(
        "timeline", epilog=EXAMPLES, short_help="Measure the PP loop's load/write ack latencies."
    )
    def timeline(
        pp: Pp = 2,
        async_depth: AsyncDepth = 1,
        json_out: Json = False,
        requests: Requests = 12,
        seed: Seed = 0,
        out: Out = None,
    ) -> None:
        """Measure load_ack / write_ack latencies of the PP event loop, one iteration at a time."""
        from hicache_diag.diagnosis.timeline import compute_timeline
        from hicache_diag.trials.rundir import check_writable

        check_writable(out)
        build_config(pp, async_depth, requests, seed, None)  # checks only
        tmp = out is None
        run_dir = Path(tempfile.mkdtemp(prefix="hicache-timeline-")) if tmp else Path(out)
        cfg = build_config(pp, async_depth, requests, seed, run_dir)
        loop = pp + async_depth  # the PP event loop's micro-batch slots
        err_console.print(f"timeline: PP{pp} + {async_depth} async slot(s), loop size {loop}")
        _run(cfg)
        table = compute_timeline(run_dir, pp, async_depth)
        if out is None:  # nothing to keep: the table is the product
            shutil.rmtree(run_dir, ignore_errors=True)
            table = dataclasses.replace(table, run_dir=None)
        if json_out:
            print_json(table.to_json())
        else:
            from hicache_diag.cli.render.timeline import render_timeline

            render_timeline(table)
        raise typer.Exit(0)
