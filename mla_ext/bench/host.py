"""Host time per call (``bench/bench_host.py``): what a call costs the CPU, measured where the GPU
is not the limit.

Each op runs 3,000 times in a loop on tiny shapes (the GPU finishes each call before the host has
issued the next), GPU idle before and after, ``time.perf_counter`` around the loop, median of 5
loops (``harness.host_us_per_call``). The rows: ``torch.add`` (the floor of any op called from
Python), FlashMLA's ``flash_mla_with_kvcache`` (dense, b 4, h_q 16, s_q 1, 256 tokens, page 64,
metadata made once before the loop), the mla_ext wrappers on the same kind of inputs, and the raw
``torch.ops.mla_ext`` ops they call. ``decode_plan_gpu`` is the GPU time of ``get_decode_plan``
(CUDA-graph replay) for b 4, 64 and 256; the row holds the largest.

The raw ops are called with their arguments bound by name against the registered schema, so a
schema change shows up as "not run: ..." on that row, not as a wrong call.
"""

from __future__ import annotations

import statistics

import torch

from ..absorb import prepare_absorb_weights, q_absorb, v_up
from ..cache import concat_and_cache_mla
from ..decode import decode_mla, get_decode_plan
from ..formats import LATENT_DIM, empty_kv_cache
from ..sparse import sparse_decode_mla
from . import flashmla_peer
from .harness import graph_time_us, host_us_per_call, markdown_table

SOFTMAX_SCALE = 192**-0.5
B, H_Q, S_Q, SEQ_LEN, BLOCK_SIZE = 4, 16, 1, 256, 64
TOPK, TOKENS = 128, 4
PLAN_BATCHES = (4, 64, 256)

OPS = ("torch.add", "flash_mla_with_kvcache", "mla_ext.decode_mla", "mla_ext.sparse_decode_mla",
       "mla_ext.concat_and_cache_mla", "mla_ext.q_absorb", "mla_ext.v_up", "torch.ops.mla_ext.decode_mla",
       "torch.ops.mla_ext.sparse_decode_mla", "torch.ops.mla_ext.concat_and_cache_mla", "torch.ops.mla_ext.q_absorb",
       "torch.ops.mla_ext.v_up", "decode_plan_gpu")

# op -> (what it is compared with, the factor it must stay within); decode_plan_gpu: an absolute bound in us.
BARS = {
    "mla_ext.decode_mla": ("flash_mla_with_kvcache", 0.6),
    "mla_ext.sparse_decode_mla": ("torch.add", 2.0),
    "mla_ext.concat_and_cache_mla": ("torch.add", 2.0),
    "mla_ext.q_absorb": ("torch.add", 2.0),
    "mla_ext.v_up": ("torch.add", 2.0),
    "decode_plan_gpu": (None, 8.0),
}


def bind_raw(op: str, **values):
    """``torch.ops.mla_ext.<op>`` with ``values`` bound to its schema's arguments by name (the others
    at their defaults): returns a function that calls it. Raises ValueError naming the mismatch
    when the schema has no such argument or needs one not given."""
    packet = getattr(torch.ops.mla_ext, op)
    schema = packet.default._schema
    names = {a.name for a in schema.arguments}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"the schema has no argument {', '.join(unknown)}: {schema}")
    args, kwargs = [], {}
    for a in schema.arguments:
        if a.name in values:
            value = values[a.name]
        elif a.has_default_value():
            value = a.default_value
        else:
            raise ValueError(f"no value for '{a.name}': {schema}")
        if a.kwarg_only:
            kwargs[a.name] = value
        else:
            args.append(value)
    return lambda: packet(*args, **kwargs)


