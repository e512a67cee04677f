"""Steps in flight (async scheduling, the batch queue), encoded in Z3 and proved (issue 13 part 5).

The main encoding (``state.py``, ``transitions.py``) is synchronous: one step
at most between ``schedule()`` and its ``update_from_output()``. This module
encodes the part of ``spec/v1/scheduler.py`` that steps in flight add
(``conformance/PROTOCOL.md``, "Steps in flight"): up to ``D`` steps scheduled whose output is not
applied yet, output placeholders (``AsyncScheduler``), in-flight and stale
token counts, speculative decoding under ``AsyncScheduler`` (draft placeholders,
drafts scheduled per step, rejection), and the rules that move them. It proves at
``R`` request slots, ``D`` steps in flight and ``num_spec_tokens`` up to ``K``
that every transition preserves the in-flight
invariants of ``spec/v1/invariants.py`` (``in_flight_accounting``,
``computed_range``, ``prefix_hit_capped``, ``scheduled_only_running``,
evaluated through :class:`FlightView`), that counters stay non-negative, the
model's own assertions on the way, and the lemmas below; it ties the encoding to the
model with a drift guard (``check_*`` functions, run by
``tests/symbolic/test_in_flight_proofs.py``).

State (:class:`FlightState`)
----------------------------
Per request slot: status (``DEAD`` or the ``spec/v1/view.py`` codes),
``num_tokens``, ``num_prompt_tokens``, ``max_tokens``,
``num_computed_tokens``, ``num_output_placeholders``,
``num_in_flight_tokens``, ``num_stale_output_tokens``, ``num_spec_token_ids``
(``len(spec_token_ids)``: 0 or ``num_spec_tokens``), ``next_decode_eligible_step``
(the pipeline-parallel decode stagger). A dead slot holds zeros.
Per in-flight step ``d`` (``0`` the oldest) and slot: the tokens the step
scheduled for the slot's request (``scheduled``), whether it samples
(``samples``: ``StepRecord.samples``) and how many drafts it scheduled
(``drafts``: ``len(scheduled_spec_decode_tokens[req])``); columns ``d >= num_steps`` hold zeros.
Scalars: the mode (``is_async``: the ``-async`` profiles), ``max_concurrent_batches``
(in ``1..D``), ``current_step``, ``num_steps`` (``len(Scheduler.in_flight)``),
``building`` (inside ``schedule()``: the newest column is the step being
built), ``num_spec_tokens`` (``k`` in ``0..K``, ``k > 0`` under async only), the
profile knobs ``trim_computed_on_stop`` and ``resolve_trimmed_placeholders``
(0.33 both, 0.32 neither), ``pipeline_parallel_size`` and ``decode_stagger``
(``use_v2_model_runner`` and the profile knob ``pp_decode_stagger``: under
AsyncScheduler a request that samples decodes again only
``pipeline_parallel_size`` steps later). The mode, ``k``, the knobs and the
pipeline size are symbolic: one proof covers both modes, every ``k <= K``,
both releases and every pipeline size.

What is abstracted, and why it is sound
---------------------------------------
The encoding over-approximates the model: every concrete transition must be
one the encoding allows (the drift guard checks exactly that), so a property
proved for every encoded transition holds for the model's.

* Blocks, queues, budget, seats, ``max_model_len``, the threshold and the
  victim choice are not represented: which running request is scheduled, how
  many tokens it gets (any ``n`` in ``[1, wanted]``), which one is preempted
  and which waiting one is admitted (with any prefix hit below
  ``num_tokens``) are the transition's inputs. A concrete ``schedule()`` is
  ``begin_step``, then one ``preempt`` per victim, one ``schedule_running`` per
  running request scheduled, one ``admit`` per admission, then ``end_step``.
* ``schedule_running`` and ``admit`` apply ``_update_after_schedule`` for
  their request at once: the update reads and writes that request's counters
  only, and each request is scheduled at most once per step (guard). A
  priority victim scheduled earlier in the same step has its tokens taken
  back (``_remove_priority_victim`` with the 0.33 ``index`` repair), which
  ``preempt`` mirrors by removing its cell of the step being built.
* The stop check is an input (``stop``): any returned token may stop the
  request (EOS, stop ids, ``max_model_len``), and one that reaches
  ``max_tokens`` must.
* ``drop_stale_output`` is always False (it is set only by
  ``reset_prefix_cache(reset_running_requests=True)``, not encoded:
  :func:`from_scheduler` refuses a state where it is set).
* Speculative decoding under async scheduling only: the model refuses steps
  in flight with spec decode on the plain scheduler, and plain spec decode
  with one step (``max_concurrent_batches = 1``) belongs to the main
  encoding; here ``num_spec_tokens > 0`` implies ``is_async`` (a lemma; the
  drift guard's :func:`from_scheduler` refuses the other case). Under async
  the drafts are ``-1`` placeholders the worker fills in: no draft ids in a
  model output (an *empty* ``draft_token_ids`` list is accepted and changes
  nothing: the engine core never calls ``update_draft_token_ids`` under async
  scheduling). The tokens returned
  (``1 .. 1 + drafts``), where a stop falls among them (``kept``) and how many
  drafts were accepted are inputs. Dynamic spec decode is not modelled (nor
  in the model).
* The 0.32 stop knobs change the counters of a request that is freed in the
  same update only: they reach the model assertion ``placeholders >= 0`` and
  nothing in a post-state.

Lemmas
------
The invariants alone are not inductive (a stale share drains by a whole
step's tokens, which needs more than ``stale <= in_flight``). The lemmas
(:data:`LEMMAS`) state the shape (columns past ``num_steps`` are empty, a
sampling cell has tokens, dead slots hold zeros) and the per-status
accounting: a WAITING request has nothing in flight; a PREEMPTED one has
computed nothing, has no placeholder nor drafts, and *all* its in-flight tokens are
stale; a RUNNING one has no stale tokens and (async) exactly ``1 + drafts``
placeholders per in-flight step in which it samples (plain: none), and
``decode_progress``: ``computed = num_tokens + placeholders - 1`` (async) while
it samples in a step in flight, ``<=`` that always; and ``decode_stagger``: with
the stagger on, two steps in flight in which one request samples lie at least
``pipeline_parallel_size`` steps apart (the rule itself), because
``next_decode_eligible_step`` is at least ``pipeline_parallel_size`` past each.
They are proved with the invariants.

Mutants
-------
``MUTANT_RULES`` names the mutants of ``conformance/checking/mutants.py`` the encoding
can express and the transition they change; each makes a proof fail
(``prove(..., mutant=name)``).

CLI: ``python -m schedconf.spec.symbolic.in_flight [--reqs 4] [--steps 2,3] [--spec 0,2] [--timeout 60]``
prints the proof table (transition x goal group, seconds) and the mutant
table.
"""

# Size: the in-flight (async) encoding is one state, its transitions and its proofs; split, each
# part would import the other two.

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3

import schedconf.spec.v1.invariants
from schedconf.spec.symbolic.state import DEAD
from schedconf.spec.symbolic.z3ops import (
    Z3Ops,
    count,
    eq,
    imax,
    imin,
    is_z3,
    ite,
    land,
    limplies,
    lnot,
    lor,
    to_bool,
    to_term,
    total,
    value_of,
)
from schedconf.spec.v1.view import PREEMPTED, RUNNING, WAITING

INT, BOOL = "int", "bool"

SCALAR_FIELDS = (
    ("is_async", BOOL),
    ("max_concurrent_batches", INT),
    ("current_step", INT),
    ("num_steps", INT),
    ("building", BOOL),
    ("num_spec_tokens", INT),
    ("trim_computed_on_stop", BOOL),
    ("resolve_trimmed_placeholders", BOOL),
    ("pipeline_parallel_size", INT),
    ("decode_stagger", BOOL),
)
SLOT_FIELDS = (
    ("status", INT),
    ("num_tokens", INT),
    ("num_prompt_tokens", INT),
    ("max_tokens", INT),
    ("num_computed_tokens", INT),
    ("num_output_placeholders", INT),
    ("num_in_flight_tokens", INT),
    ("num_stale_output_tokens", INT),
    ("num_spec_token_ids", INT),
    ("next_decode_eligible_step", INT),
)
STEP_FIELDS = (("scheduled", INT), ("samples", BOOL), ("drafts", INT))
"""Per in-flight step ``d`` (oldest first) and slot ``r``: ``field[d][r]``."""

