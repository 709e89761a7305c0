"""GPU tests of the sparse top-k decode and the index builders against the reference."""

from __future__ import annotations

import math

import pytest
import torch

import mla_ext
from bad_inputs import SPARSE_CASES, sparse_args
from conftest import assert_close
from mla_ext import reference
from mla_ext.formats import DS_MLA_ROPE_OFFSET, DS_MLA_SCALE_OFFSET
from sparse_cases import SOFTMAX_SCALE, make_cache, make_indices

pytestmark = pytest.mark.gpu
FORMATS = ["fp8_ds_mla", "auto"]


def _check(q, cache, idx, fmt, topk_length=None, sink=None):
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt, topk_length, sink)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape[:3] + (512,)
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.is_contiguous()
    # Against the fp32 spec, both formats. bf16 rows: the kernel rounds P to bf16 and out to bf16.
    # fp8_ds_mla: e4m3 values are exact in the kernel's fp16 operands and the fp32 tile scales
    # (any finite value) multiply fp32 partial scores and P (P' = P scale / R, fp16), so no
    # bf16 rounding of the rows happens and the same tolerances hold.
    ref_out, ref_lse = reference.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt, topk_length, sink)
    assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2, name="out vs fp32 spec")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=1e-4, name="lse vs fp32 spec")
    return out, lse


