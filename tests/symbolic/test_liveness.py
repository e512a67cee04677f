"""Liveness (spec/symbolic/LIVENESS.md): the bound's arithmetic, the Z3 progress lemmas, the lasso witnesses.

The lemmas run at small shapes in CI (``symbolic``; 20-40 s on 2 cores) and at the
target shapes under ``deep``. The witness traces are replayed on the
reference and re-driven into a plain scheduler, whose state must come back
at the steps their headers name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import PASS, replay
from schedconf.conformance.traces.trace import read_trace, render_trace
from schedconf.conformance.workloads.workload import apply_trace_event, run_workload
from schedconf.spec.symbolic.lasso import get_fingerprint
from schedconf.spec.symbolic.liveness_bound import (
    RequestWork,
    compute_any_order_bound,
    compute_chunk,
    compute_fcfs_bound,
    compute_fcfs_steps,
    compute_ordered_bound,
    compute_priority_bound,
    compute_work,
    get_trace_tail,
)
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.scheduler import Scheduler

WITNESS_DIR = Path(__file__).resolve().parents[2] / "conformance" / "traces" / "vectors" / "witnesses"


# ------------------------------------------------------------------ the bound


def test_work_chunk_and_fcfs_steps_by_hand() -> None:
    # W = min(P + M, max_model_len) - 1
    assert compute_work(5, 3, 100) == 7
    assert compute_work(5, 30, 16) == 15
    # c: the threshold when set (capped by the budget), else the budget
    assert compute_chunk(8, 0) == 8 and compute_chunk(8, 3) == 3 and compute_chunk(2, 3) == 2
    # P = 7, M = 4, c = 3: ceil(7/3) = 3 prefill steps (the third samples token 1), then 3 decode steps
    assert compute_fcfs_steps(7, 4, 100, 3) == 3 + (10 - 7)
    cfg = {"max_num_batched_tokens": 4, "long_prefill_token_threshold": 0, "max_model_len": 12, "policy": "fcfs"}
    reqs = [RequestWork("a", 7, 4), RequestWork("b", 3, 20)]
    # a: ceil(7/4) + (10 - 7) = 5; b: W = min(23, 12) - 1 = 11, ceil(3/4) + (11 - 3) = 9
    assert compute_fcfs_bound(reqs, cfg) == 5 + 9


def test_ordered_and_any_order_bounds_by_hand() -> None:
    # works leader first: (W1 + (W2 + 1) + (W3 + 1)) + (W2 + (W3 + 1)) + W3
    assert compute_ordered_bound([2, 5, 1]) == (2 + 6 + 2) + (5 + 2) + 1
    # the worst order puts the largest work last: [1, 2, 5] -> (1 + 3 + 6) + (2 + 6) + 5
    assert compute_any_order_bound([2, 5, 1]) == 23
    assert max(compute_ordered_bound(list(p)) for p in ([2, 5, 1], [1, 2, 5], [5, 2, 1], [2, 1, 5])) == 23
    cfg = {"max_model_len": 100}
    reqs = [RequestWork("x", 3, 3, priority=1, arrival_time=0), RequestWork("y", 2, 2, priority=0, arrival_time=5)]
    # key order y (W = 3), x (W = 5): (3 + 6) + 5
    assert compute_priority_bound(reqs, cfg) == 14


def test_trace_tail_reads_the_last_input_and_the_ends() -> None:
    config = SchedulerConfig(block_size=2, num_gpu_blocks=9, max_num_batched_tokens=4, max_num_seqs=2, max_model_len=12)
    from schedconf.conformance.workloads.workload import HashOracle, RequestSpec, Workload

    workload = Workload(
        config=config,
        profile="vllm-0.33",
        oracle=HashOracle(seed=3, eos_per_mille=0),
        requests=(
            RequestSpec("a", (10, 11, 12), max_tokens=2),
            RequestSpec("b", (20, 21, 22, 23, 24), max_tokens=3, at_step=1),
        ),
    )
    tail = get_trace_tail(run_workload(workload).events)
    # b arrives after step 1; a (3 + 2 tokens) ends in step 2 and b (5 + 3) in step 5, budget 4:
    # step 1 a:3; step 2 a:1 (ends) b:3; step 3 b:2 (samples); step 4 b:1; step 5 b:1 (ends)
    assert tail.last_input_step == 1
    assert {r.request_id for r in tail.live} == {"a", "b"}
    assert tail.ended_at == {"a": 2, "b": 5} and tail.steps_to_finish == 4


# ------------------------------------------------------------------ Z3 lemmas


def _prove_all(bounds: tuple[int, int], composed: tuple[int, int]) -> dict[tuple[str, str], str]:
    from schedconf.spec.symbolic.liveness import COMPOSED_LEMMAS, INDUCTION, LEMMAS, prove_lemma
    from schedconf.spec.symbolic.state import Shape

    out = {}
    for name, lemma in {**INDUCTION, **LEMMAS}.items():
        for policy in lemma.policies:
            r, b = composed if name in COMPOSED_LEMMAS else bounds
            out[(name, policy)] = prove_lemma(name, Shape(r, b, 2, policy), timeout_s=300).status
    return out


@pytest.mark.symbolic
def test_progress_lemmas_small() -> None:
    results = _prove_all((3, 4), (2, 3))
    assert results and set(results.values()) == {"proved"}, {k: v for k, v in results.items() if v != "proved"}


@pytest.mark.deep
def test_progress_lemmas_target() -> None:
    results = _prove_all((4, 8), (3, 4))
    assert set(results.values()) == {"proved"}, {k: v for k, v in results.items() if v != "proved"}


@pytest.mark.symbolic
def test_lemmas_fail_for_the_wrong_leader() -> None:
    """Mutations: FCFS running[1] and priority's *largest* key can be the victim (Z3 finds a counterexample)."""
    from schedconf.spec.symbolic import liveness as L
    from schedconf.spec.symbolic.state import Shape
    from schedconf.spec.symbolic.transitions import running_at
    from schedconf.spec.symbolic.z3ops import eq, land, limplies, lnot

    def second_never_victim(pre, inp, out):
        return [], lnot(eq(out.facts["victim"], running_at(pre, 1)))

    def largest_never_victim(pre, inp, out):
        sh = pre.shape
        largest = [
            land(pre.in_running[r], *(limplies(pre.in_running[c], L.key_lt(pre, c, r)) for c in sh.slots if c != r))
            for r in sh.slots
        ]
        return [], land(*(limplies(eq(out.facts["victim"], r), lnot(largest[r])) for r in sh.slots))

    mutants = {
        "m_fcfs": L.Lemma("m_fcfs", "running_preempt", ("fcfs",), second_never_victim, "wrong"),
        "m_prio": L.Lemma("m_prio", "running_preempt", ("priority",), largest_never_victim, "wrong"),
    }
    L.LEMMAS.update(mutants)
    try:
        assert L.prove_lemma("m_fcfs", Shape(3, 4, 2, "fcfs")).status == L.FAILED
        assert L.prove_lemma("m_prio", Shape(3, 4, 2, "priority")).status == L.FAILED
    finally:
        for name in mutants:
            del L.LEMMAS[name]