FIELD_NAMES = tuple(name for group in (SCALAR_FIELDS, SLOT_FIELDS, STEP_FIELDS) for name, _ in group)
COUNTERS = tuple(name for name, _ in SLOT_FIELDS if name != "status")


@dataclass(frozen=True)
class FlightShape:
    """The Python-valued bounds: ``R`` request slots, ``D`` steps in flight at most, ``K`` the largest
    ``num_spec_tokens`` (the state's ``num_spec_tokens`` is any ``k`` in ``0..K``; ``k > 0`` under async only)."""

    num_reqs: int = 4
    num_steps: int = 2
    max_spec_tokens: int = 0

    def __post_init__(self) -> None:
        assert 1 <= self.num_reqs <= 10 and 1 <= self.num_steps <= 8 and 0 <= self.max_spec_tokens <= 8

    @property
    def slots(self) -> range:
        return range(self.num_reqs)

    @property
    def steps(self) -> range:
        return range(self.num_steps)

    def label(self) -> str:
        return f"R={self.num_reqs},D={self.num_steps},K={self.max_spec_tokens}"


class FlightState:
    """One state: Python values or Z3 terms (see the module docstring)."""

    __slots__ = FIELD_NAMES + ("shape",)

    def __init__(self, shape: FlightShape, **fields: Any) -> None:
        self.shape = shape
        for name in FIELD_NAMES:
            setattr(self, name, fields[name])

    def replace(self, **changes: Any) -> FlightState:
        """A copy with some fields replaced (lists are shared unless replaced)."""
        unknown = set(changes) - set(FIELD_NAMES)
        assert not unknown, unknown
        fields = {name: getattr(self, name) for name in FIELD_NAMES}
        fields.update(changes)
        return FlightState(self.shape, **fields)

    def leaves(self) -> list[tuple[str, Any]]:
        """Every leaf as ``(name, value)``."""
        out: list[tuple[str, Any]] = [(name, getattr(self, name)) for name, _ in SCALAR_FIELDS]
        for name, _ in SLOT_FIELDS:
            out += [(f"{name}[{r}]", getattr(self, name)[r]) for r in self.shape.slots]
        for name, _ in STEP_FIELDS:
            rows = getattr(self, name)
            out += [(f"{name}[{d}][{r}]", rows[d][r]) for d in self.shape.steps for r in self.shape.slots]
        return out

    def live(self, r: int) -> Any:
        """Slot ``r`` holds a request (WAITING, RUNNING or PREEMPTED)."""
        return lnot(eq(self.status[r], DEAD))

    def is_active(self, d: int) -> Any:
        """Column ``d`` is a step in flight (or the one being built)."""
        return _lt(d, self.num_steps)

    def num_in_flight_scheduled(self, r: int) -> Any:
        """Tokens the steps in flight scheduled for slot ``r``."""
        return total(ite(self.is_active(d), self.scheduled[d][r], 0) for d in self.shape.steps)

    def num_in_flight_sampling_steps(self, r: int) -> Any:
        """Steps in flight in which slot ``r`` samples."""
        return count(land(self.is_active(d), self.samples[d][r]) for d in self.shape.steps)

    def num_in_flight_samples(self, r: int) -> Any:
        """Tokens the steps in flight may sample for slot ``r``: ``1 + drafts`` per step in which it samples
        (``spec/v1/view.py`` counts them so)."""
        return total(
            ite(land(self.is_active(d), self.samples[d][r]), 1 + self.drafts[d][r], 0) for d in self.shape.steps
        )

    def newest_scheduled(self, r: int) -> Any:
        """Tokens the newest step in flight scheduled for slot ``r`` (0 when none is in flight)."""
        return total(ite(eq(self.num_steps, d + 1), self.scheduled[d][r], 0) for d in self.shape.steps)

    def oldest_step(self) -> Any:
        """The step number of ``in_flight[0]`` (in-flight steps are the last ``num_steps`` scheduled)."""
        return self.current_step - self.num_steps + 1


def _lt(a: Any, b: Any) -> Any:
    return to_term(a) < to_term(b) if is_z3(a) or is_z3(b) else a < b


def _le(a: Any, b: Any) -> Any:
    return to_term(a) <= to_term(b) if is_z3(a) or is_z3(b) else a <= b


def fresh_state(shape: FlightShape, tag: str = "s") -> FlightState:
    """A state whose every leaf is a fresh Z3 constant named ``tag.field[index]``."""

    def var(kind: str, name: str) -> Any:
        return z3.Int(name) if kind == INT else z3.Bool(name)

    fields: dict[str, Any] = {name: var(kind, f"{tag}.{name}") for name, kind in SCALAR_FIELDS}
    for name, kind in SLOT_FIELDS:
        fields[name] = [var(kind, f"{tag}.{name}[{r}]") for r in shape.slots]
    for name, kind in STEP_FIELDS:
        fields[name] = [[var(kind, f"{tag}.{name}[{d}][{r}]") for r in shape.slots] for d in shape.steps]
    return FlightState(shape, **fields)


def evaluate(state: FlightState, model: z3.ModelRef) -> FlightState:
    """The Python-valued state of ``state`` under a Z3 model."""

    def value(x: Any) -> Any:
        return value_of(model.eval(x, model_completion=True)) if is_z3(x) else x

    fields: dict[str, Any] = {name: value(getattr(state, name)) for name, _ in SCALAR_FIELDS}
    for name, _ in SLOT_FIELDS:
        fields[name] = [value(x) for x in getattr(state, name)]
    for name, _ in STEP_FIELDS:
        fields[name] = [[value(x) for x in row] for row in getattr(state, name)]
    return FlightState(state.shape, **fields)


def describe(s: FlightState) -> str:
    """A few lines for a Python-valued state."""
    names = {DEAD: "dead", WAITING: "WAITING", RUNNING: "RUNNING", PREEMPTED: "PREEMPTED"}
    lines = [
        f"async={s.is_async} max_concurrent_batches={s.max_concurrent_batches} step={s.current_step} "
        f"in_flight={s.num_steps} building={s.building} num_spec_tokens={s.num_spec_tokens} "
        f"trim_computed_on_stop={s.trim_computed_on_stop} "
        f"resolve_trimmed_placeholders={s.resolve_trimmed_placeholders} "
        f"pipeline_parallel_size={s.pipeline_parallel_size} decode_stagger={s.decode_stagger}"
    ]
    for r in s.shape.slots:
        lines.append(
            f"  r{r}: {names.get(s.status[r], s.status[r])} tokens={s.num_tokens[r]} "
            f"prompt={s.num_prompt_tokens[r]} max={s.max_tokens[r]} computed={s.num_computed_tokens[r]} "
            f"placeholders={s.num_output_placeholders[r]} in_flight={s.num_in_flight_tokens[r]} "
            f"stale={s.num_stale_output_tokens[r]} spec={s.num_spec_token_ids[r]} "
            f"eligible_at={s.next_decode_eligible_step[r]}"
        )
    for d in s.shape.steps:
        cells = " ".join(
            f"r{r}:{s.scheduled[d][r]}{'*' if s.samples[d][r] else ''}"
            + (f"+{s.drafts[d][r]}d" if s.drafts[d][r] else "")
            for r in s.shape.slots
        )
        lines.append(f"  step[{d}]: {cells}")
    return "\n".join(lines)


# ------------------------------------------------------------------ the view the invariants read


class FlightView:
    """The names of :class:`schedconf.spec.v1.view.ConcreteView` that the in-flight invariants read, over a FlightState.

    Dead slots are masked to zeros so that every per-request predicate holds
    on them, as the concrete view simply does not list them. The step the
    view reports (``num_scheduled_tokens``) is the newest in flight, as
    ``ConcreteView`` reads ``pending_output``.
    """

    def __init__(self, s: FlightState) -> None:
        self._s = s
        self.requests = list(s.shape.slots)
        self.num_spec_tokens = s.num_spec_tokens

    def _masked(self, r: int, x: Any) -> Any:
        return ite(self._s.live(r), x, 0)

    def status(self, r: int) -> Any:
        return self._s.status[r]

    def num_tokens(self, r: int) -> Any:
        return self._masked(r, self._s.num_tokens[r])

    def num_computed_tokens(self, r: int) -> Any:
        return self._masked(r, self._s.num_computed_tokens[r])

    def num_output_placeholders(self, r: int) -> Any:
        return self._masked(r, self._s.num_output_placeholders[r])

    def num_in_flight_tokens(self, r: int) -> Any:
        return self._masked(r, self._s.num_in_flight_tokens[r])

    def num_stale_output_tokens(self, r: int) -> Any:
        return self._masked(r, self._s.num_stale_output_tokens[r])

    def num_in_flight_scheduled(self, r: int) -> Any:
        return self._masked(r, self._s.num_in_flight_scheduled(r))

    def num_in_flight_samples(self, r: int) -> Any:
        return self._masked(r, self._s.num_in_flight_samples(r))

    def num_scheduled_tokens(self, r: int) -> Any:
        return self._masked(r, self._s.newest_scheduled(r))


