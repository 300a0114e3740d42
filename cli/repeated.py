"""A flag that takes one value, given twice on one command line (`--pp 2 ... --pp 3`): click
keeps the last silently, so the user's first value is lost without a word. Refused here, one
line, before anything runs. Repeatable flags (`--fault`, `--fix`, ...) are left alone; a switch
given twice the same way (`--json --json`) means what it says once; given both ways
(`--force ... --no-force`, where a command has both) it contradicts itself and is refused.
bisect's pass-through run flags are checked as run's."""

from __future__ import annotations

from typing import Any

from hicache_diag.errors import UsageError


def _options(command: Any) -> dict[str, Any]:
    """Option string -> its click parameter, for every option of `command`."""
    found = {}
    for param in getattr(command, "params", []):
        for opt in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())):
            if opt.startswith("-"):
                found[opt] = param
    return found


def refuse_repeated(group: Any, argv: list[str]) -> None:
    commands = getattr(group, "commands", {})
    sub = next((a for a in argv if not a.startswith("-")), None)
    command = commands.get(sub)
    if command is None:
        return
    options = _options(command)
    if sub == "bisect":  # its extra arguments are run's flags
        options = {**_options(commands.get("run")), **options}
    seen: dict[str, str] = {}  # param name -> how it was first written
    tokens = argv[argv.index(sub) + 1 :]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":
            return
        name, eq, inline = token.partition("=")
        param = options.get(name)
        if param is None:
            continue
        flag = getattr(param, "is_flag", False) or getattr(param, "count", False)
        value = inline if eq else None
        if not flag and not eq and i < len(tokens):
            value, i = tokens[i], i + 1
        if getattr(param, "multiple", False) or getattr(param, "count", False):
            continue
        shown = name if flag else f"{name} {value}"
        first = seen.setdefault(param.name, shown)
        if first is shown or (flag and first == shown):
            continue  # the first time, or the same switch again: said once
        raise UsageError(
            f"{first} and {shown}: one option given twice (only the last would count); give it once"
        )
