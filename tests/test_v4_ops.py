"""The DeepSeek-V4 ops' CPU implementations (the reference) and fakes, through torch.ops: the
wrappers on CPU give the reference's results, on meta tensors the fakes' shapes, and refuse bad
input with the reference's messages."""

from __future__ import annotations

import pytest
import torch
from test_v4_reference import decode_args, random_rows, write_args

import mla_ext
from mla_ext import formats, reference

BF16 = torch.bfloat16


def test_cache_write_cpu_is_the_reference():
    cache = formats.empty_kv_cache_v4(3, 64, "fp8_ds_mla").zero_()
    expected = formats.empty_kv_cache_v4(3, 64, "fp8_ds_mla").zero_()
    kv = random_rows(9)
    slots = torch.tensor([5, -1, 130, 64, 191, 7, 2**40, 0, 9])
    mla_ext.concat_and_cache_mla_v4(kv, cache, slots, "fp8_ds_mla")
    reference.concat_and_cache_mla_v4(kv, expected, slots, "fp8_ds_mla")
    assert torch.equal(cache, expected)


def test_decode_cpu_is_the_reference():
    args = decode_args()
    args["indices"] = torch.randint(-1, 128, args["indices"].shape, dtype=torch.int32)
    args["extra_indices"] = torch.randint(-1, 6, args["extra_indices"].shape, dtype=torch.int32)
    out, lse = mla_ext.sparse_decode_mla_v4(**args)
    ref_out, ref_lse = reference.sparse_decode_mla_v4(**args)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_fakes():
    args = decode_args("meta")
    out, lse = mla_ext.sparse_decode_mla_v4(**args)
    assert out.device.type == "meta" and out.shape == (2, 2, 4, 512) and out.dtype == BF16
    assert lse.shape == (2, 4, 2) and lse.dtype == torch.float32
    mla_ext.concat_and_cache_mla_v4(**write_args("meta"))
    with pytest.raises(mla_ext.MlaInputError, match="kv must be bfloat16 or float16"):
        mla_ext.concat_and_cache_mla_v4(**dict(write_args("meta"), kv=torch.empty(5, 512, device="meta")))