SPEC_INVARIANTS = ("in_flight_accounting", "computed_range", "prefix_hit_capped", "scheduled_only_running")
"""The invariants of ``spec/v1/invariants.py`` this encoding proves (the others concern blocks, queues and the budget)."""


def inv_counters_nonnegative(s: FlightState, o: Any) -> Any:
    """Every counter of a live request is >= 0, and so is every cell of a step in flight."""
    cells = [_le(0, s.scheduled[d][r]) for d in s.shape.steps for r in s.shape.slots]

    def nonnegative(r: int) -> Any:
        return limplies(s.live(r), land(*[_le(0, getattr(s, c)[r]) for c in COUNTERS]))

    return o.and_(o.forall(s.shape.slots, nonnegative, lambda r: f"request {r}"), *cells)


def invariant_formulas(s: FlightState, ops: Any | None = None) -> list[tuple[str, Any]]:
    """``(name, formula)`` for every invariant proved here."""
    ops = ops or Z3Ops()
    view = FlightView(s)
    out = [(f"inv:{name}", schedconf.spec.v1.invariants.INVARIANTS[name](view, ops)) for name in SPEC_INVARIANTS]
    out.append(("inv:counters_nonnegative", inv_counters_nonnegative(s, ops)))
    return out


# ------------------------------------------------------------------ lemmas


def lemma_shape(s: FlightState, o: Any) -> Any:
    """``1 <= max_concurrent_batches <= D``, ``0 <= num_steps <= max_concurrent_batches`` (at least 1 while
    building), ``current_step >= num_steps``; ``0 <= num_spec_tokens <= K``, and ``num_spec_tokens > 0`` only
    under async scheduling (the model refuses steps in flight with spec decode otherwise, and plain spec
    decode with one step is the main encoding's); ``pipeline_parallel_size >= 1``, and ``> 1`` under async
    only; columns past ``num_steps`` are empty; a sampling cell has
    tokens; a cell's drafts are in ``0..num_spec_tokens``, and only a sampling cell has drafts."""
    D = s.shape.num_steps
    k = s.num_spec_tokens
    parts = [
        _le(1, s.max_concurrent_batches),
        _le(s.max_concurrent_batches, D),
        _le(0, s.num_steps),
        _le(s.num_steps, s.max_concurrent_batches),
        limplies(s.building, _le(1, s.num_steps)),
        _le(s.num_steps, s.current_step),
        _le(0, k),
        _le(k, s.shape.max_spec_tokens),
        lor(eq(k, 0), s.is_async),
        # pipeline_parallel_not_modelled: more than one stage under AsyncScheduler only.
        _le(1, s.pipeline_parallel_size),
        lor(eq(s.pipeline_parallel_size, 1), s.is_async),
    ]
    for d in s.shape.steps:
        for r in s.shape.slots:
            cell = s.drafts[d][r]
            parts.append(
                ite(
                    s.is_active(d),
                    land(
                        limplies(s.samples[d][r], _lt(0, s.scheduled[d][r])),
                        _le(0, cell),
                        _le(cell, k),
                        limplies(_lt(0, cell), s.samples[d][r]),
                    ),
                    land(eq(s.scheduled[d][r], 0), lnot(s.samples[d][r]), eq(cell, 0)),
                )
            )
    return land(*parts)


def lemma_slots(s: FlightState, o: Any) -> Any:
    """A slot is dead (all counters 0) or holds a request with ``1 <= num_prompt_tokens <= num_tokens`` and
    ``max_tokens >= 1``."""
    parts = []
    for r in s.shape.slots:
        st = s.status[r]
        dead = land(*[eq(getattr(s, c)[r], 0) for c in COUNTERS])
        live = land(
            _le(1, s.num_prompt_tokens[r]), _le(s.num_prompt_tokens[r], s.num_tokens[r]), _le(1, s.max_tokens[r])
        )
        parts.append(
            lor(land(eq(st, DEAD), dead), land(lor(eq(st, WAITING), eq(st, RUNNING), eq(st, PREEMPTED)), live))
        )
    return land(*parts)


def lemma_status_accounting(s: FlightState, o: Any) -> Any:
    """WAITING: nothing computed or in flight, no drafts. PREEMPTED: nothing computed, no placeholder, no drafts,
    all in-flight tokens stale. RUNNING: nothing stale; async, ``1 + drafts`` placeholders per in-flight step in
    which it samples (each such step resolves exactly that many: the rejected drafts and the returned tokens),
    plain none; its ``spec_token_ids`` are ``[]`` or ``[-1] * num_spec_tokens``."""
    parts = []
    for r in s.shape.slots:
        st, comp, ph = s.status[r], s.num_computed_tokens[r], s.num_output_placeholders[r]
        fl, stale, spec = s.num_in_flight_tokens[r], s.num_stale_output_tokens[r], s.num_spec_token_ids[r]
        parts.append(limplies(eq(st, WAITING), land(eq(comp, 0), eq(ph, 0), eq(fl, 0), eq(stale, 0), eq(spec, 0))))
        parts.append(limplies(eq(st, PREEMPTED), land(eq(comp, 0), eq(ph, 0), eq(stale, fl), eq(spec, 0))))
        parts.append(
            limplies(
                eq(st, RUNNING),
                land(
                    eq(stale, 0),
                    eq(ph, ite(s.is_async, s.num_in_flight_samples(r), 0)),
                    lor(eq(spec, 0), eq(spec, s.num_spec_tokens)),
                ),
            )
        )
    return land(*parts)


def lemma_decode_progress(s: FlightState, o: Any) -> Any:
    """A live request has fewer than ``num_prompt_tokens + max_tokens`` tokens (reaching it stops it). A RUNNING
    one with a sampling step in flight has computed up to the position that step samples:
    ``num_tokens + placeholders - 1`` (async; with drafts too: a step scheduled ``d`` drafts past
    ``num_tokens + placeholders`` and adds ``1 + d`` placeholders, and a returned output moves
    ``computed`` by ``-rejected``, ``placeholders`` by ``-(1 + d)`` and ``num_tokens`` by ``1 + accepted``),
    ``num_tokens`` (plain, where it therefore samples in one step in flight at most: it wants no token until
    that output returns). Any RUNNING one has ``computed <= num_tokens + placeholders - 1`` (async) /
    ``<= num_tokens`` (plain): drafts are scheduled past that point only."""
    parts = []
    for r in s.shape.slots:
        parts.append(limplies(s.live(r), _lt(s.num_tokens[r], s.num_prompt_tokens[r] + s.max_tokens[r])))
        sampled = s.num_tokens[r] + s.num_output_placeholders[r] - ite(s.is_async, 1, 0)
        running = eq(s.status[r], RUNNING)
        parts.append(
            limplies(land(running, _lt(0, s.num_in_flight_sampling_steps(r))), eq(s.num_computed_tokens[r], sampled))
        )
        parts.append(limplies(running, _le(s.num_computed_tokens[r], sampled)))
        parts.append(limplies(land(running, lnot(s.is_async)), _le(s.num_in_flight_sampling_steps(r), 1)))
    return land(*parts)


def lemma_decode_stagger(s: FlightState, o: Any) -> Any:
    """Async with the decode stagger on (V2 runner, ``pp_decode_stagger``): a live request's
    ``next_decode_eligible_step`` is at least ``pipeline_parallel_size`` past every step in flight in which it
    samples, so two such steps lie at least ``pipeline_parallel_size`` steps apart (the workers' sampled-token
    ring holds its previous token by then)."""
    on = land(s.is_async, s.decode_stagger)
    pp = s.pipeline_parallel_size
    parts = []
    for r in s.shape.slots:
        for d in s.shape.steps:
            sampling = land(on, s.live(r), s.is_active(d), s.samples[d][r])
            parts.append(limplies(sampling, _le(s.oldest_step() + d + pp, s.next_decode_eligible_step[r])))
            for e in range(d + 1, s.shape.num_steps):
                both = land(sampling, s.is_active(e), s.samples[e][r])
                parts.append(limplies(both, _le(pp, e - d)))
    return land(*parts)


