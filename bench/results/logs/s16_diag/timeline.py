# Session 16: where the time of one timed decode call goes (forced portable): the harness's event time
# with its 50k-cycle spin and with a 400k-cycle one (a longer spin leaves the host more time to launch
# the graph before the GPU reaches the start event), and the GPU timeline of the same loop from the
# torch profiler (spin end -> split kernel start, split kernel, combine end).
# Usage: python timeline.py [ROOT]  (ROOT: where to import mla_ext from; default the working directory)
import os, statistics, sys, time
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else os.getcwd())
import torch
from mla_ext.bench.decode import make_inputs, run_op, graphed
from mla_ext.decode import get_decode_plan
from mla_ext.bench.harness import Timer

timer = Timer()


def event_us(fn, spin, iters=40):
    for _ in range(5):
        fn()
    st = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    en = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        timer.flush_l2()
        torch.cuda._sleep(spin)
        st[i].record()
        fn()
        en[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(st, en))


def timeline(fn, iters=12):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            timer.flush_l2()
            torch.cuda._sleep(50_000)
            fn()
        torch.cuda.synchronize()
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    rows = []
    for i, e in enumerate(ev):
        if "decode_split" not in e.name:
            continue
        spin = next((x for x in reversed(ev[:i]) if "spin" in x.name.lower() or "sleep" in x.name.lower()), None)
        comb = next((x for x in ev[i + 1:i + 3] if "combine" in x.name), None)
        if spin is None or comb is None:
            continue
        rows.append((e.time_range.start - spin.time_range.end, e.time_range.end - e.time_range.start,
                     comb.time_range.start - e.time_range.end, comb.time_range.end - e.time_range.end,
                     comb.time_range.end - spin.time_range.end))
    med = [statistics.median(r[k] for r in rows) for k in range(5)]
    return med, len(rows)


for fmt, b, n, bs in (("fp8_ds_mla", 128, 4096, 64), ("auto", 128, 4096, 64), ("fp8", 128, 4096, 64),
                      ("fp8_ds_mla", 128, 4096, 128), ("auto", 128, 4096, 128),
                      ("fp8_ds_mla", 32, 16384, 64), ("auto", 32, 16384, 64)):
    inp = make_inputs([n] * b, 1, 16, bs, fmt)
    plan = get_decode_plan(inp["seq_lens"], 1, 16, fmt)
    replay = graphed(lambda: run_op(inp, True, plan=plan))
    e50 = event_us(replay, 50_000)
    e400 = event_us(replay, 400_000)
    e50b = event_us(replay, 50_000)
    (gap, split, to_comb, comb_tail, total), k = timeline(replay)
    # host time of one graph launch while the GPU is busy
    torch.cuda._sleep(2_000_000)
    t0 = time.perf_counter(); replay(); host = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    print(f"{fmt:10s} b{b} x {n} bs{bs}: event {e50:.1f} / spin400k {e400:.1f} / again {e50b:.1f} us | timeline ({k}): "
          f"spin->split {gap:.1f}, split {split:.1f}, split end->combine start {to_comb:.1f}, ->combine end {comb_tail:.1f}, "
          f"spin->end {total:.1f} us | host replay() {host:.0f} us", flush=True)
    del replay, inp
