"""Bad inputs of every op, shared by the CPU tests and the GPU tests.

Each case changes one argument of a valid call and gives the message (a regex) to expect. On the
CPU the reference path raises it (mla_ext.MlaInputError); on CUDA the C++ binding does (a
RuntimeError, of which MlaInputError is a subclass), since the wrappers no longer check: the two
validators must say the same thing. Cases build their tensors on the device of the valid call.
"""

from __future__ import annotations

import torch

import mla_ext
from mla_ext.bench.decode import make_inputs

BF16 = torch.bfloat16


def other_device(device: torch.device) -> str:
    """A device that does not match: CPU for CUDA inputs; meta for CPU inputs (the op then runs
    its fake, which validates like the CPU implementation)."""
    return "cpu" if device.type == "cuda" else "meta"


# ---- decode_mla -------------------------------------------------------------------------------


def decode_inputs(device) -> dict:
    """A valid call: b 2, s_q 1, h_q 4, block size 16, bf16 'auto' cache (run it with run_op)."""
    return make_inputs([5, 40], 1, 4, 16, "auto", device=device)


def _u8(i, *shape):
    return torch.zeros(*shape, dtype=torch.uint8, device=i["q"].device)


DECODE_CASES = {
    "q row": (lambda i: dict(q=i["q"][..., :512]), r"q must be \[b, s_q, h_q, 576\]"),
    "q dtype": (lambda i: dict(q=i["q"].float()), "q must be bfloat16 or float16, got float32"),
    "s_q": (lambda i: dict(q=torch.randn(2, 17, 4, 576, dtype=BF16, device=i["q"].device)),
            r"s_q \(q.shape\[1\]\) must be in \[1, 16\], got 17"),
    "q vs cache dtype": (lambda i: dict(q=i["q"].half()),
                         "kv_cache_dtype='auto' needs a kv_cache of q's dtype float16"),
    "cache row": (lambda i: dict(kv_cache=i["kv_cache"][..., :512]), "rows of 576 elements"),
    "cache not uint8": (lambda i: dict(kv_cache_dtype="fp8_ds_mla"), "kv_cache must be uint8"),
    "cache last dim": (lambda i: dict(kv_cache=i["kv_cache"].transpose(1, 2)),
                       "kv_cache's last dim must be contiguous|rows of 576"),
    "ds_mla row": (lambda i: dict(kv_cache=_u8(i, 4, 16, 576), kv_cache_dtype="fp8_ds_mla"), "rows of 656 bytes"),
    "fp8 row": (lambda i: dict(kv_cache=_u8(i, 4, 16, 656), kv_cache_dtype="fp8"), "rows of 576 bytes"),
    "fp8 scale": (lambda i: dict(kv_cache=_u8(i, 4, 16, 576), kv_cache_dtype="fp8"), "needs scale"),
    "auto on ds_mla cache": (lambda i: dict(kv_cache=_u8(i, 4, 16, 656)),
                             "got uint8: a uint8 cache of 656-byte rows is fp8_ds_mla, "
                             "pass kv_cache_dtype='fp8_ds_mla'"),
    "format name": (lambda i: dict(kv_cache_dtype="int4"), "kv_cache_dtype must be one of"),
    "block_table int64": (lambda i: dict(block_table=i["block_table"].long()),
                          r"block_table must be int32, got int64: convert once per step with "
                          r"block_table.to\(torch.int32\)"),
    "block_table rows": (lambda i: dict(block_table=i["block_table"][:1]), r"block_table must be \[b=2"),
    "seq_lens int64": (lambda i: dict(seq_lens=i["seq_lens"].long()),
                       r"seq_lens must be int32, got int64: convert once per step with seq_lens.to\(torch.int32\)"),
    "seq_lens rows": (lambda i: dict(seq_lens=i["seq_lens"][:1]), r"seq_lens must be \[b=2\]"),
    "device": (lambda i: dict(block_table=i["block_table"].to(other_device(i["q"].device))),
               "all tensors must be on one device: .* is on"),
}


