"""Tokens per second of impl/'s engine: the synchronous loop next to the overlapped (async) loop.

Usage: python bench/bench_async.py [--requests 64] [--prompt 128] [--output 64] [--model tiny,small]
                                   [--dtype float64] [--threads 1] [--repeats 3] [--device auto] [--spec 0]

The same workload (``--requests`` random ``--prompt``-token prompts, ``--output``
greedy tokens each, EOS ignored, all batched; paged KV, prefix caching on,
budget 8192) runs twice in the same process, per model and device:

* ``sync``: ``Engine.step()`` under ``vllm-0.33`` (``max_concurrent_batches`` 1):
  schedule, forward, update, one after the other;
* ``overlapped``: ``Engine.step_overlapped()`` under ``vllm-0.33-async`` with two
  steps in flight: step N+1 is scheduled (and its batch prepared) while step N's
  forward pass runs on a worker thread; a decode reads the token step N is still
  sampling from step N's result (output placeholders).

``--spec K`` runs both with spec decode, ``K`` n-gram drafts per step (the
overlapped loop: AsyncScheduler's ``-1`` drafts filled by the runner, positions
moved back over the drafts the step before rejected); random prompts give
the n-gram drafter few matches, so this measures what spec decode costs more
than what it buys. Both must generate identical tokens (the bench refuses to
print figures otherwise). Tokens/s = generated tokens over wall time (best of ``--repeats``,
the two loops alternating); ``host ms/step`` is the sync loop's time outside the
forward pass (schedule, batch preparation, update), ``forward ms/step`` the
forward pass and sampling: the overlapped loop can at best hide the smaller of
the two, so the ratio is bounded by ``(host + forward) / max(host, forward)``.
``CPU s`` is this process's CPU time in the best run of each loop: on a machine
busy with other work, two threads get more of it than one, so a ratio above
the bound measures that, not the engine.

``--device auto`` runs the CPU and, when torch sees one, CUDA. On the CPU the
worker thread and the scheduling thread share the GIL: only the time the worker
spends inside torch kernels (which release it) overlaps, so a small model gains
little; on a GPU the forward pass is kernel launches plus one synchronisation,
and scheduling hides behind the device time.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schedconf.impl.engine import Engine  # noqa: E402
from schedconf.impl.model import DTYPES, MODEL_CONFIGS, LlamaModel  # noqa: E402
from schedconf.spec.v1.config import SchedulerConfig  # noqa: E402


def make_config(prompts: list[list[int]], output_len: int, batches: int, spec_tokens: int = 0) -> SchedulerConfig:
    block_size = 16
    max_len = max(len(p) for p in prompts) + output_len + 2 + 2 * spec_tokens
    blocks_per_req = -(-max_len // block_size)
    return SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=len(prompts) * blocks_per_req + 1,
        max_num_batched_tokens=8192,
        max_num_seqs=len(prompts),
        max_model_len=max_len,
        enable_prefix_caching=True,
        max_concurrent_batches=batches,
        num_spec_tokens=spec_tokens,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_sync(model: LlamaModel, prompts: list[list[int]], output_len: int, spec_tokens: int = 0) -> dict[str, Any]:
    """The synchronous loop, its host and forward time measured apart."""
    engine = Engine(make_config(prompts, output_len, 1, spec_tokens), model, profile="vllm-0.33")
    runner = engine.runner
    _sync(model.device)
    c0 = time.process_time()
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, output_len, ignore_eos=True)
    forward = 0.0
    steps = 0
    while engine.has_requests():
        out = engine.schedule()
        prepared = runner.prepare(out)
        f0 = time.perf_counter()
        result = runner.run(prepared)  # ends with the sampled tokens on the host (a device sync)
        forward += time.perf_counter() - f0
        runner.propose(result)
        engine.update(out, result)
        steps += 1
    seconds = time.perf_counter() - t0
    return {
        "tokens": [r.output_tokens for r in engine.records],
        "seconds": seconds,
        "steps": steps,
        "forward_s": forward,
        "host_s": seconds - forward,
        "cpu_s": time.process_time() - c0,
        "accepted": engine.stats.num_drafts_accepted,
    }


def run_overlapped(
    model: LlamaModel, prompts: list[list[int]], output_len: int, spec_tokens: int = 0
) -> dict[str, Any]:
    """The overlapped loop: async profile, two steps in flight, forward on the worker thread."""
    engine = Engine(make_config(prompts, output_len, 2, spec_tokens), model, profile="vllm-0.33-async")
    _sync(model.device)
    c0 = time.process_time()
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, output_len, ignore_eos=True)
    engine.run(overlap=True)
    seconds = time.perf_counter() - t0
    engine.close()
    return {
        "tokens": [r.output_tokens for r in engine.records],
        "seconds": seconds,
        "cpu_s": time.process_time() - c0,
        "steps": engine.scheduler.current_step,
        "holes": engine.runner.num_holes_from_runner,
        "accepted": engine.stats.num_drafts_accepted,
    }


def bench(
    model_name: str,
    device: str,
    dtype: str,
    requests: int,
    prompt_len: int,
    output_len: int,
    repeats: int = 3,
    seed: int = 0,
    require_equal: bool = True,
    spec_tokens: int = 0,
) -> dict[str, Any]:
    """Both loops on one model and device, best of ``repeats``; one row of the table.

    ``require_equal``: refuse (SystemExit) when the two loops' tokens differ;
    otherwise report it in ``tokens_equal`` (lower precision, where batch
    composition may change rounding).
    """
    model = LlamaModel(MODEL_CONFIGS[model_name], device=device, dtype=DTYPES[dtype])
    rng = random.Random(seed)
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(prompt_len)] for _ in range(requests)]
    run_sync(model, prompts[:2], 4)  # warm-up (allocator, kernels)
    run_overlapped(model, prompts[:2], 4)
    best_sync: dict[str, Any] | None = None
    best_over: dict[str, Any] | None = None
    equal = True
    for _ in range(repeats):
        s = run_sync(model, prompts, output_len, spec_tokens)
        o = run_overlapped(model, prompts, output_len, spec_tokens)
        equal = equal and s["tokens"] == o["tokens"]
        if not equal and require_equal:
            raise SystemExit(
                f"{model_name} on {device}: the two loops generated different tokens; refusing to print figures"
            )
        if best_sync is None or s["seconds"] < best_sync["seconds"]:
            best_sync = s
        if best_over is None or o["seconds"] < best_over["seconds"]:
            best_over = o
    assert best_sync is not None and best_over is not None
    total = requests * output_len
    return {
        "model": model_name,
        "params_m": model.config.num_params / 1e6,
        "device": device,
        "dtype": dtype,
        "sync_tps": total / best_sync["seconds"],
        "overlapped_tps": total / best_over["seconds"],
        "sync_cpu_s": best_sync["cpu_s"],
        "overlapped_cpu_s": best_over["cpu_s"],
        "ratio": best_sync["seconds"] / best_over["seconds"],
        "host_ms": 1000 * best_sync["host_s"] / best_sync["steps"],
        "forward_ms": 1000 * best_sync["forward_s"] / best_sync["steps"],
        "bound": (best_sync["host_s"] + best_sync["forward_s"]) / max(best_sync["host_s"], best_sync["forward_s"]),
        "steps": (best_sync["steps"], best_over["steps"]),
        "holes": best_over["holes"],
        "tokens_equal": equal,
        "requests": requests,
        "prompt_len": prompt_len,
        "output_len": output_len,
        "spec_tokens": spec_tokens,
        "accepted": (best_sync["accepted"], best_over["accepted"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--model", default="tiny,small", help="comma-separated sizes (impl/model.py)")
    parser.add_argument("--dtype", default="float64", choices=sorted(DTYPES))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto", help="cpu, cuda, or auto (cpu, and cuda when present)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spec", type=int, default=0, help="spec decode: n-gram drafts per step (0: off)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    devices = ["cpu", "cuda"] if args.device == "auto" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        devices.remove("cuda")
        print("no CUDA device: CPU only")
    rows = [
        bench(m, d, args.dtype, args.requests, args.prompt, args.output, args.repeats, args.seed, spec_tokens=args.spec)
        for d in devices
        for m in args.model.split(",")
    ]
    print(
        f"{args.requests} requests x ({args.prompt} prompt + {args.output} output) tokens, {args.dtype}, "
        + (f"spec decode k={args.spec}, " if args.spec else "")
        + f"{args.threads} torch thread(s), best of {args.repeats}; identical tokens in both loops"
    )
    print(render_table(rows))


def render_table(rows: list[dict[str, Any]]) -> str:
    """The rows of ``bench`` as a markdown table."""
    lines = [
        "| model | device | sync tokens/s | overlapped tokens/s | overlapped / sync | host ms/step (sync) "
        "| forward ms/step (sync) | bound | CPU s sync/overlapped | steps sync/overlapped | placeholder inputs "
        "| spec k | drafts accepted sync/overlapped |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        accepted = r.get("accepted", (0, 0))
        lines.append(
            f"| {r['model']} ({r['params_m']:.2f} M) | {r['device']} | {r['sync_tps']:,.0f} | "
            f"{r['overlapped_tps']:,.0f} | {r['ratio']:.2f}x | {r['host_ms']:.2f} | {r['forward_ms']:.2f} | "
            f"{r['bound']:.2f}x | {r['sync_cpu_s']:.2f}/{r['overlapped_cpu_s']:.2f} | "
            f"{r['steps'][0]}/{r['steps'][1]} | {r['holes']:,} | {r.get('spec_tokens', 0)} | "
            f"{accepted[0]:,}/{accepted[1]:,} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
