"""The loops the engine is benchmarked against (``bench/bench_engine.py``), and the engine run itself.

Each generates ``output_len`` greedy tokens (EOS ignored) for every prompt
with the same model and returns the tokens and the wall time:

* :func:`engine_generate`: impl/'s engine, every request batched, paged KV
  cache, chunked prefill (budget 8192), prefix caching on;
* :func:`kv_loop`: a simple non-paged KV cache: one contiguous key/value buffer
  per request, the prompt in one forward, then one token per forward, one
  request at a time;
* :func:`dense_loop`: no cache at all: every token recomputes the whole
  sequence, one request at a time.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from schedconf.impl.engine import Engine
from schedconf.impl.model import LlamaModel
from schedconf.spec.v1.config import SchedulerConfig


def set_cpu_threads(n: int) -> int:
    """Set torch's CPU threads; return the number in effect."""
    torch.set_num_threads(n)
    return torch.get_num_threads()


def engine_generate(model: LlamaModel, prompts: list[list[int]], output_len: int) -> tuple[list[list[int]], float]:
    """All requests through the engine at once."""
    block_size = 16
    max_len = max(len(p) for p in prompts) + output_len + 1
    blocks_per_req = -(-max_len // block_size)
    config = SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=len(prompts) * blocks_per_req + 1,
        max_num_batched_tokens=8192,
        max_num_seqs=len(prompts),
        max_model_len=max_len,
    )
    engine = Engine(config, model)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, output_len, ignore_eos=True)
    engine.run()
    seconds = time.perf_counter() - t0
    return [r.output_tokens for r in engine.records], seconds


@torch.inference_mode()
def dense_loop(model: LlamaModel, prompts: list[list[int]], output_len: int) -> tuple[list[list[int]], float]:
    """No cache: the whole sequence recomputed for every token."""
    t0 = time.perf_counter()
    outs = []
    for p in prompts:
        seq = list(p)
        for _ in range(output_len):
            seq.append(int(model.forward_dense(seq)[-1].argmax()))
        outs.append(seq[len(p) :])
    return outs, time.perf_counter() - t0


@torch.inference_mode()
def kv_loop(model: LlamaModel, prompts: list[list[int]], output_len: int) -> tuple[list[list[int]], float]:
    """A contiguous (non-paged) KV cache per request, one request at a time."""
    c = model.config
    dev = model.device
    t0 = time.perf_counter()
    outs = []
    for p in prompts:
        max_len = len(p) + output_len
        k_cache = [
            torch.zeros(c.num_kv_heads, max_len, c.head_dim, dtype=model.dtype, device=dev) for _ in range(c.num_layers)
        ]
        v_cache = [
            torch.zeros(c.num_kv_heads, max_len, c.head_dim, dtype=model.dtype, device=dev) for _ in range(c.num_layers)
        ]
        seq = list(p)
        new = list(p)
        while len(seq) < max_len:
            start = len(seq) - len(new)
            positions = torch.arange(start, len(seq), device=dev)
            rope = model.rope(positions)
            hidden = model.embed(model.token_tensor(new))
            mask = torch.arange(len(seq), device=dev)[None, :] <= positions[:, None]
            for layer in range(c.num_layers):
                q, k, v = model.qkv(layer, hidden, rope)
                k_cache[layer][:, start : len(seq)] = k.transpose(0, 1)
                v_cache[layer][:, start : len(seq)] = v.transpose(0, 1)
                attn = F.scaled_dot_product_attention(
                    q.transpose(0, 1),
                    k_cache[layer][:, : len(seq)],
                    v_cache[layer][:, : len(seq)],
                    attn_mask=mask,
                    scale=model.scale,
                    enable_gqa=True,
                )
                hidden = model.finish_layer(layer, hidden, attn.transpose(0, 1).reshape(len(new), -1))
            token = int(model.logits(hidden[-1:]).argmax())
            seq.append(token)
            new = [token]
        outs.append(seq[len(p) :])
    return outs, time.perf_counter() - t0