LEMMAS: dict[str, Callable[[FlightState, Any], Any]] = {
    "shape": lemma_shape,
    "slots": lemma_slots,
    "status_accounting": lemma_status_accounting,
    "decode_progress": lemma_decode_progress,
    "decode_stagger": lemma_decode_stagger,
}


def prop_samples_within_max_tokens(s: FlightState, o: Any) -> Any:
    """Async: a RUNNING request never has more sampling steps in flight than tokens left to ``max_tokens``
    (``num_tokens + sampling steps <= num_prompt_tokens + max_tokens``; without drafts the steps are the
    placeholders): the job of the max_tokens skip rule (each sampling step returns at least one token).

    Not one of the proved invariants: it holds with at most 2 steps in flight (``D = 2``) and fails with 3
    (the rule subtracts ``placeholders - 1`` as if they were drafts that may be rejected), in the model and
    in vLLM 0.33 alike; see ``PROPERTIES`` and the tests.
    """
    return land(
        *[
            limplies(
                land(s.is_async, eq(s.status[r], RUNNING)),
                _le(s.num_tokens[r] + s.num_in_flight_sampling_steps(r), s.num_prompt_tokens[r] + s.max_tokens[r]),
            )
            for r in s.shape.slots
        ]
    )


PROPERTIES: dict[str, Callable[[FlightState, Any], Any]] = {
    "samples_within_max_tokens": prop_samples_within_max_tokens,
}
"""Properties proved on request (``prove(..., properties=...)``): assumed before, proved after, like a lemma."""


def lemma_formulas(s: FlightState, ops: Any | None = None) -> list[tuple[str, Any]]:
    ops = ops or Z3Ops()
    return [(f"lemma:{name}", fn(s, ops)) for name, fn in LEMMAS.items()]


# ------------------------------------------------------------------ transitions

Check = tuple[str, Any]


@dataclass
class Move:
    """What one transition does: next state, the guard under which the model takes it, the model's assertions."""

    post: FlightState
    guard: Any
    checks: list[Check] = field(default_factory=list)


def _put(values: list[Any], q: Any, new: Any) -> list[Any]:
    """``values`` with entry ``q`` (possibly symbolic) replaced by ``new``."""
    return [ite(eq(q, r), new, values[r]) for r in range(len(values))]


def _at(values: list[Any], q: Any) -> Any:
    """``values[q]`` for a possibly symbolic slot ``q`` (0 or False when out of range)."""
    if not is_z3(q):
        return values[q] if 0 <= q < len(values) else 0
    first = values[0]
    out: Any = False if isinstance(first, bool) or (is_z3(first) and z3.is_bool(first)) else 0
    for r in reversed(range(len(values))):
        out = ite(eq(q, r), values[r], out)
    return out


def _slot_ok(s: FlightState, q: Any) -> Any:
    return land(_le(0, q), _lt(q, s.shape.num_reqs))


def _newest_cell(s: FlightState, name: str, q: Any) -> Any:
    """``name[num_steps - 1][q]``: slot ``q``'s cell of the step being built."""
    rows = getattr(s, name)
    out: Any = False if name == "samples" else 0
    for d in reversed(s.shape.steps):
        out = ite(eq(s.num_steps, d + 1), _at(rows[d], q), out)
    return out


def _set_newest_cell(s: FlightState, name: str, q: Any, value: Any) -> list[list[Any]]:
    rows = getattr(s, name)
    return [
        [ite(land(eq(s.num_steps, d + 1), eq(q, r)), value, rows[d][r]) for r in s.shape.slots] for d in s.shape.steps
    ]


def _kill(s: FlightState, cond: Callable[[int], Any]) -> dict[str, list[Any]]:
    """Slot fields with every slot ``r`` where ``cond(r)`` made dead (status DEAD, counters 0)."""
    fields = {"status": [ite(cond(r), DEAD, s.status[r]) for r in s.shape.slots]}
    for c in COUNTERS:
        fields[c] = [ite(cond(r), 0, getattr(s, c)[r]) for r in s.shape.slots]
    return fields


def begin_step(s: FlightState, inp: dict[str, Any], mutant: str | None = None) -> Move:
    """``Scheduler.schedule()`` entry: refused (``output_not_processed``) unless fewer than
    ``max_concurrent_batches`` steps are in flight; ``current_step += 1``; the new step's record
    (``self.in_flight.append``) is the column ``num_steps`` (empty by the shape lemma)."""
    guard = land(lnot(s.building), _lt(s.num_steps, s.max_concurrent_batches))
    return Move(s.replace(num_steps=s.num_steps + 1, current_step=s.current_step + 1, building=True), guard)


def schedule_refused(s: FlightState, inp: dict[str, Any], mutant: str | None = None) -> Move:
    """``Scheduler.schedule()`` with ``max_concurrent_batches`` steps in flight: InvalidEvent
    ``output_not_processed``, nothing changed."""
    return Move(s, land(lnot(s.building), _le(s.max_concurrent_batches, s.num_steps)))


def end_step(s: FlightState, inp: dict[str, Any], mutant: str | None = None) -> Move:
    """``Scheduler.schedule()`` return: the step is in flight."""
    return Move(s.replace(building=False), s.building)


def is_sure_to_reach_max_tokens(s: FlightState, q: Any) -> Any:
    """``Scheduler._is_sure_to_reach_max_tokens``: placeholders > 0 and
    computed + 2 - placeholders >= prompt + max_tokens."""
    ph = _at(s.num_output_placeholders, q)
    return land(
        _lt(0, ph), _le(_at(s.num_prompt_tokens, q) + _at(s.max_tokens, q), _at(s.num_computed_tokens, q) + 2 - ph)
    )


def _schedule_tokens(
    s: FlightState, q: Any, n: Any, computed_before: Any, status: Any, drafts: Any = 0, spec_before: Any = None
) -> FlightState:
    """Record ``n`` tokens and ``drafts`` scheduled drafts for slot ``q`` in the step being built and apply
    ``Scheduler._update_after_schedule`` to it: ``computed += n``, ``in_flight += n``,
    ``is_prefill_chunk = computed < num_tokens + placeholders``, samples iff not a chunk, and (AsyncScheduler)
    when not a chunk ``placeholders += 1 + drafts`` and ``spec_token_ids = [-1] * num_spec_tokens``, and with
    the decode stagger ``next_decode_eligible_step = current_step + pipeline_parallel_size``.
    ``spec_before``: the length of ``spec_token_ids`` after the loop that scheduled it (default: unchanged)."""
    computed = computed_before + n
    ph = _at(s.num_output_placeholders, q)
    is_prefill_chunk = _lt(computed, _at(s.num_tokens, q) + ph)
    sampled_async = land(s.is_async, lnot(is_prefill_chunk))
    spec = _at(s.num_spec_token_ids, q) if spec_before is None else spec_before
    eligible = ite(
        land(sampled_async, s.decode_stagger),
        s.current_step + s.pipeline_parallel_size,
        _at(s.next_decode_eligible_step, q),
    )
    return s.replace(
        next_decode_eligible_step=_put(s.next_decode_eligible_step, q, eligible),
        status=_put(s.status, q, status),
        num_computed_tokens=_put(s.num_computed_tokens, q, computed),
        num_in_flight_tokens=_put(s.num_in_flight_tokens, q, _at(s.num_in_flight_tokens, q) + n),
        num_output_placeholders=_put(s.num_output_placeholders, q, ph + ite(sampled_async, 1 + drafts, 0)),
        num_spec_token_ids=_put(s.num_spec_token_ids, q, ite(sampled_async, s.num_spec_tokens, spec)),
        scheduled=_set_newest_cell(s, "scheduled", q, n),
        samples=_set_newest_cell(s, "samples", q, lnot(is_prefill_chunk)),
        drafts=_set_newest_cell(s, "drafts", q, drafts),
    )


