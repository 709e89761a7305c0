"""The DeepSeek-V4 ops on the GPU against the reference.

Cache write (csrc/cache_write/cache_write_v4.cu): every byte of the cache storage (written tokens
bit-exact, everything else untouched), both formats, bf16 and fp16 rows with the scale rule's edge
cases (zero tiles, the 1e-4 floor, subnormals, inf, NaN), strided and misaligned inputs, padded
pages, negative and out-of-range slots.

Sparse decode (csrc/sparse/v4_decode.h: the fused sm90 kernel for fp8_ds_mla with more than 32 heads,
else the gather and the V3 sparse kernels): both formats, both pools with their own page sizes, head
counts with and without full tiles, s_q 1 and 2, lengths (0, cut inside a tile, past the list), sinks
(+-inf), -1 / out-of-range / duplicate indices, NaN in every unused cache slot, split and whole
lists, on the architecture's kernels and forced portable.

Both: bad input refused with the reference's messages."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close, use_path
from test_v4_reference import DECODE_CASES, WRITE_CASES, decode_args, random_rows, write_args

import mla_ext
from mla_ext import formats, reference

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16


def _storage(num_blocks: int, block_size: int, fmt: str, dtype: torch.dtype, pad: int):
    """(cache view, the storage behind it) with every byte 0xA5; pages padded by ``pad`` bytes
    (fp8_ds_mla: a multiple of 576) or ``pad`` rows (auto)."""
    if fmt == "fp8_ds_mla":
        page = formats.v4_page_bytes(block_size) + pad
        storage = torch.full((num_blocks, page), 0xA5, dtype=torch.uint8, device="cuda")
        return storage[:, : block_size * 584].view(num_blocks, block_size, 584), storage
    storage = torch.full((num_blocks, (block_size + pad) * 512 * 2), 0xA5, dtype=torch.uint8, device="cuda")
    rows = storage.view(dtype).view(num_blocks, block_size + pad, 512)
    return rows[:, :block_size], storage


def _slots(num_tokens: int, num_slots: int) -> torch.Tensor:
    """Distinct slots in random order, about a fifth of them padding (-1, -7) or past the cache."""
    slots = torch.randperm(num_slots)[:num_tokens]
    if num_tokens > 4:
        bad = torch.randperm(num_tokens)[: num_tokens // 5]
        slots[bad] = torch.tensor([-1, num_slots, -7, num_slots + 5, 2**40])[torch.arange(len(bad)) % 5]
    return slots.cuda()


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "auto"])
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
@pytest.mark.parametrize("block_size", [256, 64, 2, 1, 61])
@pytest.mark.parametrize("layout", ["aligned", "strided", "misaligned"])
def test_small_cache_write_matches_reference(fmt, dtype, block_size, layout):
    num_tokens = 301
    num_blocks = num_tokens // block_size + 3
    rows = random_rows(num_tokens, dtype).cuda()
    if layout == "aligned":
        kv = rows
    elif layout == "strided":  # rows 1216 bytes apart (16-byte aligned): the vector path
        kv = torch.empty(num_tokens, 608, dtype=dtype, device="cuda")[:, 32:544]
        kv.copy_(rows)
    else:  # rows at an odd element offset: the byte-wise path
        kv = torch.empty(num_tokens * 513 + 1, dtype=dtype, device="cuda")[1:].view(num_tokens, 513)[:, :512]
        kv.copy_(rows)
    pad = 576 if fmt == "fp8_ds_mla" else 3
    cache, storage = _storage(num_blocks, block_size, fmt, dtype, pad)
    expected_cache, expected = _storage(num_blocks, block_size, fmt, dtype, pad)
    slot_mapping = _slots(num_tokens - 7, num_blocks * block_size)  # the last 7 tokens: graph padding
    mla_ext.concat_and_cache_mla_v4(kv, cache, slot_mapping, fmt)
    reference.concat_and_cache_mla_v4(kv, expected_cache, slot_mapping, fmt)
    torch.cuda.synchronize()
    diff = (storage != expected).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} bytes differ, first at {diff[:4].tolist()}"


def test_cache_write_in_a_cuda_graph():
    cache, storage = _storage(4, 64, "fp8_ds_mla", BF16, 0)
    kv = random_rows(16).cuda()
    slots = torch.arange(16, device="cuda") * 7
    graph = torch.cuda.CUDAGraph()
    mla_ext.concat_and_cache_mla_v4(kv, cache, slots, "fp8_ds_mla")  # warm-up
    with torch.cuda.graph(graph):
        mla_ext.concat_and_cache_mla_v4(kv, cache, slots, "fp8_ds_mla")
    kv.copy_(random_rows(16).cuda())
    slots.copy_(torch.arange(16, device="cuda") * 11)
    graph.replay()
    expected_cache, expected = _storage(4, 64, "fp8_ds_mla", BF16, 0)
    reference.concat_and_cache_mla_v4(kv, expected_cache, torch.arange(16, device="cuda") * 7, "fp8_ds_mla")
    reference.concat_and_cache_mla_v4(kv, expected_cache, slots, "fp8_ds_mla")
    torch.cuda.synchronize()
    # The warm-up's tokens (old kv at slots 7 t) stay where the replay did not overwrite them.
    assert torch.equal(storage[:, : 64 * 576].view(4, 64, 576)[slots.cpu() // 64, slots.cpu() % 64],
                       expected[:, : 64 * 576].view(4, 64, 576)[slots.cpu() // 64, slots.cpu() % 64])


def test_cache_write_checked_mode():
    cache, _ = _storage(2, 64, "fp8_ds_mla", BF16, 0)
    kv = random_rows(3).cuda()
    with pytest.raises(IndexError, match="slot_mapping"):
        mla_ext.concat_and_cache_mla_v4(kv, cache, torch.tensor([0, 128, 1], device="cuda"), "fp8_ds_mla",
                                        checked=True)
    mla_ext.concat_and_cache_mla_v4(kv, cache, torch.tensor([0, -1, 1], device="cuda"), "fp8_ds_mla", checked=True)


@pytest.mark.parametrize("case", sorted(WRITE_CASES))
def test_cache_write_bad_input_gpu(case):
    """The binding refuses what the reference refuses, with the same message, and writes nothing."""
    args = write_args("cuda")
    args.update(WRITE_CASES[case][0](args))
    before = args["kv_cache"].clone()
    with pytest.raises(RuntimeError, match=WRITE_CASES[case][1]):
        mla_ext.concat_and_cache_mla_v4(**args)
    with pytest.raises(RuntimeError, match=WRITE_CASES[case][1]):
        torch.ops.mla_ext.concat_and_cache_mla_v4(*args.values())
    torch.cuda.synchronize()
    assert torch.equal(args["kv_cache"], before)


# ---- sparse decode ----------------------------------------------------------------------------


def _pool(num_blocks: int, block_size: int, fmt: str, rows: torch.Tensor | None = None):
    """A V4 cache holding ``rows`` (default: standard normal bf16 rows, as the V3 tests' caches) in
    three quarters of its slots and NaN rows (fp8_ds_mla: scale byte 0xFF) in the rest; returns
    (cache, good slots, poisoned slots)."""
    cache = formats.empty_kv_cache_v4(num_blocks, block_size, fmt, device="cuda")
    num_slots = num_blocks * block_size
    perm = torch.randperm(num_slots, device="cuda")
    poisoned, good = perm[: num_slots // 4], perm[num_slots // 4:]
    if rows is None:
        rows = torch.randn(num_slots, 512, device="cuda").to(BF16)
    mla_ext.concat_and_cache_mla_v4(rows, cache, torch.arange(num_slots, device="cuda"), fmt)
    nan_rows = torch.full((poisoned.numel(), 512), float("nan"), dtype=BF16, device="cuda")
    mla_ext.concat_and_cache_mla_v4(nan_rows, cache, poisoned, fmt)
    return cache, good, poisoned


def _index_list(b, s_q, topk, good, poisoned, num_slots, lengths):
    """Entries from the good slots (duplicates included), some -1 / negative / past the cache, and
    poisoned slots only at positions past the request's length (never counted)."""
    idx = good[torch.randint(good.numel(), (b, s_q, topk), device="cuda")].int()
    bad = torch.rand(b, s_q, topk, device="cuda") < 0.1
    idx[bad] = torch.tensor([-1, num_slots, -5, num_slots + 77], dtype=torch.int32, device="cuda")[
        torch.randint(4, (int(bad.sum()),), device="cuda")]
    if topk > 1:
        idx[:, :, 1] = idx[:, :, 0]  # a duplicate counts twice
    if lengths is not None and poisoned.numel():
        past = torch.arange(topk, device="cuda")[None, :] >= lengths.clamp(min=0)[:, None]  # [b, topk]
        fill = poisoned[torch.randint(poisoned.numel(), (b, s_q, topk), device="cuda")].int()
        idx = torch.where(past[:, None, :], fill, idx)
    return idx


def _lengths(b, topk):
    lengths = torch.randint(1, topk + 1, (b,), dtype=torch.int32, device="cuda")
    lengths[0] = topk + 5  # past the list: all of it
    if b > 1:
        lengths[1] = 0
    if b > 2:
        lengths[2] = min(topk, 67)  # cut inside a tile
    return lengths


@pytest.mark.parametrize("path", ["default", "portable"])
@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "auto"])
@pytest.mark.parametrize("h_q", [16, 64, 128, 7, 80])
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("extra", [None, 64, 2])
def test_decode_matches_reference(path, fmt, h_q, s_q, extra, request):
    _decode_matches_reference(path, fmt, h_q, s_q, extra, request, b=3)


