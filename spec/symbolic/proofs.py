"""Prove that every transition preserves every invariant, for all states of a shape.

For a transition ``T`` and a shape (``R`` request slots, ``B`` blocks, block
size, policy) the obligation is, over fresh symbolic states and inputs::

    Inv(s) and Lemmas(s) and guard_T(s, x)  =>  Inv(T(s, x)) and Lemmas(T(s, x)) and checks_T(s, x)

where ``Inv`` are the invariants of ``spec/invariants.py`` evaluated through
:class:`~spec.symbolic.state.SymbolicView` and :class:`~spec.symbolic.z3ops.Z3Ops`,
``Lemmas`` the encoding's well-formedness and strengthening lemmas
(``state.LEMMAS``), and ``checks_T`` the model's own assertions on the way.
Each conjunct of the conclusion is one Z3 query (its negation must be
unsatisfiable). A proof is also checked for vacuity: the premises must be
satisfiable.

A failed goal yields a counterexample: the pre-state and inputs from the Z3
model, printed, injected into a concrete scheduler (``state.to_scheduler``),
and the model's own transition replayed on it to confirm the violation
concretely; it is written as a JSON file, and for the event transitions
(``abort``, ``add_request``, ``schedule``, ``update``) as a trace when a short
workload reaching an equivalent violation is found.

CLI::

    python -m spec.symbolic.proofs --bounds 4,8 --timeout 60 [--block-size 2] [--policy fcfs,priority]
        [--transitions a,b] [--largest] [--out DIR]

prints the table (transition, bounds, result, time); ``--largest`` grows the
bounds per transition while a proof fits the timeout and reports the largest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import z3

from spec.invariants import INVARIANTS
from spec.symbolic.state import (
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
from spec.symbolic.transitions import TRANSITIONS, Outcome
from spec.symbolic.z3ops import Z3Ops, is_z3, value_of

PROVED, FAILED, UNKNOWN, VACUOUS = "proved", "counterexample", "unknown", "vacuous"


def invariant_formulas(s: State) -> list[tuple[str, Any]]:
    """``(name, formula)`` for every invariant of spec/invariants.py on ``s``."""
    view = SymbolicView(s)
    return [(f"inv:{name}", fn(view, Z3Ops())) for name, fn in INVARIANTS.items()]


def lemma_formulas(s: State) -> list[tuple[str, Any]]:
    """``(name, formula)`` for every lemma of the encoding on ``s``."""
    return [(f"lemma:{name}", fn(s, Z3Ops())) for name, fn in LEMMAS.items()]


def premises(s: State) -> list[Any]:
    """Invariants and lemmas of ``s`` as Z3 Booleans."""
    return [_as_bool(f) for _, f in invariant_formulas(s) + lemma_formulas(s)]


def _as_bool(f: Any) -> z3.BoolRef:
    return f if is_z3(f) else z3.BoolVal(bool(f))


@dataclass
class Counterexample:
    """A pre-state and inputs under which a goal fails."""

    goal: str
    pre: State
    inputs: dict[str, Any]
    post: State
    subjects: list[str]

    def render(self) -> str:
        lines = [f"goal {self.goal} fails" + (f" for {', '.join(self.subjects)}" if self.subjects else ""),
                 f"inputs: {self.inputs}", "state before:", describe(self.pre), "state after:", describe(self.post)]
        return "\n".join(lines)


@dataclass
class TransitionResult:
    """The outcome of proving one transition at one shape."""

    transition: str
    shape: Shape
    status: str
    seconds: float
    goals: dict[str, str] = field(default_factory=dict)
    counterexamples: list[Counterexample] = field(default_factory=list)

    @property
    def bounds(self) -> str:
        return f"R={self.shape.num_reqs}, B={self.shape.num_blocks}"


def _inputs_of(model: z3.ModelRef, inputs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, sym in inputs.items():
        if isinstance(sym, list):
            out[key] = [value_of(model.eval(x, model_completion=True)) for x in sym]
        else:
            out[key] = value_of(model.eval(sym, model_completion=True))
    return out


def prove(shape: Shape, name: str, timeout_s: float = 60.0, goals: list[str] | None = None,
          stop_at_first_failure: bool = False) -> TransitionResult:
    """Prove transition ``name`` at ``shape``: every invariant, lemma and model assertion.

    The time limit covers the whole transition; goals not reached in time
    are ``unknown``.
    """
    t0 = time.monotonic()
    transition = TRANSITIONS[name]
    pre = fresh_state(shape, "pre")
    inputs = transition.inputs(shape, "in")
    out: Outcome = transition.apply(pre, inputs)
    solver = z3.Solver()
    solver.add(*premises(pre))
    solver.add(_as_bool(out.guard))
    # Instances of theorem_rank (proved for the shape by prove_theorem_rank).
    solver.add(*[_as_bool(p) for p in out.premises])
    result = TransitionResult(name, shape, PROVED, 0.0)

    def remaining_ms() -> int:
        return max(1, int((timeout_s - (time.monotonic() - t0)) * 1000))

    solver.set("timeout", remaining_ms())
    base = solver.check()
    if base == z3.unsat:
        result.status = VACUOUS
        result.seconds = time.monotonic() - t0
        return result
    view = SymbolicView(out.post)
    # Checks first, then lemmas, then invariants; each goal proved is assumed
    # for the next ones (sound: it follows from the premises).
    post_goals: list[tuple[str, Any]] = [(f"check:{c}", lambda ops, f=f: f) for c, f in out.checks]
    for lemma_name, fn in LEMMAS.items():
        post_goals.append((f"lemma:{lemma_name}", lambda ops, fn=fn: fn(out.post, ops)))
    for inv_name, fn in INVARIANTS.items():
        post_goals.append((f"inv:{inv_name}", lambda ops, fn=fn: fn(view, ops)))
    if goals is not None:
        post_goals = [(g, f) for g, f in post_goals if g in goals]
    for goal_name, build in post_goals:
        if time.monotonic() - t0 >= timeout_s:
            result.goals[goal_name] = UNKNOWN
            continue
        solver.push()
        ops = Z3Ops()
        goal = _as_bool(build(ops))
        solver.add(z3.Not(goal))
        solver.set("timeout", remaining_ms())
        verdict = solver.check()
        if verdict == z3.unsat:
            result.goals[goal_name] = PROVED
        elif verdict == z3.sat:
            model = solver.model()
            result.goals[goal_name] = FAILED
            result.counterexamples.append(Counterexample(
                goal=goal_name, pre=evaluate(pre, model), inputs=_inputs_of(model, inputs),
                post=evaluate(out.post, model), subjects=ops.failing_subjects(model)))
        else:
            result.goals[goal_name] = UNKNOWN
        solver.pop()
        if result.goals[goal_name] == PROVED:
            solver.add(goal)
        if stop_at_first_failure and result.goals[goal_name] == FAILED:
            break
    statuses = set(result.goals.values())
    result.status = FAILED if FAILED in statuses else UNKNOWN if UNKNOWN in statuses else PROVED
    result.seconds = time.monotonic() - t0
    return result


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
    return TransitionResult("theorem_order", Shape(1, num_items), status, time.monotonic() - t0, {"theorem_order": status})


# ------------------------------------------------------------------ counterexamples

def confirm_counterexample(cex: Counterexample, transition: str) -> str | None:
    """Replay the model's own transition on the injected pre-state; return the violation it reports.

    Only event-level transitions have a model entry point from an IDLE or
    PENDING state (``abort``, ``abort_pending``, ``add_request``,
    ``begin_step`` + loops as ``schedule()``); for the others None.
    """
    from spec.errors import InvariantViolation, SpecError
    from spec.invariants import check_invariants
    from spec.symbolic.state import slot_id, to_scheduler

    if transition not in ("abort", "abort_pending", "add_request"):
        return None
    sched, _ = to_scheduler(cex.pre)
    try:
        if transition in ("abort", "abort_pending"):
            sched.abort(slot_id(cex.inputs["slot"]))
        else:
            q = cex.inputs["slot"]
            sched.add_request(slot_id(q), [100 + i for i in range(cex.inputs["num_prompt_tokens"])],
                              cex.inputs["max_tokens"], priority=cex.inputs["priority"],
                              arrival_time=cex.inputs["arrival_time"])
        check_invariants(sched)
    except InvariantViolation as exc:
        return f"{exc.invariant}: {exc.message}"
    except SpecError as exc:
        return f"model error {exc.code}: {exc}"
    return None


def counterexample_trace(cex: Counterexample, transition: str) -> Any:
    """A short trace (format v1) that reaches a violation of the same invariant by the same event, or None.

    For ``abort_pending`` the workload is the counterexample's live requests
    (their prompt lengths, keys and max_tokens) added at step 0, one step, and
    the abort of the counterexample's request while the output is pending.
    """
    if transition != "abort_pending":
        return None
    from conformance.trace import Trace, make_header
    from conformance.workload import HashOracle, RequestSpec, respond
    from spec.errors import InvariantViolation
    from spec.invariants import check_invariants
    from spec.output import ModelRunnerOutput
    from spec.scheduler import Scheduler
    from spec.symbolic.state import RUNNING, config_of, slot_id

    pre = cex.pre
    cfg = config_of(pre)
    specs = [RequestSpec(slot_id(r), tuple(100 + r * 1000 + i for i in range(pre.num_prompt_tokens[r])),
                         max_tokens=pre.max_tokens[r], priority=pre.priority[r], arrival_time=pre.arrival_time[r])
             for r in pre.shape.slots if pre.live(r)]
    oracle = HashOracle(seed=0, eos_per_mille=0)
    for steps_before in range(0, 6):
        sched = Scheduler(cfg, "vllm-0.33")
        events: list[dict[str, Any]] = []
        for spec in specs:
            sched.add_request(spec.request_id, spec.prompt_token_ids, spec.max_tokens,
                              priority=spec.priority, arrival_time=spec.arrival_time)
            events.append(spec.to_event())
        ok = True
        for _ in range(steps_before):
            if not sched.has_requests():
                ok = False
                break
            out = sched.schedule()
            events.append({"kind": "step", "step": out.step, "expect": out.to_canonical()})
            sampled, drafts = respond(oracle, out, sched.last_step.samples, 0)
            outs = sched.update_from_output(out, ModelRunnerOutput(sampled, drafts))
            events.append({"kind": "model_output", "step": out.step,
                           "sampled_token_ids": {k: list(v) for k, v in sorted(sampled.items())},
                           "draft_token_ids": {}, "expect": {"outputs": [o.to_canonical() for o in outs]}})
        if not ok or not sched.has_requests():
            continue
        out = sched.schedule()
        events.append({"kind": "step", "step": out.step, "expect": out.to_canonical()})
        target = slot_id(cex.inputs["slot"])
        victims = [target] if target in out.num_scheduled_tokens else list(out.num_scheduled_tokens)
        if not victims:
            continue
        sched.abort(victims[0])
        events.append({"kind": "abort", "request_id": victims[0]})
        try:
            check_invariants(sched)
        except InvariantViolation as exc:
            if f"inv:{exc.invariant}" == cex.goal:
                header = make_header(cfg.to_dict(), "vllm-0.33", 0, "symbolic-counterexample",
                                     description=f"Counterexample to {cex.goal} after {transition}: "
                                                 f"abort of a request scheduled in the pending step. {exc.message}")
                return Trace(header=header, events=events)
    return None


# ------------------------------------------------------------------ tables and CLI

def prove_all(shapes: list[Shape], names: list[str], timeout_s: float) -> list[TransitionResult]:
    """Prove every transition at every shape."""
    return [prove(shape, name, timeout_s) for shape in shapes for name in names]


def largest_bounds(name: str, block_size: int, policy: str, timeout_s: float, start: tuple[int, int] = (1, 1),
                   limit: tuple[int, int] = (8, 16)) -> tuple[tuple[int, int], float]:
    """Grow (R, B) alternately from ``start`` while the proof fits ``timeout_s``; the largest proved and its time."""
    best: tuple[tuple[int, int], float] = ((0, 0), 0.0)
    r, b = start
    grow_r = False
    while r <= limit[0] and b <= limit[1]:
        res = prove(Shape(r, b, block_size, policy), name, timeout_s)
        if res.status not in (PROVED,):
            if grow_r or r >= limit[0]:
                break
            grow_r = True
            continue
        best = ((r, b), res.seconds)
        if grow_r and r < limit[0]:
            r += 1
        else:
            b += 1
        grow_r = not grow_r
    return best


def render_table(results: list[TransitionResult]) -> str:
    """A markdown table: transition, shape, result, time."""
    lines = ["| transition | bounds | block size | policy | result | time (s) |", "|---|---|---|---|---|---|"]
    for res in results:
        lines.append(f"| {res.transition} | {res.bounds} | {res.shape.block_size} | {res.shape.policy} | "
                     f"{res.status} | {res.seconds:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: prove and print the table; write counterexamples under ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m spec.symbolic.proofs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bounds", default="4,8", help="R,B: request slots and usable blocks")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per transition")
    parser.add_argument("--block-size", default="2", help="comma-separated block sizes")
    parser.add_argument("--policy", default="fcfs,priority", help="comma-separated policies")
    parser.add_argument("--transitions", default="", help="comma-separated names (default: all)")
    parser.add_argument("--largest", action="store_true", help="also report the largest bounds within the timeout")
    parser.add_argument("--out", default="reports/symbolic", help="where counterexamples are written")
    args = parser.parse_args(argv)
    num_reqs, num_blocks = (int(x) for x in args.bounds.split(","))
    names = [n for n in args.transitions.split(",") if n] or list(TRANSITIONS)
    unknown = [n for n in names if n not in TRANSITIONS]
    if unknown:
        parser.error(f"unknown transitions {unknown}; known: {', '.join(TRANSITIONS)}")
    results = []
    exit_code = 0
    for bs in (int(x) for x in args.block_size.split(",")):
        for policy in args.policy.split(","):
            for name in names:
                res = prove(Shape(num_reqs, num_blocks, bs, policy), name, args.timeout)
                results.append(res)
                print(f"{name:20s} {res.bounds:10s} bs={bs} {policy:8s} {res.status:15s} {res.seconds:6.1f}s",
                      flush=True)
                expected = TRANSITIONS[name].expected_to_hold
                if res.status != PROVED and expected:
                    exit_code = 1
                for cex in res.counterexamples[:1]:
                    print(_report_counterexample(cex, name, Path(args.out)))
    print()
    print(render_table(results))
    if args.largest:
        print()
        print("| transition | largest bounds within the timeout | time (s) |")
        print("|---|---|---|")
        for name in names:
            (r, b), secs = largest_bounds(name, int(args.block_size.split(",")[0]), args.policy.split(",")[0],
                                          args.timeout)
            print(f"| {name} | R={r}, B={b} | {secs:.1f} |", flush=True)
    return exit_code


def _report_counterexample(cex: Counterexample, transition: str, out_dir: Path) -> str:
    """Print, confirm and write one counterexample; return the report text."""
    from conformance.trace import write_trace

    lines = ["", cex.render()]
    confirmed = confirm_counterexample(cex, transition)
    if confirmed:
        lines.append(f"the model confirms on the injected state: {confirmed}")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{transition}-{cex.goal.replace(':', '-')}"
    state_file = out_dir / f"{stem}.json"
    state_file.write_text(json.dumps({
        "transition": transition, "goal": cex.goal, "subjects": cex.subjects, "inputs": cex.inputs,
        "state_before": describe(cex.pre).splitlines(), "state_after": describe(cex.post).splitlines(),
        "confirmed_by_model": confirmed,
    }, indent=1))
    lines.append(f"state written to {state_file}")
    trace = counterexample_trace(cex, transition)
    if trace is not None:
        trace_file = out_dir / f"{stem}.jsonl"
        write_trace(trace_file, trace)
        lines.append(f"trace written to {trace_file} (replay: schedconf replay {trace_file})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
