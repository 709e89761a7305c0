"""GPU tests of the sparse top-k decode and the index builders against the reference, and which
kernel each kind of input reaches (csrc/sparse/sparse_decode.cu).

Kernels on an H200, by head tile (16 for h_q <= 16, 32 up to 32 but 16 for fp8_ds_mla on sm90, else
64) and format. sm90, not
forced portable: fp8_ds_mla 64-head tiles the three-warpgroup wgmma kernel (sm90/sparse_decode_sm90_fp8.cu;
two head tiles as a 2-CTA cluster), 16-head tiles (and 17-32 heads, as two 16-head tiles) the e4m3-fragment
kernel with bulk row copies from 4 copy warps. Forced portable (what sm100 runs), and every bf16
cache and 32-head tile: the portable kernels (fp8_ds_mla 16 heads: e4m3 fragments, cp.async gathers
by 4 copy warps; 64 heads: V read from the staging rows). The other portable configurations (the
dequantising fp8_ds_mla 16-head kernel, one-stage pipelines, gathers by the compute warps) are
fallbacks for GPUs with less shared memory per block than an H200 has: no input reaches them on an
H200, so no test runs them there.

The top-k list is split over several CTAs (partials + the split combine) when the batch's
b * s_q * ceil(h_q / tile) CTAs leave SMs idle: small batches split every list, large ones none
("split" and "whole" below), and with 64-head tiles a batch whose last requests' CTAs would make a
last, mostly idle wave splits those requests' lists only ("tail")."""

from __future__ import annotations

import math

import pytest
import torch

import mla_ext
from bad_inputs import SPARSE_CASES, sparse_args
from conftest import CACHE_FORMAT, assert_close, is_sm90, kernel_is, launched_kernels, use_path
from mla_ext import _library as mla_library
from mla_ext import reference
from mla_ext.formats import DS_MLA_ROPE_OFFSET, DS_MLA_SCALE_OFFSET
from sparse_cases import SOFTMAX_SCALE, batch_kind, batch_size, make_cache, make_indices, num_splits

pytestmark = pytest.mark.gpu
FORMATS = ["fp8_ds_mla", "auto"]
BATCHES = ["split", "whole"]
BATCHES_64 = ["split", "whole", "tail"]  # 64-head tiles: also the last requests' lists split


def _check(q, cache, idx, fmt, topk_length=None, sink=None, batch=None):
    """Against the reference; with ``batch`` ("split" / "whole" / "tail") also whether the split
    combine ran."""
    call = lambda: mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt, topk_length, sink)  # noqa: E731
    if batch is None:
        out, lse = call()
    else:
        (out, lse), combine = launched_kernels(call, "split_combine_kernel")
        _assert_split_path(q, idx, fmt, batch, combine)
    _compare(q, cache, idx, fmt, topk_length, sink, out, lse)
    return out, lse


def _assert_split_path(q, idx, fmt, batch, combine_kernels):
    b, s_q, h_q = q.shape[:3]
    assert batch_kind(b, s_q, h_q, idx.shape[-1], fmt) == batch, "the case does not test its batch"
    assert bool(combine_kernels) == (batch != "whole"), combine_kernels


def _compare(q, cache, idx, fmt, topk_length, sink, out, lse):
    assert out.dtype == torch.bfloat16 and out.shape == q.shape[:3] + (512,)
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.is_contiguous()
    # Against the fp32 spec, both formats. bf16 rows: the kernel rounds P to bf16 and out to bf16.
    # fp8_ds_mla, portable kernels: e4m3 values are exact in the kernel's fp16 operands and the fp32
    # tile scales (any finite value) multiply fp32 partial scores and P (P' = P scale / R, fp16), so
    # no bf16 rounding of the rows happens and the same tolerances hold.
    ref_out, ref_lse = _reference(q, cache, idx, SOFTMAX_SCALE, fmt, topk_length, sink)
    assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2, name="out vs fp32 spec")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=1e-4, name="lse vs fp32 spec")
    if _bf16_operands(fmt, q.shape[2]):
        # and the spec on the cache's own values, within what rounding K to bf16 moves (these caches'
        # non-power-of-two scales: up to ~1e-5 cosine and 0.013 in out, 0.007 in lse, on the CPU spec)
        spec_out, spec_lse = reference.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt, topk_length, sink)
        assert_close(out, spec_out, cos_tol=5e-5, atol=5e-2, rtol=2e-2, name="out vs fp32 spec, unrounded rows")
        assert_close(lse, spec_lse, cos_tol=1e-5, atol=2e-2, rtol=1e-4, name="lse vs fp32 spec, unrounded rows")


def _bf16_operands(fmt: str, h_q: int) -> bool:
    """Whether this fp8_ds_mla call runs the sm90 64-head kernel, whose MMA operands are bf16: e4m3 x
    the tile scale in fp32, rounded to bf16 (as FlashMLA's kernel does; exact for the power-of-two
    scales writers make, which these tests' caches do not all have)."""
    return fmt == "fp8_ds_mla" and is_sm90() and not mla_library.force_portable() and h_q > 32


