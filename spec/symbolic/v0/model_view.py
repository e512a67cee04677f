"""The v0 model's own invariants (``spec/v0/invariants.py``) evaluated over a symbolic state.

:class:`ModelView` offers the names of :class:`schedconf.spec.v0.view.ConcreteV0View`
over a :class:`~schedconf.spec.symbolic.v0.state.State`, so that the model's rules,
written once over the view/ops protocol, run through :class:`~schedconf.spec.symbolic.z3ops.Z3Ops`
unchanged. What the encoding does not represent is offered as the value it
has in the encoding's scope: no evictor, no prefix-cache map
(``cache_entry_ok``, ``full_blocks_cached`` true), no preemption records
(``preemptions`` empty: ``inv_victim_order`` holds vacuously; the encoding's
victim is the tail of ``running`` by construction). ``num_curr_seqs`` is
``len(running)`` (the budget's count without the victims vLLM leaves in it;
a weaker statement than the model's).

Dead slots are shown as an empty WAITING group in ``waiting`` (so the
per-group rules hold vacuously on them); a dead slot that still holds a
table counts in ``orphan_tables``.

``inv_table_fits_tokens`` computes ``-(-x // block_size)`` with Python's
``//``, which Z3 terms lack: :func:`floordiv_for_z3` lends ``ArithRef`` a
floor division by a positive Python int while the rules are built (SMT-LIB
``div`` floors for a positive divisor).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import z3

from schedconf.spec.symbolic.v0.state import WAITING, State
from schedconf.spec.symbolic.z3ops import count, ite, land, lnot, lor, total


@contextmanager
def floordiv_for_z3() -> Iterator[None]:
    """While active, ``term // k`` for an integer Z3 term and a positive Python int is SMT ``div``."""

    def floordiv(a: z3.ArithRef, k: Any) -> z3.ArithRef:
        if not (isinstance(k, int) and k > 0 and a.is_int()):
            raise TypeError(f"only integer terms by a positive int: {a} // {k!r}")
        return a / k

    had = "__floordiv__" in z3.ArithRef.__dict__
    z3.ArithRef.__floordiv__ = floordiv  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if not had:
            del z3.ArithRef.__floordiv__  # type: ignore[attr-defined]


class ModelView:
    """``ConcreteV0View``'s names over a (symbolic or Python) :class:`State`."""

    def __init__(self, s: State) -> None:
        sh = s.shape
        self._s = s
        B = sh.num_blocks
        self.step = s.step
        self.block_size = sh.block_size
        self.num_gpu_blocks = B
        self.num_cpu_blocks = sh.num_cpu_blocks
        self.max_num_batched_tokens = s.max_num_batched_tokens
        self.max_num_seqs = s.max_num_seqs
        self.enable_caching = False
        self.gpu_blocks = list(range(B))
        self.cpu_blocks = list(range(B, B + sh.num_cpu_blocks))
        self.groups = list(sh.slots)
        self._live = [s.live(r) for r in sh.slots]
        self.orphan_tables = count(
            land(
                lnot(self._live[r]),
                lor(*([s.held[r][b] for b in sh.blocks] + [s.cpu_held[r][c] for c in sh.cpu_blocks])),
            )
            for r in sh.slots
        )
        out = s.has_output()
        self.has_pending = out
        self.preemptions: list[Any] = []
        scheduled = [land(out, self._live[r], s.num_scheduled[r] > 0) for r in sh.slots]
        self.num_scheduled_groups = count(scheduled)
        self.sum_chunks = total(ite(scheduled[r], s.num_scheduled[r], 0) for r in sh.slots)
        self.num_batched_tokens = self.sum_chunks
        self.num_uncached_tokens = self.sum_chunks
        self.num_curr_seqs = ite(out, s.num_running(), 0)
        self.swap_in_and_out = land(out, s.num_swapped_in > 0, s.num_swapped_out > 0)

    # blocks (absolute ids: CPU blocks are B..B+C-1)
    def _dev(self, b: int) -> tuple[str, int]:
        return ("gpu", b) if b < self.num_gpu_blocks else ("cpu", b - self.num_gpu_blocks)

    def refcount(self, b: int) -> Any:
        dev, i = self._dev(b)
        return (self._s.gpu_ref_cnt if dev == "gpu" else self._s.cpu_ref_cnt)[i]

    def num_in_free_list(self, b: int) -> Any:
        dev, i = self._dev(b)
        return ite((self._s.gpu_in_free if dev == "gpu" else self._s.cpu_in_free)[i], 1, 0)

    def in_evictor(self, b: int) -> bool:
        return False

    def num_holders(self, b: int) -> Any:
        dev, i = self._dev(b)
        held = self._s.held if dev == "gpu" else self._s.cpu_held
        return count(held[r][i] for r in self._s.shape.slots)

    def cache_entry_ok(self, b: int) -> bool:
        return True

    # groups (dead slots: an empty WAITING group in waiting)
    def status(self, r: int) -> Any:
        return ite(self._live[r], self._s.status[r], WAITING)

    def queue_count(self, r: int, q: int) -> Any:
        s = self._s
        member = (s.in_waiting, s.in_running, s.in_swapped)[q][r]
        return ite(self._live[r], ite(member, 1, 0), 1 if q == 0 else 0)

    def num_tokens(self, r: int) -> Any:
        return ite(self._live[r], self._s.num_tokens[r], 1)

    def num_computed_tokens(self, r: int) -> Any:
        return ite(self._live[r], self._s.num_computed_tokens[r], 0)

    def num_blocks(self, r: int) -> Any:
        return ite(self._live[r], self.num_gpu_blocks_held(r) + self.num_cpu_blocks_held(r), 0)

    def num_full_slots(self, r: int) -> Any:
        return ite(self._live[r], self._s.num_seen[r], 0)

    def num_gpu_blocks_held(self, r: int) -> Any:
        s = self._s
        return ite(self._live[r], count(s.held[r][b] for b in s.shape.blocks), 0)

    def num_cpu_blocks_held(self, r: int) -> Any:
        s = self._s
        return ite(self._live[r], count(s.cpu_held[r][c] for c in s.shape.cpu_blocks), 0)

    def full_blocks_cached(self, r: int) -> bool:
        return True


def model_invariant_formulas(s: State, ops: Any) -> dict[str, Any]:
    """Every rule of ``spec/v0/invariants.py`` on ``s`` through ``ops``."""
    from schedconf.spec.v0.invariants import INVARIANTS as MODEL_INVARIANTS

    view = ModelView(s)
    with floordiv_for_z3():
        return {name: fn(view, ops) for name, fn in MODEL_INVARIANTS.items()}
