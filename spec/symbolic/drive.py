"""Run the encoded transitions along the events of a concrete scheduler.

The drift guard needs to apply *the same event* to the Python model and to
the encoding and compare. An event of the model
(``schedule()``, ``update_from_output()``, ``abort``, ``add_request``) is a
sequence of encoded transitions: ``schedule(throttle_prefills)`` is
``begin_step`` (the throttle is its input), running
iterations while their guard holds, ``end_running_loop``, waiting admissions
while theirs holds, ``end_schedule``. At every point exactly one of the
candidate transitions must be enabled; :func:`run_schedule` checks it.

The transitions are evaluated by a :class:`Evaluator`: on Python values
(``PythonEvaluator``, fast) or by Z3 (``Z3Evaluator``: the transition is built
once over fresh symbolic states and inputs, and each concrete state is
substituted into *that* formula and solved for the successor, so the very
formulas the proofs use are the ones compared with the model).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Protocol

import z3

from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.symbolic.state import (
    IDLE,
    PENDING,
    Shape,
    Snapshot,
    State,
    bind,
    canonical,
    evaluate,
    fresh_state,
    from_scheduler,
)
from schedconf.spec.symbolic.transitions import COMPOSED, TRANSITIONS, Outcome
from schedconf.spec.symbolic.z3ops import is_z3, value_of
from schedconf.spec.v1.scheduler import Scheduler


class EncodingError(AssertionError):
    """The encoding disagrees with the model, or no / several transitions are enabled."""


class Evaluator(Protocol):
    def __call__(self, name: str, state: State, inputs: dict[str, Any]) -> tuple[bool, State, dict[str, Any]]: ...


def python_evaluator(name: str, state: State, inputs: dict[str, Any]) -> tuple[bool, State, dict[str, Any]]:
    """Evaluate transition ``name`` on Python values: (guard, next state, facts)."""
    out: Outcome = (TRANSITIONS[name] if name in TRANSITIONS else COMPOSED[name]).apply(state, inputs)
    for check_name, c in out.checks:
        if value_of(out.guard) and not value_of(c):
            raise EncodingError(f"{name}: model assertion '{check_name}' fails on a Python state")
    return bool(value_of(out.guard)), out.post, {k: value_of(v) for k, v in out.facts.items()}


class Z3Evaluator:
    """Evaluate transitions through their Z3 formulas (built once per shape and transition)."""

    def __init__(self) -> None:
        self._built: dict[tuple[Shape, str], tuple[State, dict[str, Any], Outcome]] = {}

    def _build(self, shape: Shape, name: str) -> tuple[State, dict[str, Any], Outcome]:
        key = (shape, name)
        if key not in self._built:
            pre = fresh_state(shape, "pre")
            inputs = TRANSITIONS[name].inputs(shape, "in")
            self._built[key] = (pre, inputs, TRANSITIONS[name].apply(pre, inputs))
        return self._built[key]

    def __call__(self, name: str, state: State, inputs: dict[str, Any]) -> tuple[bool, State, dict[str, Any]]:
        pre, sym_inputs, out = self._build(state.shape, name)
        solver = z3.Solver()
        solver.add(bind(pre, state))
        for key, sym in sym_inputs.items():
            value = inputs[key]
            if isinstance(sym, list):
                solver.add(*[s == v for s, v in zip(sym, value)])
            else:
                solver.add(sym == value)
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


def _one_enabled(ev: Evaluator, names: tuple[str, ...], state: State) -> tuple[str, State, dict[str, Any]]:
    enabled = []
    for name in names:
        guard, post, facts = ev(name, state, {})
        if guard:
            enabled.append((name, post, facts))
    if len(enabled) != 1:
        raise EncodingError(f"expected exactly one of {names} enabled, got {[e[0] for e in enabled]}")
    return enabled[0]


def run_schedule(
    ev: Evaluator,
    state: State,
    on_transition: Callable[[str, State, State, dict[str, Any]], None] | None = None,
    composed: bool = False,
    throttle_prefills: bool = False,
) -> State:
    """The encoded ``schedule(throttle_prefills)`` from an IDLE state: returns the PENDING state.

    With ``composed`` the loops advance by whole iterations (``COMPOSED``).
    """
    assert state.phase == IDLE
    guard, state, facts = ev("begin_step", state, {"throttle_prefills": throttle_prefills})
    assert guard
    steps = (
        ("running_start", "running_allocate", "running_preempt", "end_running_loop"),
        ("waiting_admit", "waiting_stop", "end_schedule"),
    )
    if composed:
        steps = (("running_iteration", "end_running_loop"), ("waiting_admission", "end_schedule"))
    for names in steps:
        for _ in range(8 * state.shape.num_reqs + 8):
            name, post, facts = _one_enabled(ev, names, state)
            if on_transition:
                on_transition(name, state, post, facts)
            state = post
            if name in ("end_running_loop", "end_schedule"):
                break
        else:
            raise EncodingError(f"{names[0]} did not end")
    return state


def schedule_both(
    sched: Scheduler,
    ev: Evaluator,
    shape: Shape,
    snap: Snapshot | None = None,
    on_transition: Callable[[str, State, State, dict[str, Any]], None] | None = None,
    throttle_prefills: bool = False,
) -> tuple[Snapshot, State]:
    """Run ``schedule(throttle_prefills)`` on ``sched`` (mutated) and the encoded schedule on its snapshot.

    Returns the model's snapshot after the step and the encoding's state.
    """
    snap = snap or from_scheduler(sched, shape)
    sym_post = run_schedule(ev, snap.state, on_transition, throttle_prefills=throttle_prefills)
    sched.schedule(throttle_prefills=throttle_prefills)
    after = from_scheduler(sched, shape, slot_ids=snap.slot_ids, hash_ids=snap.hash_ids)
    return after, sym_post


def is_stop_token(sched: Scheduler, request_id: str, token: int) -> bool:
    """Whether ``token`` stops the request by the token rules (EOS unless ignored, or a stop id)."""
    params = sched.requests[request_id].sampling_params
    return token == params.effective_eos_token_id or token in params.stop_token_ids


def update_both(
    sched: Scheduler,
    ev: Evaluator,
    shape: Shape,
    sampled: dict[str, tuple[int, ...]],
    snap: Snapshot | None = None,
    on_transition: Callable[[str, State, State, dict[str, Any]], None] | None = None,
) -> tuple[Snapshot, State]:
    """Run ``update_from_output`` on ``sched`` (mutated) and the encoded update on its snapshot.

    ``sampled`` gives one token per request that samples. New block hashes
    are read from the model after the update (the encoding takes them as
    inputs); a request that stopped gets a fresh number.
    """
    snap = snap or from_scheduler(sched, shape)
    assert snap.state.phase == PENDING and sched.pending_output is not None
    order = list(sched.pending_output.num_scheduled_tokens)
    stop = {rid: is_stop_token(sched, rid, sampled[rid][0]) for rid in sampled if rid in sched.requests}
    sched.update_from_output(sched.pending_output, ModelRunnerOutput(sampled_token_ids=sampled))
    after = from_scheduler(sched, shape, slot_ids=snap.slot_ids, hash_ids=snap.hash_ids)
    state = snap.state
    guard, state, _ = ev("begin_update", state, {})
    assert guard
    for rid in order:
        if rid not in snap.slot_ids:
            continue
        q = snap.slot_ids.index(rid)
        req = sched.requests.get(rid)
        n_after = state.num_tokens[q] + 1
        full_after = n_after // shape.block_size
        completes = rid in sampled and full_after > state.num_tokens[q] // shape.block_size
        if completes and req is not None and len(req.block_hashes) >= full_after:
            new_hash = after.hash_id(req.block_hashes[full_after - 1])
        else:
            new_hash = after.hash_id(b"fresh-%d-%d" % (q, n_after))
        inputs = {"slot": q, "stop_token": stop.get(rid, False), "new_hash": new_hash}
        guard, post, facts = ev("append_token", state, inputs)
        if not guard:
            if state.status[q] == -1:
                continue  # aborted while the step ran: the model skips it
            raise EncodingError(f"append_token not enabled for {rid}")
        if on_transition:
            on_transition("append_token", state, post, facts)
        state = post
    guard, state, _ = ev("end_update", state, {})
    if not guard:
        raise EncodingError("end_update not enabled after every scheduled request")
    return after, state


def assert_same(model_snap: Snapshot, sym_state: State, what: str) -> None:
    """Raise EncodingError naming the first differing field of the canonical forms."""
    a, b = canonical(model_snap.state), canonical(sym_state)
    if a != b:
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                raise EncodingError(f"{what}: '{key}' differs\n  model:    {a.get(key)}\n  encoding: {b.get(key)}")


def copy_scheduler(sched: Scheduler) -> Scheduler:
    """An independent copy of a scheduler (blocks, queues, requests)."""
    return copy.deepcopy(sched)
