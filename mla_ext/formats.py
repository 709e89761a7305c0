"""MLA dimensions and the byte layouts of the cache formats: V2/V3/V3.2 (DESIGN.md §2), then V4.

=============  ============================  ==============================================
name           cache tensor                  one token's row
=============  ============================  ==============================================
``auto``       bf16/fp16 ``[nb, bs, 576]``   ``kv_c`` (512) then ``k_pe`` (64)
``fp8``        uint8 or float8_e4m3fn        every element ``sat_e4m3(x / scale)``, one fp32
``fp8_e4m3``   ``[nb, bs, 576]``             per-tensor ``scale`` (a device tensor)
``fp8_ds_mla`` uint8 ``[nb, bs, 656]``       bytes 0-511 e4m3 of ``kv_c``; 512-527 four fp32
                                             tile scales (tile i = elements 128i..128i+127);
                                             528-655 ``k_pe`` as 64 bf16, not quantised
=============  ============================  ==============================================

DeepSeek-V4 (the ops: mla_ext.v4)
---------------------------------

V4 heads are 512 wide: 448 NoPE dims then 64 RoPE dims, and one cache row holds the same 512
(``kv [T, 512]``). Attention scores use all 512 dims and the value is the whole 512-wide row, RoPE
part included. The formats take the strings vLLM's V4 backend uses, ``auto`` and ``fp8_ds_mla``;
the cache's row width (and q's head dim) tells the V4 layouts from V3's.

=============  ==================================  ===========================================
name           cache tensor                        one token
=============  ==================================  ===========================================
``auto``       bf16/fp16 ``[nb, bs, 512]``         the row as given (448 NoPE, 64 RoPE)
``fp8_ds_mla`` uint8 ``[nb, bs, 584]``, pages      584 bytes, split in two parts of the page:
               padded to a multiple of 576 bytes   a 576-byte data part and an 8-byte scale part
=============  ==================================  ===========================================

An ``fp8_ds_mla`` V4 page (block) of ``bs`` tokens, byte offsets from the page's start:

==================================  =====================================================
bytes                               content
==================================  =====================================================
``576 t + 0 .. 576 t + 447``        token t's NoPE dims 0..447 as e4m3, ``sat_e4m3(x / s_i)``
                                    for dim ``d`` in tile ``i = d // 64``
``576 t + 448 .. 576 t + 575``      token t's RoPE dims 448..511 as 64 bf16 (little-endian),
                                    not quantised
``576 bs + 8 t + i``, i = 0..6      token t's tile scale ``s_i`` as UE8M0: byte ``127 + e`` for
                                    ``s_i = 2^e`` (0xFF = NaN)
``576 bs + 8 t + 7``                pad byte, written 0, never read
``584 bs .. page_bytes - 1``        page padding (``page_bytes = ceil(584 bs / 576) * 576``),
                                    never written or read
==================================  =====================================================

Tile scales are powers of two, ``s_i = 2^ceil(log2(max(amax_i / 448, 1e-4)))`` with ``amax_i``
the largest ``|x|`` of the tile's 64 dims (the rule V3's fp8_ds_mla writers use, there per 128
dims); a tile holding inf or NaN gets ``s_i`` = NaN (byte 0xFF) and 64 e4m3 NaN bytes (0x7F), so
it reads back as NaN. A reader computes ``e4m3 * 2^e``, exact in bf16 and in fp32 for every scale
a writer makes, short of overflow: a dim of magnitude ``>= 1.9375 * 2^127`` (the top 3% of bf16's
range) rounds to ``256 * 2^120`` and reads back as inf.

As a tensor the page is ``[bs, 584]`` with strides ``(584, 1)``: that view gives only its byte
count; token t's bytes are the two runs above, not row t. The page stride (the cache's
``stride(0)``) must be a multiple of 576 bytes and at least ``584 bs``: a kernel may address the
whole cache as rows of 576 bytes (e.g. with one tensor map), which needs every page to start on
such a row. :func:`empty_kv_cache_v4` allocates that; :func:`v4_token_offsets` gives the offsets.
"""

