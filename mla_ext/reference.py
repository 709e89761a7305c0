"""The executable spec: plain-PyTorch, fp32-math implementations of every mla_ext op.

These functions define the semantics the CUDA kernels are tested against, and they are
registered as the ops' CPU implementations, so the whole API runs without a GPU. They are
written to be read, not to be fast. They work on tensors of any device.
"""

from __future__ import annotations

import torch

from ._validate import checked_from_env
from ._validate_v4 import check_indices_in_range_v4, check_slots_in_range_v4, validate_cache_write_v4
from ._validate_v4 import validate_sparse_decode_v4
from .formats import (
    DS_MLA_NUM_TILES,
    DS_MLA_ROPE_OFFSET,
    DS_MLA_ROW_BYTES,
    DS_MLA_SCALE_OFFSET,
    DS_MLA_TILE,
    E4M3_NAN,
    FP8_E4M3_MAX,
    KV_LORA_RANK,
    LATENT_DIM,
    ROPE_DIM,
    UE8M0_BIAS,
    UE8M0_NAN,
    V4_DATA_BYTES,
    V4_HEAD_DIM,
    V4_NOPE_DIM,
    V4_NUM_TILES,
    V4_ROPE_OFFSET,
    V4_TILE,
    V4_TOKEN_BYTES,
    canonical_format,
    canonical_format_v4,
    v4_page_views,
)

# --------------------------------------------------------------------------------------------
# fp8 helpers
# --------------------------------------------------------------------------------------------


def sat_e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, round to nearest even, saturating to +-448 (NaN stays NaN)."""
    return x.float().clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def ds_mla_scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """``ceil(log2(max(amax / 448, 1e-4)))`` exactly, as int32, for finite ``amax`` (fp32 math).

    Computed from frexp (v = m * 2**e, m in [0.5, 1)), not from a rounded log2: ceil(log2 v) is
    e - 1 when v is a power of two (m == 0.5), else e.
    """
    v = torch.clamp(amax.float() / FP8_E4M3_MAX, min=1e-4)
    mantissa, exponent = torch.frexp(v)
    return torch.where(mantissa == 0.5, exponent - 1, exponent)


def ds_mla_tile_scale(amax: torch.Tensor) -> torch.Tensor:
    """fp8_ds_mla writer scale: ``2 ** ceil(log2(max(amax / 448, 1e-4)))``, exactly."""
    return torch.ldexp(torch.ones_like(amax, dtype=torch.float32), ds_mla_scale_exponent(amax))


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


# ============================================================================================
# Absorbed projections
# ============================================================================================
# kv_b_proj.weight is [H * (P + V), L]: for head h, rows h*(P+V) .. h*(P+V)+P-1 are W_UK[h]
# ([P, L]) and the next V rows are W_UV[h]^T ([V, L]). DESIGN.md §1: transpose to [L, H, P+V]
# and split on the last dim. The absorbed ops then compute, per head h,
#   q_absorb: q_lat[t, h, :L] = q_nope[t, h] @ W_UK_T[h]    ([P] x [P, L]),  q_lat[t, h, L:] = q_pe
#   v_up:     out[t, h]       = o_lat[t, h] @ W_UV[h]       ([L] x [L, V])
# fp8 checkpoints ship kv_b_proj.weight as e4m3 with weight_scale_inv [ceil(N/128), ceil(L/128)]:
# element (i, j) is worth w[i, j] * scale_inv[i // 128, j // 128].

QK_NOPE_HEAD_DIM = 128  # P (DeepSeek V2/V3)
V_HEAD_DIM = 128  # V
FP8_WEIGHT_BLOCK = 128  # side of the square blocks of weight_scale_inv


def dequantize_block_fp8(weight: torch.Tensor, weight_scale_inv: torch.Tensor, block: int = FP8_WEIGHT_BLOCK) -> torch.Tensor:
    """fp8 e4m3 ``[N, K]`` with ``weight_scale_inv [ceil(N/block), ceil(K/block)]`` -> fp32."""
    n, k = weight.shape
    s = weight_scale_inv.float().repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    return weight.float() * s


def split_kv_b_proj(
    kv_b_weight: torch.Tensor, num_heads: int, qk_nope_head_dim: int = QK_NOPE_HEAD_DIM, v_head_dim: int = V_HEAD_DIM
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(W_UK_T [H, P, L], W_UV [H, L, V])`` from a (dequantised) ``kv_b_proj.weight``."""
    L = kv_b_weight.shape[1]
    w = kv_b_weight.float().t().reshape(L, num_heads, qk_nope_head_dim + v_head_dim)  # [L, H, P+V]
    w_uk, w_uv = w.split([qk_nope_head_dim, v_head_dim], dim=-1)  # [L, H, P], [L, H, V]
    return w_uk.permute(1, 2, 0), w_uv.transpose(0, 1)


