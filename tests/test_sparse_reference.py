"""CPU tests of the sparse decode spec (reference), its op registration and input checks, and
the index builders."""

from __future__ import annotations

import math

import pytest
import torch
from bad_inputs import SPARSE_CASES, sparse_args

import mla_ext
from mla_ext import reference
from sparse_cases import SOFTMAX_SCALE, make_cache, make_indices


def _naive(q, cache, idx, scale, fmt, topk_length, sink):
    """Loop-by-loop spec: per (request, token, head), softmax over the valid entries."""
    rows = reference.dequantize_cache(cache, fmt).flatten(0, 1)
    b, s_q, h_q, _ = q.shape
    out = torch.zeros(b, s_q, h_q, 512)
    lse = torch.full((b, h_q, s_q), -math.inf)
    for i in range(b):
        n = idx.shape[2] if topk_length is None else min(int(topk_length[i]), idx.shape[2])
        for j in range(s_q):
            keys = [int(x) for x in idx[i, j, :n] if 0 <= int(x) < rows.shape[0]]
            if not keys:
                continue
            k = rows[keys]
            for h in range(h_q):
                s = (k @ q[i, j, h].float()) * scale
                lse[i, h, j] = torch.logsumexp(s, 0)
                o = torch.softmax(s, 0) @ k[:, :512]
                if sink is not None:
                    o = o * (0.0 if sink[h] == math.inf else 1 / (1 + math.exp(float(sink[h]) - float(lse[i, h, j]))))
                out[i, j, h] = o
    return out, lse


@pytest.mark.parametrize("fmt", ["auto", "fp8_ds_mla"])
@pytest.mark.parametrize("block_size", [1, 5])
def test_reference_matches_loops(fmt, block_size):
    b, s_q, h_q, topk = 3, 2, 3, 9
    cache, good, _ = make_cache(40 // block_size + 1, block_size, fmt, "cpu", pad_pages=True)
    num_slots = cache.shape[0] * cache.shape[1]
    idx = make_indices(b, s_q, topk, good, num_slots, invalid_frac=0.3)
    idx[2, 1, :] = -1
    topk_length = torch.tensor([9, 4, 0], dtype=torch.int32)
    sink = torch.tensor([0.5, math.inf, -math.inf])
    q = torch.randn(b, s_q, h_q, 576, dtype=torch.bfloat16)
    out, lse = reference.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt, topk_length, sink)
    ref_out, ref_lse = _naive(q, cache, idx, SOFTMAX_SCALE, fmt, topk_length, sink)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[fin], ref_lse[fin], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out.float(), ref_out.bfloat16().float(), atol=1e-2, rtol=1e-2)
    assert not torch.isnan(out).any()


def test_reference_properties():
    cache, good, _ = make_cache(4, 16, "auto", "cpu", poison_frac=0.0)
    q = torch.randn(1, 1, 2, 576, dtype=torch.bfloat16)
    a, c = int(good[3]), int(good[7])
    # Duplicates count: [a, a, c] is c plus a with twice the weight.
    out_dup, lse_dup = reference.sparse_decode_mla(q, cache, torch.tensor([[[a, a, c]]], dtype=torch.int32), 0.1, "auto")
    rows = cache.flatten(0, 1).float()
    s = torch.stack([rows[a], rows[c]]) @ q[0, 0].float().T * 0.1  # [2, h]
    s[0] += math.log(2.0)
    torch.testing.assert_close(lse_dup[0, :, 0], torch.logsumexp(s, 0), atol=1e-4, rtol=0)
    # Invalid entries change nothing; all invalid gives 0 and -inf.
    out_inv, lse_inv = reference.sparse_decode_mla(
        q, cache, torch.tensor([[[a, -1, a, 10**6, c]]], dtype=torch.int32), 0.1, "auto")
    torch.testing.assert_close(out_inv, out_dup)
    torch.testing.assert_close(lse_inv, lse_dup)
    out0, lse0 = reference.sparse_decode_mla(q, cache, torch.full((1, 1, 4), -1, dtype=torch.int32), 0.1, "auto")
    assert (out0 == 0).all() and (lse0 == -math.inf).all()
    # topk_length 0 is the same as all invalid; a sink of -inf changes nothing, +inf zeroes out.
    out_l0, lse_l0 = reference.sparse_decode_mla(q, cache, torch.tensor([[[a, c]]], dtype=torch.int32), 0.1, "auto",
                                                 topk_length=torch.tensor([0], dtype=torch.int32))
    assert (out_l0 == 0).all() and (lse_l0 == -math.inf).all()
    out_s, lse_s = reference.sparse_decode_mla(q, cache, torch.tensor([[[a, a, c]]], dtype=torch.int32), 0.1, "auto",
                                               attn_sink=torch.tensor([-math.inf, math.inf]))
    torch.testing.assert_close(out_s[..., 0, :], out_dup[..., 0, :])
    assert (out_s[..., 1, :] == 0).all()
    torch.testing.assert_close(lse_s, lse_dup)