def _reference(q, cache, idx, softmax_scale, fmt, topk_length=None, sink=None):
    """The fp32 spec on the values the kernel's operands hold: the cache's, or for the sm90 64-head
    fp8_ds_mla kernel the dequantised rows rounded to bf16 (as a bf16 cache)."""
    if _bf16_operands(fmt, q.shape[2]):
        rows = reference.dequantize_cache(cache, fmt).bfloat16()
        return reference.sparse_decode_mla(q, rows, idx, softmax_scale, "auto", topk_length, sink)
    return reference.sparse_decode_mla(q, cache, idx, softmax_scale, fmt, topk_length, sink)


def _case(b, s_q, h_q, topk, block_size, fmt, pad_pages=False):
    num_blocks = max(2, (b * 400) // block_size)
    cache, good, poisoned = make_cache(num_blocks, block_size, fmt, "cuda", pad_pages=pad_pages)
    idx = make_indices(b, s_q, topk, good, num_blocks * block_size)
    q = torch.randn(b, s_q, h_q, 576, dtype=torch.bfloat16, device="cuda")
    return q, cache, idx, poisoned


def _topk_length(b, topk):
    """Random lengths with the full list in request 0, nothing in request 1 (when b > 1) and one cut
    inside a tile in request 2 (when b > 2)."""
    tl = torch.randint(1, topk + 1, (b,), dtype=torch.int32, device="cuda")
    tl[0] = topk
    if b > 1:
        tl[1] = 0
    if b > 2:
        tl[2] = min(topk, 131)
    return tl


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("h_q", [1, 16, 64, 128])
@pytest.mark.parametrize("topk", [1, 100, 2048])
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("block_size", [1, 64, 61])
def test_decode_matches_reference(fmt, h_q, topk, s_q, block_size):
    q, cache, idx, _ = _case(2, s_q, h_q, topk, block_size, fmt, pad_pages=block_size == 61)
    _check(q, cache, idx, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("h_q", [20, 128, 16, 36])
@pytest.mark.parametrize("batch", BATCHES)
def test_split_paths_and_odd_heads(fmt, h_q, batch):
    """One CTA per query token and head tile (no combine) for a large batch, the top-k list split
    (partials + combine) for a small one; head counts that leave rows of the tile unused."""
    b = batch_size(batch, 1, h_q, split_b=3, fmt=fmt)
    q, cache, idx, _ = _case(b, 1, h_q, 300, 64, fmt)
    _check(q, cache, idx, fmt, batch=batch)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("batch", BATCHES)
def test_all_invalid(fmt, batch):
    b = batch_size(batch, 2, 16, split_b=3)
    q, cache, idx, poisoned = _case(b, 2, 16, 200, 64, fmt)
    num_slots = cache.shape[0] * cache.shape[1]
    idx[1] = -1
    idx[2, 0] = num_slots + torch.arange(200, device="cuda", dtype=torch.int32)
    out, lse = _check(q, cache, idx, fmt, batch=batch)
    assert (out[1] == 0).all() and (out[2, 0] == 0).all()
    assert (lse[1] == -math.inf).all() and (lse[2, :, 0] == -math.inf).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("batch", BATCHES)
def test_topk_length_and_sink(fmt, batch):
    b, topk, h_q = batch_size(batch, 2, 16, split_b=4), 2048, 16
    q, cache, idx, poisoned = _case(b, 2, h_q, topk, 64, fmt)
    topk_length = torch.randint(0, topk + 1, (b,), dtype=torch.int32, device="cuda")
    topk_length[:4] = torch.tensor([2048, 1000, 0, 65], dtype=torch.int32, device="cuda")
    # Entries past topk_length point at NaN rows: they must not be read.
    for i in range(b):
        n = int(topk_length[i])
        fill = poisoned[torch.randint(poisoned.numel(), (2, topk - n), device="cuda")]
        idx[i, :, n:] = fill.to(torch.int32)
    sink = torch.randn(h_q, device="cuda")
    sink[3] = math.inf
    sink[5] = -math.inf
    out, lse = _check(q, cache, idx, fmt, topk_length, sink, batch=batch)
    assert (out[:, :, 3] == 0).all()
    assert (out[2] == 0).all() and (lse[2] == -math.inf).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", ["default", "portable"])
@pytest.mark.parametrize("h_q,s_q", [(64, 1), (128, 2), (100, 1)])
def test_tail_requests_split(fmt, path, h_q, s_q, request):
    """A batch one request larger than the SMs hold (64-head tiles): the last request's list is split
    (its partials merged by the combine into its rows of out and lse), the others run whole in the
    same grid. topk_length (the full list, 0, a cut inside a tile; the split request's cut short)
    and a sink with +-inf, which the whole CTAs apply themselves and the combine for the split ones."""
    use_path(request, path)
    topk = 2048
    b = batch_size("tail", s_q, h_q, fmt=fmt)
    q, cache, idx, poisoned = _case(b, s_q, h_q, topk, 64, fmt)
    tl = _topk_length(b, topk)
    tl[-1] = 1000
    for i in (1, 2, b - 1):  # entries past topk_length point at NaN rows: they must not be read
        n = int(tl[i])
        idx[i, :, n:] = poisoned[torch.randint(poisoned.numel(), (s_q, topk - n), device="cuda")].to(torch.int32)
    sink = torch.randn(h_q, device="cuda")
    sink[3], sink[h_q - 1] = math.inf, -math.inf
    out, lse = _check(q, cache, idx, fmt, tl, sink, batch="tail")
    assert (out[:, :, 3] == 0).all() and (out[1] == 0).all() and (lse[1] == -math.inf).all()


def test_h16_reads_same_rows_as_h64():
    """Heads are independent: the first 16 heads of an h_q=64 call equal an h_q=16 call."""
    q, cache, idx, _ = _case(2, 1, 64, 512, 64, "fp8_ds_mla")
    out64, lse64 = mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "fp8_ds_mla")
    out16, lse16 = mla_ext.sparse_decode_mla(q[:, :, :16].contiguous(), cache, idx, SOFTMAX_SCALE, "fp8_ds_mla")
    assert_close(out16, out64[:, :, :16], cos_tol=1e-6, atol=1e-3, rtol=1e-2)
    assert_close(lse16, lse64[:, :16], cos_tol=1e-7, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("h_q", [16, "16-portable", 32, 64, "64-portable", 128, "128-portable"])
@pytest.mark.parametrize("q_exp", [-30, 0, 20])
@pytest.mark.parametrize("batch", BATCHES)
def test_fp8_ds_mla_scale_spread_and_q_magnitudes(h_q, q_exp, batch, request):
    """The fp8_ds_mla kernel keeps the fp32 tile scales out of its fp16 operands (scores: partial
    sums times the scale; values: P' = P scale / R with R the running max |scale| of the tile)
    and normalises each q row by a power of two into fp16. Stress both: scales spread over 2^16
    within every 128-wide tile (and between the tiles of one key), not powers of two, some
    negative; q rows 2^q_exp * 2^-6..2^0 (fp16 would underflow at 2^-30 and overflow at 2^20
    without the normalisation), one row all zero. softmax_scale * 2^-q_exp keeps the scores
    O(100), so the softmax is well conditioned and fp32 rounding of the scores cannot move the
    weights by more than ~0.5%. Compared row by row relative to the row's largest output (a row's
    output is dominated by its large-scale keys), with the tolerances of the bf16 cache. "-portable":
    the portable kernels forced (16 heads: cp.async gathers; 64-head tiles: mma.sync, V from the
    staging rows) where sm90 runs the bulk-copy and wgmma kernels. The sm90 64-head kernel's operands
    are e4m3 x scale rounded to bf16: compared with the spec on those rows (_reference)."""
    if isinstance(h_q, str):
        h_q = int(h_q.split("-")[0])
        use_path(request, "portable")
    s_q, topk, bs = 2, 700, 64
    b = batch_size(batch, s_q, h_q, fmt="fp8_ds_mla")
    num_blocks = max(30, b * 12)
    cache, good, _ = make_cache(num_blocks, bs, "fp8_ds_mla", "cuda", poison_frac=0.1)
    flat = cache.view(num_blocks * bs, -1)
    scales = flat[:, DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET].contiguous().view(torch.float32)
    spread = torch.pow(2.0, torch.randint(-8, 9, scales.shape, device="cuda").float())
    sign = torch.where(torch.rand(scales.shape, device="cuda") < 0.1, -1.0, 1.0)
    scales = torch.where(torch.isfinite(scales), scales * spread * sign, scales)  # poisoned slots stay NaN
    flat[:, DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET] = scales.contiguous().view(torch.uint8)
    idx = make_indices(b, s_q, topk, good, num_blocks * bs)
    row_exp = q_exp + torch.randint(-6, 1, (b, s_q, h_q, 1), device="cuda").float()
    q = (torch.randn(b, s_q, h_q, 576, device="cuda") * torch.pow(2.0, row_exp)).to(torch.bfloat16)
    q[0, 0, h_q // 2] = 0
    softmax_scale = SOFTMAX_SCALE * 2.0**-q_exp
    assert (num_splits(b, s_q, h_q, topk, "fp8_ds_mla") > 1) == (batch == "split")
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, softmax_scale, "fp8_ds_mla")
    ref_out, ref_lse = _reference(q, cache, idx, softmax_scale, "fp8_ds_mla")
    row_max = ref_out.float().abs().amax(-1, keepdim=True).clamp(min=1e-30)
    assert_close(out.float() / row_max, ref_out.float() / row_max, cos_tol=1e-5, atol=5e-3, rtol=1e-2,
                 name="out / row max")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=3e-5, name="lse")


def test_strided_q():
    q, cache, idx, _ = _case(2, 2, 16, 100, 64, "auto")
    big = torch.randn(2, 2, 16, 640, dtype=torch.bfloat16, device="cuda")
    big[..., :576] = q
    _check(big[..., :576], cache, idx, "auto")


def test_index_builders_gpu():
    table = torch.randperm(400, device="cuda", dtype=torch.int32)[:300].view(6, 50)
    table[2, 20:] = -1
    local = torch.randint(-3, 50 * 16 + 40, (6, 2, 2048), dtype=torch.int32, device="cuda")
    slots = mla_ext.sparse_indices_to_slots(local, table, 16)
    assert torch.equal(slots, reference.sparse_indices_to_slots(local, table, 16))
    positions = torch.randint(-2, 3000, (37,), device="cuda")
    req = torch.randint(0, 6, (37,), dtype=torch.int32, device="cuda")
    indices = torch.full((37, 768), 7, dtype=torch.int32, device="cuda")
    lengths = torch.full((37,), 7, dtype=torch.int32, device="cuda")
    mla_ext.sparse_compressed_indices(positions, req, table, 16, 4, 20, indices, lengths)
    ref_i, ref_l = reference.sparse_compressed_indices(positions, req, table, 16, 4, 20, 768)
    assert torch.equal(indices, ref_i) and torch.equal(lengths, ref_l)


def test_opcheck_gpu():
    q, cache, idx, _ = _case(2, 2, 16, 100, 64, "fp8_ds_mla")
    tl = torch.tensor([100, 7], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.mla_ext.sparse_decode_mla,
                          (q, cache, idx, SOFTMAX_SCALE, "fp8_ds_mla", tl, torch.randn(16, device="cuda")))
    table = torch.randperm(40, device="cuda", dtype=torch.int32).view(2, 20)
    local = torch.randint(-1, 300, (2, 2, 64), dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.mla_ext.sparse_indices_to_slots, (local, table, 16, torch.empty_like(local)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_graph_capture_replay(fmt):
    """One decode step (local top-k -> slots -> sparse decode) captured, then replayed on new
    index data: the plan depends on shapes only."""
    b, s_q, h_q, topk, bs = 3, 2, 32, 256, 64
    num_blocks = 40
    cache, good, _ = make_cache(num_blocks, bs, fmt, "cuda", poison_frac=0.0)
    table = torch.randperm(num_blocks, device="cuda", dtype=torch.int32)[: b * 12].view(b, 12)
    local = torch.randint(-1, 12 * bs, (b, s_q, topk), dtype=torch.int32, device="cuda")
    q = torch.randn(b, s_q, h_q, 576, dtype=torch.bfloat16, device="cuda")
    slots = torch.empty_like(local)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (allocator, function attributes) outside the graph
        mla_ext.sparse_indices_to_slots(local, table, bs, out=slots)
        mla_ext.sparse_decode_mla(q, cache, slots, SOFTMAX_SCALE, fmt)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mla_ext.sparse_indices_to_slots(local, table, bs, out=slots)
        out, lse = mla_ext.sparse_decode_mla(q, cache, slots, SOFTMAX_SCALE, fmt)
    for _ in range(2):
        local.copy_(torch.randint(-1, 12 * bs, local.shape, dtype=torch.int32, device="cuda"))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        want_slots = reference.sparse_indices_to_slots(local, table, bs)
        assert torch.equal(slots, want_slots)
        ref_out, ref_lse = _reference(q, cache, want_slots, SOFTMAX_SCALE, fmt)
        assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2)
        assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=1e-4)


@pytest.mark.parametrize("fmt", FORMATS)
def test_small_for_sanitizer(fmt):
    """Small, fast case with every kind of invalid entry, for compute-sanitizer (-k small)."""
    q, cache, idx, _ = _case(2, 2, 20, 130, 61, fmt, pad_pages=True)
    tl = torch.tensor([130, 70], dtype=torch.int32, device="cuda")
    _check(q, cache, idx, fmt, tl, torch.randn(20, device="cuda"))


@pytest.mark.parametrize("path", ["default", "portable"])
@pytest.mark.parametrize("h_q", [1, 16, 27])
@pytest.mark.parametrize("batch", BATCHES)
def test_small_fp8_16_head_kernels(path, h_q, batch, request):
    """The fp8_ds_mla kernels for 16-head tiles: MMA fragments read from the e4m3 staging rows,
    gathered by 4 copy warps (sm90: one bulk copy per row; "portable": 16-byte cp.async). Every
    kind of invalid entry, topk_length, attn_sink, page padding, split and whole lists; small
    enough for compute-sanitizer. h_q 27: two 16-head tiles on sm90 (the second 11 heads wide),
    the 32-head kernel forced portable."""
    use_path(request, path)
    b = batch_size(batch, 2, h_q, fmt="fp8_ds_mla")
    assert (num_splits(b, 2, h_q, 333, "fp8_ds_mla") > 1) == (batch == "split")
    q, cache, idx, _ = _case(b, 2, h_q, 333, 61, "fp8_ds_mla", pad_pages=True)
    _check(q, cache, idx, "fp8_ds_mla", _topk_length(b, 333), torch.randn(h_q, device="cuda"))


@pytest.mark.parametrize("path", ["default", "portable"])
def test_small_fp8_16_head_long_list(path, request):
    """One CTA per query token over 11-13 tiles (topk 801, a batch too large to split): every staging
    buffer is refilled at least twice, so the copy warps' release barriers and both mbarrier parities
    are used more than once; small enough for compute-sanitizer."""
    use_path(request, path)
    b = batch_size("whole", 1, 16)
    assert num_splits(b, 1, 16, 801) == 1
    q, cache, idx, _ = _case(b, 1, 16, 801, 61, "fp8_ds_mla", pad_pages=True)
    tl = torch.randint(700, 802, (b,), dtype=torch.int32, device="cuda")
    _check(q, cache, idx, "fp8_ds_mla", tl, torch.randn(16, device="cuda"))


@pytest.mark.parametrize("path", ["default", "portable"])
@pytest.mark.parametrize("h_q", [64, 128, 40])
@pytest.mark.parametrize("batch", BATCHES_64)
def test_small_fp8_64_head_kernels(path, h_q, batch, request):
    """fp8_ds_mla 64-head tiles: on sm90 the wgmma kernel (csrc/sparse/sm90/sparse_decode_sm90_fp8.cu),
    forced portable the mma.sync one that reads V from the staging rows. Fresh random data, NaN in
    unused slots and page padding, odd topk, -1 / out-of-range / duplicate indices, topk_length (one
    row cut inside a tile, one at 0), attn_sink with +-inf; h_q 40 leaves 24 rows of the tile
    unused; split lists, whole ones (a batch that fills the GPU) and the last request's split (a
    batch one request larger than the SMs hold: whole and split CTAs in one grid)."""
    use_path(request, path)
    b = batch_size(batch, 2, h_q, split_b=3 if h_q == 40 else 2)
    assert batch_kind(b, 2, h_q, 333) == batch
    q, cache, idx, _ = _case(b, 2, h_q, 333, 61, "fp8_ds_mla", pad_pages=True)
    tl = _topk_length(b, 333)
    tl[-1] = 0
    sink = torch.randn(h_q, device="cuda")
    sink[1], sink[h_q - 1] = math.inf, -math.inf
    out, lse = _check(q, cache, idx, "fp8_ds_mla", tl, sink)
    assert (out[-1] == 0).all() and (lse[-1] == -math.inf).all() and (out[:, :, 1] == 0).all()


@pytest.mark.parametrize("h_q,batch", [(16, "split"), (16, "whole"), (64, "split"), (64, "whole"), (64, "tail")])
def test_small_bf16_kernels(h_q, batch):
    """The bf16-cache kernels for 16- and 64-head tiles (2-stage pipelines, 8 threads per gathered
    row; the same on every path), with every kind of invalid entry and padded pages; small enough for
    compute-sanitizer. (32-head tiles: test_small_for_sanitizer.)"""
    b = batch_size(batch, 2, h_q)
    assert batch_kind(b, 2, h_q, 333) == batch
    q, cache, idx, _ = _case(b, 2, h_q, 333, 61, "auto", pad_pages=True)
    _check(q, cache, idx, "auto", _topk_length(b, 333), torch.randn(h_q, device="cuda"))


@pytest.mark.parametrize("path", ["default", "portable"])
@pytest.mark.parametrize("fmt,h_q", [("fp8_ds_mla", 16), ("fp8_ds_mla", 64), ("fp8_ds_mla", 128), ("auto", 16),
                                     ("auto", 64)])
@pytest.mark.parametrize("batch", BATCHES)
def test_small_nan_row_propagates(path, fmt, h_q, batch, request):
    """A counted entry on a NaN row makes its query's out and lse NaN, as the spec says, on every
    kernel and through the split combine, also when it is the only valid entry of its list (every
    other split empty); the other queries are unaffected."""
    use_path(request, path)
    b = batch_size(batch, 1, h_q)
    q, cache, idx, poisoned = _case(b, 1, h_q, 333, 64, fmt)
    idx[0, 0, 5] = poisoned[0]  # one NaN row among valid ones
    idx[1, 0, :] = -1
    idx[1, 0, 200] = poisoned[1]  # the only valid entry
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt)
    assert torch.isnan(out[:2]).all() and torch.isnan(lse[:2]).all()
    _compare(q, cache, idx, fmt, None, None, out, lse)


