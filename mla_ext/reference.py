"""The executable spec: plain-PyTorch, fp32-math implementations of every mla_ext op.

These functions define the semantics the CUDA kernels are tested against, and they are
registered as the ops' CPU implementations, so the whole API runs without a GPU. They are
written to be read, not to be fast. They work on tensors of any device.
"""

from __future__ import annotations

import torch

from .formats import (
    DS_MLA_NUM_TILES,
    DS_MLA_ROPE_OFFSET,
    DS_MLA_ROW_BYTES,
    DS_MLA_SCALE_OFFSET,
    DS_MLA_TILE,
    FP8_E4M3_MAX,
    KV_LORA_RANK,
    LATENT_DIM,
    ROPE_DIM,
    canonical_format,
)

# --------------------------------------------------------------------------------------------
# fp8 helpers
# --------------------------------------------------------------------------------------------


def sat_e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, round to nearest even, saturating to +-448 (NaN stays NaN)."""
    return x.float().clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def ds_mla_tile_scale(amax: torch.Tensor) -> torch.Tensor:
    """fp8_ds_mla writer scale: ``2 ** ceil(log2(max(amax / 448, 1e-4)))``, exactly.

    Computed from frexp (v = m * 2**e, m in [0.5, 1)), not from a rounded log2: ceil(log2 v) is
    e - 1 when v is a power of two (m == 0.5), else e.
    """
    v = torch.clamp(amax.float() / FP8_E4M3_MAX, min=1e-4)
    mantissa, exponent = torch.frexp(v)
    ceil_log2 = torch.where(mantissa == 0.5, exponent - 1, exponent)
    return torch.ldexp(torch.ones_like(v), ceil_log2)


# --------------------------------------------------------------------------------------------
# Cache write
# --------------------------------------------------------------------------------------------


def quantize_cache_rows(
    kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache_dtype: str, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """Rows ``[T, 576]`` (auto, in kv_c's dtype; fp8 as float8_e4m3fn) or ``[T, 656]`` uint8."""
    fmt = canonical_format(kv_cache_dtype)
    kv_c = kv_c.reshape(-1, KV_LORA_RANK)
    k_pe = k_pe.reshape(-1, ROPE_DIM)
    if fmt == "auto":
        return torch.cat([kv_c, k_pe], dim=-1)
    if fmt == "fp8":
        if scale is None:
            raise ValueError("kv_cache_dtype='fp8' needs scale")
        return sat_e4m3(torch.cat([kv_c, k_pe], dim=-1).float() / scale.float().reshape(()))
    # fp8_ds_mla
    tiles = kv_c.float().reshape(-1, DS_MLA_NUM_TILES, DS_MLA_TILE)
    tile_scale = ds_mla_tile_scale(tiles.abs().amax(dim=-1))  # [T, 4]
    q = sat_e4m3(tiles / tile_scale.unsqueeze(-1)).reshape(-1, KV_LORA_RANK)
    rows = torch.empty(kv_c.shape[0], DS_MLA_ROW_BYTES, dtype=torch.uint8, device=kv_c.device)
    rows[:, :DS_MLA_SCALE_OFFSET] = q.view(torch.uint8)
    rows[:, DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET] = tile_scale.contiguous().view(torch.uint8)
    rows[:, DS_MLA_ROPE_OFFSET:] = k_pe.to(torch.bfloat16).contiguous().view(torch.uint8)
    return rows


def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    scale: torch.Tensor | None = None,
) -> None:
    """Write token t's row into slot ``slot_mapping[t]`` of the paged cache, in place.

    ``slot = block * block_size + offset``; tokens with a negative slot (padding) or a slot past
    the cache are skipped. Only the first ``slot_mapping.numel()`` tokens are written.
    """
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    num_tokens = slot_mapping.shape[0]
    slots = slot_mapping.long()
    keep = (slots >= 0) & (slots < num_blocks * block_size)
    tokens = torch.nonzero(keep).flatten()
    rows = quantize_cache_rows(kv_c[:num_tokens][tokens], k_pe[:num_tokens][tokens], kv_cache_dtype, scale)
    slots = slots[tokens]
    # fp8 caches are written through a uint8 view (index_put has no float8 kernels on every device)
    target = kv_cache if canonical_format(kv_cache_dtype) == "auto" else kv_cache.view(torch.uint8)
    target[slots // block_size, slots % block_size] = rows.view(target.dtype)


# --------------------------------------------------------------------------------------------
# Cache read (used by the attention references)
# --------------------------------------------------------------------------------------------


def dequantize_cache(kv_cache: torch.Tensor, kv_cache_dtype: str, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The cache as fp32 ``[..., 576]`` rows: what attention reads. Readers compute ``q * s`` for
    any finite fp32 ``s`` (not only the powers of two the writer makes)."""
    fmt = canonical_format(kv_cache_dtype)
    if fmt == "auto":
        return kv_cache.float()
    if fmt == "fp8":
        if scale is None:
            raise ValueError("kv_cache_dtype='fp8' needs scale")
        return kv_cache.view(torch.float8_e4m3fn).float() * scale.float().reshape(())
    raw = kv_cache.view(torch.uint8)
    lead = raw.shape[:-1]
    q = raw[..., :KV_LORA_RANK].contiguous().view(torch.float8_e4m3fn).float()
    s = raw[..., DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET].contiguous().view(torch.float32)
    kv_c = (q.reshape(*lead, DS_MLA_NUM_TILES, DS_MLA_TILE) * s.unsqueeze(-1)).reshape(*lead, KV_LORA_RANK)
    k_pe = raw[..., DS_MLA_ROPE_OFFSET:DS_MLA_ROW_BYTES].contiguous().view(torch.bfloat16).float()
    out = torch.cat([kv_c, k_pe], dim=-1)
    assert out.shape[-1] == LATENT_DIM
    return out


# --------------------------------------------------------------------------------------------
# Dense paged decode
# --------------------------------------------------------------------------------------------


def decode_key_limits(seq_len: int, s_q: int, causal: bool) -> list[int]:
    """Per query j (0..s_q-1) of one request, how many leading positions it sees: with causal,
    query j sees ``0 .. seq_len - s_q + j`` (the s_q new tokens are the last ones in the cache);
    without, all ``seq_len``. Never negative."""
    if causal:
        return [max(0, min(seq_len, seq_len - s_q + 1 + j)) for j in range(s_q)]
    return [max(0, seq_len)] * s_q


def decode_mla(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    kv_cache_dtype: str,
    causal: bool,
    scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense paged MLA decode (MQA over the latent cache), fp32 math.

    ``q [b, s_q, h_q, 576]`` -> ``out [b, s_q, h_q, 512]`` in q's dtype and ``lse [b, h_q, s_q]``
    fp32 (natural log). Request i's position ``pos`` lives in row ``pos % block_size`` of page
    ``block_table[i, pos // block_size]``; scores use all 576 dims, values are the first 512 of
    the same rows. A position whose page is not in the table (``pos // block_size >=
    max_blocks``) or whose page id is outside ``[0, num_blocks)`` is invalid and not attended.
    A query with nothing to attend to gets out 0 and lse -inf.
    """
    b, s_q, h_q, _ = q.shape
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    max_blocks = block_table.shape[1]
    device = q.device
    out = torch.zeros(b, s_q, h_q, KV_LORA_RANK, dtype=torch.float32, device=device)
    lse = torch.full((b, h_q, s_q), float("-inf"), dtype=torch.float32, device=device)
    for i in range(b):
        seq_len = int(seq_lens[i])
        if seq_len <= 0:
            continue
        pos = torch.arange(seq_len, device=device)
        page_idx = pos // block_size
        in_table = page_idx < max_blocks
        page = block_table[i].long()[page_idx.clamp(max=max_blocks - 1)]
        valid = in_table & (page >= 0) & (page < num_blocks)
        rows = dequantize_cache(kv_cache[page.clamp(0, num_blocks - 1), pos % block_size], kv_cache_dtype, scale)
        rows = torch.where(valid[:, None], rows, torch.zeros((), device=device))  # never read junk
        scores = torch.einsum("shd,nd->shn", q[i].float(), rows) * softmax_scale  # [s_q, h_q, n]
        limits = torch.tensor(decode_key_limits(seq_len, s_q, causal), device=device)
        mask = valid[None, :] & (pos[None, :] < limits[:, None])  # [s_q, n]
        scores = torch.where(mask[:, None, :], scores, float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # [s_q, h_q]; -inf where nothing is attended
        seen = torch.isfinite(row_lse)
        probs = torch.where(seen[..., None], torch.exp(scores - row_lse[..., None]), torch.zeros((), device=device))
        out[i] = torch.einsum("shn,nd->shd", probs, rows[:, :KV_LORA_RANK])
        lse[i] = row_lse.transpose(0, 1)
    return out.to(q.dtype), lse


# The decode schedule (what the GPU planner computes; see csrc/decode/plan/plan.cu). Work unit:
# a tile of DECODE_BLOCK_N keys; a (request, part) piece costs its tiles + DECODE_PLAN_OVERHEAD.
DECODE_BLOCK_N = 64
DECODE_PLAN_OVERHEAD = 5
DECODE_SCHEDULE_FIELDS = 8  # begin_req, begin_tile, end_req, end_tile, begin_split, split_req, 0, 0
DECODE_SPLIT_INFO_FIELDS = 2  # num_splits, partial_base (-1 unless split)


def decode_block_m(num_rows: int) -> int:
    """Query rows (s_q x h_q) per CTA of the decode kernel."""
    return 16 if num_rows <= 16 else 32 if num_rows <= 32 else 64


def decode_num_parts(num_sms: int, s_q: int, h_q: int) -> int:
    """Parts of a decode schedule: the SMs divided among the row blocks of one request."""
    rows = s_q * h_q
    bm = decode_block_m(rows)
    return max(1, num_sms // ((rows + bm - 1) // bm))


def decode_plan(seq_lens: torch.Tensor, s_q: int, h_q: int, num_sms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-KV schedule: ``schedule int32 [num_sms, 8]`` and ``split_info int32 [b, 2]``.

    Requests are cut into pieces over ``num_parts`` parts, in request order, each part taking a
    budget of ``ceil(total / num_parts) + overhead`` cost units (the last takes the rest). Part p
    covers requests ``begin_req..end_req`` (empty when ``begin_req > end_req``), from tile
    ``begin_tile`` of the first to tile ``end_tile`` (exclusive) of the last; its first piece is
    split number ``begin_split`` of that request; ``split_req`` is the request first cut at its
    end (-1 if none), so each split request is listed once. ``split_info[i] = (num_splits,
    partial_base)``.
    """
    lens = [max(0, int(x)) for x in seq_lens.tolist()]
    b = len(lens)
    tiles = [(n + DECODE_BLOCK_N - 1) // DECODE_BLOCK_N for n in lens]
    num_parts = decode_num_parts(num_sms, s_q, h_q)
    total = sum(t + DECODE_PLAN_OVERHEAD for t in tiles)
    payload = (total + num_parts - 1) // num_parts + DECODE_PLAN_OVERHEAD
    schedule = torch.zeros(num_sms, DECODE_SCHEDULE_FIELDS, dtype=torch.int32)
    split_info = torch.zeros(b, DECODE_SPLIT_INFO_FIELDS, dtype=torch.int32)
    req = tile = split = 0
    for part in range(num_sms):
        begin = (req, tile, split)
        end_req, end_tile = req - 1, 0
        split_req = -1
        if part < num_parts:
            last = part == num_parts - 1
            budget = payload
            while req < b:
                rest = tiles[req] - tile
                if last or rest + DECODE_PLAN_OVERHEAD <= budget:
                    budget -= rest + DECODE_PLAN_OVERHEAD
                    split_info[req, 0] = split + 1
                    end_req, end_tile = req, tiles[req]
                    req, tile, split = req + 1, 0, 0
                    if not last and budget <= DECODE_PLAN_OVERHEAD:
                        break
                else:
                    take = budget - DECODE_PLAN_OVERHEAD
                    if take <= 0:
                        break
                    if split == 0:
                        split_req = req
                    tile += take
                    end_req, end_tile = req, tile
                    split += 1
                    break
        schedule[part, :6] = torch.tensor([begin[0], begin[1], end_req, end_tile, begin[2], split_req], dtype=torch.int32)
    base = 0
    for i in range(b):
        n = int(split_info[i, 0])
        split_info[i, 1] = base if n > 1 else -1
        base += n if n > 1 else 0
    return schedule, split_info
