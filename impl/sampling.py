"""Greedy sampling shared by the engine and the dense oracle, with near-tie reporting.

Rules:

* The token is the argmax of the logits (the lowest id among equal maxima).
* While a request has fewer than ``min_tokens`` outputs, every token that
  would stop it (EOS unless ``ignore_eos``, and the stop ids) is masked to
  ``-inf`` first (vLLM's min-tokens logits processor).
* The *margin* of a choice is ``top1 - top2`` of the masked logits. A margin
  below the dtype's tie threshold (``TIE_EPS``) means two candidates are close
  enough that rounding differences between two correct computations could
  swap them; such choices are reported as :class:`NearTie`, never hidden.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

TIE_EPS: dict[torch.dtype, float] = {
    torch.float64: 1e-9,
    torch.float32: 1e-3,
    torch.bfloat16: 0.125,
    torch.float16: 0.03,
}
"""Margins below this (in logit units) are reported: about 10^6 times the
observed engine-vs-dense logit difference in float64, a few times it in the
lower precisions."""


@dataclass(frozen=True)
class NearTie:
    """A greedy choice whose top-2 margin is below the tie threshold."""

    req_id: str
    output_index: int
    token: int
    runner_up: int
    margin: float


def mask_stop_tokens(logits: torch.Tensor, rows_and_tokens: Iterable[tuple[int, Iterable[int]]]) -> None:
    """Set ``logits[row, t] = -inf`` for each stop token ``t`` in the vocabulary, in place."""
    vocab = logits.shape[-1]
    rows: list[int] = []
    cols: list[int] = []
    for row, tokens in rows_and_tokens:
        for t in tokens:
            if 0 <= t < vocab:
                rows.append(row)
                cols.append(t)
    if rows:
        logits[torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device)] = float("-inf")


def greedy(logits: torch.Tensor) -> tuple[list[int], list[int], list[float]]:
    """Argmax, runner-up and margin of each row of ``logits`` [S, vocab]."""
    top = torch.topk(logits, 2, dim=-1)
    values = top.values.double()
    margins = (values[:, 0] - values[:, 1]).tolist()
    # topk's order among equal values is unspecified: the token is argmax's (first maximal id).
    tokens = torch.argmax(logits, dim=-1).tolist()
    idx = top.indices.tolist()
    runner_up = [i[1] if i[0] == t else i[0] for i, t in zip(idx, tokens)]
    return tokens, runner_up, margins
