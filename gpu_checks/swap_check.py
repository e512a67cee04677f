"""Swap throughput of the v0 engine's KV cache (device <-> host), next to a plain copy of the same bytes.

Usage (one prepared run, well under a minute on one GPU):

    python -m schedconf.gpu_checks.swap_check --out reports/gpu          # CUDA: device <-> pinned host
    python -m schedconf.gpu_checks.swap_check --device cpu --allow-cpu     # dry run on the CPU (what bench/bench_swap.py prints)

For each block size it builds the caches of ``impl/v0_runner.py`` for the
``--model`` layout (per layer a key and a value tensor ``[num_blocks,
block_size, kv_heads, head_dim]`` on the device and on the host), fills the
device blocks with random values, and times ``V0ModelRunner.swap_out`` (device
-> host) and ``swap_in`` (host -> device) of ``--blocks`` blocks scattered
over the pool (a random permutation, as block tables are), best of
``--repeats``. The baseline is one contiguous ``copy_`` of the same number of
bytes in the same direction, timed the same way in the same run; the ratio
``swap / baseline`` is the steadier figure (the machine's bandwidth cancels).
Every round trip is checked: the swapped-in device blocks equal the originals
bit for bit. Then the v0 engine runs swap-mode workloads on the device
(``--tokens-model``, float64) and every request's tokens must equal the dense
greedy forward (``check_swap_tokens``). Host-side copies run on ``--threads`` torch threads (1: on a
shared machine more threads only add hand-offs). Writes ``swap_check.json`` (rows plus ``verdict``) under ``--out``;
exit 0 when every round trip was exact. Without CUDA and without
``--allow-cpu`` it checks nothing, writes ``{"verdict": "skipped"}``, exits 0.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def measure_swap(
    device: str = "cpu",
    dtype: str = "bfloat16",
    model: str = "bench-250m",
    block_sizes: tuple[int, ...] = (16, 32, 64),
    num_blocks: int = 256,
    repeats: int = 5,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per block size: swap-out / swap-in seconds, blocks/s, GB/s, and the baseline copy's."""
    from schedconf.impl.model import DTYPES, MODEL_CONFIGS
    from schedconf.impl.v0_runner import V0ModelRunner

    dev = torch.device(device)
    dt = DTYPES[dtype]
    cfg = MODEL_CONFIGS[model]
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for bs in block_sizes:
        pool = num_blocks + num_blocks // 4  # the swapped blocks are scattered over a slightly larger pool
        gpu = SimpleNamespace(num_blocks=pool, gen=[1] * pool)
        cpu = SimpleNamespace(num_blocks=pool, gen=[1] * pool)
        sched = SimpleNamespace(bs=bs, gpu=gpu, cpu=cpu)
        fake_model = SimpleNamespace(config=cfg, dtype=dt, device=dev)
        runner = V0ModelRunner(fake_model, sched)  # type: ignore[arg-type]
        gen = torch.Generator(device="cpu").manual_seed(seed)
        for cache in (*runner.k_cache, *runner.v_cache):
            cache.copy_(torch.randn(cache.shape, generator=gen, dtype=torch.float32).to(dt))
        src = rng.sample(range(pool), num_blocks)
        dst = rng.sample(range(pool), num_blocks)
        out_pairs = list(zip(src, dst))
        in_pairs = [(c, g) for g, c in out_pairs]
        originals = [c[src].clone() for c in runner.k_cache[:1]]
        t_out = _best(lambda: runner.swap_out(out_pairs, [1] * num_blocks), dev, repeats)
        # scramble the device blocks, then swap back in: the bytes must come from the host
        saved = runner.k_cache[0][src].clone()
        runner.k_cache[0][src] = 0
        t_in = _best(lambda: runner.swap_in(in_pairs), dev, repeats)
        exact = bool(torch.equal(runner.k_cache[0][src], saved) and torch.equal(saved, originals[0]))
        block_bytes = 2 * cfg.num_layers * bs * cfg.num_kv_heads * cfg.head_dim * runner.k_cache[0].element_size()
        total = block_bytes * num_blocks
        flat = total // runner.k_cache[0].element_size()
        a = torch.empty(flat, dtype=dt, device=dev)
        h = torch.empty(flat, dtype=dt, pin_memory=dev.type == "cuda")
        t_base_out = _best(lambda: h.copy_(a, non_blocking=True), dev, repeats)
        t_base_in = _best(lambda: a.copy_(h, non_blocking=True), dev, repeats)
        rows.append(
            {
                "block_size": bs,
                "blocks": num_blocks,
                "block_bytes": block_bytes,
                "bytes": total,
                "swap_out_s": t_out,
                "swap_in_s": t_in,
                "baseline_out_s": t_base_out,
                "baseline_in_s": t_base_in,
                "swap_out_blocks_per_s": num_blocks / t_out,
                "swap_in_blocks_per_s": num_blocks / t_in,
                "swap_out_gb_per_s": total / t_out / 1e9,
                "swap_in_gb_per_s": total / t_in / 1e9,
                "baseline_out_gb_per_s": total / t_base_out / 1e9,
                "baseline_in_gb_per_s": total / t_base_in / 1e9,
                "ratio_out": t_base_out / t_out,
                "ratio_in": t_base_in / t_in,
                "round_trip_exact": exact,
            }
        )
    return rows