@pytest.mark.parametrize("extra", [None, 64])
def test_decode_large_batch_matches_reference(extra, request):
    """More CTAs than SMs: whole lists, and the last requests' lists split to fill the last wave."""
    _decode_matches_reference("default", "fp8_ds_mla", 128, 2, extra, request, b=75)


def _decode_matches_reference(path, fmt, h_q, s_q, extra, request, b):
    use_path(request, path)
    topk, extra_topk = 128, 96
    main, good, poisoned = _pool(4, 256, fmt)
    topk_length = _lengths(b, topk)
    idx = _index_list(b, s_q, topk, good, poisoned, main.shape[0] * main.shape[1], topk_length)
    kw = {}
    if extra is not None:
        cache, xgood, xpoisoned = _pool(2048 // extra, extra, fmt)
        xlen = _lengths(b, extra_topk).roll(1)  # extra list: request 0 cut inside a tile, 1 whole, 2 empty
        xidx = _index_list(b, s_q, extra_topk, xgood, xpoisoned, cache.shape[0] * cache.shape[1], xlen)
        kw = dict(extra_kv_cache=cache, extra_indices=xidx, extra_topk_length=xlen)
    q = torch.randn(b, s_q, h_q, 512, dtype=BF16, device="cuda")
    sink = torch.randn(h_q, device="cuda")
    sink[0] = float("inf")
    sink[-1] = float("-inf")
    scale = 512**-0.5
    out, lse = mla_ext.sparse_decode_mla_v4(q, main, idx, scale, fmt, topk_length, sink, **kw)
    ref_out, ref_lse = reference.sparse_decode_mla_v4(q, main, idx, scale, fmt, topk_length, sink, **kw)
    assert out.dtype == BF16 and out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q)
    assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2, name="out vs fp32 spec")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=1e-4, name="lse vs fp32 spec")


