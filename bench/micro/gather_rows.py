"""How fast can the H200 read the rows a sparse decode gathers? ``python bench/micro/gather_rows.py``

The sparse benchmark's memory-bound case (b128 s_q1 h_q16, topk 2048, 32K-token pool per request,
pages shuffled) reads 262144 scattered cache rows. This reads the same kind of rows and nothing
else (a Triton kernel loads them and folds them into one int32 per program, so there is no write
traffic), for the fp8_ds_mla row (656 bytes: 41 16-byte chunks, not a multiple of the 128-byte
line), a 640-byte row (5 whole lines), the bf16 row (1152 bytes: 9 lines), and, for each, the same
number of rows read in order. Same timer as the benchmarks (L2 cold, median of many); the copy
bandwidth is measured in the same run. Prints a table (us, GB/s of row bytes, G rows/s).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mla_ext.bench.harness import Timer, measure_roofline  # noqa: E402

POOL_TOKENS, TOPK, BLOCK_SIZE, REQUESTS = 32768, 2048, 64, 128


@triton.jit
def _gather_fold(pool, slots, out, WORDS: tl.constexpr, BLOCK_W: tl.constexpr, ROWS: tl.constexpr):
    pid = tl.program_id(0)
    rows = tl.load(slots + pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_W)
    v = tl.load(pool + rows[:, None] * WORDS + cols[None, :], mask=cols[None, :] < WORDS, other=0)
    tl.store(out + pid, tl.sum(tl.sum(v, axis=1), axis=0))


def time_gather(timer: Timer, pool: torch.Tensor, slots32: torch.Tensor, label: str, rows_per_program: int = 16) -> float:
    """Median us of reading rows `slots32` of `pool` (int32 words per row), rows_per_program per program."""
    n, words = slots32.numel(), pool.shape[1]
    out = torch.empty(n // rows_per_program, dtype=torch.int32, device="cuda")
    fn = lambda: _gather_fold[(n // rows_per_program,)](pool, slots32, out, WORDS=words,  # noqa: E731
                                                        BLOCK_W=triton.next_power_of_2(words), ROWS=rows_per_program,
                                                        num_warps=4)
    return timer.time_us(fn, label)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to time")
        return 1
    timer = Timer()
    roofline = measure_roofline(timer)
    print(f"roofline: copy {roofline.copy_GBps:.0f} GB/s")
    pages = REQUESTS * POOL_TOKENS // BLOCK_SIZE
    table = torch.randperm(pages, device="cuda", dtype=torch.int64).view(REQUESTS, -1)
    # As the sparse benchmark: topk distinct positions of each request's 32K, through its pages.
    local = torch.rand(REQUESTS, POOL_TOKENS, device="cuda").argsort(dim=-1)[:, :TOPK]
    scattered = (table.gather(1, local // BLOCK_SIZE) * BLOCK_SIZE + local % BLOCK_SIZE).view(-1)
    in_order = torch.arange(scattered.numel(), device="cuda", dtype=torch.int64)
    print("| row bytes | rows | us | GB/s | G rows/s | fraction of copy |")
    print("|---:|---|---:|---:|---:|---:|")
    for row_bytes in (656, 640, 1152):
        words = row_bytes // 4
        pool = torch.randint(0, 1 << 20, (pages * BLOCK_SIZE, words), dtype=torch.int32, device="cuda")
        for name, slots in (("scattered", scattered), ("in order", in_order)):
            slots32 = slots.to(torch.int32).contiguous()
            n = slots32.numel()
            us = time_gather(timer, pool, slots32, f"gather.{row_bytes}.{name.replace(' ', '_')}")
            gbps = n * row_bytes / (us * 1e-6) / 1e9
            print(f"| {row_bytes} | {name} | {us:.2f} | {gbps:.0f} | {n / (us * 1e-6) / 1e9:.2f} | {gbps / roofline.copy_GBps:.2f} |")
        del pool
    # Dense paged decode reads whole pages in a random order (bench/bench_decode.py shuffles them):
    # does the page size change what the DRAM delivers? Same rows, 16 per program, page by page.
    print()
    print("| row bytes | block size | us | GB/s | fraction of copy |")
    print("|---:|---:|---:|---:|---:|")
    n = REQUESTS * 4096  # the memory-bound decode case: b128 x 4096 keys
    for row_bytes in (656, 1152):
        words = row_bytes // 4
        pool = torch.randint(0, 1 << 20, (n, words), dtype=torch.int32, device="cuda")
        for block_size in (16, 64, 128):
            order = torch.randperm(n // block_size, device="cuda", dtype=torch.int64)
            slots32 = (order[:, None] * block_size + torch.arange(block_size, device="cuda")).view(-1).to(torch.int32)
            us = time_gather(timer, pool, slots32, f"pages.{row_bytes}.bs{block_size}")
            gbps = n * row_bytes / (us * 1e-6) / 1e9
            print(f"| {row_bytes} | {block_size} | {us:.2f} | {gbps:.0f} | {gbps / roofline.copy_GBps:.2f} |")
        del pool
    return 0


if __name__ == "__main__":
    sys.exit(main())
