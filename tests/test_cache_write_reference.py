"""CPU tests of the cache write: the reference against hand-worked bytes, schema/fake checks,
and clear errors for bad input. These run in CI (no GPU needed)."""

from __future__ import annotations

import pytest
import torch
from bad_inputs import CACHE_WRITE_CASES, cache_write_args

import mla_ext
from mla_ext import reference
from mla_ext.formats import DS_MLA_ROPE_OFFSET, DS_MLA_ROW_BYTES, DS_MLA_SCALE_OFFSET

# ---------------------------------------------------------------------------------------------
# An independent e4m3 decoder: from the raw bits, not through torch's float8 dtype.
# ---------------------------------------------------------------------------------------------


def decode_e4m3_byte(b: int) -> float:
    sign = -1.0 if b & 0x80 else 1.0
    exp = (b >> 3) & 0xF
    mant = b & 0x7
    if exp == 0xF and mant == 0x7:
        return float("nan")
    if exp == 0:
        return sign * (mant / 8.0) * 2.0**-6
    return sign * (1.0 + mant / 8.0) * 2.0 ** (exp - 7)


def decode_ds_mla_row(row: bytes) -> tuple[list[float], list[float], list[float]]:
    """(kv_c 512 floats, 4 scales, k_pe 64 floats) from one 656-byte row, by hand."""
    import struct

    scales = list(struct.unpack("<4f", row[DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET]))
    kv_c = [decode_e4m3_byte(row[i]) * scales[i // 128] for i in range(512)]
    k_pe = []
    for i in range(64):
        (bits,) = struct.unpack("<H", row[DS_MLA_ROPE_OFFSET + 2 * i: DS_MLA_ROPE_OFFSET + 2 * i + 2])
        (val,) = struct.unpack("<f", struct.pack("<I", bits << 16))
        k_pe.append(val)
    return kv_c, scales, k_pe


def test_e4m3_decoder_matches_known_codes():
    assert decode_e4m3_byte(0x7E) == 448.0  # largest finite
    assert decode_e4m3_byte(0x38) == 1.0
    assert decode_e4m3_byte(0x01) == 2.0**-9  # smallest subnormal
    assert decode_e4m3_byte(0xB8) == -1.0


# ---------------------------------------------------------------------------------------------
# fp8_ds_mla scale rule, worked by hand
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "amax, expected",
    [
        (336.0, 1.0),  # 336 / 448 = 0.75 -> ceil(log2) = 0
        (448.0, 1.0),  # exactly 1 -> 2^0
        (448.5, 2.0),  # just above -> 2^1
        (224.0, 0.5),  # exactly 0.5 -> 2^-1 (a power of two stays itself)
        (0.0, 2.0**-13),  # 1e-4 floor: log2(1e-4) = -13.29 -> -13
        (1e-4 * 448 * 0.99, 2.0**-13),
        (3.0e6, 8192.0),  # 3e6 / 448 = 6696 -> 2^13
    ],
)
def test_ds_mla_tile_scale_hand_worked(amax, expected):
    assert reference.ds_mla_tile_scale(torch.tensor([amax])).item() == expected


def test_ds_mla_row_bytes_hand_worked():
    """One token whose tile amaxes are 336, 0, 448*4 and 1.5: check every byte region by hand."""
    kv_c = torch.zeros(1, 512, dtype=torch.bfloat16)
    kv_c[0, 0], kv_c[0, 1], kv_c[0, 2] = 336.0, -1.0, 0.5  # tile 0: amax 336 -> scale 1
    # tile 1 all zero -> scale 2^-13, all bytes 0
    kv_c[0, 256], kv_c[0, 257] = 1792.0, -896.0  # tile 2: amax 1792 = 448 * 4 -> scale 4
    kv_c[0, 384] = 1.5  # tile 3: amax 1.5 -> 1.5/448 = 0.00335 -> 2^-8
    k_pe = torch.arange(64, dtype=torch.bfloat16).reshape(1, 64) - 31.5
    cache = torch.full((2, 4, DS_MLA_ROW_BYTES), 0xAB, dtype=torch.uint8)
    mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([6]), "fp8_ds_mla")
    row = bytes(cache[1, 2].tolist())
    dec_kv_c, scales, dec_k_pe = decode_ds_mla_row(row)
    assert scales == [1.0, 2.0**-13, 4.0, 2.0**-8]
    assert row[0] == 0x7A  # 336 = 1.3125 * 2^8: exp 8+7=15 -> 0b1111, mant 0.3125*8=2.5 -> even 2
    assert dec_kv_c[0] == 320.0  # 336 is halfway between 320 and 352: round to even mantissa (320)
    assert dec_kv_c[1] == -1.0 and dec_kv_c[2] == 0.5
    assert all(b == 0 for b in row[128:256])
    assert dec_kv_c[256] == 1792.0 and dec_kv_c[257] == -896.0
    assert dec_kv_c[384] == 1.5
    assert dec_k_pe == [float(v) for v in k_pe[0].float()]
    # Every other row is untouched.
    untouched = torch.ones(2, 4, dtype=torch.bool)
    untouched[1, 2] = False
    assert bool((cache[untouched] == 0xAB).all())


def test_fp8_per_tensor_saturates_and_divides():
    kv_c = torch.zeros(1, 512, dtype=torch.bfloat16)
    kv_c[0, 0], kv_c[0, 1], kv_c[0, 2] = 10.0, -1000.0, 0.25
    k_pe = torch.full((1, 64), 2.0, dtype=torch.bfloat16)
    cache = torch.zeros(1, 2, 576, dtype=torch.uint8)
    mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([1]), "fp8", torch.tensor([0.5]))
    row = cache[0, 1].tolist()
    assert decode_e4m3_byte(row[0]) == 20.0  # 10 / 0.5
    assert decode_e4m3_byte(row[1]) == -448.0  # -2000 saturates
    assert decode_e4m3_byte(row[2]) == 0.5
    assert all(decode_e4m3_byte(b) == 4.0 for b in row[512:])
    assert cache[0, 0].eq(0).all()