def test_reference_softmax_holds_at_huge_scores():
    """At softmax_scale 2^22 (scores ~2^27) the spec's weights still sum to 1: a top key listed twice
    weighs 1/2 each (an fp32 lse cannot hold log 2 there, so exp(scores - lse) gave each copy 1 and
    the output twice the row), against the same softmax in fp64."""
    cache, good, _ = make_cache(4, 16, "fp8_ds_mla", "cpu", poison_frac=0.0)
    q = torch.randn(1, 1, 4, 576, dtype=torch.bfloat16)
    slots = good[:12].to(torch.int32)
    idx = torch.cat([slots, slots[:3]]).view(1, 1, -1)  # three keys listed twice
    scale = 2.0**22
    out, lse = reference.sparse_decode_mla(q, cache, idx, scale, "fp8_ds_mla")
    rows = reference.dequantize_cache(cache.flatten(0, 1)[idx[0, 0].long()], "fp8_ds_mla").double()
    p = torch.softmax(q[0, 0].double() @ rows.T * scale, dim=-1)
    want = p @ rows[:, :512]
    torch.testing.assert_close(out[0, 0].double(), want.to(torch.bfloat16).double(), atol=0, rtol=1e-2)
    assert lse.abs().min() > 2.0**24  # the regime this is about


def test_op_cpu_is_reference_and_opcheck():
    cache, good, _ = make_cache(6, 8, "fp8_ds_mla", "cpu")
    q = torch.randn(2, 2, 5, 576, dtype=torch.bfloat16)
    idx = make_indices(2, 2, 11, good, 48)
    tl = torch.tensor([11, 3], dtype=torch.int32)
    sink = torch.randn(5)
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "fp8_ds_mla", tl, sink)
    ref_out, ref_lse = reference.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "fp8_ds_mla", tl, sink)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    torch.library.opcheck(torch.ops.mla_ext.sparse_decode_mla, (q, cache, idx, SOFTMAX_SCALE, "fp8_ds_mla", tl, sink))
    torch.library.opcheck(torch.ops.mla_ext.sparse_decode_mla, (q, cache.view(6, 8, 656), idx, 0.1, "fp8_ds_mla", None, None))