def _portable_config(tile, fmt, stages, e4m3_frags=False, row_threads=8, bulk_rows=False, copy_warps=0, pv_raw=False):
    """csrc/sparse/portable/sparse_decode_portable.cuh's PortableConfig, as the kernel's name shows it."""
    return "PortableConfig", (tile, CACHE_FORMAT[fmt], stages, e4m3_frags, row_threads, bulk_rows, copy_warps, pv_raw)


_SM90_FP8 = ("sparse_decode_sm90_fp8_kernel", None)
_SM90_FP8_PAIR = ("sparse_decode_sm90_fp8_pair_kernel", None)  # two head tiles: a 2-CTA cluster
_M16_BULK = _portable_config(16, "fp8_ds_mla", 4, True, 8, True, 4)
_M16_FRAGS = _portable_config(16, "fp8_ds_mla", 4, True, 16, False, 4)
_M64_PV_RAW = _portable_config(64, "fp8_ds_mla", 2, False, 16, False, 0, True)
# (format, h_q) -> (kernel on sm90 unforced, kernel forced portable)
SPARSE_KERNELS = {
    ("fp8_ds_mla", 1): (_M16_BULK, _M16_FRAGS),
    ("fp8_ds_mla", 16): (_M16_BULK, _M16_FRAGS),
    ("fp8_ds_mla", 20): (_M16_BULK, _portable_config(32, "fp8_ds_mla", 2)),  # sm90: two 16-head tiles
    ("fp8_ds_mla", 32): (_M16_BULK, _portable_config(32, "fp8_ds_mla", 2)),
    ("fp8_ds_mla", 40): (_SM90_FP8, _M64_PV_RAW),
    ("fp8_ds_mla", 64): (_SM90_FP8, _M64_PV_RAW),
    ("fp8_ds_mla", 128): (_SM90_FP8_PAIR, _M64_PV_RAW),
    ("auto", 1): (_portable_config(16, "auto", 2),) * 2,
    ("auto", 16): (_portable_config(16, "auto", 2),) * 2,
    ("auto", 32): (_portable_config(32, "auto", 2),) * 2,
    ("auto", 36): (_portable_config(64, "auto", 2),) * 2,
    ("auto", 128): (_portable_config(64, "auto", 2),) * 2,
}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("path", ["arch", "portable"])
@pytest.mark.parametrize("fmt,h_q", SPARSE_KERNELS.keys(), ids=[f"{f}_h{h}" for f, h in SPARSE_KERNELS])
def test_sparse_dispatch(fmt, h_q, path, batch, request):
    """Each head count and format runs the kernel sparse_decode.cu names for it (on sm90 unforced and
    forced portable), the split combine exactly when the batch is small enough to split, and
    matches the reference (topk_length, attn_sink, padded pages of 61 rows)."""
    if torch.cuda.get_device_properties(0).shared_memory_per_block_optin < 232320:
        pytest.skip("the expected kernels are those of GPUs with an H200's shared memory per block")
    use_path(request, path)
    b = batch_size(batch, 2, h_q, fmt=fmt)
    q, cache, idx, _ = _case(b, 2, h_q, 333, 61, fmt, pad_pages=True)
    tl, sink = _topk_length(b, 333), torch.randn(h_q, device="cuda")
    call = lambda: mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt, tl, sink)  # noqa: E731
    (out, lse), names = launched_kernels(call, "")
    decode = [n for n in names if "sparse_decode" in n]
    want = SPARSE_KERNELS[fmt, h_q][0 if path == "arch" and is_sm90() else 1]
    assert len(decode) == 1 and kernel_is(decode[0], *want), (names, want)
    _assert_split_path(q, idx, fmt, batch, [n for n in names if "split_combine_kernel" in n])
    _compare(q, cache, idx, fmt, tl, sink, out, lse)


