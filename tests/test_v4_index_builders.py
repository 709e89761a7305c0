"""The DeepSeek-V4 index builders of a flat batch: sparse_topk_to_slots (C4A decode lists -> global
slots and lengths) and compressed_slot_mapping (where a compressed cache's rows are written), on
the CPU (the reference) and on the GPU (the kernels against the reference), with padding tokens,
unassigned pages, int32 limits and bad inputs."""

from __future__ import annotations

import pytest
import torch

import mla_ext
from mla_ext import reference

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _naive_topk(topk, req, table, block_size):
    """Loop-by-loop spec of sparse_topk_to_slots."""
    slots = torch.full(topk.shape, -1, dtype=torch.int32)
    lengths = torch.zeros(topk.shape[0], dtype=torch.int32)
    for t in range(topk.shape[0]):
        r = int(req[t])
        if not 0 <= r < table.shape[0]:
            continue
        for j in range(topk.shape[1]):
            p = int(topk[t, j])
            if p < 0:
                continue
            lengths[t] = j + 1
            page = p // block_size
            if page < table.shape[1] and int(table[r, page]) >= 0:
                slot = int(table[r, page]) * block_size + p % block_size
                slots[t, j] = slot if slot <= 2**31 - 1 else -1
    return slots, lengths


@pytest.mark.parametrize("device", DEVICES)
def test_topk_to_slots(device):
    torch.manual_seed(1)
    table = torch.randperm(700, dtype=torch.int32)[:600].view(6, 100)
    table[2, 30:] = -1
    num_tokens, topk = 41, 1000  # a topk that is not a multiple of the kernel's 256 threads
    topk_idx = torch.randint(0, 100 * 16 + 50, (num_tokens, topk), dtype=torch.int32)
    valid = torch.randint(0, topk + 1, (num_tokens,))
    topk_idx[torch.arange(topk).view(1, -1) >= valid.view(-1, 1)] = -1  # valid-first lists, as an indexer makes
    topk_idx[5, ::7] = -1  # and one with holes
    topk_idx[6] = -1  # and one with nothing
    req = torch.randint(0, 6, (num_tokens,), dtype=torch.int32)
    req[[3, 9, 40]] = torch.tensor([-1, 6, 2**31 - 1], dtype=torch.int32)  # padding tokens
    want_slots, want_lengths = _naive_topk(topk_idx, req, table, 16)
    ref_slots, ref_lengths = reference.sparse_topk_to_slots(topk_idx, req, table, 16)
    assert torch.equal(ref_slots, want_slots) and torch.equal(ref_lengths, want_lengths)
    slots = torch.full((num_tokens, topk), 7, dtype=torch.int32, device=device)
    lengths = torch.full((num_tokens,), 7, dtype=torch.int32, device=device)
    got = mla_ext.sparse_topk_to_slots(topk_idx.to(device), req.to(device), table.to(device), 16, slots, lengths)
    assert got[0] is slots and got[1] is lengths
    assert torch.equal(slots.cpu(), want_slots) and torch.equal(lengths.cpu(), want_lengths)
    assert lengths[[3, 9, 40]].tolist() == [0, 0, 0] and int(lengths[6]) == 0
    # allocated outputs, an empty block table (every token padding), no tokens
    s2, l2 = mla_ext.sparse_topk_to_slots(topk_idx.to(device), req.to(device), table[:0].to(device), 16)
    assert (s2 == -1).all() and (l2 == 0).all()
    s3, l3 = mla_ext.sparse_topk_to_slots(topk_idx[:0].to(device), req[:0].to(device), table.to(device), 16)
    assert s3.shape == (0, topk) and l3.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
