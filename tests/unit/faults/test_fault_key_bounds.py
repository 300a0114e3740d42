"""Every numeric fault key is bounded by what the tool can act on, refused past it with one line
that names the largest value accepted (issue 29: `ms=1e300` overflowed a rank's own sleep)."""

import re
from dataclasses import fields
from pathlib import Path

import pytest

from hicache_diag.errors import UsageError
from hicache_diag.faults import FAULTS, parse_fault_spec, validate_faults
from hicache_diag.faults import keys as K
from hicache_diag.faults.base import key_name
from hicache_diag.faults.scenario import load_scenario
from hicache_diag.faults.spec import MAX_FAULTS
from hicache_diag.options import limits

# Each bounded parser: its largest accepted value as text, and a value just past it.
BOUNDED = {
    K.millis: (str(K.MAX_MS), str(K.MAX_MS + 1)),
    K.micros: (str(K.MAX_US), str(K.MAX_US + 1)),
    K.offset_millis: (str(-K.MAX_MS), str(-K.MAX_MS - 1)),
    K.ppm: (str(K.MAX_PPM), str(K.MAX_PPM + 1)),
    K.seconds: ("86400", "86400.5"),
    K.probability: ("1", "1.0001"),
    K.step: (str(K.MAX_INT), str(K.MAX_INT + 1)),
    K.count: (str(K.MAX_INT), str(K.MAX_INT + 1)),
    K.tokens: (str(K.MAX_INT), str(K.MAX_INT + 1)),
    K.seed: ("4294967295", "4294967296"),
}
HUGE = ("1e300", "inf", "-inf", "nan", "9" * 5000)


def _numeric_keys():
    for name, cls in FAULTS.items():
        for f in fields(cls):
            parse = f.metadata["parse"]
            if parse in BOUNDED:
                yield pytest.param(name, key_name(f.name), parse, id=f"{name}.{key_name(f.name)}")


def _spec(name: str, key: str, value: str) -> str:
    cls = FAULTS[name]
    effect = [k for k in cls.EFFECT_KEYS if k != key]
    extra = f",{effect[0]}=1" if effect and key not in cls.EFFECT_KEYS else ""
    return f"{name}:{key}={value}{extra}"


def test_every_numeric_key_has_a_bounded_type():
    """No fault key is left with an unbounded number type (the old `real`)."""
    assert not hasattr(K, "real")
    for cls in FAULTS.values():
        for f in fields(cls):
            parse = f.metadata["parse"]
            assert parse in BOUNDED or parse in (K.ranks,) or parse.__name__ == "parse", f.name


@pytest.mark.parametrize(("name", "key", "parse"), list(_numeric_keys()))
def test_past_the_bound_is_one_line_naming_the_largest(name, key, parse):
    largest, past = BOUNDED[parse]
    for text in (past, *HUGE):
        with pytest.raises(UsageError) as err:
            parse_fault_spec(_spec(name, key, text))
        message = str(err.value)
        assert "\n" not in message and f"for key {key!r}" in message
        bounds = re.findall(r"-?\d+", message.split("expected", 1)[1])
        assert largest.lstrip("-") in [b.lstrip("-") for b in bounds], message


@pytest.mark.parametrize(("name", "key", "parse"), list(_numeric_keys()))
def test_the_named_bound_itself_is_accepted_by_the_type(name, key, parse):
    largest, _ = BOUNDED[parse]
    assert parse(largest) == pytest.approx(float(largest))


def test_the_bounds_are_the_tools_own_limits():
    assert K.MAX_SECONDS == limits.MAX_SECONDS and K.SEED_MAX == limits.SEED_MAX


def test_the_reported_overflow_is_refused():
    with pytest.raises(UsageError, match=r"'ms'; expected .* to 86400000 \(one day\)"):
        validate_faults(["rank-stall:rank=1,ms=1e300"], 2, 1)


def test_a_cap_on_faults_per_run_is_named():
    same = ["rank-stall:rank=1,ms=1"] * (MAX_FAULTS + 1)
    with pytest.raises(
        UsageError, match=rf"^{MAX_FAULTS + 1} faults in a run; the most .* {MAX_FAULTS}"
    ):
        validate_faults(same, 2, 1)
    assert len(validate_faults(same[:MAX_FAULTS], 2, 1)) == MAX_FAULTS


def test_a_scenario_past_the_cap_is_refused_before_its_tables_are_read(tmp_path: Path):
    path = tmp_path / "many.toml"
    path.write_text('[[fault]]\nname = "rank-stall"\nms = 1\n' * 50_000)
    with pytest.raises(UsageError, match=r"50000 faults in scenario .*many.toml.* is 64"):
        load_scenario(path)