@pytest.mark.parametrize("path", ["default", "portable"])
@pytest.mark.parametrize("h_q", [16, 64, 128])
def test_fp8_rising_scores(path, h_q, request):
    """Scores that rise along the top-k list (rows c_k u + noise, q ~ u, indices in order), by ~2
    (log2 units) per 64-key tile and once by ~28: the running maximum moves on every tile (O is
    rescaled every tile), and the tile scales grow with c_k (the scale reference R moves too). A
    batch of such queries large enough that each list runs whole in one CTA."""
    use_path(request, path)
    topk, bs = 2048, 64
    u = torch.randn(576, device="cuda")
    c = torch.linspace(0.2, 3.0, topk, device="cuda")
    c[1500:] *= 1.6
    kv = (c[:, None] * u[None, :] + 0.05 * torch.randn(topk, 576, device="cuda")).to(torch.bfloat16)
    rows = reference.quantize_cache_rows(kv[:, :512], kv[:, 512:], "fp8_ds_mla")
    cache = rows.view(topk // bs, bs, -1).contiguous()
    b = batch_size("whole", 1, h_q)
    q = (u + 0.3 * torch.randn(b, 1, h_q, 576, device="cuda")).to(torch.bfloat16)
    idx = torch.arange(topk, dtype=torch.int32, device="cuda").view(1, 1, topk).expand(b, 1, topk).contiguous()
    assert num_splits(b, 1, h_q, topk) == 1
    scale = 40.0 / (576 * float((u * u).mean()) * 3.0)  # scores span ~0..65 (natural log units)
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, scale, "fp8_ds_mla")
    ref_out, ref_lse = reference.sparse_decode_mla(q, cache, idx, scale, "fp8_ds_mla")
    assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2, name="out vs fp32 spec")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=1e-4, name="lse vs fp32 spec")