def schedule_running(s: FlightState, inp: dict[str, Any], mutant: str | None = None) -> Move:
    """One scheduled request of ``Scheduler._schedule_running``, then its ``_update_after_schedule``.

    Not skipped by the async max_tokens rule nor by the decode stagger (``current_step <
    next_decode_eligible_step``);
    ``num_new_tokens = num_tokens + len(spec_token_ids) + placeholders - computed`` (the model asserts it is
    >= 0), cut by the threshold, budget and ``max_model_len`` to any ``n`` in ``[1, that]`` (input
    ``num_new_tokens``; 0 means skipped: no transition). ``_schedule_drafts``: with ``spec_token_ids``, the
    drafts scheduled are ``max(0, min(len(spec_token_ids), n + computed - num_tokens - placeholders))``
    (``get_num_scheduled_spec_tokens``), and ``spec_token_ids`` is cleared.
    """
    q, n = inp["slot"], inp["num_new_tokens"]
    tokens, ph, computed = _at(s.num_tokens, q), _at(s.num_output_placeholders, q), _at(s.num_computed_tokens, q)
    spec = _at(s.num_spec_token_ids, q)
    wanted = tokens + spec + ph - computed
    skip = False if mutant == "async_max_tokens_skip_missing" else is_sure_to_reach_max_tokens(s, q)
    staggered = (
        False if mutant == "decode_stagger_ignored" else _lt(s.current_step, _at(s.next_decode_eligible_step, q))
    )
    guard = land(
        s.building,
        _slot_ok(s, q),
        eq(_at(s.status, q), RUNNING),
        eq(_newest_cell(s, "scheduled", q), 0),
        lnot(skip),
        lnot(staggered),
        _le(1, n),
        _le(n, wanted),
    )
    past = n + computed - tokens - (0 if mutant == "async_drafts_with_placeholders_pending" else ph)
    drafts = ite(_lt(0, spec), imax(0, imin(spec, past)), 0)
    post = _schedule_tokens(s, q, n, computed, RUNNING, drafts, spec_before=0)
    return Move(post, guard, [("num_new_tokens >= 0", _le(0, wanted))])


def preempt(s: FlightState, inp: dict[str, Any], mutant: str | None = None) -> Move:
    """``Scheduler._preempt_request`` of a running request (after ``_remove_priority_victim``'s ``index`` repair
    took back the tokens and drafts it was given in this step): PREEMPTED, computed 0, ``stale = in_flight``,
    placeholders 0, ``spec_token_ids`` cleared."""
    q = inp["slot"]
    given = _newest_cell(s, "scheduled", q)
    in_flight = _at(s.num_in_flight_tokens, q) - given
    stale = 0 if mutant == "stale_output_applied_as_fresh" else in_flight
    placeholders = _at(s.num_output_placeholders, q) if mutant == "placeholders_kept_on_preempt" else 0
    guard = land(s.building, _slot_ok(s, q), eq(_at(s.status, q), RUNNING))
    post = s.replace(
        status=_put(s.status, q, PREEMPTED),
        num_computed_tokens=_put(s.num_computed_tokens, q, 0),
        num_in_flight_tokens=_put(s.num_in_flight_tokens, q, in_flight),
        num_stale_output_tokens=_put(s.num_stale_output_tokens, q, stale),
        num_output_placeholders=_put(s.num_output_placeholders, q, placeholders),
        num_spec_token_ids=_put(s.num_spec_token_ids, q, 0),
        scheduled=_set_newest_cell(s, "scheduled", q, 0),
        samples=_set_newest_cell(s, "samples", q, False),
        drafts=_set_newest_cell(s, "drafts", q, 0),
    )
    return Move(post, guard)


def admit(s: FlightState, inp: dict[str, Any], mutant: str | None = None) -> Move:
    """One admission of ``Scheduler._schedule_waiting``, then its ``_update_after_schedule``.

    A request with stale output in flight is skipped (not admitted); the prefix hit ``hit`` is any number
    below ``num_tokens``; ``num_new_tokens`` any ``n`` in ``[1, num_tokens - hit]``, or (input ``padded``,
    ``_should_pad_to_spec_size``, spec decode only) a one-token admission padded to ``n = 1 + num_spec_tokens``
    with ``num_spec_tokens`` drafts (``-1``s; cut by the threshold it crashes the engine instead: no transition).
    """
    q, hit, n, padded = inp["slot"], inp["hit"], inp["num_new_tokens"], inp["padded"]
    k = s.num_spec_tokens
    status = _at(s.status, q)
    stale_ok = True if mutant == "stale_request_resumed_early" else eq(_at(s.num_stale_output_tokens, q), 0)
    computed = _at(s.num_computed_tokens, q)
    # The model: num_computed_tokens if it is nonzero, else the prefix hit.
    computed_before = ite(eq(computed, 0), hit, computed)
    left = _at(s.num_tokens, q) - computed_before
    size = ite(padded, land(_lt(0, k), eq(left, 1), eq(n, 1 + k)), land(_le(1, n), _le(n, left)))
    guard = land(
        s.building,
        _slot_ok(s, q),
        lor(eq(status, WAITING), eq(status, PREEMPTED)),
        eq(_newest_cell(s, "scheduled", q), 0),
        stale_ok,
        _le(0, hit),
        _lt(hit, _at(s.num_tokens, q)),
        size,
    )
    return Move(_schedule_tokens(s, q, n, computed_before, RUNNING, ite(padded, k, 0)), guard)


def apply_output(s: FlightState, inp: dict[str, Any], mutant: str | None = None) -> Move:
    """``Scheduler.update_from_output`` of the oldest step in flight (``get_in_flight_output(oldest)``).

    Inputs per slot: ``returned`` (tokens in the model output; ``_validate_model_output``: a sampling request
    ``0 .. 1 + drafts``, at least 1 under async scheduling or with drafts scheduled; a prefill chunk 0),
    ``stop`` (a returned token stops the request; the one that reaches ``max_tokens`` must), ``kept`` (the
    tokens appended: up to and including the stopping one, else all). Per request still
    live and scheduled in the step: ``in_flight -= n``; if stale, ``stale -= n`` and no counter moves but the
    tokens appended (no rollback, no trim, no resolution); else ``_reject_drafts`` (``rejected = drafts -
    (returned - 1)`` off ``computed`` if > 0 and off ``placeholders`` if > 0), then ``_append_output_tokens``
    (on a stop, ``computed -= returned - kept`` if ``trim_computed_on_stop``; placeholders, if any, ``-=
    returned`` or, without ``resolve_trimmed_placeholders``, ``-= kept``). A stopped request is freed
    (``_update_draft_token_ids`` does not run under async; without async there are no drafts here). Then the
    step leaves ``in_flight``.
    """
    returned, kept, stop = inp["returned"], inp["kept"], inp["stop"]
    guard_parts = [lnot(s.building), _le(1, s.num_steps)]
    checks: list[Check] = []
    fields: dict[str, list[Any]] = {c: list(getattr(s, c)) for c in ("status",) + COUNTERS}
    stopped: dict[int, Any] = {}
    for r in s.shape.slots:
        n, samples, drafts = s.scheduled[0][r], s.samples[0][r], s.drafts[0][r]
        touched = land(s.live(r), _lt(0, n))
        got, keep = returned[r], kept[r]
        valid = ite(
            samples,
            land(
                _le(0, got),
                _le(got, 1 + drafts),
                limplies(s.is_async, _le(1, got)),
                limplies(_lt(0, drafts), _le(1, got)),
            ),
            eq(got, 0),
        )
        guard_parts.append(limplies(touched, valid))
        is_stale = _lt(0, s.num_stale_output_tokens[r])
        in_flight = s.num_in_flight_tokens[r] - n
        stale = ite(is_stale, s.num_stale_output_tokens[r] - n, s.num_stale_output_tokens[r])
        checks.append((f"stale >= 0 after the drain (r{r})", limplies(touched, _le(0, stale))))
        appended = land(touched, _lt(0, got))
        tokens = s.num_tokens[r] + ite(appended, keep, 0)
        limit = s.num_prompt_tokens[r] + s.max_tokens[r]
        guard_parts.append(limplies(stop[r], appended))
        guard_parts.append(ite(stop[r], land(_le(1, keep), _le(keep, got)), eq(keep, ite(appended, got, 0))))
        # The stop check runs per token: none goes past max_tokens, and the one that reaches it stops.
        guard_parts.append(limplies(appended, _le(tokens, limit)))
        guard_parts.append(limplies(land(appended, eq(tokens, limit)), stop[r]))
        stopped[r] = land(appended, stop[r])
        fresh = land(touched, lnot(is_stale))
        comp, ph = s.num_computed_tokens[r], s.num_output_placeholders[r]
        rejected = drafts - (got - 1)
        rolls_back = land(fresh, _lt(0, drafts), _lt(0, got))
        # vLLM guards both with "> 0" (0.32's AsyncScheduler resolution has no guard): never needed.
        checks.append(
            (
                f"computed > 0 and placeholders > 0 at a rollback (r{r})",
                limplies(land(rolls_back, s.is_async), land(_lt(0, comp), _lt(0, ph))),
            )
        )
        comp = ite(land(rolls_back, _lt(0, comp)), comp - rejected, comp)
        ph = ite(land(rolls_back, _lt(0, ph)), ph - rejected, ph)
        checks.append(
            (
                f"placeholders > 0 when fresh async output resolves them (r{r})",
                limplies(land(appended, fresh, s.is_async), _lt(0, ph)),
            )
        )
        comp = ite(land(stopped[r], fresh, s.trim_computed_on_stop), comp - (got - keep), comp)
        ph = ite(land(appended, fresh, _lt(0, ph)), ph - ite(s.resolve_trimmed_placeholders, got, keep), ph)
        checks.append((f"placeholders >= 0 after the update (r{r})", limplies(touched, _le(0, ph))))
        fields["num_in_flight_tokens"][r] = ite(touched, in_flight, s.num_in_flight_tokens[r])
        fields["num_stale_output_tokens"][r] = ite(touched, stale, s.num_stale_output_tokens[r])
        fields["num_tokens"][r] = tokens
        fields["num_computed_tokens"][r] = comp
        fields["num_output_placeholders"][r] = ph
    post = s.replace(**fields)
    post = post.replace(**_kill(post, lambda r: stopped[r]))
    D = s.shape.num_steps
    post = post.replace(
        num_steps=s.num_steps - 1,
        scheduled=[list(s.scheduled[d + 1]) for d in range(D - 1)] + [[0] * s.shape.num_reqs],
        samples=[list(s.samples[d + 1]) for d in range(D - 1)] + [[False] * s.shape.num_reqs],
        drafts=[list(s.drafts[d + 1]) for d in range(D - 1)] + [[0] * s.shape.num_reqs],
    )
    return Move(post, land(*guard_parts), checks)


