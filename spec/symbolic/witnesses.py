"""Witnesses: Z3 finds states that reach named corner cases; each becomes a golden trace.

For each corner case a query asks Z3 for a state that satisfies every
invariant and lemma, enables a transition, and makes the transition reach the
corner (a fact of its :class:`~schedconf.spec.symbolic.transitions.Outcome`). The state
is then

1. *confirmed* on the model: injected into a concrete scheduler
   (``state.to_scheduler``), the model's own code is run from it and a
   detector, which reads only the model, must see the corner;
2. *realised* as a trace from an empty scheduler: the witness's configuration
   and requests (prompt lengths, shared blocks, keys, ``max_tokens``) seed a
   small deterministic search over workloads (arrival steps, lengths,
   ``max_tokens``), each run through ``schedconf.conformance.workloads.workload.run_workload``
   with every invariant checked, until the detector sees the corner in the
   model; the trace goes to ``conformance/traces/vectors/witnesses/<name>.jsonl``
   with a description of what it shows.

CLI: ``python -m schedconf.spec.symbolic.witnesses [--write] [--only NAME]`` prints each
witness state and the trace it found; ``--write`` writes the traces.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import z3

from schedconf.conformance.traces.trace import Trace, write_trace
from schedconf.conformance.workloads.workload import apply_trace_event
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.symbolic.proofs import premises
from schedconf.spec.symbolic.realise import search
from schedconf.spec.symbolic.state import (
    PENDING,
    Shape,
    State,
    describe,
    evaluate,
    fresh_state,
)
from schedconf.spec.symbolic.transitions import TRANSITIONS, Outcome, at
from schedconf.spec.symbolic.z3ops import count, eq, fdiv, is_z3, land, limplies, lnot, value_of
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.kv_cache import KVCacheManager, NoSpace
from schedconf.spec.v1.scheduler import Scheduler

VECTORS = Path(__file__).resolve().parents[2] / "conformance" / "traces" / "vectors" / "witnesses"
PROFILE = "vllm-0.33"


# ------------------------------------------------------------------ detectors


class RecordingKV(KVCacheManager):
    """The model's KV cache manager, recording every ``allocate_slots`` decision (read-only)."""

    def __init__(self, base: KVCacheManager) -> None:
        self.__dict__.update(base.__dict__)
        self.calls: list[dict[str, Any]] = []

    def allocate_slots(
        self,
        request,
        num_new_tokens,
        hit=None,
        num_lookahead_tokens=0,  # noqa: ANN001
        full_sequence_must_fit=False,
    ):  # noqa: ANN001
        from schedconf.spec.v1.kv_cache import NO_HIT

        hit = hit if hit is not None else NO_HIT
        num_free = self.pool.get_num_free_blocks()
        evictable = sum(1 for b in hit.blocks if b.ref_cnt == 0 and not b.is_null)
        last_cached = (
            request.num_tokens % self.block_size == 0
            and len(request.block_hashes) > 0
            and self.pool.get_cached_block(request.block_hashes[-1]) is not None
        )
        result = super().allocate_slots(request, num_new_tokens, hit, num_lookahead_tokens, full_sequence_must_fit)
        self.calls.append(
            {
                "request_id": request.request_id,
                "num_tokens": request.num_tokens,
                "num_prompt_tokens": request.num_prompt_tokens,
                "hit_tokens": hit.num_tokens,
                "evictable": evictable,
                "num_free": num_free,
                "refused": isinstance(result, NoSpace),
                "needed": result.num_blocks_needed if isinstance(result, NoSpace) else None,
                "all_blocks_cached": last_cached,
            }
        )
        return result


class RecordingScheduler(Scheduler):
    """The model, recording what the detectors need (priority victims' repair, allocation calls)."""

    def __init__(self, config: SchedulerConfig, profile: str = PROFILE) -> None:
        super().__init__(config, profile)
        self.kv_cache_manager = RecordingKV(self.kv_cache_manager)
        self.victims: list[dict[str, Any]] = []

    def _remove_priority_victim(self, st, victim, req_index):  # noqa: ANN001, ANN201
        self.victims.append(
            {
                "victim_id": victim.request_id,
                "victim_index": self.running.index(victim),
                "req_index": req_index,
                "was_scheduled": victim in st.scheduled_running_reqs,
            }
        )
        return super()._remove_priority_victim(st, victim, req_index)


Detector = Callable[[RecordingScheduler, str, Any], "str | None"]
"""``(scheduler, event, payload)`` after each schedule()/update: a description of the corner, or None."""