def dequantize_w_uk_t(w_uk_t: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``W_UK_T [H, P, L]`` (bf16, or e4m3 with ``scale [H, L/128]``, one per 128 columns) -> fp32."""
    if scale is None:
        return w_uk_t.float()
    return w_uk_t.float() * scale.float().repeat_interleave(FP8_WEIGHT_BLOCK, dim=1)[:, None, :]


def dequantize_w_uv(w_uv: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``W_UV [H, L, V]`` (bf16, or e4m3 with ``scale [H, L/128]``, one per 128 rows) -> fp32."""
    if scale is None:
        return w_uv.float()
    return w_uv.float() * scale.float().repeat_interleave(FP8_WEIGHT_BLOCK, dim=1)[:, :, None]


def q_absorb(
    q_nope: torch.Tensor, q_pe: torch.Tensor, w_uk_t: torch.Tensor, w_uk_t_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """Latent query ``[T, H, L + R]`` in q_nope's dtype: ``q_nope [T, H, P] x W_UK_T [H, P, L]``
    per head (fp32 math), then ``q_pe [T, H, R]`` in the last R columns."""
    w = dequantize_w_uk_t(w_uk_t, w_uk_t_scale)
    q_lat = torch.einsum("thp,hpl->thl", q_nope.float(), w)
    return torch.cat([q_lat, q_pe.float()], dim=-1).to(q_nope.dtype)


def v_up(x: torch.Tensor, w_uv: torch.Tensor, w_uv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., H, L] x W_UV [H, L, V]`` per head (fp32 math) -> ``[..., H, V]`` contiguous in
    x's dtype, so ``view(T, H * V)`` is o_proj's input."""
    w = dequantize_w_uv(w_uv, w_uv_scale)
    return torch.einsum("...hl,hlv->...hv", x.float(), w).to(x.dtype).contiguous()


def _causal_softmax(scores: torch.Tensor, causal: bool) -> torch.Tensor:
    """Softmax over keys of ``scores [H, T, S]``; with causal, query t (the last T of S positions)
    sees keys ``0 .. S - T + t``."""
    if causal:
        t, s = scores.shape[-2], scores.shape[-1]
        keep = torch.arange(s, device=scores.device)[None, :] <= (s - t + torch.arange(t, device=scores.device))[:, None]
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1)


def mla_attention_unabsorbed(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_b_weight: torch.Tensor,
    softmax_scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """Ordinary multi-head attention of one sequence, K/V expanded with ``kv_b_proj`` (what
    prefill may run): ``q_nope [T, H, P]``, ``q_pe [T, H, R]``, ``kv_c [S, L]``, ``k_pe [S, R]``,
    ``kv_b_weight [H * (P + V), L]`` (dequantised). Returns o_proj's input ``[T, H, V]`` in fp32."""
    num_heads, p = q_nope.shape[1], q_nope.shape[2]
    v_dim = kv_b_weight.shape[0] // num_heads - p
    s = kv_c.shape[0]
    kv = (kv_c.float() @ kv_b_weight.float().t()).view(s, num_heads, p + v_dim)
    k_nope, v = kv.split([p, v_dim], dim=-1)
    k = torch.cat([k_nope, k_pe.float()[:, None, :].expand(s, num_heads, -1)], dim=-1)  # [S, H, P+R]
    q = torch.cat([q_nope.float(), q_pe.float()], dim=-1)  # [T, H, P+R]
    probs = _causal_softmax(torch.einsum("thd,shd->hts", q, k) * softmax_scale, causal)
    return torch.einsum("hts,shv->thv", probs, v)


def mla_attention_absorbed(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    w_uk_t: torch.Tensor,
    w_uv: torch.Tensor,
    softmax_scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """The same attention in absorbed form (what decode runs): ``q_absorb``, MQA over the latent
    rows ``[kv_c | k_pe]`` (values = kv_c) with the un-absorbed head's ``softmax_scale``, then
    ``v_up``. Weights fp32 ``W_UK_T [H, P, L]``, ``W_UV [H, L, V]``. Returns ``[T, H, V]`` fp32."""
    q_lat = q_absorb(q_nope.float(), q_pe.float(), w_uk_t.float())  # [T, H, L + R]
    rows = torch.cat([kv_c.float(), k_pe.float()], dim=-1)  # [S, L + R]: one KV head for all
    probs = _causal_softmax(torch.einsum("thc,sc->hts", q_lat, rows) * softmax_scale, causal)
    o_lat = torch.einsum("hts,sl->thl", probs, kv_c.float())  # [T, H, L]
    return v_up(o_lat, w_uv.float())


# --------------------------------------------------------------------------------------------
# Sparse top-k decode
# --------------------------------------------------------------------------------------------


def sparse_index_validity(
    indices: torch.Tensor, num_slots: int, topk_length: torch.Tensor | None = None
) -> torch.Tensor:
    """Which entries of ``indices [b, s_q, topk]`` count: ``0 <= slot < num_slots`` and position
    ``< topk_length[b]`` (when given). Invalid entries contribute nothing and are never read."""
    idx = indices.long()
    valid = (idx >= 0) & (idx < num_slots)
    if topk_length is not None:
        pos = torch.arange(indices.shape[-1], device=indices.device)
        valid &= pos.view(1, 1, -1) < topk_length.long().view(-1, 1, 1)
    return valid


def sparse_decode_mla(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    kv_cache_dtype: str,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse top-k MLA decode: query token ``(i, j)`` attends to the cache slots
    ``indices[i, j, :]`` only (DeepSeek V3.2).

    ``q [b, s_q, h_q, 576]``, ``kv_cache [num_blocks, block_size, row]`` (``auto`` or
    ``fp8_ds_mla``), ``indices int32 [b, s_q, topk]`` global slots ``block * block_size + offset``.
    Scores over all 576 dims times ``softmax_scale``, values = the first 512 dims of the same rows.
    Invalid entries (negative, ``>= num_blocks * block_size``, or at positions ``>=
    topk_length[i]``) are masked out and their rows never read; duplicates count as often as they
    appear. A query with no valid entry gives out 0 and lse -inf; a valid row holding NaN makes its
    query's out and lse NaN. ``attn_sink [h_q]`` fp32 scales out by ``e^lse / (e^lse + e^sink)``
    (lse unchanged; +inf gives 0, -inf leaves out as is).

    Returns ``out [b, s_q, h_q, 512]`` in q's dtype and ``lse [b, h_q, s_q]`` fp32 (natural log).
    """
    b, s_q, h_q, _ = q.shape
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    if num_blocks * block_size == 0:  # an empty cache: no entry is valid (and no row to gather)
        out = q.new_zeros(b, s_q, h_q, KV_LORA_RANK)
        return out, torch.full((b, h_q, s_q), float("-inf"), dtype=torch.float32, device=q.device)
    valid = sparse_index_validity(indices, num_blocks * block_size, topk_length)  # [b, s_q, topk]
    # Gather through a safe slot (0) for invalid entries, then zero those rows: the masked
    # values never reach the result, even when the slot holds NaN.
    safe = torch.where(valid, indices.long(), torch.zeros_like(indices, dtype=torch.long))
    raw_rows = kv_cache[safe // block_size, safe % block_size]  # [b, s_q, topk, row]
    rows = dequantize_cache(raw_rows, kv_cache_dtype)
    rows = torch.where(valid.unsqueeze(-1), rows, torch.zeros_like(rows))
    return attend_selected(q, rows, valid, softmax_scale, attn_sink, KV_LORA_RANK)


def attend_selected(q: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, softmax_scale: float,
                    attn_sink: torch.Tensor | None, value_dims: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention of the sparse decodes (V3.2 and V4) over the rows each query selected: ``q [b,
    s_q, h_q, d]``, ``rows`` fp32 ``[b, s_q, k, d]`` (zeros at invalid entries), ``valid [b, s_q,
    k]``; scores ``q . row * softmax_scale`` over all d dims, value = the first ``value_dims`` dims.
    Nothing valid: out 0, lse -inf. A NaN score (a valid row holding NaN) makes the query's out and
    lse NaN. ``attn_sink``: out times ``e^lse / (e^lse + e^sink)``, lse unchanged. Returns ``out [b,
    s_q, h_q, value_dims]`` in q's dtype and ``lse [b, h_q, s_q]`` fp32 (natural log)."""
    scores = torch.einsum("bshd,bskd->bshk", q.float(), rows) * softmax_scale
    scores = scores.masked_fill(~valid.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [b, s_q, h_q]; -inf where nothing is valid, NaN at a NaN score
    out = torch.einsum("bshk,bskd->bshd", softmax_probs(scores), rows[..., :value_dims])
    out = torch.where(torch.isnan(lse).unsqueeze(-1), float("nan"), out)  # softmax_probs would give 0 there
    if attn_sink is not None:
        out = out * sink_factor(lse, attn_sink).unsqueeze(-1)
    return out.to(q.dtype), lse.permute(0, 2, 1).contiguous()


def softmax_probs(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim, 0 for a row that is all -inf. Normalised by the sum of
    ``exp(scores - max)``, not as ``exp(scores - lse)``: at |scores| >= 2^24 an fp32 lse cannot hold
    the log of a small sum (its step is >= 1), so a key that appears twice (a duplicate index, or two
    slots with the same row) would weigh 1 each instead of 1/2 and the row would sum to 2."""
    top = scores.amax(dim=-1, keepdim=True)
    any_key = torch.isfinite(top)
    e = torch.where(any_key, torch.exp(scores - torch.where(any_key, top, 0.0)), 0.0)
    return e / e.sum(dim=-1, keepdim=True).clamp_min(1.0)  # the sum is >= 1 where a key is valid


def sink_factor(lse: torch.Tensor, attn_sink: torch.Tensor) -> torch.Tensor:
    """``e^lse / (e^lse + e^sink)`` per head (last dim of ``lse`` is h_q): 0 where lse is -inf or
    the sink is +inf, 1 where the sink is -inf."""
    sink = attn_sink.float().expand_as(lse)
    factor = torch.sigmoid(lse - sink)
    factor = torch.where(sink == float("-inf"), 1.0, factor)
    return torch.where(lse == float("-inf"), 0.0, factor)


def _positions_to_slots(table_rows: torch.Tensor, pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """Global slot of each position ``pos [N, K]`` through block-table row ``table_rows[n]`` (int64).
    -1 for a negative position, one past the table, a negative (unassigned) table entry, or a
    slot past int32 (the indices' type: narrowing would wrap it to a valid-looking slot)."""
    if table_rows.shape[1] == 0:
        return torch.full_like(pos, -1)
    page = torch.div(pos, block_size, rounding_mode="floor")
    ok = (pos >= 0) & (page < table_rows.shape[1])
    block = torch.gather(table_rows.long(), 1, torch.where(ok, page, torch.zeros_like(page)))
    slots = block * block_size + pos % block_size
    ok &= (block >= 0) & (slots <= torch.iinfo(torch.int32).max)
    return torch.where(ok, slots, torch.full_like(slots, -1))


def sparse_indices_to_slots(local_indices: torch.Tensor, block_table: torch.Tensor, block_size: int) -> torch.Tensor:
    """Local top-k token positions ``[b, s_q, topk]`` (-1 padded) -> global cache slots through
    request i's ``block_table[i]``: ``block_table[i, p // block_size] * block_size + p %
    block_size``. Negative positions, positions past the block table, negative block-table
    entries and slots past int32 give -1. int32."""
    b = local_indices.shape[0]
    slots = _positions_to_slots(block_table, local_indices.long().reshape(b, -1), block_size)
    return slots.view(local_indices.shape).to(torch.int32)


def sparse_topk_to_slots(
    topk_indices: torch.Tensor, token_to_req: torch.Tensor, block_table: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A flat batch's top-k lists of compressed-cache positions -> global slots and lengths (what
    DeepSeek-V4's C4A layers feed the decode as their second index list).

    Token t's list ``topk_indices[t]`` holds positions in the compressed cache of request
    ``token_to_req[t]`` (-1 = none); each becomes ``block_table[req, p // block_size] * block_size
    + p % block_size`` (-1 as in :func:`sparse_indices_to_slots`). ``lengths[t]`` is one past the
    last non-negative entry (the number of entries for the valid-first lists an indexer makes), 0
    for a padding token (``token_to_req`` outside ``[0, num_requests)``, e.g. -1), whose row is all
    -1 and which never reads the table. Returns ``slots int32 [T, topk]``, ``lengths int32 [T]``.
    """
    num_tokens, topk = topk_indices.shape
    req = token_to_req.long()
    is_request = (req >= 0) & (req < block_table.shape[0])
    pos = topk_indices.long()
    j = torch.arange(topk, device=pos.device).view(1, -1)
    last = torch.where(pos >= 0, j + 1, torch.zeros_like(j)).amax(dim=1) if topk > 0 else req.new_zeros(num_tokens)
    lengths = torch.where(is_request, last, torch.zeros_like(last))
    slots = torch.full_like(pos, -1)
    if block_table.shape[0] > 0:
        rows = block_table[torch.where(is_request, req, torch.zeros_like(req))]  # [T, max_blocks]
        slots = torch.where(is_request.view(-1, 1), _positions_to_slots(rows, pos, block_size), slots)
    return slots.to(torch.int32), lengths.to(torch.int32)


def compressed_slot_mapping(
    positions: torch.Tensor, token_to_req: torch.Tensor, block_table: torch.Tensor, block_size: int, compress_ratio: int
) -> torch.Tensor:
    """Where each token's compressed row goes in a compressed cache (the cache write's slot_mapping).

    The token at position p of request ``token_to_req[t]`` completes compressed entry ``c = p //
    compress_ratio`` when ``(p + 1) % compress_ratio == 0``; that entry's slot is ``block_table[req,
    c // block_size] * block_size + c % block_size``. Every other token, a padding token
    (``token_to_req`` outside ``[0, num_requests)``), an entry without a page and a slot past int32
    (as for the index lists) get -1, which the cache write skips. Returns int64 ``[T]``.
    """
    req = token_to_req.long()
    is_request = (req >= 0) & (req < block_table.shape[0])
    pos = positions.long()
    completes = is_request & (pos >= 0) & ((pos + 1) % compress_ratio == 0)
    entry = torch.where(completes, torch.div(pos, compress_ratio, rounding_mode="floor"), torch.full_like(pos, -1))
    if block_table.shape[0] == 0:
        return torch.full_like(pos, -1)
    rows = block_table[torch.where(is_request, req, torch.zeros_like(req))]
    return _positions_to_slots(rows, entry.view(-1, 1), block_size).view(-1)


def sparse_compressed_indices(
    positions: torch.Tensor,
    token_to_req: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    compress_ratio: int,
    num_decode_tokens: int,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The "attend to every compressed token" lists of compressed-cache layers.

    Token t (at ``positions[t]`` of request ``token_to_req[t]``) sees the ``n = (positions[t] + 1)
    // compress_ratio`` compressed entries ``0 .. n-1`` of its request. Decode tokens (``t <
    num_decode_tokens``) get them as global slots of the compressed cache through the block table
    (-1 where the table has no page or the slot is past int32); prefill tokens get the local
    indices ``0 .. n-1`` and never read the table. A token whose ``token_to_req`` is outside ``[0,
    num_requests)`` (CUDA-graph padding, e.g. -1) is padding: ``n = 0``. Rows are -1 padded to
    ``width``; entries past ``width`` are dropped. Returns ``indices int32 [T, width]`` and
    ``lengths int32 [T] = min(n, width)``.
    """
    num_tokens = positions.shape[0]
    req = token_to_req.long()
    is_request = (req >= 0) & (req < block_table.shape[0])
    n = torch.clamp(torch.div(positions.long() + 1, compress_ratio, rounding_mode="floor"), min=0)
    n = torch.where(is_request, n, torch.zeros_like(n))
    lengths = torch.clamp(n, max=width)
    j = torch.arange(width, device=positions.device).view(1, -1).expand(num_tokens, -1)
    inside = j < n.view(-1, 1)
    values = j.clone()  # prefill tokens: local indices
    d = num_decode_tokens
    if d > 0 and block_table.shape[0] > 0:  # (no request: every token is padding)
        rows = block_table[torch.where(is_request[:d], req[:d], torch.zeros_like(req[:d]))]  # [d, max_blocks]
        values[:d] = _positions_to_slots(rows, j[:d], block_size)
    indices = torch.where(inside, values, torch.full_like(values, -1))
    return indices.to(torch.int32), lengths.to(torch.int32)


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
        probs = softmax_probs(scores)
        out[i] = torch.einsum("shn,nd->shd", probs, rows[:, :KV_LORA_RANK])
        lse[i] = row_lse.transpose(0, 1)
    return out.to(q.dtype), lse


# The decode schedule (what the GPU planner computes; see csrc/decode/plan/plan.cu). Work unit:
# a tile of DECODE_BLOCK_N keys; a request costs its tiles + DECODE_PLAN_OVERHEAD.
DECODE_BLOCK_N = 64
DECODE_PLAN_OVERHEAD = 5
DECODE_SCHEDULE_FIELDS = 8  # begin_req, begin_tile, end_req, end_tile, begin_split, split_req (a list), 0, 0
DECODE_SPLIT_INFO_FIELDS = 2  # num_splits, partial_base (-1 unless split)
DECODE_MAX_BATCH = 65535  # requests of one plan (the kernels' grids)
DECODE_MAX_PARTS = 4096


def decode_block_m(num_rows: int, kv_cache_dtype: str = "auto") -> int:
    """Query rows (s_q x h_q) per CTA of the decode kernel: 16, 32 or 64; fp8 caches 16 up to 32 rows
    (their 16-row kernel converts in registers, and two such CTAs beat one 32- or 64-row tile)."""
    if kv_cache_dtype != "auto" and num_rows <= 32:
        return 16
    return 16 if num_rows <= 16 else 32 if num_rows <= 32 else 64


def decode_num_parts(num_sms: int, s_q: int, h_q: int, kv_cache_dtype: str = "auto") -> int:
    """Parts of a decode schedule: the SMs divided among the row blocks of one request."""
    rows = s_q * h_q
    bm = decode_block_m(rows, kv_cache_dtype)
    return max(1, num_sms // ((rows + bm - 1) // bm))


def decode_max_partials(num_parts: int, b: int) -> int:
    """Upper bound on the partial results (pieces of split requests) of a plan: each part ends with
    at most one cut, and a split request has one more piece than cuts."""
    return num_parts + min(b, num_parts)


def decode_workspace_shape(num_parts: int, b: int, s_q: int, h_q: int) -> tuple[int, int, int, int]:
    """Shape of a plan's fp32 workspace, ``[max_partials, s_q, h_q, 513]``: room for partial o
    ``[max_partials, s_q * h_q, 512]`` then partial lse ``[max_partials, s_q * h_q]`` (the split
    kernels write them, the combine merges them); the shape records the geometry, which the
    decode op checks."""
    return decode_max_partials(num_parts, b), s_q, h_q, KV_LORA_RANK + 1


def decode_plan(seq_lens: torch.Tensor, s_q: int, h_q: int, num_sms: int,
                kv_cache_dtype: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """The split-KV schedule: ``schedule int32 [num_parts, 8]`` (``num_parts =
    decode_num_parts(num_sms, s_q, h_q, kv_cache_dtype)``) and ``split_info int32 [b, 2]``.

    Request r costs ``tiles[r] + overhead``. Laid end to end, request r occupies ``[C[r], C[r+1])``
    of the cost line (its overhead first, then tile k at ``C[r] + overhead + k``), and the ``U =
    min(num_parts, total)`` non-empty parts cut the line evenly at ``B[p] = p * total // U``. A
    boundary inside request r past its overhead cuts it before tile ``B[p] - C[r] - overhead``
    (the request is split there); one inside the overhead puts the whole request in the later
    part. Parts ``U ..`` are empty.

    Part p covers requests ``begin_req..end_req`` (empty when ``begin_req > end_req``), from tile
    ``begin_tile`` of the first to tile ``end_tile`` (exclusive) of the last; its first piece is
    split number ``begin_split`` of that request. Column ``split_req`` is a list: row y holds the
    y-th split request (in request order), -1 after the last. ``split_info[r] = (num_splits,
    partial_base)``, partial_base -1 for a request that is not split.
    """
    overhead = DECODE_PLAN_OVERHEAD
    lens = [max(0, int(x)) for x in seq_lens.tolist()]
    b = len(lens)
    tiles = [(n + DECODE_BLOCK_N - 1) // DECODE_BLOCK_N for n in lens]
    num_parts = decode_num_parts(num_sms, s_q, h_q, kv_cache_dtype)
    starts = [0]  # starts[r] = C[r]; starts[b] = total
    for t in tiles:
        starts.append(starts[-1] + t + overhead)
    total = starts[b]
    used = min(num_parts, total)

    def boundary(p: int) -> int:  # B[p], p = 0 .. used
        return p * total // used

    def first(y: int) -> int:  # the smallest p with B[p] >= y, for 0 <= y <= total
        return -(-y * used // total)

    def cut(x: int) -> tuple[int, int]:  # (request, first tile of the later part) at boundary x < total
        lo, hi = 0, b - 1  # the last r with starts[r] <= x
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if starts[mid] <= x else (lo, mid - 1)
        return lo, max(0, x - starts[lo] - overhead)

    info = []
    split_reqs = []
    slot = 0
    for r in range(b):
        pieces = 1 + max(0, first(starts[r + 1]) - first(starts[r] + overhead + 1))
        info.append([pieces, slot if pieces > 1 else -1])
        if pieces > 1:
            split_reqs.append(r)
            slot += pieces
    split_info = torch.tensor(info, dtype=torch.int32).view(b, DECODE_SPLIT_INFO_FIELDS)

    rows = []
    for p in range(num_parts):
        if p < used:
            r, t = cut(boundary(p))
            begin = (r, t, p - first(starts[r] + overhead + 1) + 1 if t > 0 else 0)
        else:
            begin = (b, 0, 0)
        if p + 1 < used:
            r, t = cut(boundary(p + 1))
            end = (r, t) if t > 0 else (r - 1, tiles[r - 1] if r > 0 else 0)
        else:
            end = (b - 1, tiles[b - 1] if p + 1 == used else 0)
        rows.append([begin[0], begin[1], end[0], end[1], begin[2], -1, 0, 0])
    for y, r in enumerate(split_reqs):
        rows[y][5] = r
    return torch.tensor(rows, dtype=torch.int32).view(num_parts, DECODE_SCHEDULE_FIELDS), split_info


# ============================================================================================
# DeepSeek-V4: the spec of the ops in mla_ext/v4.py (their CPU implementations call these)
# ============================================================================================
# V4 heads are 512 wide (448 NoPE + 64 RoPE), the cache row is the same 512 dims, and the value is
# the whole row. Layouts in mla_ext/formats.py. Unlike the V3 functions above (whose op modules
# validate), these validate their own inputs (mla_ext/_validate_v4.py), raising MlaInputError.


def v4_scale_bytes(amax: torch.Tensor) -> torch.Tensor:
    """UE8M0 byte of each V4 tile scale from the tile's ``amax`` (fp32): ``127 + e`` with ``e =
    ceil(log2(max(amax / 448, 1e-4)))`` (so 114..247 for finite amax), 0xFF (NaN) for inf or NaN."""
    finite = torch.isfinite(amax)
    exponent = ds_mla_scale_exponent(torch.where(finite, amax.float(), 0.0))
    return torch.where(finite, exponent + UE8M0_BIAS, UE8M0_NAN).to(torch.uint8)


def ue8m0_to_float(scale_bytes: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes -> fp32: ``2 ** (byte - 127)`` (2^-127 is an fp32 subnormal, exact), 0xFF NaN."""
    exponent = scale_bytes.to(torch.int32) - UE8M0_BIAS
    value = torch.ldexp(torch.ones(scale_bytes.shape, dtype=torch.float32, device=scale_bytes.device), exponent)
    return torch.where(scale_bytes == UE8M0_NAN, float("nan"), value)


def quantize_v4_rows(kv: torch.Tensor) -> torch.Tensor:
    """V4 fp8_ds_mla quantisation: ``kv [T, 512]`` (bf16/fp16) -> ``uint8 [T, 584]``, each token's
    data part (bytes 0-575) then its scale part (576-583), as :func:`concat_and_cache_mla_v4`
    scatters them into a page.

    - bytes 0-447: NoPE dim d as e4m3 ``sat_e4m3(x_d / 2^e_i)``, round to nearest even, for tile
      ``i = d // 64``; ``e_i`` from the tile's amax (:func:`v4_scale_bytes`), so ``|x / 2^e| <=
      448``; dividing by a power of two in fp32 rounds nothing that e4m3 keeps.
    - bytes 448-575: RoPE dims 448..511 as bf16 (fp16 input rounded to nearest even; bf16 copied).
    - bytes 576-582: tile i's UE8M0 byte ``127 + e_i``; byte 583: pad, 0.
    - A tile holding inf or NaN: scale byte 0xFF (NaN) and e4m3 NaN (0x7F) in all its 64 bytes.
    """
    kv = kv.reshape(-1, V4_HEAD_DIM)
    tiles = kv[:, :V4_NOPE_DIM].float().reshape(-1, V4_NUM_TILES, V4_TILE)
    amax = tiles.abs().amax(dim=-1)  # [T, 7]; NaN if the tile holds one
    scale_bytes = v4_scale_bytes(amax)
    finite = scale_bytes != UE8M0_NAN
    scale = torch.where(finite, ue8m0_to_float(scale_bytes), 1.0)
    nope = sat_e4m3(tiles / scale.unsqueeze(-1)).view(torch.uint8)
    nope = torch.where(finite.unsqueeze(-1), nope, torch.full_like(nope, E4M3_NAN))
    rows = torch.zeros(kv.shape[0], V4_TOKEN_BYTES, dtype=torch.uint8, device=kv.device)
    rows[:, :V4_ROPE_OFFSET] = nope.reshape(-1, V4_NOPE_DIM)
    rows[:, V4_ROPE_OFFSET:V4_DATA_BYTES] = kv[:, V4_NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8)
    rows[:, V4_DATA_BYTES:V4_DATA_BYTES + V4_NUM_TILES] = scale_bytes
    return rows


def dequantize_v4_rows(rows: torch.Tensor) -> torch.Tensor:
    """``uint8 [..., 584]`` tokens (data part then scale part, as :func:`quantize_v4_rows` makes
    them) -> fp32 ``[..., 512]``: NoPE ``e4m3 * 2^(byte - 127)`` per 64-dim tile (NaN for scale byte
    0xFF), RoPE bf16. The pad byte is not read.

    Computed in fp32. FlashMLA's reader multiplies in bf16; the two agree (both exact, or both
    inf at the top of bf16's range: see mla_ext/formats.py) for every scale a writer makes (2^-13
    .. 2^120); only hand-made scale bytes below 2^-13 could give products under bf16's normal
    range, where bf16 rounds and fp32 does not.
    """
    lead = rows.shape[:-1]
    nope = rows[..., :V4_NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scale = ue8m0_to_float(rows[..., V4_DATA_BYTES:V4_DATA_BYTES + V4_NUM_TILES])
    nope = (nope.reshape(*lead, V4_NUM_TILES, V4_TILE) * scale.unsqueeze(-1)).reshape(*lead, V4_NOPE_DIM)
    rope = rows[..., V4_ROPE_OFFSET:V4_DATA_BYTES].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=-1)


def read_v4_cache(kv_cache: torch.Tensor, slots: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
    """The fp32 ``[..., 512]`` rows at in-range global ``slots`` (any shape, ``block * block_size +
    offset``) of a V4 cache: what attention reads. fp8_ds_mla: token ``offset``'s data part and
    scale part of page ``block`` (:func:`mla_ext.formats.v4_page_views`), dequantised."""
    block_size = kv_cache.shape[1]
    slots = slots.long()
    block, offset = slots // block_size, slots % block_size
    if canonical_format_v4(kv_cache_dtype) == "auto":
        return kv_cache[block, offset].float()
    data, scales = v4_page_views(kv_cache)
    return dequantize_v4_rows(torch.cat([data[block, offset], scales[block, offset]], dim=-1))


def concat_and_cache_mla_v4(
    kv: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    *,
    checked: bool | None = None,
) -> None:
    """DeepSeek-V4 cache write: token t's row ``kv[t]`` into slot ``slot_mapping[t]``, in place.

    ``kv [T, 512]`` bf16/fp16 (448 NoPE then 64 RoPE; rows may be strided, last dim contiguous),
    ``kv_cache`` a V4 cache (:func:`mla_ext.formats.empty_kv_cache_v4`), ``slot_mapping int64
    [T']``, ``T' <= T`` (only the first T' tokens are written). ``slot = block * block_size +
    offset``; a negative slot (padding) is skipped, and so is a slot ``>= num_blocks * block_size``
    unless checked mode raises ``IndexError`` for it (``checked``; None: the environment variable
    ``MLA_EXT_CHECK_SLOTS``, as in the V3 ops).

    ``auto``: the row as given (the cache has kv's dtype). ``fp8_ds_mla``: the 576-byte data part
    and 8-byte scale part of :func:`quantize_v4_rows` at :func:`mla_ext.formats.v4_token_offsets`
    of the page; nothing else in the page (other tokens, page padding) is written. Duplicate slots in
    one call leave the slot's bytes unspecified.
    """
    fmt = validate_cache_write_v4(kv, kv_cache, slot_mapping, kv_cache_dtype)
    if checked or (checked is None and checked_from_env()):
        check_slots_in_range_v4(kv_cache, slot_mapping)
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    slots = slot_mapping.long()
    tokens = torch.nonzero((slots >= 0) & (slots < num_blocks * block_size)).flatten()
    slots = slots[tokens]
    block, offset = slots // block_size, slots % block_size
    rows = kv[: slot_mapping.shape[0]][tokens]
    if fmt == "auto":
        kv_cache[block, offset] = rows
        return
    packed = quantize_v4_rows(rows)
    data, scales = v4_page_views(kv_cache)
    data[block, offset] = packed[:, :V4_DATA_BYTES]
    scales[block, offset] = packed[:, V4_DATA_BYTES:]


def _v4_pool(kv_cache, indices, topk_length, fmt) -> tuple[torch.Tensor, torch.Tensor]:
    """One pool's rows fp32 ``[b, s_q, topk, 512]`` (zeros at invalid entries, whose rows are never
    read) and validity ``[b, s_q, topk]``, by the V3 rule (:func:`sparse_index_validity`)."""
    num_slots = kv_cache.shape[0] * kv_cache.shape[1]
    valid = sparse_index_validity(indices, num_slots, topk_length)
    rows = torch.zeros(*indices.shape, V4_HEAD_DIM, dtype=torch.float32, device=indices.device)
    if num_slots > 0:  # an empty cache has no valid entry and no row to gather
        safe = torch.where(valid, indices.long(), 0)  # gather invalid entries from slot 0, then drop them
        rows = torch.where(valid.unsqueeze(-1), read_v4_cache(kv_cache, safe, fmt), rows)
    return rows, valid


def sparse_decode_mla_v4(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    kv_cache_dtype: str,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_kv_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    *,
    checked: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4 sparse decode: query token ``(i, j)`` attends to the slots ``indices[i, j, :]``
    of ``kv_cache`` and, when given, the slots ``extra_indices[i, j, :]`` of ``extra_kv_cache`` (the
    sliding-window pool, with its own page size), all in one softmax.

    ``q [b, s_q, h_q, 512]`` bf16 (448 NoPE then 64 RoPE), ``s_q`` 1..16, any ``h_q``. Both caches
    are V4 caches of one ``kv_cache_dtype`` (``auto``: bf16 ``[nb, bs, 512]``; ``fp8_ds_mla``: uint8
    ``[nb, bs, 584]``, mla_ext/formats.py), each with its own ``block_size``. ``indices int32 [b, s_q,
    topk]`` and ``extra_indices int32 [b, s_q, extra_topk]`` hold global slots ``block * block_size +
    offset`` of their own cache; ``topk_length`` / ``extra_topk_length int32 [b]``: only the first n
    entries of request i's lists count (a length past the list counts the whole list). int64 index
    tensors are refused with the conversion to make, as by the V3 ops.

    As V3's :func:`sparse_decode_mla`: an entry is invalid when negative, ``>= num_blocks *
    block_size`` of its cache, or at a position ``>=`` its list's length; invalid entries
    contribute nothing and their rows are never read (NaN there does not reach the result);
    duplicates count as often as they appear. Scores are ``q . row`` over all 512 dims times
    ``softmax_scale``; the value is the whole 512-wide dequantised row, RoPE part included. A query
    with no valid entry in either pool gives out 0 and lse -inf. A valid entry whose row holds NaN
    (e.g. a tile with scale byte 0xFF) makes its query's out and lse NaN. ``attn_sink fp32 [h_q]``
    scales out by ``e^lse / (e^lse + e^sink)`` with lse unchanged (+inf: out 0; -inf: no change).
    Checked mode (``checked``; None: ``MLA_EXT_CHECK_SLOTS``) raises ``IndexError`` for an entry
    past its cache at a counted position instead (negative entries stay allowed).

    FlashMLA's reference (tests/ref.py) computes the same, with the same sink factor and an lse
    without the sink, except: a query with nothing valid gets lse +inf there (out 0 in both); only
    -1 is invalid there (it would read slot 0 for another negative entry and fail on one past the
    cache); and it zeroes NaN in every gathered row, so NaN in a valid row reads as 0 there.

    Returns ``out [b, s_q, h_q, 512]`` in q's dtype and ``lse [b, h_q, s_q]`` fp32 (natural log of
    the sum of exp of the scaled scores over both pools).
    """
    fmt = validate_sparse_decode_v4(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length, attn_sink,
                                    extra_kv_cache, extra_indices, extra_topk_length)
    if checked or (checked is None and checked_from_env()):
        check_indices_in_range_v4(kv_cache, indices, topk_length, "indices")
        if extra_kv_cache is not None:
            check_indices_in_range_v4(extra_kv_cache, extra_indices, extra_topk_length, "extra_indices")
    rows, valid = _v4_pool(kv_cache, indices, topk_length, fmt)
    if extra_kv_cache is not None:
        extra_rows, extra_valid = _v4_pool(extra_kv_cache, extra_indices, extra_topk_length, fmt)
        rows = torch.cat([rows, extra_rows], dim=2)  # [b, s_q, topk + extra_topk, 512]
        valid = torch.cat([valid, extra_valid], dim=2)
    return attend_selected(q, rows, valid, softmax_scale, attn_sink, V4_HEAD_DIM)  # the value: the whole row
