"""Run options written back as a scenario file (TOML) that `run --scenario` reads to the same
options: the shrunk run, replayable."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from hicache_diag.options.run_options import RunOptions

_NOT_WRITTEN = ("out", "check", "given", "faults", "scenario_fix", "switches", "engine")


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return json.dumps(str(value))


def scenario_text(options: RunOptions, header: str) -> str:
    """Every option that differs from the engine's default, the switches as the scenario's
    `fix` list, then [[fault]]s."""
    from hicache_diag.faults import parse_fault_spec

    default = type(options)()
    lines = [f"# {line}" for line in header.splitlines()]
    lines.append(f'engine = "{options.engine}"')
    for f in fields(options):
        value = getattr(options, f.name)
        if f.name in _NOT_WRITTEN or value == getattr(default, f.name):
            continue
        if f.name == "sglang_env":  # NAME=VALUE strings -> the scenario's table
            pairs = (item.partition("=") for item in value)
            table = ", ".join(f"{n} = {json.dumps(v)}" for n, _, v in pairs)
            lines.append(f"sglang_env = {{ {table} }}")
            continue
        lines.append(f"{f.name} = {_value(value)}")
    fixes = (*getattr(options, "scenario_fix", ()), *getattr(options, "switches", ()))
    if fixes:
        lines.append(f"fix = {_value(tuple(fixes))}")
    for spec in options.faults:
        parsed = parse_fault_spec(spec)
        lines += ["", "[[fault]]", f'name = "{parsed.name}"']
        lines += [f"{key} = {json.dumps(value)}" for key, value in parsed.params]
    return "\n".join(lines) + "\n"
