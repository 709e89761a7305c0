"""Absorbed projections: weight preparation from ``kv_b_proj``, ``q_absorb`` and ``v_up``.

The decode query of MLA lives in latent space: each head's ``q_nope`` is multiplied by
``W_UK_T[h]`` and concatenated with ``q_pe`` (``q_absorb``); the 512-wide latent attention output
goes back to the head dim through ``W_UV[h]`` (``v_up``). Both weights come from
``kv_b_proj.weight`` once, with :func:`prepare_absorb_weights` (DESIGN.md §1, §3).
"""

from __future__ import annotations

import dataclasses

import torch

from . import reference
from ._validate import bf16_only_hint, check, check_dtype, check_last_dim_contiguous, check_no_zero_strides
from ._validate import check_same_device
from .formats import KV_LORA_RANK, LATENT_DIM, ROPE_DIM

QK_NOPE_HEAD_DIM = reference.QK_NOPE_HEAD_DIM  # P
V_HEAD_DIM = reference.V_HEAD_DIM  # V
FP8_WEIGHT_BLOCK = reference.FP8_WEIGHT_BLOCK
NUM_L_BLOCKS = KV_LORA_RANK // FP8_WEIGHT_BLOCK  # 4 scales per head and weight
# Activations (q_nope, q_pe, x, out): bf16 only, as the kernels are (mma.sync / wgmma on bf16,
# fp8 weights dequantised to bf16); float16 is refused with a message saying so.
_ACT_DTYPES = (torch.bfloat16,)
_FP8 = torch.float8_e4m3fn


