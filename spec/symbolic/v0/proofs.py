"""Prove that every v0 transition preserves every v0 invariant, for all states of a shape.

For a transition ``T`` and a shape (``R`` request slots, ``B`` GPU blocks,
``C`` CPU blocks, block size) the obligation is, over fresh symbolic states
and inputs::

    Inv(s) and Lemmas(s) and guard_T(s, x)  =>  checks_T(s, x) and Lemmas(T(s, x)) and Inv(T(s, x))

with ``Inv`` the rules of ``spec/symbolic/v0/invariants.py`` evaluated
through :class:`~schedconf.spec.symbolic.v0.state.StateView` and
:class:`~schedconf.spec.symbolic.z3ops.Z3Ops`, ``Lemmas`` the encoding's
well-formedness and strengthening lemmas, and ``checks_T`` the model's own
assertions on the way. Each conjunct is one Z3 query; goals proved are
assumed for the next ones. A proof whose premises are unsatisfiable is
reported ``vacuous`` (the transition cannot fire in any state of the shape).

CLI::

    python -m schedconf.spec.symbolic.v0.proofs --bounds 4,8 [--cpu-blocks 8] [--block-size 2] [--timeout 120]
        [--transitions a,b] [--out DIR]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import z3

from schedconf.spec.symbolic.v0 import invariants as v0_invariants
from schedconf.spec.symbolic.v0.model_view import model_invariant_formulas
from schedconf.spec.symbolic.v0.state import (
    LEMMAS,
    Shape,
    State,
    StateView,
    describe,
    evaluate,
    fresh_state,
    theorem_rank,
)
from schedconf.spec.symbolic.v0.transitions import TRANSITIONS, Outcome
from schedconf.spec.symbolic.z3ops import Z3Ops, count, is_z3, value_of

PROVED, FAILED, UNKNOWN, VACUOUS = "proved", "counterexample", "unknown", "vacuous"


def _as_bool(f: Any) -> z3.BoolRef:
    return f if is_z3(f) else z3.BoolVal(bool(f))


def invariant_formulas(s: State) -> list[tuple[str, Any]]:
    view = StateView(s)
    return [(f"inv:{name}", fn(view, Z3Ops())) for name, fn in v0_invariants.INVARIANTS.items()]


def lemma_formulas(s: State) -> list[tuple[str, Any]]:
    return [(f"lemma:{name}", fn(s, Z3Ops())) for name, fn in LEMMAS.items()]


def premises(s: State) -> list[Any]:
    """Invariants and lemmas of ``s`` as Z3 Booleans."""
    return [_as_bool(f) for _, f in invariant_formulas(s) + lemma_formulas(s)]


def dense_tables(s: State) -> list[Any]:
    """Tables without holes (the model's lists have none): asked for first in counterexamples and witnesses."""
    sh = s.shape
    return [count(s.held[r][b] for b in sh.blocks) == s.num_blocks[r] for r in sh.slots] + [
        count(s.cpu_held[r][c] for c in sh.cpu_blocks) == s.num_cpu_blocks[r] for r in sh.slots
    ]


@dataclass
class Counterexample:
    goal: str
    pre: State
    inputs: dict[str, Any]
    post: State
    subjects: list[str]

    def render(self) -> str:
        return "\n".join(
            [
                f"goal {self.goal} fails" + (f" for {', '.join(self.subjects)}" if self.subjects else ""),
                f"inputs: {self.inputs}",
                "state before:",
                describe(self.pre),
                "state after:",
                describe(self.post),
            ]
        )


@dataclass
class TransitionResult:
    transition: str
    shape: Shape
    status: str
    seconds: float
    goals: dict[str, str] = field(default_factory=dict)
    goal_seconds: dict[str, float] = field(default_factory=dict)
    counterexamples: list[Counterexample] = field(default_factory=list)


def _inputs_of(model: z3.ModelRef, inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: value_of(model.eval(v, model_completion=True)) if is_z3(v) else v for k, v in inputs.items()}


CASE_FACTS = {"case_request": "request", "case_victim": "victim", "slot": "request"}
"""The fact of an outcome that a pinned case key stands for."""


def prove(
    shape: Shape,
    name: str,
    timeout_s: float = 120.0,
    goals: list[str] | None = None,
    invariants: dict[str, Callable[[Any, Any], Any]] | None = None,
    apply: Callable[[State, dict[str, Any]], Outcome] | None = None,
    model_invariants: bool = False,
) -> TransitionResult:
    """Prove transition ``name`` at ``shape``: every model assertion, lemma and invariant after it.

    With ``model_invariants`` the rules of ``spec/v0/invariants.py`` (through
    ``model_view.ModelView``) are assumed before and proved after too (goals
    ``model:<name>``).

    A transition with ``split`` keys is proved case by case (each subject
    slot a Python int); the goal ``cases`` proves that the subject is a slot
    whenever the unsplit guard holds, so the cases cover the transition.
    ``invariants`` replaces the registry (tests: a deliberately false rule);
    ``apply`` replaces the transition's function (tests: a mutated transition).
    """
    t0 = time.monotonic()
    invs = invariants if invariants is not None else v0_invariants.INVARIANTS
    transition = TRANSITIONS[name]
    fn = apply or transition.apply
    result = TransitionResult(name, shape, PROVED, 0.0)

    def remaining_ms() -> int:
        return max(1, int((timeout_s - (time.monotonic() - t0)) * 1000))

    def base_solver(pre: State, out: Outcome) -> z3.Solver:
        solver = z3.Solver()
        view = StateView(pre)
        solver.add(*[_as_bool(f(view, Z3Ops())) for f in invs.values()])
        solver.add(*[_as_bool(f(pre, Z3Ops())) for f in LEMMAS.values()])
        solver.add(_as_bool(out.guard), *[_as_bool(p) for p in out.premises])
        if model_invariants:
            solver.add(*[_as_bool(f) for f in model_invariant_formulas(pre, Z3Ops()).values()])
        return solver

    cases = transition.cases(shape)
    if transition.split and goals is None:
        pre = fresh_state(shape, "pre")
        inputs = transition.inputs(shape, "in")
        out = fn(pre, inputs)
        solver = base_solver(pre, out)
        subjects = [inputs["slot"] if key == "slot" else out.facts[CASE_FACTS[key]] for key in transition.split]
        solver.add(
            z3.Not(
                z3.And(
                    *[
                        _as_bool(z3.And(0 <= x, x < shape.num_reqs))
                        if is_z3(x)
                        else z3.BoolVal(0 <= x < shape.num_reqs)
                        for x in subjects
                    ]
                )
            )
        )
        solver.set("timeout", remaining_ms())
        verdict = solver.check()
        result.goals["cases"] = PROVED if verdict == z3.unsat else FAILED if verdict == z3.sat else UNKNOWN
    vacuous = True
    for case in cases:
        pre = fresh_state(shape, "pre")
        inputs = {**transition.inputs(shape, "in"), **case}
        out = fn(pre, inputs)
        solver = base_solver(pre, out)
        solver.set("timeout", remaining_ms())
        if solver.check() == z3.unsat:
            continue
        vacuous = False
        view = StateView(out.post)
        todo: list[tuple[str, Callable[[Any], Any]]] = [(f"check:{c}", lambda o, f=f: f) for c, f in out.checks]
        todo += [(f"lemma:{n}", lambda o, f=f: f(out.post, o)) for n, f in LEMMAS.items()]
        todo += [(f"inv:{n}", lambda o, f=f: f(view, o)) for n, f in invs.items()]
        if model_invariants:
            from schedconf.spec.v0.invariants import INVARIANTS as MODEL_INVARIANTS

            todo += [(f"model:{n}", lambda o, n=n: model_invariant_formulas(out.post, o)[n]) for n in MODEL_INVARIANTS]
        if goals is not None:
            todo = [(g, f) for g, f in todo if g in goals]
        for goal_name, build in todo:
            previous = result.goals.get(goal_name, PROVED)
            if time.monotonic() - t0 >= timeout_s:
                result.goals[goal_name] = UNKNOWN if previous == PROVED else previous
                continue
            ops = Z3Ops()
            goal = _as_bool(build(ops))
            solver.push()
            solver.add(z3.Not(goal))
            solver.set("timeout", remaining_ms())
            t_goal = time.monotonic()
            verdict = solver.check()
            key = ",".join(f"{k}={v}" for k, v in case.items()) + ":" + goal_name
            result.goal_seconds[key] = time.monotonic() - t_goal
            if verdict == z3.unsat:
                status = PROVED
            elif verdict == z3.sat:
                solver.push()
                solver.add(*dense_tables(pre))
                model = solver.model() if solver.check() == z3.sat else None
                solver.pop()
                if model is None:
                    solver.check()
                    model = solver.model()
                status = FAILED
                result.counterexamples.append(
                    Counterexample(
                        goal_name,
                        evaluate(pre, model),
                        _inputs_of(model, inputs),
                        evaluate(out.post, model),
                        ops.failing_subjects(model),
                    )
                )
            else:
                status = UNKNOWN
            solver.pop()
            result.goals[goal_name] = status if previous == PROVED else previous
            if status == PROVED:
                solver.add(goal)
    statuses = set(result.goals.values())
    result.status = VACUOUS if vacuous else FAILED if FAILED in statuses else UNKNOWN if UNKNOWN in statuses else PROVED
    result.seconds = time.monotonic() - t0
    return result


def prove_isolated(
    shape: Shape, name: str, timeout_s: float = 120.0, model_invariants: bool = False
) -> TransitionResult:
    """``prove`` in a fresh process (``spawn``), so that its time does not depend on what ran before (Z3's global context)."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_prove_with, shape, name, timeout_s, model_invariants).result()


def _prove_with(shape: Shape, name: str, timeout_s: float, model_invariants: bool) -> TransitionResult:
    return prove(shape, name, timeout_s, model_invariants=model_invariants)


def prove_theorem_rank(num_blocks: int, timeout_s: float = 120.0) -> TransitionResult:
    """Prove ``state.theorem_rank`` for a deque of ``num_blocks`` blocks and every ``n`` (no premises)."""
    t0 = time.monotonic()
    ids = range(num_blocks)
    in_free = [z3.Bool(f"free[{b}]") for b in ids]
    key = [z3.Int(f"key[{b}]") for b in ids]
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    solver.add(z3.Not(_as_bool(theorem_rank(in_free, key, z3.Int("num_free"), z3.Int("n"), ids))))
    verdict = solver.check()
    status = PROVED if verdict == z3.unsat else FAILED if verdict == z3.sat else UNKNOWN
    return TransitionResult(
        "theorem_rank", Shape(1, max(1, num_blocks)), status, time.monotonic() - t0, {"theorem_rank": status}
    )


def render_table(results: list[TransitionResult]) -> str:
    lines = ["| transition | mirrors | bounds | result | time (s) |", "|---|---|---|---|---|"]
    for res in results:
        mirrors = TRANSITIONS[res.transition].mirrors if res.transition in TRANSITIONS else "(order theorem)"
        lines.append(f"| `{res.transition}` | {mirrors} | {res.shape.label()} | {res.status} | {res.seconds:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m schedconf.spec.symbolic.v0.proofs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--bounds", default="4,8", help="R,B: request slots and GPU blocks")
    parser.add_argument("--cpu-blocks", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per transition")
    parser.add_argument("--transitions", default="", help="comma-separated names (default: all)")
    parser.add_argument("--out", default="reports/symbolic-v0", help="where counterexamples are written")
    parser.add_argument(
        "--model-invariants",
        action="store_true",
        help="also assume and prove the rules of spec/v0/invariants.py (model_view.py)",
    )
    args = parser.parse_args(argv)
    num_reqs, num_blocks = (int(x) for x in args.bounds.split(","))
    shape = Shape(num_reqs, num_blocks, args.cpu_blocks, args.block_size)
    names = [n for n in args.transitions.split(",") if n] or list(TRANSITIONS)
    unknown = [n for n in names if n not in TRANSITIONS]
    if unknown:
        parser.error(f"unknown transitions {unknown}; known: {', '.join(TRANSITIONS)}")
    results = []
    exit_code = 0
    for name in names:
        res = prove_isolated(shape, name, args.timeout, args.model_invariants)
        results.append(res)
        print(f"{name:28s} {shape.label():24s} {res.status:15s} {res.seconds:6.1f}s", flush=True)
        if res.status not in (PROVED, VACUOUS):
            exit_code = 1
        for cex in res.counterexamples[:1]:
            out_dir = Path(args.out)
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / f"{name}-{cex.goal.replace(':', '-').replace(' ', '_')[:60]}.json"
            path.write_text(
                json.dumps(
                    {
                        "transition": name,
                        "goal": cex.goal,
                        "subjects": cex.subjects,
                        "inputs": cex.inputs,
                        "state_before": describe(cex.pre).splitlines(),
                        "state_after": describe(cex.post).splitlines(),
                    },
                    indent=1,
                )
            )
            print(cex.render())
            print(f"written to {path}")
    for size in sorted({num_blocks, args.cpu_blocks}):
        res = prove_theorem_rank(size, args.timeout)
        results.append(res)
        print(f"theorem_rank ({size} blocks)      {res.status:15s} {res.seconds:6.1f}s", flush=True)
        if res.status != PROVED:
            exit_code = 1
    print()
    print(render_table(results))
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
