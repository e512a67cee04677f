"""Liveness of the v1 scheduler: the per-transition progress lemmas, proved with Z3.

The theorem, its bound and how the lemmas below compose into it are in
``spec/symbolic/LIVENESS.md``; the bound itself is computed by
``spec/symbolic/liveness_bound.py`` and non-termination is shown by
``spec/symbolic/lasso.py``. This module proves the facts about single
transitions of the encoding (``transitions.py``, the vllm-0.33 rules, no
speculative decoding) that the step-level argument uses:

``lacks_a_token:<transition>`` (:data:`INDUCTION`)
    Every transition preserves :func:`inv_lacks_a_token`: between steps every
    live request lacks a token, so the leader always has one to compute.
``fcfs_head_never_victim``
    FCFS: the victim ``_allocate_or_preempt`` picks is never ``running[0]``.
    (The victim is the tail; the head is the tail only when it runs alone,
    and a lone request fits the pool, ``SchedulerConfig`` guarantees it.)
``priority_leader_never_victim``
    Priority: the victim is never a running request whose ``(priority,
    arrival_time)`` is strictly below every other running request's (with
    distinct keys, the theorem's hypothesis, such a leader always exists).
``victim_spares_the_leader``
    Either policy: preempting a victim other than the leader leaves the
    leader where it was (FCFS: still ``running[0]``) with the tokens it was
    given this step (the priority repair gives back only the victim's).
``head_gets_a_chunk``
    The first iteration of the running loop (cursor 0, budget untouched)
    gives ``running[0]`` ``min(lacks, c)`` tokens or more, ``c`` the chunk of
    ``liveness_bound.compute_chunk``; in particular never 0.
``idle_pool_admits_the_head``
    With ``running`` empty and nobody preempted this step, the waiting loop
    cannot stop before admitting: the head of ``waiting`` fits the budget,
    a seat, the free blocks and (0.25+) the full-sequence gate.
``admitted_head_gets_a_chunk``
    That admission gives it ``min(lacks, c)`` tokens or more.
``head_iteration_schedules_a_chunk`` (composed, smaller shapes)
    A whole running-loop iteration for the leader (``running_iteration``: its
    allocation with every preemption it makes) ends with the leader scheduled
    for ``min(lacks, c)`` tokens or more, never self-preempted.

The lemmas about a step's first request assume the step holds no prefill
back (``defer_prefills`` false: no ``throttle_prefills``, and
``prefill_schedule_interval`` 1 or its interval passed), the theorem's
hypothesis.

Each lemma is ``Inv(s) and Lemmas(s) and guard_T(s, x) and H(s, x) => G(T(s, x))``
over fresh symbolic states, with the invariants and encoding lemmas that
``proofs.py`` proves inductive as premises; the hypotheses ``H`` are also
checked satisfiable together with the guard (a lemma whose premises cannot
hold would be vacuous; ``idle_pool_admits_the_head`` is the one lemma whose
goal is that its premises cannot hold, and its non-vacuity is checked on the
admitting transition instead).

CLI::

    python -m schedconf.spec.symbolic.liveness [--bounds 4,8] [--policy fcfs,priority] [--timeout 120] [--only NAME]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import z3

from schedconf.spec.symbolic.proofs import premises
from schedconf.spec.symbolic.state import PENDING, UPDATING, WAITING_LOOP, Shape, State, fresh_state
from schedconf.spec.symbolic.transitions import COMPOSED, TRANSITIONS, Outcome, at, running_at
from schedconf.spec.symbolic.z3ops import eq, imin, is_z3, ite, land, limplies, lnot, lor

PROVED, FAILED, UNKNOWN, VACUOUS = "proved", "counterexample", "unknown", "vacuous"


# ------------------------------------------------------------------ terms


def key_lt(s: State, a: int, b: int) -> Any:
    """``(priority, arrival_time)`` of slot ``a`` is below that of slot ``b``."""
    pa, pb = s.priority[a], s.priority[b]
    return lor(pa < pb, land(eq(pa, pb), s.arrival_time[a] < s.arrival_time[b]))


def is_priority_leader(s: State, r: int) -> Any:
    """Slot ``r`` runs and its key is strictly below every other running request's.

    With tied keys there may be no such request; the theorem's hypothesis
    (distinct keys) is what makes one exist (LIVENESS.md).
    """
    return land(s.in_running[r], *(limplies(s.in_running[c], key_lt(s, r, c)) for c in s.shape.slots if c != r))


def leader_of(s: State) -> Any:
    """The leader slot: FCFS ``running[0]``; priority the running request with the least key (-1: none)."""
    sh = s.shape
    if not sh.is_priority:
        return running_at(s, 0)
    out: Any = -1
    for r in reversed(sh.slots):
        out = ite(is_priority_leader(s, r), r, out)
    return out


def chunk_of(s: State) -> Any:
    """``liveness_bound.compute_chunk`` of the config: the threshold if set (capped by the budget), else the budget."""
    t, b = s.long_prefill_token_threshold, s.max_num_batched_tokens
    return ite(t > 0, imin(t, b), b)


def inv_lacks_a_token(s: State) -> Any:
    """Every live request lacks a token (``num_computed_tokens < num_tokens``), except one scheduled in a step
    whose output is pending or being applied (it may have computed all it had; its sampled token comes next).

    Holds because the encoding's model samples one token whenever a step reaches the end of a sequence
    (the liveness theorem's hypothesis on the model); proved inductive by the :data:`INDUCTION` lemmas.
    """
    sh = s.shape
    out_pending = lor(eq(s.phase, PENDING), eq(s.phase, UPDATING))
    return land(
        *(
            limplies(
                s.live(r), lor(s.num_computed_tokens[r] < s.num_tokens[r], land(out_pending, s.num_scheduled[r] > 0))
            )
            for r in sh.slots
        )
    )


# ------------------------------------------------------------------ lemmas

Build = Callable[[State, dict[str, Any], Outcome], tuple[list[Any], Any]]
"""``(pre, inputs, outcome) -> (hypotheses, goal)``."""


@dataclass(frozen=True)
class Lemma:
    """One progress lemma over one transition."""

    name: str
    transition: str
    policies: tuple[str, ...]
    build: Build
    statement: str
    goal_is_false: bool = False
    """The lemma says its premises cannot hold (non-vacuity is then checked on ``witness_transition``)."""
    witness_transition: str = ""


def _victim_not_leader(pre: State, inp: dict[str, Any], out: Outcome) -> tuple[list[Any], Any]:
    victim = out.facts["victim"]
    sh = pre.shape
    if not sh.is_priority:
        return [], lnot(eq(victim, running_at(pre, 0)))
    return [], land(*(limplies(eq(victim, r), lnot(is_priority_leader(pre, r))) for r in sh.slots))


def _victim_spares_leader(pre: State, inp: dict[str, Any], out: Outcome) -> tuple[list[Any], Any]:
    sh = pre.shape
    victim = out.facts["victim"]
    post = out.post
    if not sh.is_priority:
        head = running_at(pre, 0)
        return [lnot(eq(victim, head))], land(
            eq(running_at(post, 0), head), eq(at(post.num_scheduled, head), at(pre.num_scheduled, head))
        )
    goals = [
        limplies(
            land(is_priority_leader(pre, r), lnot(eq(victim, r))),
            land(is_priority_leader(post, r), eq(post.num_scheduled[r], pre.num_scheduled[r])),
        )
        for r in sh.slots
    ]
    return [], land(*goals)


def _head_gets_a_chunk(pre: State, inp: dict[str, Any], out: Outcome) -> tuple[list[Any], Any]:
    q = out.facts["request"]
    lacks = at(pre.num_tokens, q) - at(pre.num_computed_tokens, q)
    hyps = [
        eq(pre.req_index, 0),
        eq(pre.token_budget, pre.max_num_batched_tokens),
        inv_lacks_a_token(pre),
        lnot(pre.defer_prefills),
    ]
    return hyps, land(lnot(out.facts["skipped"]), out.facts["num_new_tokens"] >= imin(lacks, chunk_of(pre)))


def _idle_hypotheses(pre: State) -> list[Any]:
    return [
        eq(pre.phase, WAITING_LOOP),
        eq(pre.num_running(), 0),
        eq(pre.num_preemptions, 0),
        eq(pre.token_budget, pre.max_num_batched_tokens),
        lnot(pre.defer_prefills),
    ]


def _idle_pool_admits(pre: State, inp: dict[str, Any], out: Outcome) -> tuple[list[Any], Any]:
    return _idle_hypotheses(pre), False


def _admitted_head_gets_a_chunk(pre: State, inp: dict[str, Any], out: Outcome) -> tuple[list[Any], Any]:
    q = out.facts["request"]
    bs = pre.shape.block_size
    lacks = at(pre.num_tokens, q) - out.facts["hit_blocks"] * bs
    return _idle_hypotheses(pre), out.facts["num_new_tokens"] >= imin(lacks, chunk_of(pre))


def _head_iteration(pre: State, inp: dict[str, Any], out: Outcome) -> tuple[list[Any], Any]:
    sh = pre.shape
    q = out.facts["request"]
    lacks = at(pre.num_tokens, q) - at(pre.num_computed_tokens, q)
    hyps = [
        eq(pre.req_index, 0),
        eq(pre.token_budget, pre.max_num_batched_tokens),
        inv_lacks_a_token(pre),
        lnot(pre.defer_prefills),
    ]
    if sh.is_priority:
        hyps += [lor(*(land(eq(q, r), is_priority_leader(pre, r)) for r in sh.slots))]
    goal = land(
        lnot(out.facts["self_preempted"]),
        lnot(out.facts["skipped"]),
        at(out.post.num_scheduled, q) >= imin(lacks, chunk_of(pre)),
    )
    return hyps, goal


BOTH = ("fcfs", "priority")
LEMMAS: dict[str, Lemma] = {
    lem.name: lem
    for lem in (
        Lemma(
            "fcfs_head_never_victim",
            "running_preempt",
            ("fcfs",),
            _victim_not_leader,
            "FCFS: the victim is never running[0]",
        ),
        Lemma(
            "priority_leader_never_victim",
            "running_preempt",
            ("priority",),
            _victim_not_leader,
            "priority: the victim is never the running request with the strictly least key",
        ),
        Lemma(
            "victim_spares_the_leader",
            "running_preempt",
            BOTH,
            _victim_spares_leader,
            "a victim other than the leader leaves the leader leading, with its tokens of this step",
        ),
        Lemma(
            "head_gets_a_chunk",
            "running_start",
            BOTH,
            _head_gets_a_chunk,
            "cursor 0, full budget: running[0] is given min(lacks, c) >= 1 tokens",
        ),
        Lemma(
            "idle_pool_admits_the_head",
            "waiting_stop",
            BOTH,
            _idle_pool_admits,
            "running empty, no preemption, full budget: the waiting loop does not stop",
            True,
            "waiting_admit",
        ),
        Lemma(
            "admitted_head_gets_a_chunk",
            "waiting_admit",
            BOTH,
            _admitted_head_gets_a_chunk,
            "running empty, no preemption, full budget: the admitted head gets min(lacks, c) tokens",
        ),
        Lemma(
            "head_iteration_schedules_a_chunk",
            "running_iteration",
            BOTH,
            _head_iteration,
            "the leader's whole running-loop iteration at cursor 0 schedules it min(lacks, c) tokens, "
            "no self-preemption",
        ),
    )
}


def _lacks_preserved(pre: State, inp: dict[str, Any], out: Outcome) -> tuple[list[Any], Any]:
    return [inv_lacks_a_token(pre)], inv_lacks_a_token(out.post)


INDUCTION: dict[str, Lemma] = {
    f"lacks_a_token:{name}": Lemma(
        f"lacks_a_token:{name}", name, BOTH, _lacks_preserved, f"{name} preserves inv_lacks_a_token"
    )
    for name in TRANSITIONS
}
"""The induction step of :func:`inv_lacks_a_token`, one lemma per transition (it holds initially: no request)."""
COMPOSED_LEMMAS = frozenset(name for name, lem in LEMMAS.items() if lem.transition in COMPOSED)


@dataclass
class LemmaResult:
    """The outcome of one lemma at one shape."""

    lemma: str
    shape: Shape
    status: str
    seconds: float
    cases: dict[str, str]
    counterexample: str = ""


def prove_lemma(name: str, shape: Shape, timeout_s: float = 120.0) -> LemmaResult:
    """Prove lemma ``name`` at ``shape``, case by case over the transition's slot splits."""
    lemma = LEMMAS[name] if name in LEMMAS else INDUCTION[name]
    assert shape.policy in lemma.policies, (name, shape.policy)
    transition = TRANSITIONS.get(lemma.transition) or COMPOSED[lemma.transition]
    t0 = time.monotonic()
    cases: dict[str, str] = {}
    satisfiable_somewhere = False

    def remaining_ms() -> int:
        return max(1, int((timeout_s - (time.monotonic() - t0)) * 1000))

    counterexample = ""
    for case in transition.cases(shape):
        label = ",".join(f"{k}={v}" for k, v in case.items()) or "all"
        pre = fresh_state(shape, "pre")
        inputs = {**transition.inputs(shape, "in"), **case}
        out = transition.apply(pre, inputs)
        hyps, goal = lemma.build(pre, inputs, out)
        solver = z3.Solver()
        solver.add(*premises(pre), _as_bool(out.guard), *[_as_bool(p) for p in out.premises], *map(_as_bool, hyps))
        solver.set("timeout", remaining_ms())
        base = solver.check()
        if base == z3.unsat:
            cases[label] = PROVED if lemma.goal_is_false else VACUOUS
            continue
        if base == z3.unknown:
            cases[label] = UNKNOWN
            continue
        satisfiable_somewhere = True
        if lemma.goal_is_false:
            cases[label] = FAILED
            counterexample = counterexample or str(solver.model())
            continue
        solver.add(z3.Not(_as_bool(goal)))
        solver.set("timeout", remaining_ms())
        verdict = solver.check()
        cases[label] = PROVED if verdict == z3.unsat else FAILED if verdict == z3.sat else UNKNOWN
        if verdict == z3.sat and not counterexample:
            counterexample = str(solver.model())
    statuses = set(cases.values())
    if FAILED in statuses:
        status = FAILED
    elif UNKNOWN in statuses:
        status = UNKNOWN
    elif lemma.goal_is_false:
        status = PROVED if _is_satisfiable_elsewhere(lemma, shape, remaining_ms) else VACUOUS
    else:
        status = PROVED if satisfiable_somewhere else VACUOUS
    return LemmaResult(name, shape, status, time.monotonic() - t0, cases, counterexample)


def _is_satisfiable_elsewhere(lemma: Lemma, shape: Shape, remaining_ms: Callable[[], int]) -> bool:
    """The hypotheses of a 'cannot happen' lemma hold together with its witness transition's guard (non-vacuity)."""
    transition = TRANSITIONS[lemma.witness_transition]
    pre = fresh_state(shape, "pre")
    out = transition.apply(pre, transition.inputs(shape, "in"))
    hyps, _ = lemma.build(pre, {}, out)
    solver = z3.Solver()
    solver.add(*premises(pre), _as_bool(out.guard), *map(_as_bool, hyps))
    solver.set("timeout", remaining_ms())
    return solver.check() == z3.sat


def _as_bool(f: Any) -> z3.BoolRef:
    return f if is_z3(f) else z3.BoolVal(bool(f))


def main(argv: list[str] | None = None) -> int:
    """CLI: prove every lemma at the given bounds and policies; print a table."""
    parser = argparse.ArgumentParser(
        prog="python -m schedconf.spec.symbolic.liveness", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--bounds", default="4,8", help="R,B of the non-composed lemmas")
    parser.add_argument("--composed-bounds", default="3,4", help="R,B of the composed lemma")
    parser.add_argument("--block-size", type=int, default=2)
    parser.add_argument("--policy", default="fcfs,priority")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--only", default="")
    args = parser.parse_args(argv)
    r, b = (int(x) for x in args.bounds.split(","))
    cr, cb = (int(x) for x in args.composed_bounds.split(","))
    names = [n for n in args.only.split(",") if n] or list(INDUCTION) + list(LEMMAS)
    failed = False
    print(f"{'lemma':36} {'policy':9} {'bounds':12} {'result':14} seconds")
    for name in names:
        for policy in args.policy.split(","):
            if policy not in (LEMMAS.get(name) or INDUCTION[name]).policies:
                continue
            rr, bb = (cr, cb) if name in COMPOSED_LEMMAS else (r, b)
            res = prove_lemma(name, Shape(rr, bb, args.block_size, policy), args.timeout)
            print(f"{name:36} {policy:9} {f'R={rr},B={bb}':12} {res.status:14} {res.seconds:7.1f}", flush=True)
            if res.status != PROVED:
                failed = True
                print(f"   cases: {res.cases}")
                if res.counterexample:
                    print("   " + res.counterexample[:3000])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
