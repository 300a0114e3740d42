"""Deterministic workloads (ours), shared by both engines: prompts and an arrival schedule by
scheduler step. The builtin ranks feed the schedule to their scheduler; the sglang engine sends
the same prompts over HTTP.

Arrivals are spread over steps so earlier requests finish (and insert into the tree) before later
ones arrive: that is what makes prefix reuse happen. `long-prompt` (and `random`) hold enough
unique tokens to evict at the default 1024-token pool; `shared-prefix` evicts with a smaller
`--max-total-tokens`. The sample recipes are calibrated on these exact streams: changing a
generator changes every recorded reproduction.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from hicache_diag.errors import UsageError
from hicache_diag.options.run_options import RunOptions

_DEFAULT = RunOptions()


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Which workload, how many requests, how long each; the seed picks the prompts."""

    workload: str = _DEFAULT.workload
    requests: int = _DEFAULT.requests
    max_new_tokens: int = _DEFAULT.max_new_tokens
    seed: int = _DEFAULT.seed


@dataclass(frozen=True, slots=True)
class TokenizedGenerateReqInput:
    """One request as SGLang's io_struct names it: what PP0 receives and the server is sent."""

    rid: str
    input_ids: tuple[int, ...]
    max_new_tokens: int


class PoolShape(Protocol):
    """What a workload is cut to: the device pool, the prefill chunk, the vocabulary."""

    @property
    def max_total_tokens(self) -> int: ...
    @property
    def chunked_prefill_size(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Pool:
    """A PoolShape for an engine without the runtime's ServerArgs (the sglang engine)."""

    max_total_tokens: int
    chunked_prefill_size: int
    vocab_size: int


@dataclass(frozen=True, slots=True)
class Arrival:
    step: int
    req: TokenizedGenerateReqInput


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(1, vocab) for _ in range(n)]


def _shared_prefix(rng, i, prefixes, vocab):
    return prefixes[i % len(prefixes)] + _tokens(rng, rng.randint(8, 24), vocab), 2


def _random(rng, i, prefixes, vocab):
    return _tokens(rng, rng.randint(8, 64), vocab), rng.randint(1, 3)


def _long_prompt(rng, i, prefixes, vocab):
    return prefixes[0] * 2 + _tokens(rng, rng.randint(24, 96), vocab), 4


def _idle(rng, i, prefixes, vocab):
    # Mostly idle: a request now and then, the loop spins empty in between (#30158).
    return prefixes[i % len(prefixes)] + _tokens(rng, 8, vocab), 25


_KINDS = {
    "shared-prefix": _shared_prefix,
    "random": _random,
    "long-prompt": _long_prompt,
    "idle": _idle,
}


def prompt_limit(config: WorkloadConfig, sa: PoolShape) -> int:
    """Prompts are cut so a request and its new tokens fit in half the device pool."""
    limit = min(sa.chunked_prefill_size, sa.max_total_tokens // 2)
    return max(1, limit - config.max_new_tokens)


def check_fits(config: WorkloadConfig, sa: PoolShape, page_size: int) -> None:
    """Bad input (before any rank starts) when the device pool cannot hold one request: its
    shortest prompt plus its new tokens, in whole pages. Such a run would never finish one."""
    tokens = prompt_limit(config, sa) + config.max_new_tokens
    need = -(-tokens // page_size) * page_size
    if need > sa.max_total_tokens:
        raise UsageError(
            f"--max-total-tokens {sa.max_total_tokens} cannot hold one request: a "
            f"{prompt_limit(config, sa)}-token prompt and {config.max_new_tokens} new tokens "
            f"need {need} tokens ({need // page_size} pages of {page_size})"
        )


class Workload:
    """The whole schedule, built up front from the seed; `arrivals(step)` is what PP0 receives."""

    def __init__(self, config: WorkloadConfig, server_args: PoolShape) -> None:
        rng = random.Random(f"{config.workload}:{config.seed}")
        vocab = server_args.vocab_size
        prefixes = [_tokens(rng, 48, vocab) for _ in range(4)]
        make = _KINDS[config.workload]
        step, self.arrivals_list = 0, []
        for i in range(config.requests):
            prompt, gap = make(rng, i, prefixes, vocab)
            prompt = prompt[: prompt_limit(config, server_args)]
            req = TokenizedGenerateReqInput(f"r{i:04d}", tuple(prompt), config.max_new_tokens)
            self.arrivals_list.append(Arrival(step, req))
            step += gap
        self._by_step: dict[int, list[TokenizedGenerateReqInput]] = {}
        for a in self.arrivals_list:
            self._by_step.setdefault(a.step, []).append(a.req)

    @property
    def requests(self) -> list[TokenizedGenerateReqInput]:
        return [a.req for a in self.arrivals_list]

    @property
    def last_arrival_step(self) -> int:
        return self.arrivals_list[-1].step if self.arrivals_list else 0

    def arrivals(self, step: int) -> list[TokenizedGenerateReqInput]:
        return self._by_step.get(step, [])
