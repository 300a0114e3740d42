"""Scenario files: [[fault]] tables, pass-through run options, and every bad file."""

import pytest

from hicache_diag.errors import UsageError
from hicache_diag.faults import FaultSpec, load_scenario

GOOD = """
description = "form B on rank 1"
pp = 2
async-depth = 1
protocol = "legacy"
fix = ["ack-count=leader"]
hicache_size = "16MiB"
seed = 7

[[fault]]
name = "host-alloc-fail"
rank = 1
after = 10
every = 2

[[fault]]
name = "dma_delay"
rank = [0, 1]
jitter_ms = 2.5
ms = 40
dir = "write"
"""


def _write(tmp_path, text, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_loads_faults_and_options(tmp_path):
    scenario = load_scenario(_write(tmp_path, GOOD))
    dma = (("rank", "0|1"), ("jitter-ms", "2.5"), ("ms", "40"), ("dir", "write"))
    assert scenario.faults == [
        FaultSpec("host-alloc-fail", (("rank", "1"), ("after", "10"), ("every", "2"))),
        FaultSpec("dma-delay", dma),
    ]
    assert scenario.options == {
        "pp": 2,
        "async_depth": 1,
        "protocol": "legacy",
        "fix": ["ack-count=leader"],
        "hicache_size": "16MiB",
        "seed": 7,
    }
    assert scenario.description == "form B on rank 1"
    assert scenario.fault_specs() == (
        "host-alloc-fail:rank=1,after=10,every=2",
        "dma-delay:rank=0|1,jitter-ms=2.5,ms=40,dir=write",
    )


def test_options_only_and_empty_files_are_fine(tmp_path):
    assert load_scenario(_write(tmp_path, "pp = 3\n")).faults == []
    assert load_scenario(_write(tmp_path, "")).options == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pp = ", "is not valid TOML: "),
        ("fault = 3", "'fault' must be [[fault]] tables"),
        ("fault = [1]", "fault #1 must be a table"),
        ("[[fault]]\nrank = 1", 'fault #1 needs name = "<fault>"'),
        ("[[fault]]\nname = 'dma-dely'\nms = 1", "fault #1: unknown fault 'dma-dely'"),
        (
            "[[fault]]\nname = 'host-alloc-fail'\n[[fault]]\nname = 'p2p-delay'\nbogus = 1",
            "fault #2: fault 'p2p-delay': unknown key 'bogus'; valid: rank",
        ),
        ("[[fault]]\nname = 'rank-stall'\nms = true", "key 'ms' must be a number or a string"),
        ("[[fault]]\nname = 'rank-stall'\nms = 1\nrank = []", "key 'rank' must be a list of ranks"),
        ("[[fault]]\nname = 'rank-stall'\nms = -5", "bad value '-5' for key 'ms'"),
        ("[[fault]]\nname = 'rank-stall'\nms = 5\nafter = 9\nuntil = 2", "until=2 is before"),
        ("[[fault]]\nname = 'rank-stall'\nms = 5\nms_ = 1", "unknown key 'ms-'"),
        ("description = 3", "description must be a string"),
    ],
)
def test_bad_scenario_is_one_line_naming_the_file(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(UsageError) as exc:
        load_scenario(path)
    assert message in str(exc.value)
    assert str(path) in str(exc.value)
    assert "\n" not in str(exc.value)


def test_unreadable_scenarios(tmp_path):
    with pytest.raises(UsageError, match="cannot read scenario .*No such file"):
        load_scenario(tmp_path / "missing.toml")
    with pytest.raises(UsageError, match="cannot read scenario"):
        load_scenario(tmp_path)  # a directory
    path = tmp_path / "bin.toml"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError, match="is not UTF-8 text"):
        load_scenario(path)