def detect_self_preemption(s: RecordingScheduler, event: str, payload: Any) -> str | None:
    if event == "schedule":
        for p in s.last_step.preemptions:
            if p.requester_id == p.victim_id:
                return f"step {s.current_step}: {p.victim_id} needed a block and preempted itself ({p.policy})"
    return None


def detect_budget_exact(s: RecordingScheduler, event: str, payload: Any) -> str | None:
    if event == "schedule":
        out = payload
        if (
            out.total_num_scheduled_tokens == s.config.max_num_batched_tokens
            and len(out.num_scheduled_tokens) > 1
            and all(not s.requests[r].is_prefill_chunk for r in out.num_scheduled_tokens)
        ):
            return (
                f"step {s.current_step}: {len(out.num_scheduled_tokens)} requests get all they lack, "
                f"{out.total_num_scheduled_tokens} tokens = max_num_batched_tokens"
            )
    return None


def detect_full_prompt_hit(s: RecordingScheduler, event: str, payload: Any) -> str | None:
    if event == "schedule":
        bs = s.config.block_size
        for call in s.kv_cache_manager.calls:
            n = call["num_tokens"]
            if (
                not call["refused"]
                and call["num_tokens"] == call["num_prompt_tokens"]
                and n % bs == 0
                and call["all_blocks_cached"]
                and call["hit_tokens"] == n - bs > 0
            ):
                return (
                    f"step {s.current_step}: {call['request_id']}'s whole {n}-token prompt is cached, "
                    f"the hit stops at {n - bs} tokens and its last block ({bs} tokens) is recomputed"
                )
    return None


def detect_max_model_len(s: RecordingScheduler, event: str, payload: Any) -> str | None:
    if event == "update":
        before, outputs = payload
        mml = s.config.max_model_len
        for o in outputs:
            if (
                o.finish_reason == "length"
                and before.get(o.req_id, (0, 0))[0] == mml - 1
                and before[o.req_id][1] + len(o.new_token_ids) < before[o.req_id][2]
            ):
                return (
                    f"step {s.current_step}: {o.req_id} ran at max_model_len - 1 = {mml - 1} tokens, sampled "
                    f"one more and stopped on max_model_len, below its max_tokens"
                )
    return None


def detect_priority_victim_scheduled(s: RecordingScheduler, event: str, payload: Any) -> str | None:
    if event == "schedule":
        for v in s.victims:
            if v["was_scheduled"] and v["victim_index"] < v["req_index"]:
                return (
                    f"step {s.current_step}: priority victim {v['victim_id']} had been scheduled earlier in "
                    f"the step (index {v['victim_index']} < cursor {v['req_index']}); its tokens are given back"
                )
    return None


def detect_evictable_hits(s: RecordingScheduler, event: str, payload: Any) -> str | None:
    if event == "schedule":
        for call in s.kv_cache_manager.calls:
            if (
                call["refused"]
                and call["hit_tokens"] > 0
                and call["evictable"] > 0
                and call["needed"] - call["evictable"] <= call["num_free"]
            ):
                return (
                    f"step {s.current_step}: {call['request_id']} is refused: it needs {call['needed']} blocks "
                    f"with {call['evictable']} hit block(s) still in the free queue counted, "
                    f"{call['num_free']} are free"
                )
    return None


def replay_detect(trace: Trace, detector: Detector) -> str | None:
    """Replay a trace's inputs into a recording model and return the first corner the detector sees."""
    sched = RecordingScheduler(SchedulerConfig.from_dict(trace.config), trace.profile)
    for event in trace.events:
        kind = event["kind"]
        if kind == "step":
            sched.victims.clear()
            sched.kv_cache_manager.calls.clear()
            found = detector(sched, "schedule", apply_trace_event(sched, event))
        elif kind == "model_output":
            before = {rid: (r.num_tokens, r.num_output_tokens, r.max_tokens) for rid, r in sched.requests.items()}
            found = detector(sched, "update", (before, apply_trace_event(sched, event)))
        else:
            found = None
            apply_trace_event(sched, event)
        if found:
            return found
    return None


# ------------------------------------------------------------------ queries


@dataclass(frozen=True)
class Witness:
    """A named corner case: its query, its detector, and what its trace shows."""

    name: str
    description: str
    shape: Shape
    transition: str
    fact: Callable[[State, Outcome], Any]
    detector: Detector
    extra: Callable[[State, dict[str, Any]], list[Any]] = lambda s, inp: []


