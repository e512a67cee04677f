"""Prove that every transition preserves every invariant, for all states of a shape.

For a transition ``T`` and a shape (``R`` request slots, ``B`` blocks, block
size, policy) the obligation is, over fresh symbolic states and inputs::

    Inv(s) and Lemmas(s) and guard_T(s, x)  =>  Inv(T(s, x)) and Lemmas(T(s, x)) and checks_T(s, x)

where ``Inv`` are the invariants of ``spec/v1/invariants.py`` evaluated through
:class:`~schedconf.spec.symbolic.state.SymbolicView` and :class:`~schedconf.spec.symbolic.z3ops.Z3Ops`,
``Lemmas`` the encoding's well-formedness and strengthening lemmas
(``state.LEMMAS``), and ``checks_T`` the model's own assertions on the way.
Each conjunct of the conclusion is one Z3 query (its negation must be
unsatisfiable), in order (checks, lemmas, invariants), and each goal proved is
assumed for the later ones. A proof is also checked for vacuity: the premises
must be satisfiable.

How the queries are sent (``METHODS``; issue 14): every premise and every goal
is a fresh literal defined equal to its formula, and a query is ``not goal``
under the premises' and proved goals' literals as assumptions, so Z3 never
rewrites a goal against the premises it repeats (an unchanged invariant costs
nothing) and keeps what it learns from query to query; the expensive goals
are proved in parts (``GOAL_SPLITS``); and the transitions' stepping stones
for counting (``transitions.STONE``) are proved and assumed; and when the
guard fixes the phase, the pre-state's phase is that Python value, so the
premises fold what depends on it as the goals do (``named``). By
default (``symmetric``) a transition with an acting slot is, on top of that,
proved for slot 0 only, the other slots following by slot symmetry, which Z3
checks too (``symmetry.py``); the subterms an outcome declares as
:class:`~schedconf.spec.symbolic.transitions.Abstraction` s (the prefix hit, the free
queue's ranks, the freed blocks' order) are replaced by unknowns of which only
their facts are known, once those facts are proved on the terms; and a query
still open after :data:`FRESH_AFTER_S` is sent again to a fresh solver with
everything asserted, which Z3 preprocesses (the proof's own solver, queried
with assumptions, cannot). ``plain`` is the path before issue 14 (``not
goal`` asserted in a pushed scope, no such stones); it and ``named`` are kept
for ``bench/bench_proofs.py --compare``.

A failed goal yields a counterexample: the pre-state and inputs from the Z3
model, printed, injected into a concrete scheduler (``state.to_scheduler``),
and the model's own transition replayed on it to confirm the violation
concretely; it is written as a JSON file, and for the event transitions
(``abort``, ``add_request``, ``schedule``, ``update``) as a trace when a short
workload reaching an equivalent violation is found.

CLI::

    python -m schedconf.spec.symbolic.proofs --bounds 4,8 --timeout 60 [--block-size 2] [--policy fcfs,priority]
        [--transitions a,b] [--largest] [--out DIR]

prints the table (transition, bounds, result, time); ``--largest`` grows the
bounds per transition while a proof fits the timeout and reports the largest.
"""

# Size: the proof driver: goals, the inductive step, counterexample realisation and the command line
# that runs them, which share the goal table.

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import multiprocessing
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import z3

import schedconf.spec.v1.invariants
from schedconf.spec.symbolic.helper import Helper, check_text, get_fresh_solver, render_query, result_by
from schedconf.spec.symbolic.premises import (  # noqa: F401  (re-exported: proofs' verdicts)
    FAILED,
    PROVED,
    UNKNOWN,
    VACUOUS,
    invariant_formulas,
    lemma_formulas,
    premises,
)
from schedconf.spec.symbolic.premises import as_bool as _as_bool
from schedconf.spec.symbolic.state import (
    LEMMAS,
    Shape,
    State,
    SymbolicView,
    describe,
    evaluate,
    fresh_state,
    theorem_order,
    theorem_rank,
)
from schedconf.spec.symbolic.symmetry import canonical_cases, check_equivariance, check_premises_symmetric
from schedconf.spec.symbolic.transitions import COMPOSED, STONE, TRANSITIONS, Outcome
from schedconf.spec.symbolic.z3ops import Z3Ops, is_z3, value_of

PENDING = "pending"
"""A goal whose query runs in the helper process (``prove(parallel=True)``); never in a finished result."""


def dense_tables(s: State) -> list[Any]:
    """Every table's blocks fill positions ``0..num_blocks-1`` (the concrete model's lists have no holes)."""
    from schedconf.spec.symbolic.z3ops import count

    return [count(s.held[r][b] for b in s.shape.blocks) == s.num_blocks[r] for r in s.shape.slots]


@dataclass
class Counterexample:
    """A pre-state and inputs under which a goal fails."""

    goal: str
    pre: State
    inputs: dict[str, Any]
    post: State
    subjects: list[str]

    def render(self) -> str:
        lines = [
            f"goal {self.goal} fails" + (f" for {', '.join(self.subjects)}" if self.subjects else ""),
            f"inputs: {self.inputs}",
            "state before:",
            describe(self.pre),
            "state after:",
            describe(self.post),
        ]
        return "\n".join(lines)


@dataclass
class TransitionResult:
    """The outcome of proving one transition at one shape."""

    transition: str
    shape: Shape
    status: str
    seconds: float
    goals: dict[str, str] = field(default_factory=dict)
    goal_seconds: dict[str, float] = field(default_factory=dict)
    counterexamples: list[Counterexample] = field(default_factory=list)

    @property
    def bounds(self) -> str:
        return f"R={self.shape.num_reqs}, B={self.shape.num_blocks}"


def _inputs_of(model: z3.ModelRef, inputs: dict[str, Any]) -> dict[str, Any]:
    def value(x: Any) -> Any:
        return value_of(model.eval(x, model_completion=True)) if is_z3(x) else x

    return {key: [value(x) for x in sym] if isinstance(sym, list) else value(sym) for key, sym in inputs.items()}