def check_swap_tokens(
    device: str = "cuda", model: str = "small", dtype: str = "float64", seeds: int = 4
) -> dict[str, Any]:
    """The v0 engine on ``device`` with swapping: every request's tokens equal the dense greedy forward.

    Runs the hand-made swap workload of ``tests/engine/test_impl_v0_engine.py``
    (two 7-token prompts on a 4-block pool: one is swapped out and back in)
    and ``seeds`` random swap-mode workloads (prefix caching and chunked prefill
    alternating), then compares with ``schedconf.impl.dense.dense_generate`` on the same
    device. Returns counts and the mismatching requests.
    """
    from schedconf.impl.dense import dense_generate
    from schedconf.impl.model import DTYPES, MODEL_CONFIGS, LlamaModel
    from schedconf.impl.v0_engine import V0Engine
    from schedconf.spec.schedulers import make_config

    lm = LlamaModel(MODEL_CONFIGS[model], device=device, dtype=DTYPES[dtype])
    base = dict(
        block_size=4,
        num_gpu_blocks=4,
        num_cpu_blocks=8,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        max_model_len=16,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        policy="fcfs",
        preemption_mode="swap",
        max_num_partial_prefills=1,
        max_long_partial_prefills=1,
        long_prefill_token_threshold=0,
    )
    workloads = [(base, [("a", [11, 12, 13, 14, 15, 16, 17], 6), ("b", [21, 22, 23, 24, 25, 26, 27], 6)])]
    for seed in range(seeds):
        rng = random.Random(seed)
        cfg = dict(
            base,
            num_gpu_blocks=12,
            num_cpu_blocks=64,
            max_model_len=24,
            max_num_seqs=5,
            max_num_batched_tokens=12 if seed % 2 else 24,
            enable_chunked_prefill=seed % 2 == 1,
            enable_prefix_caching=seed % 4 >= 2,
        )
        system = [rng.randrange(512) for _ in range(8)]
        # prompts of at most 12 tokens: a swapped chunked prefill always fits the 12-token budget again
        # (vLLM 0.10.2 never chunks a swap-in, so a longer one would never come back)
        reqs = [
            (
                f"r{i}",
                system[: rng.choice([0, 4, 8])] + [rng.randrange(512) for _ in range(rng.randrange(1, 5))],
                rng.randrange(4, 14),
            )
            for i in range(7)
        ]
        workloads.append((cfg, reqs))
    counts = {"workloads": 0, "requests": 0, "swapped_in_blocks": 0, "swapped_out_blocks": 0, "mismatches": []}
    for cfg, reqs in workloads:
        engine = V0Engine(make_config(cfg, "vllm-0.10"), lm)
        for rid, prompt, max_tokens in reqs:
            engine.add_request(rid, prompt, max_tokens, ignore_eos=True)
        engine.run()
        counts["workloads"] += 1
        counts["swapped_in_blocks"] += engine.num_swapped_in_blocks
        counts["swapped_out_blocks"] += engine.num_swapped_out_blocks
        for record in engine.records:
            counts["requests"] += 1
            dense = dense_generate(
                lm,
                record.prompt,
                record.max_tokens,
                max_model_len=cfg["max_model_len"],
                ignore_eos=True,
                defer_length_to_min_tokens=True,
            )
            if record.output_tokens != dense.tokens:
                counts["mismatches"].append({"config": cfg, "request": record.req_id})
    return counts


def render_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of ``measure_swap`` rows."""
    lines = [
        "| block size | KiB/block | out blocks/s | out GB/s | copy GB/s | out/copy | in blocks/s | in GB/s "
        "| copy GB/s | in/copy | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['block_size']} | {r['block_bytes'] / 1024:.0f} | {r['swap_out_blocks_per_s']:,.0f} "
            f"| {r['swap_out_gb_per_s']:.2f} | {r['baseline_out_gb_per_s']:.2f} | {r['ratio_out']:.2f} "
            f"| {r['swap_in_blocks_per_s']:,.0f} | {r['swap_in_gb_per_s']:.2f} | {r['baseline_in_gb_per_s']:.2f} "
            f"| {r['ratio_in']:.2f} | {'yes' if r['round_trip_exact'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="reports/gpu")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--allow-cpu", action="store_true")
    parser.add_argument("--model", default="bench-250m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--block-sizes", default="16,32,64")
    parser.add_argument("--blocks", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (host-side copies)")
    parser.add_argument("--tokens-model", default="small", help="model of the token check (float64)")
    parser.add_argument("--token-seeds", type=int, default=4)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("swap_check: no CUDA device; nothing checked")
        (out / "swap_check.json").write_text(json.dumps({"verdict": "skipped"}) + "\n")
        return 0
    if args.device == "cpu" and not args.allow_cpu:
        print("swap_check: --device cpu needs --allow-cpu (a dry run)")
        return 2
    rows = measure_swap(
        args.device,
        args.dtype,
        args.model,
        tuple(int(b) for b in args.block_sizes.split(",")),
        args.blocks,
        args.repeats,
    )
    tokens = check_swap_tokens(args.device, args.tokens_model, seeds=args.token_seeds)
    verdict = "pass" if all(r["round_trip_exact"] for r in rows) and not tokens["mismatches"] else "fail"
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    report = {
        "verdict": verdict,
        "device": device_name,
        "model": args.model,
        "dtype": args.dtype,
        "rows": rows,
        "tokens": tokens,
    }
    (out / "swap_check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(render_table(rows))
    print(
        f"tokens: {tokens['requests']} requests in {tokens['workloads']} workloads, "
        f"{tokens['swapped_out_blocks']} blocks swapped out, {tokens['swapped_in_blocks']} in, "
        f"{len(tokens['mismatches'])} differ from the dense forward"
    )
    print(f"swap_check: {verdict} on {device_name}")
    return 0 if verdict == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
