"""The oracle: dense, unbatched, cache-free greedy generation of one request.

Every step runs ``LlamaModel.forward_dense`` over the whole sequence so far
(no KV cache, no batching, no chunking, no drafts) and appends the greedy
token, with the engine's stop rules in vLLM 0.33's order: EOS (unless
``ignore_eos``), a stop id (``stop_reason``), then length (``max_model_len`` or
``max_tokens``); stop tokens are masked while fewer than ``min_tokens`` outputs
exist. Whatever the engine did to a request (chunking, batching, prefix hits,
preemption, drafts), its tokens must equal these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from schedconf.impl.model import LlamaModel
from schedconf.impl.sampling import TIE_EPS, NearTie, greedy, mask_stop_tokens


@dataclass
class DenseResult:
    """The oracle's outputs for one request."""

    tokens: list[int]
    finish_reason: str | None
    """``stop`` or ``length``; None when generation was cut at ``limit``."""
    stop_reason: int | None
    near_ties: list[NearTie] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)


def dense_generate(
    model: LlamaModel,
    prompt: Sequence[int],
    max_tokens: int,
    *,
    max_model_len: int,
    eos_token_id: int | None = None,
    ignore_eos: bool = False,
    stop_token_ids: Sequence[int] = (),
    min_tokens: int = 0,
    limit: int | None = None,
    req_id: str = "",
    defer_length_to_min_tokens: bool = False,
) -> DenseResult:
    """Generate greedily until a stop rule fires or ``limit`` tokens exist (see the module docstring).

    ``defer_length_to_min_tokens``: vLLM v0's ``StopChecker`` checks nothing, not even
    ``max_model_len``, while fewer than ``min_tokens`` tokens exist (the ``vllm-0.10`` engine).
    """
    eos = None if ignore_eos else eos_token_id
    stops = frozenset(stop_token_ids)
    stopset = stops | ({eos} if eos is not None else set())
    tie_eps = TIE_EPS.get(model.dtype, 1e-3)
    seq = list(prompt)
    result = DenseResult(tokens=[], finish_reason=None, stop_reason=None)
    while limit is None or len(result.tokens) < limit:
        logits = model.forward_dense(seq)[-1:].clone()
        if len(result.tokens) < min_tokens:
            mask_stop_tokens(logits, [(0, stopset)])
        tokens, runner_up, margins = greedy(logits)
        t = tokens[0]
        result.margins.append(margins[0])
        if margins[0] < tie_eps:
            result.near_ties.append(NearTie(req_id, len(result.tokens), t, runner_up[0], margins[0]))
        result.tokens.append(t)
        seq.append(t)
        if defer_length_to_min_tokens and len(result.tokens) < min_tokens:
            continue
        if t == eos:
            result.finish_reason = "stop"
        elif t in stops:
            result.finish_reason, result.stop_reason = "stop", t
        elif len(seq) >= max_model_len or len(result.tokens) >= max_tokens:
            result.finish_reason = "length"
        if result.finish_reason:
            break
    return result


@torch.inference_mode()
def dense_logits(model: LlamaModel, tokens: Sequence[int]) -> torch.Tensor:
    """Float64 CPU logits of every position of ``tokens`` (for teacher-forced checks)."""
    return model.forward_dense(list(tokens)).to(device="cpu", dtype=torch.float64)