@pytest.mark.parametrize("path", ["default", "portable"])
@pytest.mark.parametrize("h_q", [16, 128])
@pytest.mark.parametrize("batch", BATCHES)
def test_fp8_huge_scores(path, h_q, batch, request):
    """Scores around 2^27 (softmax_scale 2^22), where an fp32 ulp is 16: every P must stay within
    fp16 (every kernel scales the scores before taking the max, so the max key's P is exactly 1; the
    lazy max of the portable 64-head kernel compares the difference of the tile max and the running
    max with its slack), and the nearly one-hot softmax must pick each row's largest score as the
    fp32 spec does (duplicate indices included: the spec normalises by the sum of exp(s - max))."""
    use_path(request, path)
    b = batch_size(batch, 1, h_q)
    q, cache, idx, _ = _case(b, 1, h_q, 700, 64, "fp8_ds_mla")
    assert (num_splits(b, 1, h_q, 700) > 1) == (batch == "split")
    scale = 2.0**22
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, scale, "fp8_ds_mla")
    ref_out, ref_lse = _reference(q, cache, idx, scale, "fp8_ds_mla")
    assert ref_lse.abs().amax() > 2.0**24, "scores are not in the range this test is about"
    assert torch.isfinite(out).all(), f"{int((~torch.isfinite(out)).sum())} non-finite outputs"
    assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2, name="out vs fp32 spec")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=0.0, rtol=1e-5, name="lse vs fp32 spec")