def _inputs(device="cuda") -> dict:
    """The tiny shapes every row uses."""
    g = torch.Generator(device=device).manual_seed(0)
    pages = SEQ_LEN // BLOCK_SIZE
    kv_cache = torch.randn(B * pages, BLOCK_SIZE, LATENT_DIM, generator=g, dtype=torch.bfloat16, device=device)
    block_table = torch.randperm(B * pages, device=device).to(torch.int32).view(B, pages)
    seq_lens = torch.full((B,), SEQ_LEN, dtype=torch.int32, device=device)
    q = torch.randn(B, S_Q, H_Q, LATENT_DIM, generator=g, dtype=torch.bfloat16, device=device)
    cache_fp8 = empty_kv_cache(B * pages, BLOCK_SIZE, "fp8_ds_mla", device=device)
    rows = kv_cache.view(-1, LATENT_DIM)
    concat_and_cache_mla(rows[:, :512], rows[:, 512:], cache_fp8,
                         torch.arange(rows.shape[0], device=device), "fp8_ds_mla")
    indices = torch.stack([torch.randperm(B * SEQ_LEN, device=device)[:TOPK] for _ in range(B * S_Q)])
    indices = indices.view(B, S_Q, TOPK).to(torch.int32)
    kv = torch.randn(TOKENS, LATENT_DIM, generator=g, dtype=torch.bfloat16, device=device)
    slots = torch.arange(TOKENS, dtype=torch.int64, device=device) * 3
    w = prepare_absorb_weights(torch.randn(H_Q * 256, 512, generator=g, device=device) / 22, H_Q)
    q_proj = torch.randn(TOKENS, H_Q, 192, generator=g, dtype=torch.bfloat16, device=device)
    x = torch.randn(TOKENS, H_Q, 512, generator=g, dtype=torch.bfloat16, device=device)
    plan = get_decode_plan(seq_lens, S_Q, H_Q, "auto")
    return dict(q=q, kv_cache=kv_cache, block_table=block_table, seq_lens=seq_lens, cache_fp8=cache_fp8,
                indices=indices, kv_c=kv[:, :512], k_pe=kv[:, 512:], slots=slots, w=w, q_nope=q_proj[..., :128],
                q_pe=q_proj[..., 128:], x=x, plan=plan)


def _calls(i: dict) -> dict:
    """op name -> a function building the call (building may fail: the row then says why)."""
    q, cache, bt, lens, plan, w = i["q"], i["kv_cache"], i["block_table"], i["seq_lens"], i["plan"], i["w"]

    def flashmla():
        if not flashmla_peer.supports("dense"):
            raise RuntimeError(flashmla_peer.why_not("dense"))
        return flashmla_peer.dense(q, cache, bt, lens, SOFTMAX_SCALE, False)  # metadata made here, once

    return {
        "torch.add": lambda: (lambda: torch.add(q, q)),
        "flash_mla_with_kvcache": flashmla,
        "mla_ext.decode_mla": lambda: (lambda: decode_mla(q, cache, bt, lens, SOFTMAX_SCALE, plan=plan)),
        "mla_ext.sparse_decode_mla": lambda: (
            lambda: sparse_decode_mla(q, i["cache_fp8"], i["indices"], SOFTMAX_SCALE, "fp8_ds_mla")),
        "mla_ext.concat_and_cache_mla": lambda: (
            lambda: concat_and_cache_mla(i["kv_c"], i["k_pe"], cache, i["slots"], "auto")),
        "mla_ext.q_absorb": lambda: (lambda: q_absorb(i["q_nope"], i["q_pe"], *w.uk())),
        "mla_ext.v_up": lambda: (lambda: v_up(i["x"], *w.uv())),
        "torch.ops.mla_ext.decode_mla": lambda: bind_raw(
            "decode_mla", q=q, kv_cache=cache, block_table=bt, seq_lens=lens, softmax_scale=SOFTMAX_SCALE,
            kv_cache_dtype="auto", causal=False, schedule=plan.schedule, split_info=plan.split_info),
        "torch.ops.mla_ext.sparse_decode_mla": lambda: bind_raw(
            "sparse_decode_mla", q=q, kv_cache=i["cache_fp8"], indices=i["indices"], softmax_scale=SOFTMAX_SCALE,
            kv_cache_dtype="fp8_ds_mla"),
        "torch.ops.mla_ext.concat_and_cache_mla": lambda: bind_raw(
            "concat_and_cache_mla", kv_c=i["kv_c"], k_pe=i["k_pe"], kv_cache=cache, slot_mapping=i["slots"],
            kv_cache_dtype="auto"),
        "torch.ops.mla_ext.q_absorb": lambda: bind_raw(
            "q_absorb", q_nope=i["q_nope"], q_pe=i["q_pe"], w_uk_t=w.w_uk_t),
        "torch.ops.mla_ext.v_up": lambda: bind_raw("v_up", x=i["x"], w_uv=w.w_uv),
    }


def plan_gpu_us() -> dict[int, float]:
    """GPU time of get_decode_plan (s_q 1, h_q 16, bf16) per batch size, by CUDA-graph replay."""
    out = {}
    for b in PLAN_BATCHES:
        g = torch.Generator().manual_seed(b)
        lens = torch.randint(1024, 8192, (b,), generator=g, dtype=torch.int32).cuda()
        out[b] = graph_time_us(lambda: get_decode_plan(lens, S_Q, H_Q, "auto"), f"host.decode_plan.b{b}")
    return out


