"""The sglang engine's run options: the common ones (options/run_options.py) plus the release to
run, its own switches and its nodes, each declared once with its flag; and the refusals only
this engine's options can state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from hicache_diag.engines.sglang.patch_overlay import NO_PATCH, check_patch_file
from hicache_diag.errors import UsageError
from hicache_diag.options.limits import check_int
from hicache_diag.options.params import HOSTS, SSH_CONFIG, VIA, Param, again, option
from hicache_diag.options.run_options import ENV_NAME, RunOptions

_BUILTIN_SWITCH = (
    "{how} is a builtin-engine switch; with --engine sglang the protocol is the one the installed "
    "SGLang release contains (pick a release with --sglang-python)"
)


@dataclass(frozen=True, slots=True)
class SglangOptions(RunOptions):
    """The real SGLang server: the release to run and its own switches. Real SGLang on a 2-core
    CPU starts in tens of seconds and steps in milliseconds, so silence means more here."""

    engine: ClassVar[str] = "sglang"
    summary: ClassVar[str] = "the real SGLang server"
    trial_timeout_s: ClassVar[float] = 900.0  # a bisect trial: start-up alone takes tens of s
    # SGLang's CPU path (torch_native attention over a cached prefix, float32) strays further
    # from `transformers`: 0.5.19 runs flipped tokens at reference gaps of 0.00115 and 0.0019,
    # the rest of each output identical.
    tie_tolerance: ClassVar[float] = 5e-3
    # Flags of the other engine refused with a reason of their own.
    foreign: ClassVar[Mapping[str, str]] = {
        "protocol": _BUILTIN_SWITCH,
        "switches": _BUILTIN_SWITCH,
    }

    requests: int = again(RunOptions, "requests", 24)
    hang_timeout: float = again(RunOptions, "hang_timeout", 30.0)
    model: str | None = option(
        None, Param("--model", "A model directory.", "DIR", default_text="a tiny Llama")
    )
    sglang_arg: tuple[str, ...] = option(
        (),
        Param(
            "--sglang-arg",
            "One more launch_server argument, e.g. --sglang-arg=--watchdog-timeout=60; repeatable.",
            "ARG",
        ),
    )
    sglang_env: tuple[str, ...] = option(
        (),
        Param(
            "--sglang-env",
            "One more environment variable for the server, e.g. --sglang-env "
            "SGLANG_REQ_WAITING_TIMEOUT=1.5; repeatable.",
            "NAME=VALUE",
        ),
        scenario_kind=(dict,),
    )
    sglang_python: str | None = option(
        None,
        Param(
            "--sglang-python",
            "The Python whose SGLang release to run.",
            "PATH",
            default_text="this one",
        ),
    )
    sglang_version: str | None = option(None, None)  # a scenario's release (bisect's axis)
    # A candidate fix on the real engine: an overlay of the release's package (patch_overlay.py).
    patch: str | None = option(
        None,
        Param(
            "--patch",
            "A unified diff against the release's sglang/ package (as `patch -p1` reads it from "
            "site-packages), applied to a cached overlay the launch imports first; the release "
            "is never touched. `none`: no patch (bisect: --switch patch=none,FILE).",
            "FILE",
        ),
        scenario=False,
    )
    sglang_consensus_checker: bool = option(
        False,
        Param(
            "--sglang-consensus-checker",
            "Turn on SGLang's rank consensus checker (SGLANG_ENABLE_RANK_CONSENSUS_CHECKER); "
            "what it reports is verdict evidence.",
        ),
        scenario=False,
    )
    # SGLang's --nnodes: one server per node, PP stages on different nodes
    nnodes: int = option(
        1,
        Param(
            "--nnodes",
            "One server per node with SGLang's --nnodes/--node-rank/--dist-init-addr, PP stages "
            "on different nodes (loopback nodes here; --hosts: node i on the i-th host).",
            "N",
        ),
    )
    hosts: str | None = option(None, HOSTS)  # else loopback nodes (docs/cluster.md)
    via: str | None = option(None, VIA)  # run places its nodes through ssh only
    ssh_config: str | None = option(None, SSH_CONFIG)
    # Trials of one config reuse a server proven clean on every rank (sglang/warm.py).
    warm_server: bool = option(
        False,
        Param(
            "--warm-server",
            "Several trials (run --check on a rate scenario, bisect, hunt): run them one after "
            "another on one server, reused only when every rank proves its state equal to a "
            "fresh server's (else restarted); each trial's manifest says which.",
        ),
        scenario=False,
    )

    def __post_init__(self) -> None:
        RunOptions.__post_init__(self)
        why = self._idle_nodes() or self._warm_across_nodes() or self._hosts() or self._patch()
        if why:
            raise UsageError(why)
        self._check_nodes()
        if self.max_total_tokens < 64 * self.page_size:
            raise UsageError(
                f"{self.how('max_total_tokens')} {self.max_total_tokens} is too small for SGLang "
                f"(use >= {64 * self.page_size})"
            )
        if self.host_bytes % 1024**3:
            raise UsageError(
                f"{self.how('hicache_size')} {self.hicache_size}: with --engine sglang the host "
                "pool is sized in whole GiB (SGLang's unit); use e.g. 1GiB, or --hicache-ratio "
                "for smaller pools"
            )
        self.server_env()

    def _check_nodes(self) -> None:
        """SGLang splits PP stages over nodes, or a stage's TP ranks when there are more nodes
        than stages (entrypoints/engine.py `_calculate_rank_ranges`): each node a whole share."""
        check_int(self.how("nnodes"), self.nnodes, 1)
        pp, n = self.pp, self.nnodes
        if pp % n == 0 or (n % pp == 0 and self.tp % (n // pp) == 0):
            return
        raise UsageError(
            f"{self.how('nnodes')} {n} does not split --pp {pp} x --tp {self.tp} evenly: give "
            "a divisor of --pp (whole stages per node), or a multiple of it that divides --tp"
        )

    def _idle_nodes(self) -> str | None:
        ranks = self.pp * self.tp
        if self.nnodes > ranks:
            return (
                f"{self.how('nnodes')} {self.nnodes} is more nodes than ranks ({ranks}: --pp "
                f"{self.pp} x --tp {self.tp}): a node would run nothing"
            )
        return None

    def _warm_across_nodes(self) -> str | None:
        if self.warm_server and self.nnodes > 1:
            return (
                f"{self.how('warm_server')} and {self.how('nnodes')} {self.nnodes} together: a "
                "warm server is proven clean on one node only; drop one of them"
            )
        return None

    def _patch(self) -> str | None:
        """--patch: one file (bisect compares several with --switch), on this machine's
        release (the overlay is a local directory)."""
        if self.patch is None or self.patch == NO_PATCH:
            return None
        if "," in self.patch and not Path(self.patch).expanduser().is_file():
            return (
                f"{self.how('patch')} {self.patch}: one patch file per run; to compare patches "
                f"give bisect --switch patch={NO_PATCH},FILE"
            )
        if self.hosts:
            return (
                f"{self.how('patch')} with {HOSTS}: the patched overlay is a directory on this "
                "machine; other hosts would run their release unpatched"
            )
        check_patch_file(self.patch, self.how("patch"))
        return None

    def _hosts(self) -> str | None:
        """--hosts/--via/--ssh-config place the nodes of --nnodes on machines (remote_nodes.py
        checks that they answer); each is refused where it would do nothing."""
        via, hosts = self.via, self.hosts
        if via is not None and via != "ssh":
            return (
                f"run {VIA} {via}: not built; run places its nodes on machines through ssh "
                f"({VIA} ssh {HOSTS} A,B)"
            )
        if not hosts:
            if via or self.ssh_config:
                given = f"{VIA} ssh" if via else str(SSH_CONFIG)
                return f"{given} places the nodes of --nnodes on {HOSTS} A,B: give {HOSTS}"
            return None
        count = len(hosts.split(","))
        if self.nnodes <= 1:
            return f"{HOSTS} places the nodes of --nnodes N on machines: give --nnodes {count}"
        if count != self.nnodes:
            return (
                f"{HOSTS} names {count} host(s) for {self.how('nnodes')} {self.nnodes}: give one "
                "host per node, node 0's first"
            )
        return None

    def server_env(self) -> tuple[tuple[str, str], ...]:
        """--sglang-env NAME=VALUE pairs: the server's own switches."""
        pairs = []
        for item in self.sglang_env:
            name, sep, val = item.partition("=")
            if not sep or not ENV_NAME.fullmatch(name):
                raise UsageError(
                    f"{self.how('sglang_env')} {item!r}: expected NAME=VALUE, e.g. "
                    "SGLANG_REQ_WAITING_TIMEOUT=1.5"
                )
            pairs.append((name, val))
        return tuple(pairs)