# ---- review fixes: padding tokens, int32 limits, empty caches, alignment, checked mode ----------


def test_index_builders_padding_and_int32_limits_gpu():
    """Kernel == reference for padding tokens (token_to_req -1 / past the table: length 0, row -1,
    the table row is not read) and for slots past int32 (-1, not a wrapped slot)."""
    last = (2**31 - 16) // 16  # its slots end exactly at INT32_MAX
    table = torch.randperm(400, device="cuda", dtype=torch.int32)[:300].view(6, 50)
    table[2, 20:] = -1
    table[3, :4] = torch.tensor([last, last + 1, 2**31 - 1, last - 1], dtype=torch.int32)
    local = torch.randint(-3, 50 * 16 + 40, (6, 2, 512), dtype=torch.int32, device="cuda")
    local[3, :, :64] = torch.arange(64, dtype=torch.int32, device="cuda")
    slots = mla_ext.sparse_indices_to_slots(local, table, 16)
    want = reference.sparse_indices_to_slots(local, table, 16)
    assert torch.equal(slots, want)
    assert want[3, 0, 15] == 2**31 - 1 and (want[3, 0, 16:48] == -1).all()
    positions = torch.randint(-2, 3000, (37,), device="cuda")
    positions[:4] = 400
    req = torch.randint(0, 6, (37,), dtype=torch.int32, device="cuda")
    req[:4] = torch.tensor([3, -1, 6, 2**31 - 1], dtype=torch.int32)
    req[30:] = -1  # padding among the prefill tokens too
    for table_rows in (table, table[:0]):
        indices = torch.full((37, 768), 7, dtype=torch.int32, device="cuda")
        lengths = torch.full((37,), 7, dtype=torch.int32, device="cuda")
        mla_ext.sparse_compressed_indices(positions, req, table_rows, 16, 4, 20, indices, lengths)
        ref_i, ref_l = reference.sparse_compressed_indices(positions, req, table_rows, 16, 4, 20, 768)
        assert torch.equal(indices, ref_i) and torch.equal(lengths, ref_l)
        assert (lengths[1:4] == 0).all() and (lengths[30:] == 0).all() and (indices[30:] == -1).all()