def bench(calls: int = 3000, loops: int = 5) -> list[dict]:
    """Rows ``{"op", "us_per_call"}`` in OPS order; a row that could not run has us_per_call None
    and a "note" saying why. The ops' loops are interleaved (loop i of every op, then loop i + 1),
    so that a drift of the machine's speed during the run moves all of them alike; each row is the
    median of its loops."""
    inputs = _inputs()
    builders = _calls(inputs)
    fns, notes = {}, {}
    for op in OPS[:-1]:
        try:
            fns[op] = builders[op]()
            fns[op]()
        except Exception as e:  # one op that cannot run (no peer, a changed schema) must not stop the rest
            notes[op] = str(e).splitlines()[0] if str(e) else type(e).__name__
    samples = {op: [] for op in fns}
    for _ in range(loops):
        for op, fn in fns.items():
            samples[op].append(host_us_per_call(fn, calls=calls, loops=1))
    rows = []
    for op in OPS[:-1]:
        if op in samples:
            rows.append({"op": op, "us_per_call": round(statistics.median(samples[op]), 2)})
        else:
            rows.append({"op": op, "us_per_call": None, "note": notes[op]})
        print(f"{op:40s} {rows[-1]['us_per_call'] if rows[-1]['us_per_call'] is not None else '—':>8} us"
              + (f"  ({rows[-1]['note']})" if "note" in rows[-1] else ""), flush=True)
    plan = plan_gpu_us()
    rows.append({"op": "decode_plan_gpu", "us_per_call": round(max(plan.values()), 2),
                 "per_b": {str(b): round(us, 2) for b, us in plan.items()}})
    print(f"{'decode_plan_gpu':40s} {rows[-1]['us_per_call']:>8} us (GPU; b " +
          ", ".join(f"{b}: {us:.2f}" for b, us in plan.items()) + ")", flush=True)
    for op, (bar, verdict) in check_bars(rows).items():
        row = next(r for r in rows if r["op"] == op)
        row["bar"] = bar
        row["met"] = None if verdict == "not measured" else verdict == "met"
    return rows


def check_bars(rows: list[dict]) -> dict[str, tuple[str, str]]:
    """op -> (the bar in words, "met" / "not met" / "not measured")."""
    us = {r["op"]: r["us_per_call"] for r in rows}
    out = {}
    for op, (base, factor) in BARS.items():
        if base is None:
            bar, limit = f"<= {factor:g} us", factor
        else:
            bar = f"<= {factor:g}x {base}"
            limit = None if us.get(base) is None else factor * us[base]
        if us.get(op) is None or limit is None:
            out[op] = (bar, "not measured")
        else:
            shown = bar if base is None else f"{bar} ({limit:.1f} us)"
            out[op] = (shown, "met" if us[op] <= limit else "not met")
    return out


def table(rows: list[dict]) -> str:
    bars = check_bars(rows)
    body = []
    for r in rows:
        bar, verdict = bars.get(r["op"], ("", ""))
        us = "—" if r["us_per_call"] is None else f"{r['us_per_call']:.2f}"
        if r["op"] == "decode_plan_gpu":
            us += " (GPU; b " + ", ".join(f"{b}: {v:.2f}" for b, v in r["per_b"].items()) + ")"
        body.append([f"`{r['op']}`", us, bar, verdict or r.get("note", "")])
    return markdown_table(["op", "us per call", "bar", "met"], body, "lrll")


NOTES = (
    "Host microseconds per call: 3,000 calls in a loop on tiny shapes, GPU idle before and waited for after, "
    "time.perf_counter around the loop, median of 5 loops, the ops' loops interleaved. Shapes: decode b 4, h_q 16, s_q 1, 256 tokens, page "
    "64, bf16 cache (FlashMLA's metadata and mla_ext's plan made once before the loop); sparse b 4, h_q 16, topk "
    "128, fp8_ds_mla; cache write T 4, bf16 cache; q_absorb and v_up T 4, H 16, bf16 weights. The torch.ops rows "
    "call the registered ops directly (what the wrappers call after their checks). decode_plan_gpu: GPU time of "
    "get_decode_plan by CUDA-graph replay, the largest of b 4, 64 and 256.")