def _scheduled_all_complete(s: State, out: Outcome) -> Any:
    return land(
        *(
            limplies(s.num_scheduled[r] > 0, s.num_computed_tokens[r] + s.num_scheduled[r] >= s.num_tokens[r])
            for r in s.shape.slots
        ),
        count(s.num_scheduled[r] > 0 for r in s.shape.slots) >= 2,
    )


def _whole_prompt_hit(s: State, out: Outcome) -> Any:
    f = out.facts
    q = f["request"]
    ntok = at(s.num_tokens, q)
    return land(
        f["admitted"],
        f["whole_prompt_cached"],
        eq(ntok, at(s.num_prompt_tokens, q)),
        eq(f["hit_blocks"], fdiv(ntok, s.shape.block_size) - 1),
        f["hit_blocks"] >= 1,
    )


def _evictable_refusal(s: State, out: Outcome) -> Any:
    f = out.facts
    return land(
        f["refused"],
        f["evictable"] > 0,
        f["hit_blocks"] > 0,
        f["slot_needed"] - f["evictable"] <= f["num_free_blocks"],
        lnot(s.reserve_full_sequence),
    )


def _max_model_len_cap(s: State, out: Outcome) -> Any:
    return land(out.facts["length_capped_at_max_model_len"], eq(out.facts["num_tokens_before"], s.max_model_len - 1))


WITNESSES: dict[str, Witness] = {
    w.name: w
    for w in (
        Witness(
            "self_preemption",
            "A running request needs a block, none is free, and the FCFS victim (the tail of running) is the "
            "request itself: it preempts itself and the running loop ends.",
            Shape(3, 4, 2, "fcfs"),
            "running_preempt",
            lambda s, out: out.facts["self_preempted"],
            detect_self_preemption,
        ),
        Witness(
            "budget_exhausted_exactly",
            "A step whose scheduled tokens add up to exactly max_num_batched_tokens while every scheduled "
            "request gets all the tokens it lacks (nobody is cut short by the budget).",
            Shape(3, 4, 2, "fcfs"),
            "end_schedule",
            lambda s, out: land(out.facts["budget_exhausted"], _scheduled_all_complete(s, out)),
            detect_budget_exact,
        ),
        Witness(
            "full_prompt_prefix_hit",
            "A new request whose whole prompt (a multiple of block_size) is in the prefix cache: the hit is capped "
            "below num_tokens, so it stops one block short and that whole block is recomputed.",
            Shape(3, 4, 2, "fcfs"),
            "waiting_admit",
            _whole_prompt_hit,
            detect_full_prompt_hit,
        ),
        Witness(
            "max_model_len_minus_one",
            "A request runs at num_tokens = max_model_len - 1 (the longest a live request can be), samples one "
            "more token and is length-capped by max_model_len although max_tokens is not reached.",
            Shape(3, 4, 2, "fcfs"),
            "append_token",
            _max_model_len_cap,
            detect_max_model_len,
            extra=lambda s, inp: [lnot(inp["stop_token"])],
        ),
        Witness(
            "priority_victim_scheduled_earlier",
            "Under the priority policy a request needs a block and the victim (maximal (priority, arrival)) "
            "stands before it in running and was already scheduled in this step: it is preempted, its tokens "
            "go back to the budget and the cursor moves back.",
            Shape(3, 4, 2, "priority"),
            "running_preempt",
            lambda s, out: land(
                out.facts["victim_was_scheduled"], out.facts["victim_before_cursor"], lnot(out.facts["self_preempted"])
            ),
            detect_priority_victim_scheduled,
        ),
        Witness(
            "evictable_hit_blocks_counted",
            "A waiting request's prefix hit lies in blocks that are still in the free queue; allocate_slots counts "
            "them against the free blocks (touching them takes them out of it), so the request is refused although "
            "the blocks it needs beyond its hit are free.",
            Shape(3, 4, 2, "fcfs"),
            "waiting_stop",
            _evictable_refusal,
            detect_evictable_hits,
        ),
    )
}


def _realistic(s: State) -> list[Any]:
    """Small numbers and dense tables, so the witness reads well and seeds small workloads."""
    sh = s.shape
    pins = [
        s.step < 20,
        s.max_num_batched_tokens <= 8,
        s.long_prefill_token_threshold == 0,
        s.num_lookahead_tokens == 0,
        s.free_lo > -50,
        s.free_hi < 50,
        s.next_insert < 50,
    ]
    for r in sh.slots:
        pins += [
            count(s.held[r][b] for b in sh.blocks) == s.num_blocks[r],
            s.max_tokens[r] <= 20,
            s.priority[r] >= 0,
            s.priority[r] <= 3,
            s.arrival_time[r] >= 0,
            s.arrival_time[r] <= 5,
        ]
    return pins


