"""CPU tests of the DeepSeek-V4 spec: formats, quantisation, cache write and sparse decode in
mla_ext/reference.py, against independent by-hand computations (bits decoded and encoded in plain
Python, a per-query loop), and their input checks.

The V4 reference loads no compiled code, and neither does this file: it loads mla_ext's pure-Python
modules (formats, _validate, _validate_v4, reference) as a separate package, without running
mla_ext/__init__.py (which loads the library), so these tests run before the library is built.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import math
import pathlib
import struct
import sys

import pytest
import torch
from conftest import assert_close


def _load_pure_modules():
    name = "_mla_ext_pure"  # a second name for the mla_ext directory: its __init__ never runs
    if name not in sys.modules:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(pathlib.Path(__file__).resolve().parents[1] / "mla_ext")]
        sys.modules[name] = importlib.util.module_from_spec(spec)
    return tuple(importlib.import_module(f"{name}.{m}") for m in ("formats", "reference", "_validate"))


formats, reference, _validate = _load_pure_modules()
MlaInputError = _validate.MlaInputError
BF16 = torch.bfloat16
SOFTMAX_SCALE = 512**-0.5

# ---------------------------------------------------------------------------------------------
# By-hand encodings: from the bits, not through torch's float8 / bfloat16 conversions
# ---------------------------------------------------------------------------------------------


def e4m3_value(code: int) -> float:
    sign = -1.0 if code & 0x80 else 1.0
    exp, mant = (code >> 3) & 0xF, code & 0x7
    if exp == 0xF and mant == 0x7:
        return math.nan
    if exp == 0:
        return sign * mant / 8.0 * 2.0**-6
    return sign * (1.0 + mant / 8.0) * 2.0 ** (exp - 7)


E4M3_POSITIVE = [e4m3_value(c) for c in range(0x7F)]  # codes 0..126 ascending, 0 .. 448
E4M3_TABLE = torch.tensor([e4m3_value(c) for c in range(256)], dtype=torch.float64)


def e4m3_encode(v: float) -> int:
    """Nearest e4m3 code to v, ties to the even code, saturating at 448."""
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    a = abs(v)
    if a >= 448.0:
        return sign | 0x7E
    hi = next(c for c, x in enumerate(E4M3_POSITIVE) if x >= a)
    if hi == 0 or E4M3_POSITIVE[hi] == a:
        return sign | hi
    lo = hi - 1
    d_lo, d_hi = a - E4M3_POSITIVE[lo], E4M3_POSITIVE[hi] - a
    if d_lo != d_hi:
        return sign | (lo if d_lo < d_hi else hi)
    return sign | (lo if lo % 2 == 0 else hi)


def bf16_bits(x: float) -> int:
    """bf16 bits of x (an fp32 value): round to nearest even."""
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def bf16_value(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def scale_exponent(amax: float) -> int:
    """The smallest e with 2^e >= max(amax / 448, 1e-4), by search."""
    v = max(amax / 448.0, 1e-4)
    e = math.ceil(math.log2(v))
    while 2.0 ** (e - 1) >= v:
        e -= 1
    while 2.0**e < v:
        e += 1
    return e


def pack_token(row: list[float]) -> bytes:
    """One V4 fp8_ds_mla token (data part then scale part), element by element."""
    out = bytearray(584)
    for i in range(7):
        tile = row[64 * i: 64 * i + 64]
        if not all(math.isfinite(x) for x in tile):
            out[64 * i: 64 * i + 64] = b"\x7f" * 64
            out[576 + i] = 0xFF
            continue
        e = scale_exponent(max(abs(x) for x in tile))
        out[576 + i] = 127 + e
        for k, x in enumerate(tile):
            out[64 * i + k] = e4m3_encode(x / 2.0**e)
    for k in range(64):
        out[448 + 2 * k: 450 + 2 * k] = struct.pack("<H", bf16_bits(row[448 + k]))
    return bytes(out)


def decode_token(token: torch.Tensor) -> torch.Tensor:
    """uint8 [584] (data part then scale part) -> float64 [512], by table and bits."""
    nope = E4M3_TABLE[token[:448].long()]
    scales = torch.tensor([math.nan if b == 255 else 2.0 ** (b - 127) for b in token[576:583].tolist()],
                          dtype=torch.float64)
    rope = [bf16_value(token[448 + 2 * k].item() | token[449 + 2 * k].item() << 8) for k in range(64)]
    return torch.cat([nope * scales.repeat_interleave(64), torch.tensor(rope, dtype=torch.float64)])


def test_by_hand_codecs_match_known_codes():
    assert e4m3_value(0x7E) == 448.0 and e4m3_value(0x38) == 1.0 and e4m3_value(0x01) == 2.0**-9
    assert e4m3_encode(336.0) == 0x7A  # halfway between 320 and 352: even mantissa (320)
    assert e4m3_encode(-1.0) == 0xB8 and e4m3_encode(2.0**-10) == 0 and e4m3_encode(-0.0) == 0x80
    assert e4m3_encode(1e9) == 0x7E
    assert bf16_bits(1.0) == 0x3F80 and bf16_value(0xC000) == -2.0
    assert bf16_bits(1.0 + 2.0**-8) == 0x3F80 and bf16_bits(1.0 + 3 * 2.0**-8) == 0x3F82  # ties to even
    assert [scale_exponent(a) for a in (0.0, 448.0, 448.5, 224.0, 3.0e6)] == [-13, 0, 1, -1, 13]


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def random_rows(num_tokens: int, dtype=BF16, span: int | None = None) -> torch.Tensor:
    """kv rows whose 64-dim tiles (and RoPE part) have magnitudes 2^-span .. 2^span apart (span 20
    in bf16, 10 in fp16 unless given), so the scales vary; the first rows hold the edge cases of the
    scale rule (zero tiles, powers of two, the 1e-4 floor, near the dtype's max, subnormals, inf, NaN)."""
    span = span if span is not None else 20 if dtype == BF16 else 10
    mags = 2.0 ** torch.randint(-span, span + 1, (num_tokens, 8)).float()
    kv = torch.randn(num_tokens, 8, 64) * mags.unsqueeze(-1)
    kv = kv.reshape(num_tokens, 512)
    if num_tokens >= 4:
        kv[0, :64] = 0.0  # all zero: floor scale 2^-13
        kv[0, 64:128] = -0.0
        kv[0, 128:256] = torch.randn(128).clamp(-4.0, 4.0)
        kv[0, 128] = 448.0 * 2.0**5  # amax exactly 448 * 2^k: scale 2^k
        kv[0, 192] = 448.0 * 2.0**-3 * 1.01  # just above it: 2^-2
        kv[0, 256:320] = 1e-3  # under the 1e-4 floor: 2^-13, values ~8.2
        if dtype == BF16:
            kv[1, :64] = torch.linspace(-3.0e38, 3.0e38, 64)  # near bf16's max: scale 2^120
            kv[1, 64:128] = 1e-39  # subnormals
        else:
            kv[1, :64] = torch.linspace(-6.0e4, 6.0e4, 64)  # near fp16's max
            kv[1, 64:128] = 1e-7
        kv[2, 70] = math.inf
        kv[2, 200] = math.nan
        kv[3, 300] = -math.inf
    return kv.to(dtype)


def row_list(row: torch.Tensor) -> list[float]:
    return [float(x) for x in row.float()]


# ---------------------------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------------------------


def test_v4_constants_and_page_bytes():
    f = formats
    assert (f.V4_HEAD_DIM, f.V4_NOPE_DIM, f.V4_ROPE_DIM, f.V4_TILE, f.V4_NUM_TILES) == (512, 448, 64, 64, 7)
    assert (f.V4_DATA_BYTES, f.V4_SCALE_BYTES, f.V4_TOKEN_BYTES, f.V4_PAGE_ALIGN) == (576, 8, 584, 576)
    assert [f.v4_page_bytes(bs) for bs in (256, 64, 2, 1, 72, 0)] == [149760, 37440, 1728, 1152, 42048, 0]
    assert f.v4_row_width("auto") == 512 and f.v4_row_width("fp8_ds_mla") == 584
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        f.v4_row_width("fp8")


@pytest.mark.parametrize("block_size", [256, 64, 2, 1])
def test_token_offsets_and_page_views(block_size):
    assert formats.v4_token_offsets(block_size, 0) == (0, 576 * block_size)
    last = block_size - 1
    data_at, scale_at = formats.v4_token_offsets(block_size, last)
    assert (data_at, scale_at) == (576 * last, 576 * block_size + 8 * last)
    assert scale_at + 8 == 584 * block_size  # the scale part ends the page's used bytes
    with pytest.raises(ValueError, match="offset must be in"):
        formats.v4_token_offsets(block_size, block_size)
    cache = formats.empty_kv_cache_v4(3, block_size, "fp8_ds_mla")
    page = formats.v4_page_bytes(block_size)
    assert cache.shape == (3, block_size, 584) and cache.dtype == torch.uint8
    assert cache.stride()[0] == page and (block_size == 1 or cache.stride()[1] == 584)
    data, scales = formats.v4_page_views(cache)
    base = cache.data_ptr()
    for blk in range(3):
        for t in {0, block_size // 2, last}:
            d, s = formats.v4_token_offsets(block_size, t)
            assert data[blk, t].data_ptr() - base == blk * page + d and data[blk, t].numel() == 576
            assert scales[blk, t].data_ptr() - base == blk * page + s and scales[blk, t].numel() == 8
    auto = formats.empty_kv_cache_v4(3, block_size, "auto", torch.float16)
    assert auto.shape == (3, block_size, 512) and auto.dtype == torch.float16


# ---------------------------------------------------------------------------------------------
# Quantisation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_quantize_is_bit_exact(dtype):
    kv = random_rows(9, dtype)
    if dtype == torch.float16:
        kv[1, 450] = 1.0 + 2.0**-8 + 2.0**-10  # RoPE rounded to bf16: above the halfway point
        kv[1, 451] = 1.0 + 2.0**-8  # halfway: to even
    packed = reference.quantize_v4_rows(kv)
    assert packed.shape == (9, 584) and packed.dtype == torch.uint8
    for t in range(9):
        assert bytes(packed[t].tolist()) == pack_token(row_list(kv[t])), f"token {t}"
    assert packed[2, 64:128].eq(0x7F).all() and packed[2, 577] == 0xFF  # the inf tile
    assert packed[2, 192:256].eq(0x7F).all() and packed[2, 579] == 0xFF  # the NaN tile
    assert packed[0, 576:583].tolist()[:5] == [114, 114, 132, 125, 114]


def test_scale_rule_is_v3_rule_per_64_dims():
    amax = torch.cat([torch.rand(2000) * 2.0 ** torch.randint(-30, 30, (2000,)).float(),
                      torch.tensor([0.0, 448.0, 448.5, 224.0, 3.0e38, 1e-4 * 448])])
    b = reference.v4_scale_bytes(amax)
    assert torch.equal(torch.ldexp(torch.ones(amax.shape), b.int() - 127), reference.ds_mla_tile_scale(amax))
    assert reference.v4_scale_bytes(torch.tensor([math.inf, math.nan, -math.inf])).tolist() == [255] * 3


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_dequantize_error_bounds(dtype):
    kv = random_rows(64, dtype)
    kv[:4] = torch.randn(4, 512, dtype=dtype)  # no specials here
    packed = reference.quantize_v4_rows(kv)
    got = reference.dequantize_v4_rows(packed)
    assert got.dtype == torch.float32 and got.shape == (64, 512)
    # Against the by-hand decoding of the same bytes: exact.
    for t in (0, 17, 63):
        assert torch.equal(got[t].double(), decode_token(packed[t]))
    x = kv.float()
    scale = reference.ue8m0_to_float(packed[:, 576:583]).repeat_interleave(64, dim=1)  # [T, 448]
    err = (got[:, :448] - x[:, :448]).abs()
    # e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 of |x| for normals, 2^-10 of the scale below.
    assert bool((err <= torch.maximum(x[:, :448].abs() * 2.0**-4, scale * 2.0**-10)).all())
    assert bool((scale >= x[:, :448].abs().reshape(64, 7, 64).amax(-1).repeat_interleave(64, 1) / 448).all())
    assert torch.equal(got[:, 448:], x[:, 448:].to(BF16).float())  # RoPE: bf16 exactly


def test_dequantize_nan_tiles_and_max_range():
    packed = reference.quantize_v4_rows(random_rows(4))
    got = reference.dequantize_v4_rows(packed)
    assert torch.isnan(got[2, 64:128]).all() and torch.isnan(got[2, 192:256]).all()
    assert torch.isfinite(got[2, :64]).all() and torch.isfinite(got[2, 448:]).all()
    assert torch.isnan(got[3, 256:320]).all()
    assert torch.equal(got[0, :128], torch.zeros(128))  # zero tiles read back as zeros
    # At the top of bf16's range a dim can round up past fp32's: 248 * 2^120 -> 256 * 2^120 = inf
    top = torch.zeros(1, 512, dtype=BF16)
    top[0, 0], top[0, 1], top[0, 2] = 1.9375 * 2.0**127, 1.93 * 2.0**127, -(2 - 2**-7) * 2.0**127
    got_top = reference.dequantize_v4_rows(reference.quantize_v4_rows(top))[0, :3]
    assert got_top[0] == math.inf and got_top[2] == -math.inf and math.isfinite(got_top[1])
    # A row packed by hand reads back as its values
    row = [0.0] * 512
    row[5], row[64], row[447], row[448], row[511] = 1.5, -96.0, 2.0**-14, 3.0, -0.5
    assert torch.equal(reference.dequantize_v4_rows(torch.tensor(list(pack_token(row)), dtype=torch.uint8)),
                       torch.tensor(row))


# ---------------------------------------------------------------------------------------------
# Cache write
# ---------------------------------------------------------------------------------------------


def fp8_cache(num_blocks: int, block_size: int, fill: int, extra_pad: int = 0):
    """(cache view, its page storage [num_blocks, page]) with every byte ``fill``; pages padded to
    v4_page_bytes (plus ``extra_pad`` bytes, a multiple of 576)."""
    page = formats.v4_page_bytes(block_size) + extra_pad
    storage = torch.full((num_blocks, page), fill, dtype=torch.uint8)
    return storage[:, : block_size * 584].view(num_blocks, block_size, 584), storage


@pytest.mark.parametrize("block_size", [256, 64, 2])
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_cache_write_fp8_bytes(block_size, dtype):
    num_blocks = 3
    num_slots = num_blocks * block_size
    kv_base = random_rows(13, dtype)
    kv = torch.empty(13, 600, dtype=dtype)[:, 40:552]  # strided rows
    kv.copy_(kv_base)
    slots = torch.randperm(num_slots)[:6].tolist()  # distinct
    # padding, out-of-range slots; T' = 11 < T = 13: the last 2 tokens are CUDA-graph padding
    slot_mapping = torch.tensor(slots[:4] + [-1, num_slots, -7, num_slots + 3, 2**40] + slots[4:6])
    cache, storage = fp8_cache(num_blocks, block_size, 0xAB, extra_pad=576)
    before = storage.clone()
    reference.concat_and_cache_mla_v4(kv, cache, slot_mapping, "fp8_ds_mla")
    expected = before.clone().flatten()
    page = storage.shape[1]
    for t, s in enumerate(slot_mapping.tolist()):
        if not 0 <= s < num_slots:
            continue
        token = pack_token(row_list(kv[t]))
        d, sc = formats.v4_token_offsets(block_size, s % block_size)
        start = (s // block_size) * page
        expected[start + d: start + d + 576] = torch.tensor(list(token[:576]), dtype=torch.uint8)
        expected[start + sc: start + sc + 8] = torch.tensor(list(token[576:]), dtype=torch.uint8)
    assert torch.equal(storage.flatten(), expected)  # written tokens exact, every other byte untouched


@pytest.mark.parametrize("block_size", [256, 64, 2])
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_cache_write_auto_rows(block_size, dtype):
    kv = random_rows(7, dtype)
    cache = torch.full((2, block_size, 512), math.nan, dtype=dtype)
    num_slots = 2 * block_size
    slot_mapping = torch.tensor([num_slots - 1, -1, 0, num_slots, block_size])
    reference.concat_and_cache_mla_v4(kv, cache, slot_mapping, "auto")
    flat = cache.reshape(num_slots, 512)
    written = {}
    for t, s in enumerate(slot_mapping.tolist()):
        if 0 <= s < num_slots:
            written[s] = t
    for s in range(num_slots):
        if s in written:
            assert torch.equal(flat[s].view(torch.int16), kv[written[s]].view(torch.int16))  # bits (NaN too)
        else:
            assert torch.isnan(flat[s]).all()


def test_cache_write_checked_mode(monkeypatch):
    monkeypatch.delenv("MLA_EXT_CHECK_SLOTS", raising=False)
    kv = random_rows(3)
    cache, storage = fp8_cache(2, 4, 0)
    slot_mapping = torch.tensor([3, -1, 8])  # 8 == num_slots
    reference.concat_and_cache_mla_v4(kv, cache, slot_mapping, "fp8_ds_mla")  # skipped
    written = storage.clone()
    with pytest.raises(IndexError, match=r"concat_and_cache_mla_v4: slot_mapping\[2\] = 8 is outside the cache "
                                         r"\(2 blocks x 4 = 8 slots\); 1 of 3 entries"):
        reference.concat_and_cache_mla_v4(kv * 2, cache, slot_mapping, "fp8_ds_mla", checked=True)
    assert torch.equal(storage, written)  # nothing written before the raise
    monkeypatch.setenv("MLA_EXT_CHECK_SLOTS", "1")
    with pytest.raises(IndexError, match="outside the cache"):
        reference.concat_and_cache_mla_v4(kv, cache, slot_mapping, "fp8_ds_mla")
    reference.concat_and_cache_mla_v4(kv, cache, slot_mapping, "fp8_ds_mla", checked=False)
    reference.concat_and_cache_mla_v4(kv, cache, slot_mapping[:2], "fp8_ds_mla")  # in range: fine


# ---------------------------------------------------------------------------------------------
# Sparse decode
# ---------------------------------------------------------------------------------------------


class Pool:
    """A V4 cache of random rows, NaN in a ``poison_frac`` of its slots and in page padding, and a
    by-hand reader of its tokens."""

    def __init__(self, num_blocks: int, block_size: int, fmt: str, poison_frac: float = 0.3):
        self.fmt, self.block_size = fmt, block_size
        n = num_blocks * block_size
        kv = random_rows(n, span=2)  # scores of a few units: softmax weights spread over the keys
        kv[:4] = torch.randn(4, 512, dtype=BF16)  # random_rows' inf / NaN tiles stay out of valid rows
        self.poisoned = torch.rand(n) < poison_frac
        self.poisoned[0], self.poisoned[-1] = False, True  # at least one slot of each kind
        if fmt == "auto":
            self.cache = kv.clone().view(num_blocks, block_size, 512)
            self.cache.view(n, 512)[self.poisoned] = math.nan
        else:
            self.cache, self.storage = fp8_cache(num_blocks, block_size, 0xFF)  # padding: NaN bytes
            reference.concat_and_cache_mla_v4(kv, self.cache, torch.arange(n), "fp8_ds_mla")
            data, scales = formats.v4_page_views(self.cache)
            pb, po = self.poisoned.view(num_blocks, block_size).nonzero(as_tuple=True)
            data[pb, po] = 0xFF  # e4m3 NaN, bf16 NaN
            scales[pb, po] = 0xFF  # UE8M0 NaN
        self.good = torch.arange(n)[~self.poisoned]
        self.bad = torch.arange(n)[self.poisoned]
        self.num_slots = n

    def row(self, slot: int) -> torch.Tensor:
        """float64 [512] of a slot, read from the page by hand."""
        blk, off = divmod(slot, self.block_size)
        if self.fmt == "auto":
            return self.cache[blk, off].double()
        page = self.storage[blk]
        d, s = formats.v4_token_offsets(self.block_size, off)
        return decode_token(torch.cat([page[d: d + 576], page[s: s + 8]]))

    def indices(self, b: int, s_q: int, topk: int) -> torch.Tensor:
        """Valid slots with replacement (duplicates), mixed with -1, other negative and out-of-range
        entries (which must not be read: some of them would land on poisoned slots)."""
        idx = self.good[torch.randint(self.good.numel(), (b, s_q, topk))]
        r = torch.rand(b, s_q, topk)
        idx = torch.where(r < 0.06, torch.full_like(idx, -1), idx)
        idx = torch.where((r >= 0.06) & (r < 0.1), self.num_slots + idx % 5, idx)
        idx = torch.where((r >= 0.1) & (r < 0.13), torch.full_like(idx, -(2**31)), idx)
        if topk > 3:
            idx[..., 1] = 2**31 - 1
            idx[..., -1] = idx[..., 0]
        return idx.to(torch.int32)


def naive_decode(q, pools, lists, lengths, scale, sink):
    """Per query token, the valid entries of both lists in order, then softmax in float64."""
    b, s_q, h_q, _ = q.shape
    out = torch.zeros(b, s_q, h_q, 512, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), -math.inf, dtype=torch.float64)
    for i in range(b):
        for j in range(s_q):
            keys = []
            for pool, idx, length in zip(pools, lists, lengths):
                n = idx.shape[2] if length is None else max(0, min(int(length[i]), idx.shape[2]))
                keys += [pool.row(int(x)) for x in idx[i, j, :n] if 0 <= int(x) < pool.num_slots]
            if not keys:
                continue
            k = torch.stack(keys)  # [n, 512]
            s = q[i, j].double() @ k.T * scale  # [h_q, n]
            row_lse = torch.logsumexp(s, dim=-1)
            o = torch.softmax(s, dim=-1) @ k  # the value is the whole row
            if sink is not None:
                for h in range(h_q):
                    sk = float(sink[h])
                    o[h] *= 0.0 if sk == math.inf else 1.0 / (1.0 + math.exp(min(sk - float(row_lse[h]), 700.0)))
            out[i, j], lse[i, :, j] = o, row_lse
    return out, lse


CASES = {
    # name: (b, s_q, h_q, main (num_blocks, block_size, topk), extra or None, lengths, extra lengths, sink)
    "h1_sq1_main256": (3, 1, 1, (3, 256, 37), None, False, False, False),
    "h64_sq2_main256_extra64": (4, 2, 64, (3, 256, 37), (5, 64, 11), True, True, True),
    "h128_sq2_main64_extra2": (4, 2, 128, (4, 64, 20), (40, 2, 9), False, True, True),
    "h3_sq2_main2_extra256": (3, 2, 3, (30, 2, 6), (2, 256, 70), True, False, True),
}


@pytest.mark.parametrize("fmt", ["auto", "fp8_ds_mla"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_decode_matches_per_query_loop(fmt, case):
    b, s_q, h_q, main, extra, with_len, with_extra_len, with_sink = CASES[case]
    pool = Pool(main[0], main[1], fmt)
    idx = pool.indices(b, s_q, main[2])
    topk_length = torch.tensor([main[2] + 5, 4, 0, 1][:b], dtype=torch.int32) if with_len else None
    idx[1, 0, :] = -1  # request 1, token 0: nothing valid in the main list
    if topk_length is not None:  # entries past a length point at poisoned slots: never read
        idx[1, :, 4:] = pool.bad[0].to(torch.int32)
    pools, lists, lengths = [pool], [idx], [topk_length]
    kwargs = dict(topk_length=topk_length)
    if extra is not None:
        xpool = Pool(extra[0], extra[1], fmt)
        xidx = xpool.indices(b, s_q, extra[2])
        xlen = torch.tensor([0, extra[2], 2, extra[2] + 100][:b], dtype=torch.int32) if with_extra_len else None
        if xlen is not None:
            xidx[0, :, :] = xpool.bad[0].to(torch.int32)  # request 0 has extra length 0
        xidx[2, -1, :] = -1
        pools, lists, lengths = pools + [xpool], lists + [xidx], lengths + [xlen]
        kwargs.update(extra_kv_cache=xpool.cache, extra_indices=xidx, extra_topk_length=xlen)
    sink = None
    if with_sink:
        sink = torch.randn(h_q)
        sink[0] = math.inf
        if h_q > 1:
            sink[1] = -math.inf
        kwargs["attn_sink"] = sink
    q = torch.randn(b, s_q, h_q, 512, dtype=BF16)
    out, lse = reference.sparse_decode_mla_v4(q, pool.cache, idx, SOFTMAX_SCALE, fmt, **kwargs)
    ref_out, ref_lse = naive_decode(q, pools, lists, lengths, SOFTMAX_SCALE, sink)
    assert out.shape == (b, s_q, h_q, 512) and out.dtype == BF16
    assert lse.shape == (b, h_q, s_q) and lse.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert_close(lse, ref_lse, cos_tol=1e-9, atol=1e-4, rtol=1e-5, name="lse")
    assert_close(out, ref_out.to(BF16), cos_tol=1e-5, atol=1e-2, rtol=1e-2, name="out")
    empty = ref_lse == -math.inf  # [b, h_q, s_q]
    assert torch.equal(lse == -math.inf, empty)
    assert (out.permute(0, 2, 1, 3)[empty] == 0).all()


def _auto_pool(num_slots: int, block_size: int) -> torch.Tensor:
    return torch.randn(num_slots // block_size, block_size, 512, dtype=BF16)


def test_value_is_the_whole_row_and_pools_share_one_softmax():
    main = _auto_pool(16, 4)
    extra = main.reshape(8, 2, 512)  # the same rows, pages of 2: slot s is the same row in both
    q = torch.randn(2, 1, 5, 512, dtype=BF16)
    one = torch.tensor([[[6]], [[9]]], dtype=torch.int32)
    out, lse = reference.sparse_decode_mla_v4(q, main, one, 0.1, "auto")
    assert torch.equal(out[:, 0], main.reshape(16, 512)[[6, 9]].unsqueeze(1).expand(2, 5, 512))  # RoPE part too
    torch.testing.assert_close(lse[:, :, 0], (q[:, 0].float() @ main.reshape(16, 512)[[6, 9]].float().unsqueeze(-1))
                               .squeeze(-1) * 0.1, atol=1e-5, rtol=1e-6)
    # Splitting one list over the two pools, duplicates across them included, is one softmax.
    whole = torch.tensor([[[1, 5, 5, 14]], [[3, 3, 0, 7]]], dtype=torch.int32)
    out_w, lse_w = reference.sparse_decode_mla_v4(q, main, whole, 0.1, "auto")
    out_s, lse_s = reference.sparse_decode_mla_v4(q, main, whole[..., :2].contiguous(), 0.1, "auto",
                                                  extra_kv_cache=extra, extra_indices=whole[..., 2:].contiguous())
    torch.testing.assert_close(lse_s, lse_w, atol=1e-5, rtol=0)
    torch.testing.assert_close(out_s, out_w, atol=1e-2, rtol=1e-2)
    # Only the extra pool: main list all invalid, or its length 0.
    out_x, lse_x = reference.sparse_decode_mla_v4(
        q, main, torch.full((2, 1, 3), -1, dtype=torch.int32), 0.1, "auto", extra_kv_cache=extra,
        extra_indices=whole)
    out_l, lse_l = reference.sparse_decode_mla_v4(
        q, main, whole, 0.1, "auto", topk_length=torch.zeros(2, dtype=torch.int32), extra_kv_cache=extra,
        extra_indices=whole)
    for o, l_ in ((out_x, lse_x), (out_l, lse_l)):
        torch.testing.assert_close(l_, lse_w, atol=1e-5, rtol=0)
        torch.testing.assert_close(o, out_w, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("fmt", ["auto", "fp8_ds_mla"])
def test_nothing_valid_and_sinks(fmt):
    pool = Pool(2, 64, fmt, poison_frac=0.5)
    xpool = Pool(3, 2, fmt, poison_frac=0.5)
    q = torch.randn(3, 2, 4, 512, dtype=BF16)
    idx = pool.indices(3, 2, 8)
    xidx = xpool.indices(3, 2, 5)
    idx[0] = -1
    xidx[0] = -1  # request 0: all -1 in both
    idx[1, :, :] = pool.bad[0].to(torch.int32)
    xidx[1, :, :] = xpool.bad[0].to(torch.int32)  # request 1: lengths 0 (entries would read NaN)
    lengths = torch.tensor([8, 0, 8], dtype=torch.int32)
    xlengths = torch.tensor([5, 0, 5], dtype=torch.int32)
    sink = torch.tensor([math.inf, -math.inf, 0.5, -3.0])
    args = (q, pool.cache, idx, SOFTMAX_SCALE, fmt)
    kw = dict(topk_length=lengths, extra_kv_cache=xpool.cache, extra_indices=xidx, extra_topk_length=xlengths)
    out, lse = reference.sparse_decode_mla_v4(*args, **kw)
    out_s, lse_s = reference.sparse_decode_mla_v4(*args, attn_sink=sink, **kw)
    assert (out[:2] == 0).all() and (lse[:2] == -math.inf).all()
    assert (out_s[:2] == 0).all() and (lse_s[:2] == -math.inf).all()  # no NaN from sink -inf and lse -inf
    assert torch.equal(lse_s, lse)  # the sink leaves lse as it is
    assert (out_s[2, :, 0] == 0).all()  # +inf: out 0
    assert torch.equal(out_s[2, :, 1], out[2, :, 1])  # -inf: unchanged
    factor = torch.sigmoid(lse[2, 2:] - sink[2:, None]).T  # [s_q, 2]: e^lse / (e^lse + e^sink)
    torch.testing.assert_close(out_s[2, :, 2:].float(), (out[2, :, 2:].float() * factor[..., None]).to(BF16).float(),
                               atol=1e-2, rtol=1e-2)


def test_nan_in_a_valid_row_propagates_and_empty_pools():
    cache = formats.empty_kv_cache_v4(2, 4, "fp8_ds_mla")
    kv = random_rows(8)  # token 2 holds an inf and a NaN tile, token 3 a -inf one
    reference.concat_and_cache_mla_v4(kv, cache, torch.arange(8), "fp8_ds_mla")
    q = torch.randn(1, 2, 2, 512, dtype=BF16)
    idx = torch.tensor([[[2, 5]], [[5, 6]]], dtype=torch.int32).view(1, 2, 2)
    out, lse = reference.sparse_decode_mla_v4(q, cache, idx, 0.01, "fp8_ds_mla")
    assert torch.isnan(out[0, 0]).all() and torch.isnan(lse[0, :, 0]).all()
    assert not torch.isnan(out[0, 1]).any() and not torch.isnan(lse[0, :, 1]).any()
    out_s, _ = reference.sparse_decode_mla_v4(q, cache, idx, 0.01, "fp8_ds_mla",
                                              attn_sink=torch.tensor([math.inf, -math.inf]))
    assert torch.isnan(out_s[0, 0]).all()
    # An empty extra cache: its entries are all invalid; the main pool alone decides.
    empty = torch.empty(0, 2, 584, dtype=torch.uint8)
    out_e, lse_e = reference.sparse_decode_mla_v4(q, cache, idx, 0.01, "fp8_ds_mla", extra_kv_cache=empty,
                                                  extra_indices=torch.zeros(1, 2, 3, dtype=torch.int32))
    torch.testing.assert_close(lse_e, lse, atol=1e-5, rtol=1e-6, equal_nan=True)
    torch.testing.assert_close(out_e, out, atol=1e-2, rtol=1e-2, equal_nan=True)
    out_0, lse_0 = reference.sparse_decode_mla_v4(q, empty, idx, 0.01, "fp8_ds_mla")
    assert (out_0 == 0).all() and (lse_0 == -math.inf).all()


def test_decode_checked_mode(monkeypatch):
    monkeypatch.delenv("MLA_EXT_CHECK_SLOTS", raising=False)
    main, extra = _auto_pool(64, 16), _auto_pool(8, 2)
    q = torch.randn(2, 1, 3, 512, dtype=BF16)
    idx = torch.tensor([[[1, -1, 5, -(2**31)]], [[2, 3, 64, 70]]], dtype=torch.int32)  # 64, 70: past 64 slots
    xidx = torch.tensor([[[0, 8]], [[7, -1]]], dtype=torch.int32)  # 8: past 8 slots
    reference.sparse_decode_mla_v4(q, main, idx, 0.1, "auto", extra_kv_cache=extra, extra_indices=xidx)
    with pytest.raises(IndexError, match=r"sparse_decode_mla_v4: indices\[1, 0, 2\] = 64 is outside kv_cache "
                                         r"\(4 blocks x 16 = 64 slots\); 2 of 8 entries out of range"):
        reference.sparse_decode_mla_v4(q, main, idx, 0.1, "auto", checked=True)
    tl = torch.tensor([4, 2], dtype=torch.int32)  # positions past the length do not count
    got = reference.sparse_decode_mla_v4(q, main, idx, 0.1, "auto", tl, checked=True)
    assert torch.equal(got[1], reference.sparse_decode_mla_v4(q, main, idx, 0.1, "auto", tl)[1])
    with pytest.raises(IndexError, match=r"extra_indices\[0, 0, 1\] = 8 is outside extra_kv_cache "
                                         r"\(4 blocks x 2 = 8 slots\)"):
        reference.sparse_decode_mla_v4(q, main, idx, 0.1, "auto", tl, extra_kv_cache=extra, extra_indices=xidx,
                                       checked=True)
    reference.sparse_decode_mla_v4(q, main, idx, 0.1, "auto", tl, extra_kv_cache=extra, extra_indices=xidx,
                                   extra_topk_length=torch.tensor([1, 2], dtype=torch.int32), checked=True)
    monkeypatch.setenv("MLA_EXT_CHECK_SLOTS", "1")
    with pytest.raises(IndexError, match="is outside kv_cache"):
        reference.sparse_decode_mla_v4(q, main, idx, 0.1, "auto")
    reference.sparse_decode_mla_v4(q, main, idx, 0.1, "auto", checked=False)


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors naming the argument
# ---------------------------------------------------------------------------------------------


def write_args(device="cpu") -> dict:
    """A valid call of the V4 cache write (keyword arguments, in the op's order); the bad-input cases
    (WRITE_CASES, also run through the CUDA binding) build their tensors on its device."""
    return dict(kv=torch.randn(5, 512, dtype=BF16, device=device),
                kv_cache=formats.empty_kv_cache_v4(2, 64, "fp8_ds_mla", device=device).zero_(),
                slot_mapping=torch.arange(5, device=device), kv_cache_dtype="fp8_ds_mla")


def _d(a) -> torch.device:
    return (a["kv"] if "kv" in a else a["q"]).device


def _contiguous_fp8(a, num_blocks, block_size):
    return torch.zeros(num_blocks, block_size, 584, dtype=torch.uint8, device=_d(a))


WRITE_CASES = {
    "kv V3 width": (lambda a: dict(kv=torch.randn(5, 576, dtype=BF16, device=_d(a))),
                    r"kv must be \[num_tokens, 512\] \(DeepSeek-V4: 448 NoPE \+ 64 RoPE\), got \[5, 576\] "
                    r"\(rows of 576 are V3's"),
    "kv 3-D": (lambda a: dict(kv=a["kv"].view(5, 1, 512)), r"kv must be \[num_tokens, 512\]"),
    "kv dtype": (lambda a: dict(kv=a["kv"].float()), "kv must be bfloat16 or float16, got float32"),
    "kv last dim": (lambda a: dict(kv=torch.randn(512, 5, dtype=BF16, device=_d(a)).T),
                    "kv's last dim must be contiguous"),
    "slot_mapping int32": (lambda a: dict(slot_mapping=a["slot_mapping"].int()),
                           r"slot_mapping must be int64, got int32: convert once per step with "
                           r"slot_mapping.to\(torch.int64\)"),
    "slot_mapping too long": (lambda a: dict(slot_mapping=torch.arange(6, device=_d(a))),
                              "slot_mapping has 6 entries but kv only 5"),
    "format": (lambda a: dict(kv_cache_dtype="fp8"), r"kv_cache_dtype must be one of \('auto', 'fp8_ds_mla'\)"),
    "V3 ds_mla rows": (lambda a: dict(kv_cache=torch.zeros(2, 64, 656, dtype=torch.uint8, device=_d(a))),
                       r"needs kv_cache of DeepSeek-V4 tokens, \[num_blocks, block_size, 584\] bytes, got "
                       r"\[2, 64, 656\] \(656-byte rows are the V3.2 fp8_ds_mla layout\)"),
    "fp8 cache dtype": (lambda a: dict(kv_cache=a["kv_cache"].view(torch.float8_e4m3fn)),
                        "kv_cache must be uint8 for kv_cache_dtype='fp8_ds_mla', got float8_e4m3fn"),
    "page not 576-aligned": (lambda a: dict(kv_cache=_contiguous_fp8(a, 2, 256)),
                             r"kv_cache's page stride must be a multiple of 576 bytes and at least 584 x block_size "
                             r"= 149504 \(.* pads each page to 149760 bytes for block_size 256\), got 149504; "
                             r"allocate the cache with mla_ext.formats.empty_kv_cache_v4"),
    "pages overlap": (lambda a: dict(kv_cache=torch.zeros(2 * 584 * 64, dtype=torch.uint8, device=_d(a)).as_strided(
        (2, 64, 584), (576 * 64, 584, 1))), "page stride must be .* got 36864"),
    "tokens not 584 apart": (lambda a: dict(kv_cache=torch.zeros(2, 64, 600, dtype=torch.uint8,
                                                                 device=_d(a))[..., :584]),
                             r"pages must each be one contiguous run of block_size \* 584 bytes"),
    "auto cache dtype": (lambda a: dict(kv_cache_dtype="auto",
                                        kv_cache=torch.zeros(2, 64, 512, dtype=torch.float16, device=_d(a))),
                         "kv_cache_dtype='auto' needs kv_cache of kv's dtype bfloat16, got float16"),
    "auto on fp8 cache": (lambda a: dict(kv_cache_dtype="auto"),
                          "got uint8: a uint8 cache of 584-byte tokens is fp8_ds_mla"),
    "auto V3 rows": (lambda a: dict(kv_cache_dtype="auto",
                                    kv_cache=torch.zeros(2, 64, 576, dtype=BF16, device=_d(a))),
                     r"needs kv_cache rows of 512 elements .* \(rows of 576 are the V3 latent layout\)"),
    "device": (lambda a: dict(slot_mapping=a["slot_mapping"].to("cpu" if _d(a).type == "cuda" else "meta")),
               r"all tensors must be on one device: kv is on (cpu|cuda:\d), slot_mapping is on (meta|cpu)"),
}


@pytest.mark.parametrize("case", sorted(WRITE_CASES))
def test_cache_write_bad_input(case):
    args = write_args()
    args.update(WRITE_CASES[case][0](args))
    before = args["kv_cache"].clone()
    with pytest.raises(MlaInputError, match=WRITE_CASES[case][1]) as error:
        reference.concat_and_cache_mla_v4(**args)
    assert str(error.value).startswith("mla_ext.concat_and_cache_mla_v4: ")
    assert torch.equal(args["kv_cache"], before)


def decode_args(device="cpu") -> dict:
    """A valid call of the V4 decode (keyword arguments, in the op's order) on ``device``."""
    return dict(q=torch.randn(2, 2, 4, 512, dtype=BF16, device=device),
                kv_cache=formats.empty_kv_cache_v4(2, 64, "fp8_ds_mla", device=device).zero_(),
                indices=torch.zeros(2, 2, 8, dtype=torch.int32, device=device), softmax_scale=0.1,
                kv_cache_dtype="fp8_ds_mla", topk_length=None, attn_sink=None,
                extra_kv_cache=formats.empty_kv_cache_v4(3, 2, "fp8_ds_mla", device=device).zero_(),
                extra_indices=torch.zeros(2, 2, 3, dtype=torch.int32, device=device), extra_topk_length=None)


DECODE_CASES = {
    "q V3 width": (lambda a: dict(q=torch.randn(2, 2, 4, 576, dtype=BF16, device=_d(a))),
                   r"q must be \[b, s_q, h_q, 512\] \(DeepSeek-V4: 448 NoPE \+ 64 RoPE\), got \[2, 2, 4, 576\] "
                   r"\(a 576-wide q is V3's latent query"),
    "q fp16": (lambda a: dict(q=a["q"].half()),
               r"q must be bfloat16, got float16 \(the sparse decode kernels take bfloat16 activations only"),
    "q last dim": (lambda a: dict(q=torch.randn(2, 2, 512, 4, dtype=BF16, device=_d(a)).transpose(2, 3)),
                   "q's last dim must be contiguous"),
    "s_q": (lambda a: dict(q=torch.randn(2, 17, 4, 512, dtype=BF16, device=_d(a))), "s_q must be 1..16, got 17"),
    "softmax_scale": (lambda a: dict(softmax_scale=torch.tensor(0.1)), "softmax_scale must be a float, got Tensor"),
    "format": (lambda a: dict(kv_cache_dtype="fp8_e4m3"), "kv_cache_dtype must be one of"),
    "cache V3 rows": (lambda a: dict(kv_cache=torch.zeros(2, 64, 656, dtype=torch.uint8, device=_d(a))),
                      r"kv_cache of DeepSeek-V4 tokens.*got \[2, 64, 656\]"),
    "cache page": (lambda a: dict(kv_cache=_contiguous_fp8(a, 2, 64)),
                   r"kv_cache's page stride must be a multiple of 576"),
    "extra cache page": (lambda a: dict(extra_kv_cache=_contiguous_fp8(a, 3, 2)),
                         r"extra_kv_cache's page stride must be a multiple of 576 .* got 1168"),
    "auto fp16 cache": (lambda a: dict(kv_cache_dtype="auto",
                                       kv_cache=torch.zeros(2, 64, 512, dtype=torch.float16, device=_d(a))),
                        "needs kv_cache of q's dtype bfloat16, got float16"),
    "extra cache other format": (lambda a: dict(kv_cache_dtype="auto",
                                                kv_cache=torch.zeros(2, 64, 512, dtype=BF16, device=_d(a))),
                                 "needs extra_kv_cache of q's dtype bfloat16, got uint8"),
    "indices int64": (lambda a: dict(indices=a["indices"].long()),
                      r"indices must be int32, got int64: convert once per step with indices.to\(torch.int32\)"),
    "indices shape": (lambda a: dict(indices=a["indices"][:1]),
                      r"indices must be \[b, s_q, topk\] = \[2, 2, topk >= 1\]"),
    "indices empty": (lambda a: dict(indices=a["indices"][..., :0]), r"indices must be \[b, s_q, topk\]"),
    "topk_length int64": (lambda a: dict(topk_length=torch.zeros(2, dtype=torch.int64, device=_d(a))),
                          r"topk_length must be int32, got int64: convert"),
    "topk_length shape": (lambda a: dict(topk_length=torch.zeros(3, dtype=torch.int32, device=_d(a))),
                          r"topk_length must be int32 \[b\] = \[2\], got \[3\]"),
    "attn_sink": (lambda a: dict(attn_sink=torch.zeros(4, dtype=BF16, device=_d(a))),
                  r"attn_sink must be float32 \[h_q\] = \[4\], got bfloat16 \[4\]"),
    "extra_indices int64": (lambda a: dict(extra_indices=a["extra_indices"].long()),
                            r"extra_indices must be int32, got int64: convert once per step with "
                            r"extra_indices.to\(torch.int32\)"),
    "extra_indices shape": (lambda a: dict(extra_indices=torch.zeros(2, 1, 3, dtype=torch.int32, device=_d(a))),
                            r"extra_indices must be \[b, s_q, topk\] = \[2, 2, topk >= 1\], got \[2, 1, 3\]"),
    "extra_topk_length shape": (lambda a: dict(extra_topk_length=torch.zeros(2, 1, dtype=torch.int32, device=_d(a))),
                                r"extra_topk_length must be int32 \[b\] = \[2\]"),
    "extra cache without list": (lambda a: dict(extra_indices=None), "extra_kv_cache needs extra_indices"),
    "list without extra cache": (lambda a: dict(extra_kv_cache=None), "extra_indices given without extra_kv_cache"),
    "length without extra cache": (lambda a: dict(extra_kv_cache=None, extra_indices=None,
                                                  extra_topk_length=torch.zeros(2, dtype=torch.int32, device=_d(a))),
                                   "extra_topk_length given without extra_kv_cache"),
    "device": (lambda a: dict(extra_indices=a["extra_indices"].to("cpu" if _d(a).type == "cuda" else "meta")),
               r"all tensors must be on one device: q is on (cpu|cuda:\d), extra_indices is on (meta|cpu)"),
}


@pytest.mark.parametrize("case", sorted(DECODE_CASES))
def test_decode_bad_input(case):
    args = decode_args()
    reference.sparse_decode_mla_v4(**args)  # the valid call runs
    args.update(DECODE_CASES[case][0](args))
    with pytest.raises(MlaInputError, match=DECODE_CASES[case][1]) as error:
        reference.sparse_decode_mla_v4(**args)
    assert str(error.value).startswith("mla_ext.sparse_decode_mla_v4: ")


def test_errors_are_value_and_runtime_errors():
    assert issubclass(MlaInputError, ValueError) and issubclass(MlaInputError, RuntimeError)
