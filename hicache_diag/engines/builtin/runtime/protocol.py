"""Protocol switches (`--switch NAME=MODE`) and presets (`--protocol legacy|l2|full`); ours.

Each switch turns one per-rank quantity into a protocol quantity. The legacy mode reproduces the
historical bug; the fixed modes are the upstream changes named in `upstream`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from hicache_diag.errors import UsageError


@dataclass(frozen=True, slots=True)
class Switch:
    name: str
    legacy: str
    fixed: tuple[str, ...]  # the first one is the mode `full` picks
    upstream: str
    what: str

    @property
    def modes(self) -> tuple[str, ...]:
        return (self.legacy, *self.fixed)


SWITCHES: MappingProxyType[str, Switch] = MappingProxyType(
    {
        s.name: s
        for s in (
            Switch(
                "ack-count",
                "local",
                ("leader-batched", "leader"),
                "#27285, #33473",
                "who counts ready DMA acks: each rank, or PP0 relayed down the PP chain",
            ),
            Switch(
                "tp-collective",
                "conditional",
                ("unconditional",),
                "#26923, #28429",
                "whether writing_check skips its TP all-reduce when the local queue is empty",
            ),
            Switch(
                "inflight-sends",
                "unbounded",
                ("bounded",),
                "#28902, #28916",
                "whether PP0 drains last round's pp_sync isends before sending more",
            ),
            Switch(
                "host-capacity",
                "local",
                ("min",),
                "#29258",
                "host pool token capacity: per-rank, or MIN across PP",
            ),
            Switch(
                "host-alloc",
                "local",
                ("two-phase",),
                "#31425",
                "write_backup and L3 prefetch host alloc: local, or reserve -> MIN -> commit/abort",
            ),
            Switch(
                "lru-clock",
                "monotonic",
                ("logical",),
                "#22759",
                "last_access_time from time.monotonic() or a logical step counter",
            ),
            Switch(
                "l3-hit",
                "local",
                ("min",),
                "#27010",
                "L3 hit length: local batch_exists, or MIN in the prefetch thread",
            ),
            Switch(
                "l3-progress",
                "local",
                ("min",),
                "#27010",
                "L3 completed tokens: local, or MIN in the prefetch sync thread",
            ),
        )
    }
)

L2_SWITCHES = ("ack-count", "tp-collective", "inflight-sends", "host-capacity")

PRESETS: MappingProxyType[str, dict[str, str]] = MappingProxyType(
    {
        "legacy": {s.name: s.legacy for s in SWITCHES.values()},
        # The L2 fixes merged upstream by 2026-08; L3 and the rest stay legacy.
        "l2": {
            s.name: (s.fixed[0] if s.name in L2_SWITCHES else s.legacy) for s in SWITCHES.values()
        },
        "full": {s.name: s.fixed[0] for s in SWITCHES.values()},
    }
)


def _switch_attr(name: str) -> str:
    return name.replace("-", "_")


@dataclass(frozen=True, slots=True)
class ProtocolConfig:
    """The mode of every switch; attribute names are the switch names in snake_case."""

    ack_count: str = PRESETS["full"]["ack-count"]
    tp_collective: str = PRESETS["full"]["tp-collective"]
    inflight_sends: str = PRESETS["full"]["inflight-sends"]
    host_capacity: str = PRESETS["full"]["host-capacity"]
    host_alloc: str = PRESETS["full"]["host-alloc"]
    lru_clock: str = PRESETS["full"]["lru-clock"]
    l3_hit: str = PRESETS["full"]["l3-hit"]
    l3_progress: str = PRESETS["full"]["l3-progress"]
    preset: str | None = field(default="full", compare=False)

    def __post_init__(self) -> None:
        for sw in SWITCHES.values():
            mode = getattr(self, _switch_attr(sw.name))
            if mode not in sw.modes:
                raise UsageError(
                    f"unknown mode {mode!r} for switch {sw.name!r}; valid: {', '.join(sw.modes)}"
                )

    def mode(self, name: str) -> str:
        return getattr(self, _switch_attr(name))

    def as_dict(self) -> dict[str, str]:
        return {name: self.mode(name) for name in SWITCHES}

    def is_legacy(self, name: str) -> bool:
        return self.mode(name) == SWITCHES[name].legacy


def parse_fix(spec: str) -> tuple[str, str]:
    """Parse one `--switch NAME=MODE` into (name, mode), validated against SWITCHES."""
    name, sep, mode = spec.partition("=")
    name, mode = name.strip(), mode.strip()
    if not sep or not name or not mode:
        raise UsageError(f"malformed --switch {spec!r}; expected NAME=MODE, e.g. ack-count=leader")
    if name not in SWITCHES:
        raise UsageError(f"unknown switch {name!r}; valid: {', '.join(SWITCHES)}")
    if mode not in SWITCHES[name].modes:
        raise UsageError(
            f"unknown mode {mode!r} for switch {name!r}; valid: {', '.join(SWITCHES[name].modes)}"
        )
    return name, mode


def build_protocol(preset: str = "full", fixes: list[str] | tuple[str, ...] = ()) -> ProtocolConfig:
    """A preset with `--switch` overrides applied on top, in order."""
    if preset not in PRESETS:
        raise UsageError(f"unknown protocol preset {preset!r}; valid: {', '.join(PRESETS)}")
    modes = dict(PRESETS[preset])
    for spec in fixes:
        name, mode = parse_fix(spec)
        modes[name] = mode
    label = preset if modes == PRESETS[preset] else f"{preset}+fixes"
    return ProtocolConfig(**{_switch_attr(k): v for k, v in modes.items()}, preset=label)