def test_topk_to_slots_past_int32(device):
    last = (2**31 - 16) // 16  # its slots end exactly at INT32_MAX
    table = torch.tensor([[last, last + 1]], dtype=torch.int32, device=device)
    topk_idx = torch.tensor([[15, 16, 0, -1]], dtype=torch.int32, device=device)
    slots, lengths = mla_ext.sparse_topk_to_slots(topk_idx, torch.zeros(1, dtype=torch.int32, device=device), table, 16)
    assert slots.tolist() == [[2**31 - 1, -1, last * 16, -1]] and lengths.tolist() == [3]


def _naive_compressed(positions, req, table, block_size, ratio):
    out = torch.full(positions.shape, -1, dtype=torch.int64)
    for t in range(positions.shape[0]):
        r, p = int(req[t]), int(positions[t])
        if not 0 <= r < table.shape[0] or p < 0 or (p + 1) % ratio:
            continue
        c = p // ratio
        if c // block_size < table.shape[1] and int(table[r, c // block_size]) >= 0:
            out[t] = int(table[r, c // block_size]) * block_size + c % block_size
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ratio", [4, 128])
def test_compressed_slot_mapping(device, ratio):
    torch.manual_seed(2)
    table = torch.randperm(300, dtype=torch.int32)[:240].view(4, 60)
    table[1, 10:] = -1
    num_tokens = 3000
    positions = torch.randint(-3, 60 * 64 * ratio, (num_tokens,), dtype=torch.int64)
    positions[:200] = torch.arange(200) * ratio - 1  # tokens that complete an entry
    req = torch.randint(0, 4, (num_tokens,), dtype=torch.int32)
    req[[7, 8]] = torch.tensor([-1, 4], dtype=torch.int32)
    want = _naive_compressed(positions, req, table, 64, ratio)
    assert torch.equal(reference.compressed_slot_mapping(positions, req, table, 64, ratio), want)
    out = torch.full((num_tokens,), 7, dtype=torch.int64, device=device)
    got = mla_ext.compressed_slot_mapping(positions.to(device), req.to(device), table.to(device), 64, ratio, out)
    assert got is out and torch.equal(out.cpu(), want)
    assert (want[1:200] >= 0).sum() > 100 and int(out[7]) == -1 and int(out[8]) == -1
    assert torch.equal(mla_ext.compressed_slot_mapping(positions.to(device), req.to(device), table[:0].to(device), 64,
                                                       ratio).cpu(), torch.full((num_tokens,), -1, dtype=torch.int64))


@pytest.mark.parametrize("device", DEVICES)
def test_compressed_slot_mapping_edges(device):
    """Entries past the block table, on an unassigned page or past int32 get -1; strided inputs."""
    last = (2**31 - 16) // 16  # its slots end exactly at INT32_MAX
    table = torch.tensor([[last, last + 1, -1]], dtype=torch.int32, device=device)
    ratio = 4
    entries = torch.tensor([15, 16, 0, 32, 48, 47], dtype=torch.int64)  # page 0 end, page 1 (past int32), 0, -1 page, past
    positions = (entries * ratio + ratio - 1).to(device)
    req = torch.zeros(6, dtype=torch.int32, device=device)
    out = mla_ext.compressed_slot_mapping(positions, req, table, 16, ratio)
    assert out.tolist() == [2**31 - 1, -1, last * 16, -1, -1, -1]
    # strided positions / token_to_req (views of wider buffers) read the same
    wide_pos = torch.stack([positions, positions], 1).view(-1)[::2]
    wide_req = torch.stack([req, req], 1).view(-1)[::2]
    assert not wide_pos.is_contiguous()
    assert mla_ext.compressed_slot_mapping(wide_pos, wide_req, table, 16, ratio).tolist() == out.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_topk_to_slots_strided_input(device):
    table = torch.randperm(40, dtype=torch.int32)[:32].view(4, 8).to(device)
    topk_idx = torch.randint(-1, 128, (9, 2, 33), dtype=torch.int32, device=device)[:, 1]  # rows 2 x 33 apart
    req = torch.randint(-1, 4, (9,), dtype=torch.int32, device=device)
    assert not topk_idx.is_contiguous()
    got = mla_ext.sparse_topk_to_slots(topk_idx, req, table, 16)
    want = reference.sparse_topk_to_slots(topk_idx.cpu(), req.cpu(), table.cpu(), 16)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@pytest.mark.parametrize("device", DEVICES)
def test_index_builders_bad_inputs(device):
    table = torch.zeros(2, 4, dtype=torch.int32, device=device)
    req = torch.zeros(3, dtype=torch.int32, device=device)
    topk_idx = torch.zeros(3, 8, dtype=torch.int32, device=device)
    cases = [
        (lambda: mla_ext.sparse_topk_to_slots(topk_idx.long(), req, table, 16), "topk_indices must be int32, got int64"),
        (lambda: mla_ext.sparse_topk_to_slots(topk_idx[0], req, table, 16), r"topk_indices must be \[T, topk\]"),
        (lambda: mla_ext.sparse_topk_to_slots(topk_idx, req[:2], table, 16), r"token_to_req must be \[T\] = \[3\]"),
        (lambda: mla_ext.sparse_topk_to_slots(topk_idx, req, table.long(), 16), "block_table must be int32, got int64"),
        (lambda: mla_ext.sparse_topk_to_slots(topk_idx, req, table, 0), r"block_size must be .*\[1, 2147483647\], got 0"),
        (lambda: mla_ext.sparse_topk_to_slots(topk_idx, req, table, 16, torch.empty(3, 7, dtype=torch.int32, device=device)),
         "slots must be a contiguous int32 tensor of topk_indices' shape"),
        (lambda: mla_ext.sparse_topk_to_slots(topk_idx, req, table, 16, None, torch.empty(3, dtype=torch.int64, device=device)),
         "lengths must be .*int32"),
        (lambda: mla_ext.sparse_topk_to_slots(topk_idx, req, table, 16, None, torch.empty(4, dtype=torch.int32, device=device)),
         r"lengths must be a contiguous .*\[T\] = \[3\]"),
        (lambda: mla_ext.sparse_topk_to_slots(topk_idx, req, torch.zeros(4, 2, dtype=torch.int32, device=device).t(), 16),
         "block_table.*contiguous"),
        (lambda: mla_ext.compressed_slot_mapping(req.long(), req.long(), table, 16, 4), "token_to_req must be int32"),
        (lambda: mla_ext.compressed_slot_mapping(req, req, table, 16, 4), "positions must be int64, got int32"),
        (lambda: mla_ext.compressed_slot_mapping(req.long(), req, table, 16, 2**32),
         r"compress_ratio must be .*\[1, 2147483647\], got 4294967296"),
        (lambda: mla_ext.compressed_slot_mapping(req.long(), req, table, 16, 4, torch.empty(3, dtype=torch.int32, device=device)),
         r"slot_mapping must be .*int64"),
        (lambda: mla_ext.compressed_slot_mapping(req.long(), req, table, 16, 4, torch.empty(4, dtype=torch.int64, device=device)),
         r"slot_mapping must be a contiguous .*\[T\] = \[3\]"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):  # MlaInputError (CPU) is a RuntimeError too
            call()


def test_index_builders_opcheck():
    table = torch.randperm(40, dtype=torch.int32)[:32].view(4, 8)
    topk_idx = torch.randint(-1, 100, (5, 12), dtype=torch.int32)
    req = torch.tensor([0, 3, -1, 2, 1], dtype=torch.int32)
    torch.library.opcheck(torch.ops.mla_ext.sparse_topk_to_slots,
                          (topk_idx, req, table, 16, torch.empty(5, 12, dtype=torch.int32), torch.empty(5, dtype=torch.int32)))
    torch.library.opcheck(torch.ops.mla_ext.compressed_slot_mapping,
                          (torch.arange(5) * 4 + 3, req, table, 16, 4, torch.empty(5, dtype=torch.int64)))
