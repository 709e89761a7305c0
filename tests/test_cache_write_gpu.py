"""GPU tests of the cache-write kernel: bit-for-bit equal to the reference in every format."""

from __future__ import annotations

import pytest
import torch
from bad_inputs import CACHE_WRITE_CASES, cache_write_args

import mla_ext
from mla_ext import reference
from mla_ext.formats import empty_kv_cache

pytestmark = pytest.mark.gpu

FORMATS = ["auto", "fp8", "fp8_e4m3", "fp8_ds_mla"]


def _poisoned_cache(num_blocks, block_size, fmt, dtype, pad_tokens=0):
    """A cache whose every byte starts as NaN (auto) or 0xFF (fp8: e4m3 NaN), optionally with
    padded pages (block stride larger than block_size * row)."""
    storage = empty_kv_cache(num_blocks, block_size + pad_tokens, fmt, dtype, device="cuda")
    if storage.is_floating_point():
        storage.fill_(float("nan"))
    else:
        storage.fill_(0xFF)
    return storage, storage[:, :block_size]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_tokens", [1, 3, 4097])
@pytest.mark.parametrize("block_size", [1, 16, 61, 64])
def test_kernel_equals_reference(fmt, dtype, num_tokens, block_size):
    num_blocks = (num_tokens + block_size - 1) // block_size + 5
    kv = torch.randn(num_tokens, 576, dtype=dtype, device="cuda") * 3
    kv_c, k_pe = kv[:, :512], kv[:, 512:]  # strided views of one projection output
    # Random slots over a randomly ordered set of pages, some padding (-1) tokens.
    slots = torch.randperm(num_blocks * block_size, device="cuda")[:num_tokens]
    if num_tokens > 2:
        slots[torch.randperm(num_tokens, device="cuda")[: num_tokens // 5]] = -1
    scale = (torch.rand(1, device="cuda") * 0.1 + 0.01) if fmt.startswith("fp8") and fmt != "fp8_ds_mla" else None
    storage, cache = _poisoned_cache(num_blocks, block_size, fmt, dtype)
    expected_storage = storage.clone()
    expected = expected_storage[:, :block_size]
    reference.concat_and_cache_mla(kv_c, k_pe, expected, slots, fmt, scale)
    mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, fmt, scale)
    torch.cuda.synchronize()
    # Bytes, not values: NaN == NaN here, and untouched slots must keep their poison.
    assert torch.equal(storage.view(torch.uint8), expected_storage.view(torch.uint8))


@pytest.mark.parametrize("fmt", ["auto", "fp8", "fp8_ds_mla"])
def test_padded_pages_unaligned_strides_and_3d_k_pe(fmt):
    """Padded page stride, a row stride that is not a multiple of 16 bytes (byte-wise path),
    k_pe given as [T, 1, 64], fewer slots than tokens, out-of-range slots skipped."""
    num_tokens, block_size = 37, 16
    base = torch.randn(num_tokens, 583, dtype=torch.bfloat16, device="cuda")  # odd row stride
    kv_c = base[:, 1:513]
    k_pe = base[:, 515:579].unsqueeze(1)
    storage, cache = _poisoned_cache(6, block_size, fmt, torch.bfloat16, pad_tokens=3)
    slots = torch.randperm(6 * block_size, device="cuda")[: num_tokens - 4]
    slots[0], slots[5] = 6 * block_size, 10**12  # out of range: must be skipped
    scale = torch.tensor([0.037], device="cuda") if fmt == "fp8" else None
    expected_storage = storage.clone()
    reference.concat_and_cache_mla(kv_c, k_pe, expected_storage[:, :block_size], slots, fmt, scale)
    mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, fmt, scale)
    assert torch.equal(storage.view(torch.uint8), expected_storage.view(torch.uint8))


def test_ds_mla_extreme_tiles():
    """Tiles with huge, tiny and zero amax; all values must still match the reference bits."""
    kv_c = torch.randn(8, 512, device="cuda", dtype=torch.bfloat16)
    kv_c[0, :128] = 0
    kv_c[1, 128:256] *= 1e-8
    kv_c[2, 256:384] *= 1e30
    kv_c[3, 384:] = 448.0
    k_pe = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)
    cache = torch.zeros(1, 8, 656, dtype=torch.uint8, device="cuda")
    expected = cache.clone()
    slots = torch.arange(8, device="cuda")
    reference.concat_and_cache_mla(kv_c, k_pe, expected, slots, "fp8_ds_mla")
    mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla")
    assert torch.equal(cache, expected)


def test_checked_mode_raises_on_gpu():
    kv_c = torch.randn(3, 512, device="cuda", dtype=torch.bfloat16)
    k_pe = torch.randn(3, 64, device="cuda", dtype=torch.bfloat16)
    cache = torch.zeros(2, 2, 576, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(IndexError, match=r"slot_mapping\[2\] = 4 is outside"):
        mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([0, 1, 4], device="cuda"), checked=True)