# ---- sparse_decode_mla ------------------------------------------------------------------------


def sparse_args(device) -> dict:
    """A valid call of mla_ext.sparse_decode_mla (keyword arguments)."""
    return dict(q=torch.randn(1, 1, 4, 576, dtype=BF16, device=device),
                kv_cache=torch.zeros(4, 16, 656, dtype=torch.uint8, device=device),
                indices=torch.zeros(1, 1, 8, dtype=torch.int32, device=device), softmax_scale=0.1,
                kv_cache_dtype="fp8_ds_mla", topk_length=None, attn_sink=None)


def _on(a, t):
    return t.to(a["q"].device)


SPARSE_CASES = {
    "q dtype": (lambda a: dict(q=a["q"].float()), "q must be bfloat16, got float32"),
    "q fp16": (lambda a: dict(q=a["q"].half()),
               r"q must be bfloat16, got float16 \(the sparse decode kernels take bfloat16 activations only: "
               r"convert with q.to\(torch.bfloat16\)\)"),
    "q row": (lambda a: dict(q=_on(a, torch.randn(1, 1, 4, 512, dtype=BF16))), r"q must be \[b, s_q, h_q, 576\]"),
    "s_q": (lambda a: dict(q=_on(a, torch.randn(1, 17, 4, 576, dtype=BF16))), r"s_q must be 1\.\.16"),
    "indices int64": (lambda a: dict(indices=a["indices"].long()),
                      r"indices must be int32, got int64: convert once per step with indices.to\(torch.int32\)"),
    "indices shape": (lambda a: dict(indices=_on(a, torch.zeros(2, 1, 8, dtype=torch.int32))),
                      r"indices must be \[b, s_q, topk\]"),
    "format fp8": (lambda a: dict(kv_cache_dtype="fp8"), r"'auto' \(bf16\) or 'fp8_ds_mla'"),
    "format name": (lambda a: dict(kv_cache_dtype="bf16"), "kv_cache_dtype must be one of"),
    "cache row": (lambda a: dict(kv_cache=_on(a, torch.zeros(4, 16, 576, dtype=torch.uint8))),
                  "needs rows of 656 bytes"),
    "auto on ds_mla cache": (lambda a: dict(kv_cache_dtype="auto"),
                             "kv_cache_dtype='auto' needs a kv_cache of q's dtype bfloat16, got uint8: a uint8 "
                             "cache of 656-byte rows is fp8_ds_mla, pass kv_cache_dtype='fp8_ds_mla'"),
    "topk_length shape": (lambda a: dict(topk_length=_on(a, torch.zeros(3, dtype=torch.int32))),
                          r"topk_length must be int32 \[b\]"),
    "topk_length int64": (lambda a: dict(topk_length=_on(a, torch.zeros(1, dtype=torch.int64))),
                          r"topk_length must be int32, got int64: convert once per step"),
    "attn_sink dtype": (lambda a: dict(attn_sink=_on(a, torch.zeros(4, dtype=torch.float64))),
                        "attn_sink must be float32"),
    "attn_sink shape": (lambda a: dict(attn_sink=_on(a, torch.zeros(5))), r"attn_sink must be float32 \[h_q\]"),
    "device": (lambda a: dict(indices=a["indices"].to(other_device(a["q"].device))),
               "all tensors must be on one device: .* is on"),
}


# ---- concat_and_cache_mla ---------------------------------------------------------------------


def cache_write_args(device, fmt="auto") -> dict:
    """A valid call of concat_and_cache_mla (keyword arguments, in the op's order)."""
    return dict(kv_c=torch.randn(4, 512, dtype=BF16, device=device), k_pe=torch.randn(4, 64, dtype=BF16, device=device),
                kv_cache=mla_ext.empty_kv_cache(2, 4, fmt, device=device).zero_(),
                slot_mapping=torch.tensor([0, 1, 2, 3], device=device), kv_cache_dtype=fmt)


