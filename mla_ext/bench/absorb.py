"""Absorbed projections (q_absorb, v_up): self-check and benchmark against what an engine writes
in PyTorch: ``torch.bmm`` + ``torch.cat`` (vLLM's q path), ``torch.bmm`` (v path), and for fp8
checkpoints dequantise-then-bmm."""

from __future__ import annotations

import math

import torch

from .. import reference
from ..absorb import AbsorbWeights, prepare_absorb_weights, q_absorb, v_up
from .harness import Roofline, Row, Timer

NAME = "absorb"
P, V, L, R = 128, 128, 512, 64
TOKENS = (1, 16, 64, 128, 256, 8192)
HEADS = (16, 128)


def _weights(h: int, device) -> AbsorbWeights:
    """Synthetic fp8 checkpoint (e4m3 + 128x128 block scales); prepare keeps both precisions."""
    w8 = (torch.randn(h * (P + V), L, device=device) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    scales = torch.rand(h * (P + V) // 128, L // 128, device=device) * 2e-3 + 1e-4
    return prepare_absorb_weights(w8, h, scales)


def _dequant(w8: torch.Tensor, scale: torch.Tensor, latent_dim: int) -> torch.Tensor:
    """What an engine does per call without an fp8 kernel: expand the block scales, multiply,
    round to bf16 (latent_dim = the dim of w8 that the 4 scales run along)."""
    s = scale.repeat_interleave(128, dim=1)
    s = s[:, None, :] if latent_dim == 2 else s[:, :, None]
    return (w8.float() * s).to(torch.bfloat16)


def self_check(device: str) -> str:
    """q_absorb and v_up, bf16 and fp8 weights, on two sizes, against the fp32 reference."""
    worst = 0.0
    for t, h in ((5, 16), (300, 8)):
        w = _weights(h, device)
        q = torch.randn(t, h, P + R, device=device, dtype=torch.bfloat16)
        x = torch.randn(t, h, L, device=device, dtype=torch.bfloat16)
        for fp8 in (False, True):
            got = q_absorb(q[..., :P], q[..., P:], *w.uk(fp8)).float()
            ref = reference.q_absorb(q[..., :P].float(), q[..., P:].float(), *w.uk(fp8))
            if not torch.equal(got[..., L:], ref[..., L:]):
                raise AssertionError(f"{NAME}: q_absorb did not copy q_pe exactly (T={t}, H={h}, fp8={fp8})")
            got_v = v_up(x, *w.uv(fp8)).float()
            ref_v = reference.v_up(x.float(), *w.uv(fp8))
            for name, a, b in (("q_absorb", got, ref), ("v_up", got_v, ref_v)):
                rel = ((a - b).norm() / b.norm()).item()
                if not rel < 1e-2:  # bf16 output rounding is ~2e-3 rms
                    raise AssertionError(f"{NAME}: {name} T={t} H={h} fp8={fp8}: relative error {rel:.3g}")
                worst = max(worst, rel)
    what = "kernels" if device != "cpu" else "CPU reference"
    return f"{what}: q_absorb and v_up (bf16 and fp8 weights) within rel. error {worst:.1e} of the fp32 reference"


def bench(timer: Timer, roofline: Roofline, quick: bool = False) -> list[Row]:
    rows: list[Row] = []
    tokens = (1, 64, 8192) if quick else TOKENS
    for h in HEADS:
        w = _weights(h, "cuda")
        w_uk_t, w_uv = w.w_uk_t, w.w_uv
        for t in tokens:
            q = torch.randn(t, h, P + R, device="cuda", dtype=torch.bfloat16)
            q_nope, q_pe = q[..., :P], q[..., P:]
            x = torch.randn(t, h, L, device="cuda", dtype=torch.bfloat16)
            flops = 2.0 * t * h * P * L
            q_act = t * h * (P + R + L + R) * 2  # q_nope, q_pe read; [T, H, 576] written
            v_act = t * h * (L + V) * 2
            w_bf16, w_fp8 = h * P * L * 2, h * P * L + h * 4 * 4

            def vllm_q(w_uk_t=w_uk_t):
                return torch.cat([torch.bmm(q_nope.transpose(0, 1), w_uk_t).transpose(0, 1), q_pe], dim=-1)

            def vllm_q_fp8():
                return vllm_q(_dequant(w.w_uk_t_fp8, w.w_uk_t_scale, 2))

            def vllm_v(w_uv=w_uv):
                return torch.bmm(x.transpose(0, 1), w_uv)  # [H, T, V]; o_proj would still need a transpose

            def vllm_v_fp8():
                return vllm_v(_dequant(w.w_uv_fp8, w.w_uv_scale, 1))

            cases = [
                ("q_absorb bf16", lambda: torch.ops.mla_ext.q_absorb(q_nope, q_pe, w_uk_t, None), q_act + w_bf16),
                ("torch bmm+cat bf16", vllm_q, q_act + w_bf16),
                ("q_absorb fp8", lambda: torch.ops.mla_ext.q_absorb(q_nope, q_pe, w.w_uk_t_fp8, w.w_uk_t_scale), q_act + w_fp8),
                ("torch dequant+bmm+cat fp8", vllm_q_fp8, q_act + w_fp8),
                ("v_up bf16", lambda: torch.ops.mla_ext.v_up(x, w_uv, None), v_act + w_bf16),
                ("torch bmm bf16", vllm_v, v_act + w_bf16),
                ("v_up fp8", lambda: torch.ops.mla_ext.v_up(x, w.w_uv_fp8, w.w_uv_scale), v_act + w_fp8),
                ("torch dequant+bmm fp8", vllm_v_fp8, v_act + w_fp8),
            ]
            timed = {}
            for label, fn, nbytes in cases:
                us = timer.time_us(fn, f"{NAME}.{label.replace(' ', '_')}.H{h}.T{t}")
                timed[label] = us
                rows.append(Row(f"{label} H={h} T={t}", us, bytes=nbytes, flops=flops, roofline=roofline))
            # speedup of each op over its PyTorch counterpart, in the JSON rows of the ops
            for ours, base in (("q_absorb bf16", "torch bmm+cat bf16"), ("q_absorb fp8", "torch dequant+bmm+cat fp8"),
                               ("v_up bf16", "torch bmm bf16"), ("v_up fp8", "torch dequant+bmm fp8")):
                row = next(r for r in rows if r.case == f"{ours} H={h} T={t}")
                row.extra["baseline"] = base
                row.extra["baseline_us"] = round(timed[base], 3)
                row.extra["speedup"] = round(timed[base] / timed[ours], 3) if timed[ours] > 0 else math.nan
            del q, x
    return rows


def bar_summary(rows: list[Row]) -> str:
    """The bar, checked on these rows: each op at least as fast as its PyTorch counterpart (v_up bf16:
    within 5% of torch.bmm); one line per op and a list of misses."""
    checks = {"q_absorb bf16": 1.0, "q_absorb fp8": 1.0, "v_up bf16": 1 / 1.05, "v_up fp8": 1.0}
    lines, misses = [], []
    for op, need in checks.items():
        mine = [r for r in rows if r.case.startswith(op + " ")]
        if not mine:
            continue
        worst = min(mine, key=lambda r: r.extra.get("speedup", 0))
        lines.append(f"- {op}: speedup over {worst.extra['baseline']} from {worst.extra['speedup']:.2f}x "
                     f"({worst.case}) to {max(r.extra['speedup'] for r in mine):.2f}x; need >= {need:.3f}x")
        misses += [f"{r.case}: {r.extra['speedup']:.3f}x" for r in mine if r.extra["speedup"] < need]
    lines.append("- bar met at every case" if not misses else "- MISSED: " + "; ".join(misses))
    return "\n".join(lines)