@pytest.mark.parametrize("path", ["default", "portable"])
@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "auto"])
@pytest.mark.parametrize("h_q", [16, 64])
def test_small_decode_one_entry_reads_the_row_exactly(path, fmt, h_q, request):
    """A query with one valid entry (among -1, out-of-range and past-the-length ones) returns that
    row, bit-exact: the dequantisation (scales 2^-20 .. 2^20 apart between tiles) is exact in bf16,
    and P is 1. Each query's entry is in the main or the extra pool."""
    use_path(request, path)
    b, s_q, topk, extra_topk = 3, 2, 40, 24
    main, good, _ = _pool(8, 64, fmt, random_rows(8 * 64 + 8)[8:].cuda())  # (rows 0-7 hold inf / NaN tiles)
    extra, xgood, _ = _pool(300, 2, fmt, random_rows(600 + 8)[8:].cuda())
    idx = torch.full((b, s_q, topk), -1, dtype=torch.int32, device="cuda")
    idx[..., 1::3] = 8 * 64 + 9  # past the cache
    xidx = torch.full((b, s_q, extra_topk), -1, dtype=torch.int32, device="cuda")
    xidx[..., ::5] = 600
    xlen = torch.tensor([extra_topk, 3, 0], dtype=torch.int32, device="cuda")
    xidx[1, :, 5] = xgood[0].int()  # past request 1's extra length: not counted
    for i in range(b):
        for j in range(s_q):
            if (i + j) % 2 == 1 and xlen[i] > 0:
                xidx[i, j, int(torch.randint(int(xlen[i]), ()))] = xgood[torch.randint(xgood.numel(), ())].int()
            else:
                idx[i, j, int(torch.randint(topk, ()))] = good[torch.randint(good.numel(), ())].int()
    q = torch.randn(b, s_q, h_q, 512, dtype=BF16, device="cuda")
    kw = dict(extra_kv_cache=extra, extra_indices=xidx, extra_topk_length=xlen)
    out, lse = mla_ext.sparse_decode_mla_v4(q, main, idx, 0.05, fmt, **kw)
    ref_out, ref_lse = reference.sparse_decode_mla_v4(q, main, idx, 0.05, fmt, **kw)
    assert torch.isfinite(ref_out).all()
    assert torch.equal(out, ref_out), f"{int((out != ref_out).sum())} elements differ"
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=1e-4, name="lse")