def _naive_slots(local, table, block_size):
    out = torch.full_like(local, -1)
    for i in range(local.shape[0]):
        for j in range(local.shape[1]):
            for k in range(local.shape[2]):
                p = int(local[i, j, k])
                if p >= 0 and p // block_size < table.shape[1] and int(table[i, p // block_size]) >= 0:
                    out[i, j, k] = int(table[i, p // block_size]) * block_size + p % block_size
    return out


def test_indices_to_slots_cpu():
    table = torch.randperm(40, dtype=torch.int32)[:30].view(3, 10)
    table[1, 7:] = -1
    local = torch.randint(-3, 10 * 7 + 5, (3, 2, 13), dtype=torch.int32)
    out = mla_ext.sparse_indices_to_slots(local, table, 7)
    assert torch.equal(out, _naive_slots(local, table, 7))
    preallocated = torch.empty_like(local)
    assert mla_ext.sparse_indices_to_slots(local, table, 7, out=preallocated) is preallocated
    assert torch.equal(preallocated, out)
    torch.library.opcheck(torch.ops.mla_ext.sparse_indices_to_slots, (local, table, 7, torch.empty_like(local)))


def test_compressed_indices_cpu():
    table = torch.randperm(60, dtype=torch.int32)[:48].view(4, 12)
    table[2, 3:] = -1
    positions = torch.tensor([0, 3, 17, 200, -1, 50, 800], dtype=torch.int64)
    req = torch.tensor([0, 1, 2, 3, 0, 1, 2], dtype=torch.int32)
    indices = torch.empty(7, 256, dtype=torch.int32)
    lengths = torch.empty(7, dtype=torch.int32)
    mla_ext.sparse_compressed_indices(positions, req, table, 16, 4, 5, indices, lengths)
    for t in range(7):
        n = max((int(positions[t]) + 1) // 4, 0)
        assert int(lengths[t]) == min(n, 256)
        for j in range(256):
            if j >= n:
                want = -1
            elif t >= 5:
                want = j
            else:
                blk = int(table[int(req[t]), j // 16]) if j // 16 < 12 else -1
                want = blk * 16 + j % 16 if blk >= 0 else -1
            assert int(indices[t, j]) == want, (t, j)
    torch.library.opcheck(torch.ops.mla_ext.sparse_compressed_indices,
                          (positions, req, table, 16, 4, 5, torch.empty_like(indices), torch.empty_like(lengths)))


@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
def test_bad_inputs(case):
    change, message = SPARSE_CASES[case]
    args = sparse_args("cpu")
    args.update(change(args))
    with pytest.raises(mla_ext.MlaInputError, match=r"mla_ext\.sparse_decode_mla: .*" + message):
        mla_ext.sparse_decode_mla(**args)


def test_default_format_is_auto():
    """kv_cache_dtype defaults to 'auto' as in every op: a bf16 cache needs no format; a uint8
    fp8_ds_mla cache is refused with a message naming the format to pass."""
    cache, good, _ = make_cache(4, 16, "auto", "cpu", poison_frac=0.0)
    q = torch.randn(2, 1, 3, 576, dtype=torch.bfloat16)
    idx = good[torch.randint(good.numel(), (2, 1, 8))].to(torch.int32)
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, 0.1)
    ref = reference.sparse_decode_mla(q, cache, idx, 0.1, "auto")
    assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1])
    ds_cache, _, _ = make_cache(4, 16, "fp8_ds_mla", "cpu", poison_frac=0.0)
    with pytest.raises(RuntimeError, match=r"got uint8: a uint8 cache of 656-byte rows is fp8_ds_mla, "
                                           r"pass kv_cache_dtype='fp8_ds_mla'"):
        mla_ext.sparse_decode_mla(q, ds_cache, idx, 0.1)


def test_bad_builder_inputs():
    with pytest.raises(mla_ext.MlaInputError, match="multiple of 128"):
        mla_ext.sparse_compressed_indices(torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int32),
                                          torch.zeros(1, 4, dtype=torch.int32), 16, 4, 2,
                                          torch.empty(2, 100, dtype=torch.int32), torch.empty(2, dtype=torch.int32))
    with pytest.raises(mla_ext.MlaInputError, match="block_table must be"):
        mla_ext.sparse_indices_to_slots(torch.zeros(2, 1, 4, dtype=torch.int32), torch.zeros(3, 4, dtype=torch.int32), 16)


# ---- review fixes: padding tokens, int32 limits, empty caches, checked mode --------------------


def test_compressed_indices_padding_tokens():
    """token_to_req outside [0, num_requests) (CUDA-graph padding) gives length 0 and a -1 row,
    for decode and prefill tokens; -1 no longer wraps to the last row, 99 no longer raises."""
    table = torch.randperm(60, dtype=torch.int32)[:48].view(4, 12)
    positions = torch.tensor([40, 40, 40, 40, 40, 40], dtype=torch.int64)
    req = torch.tensor([3, -1, 99, 4, 1, -1], dtype=torch.int32)  # decode: 0..3, prefill: 4..5
    indices = torch.empty(6, 128, dtype=torch.int32)
    lengths = torch.empty(6, dtype=torch.int32)
    mla_ext.sparse_compressed_indices(positions, req, table, 16, 4, 4, indices, lengths)
    assert lengths.tolist() == [10, 0, 0, 0, 10, 0]
    assert (indices[[1, 2, 3, 5]] == -1).all()
    assert indices[0, :10].tolist() == [int(table[3, 0]) * 16 + j for j in range(10)]
    assert indices[4, :10].tolist() == list(range(10)) and (indices[[0, 4], 10:] == -1).all()
    # no request at all: every token is padding
    ref_i, ref_l = reference.sparse_compressed_indices(positions, req, table[:0], 16, 4, 4, 128)
    assert (ref_l == 0).all() and (ref_i == -1).all()


def test_slots_past_int32_are_invalid():
    """block * block_size + offset past int32 gives -1 (it used to wrap to a valid-looking slot)."""
    last = (2**31 - 16) // 16  # its slots end exactly at INT32_MAX
    table = torch.tensor([[last, last + 1, 2**31 - 1]], dtype=torch.int32)
    local = torch.tensor([[[15, 16, 17, 32, 0]]], dtype=torch.int32)
    slots = mla_ext.sparse_indices_to_slots(local, table, 16)
    assert slots.tolist() == [[[2**31 - 1, -1, -1, -1, last * 16]]]
    indices = torch.empty(1, 128, dtype=torch.int32)
    lengths = torch.empty(1, dtype=torch.int32)
    mla_ext.sparse_compressed_indices(torch.tensor([4 * 40 - 1]), torch.tensor([0], dtype=torch.int32), table, 16, 4, 1,
                                      indices, lengths)
    assert int(lengths[0]) == 40
    assert indices[0, :16].tolist() == [last * 16 + j for j in range(16)] and (indices[0, 16:] == -1).all()


@pytest.mark.parametrize("name", ["block_size", "compress_ratio"])
@pytest.mark.parametrize("value", [0, 2**31, 2**32])
def test_int32_parameters_are_range_checked(name, value):
    args = dict(block_size=16, compress_ratio=4)
    args[name] = value
    with pytest.raises(mla_ext.MlaInputError, match=rf"{name} must be an int in \[1, 2147483647\], got {value}"):
        mla_ext.sparse_compressed_indices(torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int32),
                                          torch.zeros(1, 4, dtype=torch.int32), args["block_size"],
                                          args["compress_ratio"], 2, torch.empty(2, 128, dtype=torch.int32),
                                          torch.empty(2, dtype=torch.int32))
    if name == "block_size":
        with pytest.raises(mla_ext.MlaInputError, match=r"block_size must be an int in \[1, 2147483647\]"):
            mla_ext.sparse_indices_to_slots(torch.zeros(1, 1, 4, dtype=torch.int32), torch.zeros(1, 4, dtype=torch.int32),
                                            value)
    # the largest allowed value works
    out = mla_ext.sparse_indices_to_slots(torch.tensor([[[5, -1]]], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32),
                                          2**31 - 1)
    assert out.tolist() == [[[5, -1]]]


