import pytest

from hicache_diag.engines.builtin.runtime.protocol import (
    PRESETS,
    SWITCHES,
    build_protocol,
    parse_fix,
)
from hicache_diag.errors import UsageError


def test_presets_have_the_design_meaning():
    legacy, l2, full = (build_protocol(p).as_dict() for p in ("legacy", "l2", "full"))
    assert all(legacy[n] == s.legacy for n, s in SWITCHES.items())
    assert all(full[n] == s.fixed[0] for n, s in SWITCHES.items())
    assert l2["ack-count"] == "leader-batched" and l2["tp-collective"] == "unconditional"
    assert l2["inflight-sends"] == "bounded" and l2["host-capacity"] == "min"
    assert l2["l3-hit"] == "local" and l2["l3-progress"] == "local"
    assert l2["host-alloc"] == "local" and l2["lru-clock"] == "monotonic"
    assert set(PRESETS) == {"legacy", "l2", "full"}


def test_fix_flips_one_switch():
    p = build_protocol("legacy", ["ack-count=leader"])
    assert p.mode("ack-count") == "leader"
    assert p.mode("host-alloc") == "local"
    assert p.preset == "legacy+fixes"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [("ack-count", "NAME=MODE"), ("bogus=x", "valid: ack-count"), ("ack-count=x", "leader")],
)
def test_bad_fix_names_valid_choices(spec, needle):
    with pytest.raises(UsageError, match=needle):
        parse_fix(spec)


def test_unknown_preset():
    with pytest.raises(UsageError, match="legacy, l2, full"):
        build_protocol("newest")
