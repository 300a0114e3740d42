"""The spec grammar: parsing, normalization, round trip, and every bad-input message."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache_diag.errors import UsageError
from hicache_diag.faults import FAULTS, FaultSpec, parse_fault_spec, validate_faults


def test_parse_typed_keys():
    spec = parse_fault_spec("dma-delay:rank=1|2,ms=40,jitter-ms=5,dir=write,p=0.5,after=3,until=9")
    fault = spec.build()
    assert spec.name == "dma-delay"
    assert fault.rank == (1, 2) and fault.ms == 40.0 and fault.jitter_ms == 5.0
    assert fault.dir == "write" and fault.p == 0.5 and (fault.after, fault.until) == (3, 9)
    assert fault.targets(1) and fault.targets(2) and not fault.targets(0)


def test_name_alone_and_defaults():
    fault = parse_fault_spec("host-alloc-fail").build()
    assert fault.rank is None and fault.p == 1.0 and fault.every == 1
    assert fault.targets(0) and fault.targets(7)


def test_star_rank_means_every_rank():
    assert parse_fault_spec("p2p-delay:rank=*,ms=3").build().rank is None


def test_normalizes_snake_case_and_spaces():
    spec = parse_fault_spec(" dma_delay : jitter_ms = 5 , ms=1 ")
    assert spec == FaultSpec("dma-delay", (("jitter-ms", "5"), ("ms", "1")))
    assert spec.to_spec() == "dma-delay:jitter-ms=5,ms=1"


def test_every_registered_fault_parses_with_its_effect_key():
    for name, cls in FAULTS.items():
        params = f":{cls.EFFECT_KEYS[0]}=1" if cls.EFFECT_KEYS else ""
        assert parse_fault_spec(name + params).name == name
        assert set(cls.key_names()) >= {"rank", "p", "after", "until", "seed"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "malformed fault spec ''; expected NAME[:key=value"),
        ("dma-delay:", "malformed fault spec 'dma-delay:'"),
        ("dma-delay:ms", "'ms' is not key=value"),
        ("dma-delay:ms=", "'ms=' is not key=value"),
        ("dma-delay:ms=1,,", "'' is not key=value"),
        (
            "dma-dely:ms=1",
            "unknown fault 'dma-dely' (did you mean 'dma-delay'?); valid: dma-delay, "
            "host-alloc-fail, clock-skew, l3-partial-hit, p2p-delay, rank-stall",
        ),
        ("nope", "unknown fault 'nope'; valid: dma-delay"),
        ("dma-delay:foo=1", "unknown key 'foo'; valid: rank, p, after, until, seed, ms, jitter-ms"),
        ("p2p-delay:every=2,ms=1", "fault 'p2p-delay': unknown key 'every'"),
        ("dma-delay:ms=abc", "bad value 'abc' for key 'ms'; expected a number"),
        ("dma-delay:ms=-1", "expected a number of milliseconds from 0 to 86400000"),
        ("dma-delay:ms=nan", "expected a number of milliseconds from 0"),
        (
            "dma-delay:ms=1,dir=up",
            "bad value 'up' for key 'dir'; expected one of write, load, both",
        ),
        ("dma-delay:ms=1,p=1.5", "expected a probability between 0 and 1"),
        ("dma-delay:ms=1,after=-2", "expected a step number from 0 to"),
        ("dma-delay:ms=1,after=1.5", "expected a step number"),
        ("rank-stall:ms=1,every=0", "bad value '0' for key 'every'; expected an integer from 1 to"),
        (
            "dma-delay:ms=1,seed=-1",
            "bad value '-1' for key 'seed'; expected an integer from 0 to 4294967295",
        ),
        ("dma-delay:ms=1,rank=x", "expected a rank (e.g. 1), ranks joined by | (e.g. 1|2), or *"),
        ("dma-delay:ms=1,rank=1|", "for key 'rank'"),
        ("dma-delay:ms=1,rank=-1", "for key 'rank'"),
        ("l3-partial-hit:keep=2", "bad value '2' for key 'keep'; expected a probability"),
        ("rank-stall:ms=1,after=10,until=3", "until=3 is before after=10; the step window needs"),
        ("dma-delay:ms=1,ms=2", "key 'ms' given twice"),
        ("clock-skew", "does nothing without one of: offset-ms, drift-ppm, jitter-us"),
        ("l3-partial-hit:rank=1", "does nothing without one of: keep, holes, slow-ms"),
        ("rank-stall", "does nothing without one of: ms"),
        ("dma-delay:dir=load", "does nothing without one of: ms, jitter-ms"),
    ],
)
def test_bad_spec_is_one_line_with_choices(text, message):
    with pytest.raises(UsageError) as exc:
        parse_fault_spec(text)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_window_of_one_step_is_valid():
    fault = parse_fault_spec("rank-stall:ms=1,after=4,until=4").build()
    assert (fault.after, fault.until) == (4, 4)


def test_validate_faults_checks_the_topology():
    specs = validate_faults(["dma-delay:rank=3,ms=1", "host-alloc-fail"], pp_size=2, tp_size=2)
    assert [s.name for s in specs] == ["dma-delay", "host-alloc-fail"]
    with pytest.raises(UsageError) as exc:
        validate_faults(["p2p-delay:rank=1|2,ms=1"], pp_size=2, tp_size=1)
    assert "rank 2 is outside the topology (pp=2 x tp=1" in str(exc.value)
    assert "valid: 0, 1 or *" in str(exc.value)


def test_validate_faults_rechecks_hand_built_specs():
    with pytest.raises(UsageError, match="unknown fault 'bogus'"):
        validate_faults([FaultSpec("bogus")], pp_size=1, tp_size=1)
    with pytest.raises(UsageError, match="unknown key 'x'"):
        validate_faults([FaultSpec("host-alloc-fail", (("x", "1"),))], pp_size=1, tp_size=1)


_numbers = st.integers(0, 10_000).map(str)
_probs = st.sampled_from(["0", "0.25", "0.5", "1"])
_ranks = st.one_of(
    st.just("*"),
    st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True).map(
        lambda rs: "|".join(map(str, sorted(rs)))
    ),
)


@st.composite
def _specs(draw):
    name = draw(st.sampled_from(list(FAULTS)))
    cls = FAULTS[name]
    params = {}
    if cls.EFFECT_KEYS:
        key = cls.EFFECT_KEYS[0]
        bounded = {"keep": st.just("0.5"), "phase-ms": st.integers(0, 999).map(str)}
        params[key] = draw(bounded.get(key, _numbers))
    if draw(st.booleans()):
        params["rank"] = draw(_ranks)
    if draw(st.booleans()):
        params["p"] = draw(_probs)
    if draw(st.booleans()):
        after = draw(st.integers(0, 50))
        params["after"], params["until"] = str(after), str(after + draw(st.integers(0, 50)))
    if draw(st.booleans()):
        params["seed"] = draw(_numbers)
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")


@settings(deadline=None)  # a shared 2-core box: never fail on a slow example
@given(_specs())
def test_to_spec_round_trips(text):
    spec = parse_fault_spec(text)
    again = parse_fault_spec(spec.to_spec())
    assert again == spec
    assert again.build() == spec.build()