def _case(b, s_q, h_q, topk, block_size, fmt, pad_pages=False):
    num_blocks = max(2, (b * 400) // block_size)
    cache, good, poisoned = make_cache(num_blocks, block_size, fmt, "cuda", pad_pages=pad_pages)
    idx = make_indices(b, s_q, topk, good, num_blocks * block_size)
    q = torch.randn(b, s_q, h_q, 576, dtype=torch.bfloat16, device="cuda")
    return q, cache, idx, poisoned


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("h_q", [1, 16, 64, 128])
@pytest.mark.parametrize("topk", [1, 100, 2048])
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("block_size", [1, 64, 61])
def test_decode_matches_reference(fmt, h_q, topk, s_q, block_size):
    q, cache, idx, _ = _case(2, s_q, h_q, topk, block_size, fmt, pad_pages=block_size == 61)
    _check(q, cache, idx, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("h_q, b", [(20, 3), (128, 70), (16, 140), (36, 5)])
@pytest.mark.parametrize("splits", ["1", "3", "auto"])
def test_split_paths_and_odd_heads(fmt, h_q, b, splits, monkeypatch):
    # "1" = one CTA per query and head tile (no combine), "3" = forced 3-way split + combine.
    if splits != "auto":
        monkeypatch.setenv("MLA_EXT_SPARSE_NUM_SPLITS", splits)
    q, cache, idx, _ = _case(b, 1, h_q, 300, 64, fmt)
    _check(q, cache, idx, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("splits", ["1", "auto"])
def test_all_invalid(fmt, splits, monkeypatch):
    if splits != "auto":
        monkeypatch.setenv("MLA_EXT_SPARSE_NUM_SPLITS", splits)
    q, cache, idx, poisoned = _case(3, 2, 16, 200, 64, fmt)
    num_slots = cache.shape[0] * cache.shape[1]
    idx[1] = -1
    idx[2, 0] = num_slots + torch.arange(200, device="cuda", dtype=torch.int32)
    out, lse = _check(q, cache, idx, fmt)
    assert (out[1] == 0).all() and (out[2, 0] == 0).all()
    assert (lse[1] == -math.inf).all() and (lse[2, :, 0] == -math.inf).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("splits", ["1", "auto"])
def test_topk_length_and_sink(fmt, splits, monkeypatch):
    if splits != "auto":
        monkeypatch.setenv("MLA_EXT_SPARSE_NUM_SPLITS", splits)
    b, topk, h_q = 4, 2048, 16
    q, cache, idx, poisoned = _case(b, 2, h_q, topk, 64, fmt)
    topk_length = torch.tensor([2048, 1000, 0, 65], dtype=torch.int32, device="cuda")
    # Entries past topk_length point at NaN rows: they must not be read.
    for i in range(b):
        n = int(topk_length[i])
        fill = poisoned[torch.randint(poisoned.numel(), (2, topk - n), device="cuda")]
        idx[i, :, n:] = fill.to(torch.int32)
    sink = torch.randn(h_q, device="cuda")
    sink[3] = math.inf
    sink[5] = -math.inf
    out, lse = _check(q, cache, idx, fmt, topk_length, sink)
    assert (out[:, :, 3] == 0).all()
    assert (out[2] == 0).all() and (lse[2] == -math.inf).all()


def test_h16_reads_same_rows_as_h64():
    """Heads are independent: the first 16 heads of an h_q=64 call equal an h_q=16 call."""
    q, cache, idx, _ = _case(2, 1, 64, 512, 64, "fp8_ds_mla")
    out64, lse64 = mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "fp8_ds_mla")
    out16, lse16 = mla_ext.sparse_decode_mla(q[:, :, :16].contiguous(), cache, idx, SOFTMAX_SCALE, "fp8_ds_mla")
    assert_close(out16, out64[:, :, :16], cos_tol=1e-6, atol=1e-3, rtol=1e-2)
    assert_close(lse16, lse64[:, :16], cos_tol=1e-7, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    "h_q", [16, "16-copy0", "16-dequant", "16-cpasync", 32, 64, "64-portable", 128, "128-portable", "128-pvdequant", "128-cpasync"]
)
@pytest.mark.parametrize("q_exp", [-30, 0, 20])
@pytest.mark.parametrize("splits", ["1", "3"])
def test_fp8_ds_mla_scale_spread_and_q_magnitudes(h_q, q_exp, splits, monkeypatch):
    """The fp8_ds_mla kernel keeps the fp32 tile scales out of its fp16 operands (scores: partial
    sums times the scale; values: P' = P scale / R with R the running max |scale| of the tile)
    and normalises each q row by a power of two into fp16. Stress both: scales spread over 2^16
    within every 128-wide tile (and between the tiles of one key), not powers of two, some
    negative; q rows 2^q_exp * 2^-6..2^0 (fp16 would underflow at 2^-30 and overflow at 2^20
    without the normalisation), one row all zero. softmax_scale * 2^-q_exp keeps the scores
    O(100), so the softmax is well conditioned and fp32 rounding of the scores cannot move the
    weights by more than ~0.5%. Compared row by row relative to the row's largest output (a row's
    output is dominated by its large-scale keys), with the tolerances of the bf16 cache."""
    monkeypatch.setenv("MLA_EXT_SPARSE_NUM_SPLITS", splits)
    if h_q == "16-dequant":
        monkeypatch.setenv("MLA_EXT_SPARSE_FP8_DEQUANT", "1")
        h_q = 16
    elif h_q == "16-copy0":  # sm90: the bulk copies issued by the compute warps (default: 4 copy warps)
        monkeypatch.setenv("MLA_EXT_SPARSE_COPY_WARPS", "0")
        h_q = 16
    elif isinstance(h_q, str):  # "64-portable": the mma.sync kernel where sm90 runs the wgmma one, etc.
        h_q, path = h_q.split("-")
        h_q = int(h_q)
        _select_64_head_path(path, monkeypatch)
    b, s_q, topk, bs = 2, 2, 700, 64
    num_blocks = 30
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
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, softmax_scale, "fp8_ds_mla")
    ref_out, ref_lse = reference.sparse_decode_mla(q, cache, idx, softmax_scale, "fp8_ds_mla")
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
        ref_out, ref_lse = reference.sparse_decode_mla(q, cache, want_slots, SOFTMAX_SCALE, fmt)
        assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2)
        assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=1e-4)


@pytest.mark.parametrize("fmt", FORMATS)
def test_small_for_sanitizer(fmt):
    """Small, fast case with every kind of invalid entry, for compute-sanitizer (-k small)."""
    q, cache, idx, _ = _case(2, 2, 20, 130, 61, fmt, pad_pages=True)
    tl = torch.tensor([130, 70], dtype=torch.int32, device="cuda")
    _check(q, cache, idx, fmt, tl, torch.randn(20, device="cuda"))