def test_cuda_graph_capture_and_replay():
    num_tokens, block_size = 24, 16
    kv_c = torch.randn(num_tokens, 512, device="cuda", dtype=torch.bfloat16)
    k_pe = torch.randn(num_tokens, 64, device="cuda", dtype=torch.bfloat16)
    cache = torch.zeros(4, block_size, 656, device="cuda", dtype=torch.uint8)
    slots = torch.randperm(4 * block_size, device="cuda")[:num_tokens]
    torch.ops.mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", None)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", None)
    for _ in range(2):  # new contents and new slots each replay
        kv_c.copy_(torch.randn_like(kv_c))
        slots.copy_(torch.randperm(4 * block_size, device="cuda")[:num_tokens])
        cache.zero_()
        graph.replay()
        expected = torch.zeros_like(cache)
        reference.concat_and_cache_mla(kv_c, k_pe, expected, slots, "fp8_ds_mla")
        torch.cuda.synchronize()
        assert torch.equal(cache, expected)


@pytest.mark.parametrize("fmt", ["auto", "fp8", "fp8_ds_mla"])
def test_opcheck_cuda(fmt):
    kv_c = torch.randn(9, 512, device="cuda", dtype=torch.bfloat16)
    k_pe = torch.randn(9, 64, device="cuda", dtype=torch.bfloat16)
    cache = empty_kv_cache(3, 4, fmt, device="cuda").zero_()
    scale = torch.tensor([0.1], device="cuda") if fmt == "fp8" else None
    slots = torch.tensor([0, 5, 11, -1, 3, 2, 7, 8, 9], device="cuda")
    torch.library.opcheck(torch.ops.mla_ext.concat_and_cache_mla.default, (kv_c, k_pe, cache, slots, fmt, scale))


def test_sanitizer_small_case():
    """Small case for `compute-sanitizer --tool memcheck` (see bench/gpu_check.sh): every format,
    vector and byte-wise paths, out-of-range and padding slots."""
    for fmt in ("auto", "fp8", "fp8_ds_mla"):
        for odd in (False, True):
            base = torch.randn(5, 583 if odd else 576, dtype=torch.bfloat16, device="cuda")
            kv_c, k_pe = base[:, :512], base[:, 512:576]
            cache = empty_kv_cache(2, 3, fmt, device="cuda").zero_()
            scale = torch.tensor([0.5], device="cuda") if fmt == "fp8" else None
            slots = torch.tensor([5, -1, 6, 0, 10**9], device="cuda")
            mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, fmt, scale)
    torch.cuda.synchronize()


@pytest.mark.parametrize("scale_value", [1.0, 0.5, 2.0**-10, 64.0, 0.0173, 3.7, 1e-3])
def test_fp8_scales_pow2_and_arbitrary(scale_value):
    """Power-of-two scales take the multiply path, others true division: both equal x / scale."""
    kv_c = torch.randn(257, 512, device="cuda", dtype=torch.bfloat16) * 4
    k_pe = torch.randn(257, 64, device="cuda", dtype=torch.bfloat16) * 4
    cache = torch.zeros(5, 64, 576, device="cuda", dtype=torch.uint8)
    expected = cache.clone()
    slots = torch.randperm(5 * 64, device="cuda")[:257]
    scale = torch.tensor([scale_value], device="cuda")
    reference.concat_and_cache_mla(kv_c, k_pe, expected, slots, "fp8", scale)
    mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8", scale)
    assert torch.equal(cache, expected)


def test_fp8_division_bits_over_wide_ranges():
    """The kernel's fast correctly-rounded division must give the reference's x / scale bits for
    values and scales over many decades, signed zeros, saturation and e4m3 subnormals."""
    n = 4096
    magnitude = torch.pow(10.0, torch.empty(n, 1, device="cuda").uniform_(-7, 7))
    kv = (torch.randn(n, 576, device="cuda") * magnitude).to(torch.bfloat16)
    kv[0, :10] = torch.tensor([0.0, -0.0, 1e-38, -1e-38, 3e38, -3e38, 448.0, -448.0, float("inf"), -float("inf")])
    kv_c, k_pe = kv[:, :512], kv[:, 512:]
    slots = torch.arange(n, device="cuda")
    # Random decades, common values, and divisors whose reciprocal is not a normal float.
    for scale_value in torch.pow(10.0, torch.empty(6).uniform_(-4, 4)).tolist() + [1.0, 0.1, 3.0, 1e38, 1e-38, 2.0**-127]:
        scale = torch.tensor([scale_value], device="cuda", dtype=torch.float32)
        cache = torch.zeros(n // 64, 64, 576, device="cuda", dtype=torch.uint8)
        expected = cache.clone()
        reference.concat_and_cache_mla(kv_c, k_pe, expected, slots, "fp8", scale)
        mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8", scale)
        mismatched = int((cache != expected).sum())
        assert mismatched == 0, f"scale {scale_value}: {mismatched} bytes differ"


@pytest.mark.parametrize("case", sorted(CACHE_WRITE_CASES))
def test_bad_input_gpu(case):
    """The binding refuses what the reference path refuses, with the same message (RuntimeError),
    and leaves the cache as it was."""
    mutate, message = CACHE_WRITE_CASES[case]
    args = cache_write_args("cuda")
    mutate(args)
    before = args["kv_cache"].clone()
    with pytest.raises(RuntimeError, match=message):
        mla_ext.concat_and_cache_mla(**args)
    with pytest.raises(RuntimeError, match=message):  # the op itself
        torch.ops.mla_ext.concat_and_cache_mla(*args.values())
    torch.cuda.synchronize()
    assert torch.equal(args["kv_cache"], before)