# ------------------------------------------------------------------ witnesses

WITNESSES = ("liveness_thrash_0_11", "liveness_tie_livelock_0_33")


def _repeat_steps(description: str) -> tuple[int, int]:
    """The two step numbers whose starting states the header says are equal."""
    m = re.search(r"start of step (\d+) comes back at the start of step (\d+)", description)
    assert m, description
    return int(m.group(1)), int(m.group(2))


@pytest.mark.parametrize("name", WITNESSES)
def test_witness_replays_and_its_state_comes_back(name: str) -> None:
    trace = read_trace(WITNESS_DIR / f"{name}.jsonl")
    assert trace.header["origin"] == "symbolic-witness"
    assert replay(trace, ReferenceSut()).verdict == PASS
    first, again = _repeat_steps(trace.header["description"])
    sched = Scheduler(SchedulerConfig.from_dict(trace.config), trace.profile)
    seen: dict[int, tuple] = {}
    for event in trace.events:
        if event["kind"] == "step":
            # the state at the start of this step (after the previous update)
            seen[event["step"]] = (get_fingerprint(sched), sched.observe())
        apply_trace_event(sched, event)
    assert first in seen and again in seen
    assert seen[first][0] == seen[again][0], "the full state at the two steps differs"
    assert seen[first][1] == seen[again][1]
    live = seen[again][1]["requests"]
    assert live and all(r["status"] in ("WAITING", "RUNNING", "PREEMPTED") for r in live.values())
    assert not get_trace_tail(trace.events).ended_at, "a request of the loop ended"


def test_thrash_0_11_workload_finishes_under_0_32_and_0_33() -> None:
    from schedconf.spec.symbolic.liveness_witnesses import WITNESSES as W

    workload = W["liveness_thrash_0_11"].workload()
    works = [
        compute_work(len(r.prompt_token_ids), r.max_tokens, workload.config.max_model_len) for r in workload.requests
    ]
    for profile in ("vllm-0.33", "vllm-0.32"):
        tail = get_trace_tail(run_workload(workload.replace(profile=profile), max_steps=100).events)
        assert tail.steps_to_finish is not None and tail.steps_to_finish <= compute_any_order_bound(works)


@pytest.mark.parametrize("name", WITNESSES)
def test_witness_trace_is_what_the_generator_writes(name: str) -> None:
    """Drift guard: ``python -m schedconf.spec.symbolic.liveness_witnesses --write`` reproduces the committed file."""
    from schedconf.spec.symbolic.liveness_witnesses import WITNESSES as W
    from schedconf.spec.symbolic.liveness_witnesses import realise

    trace, _ = realise(W[name])
    assert render_trace(trace) == (WITNESS_DIR / f"{name}.jsonl").read_text()