@pytest.mark.parametrize("path", ["default", "copy0", "cpasync", "dequant"])
@pytest.mark.parametrize("h_q", [1, 16])
@pytest.mark.parametrize("splits", ["1", "3"])
def test_small_fp8_16_head_paths(path, h_q, splits, monkeypatch):
    """The fp8_ds_mla kernels for 16-head tiles: the default reads e4m3 fragments from the staging
    rows, gathered by 4 copy warps (sm90: one bulk copy per row; portable: 16-byte cp.async) ("copy0",
    MLA_EXT_SPARSE_COPY_WARPS=0: by the compute warps; "cpasync", MLA_EXT_SPARSE_SM90=cpasync: the
    portable kernel on sm90); MLA_EXT_SPARSE_FP8_DEQUANT=1 dequantises into an fp16 tile. Every
    kind of invalid entry, topk_length, attn_sink, page padding; small enough for compute-sanitizer
    (with MLA_EXT_FORCE_PORTABLE=1 every path but "dequant" is a portable e4m3-fragment kernel)."""
    if path == "dequant":
        monkeypatch.setenv("MLA_EXT_SPARSE_FP8_DEQUANT", "1")
    elif path == "cpasync":
        monkeypatch.setenv("MLA_EXT_SPARSE_SM90", "cpasync")
    elif path == "copy0":
        monkeypatch.setenv("MLA_EXT_SPARSE_COPY_WARPS", "0")
    monkeypatch.setenv("MLA_EXT_SPARSE_NUM_SPLITS", splits)
    q, cache, idx, _ = _case(2, 2, h_q, 333, 61, "fp8_ds_mla", pad_pages=True)
    tl = torch.tensor([333, 140], dtype=torch.int32, device="cuda")
    _check(q, cache, idx, "fp8_ds_mla", tl, torch.randn(h_q, device="cuda"))


@pytest.mark.parametrize("path", ["default", "copy0"])
def test_small_fp8_16_head_paths_long_list(path, monkeypatch):
    """One CTA per query token over 11-13 tiles (topk 801, no split): every staging buffer is
    refilled at least twice, so on sm90 both of the copy warps' release barriers and both mbarrier
    parities are used more than once (the small cases above have at most 6 tiles per CTA); small
    enough for compute-sanitizer."""
    if path == "copy0":
        monkeypatch.setenv("MLA_EXT_SPARSE_COPY_WARPS", "0")
    monkeypatch.setenv("MLA_EXT_SPARSE_NUM_SPLITS", "1")
    q, cache, idx, _ = _case(2, 1, 16, 801, 61, "fp8_ds_mla", pad_pages=True)
    tl = torch.tensor([801, 700], dtype=torch.int32, device="cuda")
    _check(q, cache, idx, "fp8_ds_mla", tl, torch.randn(16, device="cuda"))


def _sparse_kernels_run(fn):
    """Names of the sparse-decode kernels one call of fn launches (torch profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if "sparse_decode" in e.name}


@pytest.mark.parametrize("h_q", [16, 64])
def test_sm90_gather_env_selects_kernel(h_q, monkeypatch):
    """On sm90 the fp8_ds_mla kernels gather rows with bulk copies, MLA_EXT_SPARSE_SM90=cpasync with
    16-byte cp.async: different kernels, so the paths the other tests name are the ones that run."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the bulk-copy gather is the sm90 path")
    q, cache, idx, _ = _case(2, 1, h_q, 200, 64, "fp8_ds_mla")
    call = lambda: mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "fp8_ds_mla")  # noqa: E731
    bulk = _sparse_kernels_run(call)
    monkeypatch.setenv("MLA_EXT_SPARSE_SM90", "cpasync")
    cpasync = _sparse_kernels_run(call)
    assert len(bulk) == 1 and len(cpasync) == 1 and bulk != cpasync, (bulk, cpasync)