SYMMETRIC, NAMED, PLAIN = "symmetric", "named", "plain"
METHODS = (SYMMETRIC, NAMED, PLAIN)
"""How ``prove`` queries a goal (``_prove_case``): ``symmetric`` (``named``, and a transition with
an acting slot is proved for slot 0 only, by slot symmetry: ``symmetry.py``), ``named`` (each goal
a named literal, queried as an assumption; the goals of :data:`GOAL_SPLITS` by parts; the counting
stepping stones), or ``plain`` (``not goal`` asserted in a pushed scope, no counting stones: the
path before issue 14). ``named`` and ``plain`` are kept for ``bench/bench_proofs.py --compare``."""


def conjuncts(f: Any, depth: int = -1) -> list[z3.BoolRef]:
    """The conjuncts of ``f`` down to ``depth`` nested ``And``s (all of them when negative); a Python bool is one."""
    if not is_z3(f):
        return [z3.BoolVal(bool(f))]
    if depth == 0 or not z3.is_and(f):
        return [f]
    return [g for child in f.children() for g in conjuncts(child, depth - 1)]


def goal_parts(goal: z3.BoolRef, depth: int, chunks: int) -> list[z3.BoolRef]:
    """The conjuncts of ``goal`` down to ``depth`` nested ``And``s, in at most ``chunks`` groups (their ``And`` is ``goal``)."""
    items = conjuncts(goal, depth)
    size = -(-len(items) // max(1, chunks))
    return [z3.And(*items[i : i + size]) if size > 1 else items[i] for i in range(0, len(items), size)]


SLOTS = 0
"""``chunks`` of a :data:`GOAL_SPLITS` entry: one group per request slot."""


@dataclass(frozen=True)
class Pin:
    """A :data:`GOAL_SPLITS` entry: prove the goal once per value ``0..R`` of the pre-state's count ``field``.

    For a goal that indexes by a symbolic count (the new preemption record sits at
    ``num_preemptions``), each part has the count as a number, so the terms fold: the
    records below it are the pre-state's, and their rules are the premise's own
    (:func:`pinned_parts`).
    """

    field: str


def pin_state(s: State, term: z3.ExprRef, value: int) -> State:
    """``s`` with ``term`` replaced by ``value`` in every leaf, simplified; a leaf that folds to a literal becomes a Python value."""
    pinned = (term, z3.IntVal(value))

    def pin(name: str, leaf: Any, kind: str) -> Any:
        if not is_z3(leaf):
            return leaf
        folded = z3.simplify(z3.substitute(leaf, pinned))
        return value_of(folded) if z3.is_int_value(folded) or z3.is_true(folded) or z3.is_false(folded) else folded

    return s.map(pin)


def pinned_parts(goal_of: Any, pre: State, post: State, term: z3.ExprRef, values: range) -> list[z3.BoolRef]:
    """``Implies(term == v, rest_v)`` for each ``v``: ``rest_v`` is the conjuncts of ``goal_of(post)``, both states
    pinned at ``term == v`` (:func:`pin_state`), less those of ``goal_of(pre)`` so pinned.

    ``goal_of`` is an invariant or lemma (a function of a state), so ``goal_of(pre)`` is a
    premise. Sound: under ``term == v`` each pinned state equals the state (substitution of
    equals, and simplification keeps equivalence), so the parts, with the premise and
    ``Or(term == v for v in values)``, imply ``goal_of(post)``. With the count a number, the
    records below it are the pre-state's own leaves, and the invariant builds the same terms
    from them on both sides: Z3 hash-conses terms, so a shared conjunct is found by its id.
    (Replacing the count in the two formulas instead, and simplifying them, gave the same
    conjuncts different normal forms, depending on which formula was simplified first.)
    """

    parts = []
    for v in values:
        # The premise's conjuncts are held while their ids are compared: a term Python lets go
        # of may be freed by Z3, and its id given to another.
        premise = conjuncts(goal_of(pin_state(pre, term, v)))
        known = {f.get_id() for f in premise}
        rest = [f for f in conjuncts(goal_of(pin_state(post, term, v))) if f.get_id() not in known]
        parts.append(z3.Implies(term == v, z3.And(*rest)))
    return parts


GOAL_SPLITS: dict[str, dict[str, tuple[int, int] | Pin]] = {
    "*": {
        "lemma:requests": (2, 1 << 10),  # each slot's table rules, then the queue positions
        "inv:prefix_chain": (1, SLOTS),  # table positions, slot by slot
        "inv:victim_order": (1, SLOTS),  # preemption records, one by one
    },
    # The new record sits at the symbolic index num_preemptions (R=6, B=12, priority): by records
    # 94.5 s (stop 22); whole 5-8 s per case in most runs of stop 25, 108 s in one; one part per
    # count 7-8 s per case, no part above 3.5 s (README).
    "running_preempt": {"inv:victim_order": Pin("num_preemptions")},
}
"""Per transition (``"*"``: every transition, overridden per goal by the transition's own entry),
the goals proved by parts, as ``(depth, chunks)``: the goal's conjuncts ``depth`` levels of
``And`` down, in ``chunks`` consecutive groups (:func:`goal_parts`), proved in order, each with
the earlier ones assumed; or as a :class:`Pin`: one part per value of a count
(:func:`pinned_parts`), and then a query that the premises keep the count within ``0..R``
(if Z3 cannot show it, the goal is proved whole). Either way the parts imply the goal, so it
follows from the premises alone, and is assumed for the later goals like any other.
"""


CASE_FACTS = {"case_request": "request", "case_victim": "victim"}
"""Which fact of an outcome a pinned case key stands for (input ``slot`` stands for itself)."""


def prove(
    shape: Shape,
    name: str,
    timeout_s: float = 60.0,
    goals: list[str] | None = None,
    stop_at_first_failure: bool = False,
    method: str = SYMMETRIC,
    parallel: bool = False,
) -> TransitionResult:
    """Prove transition ``name`` at ``shape``: every invariant, lemma and model assertion.

    A transition with ``split`` slots is proved case by case (each slot a
    Python int, so the formulas index directly instead of through ``If``
    chains); one more goal, ``cases``, proves the cases cover the transition's
    guard. The time limit covers the whole transition; goals not reached in
    time are ``unknown``. ``method``: see :data:`METHODS`.

    ``symmetric``, for a transition with acting slots (``Transition.actor``):
    only the canonical cases are proved (``symmetry.canonical_cases``: the
    acting slot is slot 0), and two more goals carry them to every slot:
    ``cases`` (every application has its acting slots in range: one of the
    cases over all slots) and ``symmetry`` (the transition commutes with the
    permutation taking each other case to a canonical one:
    ``symmetry.check_equivariance``). The third premise of the argument, that
    the invariants and lemmas are blind to slot names, is a theorem of the
    shape, proved once by :func:`prove_theorem_symmetry`.

    ``parallel`` (``symmetric`` only): a second process (``helper.py``) checks the ``cases`` and
    ``symmetry`` goals and the queries sent to a fresh solver while this one goes on; the
    result waits for all of them (:func:`settle`). It builds those two goals from the modules as
    imported, so ask for it only in a process nothing has patched (``prove_isolated`` does).
    """
    assert method in METHODS, method
    t0 = time.monotonic()
    helper = Helper() if parallel and method == SYMMETRIC else None
    try:
        return _prove(shape, name, timeout_s, goals, stop_at_first_failure, method, helper, t0)
    finally:
        if helper is not None:
            helper.close()


@dataclass
class Pending:
    """A goal (or part) whose fresh query runs in the helper; the proof assumed it and went on.

    ``recheck()`` checks the same query here, in a fresh solver (:func:`_check_goal` with the facts
    as they were): for a query the helper has not started, and for a counterexample, which is read
    from a model here.
    """

    goal_name: str
    key: str
    future: Any
    recheck: Any


def _prove(
    shape: Shape,
    name: str,
    timeout_s: float,
    goals: list[str] | None,
    stop_at_first_failure: bool,
    method: str,
    helper: Helper | None,
    t0: float,
) -> TransitionResult:
    transition = TRANSITIONS[name] if name in TRANSITIONS else COMPOSED[name]
    result = TransitionResult(name, shape, PROVED, 0.0)
    deadline = t0 + timeout_s
    deferred: dict[str, tuple[Any, Any]] = {}
    """A goal checked by the helper: its future and how to check it here instead."""

    def run_goal(goal_name: str, fn: Any, *args: Any) -> None:
        if helper is None:
            result.goals[goal_name], result.goal_seconds[goal_name] = fn(*args, deadline - time.monotonic())
        else:
            deferred[goal_name] = (
                helper.submit(fn, *args, deadline - time.monotonic()),
                lambda: fn(*args, deadline - time.monotonic()),
            )

    cases = transition.cases(shape)
    symmetric = method == SYMMETRIC and bool(transition.actor) and not transition.split
    if symmetric:
        cases = dataclasses.replace(transition, split=transition.actor).cases(shape)
    if len(cases) > 1 and goals is None:
        run_goal("cases", check_cases, shape, name, cases)
    if symmetric:
        cases = canonical_cases(transition.actor)
        if goals is None:
            run_goal("symmetry", check_symmetry, shape, name)
    vacuous = True
    went_fresh: set[str] = set()
    pending: list[Pending] = []
    for case in cases:
        label = ",".join(f"{k}={v}" for k, v in case.items())
        status = _prove_case(
            shape,
            transition,
            case,
            label,
            timeout_s,
            t0,
            result,
            goals,
            stop_at_first_failure,
            {**GOAL_SPLITS["*"], **GOAL_SPLITS.get(name, {})} if method != PLAIN else {},
            method,
            went_fresh,
            helper,
            pending,
        )
        vacuous = vacuous and status == VACUOUS
        if stop_at_first_failure and FAILED in result.goals.values():
            break
    settle(result, deferred, pending, deadline)
    statuses = set(result.goals.values())
    result.status = VACUOUS if vacuous else FAILED if FAILED in statuses else UNKNOWN if UNKNOWN in statuses else PROVED
    result.seconds = time.monotonic() - t0
    return result


def settle(
    result: TransitionResult, deferred: dict[str, tuple[Any, Any]], pending: list[Pending], deadline: float
) -> None:
    """Wait for the helper's goals and queries and put their verdicts into ``result``.

    The tasks the helper has not started are taken back and run here, the last first (the
    helper goes on from the front; the proof is done, this process is free). A pending goal
    that does not come back ``unsat`` makes its goal ``unknown``, or ``counterexample`` when the
    check here finds one; the goals after it were proved assuming it, so the transition is not
    proved either way.
    """
    futures = [future for future, _ in deferred.values()] + [p.future for p in pending]
    runs = [run for _, run in deferred.values()] + [p.recheck for p in pending]
    here: dict[int, Any] = {}
    for i in reversed(range(len(futures))):
        if futures[i].cancel():
            here[i] = runs[i]()
    for i, goal_name in enumerate(deferred):
        got = here[i] if i in here else result_by(futures[i], deadline)
        result.goals[goal_name], result.goal_seconds[goal_name] = got if got is not None else (UNKNOWN, 0.0)
    for i, p in enumerate(pending, start=len(deferred)):
        if i in here:
            status = here[i]
        else:
            got = result_by(p.future, deadline)
            if got is not None:
                result.goal_seconds[p.key + " (fresh)"] = got[1]
            verdict = got[0] if got is not None else "unknown"
            status = PROVED if verdict == "unsat" else p.recheck() if verdict == "sat" else UNKNOWN
        if status != PROVED and result.goals.get(p.goal_name) != FAILED:
            result.goals[p.goal_name] = status


def check_cases(shape: Shape, name: str, cases: list[dict[str, int]], timeout_s: float) -> tuple[str, float]:
    """The goal ``cases``: every application of the transition has its acting slots in one of ``cases``."""
    t0 = time.monotonic()
    transition = TRANSITIONS[name] if name in TRANSITIONS else COMPOSED[name]
    pre = fresh_state(shape, "pre")
    inputs = transition.inputs(shape, "in")
    out = transition.apply(pre, inputs)
    solver = z3.Solver()
    solver.set("timeout", max(1, int(timeout_s * 1000)))
    solver.add(*premises(pre), _as_bool(out.guard))
    for case in cases:
        match = [inputs[k] == v if k == "slot" else out.facts[CASE_FACTS[k]] == v for k, v in case.items()]
        solver.add(z3.Not(z3.And(*[_as_bool(m) for m in match])))
    verdict = solver.check()
    return PROVED if verdict == z3.unsat else FAILED if verdict == z3.sat else UNKNOWN, time.monotonic() - t0


def check_symmetry(shape: Shape, name: str, timeout_s: float) -> tuple[str, float]:
    """The goal ``symmetry``: the transition commutes with the slot permutations (``symmetry.check_equivariance``)."""
    transition = TRANSITIONS[name] if name in TRANSITIONS else COMPOSED[name]
    status, seconds, _ = check_equivariance(shape, transition, timeout_s)
    return status, seconds


def prove_isolated(
    shape: Shape, name: str, timeout_s: float = 60.0, method: str = SYMMETRIC, parallel: bool = True
) -> TransitionResult:
    """``prove`` in a fresh process, so that its time does not depend on what ran before it.

    Z3 keeps every term ever built in one global context, and a proof run
    after many others in the same process can take several times longer
    (``running_preempt`` at R=4, B=8: 26 s fresh, 69 s after the other
    transitions; ``waiting_admit`` went from 38 s to over 240 s under
    pytest-xdist). Every figure in the proof table and every CI proof is
    therefore measured in a process of its own (``spawn``: nothing inherited).
    ``parallel``: with the helper process beside it (``prove(parallel=True)``), as everywhere
    but the benchmark's before-and-after.
    """
    return run_isolated(prove, shape, name, timeout_s, None, False, method, parallel)


def run_isolated(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a fresh process (``spawn``), for the reason ``prove_isolated`` gives."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


def _prove_case(
    shape: Shape,
    transition: Any,
    case: dict[str, int],
    label: str,
    timeout_s: float,
    t0: float,
    result: TransitionResult,
    goals: list[str] | None,
    stop_at_first_failure: bool,
    splits: dict[str, tuple[int, int] | Pin] | None = None,
    method: str = SYMMETRIC,
    went_fresh: set[str] | None = None,
    helper: Helper | None = None,
    pending: list[Pending] | None = None,
) -> str:
    """Prove one case of a transition into ``result``; return VACUOUS when its premises are unsatisfiable.

    ``splits`` maps a goal to how it is proved by parts (:data:`GOAL_SPLITS`).
    ``went_fresh``: the goals (and parts) an earlier case sent to a fresh solver (``symmetric``,
    :data:`FRESH_AFTER_S`); this case sends them there at once, and adds its own.
    ``helper``: such a query goes to the helper process instead, the goal is assumed as if proved,
    and is added to ``pending`` (for :func:`settle`).
    ``symmetric``, for an outcome with :class:`~schedconf.spec.symbolic.transitions.Abstraction` s:
    their facts are proved first (goals ``abstraction:...``, in the solver that checked the premises),
    then every goal with the abstracted terms replaced by fresh constants of which only
    those facts are known (:func:`_abstract`).
    """

    def remaining_ms() -> int:
        return max(1, int((timeout_s - (time.monotonic() - t0)) * 1000))

    went_fresh = set() if went_fresh is None else went_fresh
    pending = [] if pending is None else pending
    pre = fresh_state(shape, "pre")
    inputs = {**transition.inputs(shape, "in"), **case}
    out: Outcome = transition.apply(pre, inputs)
    if method != PLAIN:
        phase = _phase_fixed_by(out.guard, pre.phase)
        if phase is not None:
            # The guard fixes the phase: prove over the states with that phase as a Python value,
            # so the premises fold what depends on it (has_output) the way the goals do.
            pre = pre.replace(phase=phase)
            out = transition.apply(pre, inputs)
    named = method != PLAIN
    fresh_after_s = FRESH_AFTER_S if method == SYMMETRIC else None
    state_premises = premises(pre)
    hypotheses = [_as_bool(out.guard), *[_as_bool(p) for p in out.premises]]
    """Guard and instances of theorem_rank / theorem_order (proved for the shape by prove_theorem_*)."""
    abstract_facts: list[tuple[str, Any]] = []
    """Facts of the abstracted terms, proved on the terms (first) and assumed of their stand-ins (then)."""
    substitute: Any = None
    definitions: list[Any] = []
    """``stand-in == term`` for each abstracted term: added only to confirm a counterexample."""
    if method == SYMMETRIC and out.abstractions and goals is None:
        abstract_facts = [
            (f"abstraction:{name}", _as_bool(f)) for a in out.abstractions for name, f in a.facts(a.terms)
        ]
        substitute, stand_in_facts, definitions = _abstract(out.abstractions, label)

    def open_solver(formulas: list[Any]) -> tuple[z3.Solver, list[z3.BoolRef]]:
        solver = z3.Solver()
        facts: list[z3.BoolRef] = []
        """``named``: literals standing for the premises and the goals proved so far, passed as assumptions."""
        for i, p in enumerate(formulas):
            if named:
                facts.append(z3.Bool(f"premise!{i}"))
                solver.add(facts[-1] == p)
            else:
                solver.add(p)
        return solver, facts

    def key_of(goal_name: str, part: str = "") -> str:
        return f"{label}:{goal_name}{part}" if label else goal_name + part

    def check(goal_name: str, goal: z3.BoolRef, ops: Z3Ops, part: str = "", terms: bool = False) -> str:
        """``goal`` in the proof's solver; PENDING when it went to the helper. ``terms``: over the
        abstracted terms themselves (an abstraction's facts), so no definitions to add."""
        key = key_of(goal_name, part)
        # A goal that an earlier case of the transition sent to a fresh solver goes there first.
        after_s = 0.0 if fresh_after_s is not None and goal_name + part in went_fresh else fresh_after_s
        by_terms = [] if terms else definitions

        def send(query: list[z3.BoolRef]) -> None:
            # The recheck is this very query, with the solver and facts as they are now.
            recheck = functools.partial(
                _check_goal,
                solver,
                list(facts),
                names,
                named,
                goal,
                remaining_ms,
                result,
                key,
                goal_name,
                pre,
                out,
                inputs,
                ops,
                by_terms,
                0.0,
            )
            future = helper.submit(check_text, render_query(solver, query), t0 + timeout_s)
            pending.append(Pending(goal_name, key, future, recheck))

        status = _check_goal(
            solver,
            facts,
            names,
            named,
            goal,
            remaining_ms,
            result,
            key,
            goal_name,
            pre,
            out,
            inputs,
            ops,
            by_terms,
            after_s,
            send if helper is not None else None,
        )
        if status == PENDING or f"{key} (fresh)" in result.goal_seconds:
            went_fresh.add(goal_name + part)
        return status

    names: dict[int, z3.BoolRef] = {}
    solver, facts = open_solver([*state_premises, *hypotheses])
    solver.set("timeout", remaining_ms())
    # The premises are satisfiable (else the proof is vacuous): checked with them asserted, in a
    # solver of its own (_check_fresh), which Z3 preprocesses (running_preempt at R=6, B=12:
    # 2.4-2.9 s as assumptions in the proof's solver, 0.7-1.0 s asserted).
    if (_check_fresh(solver, facts, remaining_ms())[0] if named else solver.check()) == z3.unsat:
        return VACUOUS
    if abstract_facts:
        # The abstraction's facts, on the terms themselves (this solver); then a solver where
        # the terms are replaced by stand-ins of which only those facts are known.
        for goal_name, goal in abstract_facts:
            status = check(goal_name, goal, Z3Ops(), terms=True)
            result.goals[goal_name] = PROVED if status == PENDING else status
            if status not in (PROVED, PENDING):
                return PROVED
        solver, facts = open_solver([*state_premises, *[substitute(h) for h in hypotheses], *stand_in_facts])
        names = {}
    if not named:
        out.checks = [(c, f) for c, f in out.checks if not c.startswith(STONE)]
    view = SymbolicView(out.post)
    # Checks first, then lemmas, then invariants; each goal proved is assumed
    # for the next ones (sound: it follows from the premises).
    post_goals: list[tuple[str, Any]] = [(f"check:{c}", lambda ops, f=f: f) for c, f in out.checks]
    for lemma_name, fn in LEMMAS.items():
        post_goals.append((f"lemma:{lemma_name}", lambda ops, fn=fn: fn(out.post, ops)))
    for inv_name, fn in schedconf.spec.v1.invariants.INVARIANTS.items():
        post_goals.append((f"inv:{inv_name}", lambda ops, fn=fn: fn(view, ops)))
    if goals is not None:
        post_goals = [(g, f) for g, f in post_goals if g in goals]
    splits = splits or {}

    def assume_proved(goal: z3.BoolRef) -> None:
        if named:
            facts.append(_name_of(solver, names, goal))
        else:
            solver.add(goal)

    def split_goal(goal_name: str, goal: z3.BoolRef, how: tuple[int, int] | Pin) -> list[z3.BoolRef]:
        if not isinstance(how, Pin):
            depth, chunks = how
            return goal_parts(goal, depth, chunks or shape.num_reqs)
        kind, name = goal_name.split(":", 1)
        if kind == "inv":

            def goal_of(s: State) -> Any:
                return schedconf.spec.v1.invariants.INVARIANTS[name](SymbolicView(s), Z3Ops())
        else:

            def goal_of(s: State) -> Any:
                return LEMMAS[name](s, Z3Ops())

        parts = pinned_parts(goal_of, pre, out.post, getattr(pre, how.field), range(shape.num_reqs + 1))
        # The stand-ins of an abstraction replace those of its terms the pinned states kept as they were.
        return [substitute(part) for part in parts] if substitute is not None else parts

    def is_covered(goal_name: str, how: tuple[int, int] | Pin) -> bool:
        """The parts imply the goal: always for conjuncts; for a pin, when the premises keep the count in ``0..R``
        (asked after the parts, which do not assume it)."""
        if not isinstance(how, Pin):
            return True
        # Goals are split only by the named methods (prove passes no splits to plain).
        term = getattr(pre, how.field)
        in_range = z3.Or(*[term == v for v in range(shape.num_reqs + 1)])
        solver.set("timeout", remaining_ms())
        t_range = time.monotonic()
        verdict = solver.check(*facts, z3.Not(_name_of(solver, names, in_range)))
        result.goal_seconds[key_of(goal_name, "#range")] = time.monotonic() - t_range
        return verdict == z3.unsat

    for goal_name, build in post_goals:
        if time.monotonic() - t0 >= timeout_s:
            result.goals[goal_name] = UNKNOWN
            continue
        ops = Z3Ops()
        goal = _as_bool(build(ops))
        if substitute is not None:
            goal = substitute(goal)
        if goal_name in splits:
            # By parts: each proved with the earlier ones assumed; together they imply the goal.
            status = PROVED
            for i, part in enumerate(split_goal(goal_name, goal, splits[goal_name])):
                status = check(goal_name, part, ops, f"#{i}")
                if status not in (PROVED, PENDING):
                    break
                assume_proved(part)
            if status in (PROVED, PENDING) and not is_covered(goal_name, splits[goal_name]):
                status = check(goal_name, goal, ops)  # the parts leave some counts out: the goal whole
        else:
            status = check(goal_name, goal, ops)
        previous = result.goals.get(goal_name, PROVED)
        # A pending goal counts as proved until settle() hears otherwise.
        result.goals[goal_name] = (PROVED if status == PENDING else status) if previous == PROVED else previous
        if status in (PROVED, PENDING):
            assume_proved(goal)
        if stop_at_first_failure and status == FAILED:
            break
    return PROVED


def _abstract(abstractions: list[Any], label: str) -> tuple[Any, list[z3.BoolRef], list[z3.BoolRef]]:
    """Fresh constants for the abstracted terms: ``(substitute, facts of the constants, definitions)``.

    ``substitute(f)`` is ``f`` with every abstracted term replaced by its
    constant; the definitions (``constant == term``) are not assumed by the
    proof, only added to confirm a counterexample it finds.
    """
    pairs: list[tuple[Any, Any]] = []
    stand_in_facts: list[z3.BoolRef] = []
    for n, a in enumerate(abstractions):
        fresh: dict[Any, Any] = {}
        for key, term in a.terms.items():
            if not is_z3(term):
                fresh[key] = term
                continue
            const = z3.Const(f"abstract!{label}!{n}!{key}", term.sort())
            fresh[key] = const
            pairs.append((term, const))
        stand_in_facts += [_as_bool(f) for _, f in a.facts(fresh)]

    def substitute(f: Any) -> Any:
        return z3.substitute(f, *pairs) if is_z3(f) and pairs else f

    # A fact may mention another abstraction's terms (the free queue after a touch mentions the hit).
    return substitute, [substitute(f) for f in stand_in_facts], [c == t for t, c in pairs]


FRESH_AFTER_S = 2.0
"""How long a ``symmetric`` query runs in the proof's solver before it is sent to a fresh one
(``running_preempt`` at R=6, B=12, FCFS: 63.8 s with 5 s, 51.5 s with 2 s; 0.5 s: faster at
R=6, B=12 in 3 of 4 rows, slower at R=4, B=8 for ``waiting_admit``, README). The proof's solver
is stopped by its own timeout only: ``Context.interrupt`` landing mid-check made it answer
``sat`` to valid queries (README, stop 24), so a race that stops the loser that way is unsound."""


def _check_fresh(solver: z3.Solver, query: list[z3.BoolRef], timeout_ms: int) -> tuple[Any, z3.Solver]:
    """``query`` (assumption literals) checked in a new solver holding ``solver``'s assertions, the literals asserted.

    The proof's solver is incremental: its queries pass the premises and goals as assumptions, so
    Z3 cannot preprocess them (solve equations, propagate values) and keeps no proof-specific
    simplification; a new solver with the same formulas asserted checks them the way a single
    query is checked. ``running_preempt`` at R=6, B=12, self-preemption: the record rule of
    ``lemma:step`` is unknown after 60 s in the proof's solver and unsat in 0.8 s in a new one.
    What the new solver learns is lost; the proof's solver keeps its own.
    """
    fresh = get_fresh_solver(solver, query)
    fresh.set("timeout", timeout_ms)
    return fresh.check(), fresh


def _name_of(solver: z3.Solver, names: dict[int, z3.BoolRef], goal: z3.BoolRef) -> z3.BoolRef:
    """The fresh literal standing for ``goal`` in ``solver`` (``lit == goal`` asserted once)."""
    if goal.get_id() not in names:
        names[goal.get_id()] = z3.Bool(f"goal!{len(names)}")
        solver.add(names[goal.get_id()] == goal)
    return names[goal.get_id()]


def _check_goal(
    solver: z3.Solver,
    facts: list[z3.BoolRef],
    names: dict[int, z3.BoolRef],
    named: bool,
    goal: z3.BoolRef,
    remaining_ms: Any,
    result: TransitionResult,
    key: str,
    goal_name: str,
    pre: State,
    out: Outcome,
    inputs: dict[str, Any],
    ops: Z3Ops,
    definitions: list[z3.BoolRef],
    fresh_after_s: float | None = None,
    offload: Any = None,
) -> str:
    """One query: ``goal`` under everything asserted; a counterexample goes into ``result``.

    ``named``: the goal gets a fresh name ``lit`` (``lit == goal`` asserted: a definition, which
    any model extends), and the query is ``not lit`` under the ``facts`` (premises and goals
    proved, named alike) as assumptions. Asserted, the premises are simplified by Z3 into
    other terms than the goals', so a goal that repeats a premise (an unchanged invariant)
    still cost a search (about 2 s for ``victim_order`` after ``get_new_blocks`` at R=6,
    B=12); named, it is the same literal. No scope is pushed, so what Z3 learns in one query
    serves the next.

    ``definitions``: the goal is over stand-ins for abstracted terms; a model of its negation
    may give them values the terms cannot take, so the query is repeated with the definitions
    (the goal on the terms themselves, time under ``key + " (terms)"``) before it counts as a
    counterexample.

    ``fresh_after_s`` (named only): a query still open after that long is stopped and sent again
    to a fresh solver with everything asserted (:func:`_check_fresh`; time under
    ``key + " (fresh)"``); 0: it goes to the fresh solver at once. ``offload``: instead of that,
    the query is handed to ``offload(query)`` (which sends it to the helper process) and PENDING
    is returned.
    """
    if named:
        query = [*facts, z3.Not(_name_of(solver, names, goal))]
    else:
        solver.push()
        solver.add(z3.Not(goal))
        query = []
    capped = named and fresh_after_s is not None and remaining_ms() > fresh_after_s * 1000
    verdict = z3.unknown
    if not (capped and fresh_after_s == 0):
        solver.set("timeout", max(1, int(fresh_after_s * 1000)) if capped else remaining_ms())
        t_goal = time.monotonic()
        verdict = solver.check(*query)
        result.goal_seconds[key] = result.goal_seconds.get(key, 0.0) + time.monotonic() - t_goal
    if capped and verdict == z3.unknown and offload is not None:
        offload(query)
        return PENDING
    if capped and verdict == z3.unknown:
        t_goal = time.monotonic()
        verdict, fresh = _check_fresh(solver, query, remaining_ms())
        result.goal_seconds[key + " (fresh)"] = time.monotonic() - t_goal
        if verdict == z3.sat:
            solver = fresh  # the counterexample is read from the solver that found it
    if verdict == z3.sat and definitions:
        solver.push()
        solver.add(*definitions)
        solver.set("timeout", remaining_ms())
        t_goal = time.monotonic()
        verdict = solver.check(*query)
        result.goal_seconds[key + " (terms)"] = time.monotonic() - t_goal
        solver.pop()
    if verdict == z3.unsat:
        status = PROVED
    elif verdict == z3.sat:
        # Prefer a counterexample the concrete model can hold: tables without holes.
        solver.push()
        solver.add(*definitions, *dense_tables(pre))
        solver.set("timeout", remaining_ms())
        dense = solver.check(*query) == z3.sat
        model = solver.model() if dense else None
        solver.pop()
        if model is None:
            solver.push()
            solver.add(*definitions)
            solver.check(*query)
            model = solver.model()
            solver.pop()
        status = FAILED
        result.counterexamples.append(
            Counterexample(
                goal=goal_name,
                pre=evaluate(pre, model),
                inputs=_inputs_of(model, inputs),
                post=evaluate(out.post, model),
                subjects=ops.failing_subjects(model),
            )
        )
    else:
        status = UNKNOWN
    if not named:
        solver.pop()
    return status


def _phase_fixed_by(guard: Any, phase: Any) -> int | None:
    """The value ``c`` when ``phase == c`` is a top-level conjunct of ``guard``, else None."""
    if not is_z3(guard):
        return None
    if z3.is_and(guard):
        for child in guard.children():
            found = _phase_fixed_by(child, phase)
            if found is not None:
                return found
        return None
    if z3.is_eq(guard):
        a, b = guard.arg(0), guard.arg(1)
        if a.eq(phase) and z3.is_int_value(b):
            return b.as_long()
        if b.eq(phase) and z3.is_int_value(a):
            return a.as_long()
    return None


def prove_theorem_rank(shape: Shape, timeout_s: float = 120.0) -> TransitionResult:
    """Prove ``state.theorem_rank`` for every state of ``shape`` and every ``n`` (no premises at all)."""
    t0 = time.monotonic()
    s = fresh_state(shape, "any")
    n = z3.Int("any.n")
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    solver.add(z3.Not(_as_bool(theorem_rank(s, n))))
    verdict = solver.check()
    status = PROVED if verdict == z3.unsat else FAILED if verdict == z3.sat else UNKNOWN
    return TransitionResult("theorem_rank", shape, status, time.monotonic() - t0, {"theorem_rank": status})


def prove_theorem_symmetry(shape: Shape, timeout_s: float = 120.0) -> TransitionResult:
    """Prove that the premises (every invariant and lemma) are blind to slot names at ``shape`` (``symmetry.py``)."""
    status, seconds = check_premises_symmetric(shape, timeout_s)
    return TransitionResult("theorem_symmetry", shape, status, seconds, {"theorem_symmetry": status})


def prove_theorem_order(num_items: int, timeout_s: float = 120.0) -> TransitionResult:
    """Prove ``state.theorem_order`` for ``num_items`` fresh members and keys, both orders (no premises)."""
    t0 = time.monotonic()
    members = {b: z3.Bool(f"member[{b}]") for b in range(1, num_items + 1)}
    keys = {b: z3.Int(f"key[{b}]") for b in range(1, num_items + 1)}
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    solver.add(z3.Not(z3.And(_as_bool(theorem_order(members, keys)), _as_bool(theorem_order(members, keys, True)))))
    verdict = solver.check()
    status = PROVED if verdict == z3.unsat else FAILED if verdict == z3.sat else UNKNOWN
    return TransitionResult(
        "theorem_order", Shape(1, num_items), status, time.monotonic() - t0, {"theorem_order": status}
    )


# ------------------------------------------------------------------ counterexamples


def confirm_counterexample(cex: Counterexample, transition: str) -> str | None:
    """Run the model's own event on the injected pre-state; return the violation of the goal's invariant.

    Only event-level transitions have a model entry point from an IDLE or
    PENDING state (``abort``, ``abort_pending``, ``add_request``); for the
    others None. The injected pre-state must satisfy every invariant
    concretely (else the injection is reported).
    """
    from schedconf.spec.errors import SpecError
    from schedconf.spec.ops import ConcreteOps
    from schedconf.spec.symbolic.state import slot_id, to_scheduler
    from schedconf.spec.v1.view import ConcreteView

    if transition not in ("abort", "abort_pending", "add_request") or not cex.goal.startswith("inv:"):
        return None
    invariant = cex.goal[4:]
    sched, _ = to_scheduler(cex.pre)
    invariants = schedconf.spec.v1.invariants.INVARIANTS
    broken = [name for name, fn in invariants.items() if not fn(ConcreteView(sched), ConcreteOps())]
    if broken:
        return f"injection: the concrete pre-state already breaks {broken}"
    try:
        if transition in ("abort", "abort_pending"):
            sched.abort(slot_id(cex.inputs["slot"]))
        else:
            q = cex.inputs["slot"]
            sched.add_request(
                slot_id(q),
                [100 + i for i in range(cex.inputs["num_prompt_tokens"])],
                cex.inputs["max_tokens"],
                priority=cex.inputs["priority"],
                arrival_time=cex.inputs["arrival_time"],
            )
    except SpecError as exc:
        return f"model error {exc.code}: {exc}"
    ops = ConcreteOps()
    if not invariants[invariant](ConcreteView(sched), ops):
        subject = " / ".join(reversed(ops.failures)) or "the step as a whole"
        return f"{invariant}: violated by {subject}"
    return None


EVENT_KINDS = {"abort": ("abort",), "abort_pending": ("abort",), "add_request": ("add_request",)}
"""Trace event kinds of the transitions that are model events by themselves; the rest are parts of a
``step`` (schedule) or ``model_output`` (update) event."""


def counterexample_trace(cex: Counterexample, transition: str, tries: int = 200) -> Any:
    """A trace (format v1) in which the model breaks the same invariant in the same kind of event, or None.

    Workloads seeded by the counterexample's state (``realise.search``) are
    run and replayed with every invariant checked; the first that breaks the
    goal's invariant at an event of the transition's kind is cut there.
    """
    from schedconf.spec.symbolic.realise import search, truncate_at_violation

    if not cex.goal.startswith("inv:"):
        return None
    invariant = cex.goal[4:]
    if transition in EVENT_KINDS:
        kinds = EVENT_KINDS[transition]
    elif transition in ("append_token", "begin_update", "end_update"):
        kinds = ("model_output",)
    else:
        kinds = ("step",)
    holder: dict[str, Any] = {}

    def accept(trace: Any) -> str | None:
        cut = truncate_at_violation(trace, invariant, kinds)
        if cut is None:
            return None
        holder["trace"] = cut[0]
        return cut[1]

    description = f"Counterexample to {cex.goal} after {transition}."
    found = search(
        cex.pre,
        f"cex-{transition}",
        description,
        accept,
        tries=tries,
        with_abort=transition in ("abort", "abort_pending"),
    )
    if found is None:
        return None
    trace = holder["trace"]
    trace.header["origin"] = "symbolic-counterexample"
    trace.header["description"] = f"{description} {found[1]}"
    return trace


# ------------------------------------------------------------------ tables and CLI


def prove_all(shapes: list[Shape], names: list[str], timeout_s: float) -> list[TransitionResult]:
    """Prove every transition at every shape."""
    return [prove(shape, name, timeout_s) for shape in shapes for name in names]


@dataclass
class Largest:
    """The largest bounds a transition's proof reached within a time limit, per direction."""

    transition: str
    policy: str
    blocks: tuple[int, int, float]
    """(R, largest B, seconds) growing B at the target R (or shrinking it when the target misses)."""
    reqs: tuple[int, int, float]
    """(largest R, B, seconds) growing R at the target B."""


def largest_bounds(
    name: str,
    policy: str = "fcfs",
    block_size: int = 2,
    timeout_s: float = 60.0,
    target: tuple[int, int] = (4, 8),
    more_blocks: tuple[int, ...] = (10, 12, 16),
    more_reqs: tuple[int, ...] = (6, 8),
) -> Largest:
    """Grow B at the target R, and R at the target B, through the given steps while the proof fits ``timeout_s``.

    When the target itself misses the limit, B shrinks one by one until a proof fits.
    """

    def ok(r: int, b: int) -> float | None:
        res = prove_isolated(Shape(r, b, block_size, policy), name, timeout_s)
        return res.seconds if res.status == PROVED else None

    r0, b0 = target
    at_target = ok(r0, b0)
    if at_target is None:
        for b in range(b0 - 1, 0, -1):
            secs = ok(r0, b)
            if secs is not None:
                return Largest(name, policy, (r0, b, secs), (0, b0, 0.0))
        return Largest(name, policy, (r0, 0, 0.0), (0, b0, 0.0))

    def grow(bounds: list[tuple[int, int]]) -> tuple[int, int, float]:
        best = (r0, b0, at_target)
        for r, b in bounds:
            secs = ok(r, b)
            if secs is None:
                break
            best = (r, b, secs)
        return best

    return Largest(name, policy, grow([(r0, b) for b in more_blocks]), grow([(r, b0) for r in more_reqs]))


def render_table(results: list[TransitionResult]) -> str:
    """A markdown table: transition, shape, result, time."""
    lines = ["| transition | bounds | block size | policy | result | time (s) |", "|---|---|---|---|---|---|"]
    for res in results:
        lines.append(
            f"| {res.transition} | {res.bounds} | {res.shape.block_size} | {res.shape.policy} | "
            f"{res.status} | {res.seconds:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: prove and print the table; write counterexamples under ``--out``."""
    parser = argparse.ArgumentParser(
        prog="python -m schedconf.spec.symbolic.proofs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--bounds", default="4,8", help="R,B: request slots and usable blocks")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per transition")
    parser.add_argument("--block-size", default="2", help="comma-separated block sizes")
    parser.add_argument("--policy", default="fcfs,priority", help="comma-separated policies")
    parser.add_argument("--transitions", default="", help="comma-separated names (default: all)")
    parser.add_argument(
        "--largest",
        action="store_true",
        help="also report the largest bounds within the timeout (B in 10, 12, 16 at R; R in 6, 8 at B)",
    )
    parser.add_argument("--skip-table", action="store_true", help="with --largest: skip the proofs at --bounds")
    parser.add_argument("--out", default="reports/symbolic", help="where counterexamples are written")
    args = parser.parse_args(argv)
    num_reqs, num_blocks = (int(x) for x in args.bounds.split(","))
    names = [n for n in args.transitions.split(",") if n] or list(TRANSITIONS)
    known = {**TRANSITIONS, **COMPOSED}
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown transitions {unknown}; known: {', '.join(known)}")
    results = []
    exit_code = 0
    for bs in (int(x) for x in args.block_size.split(",")) if not (args.largest and args.skip_table) else ():
        for policy in args.policy.split(","):
            for name in names:
                res = prove_isolated(Shape(num_reqs, num_blocks, bs, policy), name, args.timeout)
                results.append(res)
                print(_render_row(res), flush=True)
                if res.status != PROVED:
                    exit_code = 1
                for cex in res.counterexamples[:1]:
                    print(_report_counterexample(cex, name, Path(args.out)))
            if any(known[n].actor for n in names):
                # The symmetric proofs above rest on this theorem of the shape.
                res = run_isolated(prove_theorem_symmetry, Shape(num_reqs, num_blocks, bs, policy), args.timeout)
                results.append(res)
                print(_render_row(res), flush=True)
                if res.status != PROVED:
                    exit_code = 1
    print()
    print(render_table(results))
    if args.largest:
        print()
        print(f"| transition | policy | largest B at R={num_reqs} (time) | largest R at B={num_blocks} (time) |")
        print("|---|---|---|---|")
        for policy in args.policy.split(","):
            for name in names:
                big = largest_bounds(
                    name, policy, int(args.block_size.split(",")[0]), args.timeout, (num_reqs, num_blocks)
                )
                print(
                    f"| {name} | {policy} | B={big.blocks[1]} ({big.blocks[2]:.1f} s) | "
                    f"R={big.reqs[0]} ({big.reqs[2]:.1f} s) |",
                    flush=True,
                )
    return exit_code


def _render_row(res: TransitionResult) -> str:
    """One progress line of the CLI: transition, bounds, block size, policy, result, time."""
    sh = res.shape
    return (
        f"{res.transition:20s} {res.bounds:10s} bs={sh.block_size} {sh.policy:8s} {res.status:15s} {res.seconds:6.1f}s"
    )


def _report_counterexample(cex: Counterexample, transition: str, out_dir: Path) -> str:
    """Print, confirm and write one counterexample; return the report text."""
    from schedconf.conformance.traces.trace import write_trace

    lines = ["", cex.render()]
    confirmed = confirm_counterexample(cex, transition)
    if confirmed:
        lines.append(f"the model confirms on the injected state: {confirmed}")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{transition}-{cex.goal.replace(':', '-')}"
    state_file = out_dir / f"{stem}.json"
    state_file.write_text(
        json.dumps(
            {
                "transition": transition,
                "goal": cex.goal,
                "subjects": cex.subjects,
                "inputs": cex.inputs,
                "state_before": describe(cex.pre).splitlines(),
                "state_after": describe(cex.post).splitlines(),
                "confirmed_by_model": confirmed,
            },
            indent=1,
        )
    )
    lines.append(f"state written to {state_file}")
    trace = counterexample_trace(cex, transition)
    if trace is not None:
        trace_file = out_dir / f"{stem}.jsonl"
        write_trace(trace_file, trace)
        lines.append(f"trace written to {trace_file} (replay: schedconf replay {trace_file})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
