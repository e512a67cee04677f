"""Swap throughput of the v0 engine's KV cache on the CPU: blocks/s and GB/s, against a plain copy.

Usage: python bench/bench_swap.py [--model bench-250m] [--dtype bfloat16] [--block-sizes 16,32,64]
                                  [--blocks 512] [--repeats 5] [--threads 1]

Times ``V0ModelRunner.swap_out`` (device cache -> host cache) and ``swap_in``
(host -> device) of ``--blocks`` blocks scattered over the pool, with the
``--model`` KV layout (``bench-250m``: 16 layers, 4 KV heads of 64), best of
``--repeats``, and in the same run a contiguous ``copy_`` of the same bytes
(the baseline); ``out/copy`` and ``in/copy`` are the ratios of throughputs. On
this machine "device" and "host" are both CPU memory: the figure is the
runner's own cost of moving blocks. Every round trip is checked bit for bit.
The same measurement on a GPU (device <-> pinned host):
``python -m schedconf.gpu_checks.swap_check --out reports/gpu``.
"""

from __future__ import annotations

import argparse

import torch

from schedconf.gpu_checks.swap_check import measure_swap, render_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bench-250m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--block-sizes", default="16,32,64")
    parser.add_argument("--blocks", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = measure_swap(
        "cpu", args.dtype, args.model, tuple(int(b) for b in args.block_sizes.split(",")), args.blocks, args.repeats
    )
    print(
        f"model {args.model} ({args.dtype}), {args.blocks} blocks per swap, best of {args.repeats}, "
        f"{args.threads} torch thread(s)"
    )
    print(render_table(rows))
    if not all(r["round_trip_exact"] for r in rows):
        raise SystemExit("a swap round trip changed the bytes")


if __name__ == "__main__":
    main()