def test_int32_limits_raise_gpu():
    """block_size / compress_ratio past int32 and a topk past int32 - 64 are refused by the
    binding (direct torch.ops callers), with messages naming them."""
    local = torch.zeros(1, 1, 4, dtype=torch.int32, device="cuda")
    table = torch.zeros(1, 4, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match=r"block_size must be in \[1, 2147483647\], got 4294967296"):
        torch.ops.mla_ext.sparse_indices_to_slots(local, table, 2**32, torch.empty_like(local))
    args = (torch.zeros(2, dtype=torch.int64, device="cuda"), torch.zeros(2, dtype=torch.int32, device="cuda"), table)
    bufs = (torch.empty(2, 128, dtype=torch.int32, device="cuda"), torch.empty(2, dtype=torch.int32, device="cuda"))
    with pytest.raises(RuntimeError, match=r"block_size must be in \[1, 2147483647\], got 4294967296"):
        torch.ops.mla_ext.sparse_compressed_indices(*args, 2**32, 4, 2, *bufs)
    with pytest.raises(RuntimeError, match=r"compress_ratio must be in \[1, 2147483647\], got 4294967296"):
        torch.ops.mla_ext.sparse_compressed_indices(*args, 16, 2**32, 2, *bufs)
    q = torch.zeros(1, 1, 16, 576, dtype=torch.bfloat16, device="cuda")
    cache = torch.zeros(4, 16, 576, dtype=torch.bfloat16, device="cuda")
    huge = torch.empty(1, 1, 2**31 - 64, dtype=torch.int32, device="cuda")  # 8 GiB, never read
    with pytest.raises(RuntimeError, match=r"topk \(indices.shape\[2\]\) must be <= 2147483583, got 2147483584"):
        torch.ops.mla_ext.sparse_decode_mla(q, cache, huge, 0.1, "auto", None, None)
    del huge


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(4, 0), (0, 16)], ids=["block_size0", "blocks0"])
def test_empty_cache_gpu(fmt, shape):
    row, dtype = (656, torch.uint8) if fmt == "fp8_ds_mla" else (576, torch.bfloat16)
    cache = torch.empty(*shape, row, dtype=dtype, device="cuda")
    q = torch.randn(2, 2, 16, 576, dtype=torch.bfloat16, device="cuda")
    idx = torch.tensor([0, -1, 7, 2**31 - 1], dtype=torch.int32, device="cuda").repeat(2, 2, 1)
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt, attn_sink=torch.randn(16, device="cuda"))
    torch.cuda.synchronize()
    assert (out == 0).all() and (lse == -math.inf).all()