def _output_refused(s: FlightState, k: Any, duplicate: bool) -> Move:
    in_range = land(lnot(s.building), _le(1, k), _le(k, s.current_step))
    if duplicate:
        guard = land(in_range, lor(eq(s.num_steps, 0), _lt(k, s.oldest_step())))
    else:
        guard = land(in_range, _le(1, s.num_steps), _lt(s.oldest_step(), k))
    return Move(s, guard)


def output_duplicate(s: FlightState, inp: dict[str, Any], mutant: str | None = None) -> Move:
    """``Scheduler.get_in_flight_output(k)`` for a step whose output was applied: InvalidEvent
    ``duplicate_model_output``, nothing changed."""
    return _output_refused(s, inp["step"], duplicate=True)


def output_out_of_order(s: FlightState, inp: dict[str, Any], mutant: str | None = None) -> Move:
    """``Scheduler.get_in_flight_output(k)`` for a step in flight behind an older one: InvalidEvent
    ``model_output_out_of_order``, nothing changed."""
    return _output_refused(s, inp["step"], duplicate=False)


def abort(s: FlightState, inp: dict[str, Any], mutant: str | None = None) -> Move:
    """``Scheduler.abort`` of a live request (``finish_requests``): freed; its cells in the steps in flight stay
    (their output skips it)."""
    q = inp["slot"]
    guard = land(lnot(s.building), _slot_ok(s, q), lnot(eq(_at(s.status, q), DEAD)))
    return Move(s.replace(**_kill(s, lambda r: eq(q, r))), guard)


def add_request(s: FlightState, inp: dict[str, Any], mutant: str | None = None) -> Move:
    """``Scheduler.add_request`` into a free slot: WAITING, every counter 0. A slot that a step in flight
    still schedules is not free (the model's ``request_id_in_flight`` refusal: the drift guard gives a new id
    a slot of its own)."""
    q, p, m = inp["slot"], inp["num_prompt_tokens"], inp["max_tokens"]
    referenced = lor(*[land(s.is_active(d), _lt(0, _at(s.scheduled[d], q))) for d in s.shape.steps])
    free = True if mutant == "in_flight_id_reused" else lnot(referenced)
    guard = land(lnot(s.building), _slot_ok(s, q), eq(_at(s.status, q), DEAD), free, _le(1, p), _le(1, m))
    fields = {c: _put(getattr(s, c), q, 0) for c in COUNTERS}
    fields.update(
        status=_put(s.status, q, WAITING),
        num_tokens=_put(s.num_tokens, q, p),
        num_prompt_tokens=_put(s.num_prompt_tokens, q, p),
        max_tokens=_put(s.max_tokens, q, m),
    )
    return Move(s.replace(**fields), guard)


Inputs = Callable[[FlightShape, str], dict[str, Any]]


def _no_inputs(shape: FlightShape, tag: str) -> dict[str, Any]:
    return {}


def _slot_inputs(*names: str) -> Inputs:
    def make(shape: FlightShape, tag: str) -> dict[str, Any]:
        return {name: z3.Int(f"{tag}.{name}") for name in ("slot",) + names}

    return make


def _output_inputs(shape: FlightShape, tag: str) -> dict[str, Any]:
    return {
        "returned": [z3.Int(f"{tag}.returned[{r}]") for r in shape.slots],
        "kept": [z3.Int(f"{tag}.kept[{r}]") for r in shape.slots],
        "stop": [z3.Bool(f"{tag}.stop[{r}]") for r in shape.slots],
    }


def _admit_inputs(shape: FlightShape, tag: str) -> dict[str, Any]:
    return {**_slot_inputs("hit", "num_new_tokens")(shape, tag), "padded": z3.Bool(f"{tag}.padded")}


def _step_input(shape: FlightShape, tag: str) -> dict[str, Any]:
    return {"step": z3.Int(f"{tag}.step")}


@dataclass(frozen=True)
class Transition:
    name: str
    apply: Callable[[FlightState, dict[str, Any], str | None], Move]
    inputs: Inputs


TRANSITIONS: dict[str, Transition] = {
    t.name: t
    for t in (
        Transition("begin_step", begin_step, _no_inputs),
        Transition("schedule_refused", schedule_refused, _no_inputs),
        Transition("schedule_running", schedule_running, _slot_inputs("num_new_tokens")),
        Transition("preempt", preempt, _slot_inputs()),
        Transition("admit", admit, _admit_inputs),
        Transition("end_step", end_step, _no_inputs),
        Transition("apply_output", apply_output, _output_inputs),
        Transition("output_duplicate", output_duplicate, _step_input),
        Transition("output_out_of_order", output_out_of_order, _step_input),
        Transition("abort", abort, _slot_inputs()),
        Transition("add_request", add_request, _slot_inputs("num_prompt_tokens", "max_tokens")),
    )
}

MUTANT_RULES: dict[str, tuple[str, str]] = {
    "stale_output_applied_as_fresh": ("preempt", "lemma:status_accounting"),
    "placeholders_kept_on_preempt": ("preempt", "lemma:status_accounting"),
    "stale_request_resumed_early": ("admit", "lemma:status_accounting"),
    "in_flight_id_reused": ("add_request", "inv:in_flight_accounting"),
    "async_max_tokens_skip_missing": ("schedule_running", "prop:samples_within_max_tokens"),
    "async_drafts_with_placeholders_pending": ("schedule_running", "lemma:decode_progress"),
    "decode_stagger_ignored": ("schedule_running", "lemma:decode_stagger"),
}
"""Mutants of ``conformance/checking/mutants.py`` the encoding expresses: (the transition they change, a goal that fails)."""


# ------------------------------------------------------------------ proofs

PROVED, FAILED, UNKNOWN, VACUOUS = "proved", "counterexample", "unknown", "vacuous"


def premises(s: FlightState) -> list[Any]:
    """Invariants and lemmas of ``s`` as Z3 Booleans."""
    return [to_bool(f) for _, f in invariant_formulas(s) + lemma_formulas(s)]


def get_failing_premises(s: FlightState) -> list[str]:
    """The invariants and lemmas a Python-valued state violates (the drift guard's initial state must satisfy
    them all: the induction starts there)."""
    return [
        name
        for name, f in invariant_formulas(s) + lemma_formulas(s)
        if not value_of(z3.simplify(to_bool(f)) if is_z3(f) else f)
    ]


