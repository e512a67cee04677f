"""An n-gram drafter for speculative decoding (prompt-lookup decoding).

Rule: for ``n`` from ``n_max`` down to ``n_min``, take the last ``n`` tokens of
the request's sequence; if the same ``n`` tokens occur earlier in the sequence
(prompt or outputs), propose the up to ``k`` tokens that followed their most
recent earlier occurrence. No match: no drafts.

The index of earlier n-grams is kept per request and extended incrementally
with the tokens each step accepts, so a proposal costs O(n_max) dictionary
lookups however long the sequence is. The target model verifies the drafts
greedily; rejected ones are rolled back by the scheduler (``num_computed_tokens``)
and their KV slots are simply rewritten later.
"""

from __future__ import annotations

from collections.abc import Sequence


class _Context:
    """One request's sequence and the index of its n-grams that are not the current suffix."""

    __slots__ = ("tokens", "indexed_end", "index")

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens: list[int] = list(tokens)
        self.indexed_end = 0  # n-grams ending before this position are indexed
        self.index: dict[tuple[int, ...], int] = {}


class NgramDrafter:
    """Proposes up to ``k`` drafts per request from n-gram matches in its own sequence."""

    def __init__(self, k: int, n_max: int = 3, n_min: int = 1) -> None:
        if k < 1 or not 1 <= n_min <= n_max:
            raise ValueError("need k >= 1 and 1 <= n_min <= n_max")
        self.k = k
        self.n_max = n_max
        self.n_min = n_min
        self._contexts: dict[str, _Context] = {}
        self.num_proposed = 0

    def propose(self, req_id: str, tokens: Sequence[int], new_tokens: Sequence[int], limit: int) -> list[int]:
        """Drafts for the request whose sequence is ``tokens + new_tokens``, at most ``limit`` of them.

        ``tokens`` is only read the first time a request is seen; afterwards the
        drafter's own copy is extended by ``new_tokens``.
        """
        ctx = self._contexts.get(req_id)
        if ctx is None:
            ctx = self._contexts[req_id] = _Context(tokens)
        ctx.tokens.extend(new_tokens)
        seq = ctx.tokens
        end = len(seq) - 1  # the n-grams ending at the last token are the suffix, not indexed yet
        index = ctx.index
        for e in range(ctx.indexed_end + 1, end + 1):
            for n in range(self.n_min, self.n_max + 1):
                if e - n >= 0:
                    index[tuple(seq[e - n : e])] = e - n
        ctx.indexed_end = max(ctx.indexed_end, end)
        limit = min(limit, self.k)
        if limit <= 0:
            return []
        for n in range(min(self.n_max, len(seq)), self.n_min - 1, -1):
            start = index.get(tuple(seq[len(seq) - n :]))
            if start is not None:
                drafts = seq[start + n : start + n + limit]
                self.num_proposed += len(drafts)
                return drafts
        return []

    def context_tail(self, req_id: str) -> tuple[int, int] | None:
        """``(length, last token)`` of the drafter's copy of a request's sequence, or None if it has none."""
        ctx = self._contexts.get(req_id)
        if ctx is None or not ctx.tokens:
            return None
        return len(ctx.tokens), ctx.tokens[-1]

    def forget(self, req_id: str) -> None:
        """Drop a finished request's index."""
        self._contexts.pop(req_id, None)
