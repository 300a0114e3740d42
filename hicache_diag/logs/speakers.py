"""Who speaks on a line, from the process name an engine or collector puts in front of it:
vLLM's worker processes (`(Worker_TP10 pid=281) `, `(Worker_PP1_TP3 pid=9) `, `(VllmWorker
rank=2 pid=9) `) are ranks, and the prefix that names them is peeled with the other carriers
(logs/carriers.py), so the rank is read here first and kept as a rank label in front of the
line. A worker index alone (`VllmWorker-3`, vLLM's global rank) is read as TP, as the text
shows no PP. The engine core (`EngineCore_DP0`) and the API server are processes, not ranks."""

from __future__ import annotations

import re

from hicache_diag.evidence.ranks import RankId, parse_rank_tokens

_PREFIX = re.compile(
    r"^\((?P<name>(?:Vllm)?Worker(?:_[A-Z]{2,8}\d{1,5}){0,4})(?P<rest>[ -][^)]{0,120})?\)\s"
)
_RANK_FIELD = re.compile(r"\brank=(\d{1,6})\b")
# vLLM's executor naming the worker that died (`Worker proc VllmWorker-3 died unexpectedly`).
_WORKER_NAME = re.compile(
    r"\b(?:Vllm)?Worker(?:-(?P<n>\d{1,6})|(?P<dims>(?:_[A-Z]{2,8}\d{1,5}){1,4}))\b"
)


def _tokens(name: str, rest: str = "") -> str | None:
    if "_" in name:
        return " ".join(name.split("_")[1:])
    if m := _RANK_FIELD.search(rest):
        return f"TP{m[1]}"
    return None


def speaker_label(line: str) -> str | None:
    """The rank tokens (`TP10`, `PP1 TP3`) a worker's prefix at the start of `line` names."""
    m = _PREFIX.match(line) if line[:1] == "(" else None
    return _tokens(m["name"], m["rest"] or "") if m else None


def worker_rank(text: str) -> RankId | None:
    """The rank of the worker a message names (`VllmWorker-3`, `Worker_TP10`); None if none."""
    m = _WORKER_NAME.search(text) if "Worker" in text else None
    if m is None:
        return None
    return parse_rank_tokens(f"TP{m['n']}" if m["n"] else m["dims"].replace("_", " "))


_ANYWHERE = re.compile(r"\((?:Vllm)?Worker[^()]{0,160}\)")


def speaker_in(text: str) -> str | None:
    """The rank a worker's process name names anywhere in `text` (a wrapper learned whole)."""
    m = _ANYWHERE.search(text) if "Worker" in text else None
    return speaker_label(m.group() + " ") if m else None
