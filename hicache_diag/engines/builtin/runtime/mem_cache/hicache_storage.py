"""Mirrors sglang/srt/mem_cache/hicache_storage.py: the L3 key-value contract and HiCacheFile.

One file per page per rank, named as SGLang's HiCacheFile names it, so that a directory can be
inspected (and one rank's pages deleted) exactly as on a real SGLang deployment. Unlike SGLang,
a truncated or unreadable page found at read time is recorded as a storage fault and reported
as a miss: SGLang's `get()` raises `IOError("Short read ...")` and kills its IO thread silently.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from hicache_diag.faults.hooks import Hooks
from hicache_diag.options.storage_dir import check_storage_dir

logger = logging.getLogger(__name__)

# Max pages per batched storage IO call (SGLang's value).
STORAGE_BATCH_SIZE = 128


def get_hash_str(token_ids: Sequence[int], prior_hash: str | None = None) -> str:
    """SHA-256 hex of one page: the previous page's raw digest, then each token id as 4-byte
    little-endian. Chaining makes a page's key depend on the whole prefix before it."""
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for token in token_ids:
        hasher.update(int(token).to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def get_page_hashes(
    token_ids: Sequence[int], page_size: int, prior_hash: str | None = None
) -> list[str]:
    """Chained hashes of every full page of `token_ids`; a trailing partial page is skipped."""
    hashes: list[str] = []
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        prior_hash = get_hash_str(token_ids[start : start + page_size], prior_hash)
        hashes.append(prior_hash)
    return hashes


@dataclass(frozen=True, slots=True)
class HiCacheStorageConfig:
    """Who this storage belongs to; part of every key (SGLang's HiCacheStorageConfig subset)."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    model_name: str = ""


@dataclass(frozen=True, slots=True)
class StorageFault:
    """A storage problem the runtime survived; surfaces in probes and the verdict evidence."""

    op: str  # "read" | "write" | "query" | "sync"
    key: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


class HiCacheStorage(ABC):
    """Generic page key-value store. Keys are page hashes; values are flat page tensors.

    Called from the storage threads (prefetch, IO, backup) concurrently; implementations must
    be thread safe. Faults are collected, never raised, so a thread's message flow never stops.
    The batch calls carry the `storage_exists` / `storage_read` hook points for every backend.
    """

    def __init__(self, hooks: Hooks | None = None) -> None:
        self.hooks = hooks if hooks is not None else Hooks()
        self._faults: list[StorageFault] = []
        self._faults_lock = threading.Lock()

    @abstractmethod
    def get(self, key: str, target_location: torch.Tensor | None = None) -> torch.Tensor | None:
        """The page stored under `key` (read into `target_location` when given), or None."""

    @abstractmethod
    def set(self, key: str, value: torch.Tensor) -> bool:
        """Store `value` under `key`; True on success (or when the key already exists)."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether `key` is stored (SGLang: a present but empty page counts)."""

    def batch_exists(self, keys: Sequence[str], step: int | None = None) -> int:
        """Number of leading `keys` that exist, after the `storage_exists` hook. `step`: the
        scheduler step that issued the lookup (default: the hooks' current step)."""
        hit_pages = len(keys)
        for i, key in enumerate(keys):
            if not self.exists(key):
                hit_pages = i
                break
        # l3-partial-hit acts here; it may only shorten what was really found.
        at = {} if step is None else {"step": step}
        hooked = self.hooks.apply("storage_exists", hit_pages, num_pages=len(keys), **at)
        return max(0, min(int(hooked), hit_pages))

    def batch_get(
        self,
        keys: Sequence[str],
        target_locations: Sequence[torch.Tensor] | None = None,
        *,
        page_offset: int = 0,
        num_pages: int | None = None,
        step: int | None = None,
    ) -> list[torch.Tensor | None]:
        """Read pages; a `storage_read` hook returning False fails that page (l3-partial-hit).
        `page_offset`/`num_pages` place this batch inside its whole prefetch for the hook."""
        targets = target_locations if target_locations is not None else [None] * len(keys)
        total = num_pages if num_pages is not None else len(keys)
        at = {} if step is None else {"step": step}
        pages: list[torch.Tensor | None] = []
        for i, (key, target) in enumerate(zip(keys, targets, strict=True)):
            ok = self.hooks.apply(
                "storage_read", True, page_index=page_offset + i, num_pages=total, **at
            )
            pages.append(self.get(key, target) if ok else None)
        return pages

    def batch_set(self, keys: Sequence[str], values: Sequence[torch.Tensor]) -> bool:
        """Store pages in order; stops at the first failure (SGLang semantics)."""
        return all(self.set(key, value) for key, value in zip(keys, values, strict=True))

    def record_fault(self, op: str, key: str, reason: str) -> None:
        logger.warning("HiCache storage %s fault on %s: %s", op, key, reason)
        with self._faults_lock:
            self._faults.append(StorageFault(op, key, reason))

    def drain_faults(self) -> list[StorageFault]:
        with self._faults_lock:
            faults, self._faults = self._faults, []
        return faults


class HiCacheFile(HiCacheStorage):
    """One `<page_hash><suffix>.bin` per page per rank under `file_path`.

    suffix = `_<model>_<tp_rank>_<tp_size>`, plus `_<pp_size>_<pp_rank>` only when pp_size > 1
    (so a PP1 directory is invisible to a PP2 run, as in SGLang). Writes are atomic (temp file,
    then rename), so readers never see a half-written page from us; a short page left by
    someone else is a read fault. `hooks` carries the `storage_exists` / `storage_read` points.
    """

    def __init__(
        self, config: HiCacheStorageConfig, file_path: str, hooks: Hooks | None = None
    ) -> None:
        super().__init__(hooks)
        self.file_path = check_storage_dir(file_path)
        model_name = "-".join(config.model_name.split("/"))
        self.config_suffix = f"_{model_name}_{config.tp_rank}_{config.tp_size}"
        if config.pp_size > 1:
            self.config_suffix += f"_{config.pp_size}_{config.pp_rank}"

    def key_path(self, key: str) -> str:
        return os.path.join(self.file_path, f"{key}{self.config_suffix}.bin")

    def exists(self, key: str) -> bool:
        return os.path.exists(self.key_path(key))

    def get(self, key: str, target_location: torch.Tensor | None = None) -> torch.Tensor | None:
        path = self.key_path(key)
        try:
            with open(path, "rb", buffering=0) as f:
                if target_location is None:
                    return self._read_all(f, key)
                return self._read_into(f, key, target_location)
        except FileNotFoundError:
            return None
        except OSError as e:
            self.record_fault("read", key, f"unreadable {os.path.basename(path)}: {e}")
            return None

    def _read_all(self, f, key: str) -> torch.Tensor | None:
        data = f.read()
        if not data:
            self.record_fault("read", key, "short read: empty page file")
            return None
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def _read_into(self, f, key: str, target: torch.Tensor) -> torch.Tensor | None:
        expected = target.numel() * target.element_size()
        size = os.fstat(f.fileno()).st_size
        if size != expected:
            self.record_fault("read", key, f"short read: {size} of {expected} bytes")
            return None
        staging = target if target.is_contiguous() else torch.empty_like(target)
        buf = memoryview(staging.reshape(-1).view(torch.uint8).numpy())
        if f.readinto(buf) != expected:
            self.record_fault("read", key, f"short read: file shrank below {expected} bytes")
            return None
        if staging is not target:
            target.copy_(staging)
        return target

    def set(self, key: str, value: torch.Tensor) -> bool:
        path = self.key_path(key)
        if os.path.exists(path):
            return True  # pages are content-addressed: same key, same bytes
        tmp_path = os.path.join(self.file_path, f".{uuid.uuid4().hex}.tmp")
        try:
            value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tofile(tmp_path)
            os.replace(tmp_path, path)
            return True
        except (OSError, RuntimeError) as e:
            self.record_fault("write", key, str(e))
            if os.path.exists(tmp_path):
                os.remove(tmp_path)
            return False

    def clear(self) -> int:
        """Delete this rank's pages; returns how many were removed."""
        removed = 0
        for name in os.listdir(self.file_path):
            if name.endswith(f"{self.config_suffix}.bin"):
                os.remove(os.path.join(self.file_path, name))
                removed += 1
        return removed