# --------------------------------------------------------------------------------------------
# Weight preparation
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AbsorbWeights:
    """Per-head weights of the absorbed projections, in the layouts the kernels read.

    Attributes
    ----------
    w_uk_t : Tensor ``[H, 128, 512]`` bfloat16, contiguous
        ``W_UK_T[h]``: ``q_lat = q_nope @ W_UK_T[h]``.
    w_uv : Tensor ``[H, 512, 128]`` bfloat16, strides ``(65536, 1, 512)``
        ``W_UV[h]``: ``out = o_lat @ W_UV[h]``. Stored as ``W_UV^T`` contiguous (each head's
        rows of ``kv_b_proj`` as they are), so ``w_uv.transpose(1, 2)`` is contiguous.
    w_uk_t_fp8, w_uv_fp8 : Tensor or None
        fp8 checkpoints only: the e4m3 weights with the same shapes and layouts.
    w_uk_t_scale, w_uv_scale : Tensor ``[H, 4]`` float32 or None
        fp8 checkpoints only: block scale of each 128-wide block of the 512 (latent) dim; the
        128-dim of each head is exactly one block of ``weight_scale_inv``.
    """

    w_uk_t: torch.Tensor
    w_uv: torch.Tensor
    w_uk_t_fp8: torch.Tensor | None = None
    w_uk_t_scale: torch.Tensor | None = None
    w_uv_fp8: torch.Tensor | None = None
    w_uv_scale: torch.Tensor | None = None

    @property
    def num_heads(self) -> int:
        return self.w_uk_t.shape[0]

    @property
    def has_fp8(self) -> bool:
        return self.w_uk_t_fp8 is not None

    def uk(self, fp8: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(w_uk_t, w_uk_t_scale)`` to pass to :func:`q_absorb` (fp8 ones if asked and present)."""
        check(not fp8 or self.has_fp8, "AbsorbWeights", "fp8 weights asked for, but these come from a bf16 checkpoint")
        return (self.w_uk_t_fp8, self.w_uk_t_scale) if fp8 else (self.w_uk_t, None)

    def uv(self, fp8: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(w_uv, w_uv_scale)`` to pass to :func:`v_up` (fp8 ones if asked and present)."""
        check(not fp8 or self.has_fp8, "AbsorbWeights", "fp8 weights asked for, but these come from a bf16 checkpoint")
        return (self.w_uv_fp8, self.w_uv_scale) if fp8 else (self.w_uv, None)


def prepare_absorb_weights(
    kv_b_weight: torch.Tensor,
    num_heads: int,
    weight_scale_inv: torch.Tensor | None = None,
    *,
    qk_nope_head_dim: int = QK_NOPE_HEAD_DIM,
    v_head_dim: int = V_HEAD_DIM,
) -> AbsorbWeights:
    """Split ``kv_b_proj.weight`` into the absorbed weights (one time, at model load).

    Parameters
    ----------
    kv_b_weight : Tensor ``[H * (P + V), 512]``
        bfloat16/float16/float32, or float8_e4m3fn (with ``weight_scale_inv``). Rows of head h:
        ``W_UK[h]`` (P rows) then ``W_UV[h]^T`` (V rows).
    num_heads : int
        H, the heads on this rank (TP splits: 128, 64, 32, 16, ...).
    weight_scale_inv : Tensor ``[H * (P + V) / 128, 4]`` float32, optional
        Block scales of an fp8 checkpoint: block (i, j) covers rows 128i.. and columns 128j..
    qk_nope_head_dim, v_head_dim : int
        P and V; the kernels support DeepSeek's 128 and 128.

    Returns
    -------
    AbsorbWeights
        bf16 ``w_uk_t``/``w_uv`` (for fp8: dequantise-then-split, rounded once to bf16), and for
        fp8 checkpoints also the e4m3 weights with their ``[H, 4]`` scales.

    Examples
    --------
    >>> import torch, mla_ext
    >>> kv_b = torch.randn(16 * 256, 512).div(22).to(torch.float8_e4m3fn)
    >>> scales = torch.rand(16 * 2, 4) / 100
    >>> w = mla_ext.prepare_absorb_weights(kv_b, 16, scales)
    >>> w.w_uk_t.shape, w.w_uv.shape, w.w_uv_scale.shape
    (torch.Size([16, 128, 512]), torch.Size([16, 512, 128]), torch.Size([16, 4]))
    """
    op = "prepare_absorb_weights"
    p, v = qk_nope_head_dim, v_head_dim
    check(p == QK_NOPE_HEAD_DIM and v == V_HEAD_DIM, op,
          f"the kernels support qk_nope_head_dim=v_head_dim=128 (DeepSeek V2/V3), got {p} and {v}")
    check(isinstance(num_heads, int) and num_heads >= 1, op, f"num_heads must be a positive int, got {num_heads!r}")
    rows = num_heads * (p + v)
    check(kv_b_weight.dim() == 2 and tuple(kv_b_weight.shape) == (rows, KV_LORA_RANK), op,
          f"kv_b_weight must be [num_heads * (P + V), {KV_LORA_RANK}] = [{rows}, {KV_LORA_RANK}] for "
          f"num_heads={num_heads}, got {list(kv_b_weight.shape)}")
    check_dtype(kv_b_weight, "kv_b_weight", (torch.bfloat16, torch.float16, torch.float32, _FP8), op)
    if kv_b_weight.dtype != _FP8:
        check(weight_scale_inv is None, op, f"weight_scale_inv is only for float8_e4m3fn weights, got {kv_b_weight.dtype}")
        w = kv_b_weight.to(torch.bfloat16).reshape(num_heads, p + v, KV_LORA_RANK)
        return AbsorbWeights(w_uk_t=w[:, :p].contiguous(), w_uv=w[:, p:].contiguous().transpose(1, 2))

    check(weight_scale_inv is not None, op, "float8_e4m3fn kv_b_weight needs weight_scale_inv (128x128 block scales)")
    check_same_device(op, kv_b_weight=kv_b_weight, weight_scale_inv=weight_scale_inv)
    check_dtype(weight_scale_inv, "weight_scale_inv", (torch.float32,), op)
    blocks = (rows // FP8_WEIGHT_BLOCK, NUM_L_BLOCKS)
    check(tuple(weight_scale_inv.shape) == blocks, op,
          f"weight_scale_inv must be [{blocks[0]}, {blocks[1]}] (one scale per 128x128 block of kv_b_weight), "
          f"got {list(weight_scale_inv.shape)}")
    # Reference semantics: dequantise the whole weight, then split (rounded once to bf16).
    w_uk_t, w_uv = reference.split_kv_b_proj(reference.dequantize_block_fp8(kv_b_weight, weight_scale_inv), num_heads, p, v)
    w8 = kv_b_weight.reshape(num_heads, p + v, KV_LORA_RANK)
    s = weight_scale_inv.reshape(num_heads, 2, NUM_L_BLOCKS)  # block row 2h: W_UK[h], 2h+1: W_UV[h]^T
    return AbsorbWeights(
        w_uk_t=w_uk_t.to(torch.bfloat16).contiguous(),
        w_uv=w_uv.to(torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2),
        w_uk_t_fp8=w8[:, :p].contiguous(),
        w_uk_t_scale=s[:, 0].contiguous(),
        w_uv_fp8=w8[:, p:].contiguous().transpose(1, 2),
        w_uv_scale=s[:, 1].contiguous(),
    )


# --------------------------------------------------------------------------------------------
# Validation of the CPU implementations and the fakes (on CUDA csrc/bindings/absorb.cpp checks
# the same, with the same messages)
# --------------------------------------------------------------------------------------------


def _check_weight(w, scale, name: str, shape: tuple[int, int, int], strides: tuple[int, int, int], op: str) -> None:
    check_dtype(w, name, (torch.bfloat16, _FP8), op)
    check(w.dim() == 3 and tuple(w.shape) == shape, op, f"{name} must be {list(shape)}, got {list(w.shape)}")
    # (the stride of a size-1 dim is irrelevant: H = 1 weights may keep kv_b_proj's head stride)
    check(all(st == want or size == 1 for st, want, size in zip(w.stride(), strides, w.shape)), op,
          f"{name} must have strides {strides} (the layout prepare_absorb_weights makes), got {tuple(w.stride())}")
    if w.dtype == _FP8:
        check(scale is not None, op, f"float8_e4m3fn {name} needs {name}_scale [H, {NUM_L_BLOCKS}] float32")
        check_dtype(scale, f"{name}_scale", (torch.float32,), op)
        check(tuple(scale.shape) == (shape[0], NUM_L_BLOCKS) and scale.is_contiguous(), op,
              f"{name}_scale must be a contiguous [{shape[0]}, {NUM_L_BLOCKS}] float32 tensor, got {list(scale.shape)}")
    else:
        check(scale is None, op, f"{name}_scale is only for float8_e4m3fn {name}, got {name} in {w.dtype}")


def _validate_q_absorb(q_nope, q_pe, w_uk_t, w_uk_t_scale, out=None) -> None:
    op = "q_absorb"
    check_same_device(op, q_nope=q_nope, q_pe=q_pe, w_uk_t=w_uk_t, w_uk_t_scale=w_uk_t_scale, out=out)
    check(q_nope.dim() == 3 and q_nope.shape[2] == QK_NOPE_HEAD_DIM, op,
          f"q_nope must be [num_tokens, num_heads, {QK_NOPE_HEAD_DIM}], got {list(q_nope.shape)}")
    t, h = q_nope.shape[0], q_nope.shape[1]
    check(tuple(q_pe.shape) == (t, h, ROPE_DIM), op, f"q_pe must be [{t}, {h}, {ROPE_DIM}] like q_nope, got {list(q_pe.shape)}")
    check_dtype(q_nope, "q_nope", _ACT_DTYPES, op, bf16_only_hint(q_nope, "q_nope", "absorb"))
    check(q_pe.dtype == q_nope.dtype, op, f"q_pe must have q_nope's dtype {q_nope.dtype}, got {q_pe.dtype}")
    check_last_dim_contiguous(q_nope, "q_nope", op)
    check_last_dim_contiguous(q_pe, "q_pe", op)
    L, P = KV_LORA_RANK, QK_NOPE_HEAD_DIM
    _check_weight(w_uk_t, w_uk_t_scale, "w_uk_t", (h, P, L), (P * L, L, 1), op)
    if out is not None:
        check(tuple(out.shape) == (t, h, LATENT_DIM), op, f"out must be [{t}, {h}, {LATENT_DIM}], got {list(out.shape)}")
        check(out.dtype == q_nope.dtype, op, f"out must have q_nope's dtype {q_nope.dtype}, got {out.dtype}")
        check_last_dim_contiguous(out, "out", op)
        check_no_zero_strides(out, "out", op)


def _validate_v_up(x, w_uv, w_uv_scale, out=None) -> None:
    op = "v_up"
    check_same_device(op, x=x, w_uv=w_uv, w_uv_scale=w_uv_scale, out=out)
    check(x.dim() in (3, 4) and x.shape[-1] == KV_LORA_RANK, op,
          f"x must be [num_tokens, num_heads, {KV_LORA_RANK}] or [b, s_q, num_heads, {KV_LORA_RANK}], got {list(x.shape)}")
    check_dtype(x, "x", _ACT_DTYPES, op, bf16_only_hint(x, "x", "absorb"))
    check_last_dim_contiguous(x, "x", op)
    if x.dim() == 4:
        check(x.shape[1] <= 1 or x.shape[0] <= 1 or x.stride(0) == x.shape[1] * x.stride(1), op,
              f"a 4-D x must have mergeable [b, s_q] dims (stride(0) == s_q * stride(1)), got strides {tuple(x.stride())}")
    h = x.shape[-2]
    L, V = KV_LORA_RANK, V_HEAD_DIM
    _check_weight(w_uv, w_uv_scale, "w_uv", (h, L, V), (L * V, 1, L), op)
    if out is not None:
        shape = (*x.shape[:-1], V)
        check(tuple(out.shape) == shape, op, f"out must be {list(shape)}, got {list(out.shape)}")
        check(out.dtype == x.dtype, op, f"out must have x's dtype {x.dtype}, got {out.dtype}")
        check(out.is_contiguous(), op, "out must be contiguous (so that view(T, H * 128) feeds o_proj)")


# --------------------------------------------------------------------------------------------
# Typed wrappers
# --------------------------------------------------------------------------------------------


def q_absorb(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    w_uk_t: torch.Tensor,
    w_uk_t_scale: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Latent decode query: ``q_nope x W_UK_T`` per head, with ``q_pe`` in the last 64 columns.

    Parameters
    ----------
    q_nope : Tensor ``[T, H, 128]`` bfloat16
        May be a strided view (e.g. ``q[..., :128]`` of a ``[T, H, 192]`` projection output);
        last dim contiguous. The kernels are bf16-only: float16 is refused.
    q_pe : Tensor ``[T, H, 64]`` bfloat16
        The roped part (e.g. ``q[..., 128:]``); last dim contiguous. Roped by the same function
        as the ``k_pe`` written to the cache (see :func:`concat_and_cache_mla`): attention
        scores ``q_pe . k_pe`` as given, so both must come out in one layout.
    w_uk_t : Tensor ``[H, 128, 512]`` contiguous, bfloat16 or float8_e4m3fn
        From :func:`prepare_absorb_weights` (``w.uk()`` or ``w.uk(fp8=True)``).
    w_uk_t_scale : Tensor ``[H, 4]`` float32, optional
        Block scales, required with fp8 ``w_uk_t``.
    out : Tensor ``[T, H, 576]`` bfloat16, optional
        Written in place and returned (last dim contiguous; rows may be strided).

    Returns
    -------
    Tensor ``[T, H, 576]``: ``[:, :, :512] = q_nope @ W_UK_T[h]``, ``[:, :, 512:] = q_pe``; the
    ``q`` that the decode ops take (as ``[b, s_q, H, 576]`` after a view).

    Views whose rows are not 16-byte aligned are copied first, and such an ``out`` is written
    through an aligned temporary (a slow path, in the op itself).

    Examples
    --------
    >>> import torch, mla_ext
    >>> w = mla_ext.prepare_absorb_weights(torch.randn(16 * 256, 512) / 22, 16)
    >>> q = torch.randn(3, 16, 192, dtype=torch.bfloat16)
    >>> mla_ext.q_absorb(q[..., :128], q[..., 128:], *w.uk()).shape
    torch.Size([3, 16, 576])
    """
    # The op validates (C++ on CUDA, _validate_q_absorb on CPU).
    if out is None:
        return _q_absorb_op(q_nope, q_pe, w_uk_t, w_uk_t_scale)
    _q_absorb_out_op(q_nope, q_pe, w_uk_t, w_uk_t_scale, out)
    return out


def v_up(
    x: torch.Tensor,
    w_uv: torch.Tensor,
    w_uv_scale: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Latent attention output back to the head dim: ``x x W_UV`` per head.

    Parameters
    ----------
    x : Tensor ``[T, H, 512]`` or ``[b, s_q, H, 512]`` bfloat16
        As the decode ops return it; rows may be strided (last dim contiguous). The kernels are
        bf16-only: float16 is refused.
    w_uv : Tensor ``[H, 512, 128]`` bfloat16 or float8_e4m3fn, strides ``(65536, 1, 512)``
        From :func:`prepare_absorb_weights` (``w.uv()`` or ``w.uv(fp8=True)``).
    w_uv_scale : Tensor ``[H, 4]`` float32, optional
        Block scales, required with fp8 ``w_uv``.
    out : Tensor ``[..., H, 128]`` bfloat16 contiguous, optional
        Written in place and returned (one not 16-byte aligned goes through an aligned temporary).

    Returns
    -------
    Tensor ``[..., H, 128]`` contiguous: ``out.view(T, H * 128)`` is o_proj's input.

    Examples
    --------
    >>> import torch, mla_ext
    >>> w = mla_ext.prepare_absorb_weights(torch.randn(16 * 256, 512) / 22, 16)
    >>> mla_ext.v_up(torch.randn(2, 1, 16, 512, dtype=torch.bfloat16), *w.uv()).shape
    torch.Size([2, 1, 16, 128])
    """
    # The op validates (C++ on CUDA, _validate_v_up on CPU).
    if out is None:
        return _v_up_op(x, w_uv, w_uv_scale)
    _v_up_out_op(x, w_uv, w_uv_scale, out)
    return out


_q_absorb_op = torch.ops.mla_ext.q_absorb.default
_q_absorb_out_op = torch.ops.mla_ext.q_absorb_out.default
_v_up_op = torch.ops.mla_ext.v_up.default
_v_up_out_op = torch.ops.mla_ext.v_up_out.default


# --------------------------------------------------------------------------------------------
# CPU implementation (the reference) and fakes
# --------------------------------------------------------------------------------------------


@torch.library.register_kernel("mla_ext::q_absorb", "cpu")
def _q_absorb_cpu(q_nope, q_pe, w_uk_t, w_uk_t_scale=None):
    _validate_q_absorb(q_nope, q_pe, w_uk_t, w_uk_t_scale)
    return reference.q_absorb(q_nope, q_pe, w_uk_t, w_uk_t_scale)


@torch.library.register_kernel("mla_ext::q_absorb_out", "cpu")
def _q_absorb_out_cpu(q_nope, q_pe, w_uk_t, w_uk_t_scale, out):
    _validate_q_absorb(q_nope, q_pe, w_uk_t, w_uk_t_scale, out)
    out.copy_(reference.q_absorb(q_nope, q_pe, w_uk_t, w_uk_t_scale))


@torch.library.register_fake("mla_ext::q_absorb")
def _q_absorb_fake(q_nope, q_pe, w_uk_t, w_uk_t_scale=None):
    _validate_q_absorb(q_nope, q_pe, w_uk_t, w_uk_t_scale)
    return q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], LATENT_DIM)


@torch.library.register_fake("mla_ext::q_absorb_out")
def _q_absorb_out_fake(q_nope, q_pe, w_uk_t, w_uk_t_scale, out):
    _validate_q_absorb(q_nope, q_pe, w_uk_t, w_uk_t_scale, out)


@torch.library.register_kernel("mla_ext::v_up", "cpu")
def _v_up_cpu(x, w_uv, w_uv_scale=None):
    _validate_v_up(x, w_uv, w_uv_scale)
    return reference.v_up(x, w_uv, w_uv_scale)


@torch.library.register_kernel("mla_ext::v_up_out", "cpu")
def _v_up_out_cpu(x, w_uv, w_uv_scale, out):
    _validate_v_up(x, w_uv, w_uv_scale, out)
    out.copy_(reference.v_up(x, w_uv, w_uv_scale))


@torch.library.register_fake("mla_ext::v_up")
def _v_up_fake(x, w_uv, w_uv_scale=None):
    _validate_v_up(x, w_uv, w_uv_scale)
    return x.new_empty(*x.shape[:-1], V_HEAD_DIM)


@torch.library.register_fake("mla_ext::v_up_out")
def _v_up_out_fake(x, w_uv, w_uv_scale, out):
    _validate_v_up(x, w_uv, w_uv_scale, out)