def test_misaligned_contiguous_q():
    """A contiguous q starting at element 1: .contiguous() would return it unchanged; the op itself
    copies it to an aligned buffer (the wrapper does nothing), and so do strided topk_length and
    attn_sink views."""
    q, cache, idx, _ = _case(2, 2, 16, 100, 64, "auto")
    flat = torch.empty(1 + q.numel(), dtype=torch.bfloat16, device="cuda")
    q_odd = flat[1:].view(q.shape)
    q_odd.copy_(q)
    assert q_odd.is_contiguous() and q_odd.data_ptr() % 16 != 0
    _check(q_odd, cache, idx, "auto")
    want = torch.ops.mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "auto", None, None)
    got = torch.ops.mla_ext.sparse_decode_mla(q_odd, cache, idx, SOFTMAX_SCALE, "auto", None, None)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    topk_length = torch.tensor([[60, 0], [100, 0]], dtype=torch.int32, device="cuda")[:, 0]
    sink = torch.randn(16, 2, device="cuda")[:, 1]
    assert not topk_length.is_contiguous() and not sink.is_contiguous()
    _check(q, cache, idx, "auto", topk_length, sink)


@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
def test_bad_input_gpu(case):
    """The binding refuses what the reference path refuses, with the same message (RuntimeError)."""
    change, message = SPARSE_CASES[case]
    args = sparse_args("cuda")
    args.update(change(args))
    with pytest.raises(RuntimeError, match=r"mla_ext\.sparse_decode_mla: .*" + message):
        mla_ext.sparse_decode_mla(**args)


def test_default_format_is_auto():
    """kv_cache_dtype defaults to 'auto' as in every op: a bf16 cache needs no format, a uint8
    fp8_ds_mla cache is refused with a message naming the format to pass."""
    q, cache, idx, _ = _case(2, 1, 16, 100, 64, "auto")
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE)
    want = mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "auto")
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    q, cache, idx, _ = _case(2, 1, 16, 100, 64, "fp8_ds_mla")
    with pytest.raises(RuntimeError, match="pass kv_cache_dtype='fp8_ds_mla'"):
        mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE)


def test_checked_mode_gpu(monkeypatch):
    monkeypatch.delenv("MLA_EXT_CHECK_SLOTS", raising=False)
    cache, good, _ = make_cache(8, 64, "fp8_ds_mla", "cuda", poison_frac=0.0)
    q = torch.randn(2, 1, 16, 576, dtype=torch.bfloat16, device="cuda")
    idx = good[torch.randint(good.numel(), (2, 1, 64), device="cuda")].to(torch.int32)
    idx[0, 0, 3] = -1
    idx[1, 0, 40] = 8 * 64
    with pytest.raises(IndexError, match=r"indices\[1, 0, 40\] = 512 is outside the cache"):
        mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "fp8_ds_mla", checked=True)
    _check(q, cache, idx, "fp8_ds_mla", torch.tensor([64, 40], dtype=torch.int32, device="cuda"))
    monkeypatch.setenv("MLA_EXT_CHECK_SLOTS", "1")
    table = torch.arange(8, dtype=torch.int32, device="cuda").view(2, 4)
    with pytest.raises(IndexError, match=r"local_indices\[0, 0, 1\] = 256 is outside the block table"):
        mla_ext.sparse_indices_to_slots(torch.tensor([[[5, 256]], [[0, -1]]], dtype=torch.int32, device="cuda"), table, 64)
