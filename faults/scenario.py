"""Scenario files: TOML with `[[fault]]` tables plus top-level `run` options.

```toml
description = "form B: one rank's host pool fails an alloc"
pp = 2
protocol = "legacy"
fix = ["ack-count=leader"]

[[fault]]
name = "host-alloc-fail"
rank = 1
after = 10
```
Fault tables take the keys of the spec grammar (`jitter-ms` or `jitter_ms`). An `[expect]` table
says what the run must produce (faults/expect.py; `run --check`). Every other top-level
key is passed through in `options` with snake_case names; the run command validates and merges
them, and its CLI flags override them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_diag.errors import UsageError
from hicache_diag.faults.expect import Expectation, parse_expect
from hicache_diag.faults.spec import FaultSpec, check_fault_count, make_fault_spec

try:
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10 without tomli
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Scenario:
    faults: list[FaultSpec] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    path: str | None = None
    expect: Expectation | None = None  # the `[expect]` table, when the file has one

    def fault_specs(self) -> tuple[str, ...]:
        """The faults as spec strings, the form RunConfig.faults and rank processes take."""
        return tuple(spec.to_spec() for spec in self.faults)


def _read_toml(path: Path) -> dict[str, Any]:
    if tomllib is None:
        raise UsageError("reading a scenario needs Python >= 3.11 or the tomli package")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read scenario {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"scenario {str(path)!r} is not UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        detail = " ".join(str(exc).split())
        raise UsageError(f"scenario {str(path)!r} is not valid TOML: {detail}") from None


def _value_text(value: Any) -> str:
    """A TOML value as spec text: numbers and strings as written, a list of ranks as `1|2`."""
    if isinstance(value, bool) or not isinstance(value, int | float | str | list):
        raise ValueError(f"a number or a string, not a TOML {type(value).__name__}")
    if isinstance(value, list):
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ValueError("a list of ranks such as [1, 2]")
        return "|".join(str(v) for v in value)
    return str(value)


def _fault_from_table(table: Any, where: str) -> FaultSpec:
    if not isinstance(table, dict):
        raise UsageError(f"{where} must be a table; write faults as [[fault]] tables")
    params = dict(table)
    name = params.pop("name", None)
    if not isinstance(name, str) or not name.strip():
        raise UsageError(f'{where} needs name = "<fault>", e.g. name = "dma-delay"')
    texts = []
    for key, value in params.items():
        try:
            texts.append((key, _value_text(value)))
        except ValueError as exc:
            raise UsageError(f"{where} ({name}): key {key!r} must be {exc}") from None
    try:
        return make_fault_spec(name, texts)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and check a scenario file; any problem is one UsageError line naming the file."""
    path = Path(path)
    data = _read_toml(path)
    tables = data.pop("fault", [])
    if not isinstance(tables, list):
        raise UsageError(f"scenario {str(path)!r}: 'fault' must be [[fault]] tables")
    check_fault_count(len(tables), f"scenario {str(path)!r}")
    faults = [
        _fault_from_table(t, f"scenario {str(path)!r}, fault #{i + 1}")
        for i, t in enumerate(tables)
    ]
    description = data.pop("description", "")
    if not isinstance(description, str):
        raise UsageError(f"scenario {str(path)!r}: description must be a string")
    expect = None
    if "expect" in data:
        expect = parse_expect(data.pop("expect"), f"scenario {str(path)!r}")
    options = {key.replace("-", "_"): value for key, value in data.items()}
    return Scenario(faults, options, description, str(path), expect)