def test_topk_limit():
    """topk past int32 (minus a tile) is refused before any work (meta tensors: no memory)."""
    from mla_ext.sparse import MAX_TOPK
    assert MAX_TOPK == 2**31 - 65
    q = torch.empty(1, 1, 4, 576, dtype=torch.bfloat16, device="meta")
    cache = torch.empty(4, 16, 656, dtype=torch.uint8, device="meta")
    with pytest.raises(mla_ext.MlaInputError, match=rf"topk \(indices.shape\[2\]\) must be <= {MAX_TOPK}, got {2**31}"):
        mla_ext.sparse_decode_mla(q, cache, torch.empty(1, 1, 2**31, dtype=torch.int32, device="meta"), 0.1,
                                  "fp8_ds_mla")
    out, lse = mla_ext.sparse_decode_mla(q, cache, torch.empty(1, 1, MAX_TOPK, dtype=torch.int32, device="meta"), 0.1,
                                         "fp8_ds_mla")
    assert out.shape == (1, 1, 4, 512) and lse.shape == (1, 4, 1)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "auto"])
@pytest.mark.parametrize("shape", [(4, 0), (0, 16)], ids=["block_size0", "blocks0"])
def test_empty_cache(fmt, shape):
    row, dtype = (656, torch.uint8) if fmt == "fp8_ds_mla" else (576, torch.bfloat16)
    cache = torch.empty(*shape, row, dtype=dtype)
    q = torch.randn(2, 3, 5, 576, dtype=torch.bfloat16)
    idx = torch.tensor([0, -1, 7, 2**31 - 1], dtype=torch.int32).repeat(2, 3, 1)
    for sink in (None, torch.randn(5)):
        out, lse = mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt, attn_sink=sink)
        assert out.shape == (2, 3, 5, 512) and out.dtype == torch.bfloat16 and (out == 0).all()
        assert lse.shape == (2, 5, 3) and (lse == -math.inf).all()