def _dev(a):
    return a["kv_c"].device


CACHE_WRITE_CASES = {
    "kv_c dtype": (lambda a: a.update(kv_c=a["kv_c"].float()), "kv_c must be bfloat16 or float16"),
    "kv_c last dim": (lambda a: a.update(kv_c=torch.randn(4, 576, dtype=BF16, device=_dev(a))),
                      r"kv_c must be \[num_tokens, 512\]"),
    "k_pe last dim": (lambda a: a.update(k_pe=torch.randn(4, 32, dtype=BF16, device=_dev(a))),
                      r"k_pe must be \[num_tokens, 64\]"),
    "k_pe dtype": (lambda a: a.update(k_pe=a["k_pe"].half()), "k_pe must have kv_c's dtype"),
    "lengths": (lambda a: a.update(k_pe=torch.randn(3, 64, dtype=BF16, device=_dev(a))), "same number of tokens"),
    "slot dtype": (lambda a: a.update(slot_mapping=a["slot_mapping"].int()),
                   r"slot_mapping must be int64, got int32: convert once per step with slot_mapping.to\(torch.int64\)"),
    "slot longer": (lambda a: a.update(slot_mapping=torch.arange(5, device=_dev(a))),
                    "slot_mapping has 5 entries but kv_c only 4"),
    "slot 2-D": (lambda a: a.update(slot_mapping=a["slot_mapping"].reshape(2, 2)), "slot_mapping must be 1-D"),
    "non-contiguous last dim": (lambda a: a.update(kv_c=torch.randn(4, 1024, dtype=BF16, device=_dev(a))[:, ::2]),
                                "kv_c's last dim must be contiguous"),
    "cache dtype": (lambda a: a.update(kv_cache=a["kv_cache"].half()),
                    "kv_cache_dtype='auto' needs a kv_cache of kv_c's dtype"),
    "cache row": (lambda a: a.update(kv_cache=torch.zeros(2, 4, 656, dtype=BF16, device=_dev(a))),
                  "rows of 576 elements"),
    "format name": (lambda a: a.update(kv_cache_dtype="fp8_e5m2"), "kv_cache_dtype must be one of"),
    "ds_mla row": (lambda a: a.update(kv_cache=torch.zeros(2, 4, 576, dtype=torch.uint8, device=_dev(a)),
                                      kv_cache_dtype="fp8_ds_mla"), "rows of 656 bytes"),
    "fp8 without scale": (lambda a: a.update(kv_cache=torch.zeros(2, 4, 576, dtype=torch.uint8, device=_dev(a)),
                                             kv_cache_dtype="fp8"), "needs scale"),
    "fp8 scale dtype": (lambda a: a.update(kv_cache=torch.zeros(2, 4, 576, dtype=torch.uint8, device=_dev(a)),
                                           kv_cache_dtype="fp8",
                                           scale=torch.tensor([1.0], dtype=torch.float64, device=_dev(a))),
                        "scale must be a float32 tensor"),
    "cache 2-D": (lambda a: a.update(kv_cache=torch.zeros(8, 576, dtype=BF16, device=_dev(a))), "kv_cache must be"),
    "auto on fp8 cache": (lambda a: a.update(kv_cache=torch.zeros(2, 4, 576, dtype=torch.uint8, device=_dev(a))),
                          "an 8-bit cache of 576-byte rows is fp8, pass kv_cache_dtype='fp8' and its scale"),
    "device": (lambda a: a.update(kv_c=a["kv_c"].to(other_device(_dev(a)))), "all tensors must be on one device"),
}


# ---- q_absorb / v_up --------------------------------------------------------------------------

P, L, R, V = 128, 512, 64, 128