@dataclass
class FlightResult:
    """The outcome of proving one transition at one shape (``mutant``: the encoding of that mutant)."""

    transition: str
    shape: FlightShape
    mutant: str | None
    status: str
    seconds: float
    goals: dict[str, str] = field(default_factory=dict)
    goal_seconds: dict[str, float] = field(default_factory=dict)
    counterexamples: dict[str, str] = field(default_factory=dict)
    """Per failed goal: the pre-state, inputs and post-state, rendered."""


def goal_names() -> list[str]:
    """The goals of every proof, in the order they are proved (each proved goal is assumed for the next)."""
    return (
        ["checks"]
        + [f"lemma:{n}" for n in LEMMAS]
        + [f"inv:{n}" for n in SPEC_INVARIANTS]
        + ["inv:counters_nonnegative"]
    )


def prove(
    shape: FlightShape, name: str, timeout_s: float = 60.0, mutant: str | None = None, properties: tuple[str, ...] = ()
) -> FlightResult:
    """Prove ``Inv(pre) and Lemmas(pre) and guard => checks and Lemmas(post) and Inv(post)`` for transition ``name``.

    One Z3 query per goal (its negation must be unsatisfiable); the premises must be satisfiable (else
    ``vacuous``). A failed goal keeps a rendered counterexample. ``properties`` (names of
    :data:`PROPERTIES`) are added to the premises and the goals.
    """
    t0 = time.monotonic()
    transition = TRANSITIONS[name]
    result = FlightResult(name, shape, mutant, PROVED, 0.0)
    pre = fresh_state(shape, "pre")
    inputs = transition.inputs(shape, "in")
    move = transition.apply(pre, inputs, mutant)

    def remaining_ms() -> int:
        return max(1, int((timeout_s - (time.monotonic() - t0)) * 1000))

    solver = z3.Solver()
    solver.add(*premises(pre), to_bool(move.guard), *[to_bool(PROPERTIES[p](pre, Z3Ops())) for p in properties])
    solver.set("timeout", remaining_ms())
    if solver.check() != z3.sat:
        result.status, result.seconds = VACUOUS, time.monotonic() - t0
        return result
    post_goals: list[tuple[str, Callable[[], Any]]] = [("checks", lambda: land(*[c for _, c in move.checks]))]
    post_goals += [(g, lambda f=f: f) for g, f in lemma_formulas(move.post) + invariant_formulas(move.post)]
    post_goals += [(f"prop:{p}", lambda p=p: PROPERTIES[p](move.post, Z3Ops())) for p in properties]
    for goal, build in post_goals:
        t_goal = time.monotonic()
        formula = to_bool(build())
        solver.push()
        solver.add(z3.Not(formula))
        solver.set("timeout", remaining_ms())
        verdict = solver.check()
        if verdict == z3.unsat:
            status = PROVED
        elif verdict == z3.sat:
            status = FAILED
            model = solver.model()
            values = {
                k: (
                    [value_of(model.eval(x, model_completion=True)) for x in v]
                    if isinstance(v, list)
                    else value_of(model.eval(v, model_completion=True))
                )
                for k, v in inputs.items()
            }
            result.counterexamples[goal] = "\n".join(
                [
                    f"goal {goal} fails after {name}" + (f" (mutant {mutant})" if mutant else ""),
                    f"inputs: {values}",
                    "state before:",
                    describe(evaluate(pre, model)),
                    "state after:",
                    describe(evaluate(move.post, model)),
                ]
            )
        else:
            status = UNKNOWN
        solver.pop()
        result.goals[goal] = status
        result.goal_seconds[goal] = time.monotonic() - t_goal
        if status == PROVED:
            solver.add(formula)
    statuses = set(result.goals.values())
    result.status = FAILED if FAILED in statuses else UNKNOWN if UNKNOWN in statuses else PROVED
    result.seconds = time.monotonic() - t0
    return result


def prove_all(shape: FlightShape, timeout_s: float = 60.0, names: list[str] | None = None) -> list[FlightResult]:
    """Prove every transition (or ``names``) at ``shape``."""
    return [prove(shape, name, timeout_s) for name in names or TRANSITIONS]


def prove_mutant(shape: FlightShape, mutant: str, timeout_s: float = 60.0) -> FlightResult:
    """Prove the transition ``mutant`` changes, with the mutant's rule (and the property its goal names): a goal
    must fail (``async_drafts_with_placeholders_pending`` needs ``K >= 1``)."""
    name, goal = MUTANT_RULES[mutant]
    properties = (goal.removeprefix("prop:"),) if goal.startswith("prop:") else ()
    return prove(shape, name, timeout_s, mutant, properties)