def find_witness(w: Witness, timeout_s: float = 60.0) -> tuple[State, dict[str, Any], dict[str, Any]] | None:
    """Ask Z3 for a state and inputs that reach the corner; None if unsatisfiable or unknown."""
    pre = fresh_state(w.shape, f"w.{w.name}")
    transition = TRANSITIONS[w.transition]
    inputs = transition.inputs(w.shape, "w.in")
    out = transition.apply(pre, inputs)
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    solver.add(
        *premises(pre),
        out.guard,
        *[p for p in out.premises if is_z3(p)],
        w.fact(pre, out),
        *w.extra(pre, inputs),
        *_realistic(pre),
    )
    if solver.check() != z3.sat:
        return None
    model = solver.model()
    state = evaluate(pre, model)
    values = {
        k: (
            [value_of(model.eval(x, model_completion=True)) for x in v]
            if isinstance(v, list)
            else value_of(model.eval(v, model_completion=True))
        )
        for k, v in inputs.items()
    }
    facts = {k: value_of(model.eval(v, model_completion=True)) if is_z3(v) else v for k, v in out.facts.items()}
    return state, values, facts


# ------------------------------------------------------------------ realisation


def realise(w: Witness, state: State, tries: int = 400) -> tuple[Trace, str] | None:
    """The first workload seeded by the witness state whose trace makes the model reach the corner."""
    found = search(state, w.name, w.description, lambda trace: replay_detect(trace, w.detector), tries=tries)
    if found is None:
        return None
    trace, note = found
    trace.header["origin"] = "symbolic-witness"
    trace.header["description"] = f"{w.description} Reached at {note}."
    return trace, note


def confirm_on_model(w: Witness, state: State, inputs: dict[str, Any]) -> str | None:
    """Inject the witness state into the model, run the model's event from it, return what the detector saw.

    Only witnesses whose transition starts a model event from an injectable
    state (an IDLE state for ``schedule()``, a PENDING one for the update)
    can be confirmed this way; the others return None.
    """
    from schedconf.spec.symbolic.state import IDLE, to_scheduler

    if state.phase not in (IDLE, PENDING):
        return None
    sched, _ = to_scheduler(state)
    rec = RecordingScheduler(sched.config, PROFILE)
    rec.__dict__.update({k: v for k, v in sched.__dict__.items() if k not in ("kv_cache_manager",)})
    rec.kv_cache_manager = RecordingKV(sched.kv_cache_manager)
    rec.victims = []
    if state.phase == IDLE:
        out = rec.schedule()
        return w.detector(rec, "schedule", out)
    before = {rid: (r.num_tokens, r.num_output_tokens, r.max_tokens) for rid, r in rec.requests.items()}
    tokens = {rid: (7,) for rid, samples in rec.last_step.samples.items() if samples}
    outputs = rec.update_from_output(rec.pending_output, ModelRunnerOutput(tokens))
    return w.detector(rec, "update", (before, outputs))


def main(argv: list[str] | None = None) -> int:
    """CLI: find, print, confirm and realise each witness; ``--write`` writes the traces."""
    parser = argparse.ArgumentParser(
        prog="python -m schedconf.spec.symbolic.witnesses", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--write", action="store_true", help=f"write the traces under {VECTORS}")
    parser.add_argument("--out", default=str(VECTORS), help="where --write puts them")
    parser.add_argument("--only", default="", help="comma-separated witness names")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(WITNESSES)
    status = 0
    for name in names:
        w = WITNESSES[name]
        print(f"== {name}: {w.description}")
        found = find_witness(w)
        if found is None:
            print("   Z3 found no state (unsat or timeout)")
            status = 1
            continue
        state, inputs, facts = found
        print("   witness state (Z3):")
        print("\n".join("     " + line for line in describe(state).splitlines()))
        print(f"   inputs {inputs}")
        realised = realise(w, state)
        if realised is None:
            print("   no workload reaching it was found")
            status = 1
            continue
        trace, note = realised
        print(f"   trace: {len(trace.events)} events; {note}")
        if args.write:
            path = Path(args.out) / f"{name}.jsonl"
            write_trace(path, trace)
            print(f"   written to {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
