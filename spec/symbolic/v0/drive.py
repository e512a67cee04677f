"""Run the encoded v0 transitions along the events of a ``schedconf.spec.v0`` scheduler (the drift guard's engine).

An event of the model is a sequence of encoded transitions: ``schedule()``
is ``begin_step`` and then, until the phase is PENDING or CRASHED, the one
schedule transition whose guard holds (exactly one must: checked);
``update_from_output()`` is ``begin_update``, ``update_append_token`` per
scheduled group in the output's order, ``end_update``; ``add_request`` and
``abort`` are one transition each. :func:`schedule_both` and friends apply
the event to the model and to the state read from it, and return both
results for :func:`assert_same`.

Evaluators: :func:`python_evaluator` runs a transition on Python values;
:class:`Z3Evaluator` builds it once over fresh symbolic states (the formulas
the proofs use) and solves it for each concrete state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import z3

from schedconf.spec.errors import EngineCrash
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.symbolic.v0.bridge import Snapshot, assign_slots, from_scheduler
from schedconf.spec.symbolic.v0.state import (
    CRASHED,
    IDLE,
    PENDING,
    Shape,
    State,
    bind,
    canonical,
    evaluate,
    fresh_state,
)
from schedconf.spec.symbolic.v0.transitions import TRANSITIONS, Outcome
from schedconf.spec.symbolic.z3ops import is_z3, value_of

SCHEDULE_TRANSITIONS = (
    "prefill_admit",
    "prefill_ignore",
    "prefill_stop",
    "end_prefill_loop",
    "priority_sort_running",
    "priority_force_preempt",
    "priority_end",
    "running_append",
    "running_preempt_recompute",
    "running_preempt_swap",
    "running_swap_crash",
    "end_running_loop",
    "swapped_swap_in",
    "swapped_ignore",
    "swapped_stop",
    "end_schedule",
)


class EncodingError(AssertionError):
    """The encoding disagrees with the model, or no / several transitions are enabled."""


class Evaluator(Protocol):
    def __call__(self, name: str, state: State, inputs: dict[str, Any]) -> tuple[bool, State, dict[str, Any]]: ...


def python_evaluator(name: str, state: State, inputs: dict[str, Any]) -> tuple[bool, State, dict[str, Any]]:
    """Evaluate transition ``name`` on Python values: (guard, next state, facts); a failing model assertion raises."""
    out: Outcome = TRANSITIONS[name].apply(state, inputs)
    guard = bool(value_of(out.guard))
    if guard:
        for check_name, c in out.checks:
            if not value_of(c):
                raise EncodingError(f"{name}: model assertion '{check_name}' fails on a Python state")
    return guard, out.post, {k: value_of(v) for k, v in out.facts.items()}


class Z3Evaluator:
    """Evaluate transitions through their Z3 formulas (built once per shape and transition)."""

    def __init__(self) -> None:
        self._built: dict[tuple[Shape, str], tuple[State, dict[str, Any], Outcome]] = {}

    def __call__(self, name: str, state: State, inputs: dict[str, Any]) -> tuple[bool, State, dict[str, Any]]:
        key = (state.shape, name)
        if key not in self._built:
            pre = fresh_state(state.shape, "pre")
            sym_inputs = TRANSITIONS[name].inputs(state.shape, "in")
            self._built[key] = (pre, sym_inputs, TRANSITIONS[name].apply(pre, sym_inputs))
        pre, sym_inputs, out = self._built[key]
        solver = z3.Solver()
        solver.add(bind(pre, state))
        solver.add(*[sym == inputs[k] for k, sym in sym_inputs.items()])
        if solver.check() != z3.sat:
            raise EncodingError(f"{name}: binding a concrete state is unsatisfiable")
        model = solver.model()
        guard = z3.is_true(model.eval(out.guard, model_completion=True)) if is_z3(out.guard) else bool(out.guard)
        if guard:
            for check_name, c in out.checks:
                if is_z3(c) and not z3.is_true(model.eval(c, model_completion=True)):
                    raise EncodingError(f"{name}: model assertion '{check_name}' fails on a concrete state")
        facts = {k: value_of(model.eval(v, model_completion=True)) if is_z3(v) else v for k, v in out.facts.items()}
        return guard, evaluate(out.post, model), facts


OnTransition = Callable[[str, State, State, dict[str, Any]], None]


def run_schedule(ev: Evaluator, state: State, on_transition: OnTransition | None = None) -> State:
    """The encoded ``schedule()`` from an IDLE state: returns the PENDING (or CRASHED) state."""
    assert state.phase == IDLE
    guard, post, facts = ev("begin_step", state, {})
    assert guard
    if on_transition:
        on_transition("begin_step", state, post, facts)
    state = post
    for _ in range(10 * state.shape.num_reqs + 10):
        if state.phase in (PENDING, CRASHED):
            return state
        enabled = []
        for name in SCHEDULE_TRANSITIONS:
            g, p, f = ev(name, state, {})
            if g:
                enabled.append((name, p, f))
        if len(enabled) != 1:
            raise EncodingError(f"expected exactly one schedule transition enabled, got {[e[0] for e in enabled]}")
        name, post, facts = enabled[0]
        if on_transition:
            on_transition(name, state, post, facts)
        state = post
    raise EncodingError("the encoded schedule() did not end")


def schedule_both(
    sched: Any, ev: Evaluator, shape: Shape, on_transition: OnTransition | None = None
) -> tuple[Snapshot, State, Any]:
    """``schedule()`` on the model (mutated) and the encoded schedule on the state read before it.

    Returns the model's snapshot after, the encoding's state, and the model's
    output (or the EngineCrash it raised).
    """
    snap = from_scheduler(sched, shape)
    sym = run_schedule(ev, snap.state, on_transition)
    try:
        result: Any = sched.schedule()
    except EngineCrash as exc:
        result = exc
    return from_scheduler(sched, shape, slot_ids=snap.slot_ids), sym, result


def is_stop_token(sg: Any, token: int) -> bool:
    """The abstraction of the stop check: EOS (unless ignored) or a stop id (``min_tokens`` must be 0)."""
    params = sg.sampling_params
    assert params.min_tokens == 0, "the encoding abstracts min_tokens away"
    return (not params.ignore_eos and token == params.eos_token_id) or token in params.stop_token_ids


def update_both(
    sched: Any,
    ev: Evaluator,
    shape: Shape,
    sampled: dict[str, tuple[int, ...]],
    on_transition: OnTransition | None = None,
) -> tuple[Snapshot, State, Any]:
    """``update_from_output()`` on the model (mutated) and the encoded update on the state read before it."""
    snap = from_scheduler(sched, shape)
    record = sched.pending
    assert snap.state.phase == PENDING and record is not None
    order = [
        (sg.request_id, is_stop_token(sg, sampled[sg.request_id][0]) if sg.request_id in sampled else False)
        for sg, _ in record.groups
    ]
    outputs = sched.update_from_output(record.output, ModelRunnerOutput(sampled_token_ids=sampled))
    state = snap.state
    guard, state, _ = ev("begin_update", state, {})
    assert guard
    for rid, stop in order:
        q = snap.slot_ids.index(rid)
        guard, post, facts = ev("update_append_token", state, {"slot": q, "stop_token": stop})
        if not guard:
            raise EncodingError(f"update_append_token not enabled for {rid}")
        if on_transition:
            on_transition("update_append_token", state, post, facts)
        state = post
    guard, state, _ = ev("end_update", state, {})
    if not guard:
        raise EncodingError("end_update not enabled after every scheduled group")
    return from_scheduler(sched, shape, slot_ids=snap.slot_ids), state, outputs


def add_both(
    sched: Any, ev: Evaluator, shape: Shape, request_id: str, prompt: list[int], max_tokens: int, **kwargs: Any
) -> tuple[Snapshot, State]:
    """``add_request`` on the model and as the encoded transition."""
    snap = from_scheduler(sched, shape, slot_ids=assign_slots(sched, shape, (request_id,)))
    sched.add_request(request_id, prompt, max_tokens, **kwargs)
    guard, post, _ = ev(
        "add_request",
        snap.state,
        {
            "slot": snap.slot_ids.index(request_id),
            "num_prompt_tokens": len(prompt),
            "max_tokens": max_tokens,
            "priority": kwargs.get("priority", 0),
            "arrival_time": int(kwargs.get("arrival_time", 0)),
        },
    )
    if not guard:
        raise EncodingError(f"add_request {request_id} not enabled")
    return from_scheduler(sched, shape, slot_ids=snap.slot_ids), post


def abort_both(sched: Any, ev: Evaluator, shape: Shape, request_id: str) -> tuple[Snapshot, State]:
    """``abort`` between steps on the model and as the encoded transition (a finished id: nothing on either)."""
    snap = from_scheduler(sched, shape, slot_ids=assign_slots(sched, shape, (request_id,)))
    sched.abort(request_id)
    guard, post, _ = ev("abort", snap.state, {"slot": snap.slot_ids.index(request_id)})
    if not guard:
        post = snap.state  # a dead slot: abort is a no-op
    return from_scheduler(sched, shape, slot_ids=snap.slot_ids), post


def assert_same(model_snap: Snapshot, sym_state: State, what: str) -> None:
    """Raise EncodingError naming the first differing field of the canonical forms (a crashed model: phases only)."""
    a, b = canonical(model_snap.state), canonical(sym_state)
    if a["phase"] == CRASHED or b["phase"] == CRASHED:
        a, b = {"phase": a["phase"]}, {"phase": b["phase"]}
    if a != b:
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                raise EncodingError(f"{what}: '{key}' differs\n  model:    {a.get(key)}\n  encoding: {b.get(key)}")