def test_auto_writes_exact_rows_and_skips_padding():
    kv_c = torch.randn(5, 512, dtype=torch.float16)
    k_pe = torch.randn(5, 1, 64, dtype=torch.float16)
    cache = torch.full((3, 3, 576), float("nan"), dtype=torch.float16)
    slots = torch.tensor([8, -1, 0, 4])  # token 4 is CUDA-graph padding past slot_mapping
    mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto")
    flat = cache.reshape(9, 576)
    for t, s in [(0, 8), (2, 0), (3, 4)]:
        assert torch.equal(flat[s], torch.cat([kv_c[t], k_pe[t, 0]]))
    assert torch.isnan(flat[[1, 2, 3, 5, 6, 7]]).all()


def test_out_of_range_slots_are_skipped_or_raise_in_checked_mode(monkeypatch):
    kv_c = torch.randn(2, 512, dtype=torch.bfloat16)
    k_pe = torch.randn(2, 64, dtype=torch.bfloat16)
    cache = torch.zeros(2, 4, 576, dtype=torch.bfloat16)
    slots = torch.tensor([3, 8])  # 8 == num_slots: out of range
    mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto")
    assert torch.equal(cache[0, 3], torch.cat([kv_c[0], k_pe[0]]))
    assert int((cache != 0).any(-1).sum()) == 1
    with pytest.raises(IndexError, match=r"slot_mapping\[1\] = 8 is outside the cache"):
        mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", checked=True)
    monkeypatch.setenv("MLA_EXT_CHECK_SLOTS", "1")
    with pytest.raises(IndexError, match="outside the cache"):
        mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto")


def test_padded_pages_and_strided_inputs():
    base = torch.randn(6, 700, dtype=torch.bfloat16)  # rows with stride 700
    kv_c, k_pe = base[:, :512], base[:, 600:664]
    storage = torch.full((4, 5, 656), 7, dtype=torch.uint8)
    cache = storage[:, :3]  # block stride 5*656 > block_size*row (padded pages)
    slots = torch.tensor([0, 11, 5, 6, 2, 9])
    mla_ext.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla")
    expected = reference.quantize_cache_rows(kv_c, k_pe, "fp8_ds_mla")
    for t, s in enumerate(slots.tolist()):
        assert torch.equal(cache[s // 3, s % 3], expected[t])
    assert bool((storage[:, 3:] == 7).all()), "padding between pages was written"


# ---------------------------------------------------------------------------------------------
# Schema, fake, torch.compile
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["auto", "fp8", "fp8_ds_mla"])
def test_opcheck_cpu(fmt):
    kv_c = torch.randn(7, 512, dtype=torch.bfloat16)
    k_pe = torch.randn(7, 64, dtype=torch.bfloat16)
    cache = mla_ext.empty_kv_cache(3, 4, fmt).zero_()
    scale = torch.tensor([0.1]) if fmt == "fp8" else None
    slots = torch.tensor([0, 5, 11, -1, 3, 2])
    torch.library.opcheck(
        torch.ops.mla_ext.concat_and_cache_mla.default, (kv_c, k_pe, cache, slots, fmt, scale)
    )


def test_schema_marks_cache_mutated():
    schema = torch.ops.mla_ext.concat_and_cache_mla.default._schema
    mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert mutated == ["kv_cache"]
    assert len(schema.returns) == 0


def test_torch_compile_fullgraph():
    kv_c = torch.randn(4, 512, dtype=torch.bfloat16)
    k_pe = torch.randn(4, 64, dtype=torch.bfloat16)
    cache = mla_ext.empty_kv_cache(2, 4, "fp8_ds_mla").zero_()
    expected = cache.clone()
    slots = torch.tensor([1, 6, 3, 0])

    @torch.compile(fullgraph=True, backend="eager")
    def step(kv_c, k_pe, cache, slots):
        torch.ops.mla_ext.concat_and_cache_mla(kv_c * 2, k_pe, cache, slots, "fp8_ds_mla", None)

    step(kv_c, k_pe, cache, slots)
    reference.concat_and_cache_mla(kv_c * 2, k_pe, expected, slots, "fp8_ds_mla")
    assert torch.equal(cache, expected)


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors, cache untouched
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CACHE_WRITE_CASES))
def test_bad_input_raises_clear_error(case):
    mutate, message = CACHE_WRITE_CASES[case]
    args = cache_write_args("cpu")
    mutate(args)
    before = args["kv_cache"].clone()
    with pytest.raises(mla_ext.MlaInputError, match=message):
        mla_ext.concat_and_cache_mla(**args)
    with pytest.raises(mla_ext.MlaInputError, match=message):  # the op itself, not only the wrapper
        torch.ops.mla_ext.concat_and_cache_mla(*args.values())
    assert torch.equal(args["kv_cache"], before)


@pytest.mark.parametrize("device", ["meta", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_device_mix_raises(device):
    """On CUDA the binding raises RuntimeError (MlaInputError, raised here by the fake for meta, is one)."""
    args = cache_write_args("cpu")
    args["kv_c"] = args["kv_c"].to(device)
    with pytest.raises(RuntimeError, match="all tensors must be on one device"):
        mla_ext.concat_and_cache_mla(**args)