@pytest.mark.parametrize("h_q", [16, 64])
def test_small_decode_nothing_valid_and_nan_rows(h_q):
    """All-invalid lists give out 0 and lse -inf; a counted entry on a NaN row makes its query's out
    and lse NaN."""
    main, good, poisoned = _pool(2, 64, "fp8_ds_mla")
    q = torch.randn(2, 1, h_q, 512, dtype=BF16, device="cuda")
    idx = torch.full((2, 1, 40), -1, dtype=torch.int32, device="cuda")
    idx[1, 0, :5] = good[:5].int()
    idx[1, 0, 7] = poisoned[0].int()
    out, lse = mla_ext.sparse_decode_mla_v4(q, main, idx, 0.05, "fp8_ds_mla")
    ref_out, ref_lse = reference.sparse_decode_mla_v4(q, main, idx, 0.05, "fp8_ds_mla")
    assert (out[0] == 0).all() and (lse[0] == float("-inf")).all()
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2, name="out")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=1e-4, name="lse")


@pytest.mark.parametrize("case", sorted(set(DECODE_CASES) - {"softmax_scale"}))  # (the schema refuses a tensor)
def test_decode_bad_input_gpu(case):
    args = decode_args("cuda")
    mla_ext.sparse_decode_mla_v4(**args)  # the valid call runs
    args.update(DECODE_CASES[case][0](args))
    with pytest.raises(RuntimeError, match=DECODE_CASES[case][1]):
        mla_ext.sparse_decode_mla_v4(**args)