def _assert_env_switches_kernel(h_q, var, other, bad, monkeypatch):
    """One fp8_ds_mla call with h_q heads launches one sparse kernel, `var`=`other` a different one
    (so the tests that name that path run what they name), and `var`=`bad` is refused with a message."""
    q, cache, idx, _ = _case(2, 1, h_q, 200, 64, "fp8_ds_mla")
    call = lambda: mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, "fp8_ds_mla")  # noqa: E731
    default = _sparse_kernels_run(call)
    monkeypatch.setenv(var, other)
    switched = _sparse_kernels_run(call)
    assert len(default) == 1 and len(switched) == 1 and default != switched, (default, switched)
    monkeypatch.setenv(var, bad)
    with pytest.raises(RuntimeError, match=f"{var} must be"):
        call()


def test_sm90_copy_warps_env_selects_kernel(monkeypatch):
    """On sm90 the fp8_ds_mla 16-head kernel's bulk copies are issued by 4 copy warps,
    MLA_EXT_SPARSE_COPY_WARPS=0 by the compute warps: different kernels (so "copy0" tests what it
    names); any other value is refused with a message."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the copy warps are the sm90 16-head kernel's")
    for var in ("MLA_EXT_SPARSE_COPY_WARPS", "MLA_EXT_SPARSE_SM90", "MLA_EXT_FORCE_PORTABLE", "MLA_EXT_SPARSE_FP8_DEQUANT"):
        monkeypatch.delenv(var, raising=False)
    _assert_env_switches_kernel(16, "MLA_EXT_SPARSE_COPY_WARPS", "0", "2", monkeypatch)


def test_portable_copy_warps_env_selects_kernel(monkeypatch):
    """The portable fp8_ds_mla 16-head kernel gathers with 4 copy warps (cp.async, completion on an
    mbarrier) by default, MLA_EXT_SPARSE_COPY_WARPS=0 with the compute warps: different kernels (so
    the "copy0" tests under MLA_EXT_FORCE_PORTABLE=1 test what they name); other values are refused."""
    for var in ("MLA_EXT_SPARSE_COPY_WARPS", "MLA_EXT_SPARSE_ROW_THREADS", "MLA_EXT_SPARSE_FP8_DEQUANT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLA_EXT_FORCE_PORTABLE", "1")
    _assert_env_switches_kernel(16, "MLA_EXT_SPARSE_COPY_WARPS", "0", "2", monkeypatch)


def test_pv_raw_env_selects_kernel(monkeypatch):
    """The portable fp8_ds_mla 64-head kernel reads V from the staging rows by default and
    MLA_EXT_SPARSE_PV_RAW=0 selects the dequantising one: different kernels (so "pvdequant" tests
    what it names); any other value is refused with a message."""
    if torch.cuda.get_device_properties(0).shared_memory_per_block_optin < 232320:
        pytest.skip("the kernel that reads V from the staging rows needs 232320 bytes of shared memory")
    for var in ("MLA_EXT_SPARSE_PV_RAW", "MLA_EXT_SPARSE_ROW_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLA_EXT_FORCE_PORTABLE", "1")
    _assert_env_switches_kernel(64, "MLA_EXT_SPARSE_PV_RAW", "0", "yes", monkeypatch)


def _select_64_head_path(path, monkeypatch):
    """fp8_ds_mla on sm90: "default" (64-head tiles: the wgmma kernel; 16-head tiles: the e4m3-
    fragment kernel; rows gathered by bulk copies), "cpasync" (the same kernels gathering with
    16-byte cp.async, MLA_EXT_SPARSE_SM90=cpasync), "portable" (the mma.sync kernels,
    MLA_EXT_FORCE_PORTABLE=1; 64-head tiles: V read from the staging rows, the next tile dequantised
    during PV), or "pvdequant" (the portable 64-head kernel that dequantises each tile before its
    QK^T, MLA_EXT_SPARSE_PV_RAW=0). Other GPUs run the portable kernels for all of them."""
    if path in ("portable", "pvdequant"):
        monkeypatch.setenv("MLA_EXT_FORCE_PORTABLE", "1")
        if path == "pvdequant":
            monkeypatch.setenv("MLA_EXT_SPARSE_PV_RAW", "0")
    elif path != "default":
        monkeypatch.setenv("MLA_EXT_SPARSE_SM90", path)


@pytest.mark.parametrize("path", ["default", "cpasync", "portable", "pvdequant"])
@pytest.mark.parametrize("h_q, b", [(64, 2), (128, 2), (40, 3), (128, 70)])
@pytest.mark.parametrize("splits", ["1", "3"])
def test_small_fp8_64_head_paths(path, h_q, b, splits, monkeypatch):
    """fp8_ds_mla 64-head tiles: on sm90 the default is the wgmma kernel
    (csrc/sparse/sm90/sparse_decode_sm90_fp8.cu; its cp.async gather by MLA_EXT_SPARSE_SM90=cpasync),
    MLA_EXT_FORCE_PORTABLE=1 the mma.sync one (MLA_EXT_SPARSE_PV_RAW=0: its dequantising variant).
    Fresh random data, NaN in unused slots and page padding, odd topk, -1 / out-of-range /
    duplicate indices, topk_length (one row cut inside a tile, one at 0), attn_sink with +-inf;
    h_q 40 leaves 24 rows of the tile unused; b 70 x 2 tiles fills the GPU without splits."""
    _select_64_head_path(path, monkeypatch)
    monkeypatch.setenv("MLA_EXT_SPARSE_NUM_SPLITS", splits)
    q, cache, idx, _ = _case(b, 2, h_q, 333, 61, "fp8_ds_mla", pad_pages=True)
    tl = torch.randint(1, 334, (b,), dtype=torch.int32, device="cuda")
    tl[0], tl[-1] = 333, 0
    if b > 2:
        tl[1] = 131
    sink = torch.randn(h_q, device="cuda")
    sink[1], sink[h_q - 1] = math.inf, -math.inf
    out, lse = _check(q, cache, idx, "fp8_ds_mla", tl, sink)
    assert (out[-1] == 0).all() and (lse[-1] == -math.inf).all() and (out[:, :, 1] == 0).all()


@pytest.mark.parametrize("path", ["default", "cpasync", "portable", "pvdequant"])
@pytest.mark.parametrize("h_q", [16, "16-copy0", 64, 128])
def test_fp8_rising_scores(path, h_q, monkeypatch):
    """Scores that rise along the top-k list (rows c_k u + noise, q ~ u, indices in order), by ~2
    (log2 units) per 64-key tile and once by ~28: the running maximum moves on every tile (O is
    rescaled every tile), and the tile scales grow with c_k (the scale reference R moves too).
    h_q 16 runs the 16-head kernels (sm90 default: bulk copies from copy warps; "16-copy0": from the
    compute warps)."""
    if path == "pvdequant" and h_q in (16, "16-copy0"):
        pytest.skip("MLA_EXT_SPARSE_PV_RAW selects between 64-head kernels only")
    _select_64_head_path(path, monkeypatch)
    if h_q == "16-copy0":
        monkeypatch.setenv("MLA_EXT_SPARSE_COPY_WARPS", "0")
        h_q = 16
    monkeypatch.setenv("MLA_EXT_SPARSE_NUM_SPLITS", "1")
    topk, bs = 2048, 64
    u = torch.randn(576, device="cuda")
    c = torch.linspace(0.2, 3.0, topk, device="cuda")
    c[1500:] *= 1.6
    kv = (c[:, None] * u[None, :] + 0.05 * torch.randn(topk, 576, device="cuda")).to(torch.bfloat16)
    rows = reference.quantize_cache_rows(kv[:, :512], kv[:, 512:], "fp8_ds_mla")
    cache = rows.view(topk // bs, bs, -1).contiguous()
    q = (u[None, :] + 0.3 * torch.randn(h_q, 576, device="cuda")).to(torch.bfloat16).view(1, 1, h_q, 576)
    idx = torch.arange(topk, dtype=torch.int32, device="cuda").view(1, 1, topk)
    scale = 40.0 / (576 * float((u * u).mean()) * 3.0)  # scores span ~0..65 (natural log units)
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, scale, "fp8_ds_mla")
    ref_out, ref_lse = reference.sparse_decode_mla(q, cache, idx, scale, "fp8_ds_mla")
    assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2, name="out vs fp32 spec")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=5e-4, rtol=1e-4, name="lse vs fp32 spec")


@pytest.mark.parametrize("path", ["default", "cpasync", "portable", "pvdequant"])
@pytest.mark.parametrize("h_q", [16, 128])
def test_fp8_huge_scores(path, h_q, monkeypatch):
    """Scores around 2^27 (softmax_scale 2^22), where an fp32 ulp is 16: every P must stay within
    fp16 (every kernel scales the scores before taking the max, so the max key's P is exactly 1; the
    lazy max of the portable 64-head kernel compares the difference of the tile max and the running
    max with its slack), and the nearly one-hot softmax must pick each row's largest score as the
    fp32 spec does (duplicate indices included: the spec normalises by the sum of exp(s - max)).
    Before session 12 the sm90 64-head kernel failed here (csrc/sparse/README.md, "Session 12")."""
    if path == "pvdequant" and h_q == 16:
        pytest.skip("MLA_EXT_SPARSE_PV_RAW selects between 64-head kernels only")
    _select_64_head_path(path, monkeypatch)
    monkeypatch.setenv("MLA_EXT_SPARSE_NUM_SPLITS", "1")
    q, cache, idx, _ = _case(2, 1, h_q, 700, 64, "fp8_ds_mla")
    scale = 2.0**22
    out, lse = mla_ext.sparse_decode_mla(q, cache, idx, scale, "fp8_ds_mla")
    ref_out, ref_lse = reference.sparse_decode_mla(q, cache, idx, scale, "fp8_ds_mla")
    assert ref_lse.abs().amax() > 2.0**24, "scores are not in the range this test is about"
    assert torch.isfinite(out).all(), f"{int((~torch.isfinite(out)).sum())} non-finite outputs"
    assert_close(out, ref_out, cos_tol=1e-5, atol=5e-3, rtol=1e-2, name="out vs fp32 spec")
    assert_close(lse, ref_lse, cos_tol=1e-7, atol=0.0, rtol=1e-5, name="lse vs fp32 spec")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("h_q", [16, 64])
@pytest.mark.parametrize("rows", ["4", "8", "16"])
def test_small_row_threads(rows, fmt, h_q, monkeypatch):
    """The portable gathers with 4, 8 and 16 threads per row (MLA_EXT_SPARSE_ROW_THREADS; the
    defaults are 16 for fp8_ds_mla, 8 for bf16; 4 is the dequantising kernel at 64 heads) against
    the reference, with every kind of invalid entry and padded pages."""
    monkeypatch.setenv("MLA_EXT_SPARSE_ROW_THREADS", rows)
    monkeypatch.setenv("MLA_EXT_FORCE_PORTABLE", "1")
    q, cache, idx, _ = _case(2, 2, h_q, 333, 61, fmt, pad_pages=True)
    tl = torch.tensor([333, 140], dtype=torch.int32, device="cuda")
    _check(q, cache, idx, fmt, tl, torch.randn(h_q, device="cuda"))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("h_q", [16, 64])
def test_row_threads_env_selects_kernel(fmt, h_q, monkeypatch):
    """MLA_EXT_SPARSE_ROW_THREADS names the portable gather that runs: the value that is not the
    default (8 for fp8_ds_mla, 16 for bf16) launches a different kernel, so test_small_row_threads
    tests what it names."""
    for var in ("MLA_EXT_SPARSE_PV_RAW", "MLA_EXT_SPARSE_ROW_THREADS", "MLA_EXT_SPARSE_FP8_DEQUANT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLA_EXT_FORCE_PORTABLE", "1")
    if fmt == "fp8_ds_mla" and h_q == 64 and torch.cuda.get_device_properties(0).shared_memory_per_block_optin < 232320:
        pytest.skip("the 64-head fp8_ds_mla kernel with a choice of gathers needs 232320 bytes of shared memory")
    q, cache, idx, _ = _case(2, 1, h_q, 200, 64, fmt)
    call = lambda: mla_ext.sparse_decode_mla(q, cache, idx, SOFTMAX_SCALE, fmt)  # noqa: E731
    default = _sparse_kernels_run(call)
    monkeypatch.setenv("MLA_EXT_SPARSE_ROW_THREADS", "8" if fmt == "fp8_ds_mla" else "16")
    other = _sparse_kernels_run(call)
    assert len(default) == 1 and len(other) == 1 and default != other, (default, other)


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