def render_table(results: list[FlightResult]) -> str:
    """Markdown: one row per transition and shape, one column per goal (seconds, or the status if not proved)."""
    goals = goal_names()
    short = {g: g.split(":", 1)[-1] for g in goals}
    lines = [
        "| transition | bounds | " + " | ".join(short[g] for g in goals) + " | total (s) |",
        "|---|---|" + "---|" * len(goals) + "---|",
    ]
    for res in results:
        cells = []
        for g in goals:
            st = res.goals.get(g, res.status if res.status == VACUOUS else "-")
            cells.append(f"{res.goal_seconds[g]:.2f}" if st == PROVED else st)
        lines.append(
            f"| {res.transition}{' [' + res.mutant + ']' if res.mutant else ''} | {res.shape.label()} | "
            + " | ".join(cells)
            + f" | {res.seconds:.2f} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ the bridge to the model (drift guard)


def from_scheduler(sched: Any, shape: FlightShape, slot_of: dict[str, int]) -> FlightState:
    """The FlightState of a concrete scheduler between two calls; ``slot_of`` maps request ids to slots.

    Every live request and every id a step in flight scheduled must have a slot; ``num_spec_tokens`` must be
    at most the shape's ``K``.
    """
    from schedconf.spec.v1.view import STATUS_CODES

    k = sched.config.num_spec_tokens
    assert k <= shape.max_spec_tokens, f"num_spec_tokens={k} exceeds K={shape.max_spec_tokens}"
    assert k == 0 or sched.profile.async_scheduling, "spec decode without async scheduling is not encoded here"
    R = shape.num_reqs
    fields: dict[str, Any] = {c: [0] * R for c in COUNTERS}
    fields["status"] = [DEAD] * R
    for rid, req in sched.requests.items():
        r = slot_of[rid]
        assert not getattr(req, "drop_stale_output", False), f"{rid}: drop_stale_output is not encoded"
        fields["status"][r] = STATUS_CODES[req.status]
        fields["num_tokens"][r] = req.num_tokens
        fields["num_prompt_tokens"][r] = req.num_prompt_tokens
        fields["max_tokens"][r] = req.max_tokens
        fields["num_computed_tokens"][r] = req.num_computed_tokens
        fields["num_output_placeholders"][r] = req.num_output_placeholders
        fields["num_in_flight_tokens"][r] = req.num_in_flight_tokens
        fields["num_stale_output_tokens"][r] = req.num_stale_output_tokens
        fields["num_spec_token_ids"][r] = len(req.spec_token_ids)
        fields["next_decode_eligible_step"][r] = req.next_decode_eligible_step
    records = list(sched.in_flight)
    assert len(records) <= shape.num_steps, f"{len(records)} steps in flight exceed D={shape.num_steps}"
    scheduled = [[0] * R for _ in shape.steps]
    samples = [[False] * R for _ in shape.steps]
    drafts = [[0] * R for _ in shape.steps]
    for d, rec in enumerate(records):
        for rid, n in rec.output.num_scheduled_tokens.items():
            scheduled[d][slot_of[rid]] = n
            samples[d][slot_of[rid]] = bool(rec.samples.get(rid))
            drafts[d][slot_of[rid]] = len(rec.output.scheduled_spec_decode_tokens.get(rid, ()))
    profile = sched.profile
    return FlightState(
        shape,
        is_async=bool(profile.async_scheduling),
        max_concurrent_batches=sched.config.max_concurrent_batches,
        current_step=sched.current_step,
        num_steps=len(records),
        building=False,
        num_spec_tokens=k,
        trim_computed_on_stop=bool(profile.trim_computed_on_stop),
        resolve_trimmed_placeholders=bool(profile.resolve_trimmed_placeholders),
        pipeline_parallel_size=sched.config.pipeline_parallel_size,
        decode_stagger=bool(sched.config.use_v2_model_runner and profile.pp_decode_stagger),
        scheduled=scheduled,
        samples=samples,
        drafts=drafts,
        **fields,
    )


class DriftError(AssertionError):
    """A concrete transition the encoding does not allow (or allows differently)."""


Evaluator = Callable[[str, FlightState, dict[str, Any], "str | None"], Move]


def python_evaluator(name: str, s: FlightState, inputs: dict[str, Any], mutant: str | None = None) -> Move:
    """Evaluate transition ``name`` on Python values (the same code the proofs build formulas from)."""
    move = TRANSITIONS[name].apply(s, inputs, mutant)
    return Move(move.post, value_of(move.guard), [(c, value_of(f)) for c, f in move.checks])


class Z3Evaluator:
    """Evaluate transitions through their Z3 formulas: built once per (shape, transition, mutant) over fresh
    states and inputs; each call binds the pre-state and inputs to concrete values and reads the guard, the
    checks and the post-state off the (unique) model."""

    def __init__(self) -> None:
        self._built: dict[tuple[FlightShape, str, str | None], tuple[FlightState, dict[str, Any], Move]] = {}

    def __call__(self, name: str, s: FlightState, inputs: dict[str, Any], mutant: str | None = None) -> Move:
        key = (s.shape, name, mutant)
        if key not in self._built:
            pre = fresh_state(s.shape, "pre")
            sym_inputs = TRANSITIONS[name].inputs(s.shape, "in")
            self._built[key] = (pre, sym_inputs, TRANSITIONS[name].apply(pre, sym_inputs, mutant))
        pre, sym_inputs, move = self._built[key]
        solver = z3.Solver()
        solver.add(*[sym == to_term(val) for (_, sym), (_, val) in zip(pre.leaves(), s.leaves())])
        for k, sym in sym_inputs.items():
            vals = inputs[k]
            pairs = zip(sym, vals) if isinstance(sym, list) else [(sym, vals)]
            solver.add(*[x == to_term(v) for x, v in pairs])
        if solver.check() != z3.sat:
            raise DriftError(f"{name}: binding a concrete state is unsatisfiable")
        model = solver.model()

        def ground(x: Any) -> Any:
            return value_of(model.eval(x, model_completion=True)) if is_z3(x) else x

        post = evaluate(move.post, model)
        return Move(post, ground(move.guard), [(c, ground(f)) for c, f in move.checks])


def canonical(s: FlightState) -> dict[str, Any]:
    """Every leaf by name, as Python values."""
    return {name: value_of(v) for name, v in s.leaves()}


def assert_same(expected: FlightState, got: FlightState, what: str) -> None:
    """Raise DriftError naming the leaves where ``got`` (the encoding) differs from ``expected`` (the model)."""
    a, b = canonical(expected), canonical(got)
    diff = [k for k in a if a[k] != b[k]]
    if diff:
        raise DriftError(
            f"{what}: the encoding differs from the model in "
            + ", ".join(f"{k} (model {a[k]}, encoding {b[k]})" for k in diff[:6])
        )


def run_move(
    ev: Evaluator, name: str, s: FlightState, inputs: dict[str, Any], what: str, mutant: str | None = None
) -> FlightState:
    """Apply transition ``name``: its guard must hold and its model assertions too."""
    move = ev(name, s, inputs, mutant)
    if not move.guard:
        raise DriftError(f"{what}: {name}{inputs} is not enabled on\n{describe(s)}")
    for check, ok in move.checks:
        if not ok:
            raise DriftError(f"{what}: {name}: model assertion '{check}' fails")
    return move.post


def explain_schedule(
    ev: Evaluator, pre: FlightState, sched_after: Any, slot_of: dict[str, int], mutant: str | None = None
) -> FlightState:
    """The encoded ``schedule()`` that explains the model's last step: ``begin_step``, a ``preempt`` per
    victim, a ``schedule_running`` per running request scheduled, an ``admit`` per new or resumed request,
    ``end_step``. Returns the encoding's state after it."""
    record = sched_after.last_step
    out = record.output
    what = f"schedule() of step {record.step}"
    s = run_move(ev, "begin_step", pre, {}, what, mutant)
    for p in record.preemptions:
        s = run_move(ev, "preempt", s, {"slot": slot_of[p.victim_id]}, what, mutant)
    for data in out.scheduled_cached_reqs:
        q, n = slot_of[data.req_id], out.num_scheduled_tokens[data.req_id]
        if data.resumed:
            inputs = {
                "slot": q,
                "hit": data.num_computed_tokens,
                "num_new_tokens": n,
                "padded": data.req_id in out.scheduled_spec_decode_tokens,
            }
            s = run_move(ev, "admit", s, inputs, what, mutant)
        else:
            s = run_move(ev, "schedule_running", s, {"slot": q, "num_new_tokens": n}, what, mutant)
    for data in out.scheduled_new_reqs:
        q, n = slot_of[data.req_id], out.num_scheduled_tokens[data.req_id]
        inputs = {
            "slot": q,
            "hit": data.num_computed_tokens,
            "num_new_tokens": n,
            "padded": data.req_id in out.scheduled_spec_decode_tokens,
        }
        s = run_move(ev, "admit", s, inputs, what, mutant)
    return run_move(ev, "end_step", s, {}, what, mutant)


def explain_output(
    ev: Evaluator,
    pre: FlightState,
    returned: dict[str, int],
    stopped: set[str],
    slot_of: dict[str, int],
    mutant: str | None = None,
    kept: dict[str, int] | None = None,
) -> FlightState:
    """The encoded ``update_from_output`` of the oldest step: ``returned`` tokens per request id of the model
    output (of a live request), ``stopped`` the ids the update finished, ``kept`` the tokens each stopped one
    kept (default: all)."""
    R = pre.shape.num_reqs
    ret, keep, stop = [0] * R, [0] * R, [False] * R
    for rid, q in slot_of.items():
        ret[q] = returned.get(rid, 0)
        keep[q] = (kept or {}).get(rid, ret[q])
        stop[q] = rid in stopped
    return run_move(
        ev, "apply_output", pre, {"returned": ret, "kept": keep, "stop": stop}, "update_from_output()", mutant
    )


def check_refusal(
    ev: Evaluator, pre: FlightState, name: str, inputs: dict[str, Any], others: tuple[str, ...], what: str
) -> None:
    """A refused call: transition ``name`` is enabled and changes nothing, and none of ``others`` is enabled."""
    post = run_move(ev, name, pre, inputs, what)
    assert_same(pre, post, what)
    for other in others:
        if ev(other, pre, inputs, None).guard:
            raise DriftError(f"{what}: {other} is enabled too")


# ------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> int:
    """Print the proof table (transition x goal, seconds) and the mutant table."""
    parser = argparse.ArgumentParser(
        prog="python -m schedconf.spec.symbolic.in_flight", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--reqs", type=int, default=4, help="request slots R")
    parser.add_argument("--steps", default="2,3", help="comma-separated steps in flight D")
    parser.add_argument("--spec", default="0,2", help="comma-separated bounds K on num_spec_tokens")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per transition")
    args = parser.parse_args(argv)
    shapes = [FlightShape(args.reqs, int(d), int(k)) for k in args.spec.split(",") for d in args.steps.split(",")]
    results, exit_code = [], 0
    for shape in shapes:
        for name in TRANSITIONS:
            res = prove(shape, name, args.timeout)
            results.append(res)
            exit_code |= res.status != PROVED
            for text in list(res.counterexamples.values())[:1]:
                print(text, file=sys.stderr)
    print(render_table(results))
    print()
    print("| property | bounds | transitions proved | counterexamples | time (s) |")
    print("|---|---|---|---|---|")
    for shape in shapes:
        for prop in PROPERTIES:
            res_p = [prove(shape, name, args.timeout, properties=(prop,)) for name in TRANSITIONS]
            bad = [r.transition for r in res_p if r.status != PROVED]
            print(
                f"| {prop} | {shape.label()} | {len(res_p) - len(bad)}/{len(res_p)} | "
                f"{', '.join(bad) or '-'} | {sum(r.seconds for r in res_p):.2f} |"
            )
    print()
    print("| mutant | transition | bounds | result | goals failed | time (s) |")
    print("|---|---|---|---|---|---|")
    max_spec = max(int(k) for k in args.spec.split(","))
    for mutant, (name, _) in MUTANT_RULES.items():
        res = prove_mutant(FlightShape(args.reqs, 2, max(max_spec, 1)), mutant, args.timeout)
        failed = ", ".join(g for g, st in res.goals.items() if st == FAILED) or "-"
        print(f"| {mutant} | {name} | {res.shape.label()} | {res.status} | {failed} | {res.seconds:.2f} |")
        exit_code |= res.status != FAILED
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