from __future__ import annotations

import torch

KV_LORA_RANK = 512  # L: width of kv_c, and of the attention output in latent space
ROPE_DIM = 64  # R: width of k_pe / q_pe
LATENT_DIM = KV_LORA_RANK + ROPE_DIM  # 576: one cache row, one latent query

DS_MLA_TILE = 128
DS_MLA_NUM_TILES = KV_LORA_RANK // DS_MLA_TILE  # 4
DS_MLA_SCALE_OFFSET = KV_LORA_RANK  # 512
DS_MLA_ROPE_OFFSET = DS_MLA_SCALE_OFFSET + 4 * DS_MLA_NUM_TILES  # 528
DS_MLA_ROW_BYTES = DS_MLA_ROPE_OFFSET + 2 * ROPE_DIM  # 656

FP8_E4M3_MAX = 448.0

CACHE_FORMATS = ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla")


def canonical_format(kv_cache_dtype: str) -> str:
    """'auto' | 'fp8' | 'fp8_ds_mla' ('fp8_e4m3' is an alias of 'fp8')."""
    if kv_cache_dtype not in CACHE_FORMATS:
        raise ValueError(f"kv_cache_dtype must be one of {CACHE_FORMATS}, got {kv_cache_dtype!r}")
    return "fp8" if kv_cache_dtype == "fp8_e4m3" else kv_cache_dtype


def row_width(kv_cache_dtype: str) -> int:
    """Last dim of the cache tensor: 576 elements, or 656 bytes for fp8_ds_mla."""
    return DS_MLA_ROW_BYTES if canonical_format(kv_cache_dtype) == "fp8_ds_mla" else LATENT_DIM


def cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype = torch.bfloat16) -> torch.dtype:
    """The dtype of a cache tensor in this format (uint8 for both fp8 formats)."""
    return model_dtype if canonical_format(kv_cache_dtype) == "auto" else torch.uint8