def test_checked_mode_decode(monkeypatch):
    monkeypatch.delenv("MLA_EXT_CHECK_SLOTS", raising=False)
    cache, good, _ = make_cache(4, 16, "auto", "cpu", poison_frac=0.0)
    q = torch.randn(2, 1, 3, 576, dtype=torch.bfloat16)
    idx = torch.tensor([[[1, -1, 5, -(2**31)]], [[2, 3, 64, 70]]], dtype=torch.int32)  # 64, 70: past 4 x 16 slots
    mla_ext.sparse_decode_mla(q, cache, idx, 0.1, "auto")  # unchecked: treated as invalid
    with pytest.raises(IndexError, match=r"sparse_decode_mla: indices\[1, 0, 2\] = 64 is outside the cache "
                                         r"\(4 blocks x 16 = 64 slots\); 2 of 8 entries out of range"):
        mla_ext.sparse_decode_mla(q, cache, idx, 0.1, "auto", checked=True)
    # positions past topk_length do not count; negative entries (padding) are fine
    tl = torch.tensor([4, 2], dtype=torch.int32)
    got = mla_ext.sparse_decode_mla(q, cache, idx, 0.1, "auto", tl, checked=True)
    ref = reference.sparse_decode_mla(q, cache, idx, 0.1, "auto", tl)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    with pytest.raises(IndexError, match=r"indices\[1, 0, 2\] = 64"):
        mla_ext.sparse_decode_mla(q, cache, idx, 0.1, "auto", torch.tensor([4, 3], dtype=torch.int32), checked=True)
    # the environment variable turns it on; checked=False overrides it
    monkeypatch.setenv("MLA_EXT_CHECK_SLOTS", "1")
    with pytest.raises(IndexError, match="is outside the cache"):
        mla_ext.sparse_decode_mla(q, cache, idx, 0.1, "auto")
    mla_ext.sparse_decode_mla(q, cache, idx, 0.1, "auto", checked=False)


def test_checked_mode_slots(monkeypatch):
    monkeypatch.delenv("MLA_EXT_CHECK_SLOTS", raising=False)
    table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    local = torch.tensor([[[0, -1, 31]], [[32, 5, -7]]], dtype=torch.int32)  # 32: past 2 pages x 16
    assert mla_ext.sparse_indices_to_slots(local, table, 16)[1, 0, 0] == -1
    with pytest.raises(IndexError, match=r"sparse_indices_to_slots: local_indices\[1, 0, 0\] = 32 is outside the block "
                                         r"table \(2 pages x 16 = 32 positions\); 1 of 6 entries"):
        mla_ext.sparse_indices_to_slots(local, table, 16, checked=True)
    monkeypatch.setenv("MLA_EXT_CHECK_SLOTS", "1")
    with pytest.raises(IndexError, match="outside the block table"):
        mla_ext.sparse_indices_to_slots(local, table, 16)
    local[1, 0, 0] = 31
    assert mla_ext.sparse_indices_to_slots(local, table, 16).tolist() == [[[48, -1, 31]], [[47, 5, -1]]]
