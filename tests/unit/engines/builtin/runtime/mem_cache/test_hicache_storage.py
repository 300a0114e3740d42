"""HiCacheFile against real files: naming, atomic writes, exists/read semantics, bad dirs."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from hicache_diag.engines.builtin.runtime.mem_cache.hicache_storage import (
    HiCacheFile,
    HiCacheStorageConfig,
    get_hash_str,
    get_page_hashes,
)
from hicache_diag.errors import UsageError
from hicache_diag.faults.hooks import Hooks

# Worked example, by hand: page 1 = tokens [1, 2, 3, 4] as 4-byte little-endian words, no seed;
# page 2 = tokens [5, 6, 7, 256] seeded with page 1's raw 32-byte digest (256 = 00 01 00 00).
PAGE1_BYTES = bytes.fromhex("01000000020000000300000004000000")
PAGE2_WORDS = bytes.fromhex("05000000060000000700000000010000")
PAGE1_HASH = "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72"
PAGE2_HASH = "883ccd6b78001a19662dc799dece204eab9a5ca513ca49d24b313ff4161ee8e7"


def make_file(tmp_path, *, pp_size=2, pp_rank=1, tp_rank=0, tp_size=1, hooks=None, model="m"):
    cfg = HiCacheStorageConfig(tp_rank, tp_size, pp_rank, pp_size, model)
    return HiCacheFile(cfg, str(tmp_path / "l3"), hooks=hooks)


def page(seed: float, n: int = 8) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + seed


def test_worked_example_hashes_match_the_byte_level_definition():
    import hashlib

    assert hashlib.sha256(PAGE1_BYTES).hexdigest() == PAGE1_HASH
    assert hashlib.sha256(bytes.fromhex(PAGE1_HASH) + PAGE2_WORDS).hexdigest() == PAGE2_HASH
    assert get_hash_str([1, 2, 3, 4]) == PAGE1_HASH
    assert get_hash_str([5, 6, 7, 256], PAGE1_HASH) == PAGE2_HASH
    # a trailing partial page has no key
    assert get_page_hashes([1, 2, 3, 4, 5, 6, 7, 256, 9], page_size=4) == [PAGE1_HASH, PAGE2_HASH]


def test_chaining_makes_a_page_key_depend_on_its_prefix():
    assert get_hash_str([5, 6, 7, 256]) != PAGE2_HASH
    assert get_page_hashes([9, 9, 9, 9, 5, 6, 7, 256], 4)[1] != PAGE2_HASH


def test_token_ids_beyond_uint32_are_rejected():
    with pytest.raises(OverflowError):
        get_hash_str([2**32])


@pytest.mark.parametrize(
    ("pp_size", "pp_rank", "tp_rank", "tp_size", "suffix"),
    [
        (2, 1, 0, 1, "_org-tiny_0_1_2_1.bin"),
        (1, 0, 1, 2, "_org-tiny_1_2.bin"),  # PP part only when pp > 1
        (4, 3, 2, 4, "_org-tiny_2_4_4_3.bin"),
    ],
)
def test_file_name_is_sglangs(tmp_path, pp_size, pp_rank, tp_rank, tp_size, suffix):
    store = make_file(
        tmp_path,
        pp_size=pp_size,
        pp_rank=pp_rank,
        tp_rank=tp_rank,
        tp_size=tp_size,
        model="org/tiny",
    )
    assert store.set(PAGE1_HASH, page(0))
    assert os.listdir(tmp_path / "l3") == [PAGE1_HASH + suffix]


def test_roundtrip_into_target_and_raw(tmp_path):
    store = make_file(tmp_path)
    assert store.batch_set([PAGE1_HASH, PAGE2_HASH], [page(1), page(2)])
    target = torch.zeros(8)
    assert store.get(PAGE2_HASH, target) is target
    assert torch.equal(target, page(2))
    raw = store.get(PAGE1_HASH)
    assert torch.equal(raw.view(torch.float32), page(1))
    assert store.get("0" * 64, torch.zeros(8)) is None
    assert store.drain_faults() == []  # a plain miss is not a fault


def test_ranks_do_not_see_each_others_pages(tmp_path):
    pp0, pp1 = make_file(tmp_path, pp_rank=0), make_file(tmp_path, pp_rank=1)
    pp0.set(PAGE1_HASH, page(0))
    assert pp0.exists(PAGE1_HASH) and not pp1.exists(PAGE1_HASH)
    pp1_alone = make_file(tmp_path, pp_size=1, pp_rank=0)
    assert not pp1_alone.exists(PAGE1_HASH)  # a PP1 run cannot see PP2 files


def test_batch_exists_counts_leading_pages_only(tmp_path):
    store = make_file(tmp_path)
    keys = get_page_hashes(list(range(20)), 4)
    for k in (keys[0], keys[1], keys[3]):
        store.set(k, page(0))
    assert store.batch_exists(keys) == 2
    assert store.batch_exists(keys[3:4]) == 1
    assert store.batch_exists([]) == 0


def test_write_is_atomic_no_temp_left_and_existing_key_is_kept(tmp_path):
    store = make_file(tmp_path)
    assert store.set(PAGE1_HASH, page(1))
    assert store.set(PAGE1_HASH, page(99))  # content addressed: the first write stays
    assert torch.equal(store.get(PAGE1_HASH, torch.zeros(8)), page(1))
    assert [n for n in os.listdir(tmp_path / "l3") if n.endswith(".tmp")] == []


def test_concurrent_readers_never_see_a_partial_page(tmp_path):
    store = make_file(tmp_path)
    big = torch.arange(1 << 18, dtype=torch.float32)
    keys = [get_hash_str([i]) for i in range(6)]
    seen: list[int] = []

    def reader():
        for _ in range(200):
            for k in keys:
                got = store.get(k, torch.empty_like(big))
                if got is not None:
                    seen.append(int(torch.equal(got, big)))

    t = threading.Thread(target=reader)
    t.start()
    for k in keys:
        store.set(k, big)
    t.join()
    assert all(seen), "a reader saw a torn page"
    assert store.drain_faults() == []


def test_zero_length_file_exists_but_read_is_a_fault(tmp_path):
    store = make_file(tmp_path)
    open(store.key_path(PAGE1_HASH), "wb").close()
    assert store.exists(PAGE1_HASH) and store.batch_exists([PAGE1_HASH]) == 1  # SGLang: a hit
    assert store.get(PAGE1_HASH, torch.zeros(8)) is None
    assert store.get(PAGE1_HASH) is None
    faults = store.drain_faults()
    assert [f.op for f in faults] == ["read", "read"]
    assert "0 of 32 bytes" in faults[0].reason
    assert store.drain_faults() == []


def test_truncated_file_is_a_fault_not_an_exception(tmp_path):
    store = make_file(tmp_path)
    store.set(PAGE1_HASH, page(1))
    with open(store.key_path(PAGE1_HASH), "r+b") as f:
        f.truncate(12)
    assert store.batch_get([PAGE1_HASH], [torch.zeros(8)]) == [None]
    (fault,) = store.drain_faults()
    assert fault.key == PAGE1_HASH and "12 of 32" in fault.reason


def test_unreadable_path_is_a_fault(tmp_path):
    store = make_file(tmp_path)
    os.mkdir(store.key_path(PAGE1_HASH))  # open() raises IsADirectoryError, even for root
    assert store.exists(PAGE1_HASH)
    assert store.get(PAGE1_HASH, torch.zeros(8)) is None
    (fault,) = store.drain_faults()
    assert fault.op == "read" and "unreadable" in fault.reason


def test_failed_write_is_a_fault_returns_false_and_leaves_no_temp(tmp_path):
    store = make_file(tmp_path)
    os.rmdir(store.file_path)  # the directory vanished under a running rank
    assert store.set(PAGE1_HASH, page(0)) is False
    (fault,) = store.drain_faults()
    assert fault.op == "write" and fault.key == PAGE1_HASH
    os.mkdir(store.file_path)
    assert store.batch_set([PAGE1_HASH], [page(0)]) and os.listdir(store.file_path) == [
        os.path.basename(store.key_path(PAGE1_HASH))
    ]


def test_storage_hooks_shorten_hits_and_fail_reads(tmp_path):
    hooks = Hooks()
    calls = []
    hooks.register("storage_exists", lambda v, ctx: calls.append(("e", v, ctx)) or v - 1)
    hooks.register("storage_read", lambda v, ctx: ctx["page_index"] != 3)
    store = make_file(tmp_path, hooks=hooks)
    keys = get_page_hashes(list(range(8)), 4)
    store.batch_set(keys, [page(0), page(1)])
    assert store.batch_exists(keys) == 1
    assert calls == [("e", 2, {"num_pages": 2, "step": 0})]
    got = store.batch_get(keys, [torch.zeros(8), torch.zeros(8)], page_offset=2, num_pages=9)
    assert got[0] is not None and got[1] is None
    hooks.register("storage_exists", lambda v, ctx: 10**6)
    assert store.batch_exists(keys) <= 2  # a hook can shorten hits, never invent pages


def test_clear_removes_only_this_ranks_pages(tmp_path):
    pp0, pp1 = make_file(tmp_path, pp_rank=0), make_file(tmp_path, pp_rank=1)
    pp0.set(PAGE1_HASH, page(0))
    pp1.set(PAGE1_HASH, page(0))
    assert pp0.clear() == 1
    assert not pp0.exists(PAGE1_HASH) and pp1.exists(PAGE1_HASH)


def test_storage_dir_that_is_a_file_is_a_usage_error(tmp_path):
    f = tmp_path / "plain"
    f.write_text("x")
    with pytest.raises(UsageError, match="not a directory") as err:
        HiCacheFile(HiCacheStorageConfig(), str(f))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("path", ["/proc/hicache-l3", "/proc"])
def test_storage_dir_not_writable_is_a_usage_error(path):
    with pytest.raises(UsageError, match="not writable") as err:
        HiCacheFile(HiCacheStorageConfig(), path)
    assert "\n" not in str(err.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_dir_is_a_usage_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(UsageError, match="not writable"):
        HiCacheFile(HiCacheStorageConfig(), str(ro))


def test_missing_dir_is_created(tmp_path):
    store = HiCacheFile(HiCacheStorageConfig(), str(tmp_path / "a" / "b"))
    assert os.path.isdir(store.file_path) and os.listdir(store.file_path) == []


def test_storage_hooks_carry_the_issuing_step(tmp_path):
    """Issue 14: lookups and reads run on storage threads; the step they report is the one
    the caller passes (the step that queued the operation), else the hooks' current step."""
    hooks = Hooks()
    seen = []
    hooks.register("storage_exists", lambda v, ctx: seen.append(("exists", ctx["step"])) or v)
    hooks.register("storage_read", lambda v, ctx: seen.append(("read", ctx["step"])) or v)
    store = make_file(tmp_path, hooks=hooks)
    store.set(PAGE1_HASH, page(1.0))
    hooks.step = 40
    store.batch_exists([PAGE1_HASH], step=7)
    store.batch_get([PAGE1_HASH], [torch.zeros(8)], step=8)
    store.batch_exists([PAGE1_HASH])
    assert seen == [("exists", 7), ("read", 8), ("exists", 40)]