def empty_kv_cache(
    num_blocks: int,
    block_size: int,
    kv_cache_dtype: str = "auto",
    model_dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Allocate an (uninitialised) paged cache ``[num_blocks, block_size, row]``."""
    return torch.empty(
        num_blocks,
        block_size,
        row_width(kv_cache_dtype),
        dtype=cache_torch_dtype(kv_cache_dtype, model_dtype),
        device=device,
    )


# --------------------------------------------------------------------------------------------
# DeepSeek-V4 (see the module docstring; the ops are in mla_ext/v4.py)
# --------------------------------------------------------------------------------------------
# Format strings: V4 layers take the same kv_cache_dtype strings as V3 ('auto', 'fp8_ds_mla'),
# as vLLM's --kv-cache-dtype does for both models; what differs is the head dim (q [..., 512] and
# kv [T, 512] against V3's 576), and with it the cache's row (512 elements or 584 bytes against
# V3's 576 or 656). So one string per format and no model switch: the shapes say which layout
# a cache holds, and a V3 cache handed to a V4 function (or the reverse) is refused by its width.

V4_HEAD_DIM = 512  # q, k and v width of a V4 head; one cache row
V4_NOPE_DIM = 448  # the NoPE dims 0..447, quantised in fp8_ds_mla
V4_ROPE_DIM = ROPE_DIM  # the RoPE dims 448..511, kept bf16
V4_TILE = 64  # NoPE dims per UE8M0 scale
V4_NUM_TILES = V4_NOPE_DIM // V4_TILE  # 7
V4_ROPE_OFFSET = V4_NOPE_DIM  # 448: byte offset of the bf16 RoPE dims in a token's data part
V4_DATA_BYTES = V4_NOPE_DIM + 2 * V4_ROPE_DIM  # 576: a token's data part
V4_SCALE_BYTES = 8  # a token's scale part: 7 UE8M0 scales and one pad byte
V4_TOKEN_BYTES = V4_DATA_BYTES + V4_SCALE_BYTES  # 584: the cache tensor's last dim
V4_PAGE_ALIGN = 576  # page strides are multiples of this many bytes
UE8M0_BIAS = 127  # UE8M0 byte b is 2^(b - 127); 0xFF is NaN
UE8M0_NAN = 0xFF
E4M3_NAN = 0x7F  # the e4m3 bytes of a tile whose scale is NaN

V4_CACHE_FORMATS = ("auto", "fp8_ds_mla")


def canonical_format_v4(kv_cache_dtype: str) -> str:
    """'auto' | 'fp8_ds_mla': the V4 cache formats (V4 has no per-tensor fp8 format)."""
    if kv_cache_dtype not in V4_CACHE_FORMATS:
        raise ValueError(f"kv_cache_dtype must be one of {V4_CACHE_FORMATS} for DeepSeek-V4, got {kv_cache_dtype!r}")
    return kv_cache_dtype


def v4_row_width(kv_cache_dtype: str) -> int:
    """Last dim of a V4 cache tensor: 512 elements (auto) or 584 bytes (fp8_ds_mla)."""
    return V4_TOKEN_BYTES if canonical_format_v4(kv_cache_dtype) == "fp8_ds_mla" else V4_HEAD_DIM


def v4_page_bytes(block_size: int) -> int:
    """Bytes of one fp8_ds_mla V4 page of ``block_size`` tokens: ``584 * block_size`` rounded up to
    a multiple of 576 (256 tokens: 149760; 64: 37440; 2: 1728)."""
    return -(-V4_TOKEN_BYTES * block_size // V4_PAGE_ALIGN) * V4_PAGE_ALIGN


def v4_token_offsets(block_size: int, offset: int) -> tuple[int, int]:
    """Byte offsets, from its page's start, of token ``offset``'s data part (576 bytes: 448 e4m3
    NoPE then 64 bf16 RoPE) and scale part (8 bytes: 7 UE8M0 scales then a pad byte) in an
    fp8_ds_mla V4 page of ``block_size`` tokens."""
    if not 0 <= offset < block_size:
        raise ValueError(f"offset must be in [0, block_size = {block_size}), got {offset}")
    return V4_DATA_BYTES * offset, V4_DATA_BYTES * block_size + V4_SCALE_BYTES * offset


def v4_page_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two parts of every page of an fp8_ds_mla V4 cache ``uint8 [nb, bs, 584]`` (page stride
    ``kv_cache.stride(0)``, tokens 584 bytes apart): views ``data [nb, bs, 576]`` (row t = token
    t's e4m3 NoPE and bf16 RoPE) and ``scales [nb, bs, 8]`` (row t = token t's 7 UE8M0 scales and
    its pad byte) of the same memory; writing them writes the cache."""
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    pages = kv_cache.as_strided((num_blocks, block_size * V4_TOKEN_BYTES), (kv_cache.stride(0), 1))
    data = pages[:, : block_size * V4_DATA_BYTES].view(num_blocks, block_size, V4_DATA_BYTES)
    scales = pages[:, block_size * V4_DATA_BYTES:].view(num_blocks, block_size, V4_SCALE_BYTES)
    return data, scales


def empty_kv_cache_v4(
    num_blocks: int,
    block_size: int,
    kv_cache_dtype: str = "auto",
    model_dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Allocate an (uninitialised) DeepSeek-V4 paged cache: ``auto``: ``[num_blocks, block_size,
    512]`` in ``model_dtype``; ``fp8_ds_mla``: uint8 ``[num_blocks, block_size, 584]`` whose pages
    are :func:`v4_page_bytes` apart (a view into ``num_blocks * v4_page_bytes(block_size)`` bytes)."""
    if canonical_format_v4(kv_cache_dtype) == "auto":
        return torch.empty(num_blocks, block_size, V4_HEAD_DIM, dtype=model_dtype, device=device)
    storage = torch.empty(num_blocks, v4_page_bytes(block_size), dtype=torch.uint8, device=device)
    return storage[:, : block_size * V4_TOKEN_BYTES].view(num_blocks, block_size, V4_TOKEN_BYTES)
