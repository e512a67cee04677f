"""Tokens per second of impl/'s engine on the CPU next to two simple greedy loops.

Usage: python bench/bench_engine.py [--requests 64] [--prompt 128] [--output 128]
                                    [--dense-requests 8] [--model tiny] [--dtype float64] [--threads 1]

Three ways (``impl/baselines.py``) to generate ``--output`` greedy tokens for each of ``--requests``
random ``--prompt``-token prompts with the same model (EOS ignored, so every
request produces exactly ``--output`` tokens):

* ``engine``: impl/'s engine: all requests batched, paged KV cache, chunked
  prefill (budget 8192), prefix caching on;
* ``dense loop``: no KV cache: every token recomputes the whole sequence
  (``LlamaModel.forward_dense``), one request at a time;
* ``kv loop``: a simple non-paged KV cache: one contiguous key/value buffer per
  request, the prompt in one forward, then one token per forward, one request
  at a time.

Tokens/s counts generated tokens over wall time, prefill included; tokens/CPU-s
over this process's CPU time (on a shared machine, the time it actually ran). The dense
loop's cost per token does not depend on how many requests run (it is
unbatched), so it is measured on ``--dense-requests`` of them. The three must
generate identical tokens; the bench refuses to print figures otherwise.
"""

from __future__ import annotations

import argparse
import random
import time

from schedconf.impl.baselines import dense_loop, engine_generate, kv_loop, set_cpu_threads
from schedconf.impl.model import DTYPES, MODEL_CONFIGS, LlamaModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=128)
    parser.add_argument("--dense-requests", type=int, default=8)
    parser.add_argument("--model", default="tiny", choices=sorted(MODEL_CONFIGS))
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    threads = set_cpu_threads(args.threads)
    model = LlamaModel(MODEL_CONFIGS[args.model], dtype=DTYPES[args.dtype])
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(args.prompt)] for _ in range(args.requests)]
    cpu: dict[str, float] = {}
    c0 = time.process_time()
    engine_tokens, engine_s = engine_generate(model, prompts, args.output)
    cpu["engine"] = time.process_time() - c0
    c0 = time.process_time()
    kv_tokens, kv_s = kv_loop(model, prompts, args.output)
    cpu["kv"] = time.process_time() - c0
    sub = prompts[: args.dense_requests]
    c0 = time.process_time()
    dense_tokens, dense_s = dense_loop(model, sub, args.output)
    cpu["dense"] = time.process_time() - c0
    if engine_tokens != kv_tokens or engine_tokens[: len(sub)] != dense_tokens:
        raise SystemExit("the three loops generated different tokens; refusing to print figures")
    total = args.requests * args.output
    rates = {
        "engine (paged, batched)": (total / engine_s, total / cpu["engine"]),
        "kv loop (contiguous KV, unbatched)": (total / kv_s, total / cpu["kv"]),
        f"dense loop (no cache, unbatched; {len(sub)} requests)": (
            len(sub) * args.output / dense_s,
            len(sub) * args.output / cpu["dense"],
        ),
    }
    print(
        f"model {args.model} ({model.config.num_params / 1e6:.2f} M parameters, {args.dtype}), "
        f"{args.requests} requests x ({args.prompt} prompt + {args.output} output) tokens, "
        f"{threads} thread(s); identical tokens in all three"
    )
    engine_rate, engine_cpu_rate = rates["engine (paged, batched)"]
    print(f"{'loop':<44} | {'tokens/s':>10} | {'engine speedup':>14} | {'tokens/CPU-s':>12} | engine speedup (CPU)")
    for name, (rate, cpu_rate) in rates.items():
        print(
            f"{name:<44} | {rate:>10.0f} | {engine_rate / rate:>13.1f}x | {cpu_rate:>12.0f} | "
            f"{engine_cpu_rate / cpu_rate:>8.1f}x"
        )


if __name__ == "__main__":
    main()