def absorb_weights(h: int, device) -> mla_ext.AbsorbWeights:
    return mla_ext.prepare_absorb_weights((torch.randn(h * (P + V), L, device=device) / 22).to(BF16), h)


def q_absorb_cases(device):
    """(name, call, message): calls of mla_ext.q_absorb with one bad argument (H = 2, T = 3)."""
    w, w3 = absorb_weights(2, device), absorb_weights(3, device)
    q = torch.randn(3, 2, P + R, dtype=BF16, device=device)
    qa = mla_ext.q_absorb
    return [
        ("q_nope dim", lambda: qa(q[..., :96], q[..., P:], *w.uk()), r"q_nope must be \[num_tokens, num_heads, 128\]"),
        ("q_pe shape", lambda: qa(q[..., :P], q[..., P:P + 32], *w.uk()), r"q_pe must be \[3, 2, 64\]"),
        ("w_uk_t heads", lambda: qa(q[..., :P], q[..., P:], w3.w_uk_t), r"w_uk_t must be \[2, 128, 512\]"),
        ("q_nope float32", lambda: qa(q[..., :P].float(), q[..., P:].float(), *w.uk()),
         "q_nope must be bfloat16, got float32"),
        ("q_nope float16", lambda: qa(q[..., :P].half(), q[..., P:].half(), *w.uk()),
         r"q_nope must be bfloat16, got float16 \(the absorb kernels take bfloat16 activations only: "
         r"convert with q_nope.to\(torch.bfloat16\)\)"),
        ("fp8 without scale", lambda: qa(q[..., :P], q[..., P:], w.w_uk_t.to(torch.float8_e4m3fn)),
         "needs w_uk_t_scale"),
        ("out shape", lambda: qa(q[..., :P], q[..., P:], *w.uk(),
                                 out=torch.empty(3, 2, 512, dtype=BF16, device=device)),
         r"out must be \[3, 2, 576\]"),
        ("out expanded", lambda: qa(q[..., :P], q[..., P:], *w.uk(),
                                    out=torch.empty(1, 2, 576, dtype=BF16, device=device).expand(3, 2, 576)),
         "out must not have zero strides"),
        ("device", lambda: qa(q[..., :P], q[..., P:], w.w_uk_t.to(other_device(q.device))),
         "all tensors must be on one device"),
    ]


def v_up_cases(device):
    """(name, call, message): calls of mla_ext.v_up with one bad argument (H = 2, T = 3)."""
    w, w4 = absorb_weights(2, device), absorb_weights(4, device)
    x = torch.randn(3, 2, L, dtype=BF16, device=device)
    vu = mla_ext.v_up
    return [
        ("x dim", lambda: vu(x[..., :256], *w.uv()), r"x must be \[num_tokens, num_heads, 512\]"),
        ("x float16", lambda: vu(x.half(), *w.uv()),
         r"x must be bfloat16, got float16 \(the absorb kernels take bfloat16 activations only"),
        ("w_uv strides", lambda: vu(x, w.w_uv.contiguous()), r"w_uv must have strides \(65536, 1, 512\)"),
        ("w_uv heads", lambda: vu(x, w4.w_uv), r"w_uv must be \[2, 512, 128\]"),
        ("w_uv_scale", lambda: vu(x, w.w_uv.to(torch.float8_e4m3fn), torch.ones(2, 3, device=device)),
         r"w_uv_scale must be a contiguous \[2, 4\] float32"),
        ("mergeable", lambda: vu(torch.randn(3, 4, 2, L, dtype=BF16, device=device).transpose(0, 1), *w.uv()),
         "mergeable"),
        ("out strided", lambda: vu(x, *w.uv(), out=torch.empty(2, 3, V, dtype=BF16, device=device).transpose(0, 1)),
         "out must be contiguous"),
        ("device", lambda: vu(x, *w.uv(), out=torch.empty(3, 2, V, dtype=BF16, device=other_device(x.device))),
         "all tensors must be on one device"),
    ]
