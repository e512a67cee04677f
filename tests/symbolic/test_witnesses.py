"""The witness traces: each replays against the reference and really reaches its corner case.

``conformance/traces/vectors/witnesses/<name>.jsonl`` were produced by
``python -m schedconf.spec.symbolic.witnesses --write`` from Z3 witness states. Here
each is (1) replayed against the reference adapter, which must pass, and (2)
re-driven into a plain model scheduler while a detector written in this file
(reading only the model's state and outputs, not ``spec/symbolic``) looks for
the corner case the trace claims. A marked test also asks Z3 again for every
witness state, so the queries keep being satisfiable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import PASS, replay
from schedconf.conformance.traces.trace import Trace, read_trace
from schedconf.conformance.workloads.workload import apply_trace_event
from schedconf.spec.output import SchedulerOutput
from schedconf.spec.v1.config import SchedulerConfig, cdiv
from schedconf.spec.v1.scheduler import Scheduler

WITNESS_DIR = Path(__file__).resolve().parents[2] / "conformance" / "traces" / "vectors" / "witnesses"
NAMES = (
    "self_preemption",
    "budget_exhausted_exactly",
    "full_prompt_prefix_hit",
    "max_model_len_minus_one",
    "priority_victim_scheduled_earlier",
    "evictable_hit_blocks_counted",
)


def check_step(name: str, s: Scheduler, out: SchedulerOutput) -> bool:
    """Does this ``schedule()`` show corner case ``name``?"""
    cfg = s.config
    record = s.last_step
    if name == "self_preemption":
        return any(p.requester_id == p.victim_id for p in record.preemptions)
    if name == "budget_exhausted_exactly":
        return (
            out.total_num_scheduled_tokens == cfg.max_num_batched_tokens
            and len(out.num_scheduled_tokens) >= 2
            and all(s.requests[r].num_computed_tokens == s.requests[r].num_tokens for r in out.num_scheduled_tokens)
        )
    if name == "full_prompt_prefix_hit":
        # The hit stops one block short of a block-aligned prompt, and that last
        # block is recomputed into a second copy of content already cached
        # (before the step, or earlier in it: blocks are cached when scheduled).
        for n in out.scheduled_new_reqs:
            length = len(n.prompt_token_ids)
            if (
                length % cfg.block_size == 0
                and n.num_computed_tokens == length - cfg.block_size > 0
                and out.num_scheduled_tokens[n.req_id] == cfg.block_size
            ):
                req = s.requests[n.req_id]
                own_last = s.kv_cache_manager.get_blocks(n.req_id)[length // cfg.block_size - 1]
                first = s.block_pool.get_cached_block(req.block_hashes[-1])
                if first is not None and first is not own_last:
                    return True
        return False
    if name == "priority_victim_scheduled_earlier":
        for p in record.preemptions:
            ids = [c[0] for c in p.candidates]
            if (
                p.policy == "priority"
                and p.victim_id != p.requester_id
                and ids.index(p.victim_id) < ids.index(p.requester_id)
                and p.victim_id not in out.num_scheduled_tokens
            ):
                return True
        return False
    if name == "evictable_hit_blocks_counted":
        if record.preemptions or not s.waiting or len(s.running) >= cfg.max_num_seqs:
            return False
        head = s.waiting.peek_request()
        kv = s.kv_cache_manager
        hit = kv.get_computed_blocks(head)
        evictable = sum(1 for b in hit.blocks if b.ref_cnt == 0)
        budget = cfg.max_num_batched_tokens - out.total_num_scheduled_tokens
        if head.request_id in out.num_scheduled_tokens or not hit.blocks or evictable == 0 or budget <= 0:
            return False
        num_new = head.num_tokens - hit.num_tokens
        threshold = cfg.long_prefill_token_threshold
        if 0 < threshold < num_new:
            num_new = threshold
        if not cfg.enable_chunked_prefill and num_new > budget:
            return False
        num_new = min(num_new, budget)
        slots = min(hit.num_tokens + num_new + cfg.num_lookahead_tokens, cfg.max_model_len)
        needed = kv.get_num_blocks_to_allocate(head.request_id, slots, hit.blocks)
        free = s.block_pool.get_num_free_blocks()
        without_hits_in_queue = max(cdiv(slots, cfg.block_size) - len(hit.blocks), 0)
        return needed > free >= without_hits_in_queue
    return False


def check_update(name: str, s: Scheduler, outputs: list[Any], before: dict[str, tuple[int, int, int]]) -> bool:
    """Does this ``update_from_output()`` show corner case ``name``?"""
    if name != "max_model_len_minus_one":
        return False
    mml = s.config.max_model_len
    return any(
        o.finish_reason == "length"
        and before[o.req_id][0] == mml - 1
        and before[o.req_id][1] + len(o.new_token_ids) < before[o.req_id][2]
        for o in outputs
    )


def reaches(name: str, trace: Trace) -> bool:
    """Re-drive the trace's inputs into the model and look for the corner case."""
    s = Scheduler(SchedulerConfig.from_dict(trace.config), trace.profile)
    for event in trace.events:
        kind = event["kind"]
        if kind == "step":
            if check_step(name, s, apply_trace_event(s, event)):
                return True
        elif kind == "model_output":
            counts = {rid: (r.num_tokens, r.num_output_tokens, r.max_tokens) for rid, r in s.requests.items()}
            if check_update(name, s, apply_trace_event(s, event), counts):
                return True
        else:
            apply_trace_event(s, event)
    return False


@pytest.mark.parametrize("name", NAMES)
def test_witness_trace_replays_and_reaches_its_corner(name: str) -> None:
    """The witness trace passes against the reference and reaches the corner case it describes."""
    trace = read_trace(WITNESS_DIR / f"{name}.jsonl")
    assert trace.header["description"], "a witness says what it shows"
    assert trace.header["origin"] == "symbolic-witness"
    result = replay(trace, ReferenceSut())
    assert result.verdict == PASS, result.divergence
    assert reaches(name, trace), f"{name}: the model never reaches the corner case in {WITNESS_DIR / name}.jsonl"


def test_detectors_stay_silent_on_a_plain_trace() -> None:
    """No detector fires on a plain run: two short requests, a large pool and budget, no priorities."""
    from schedconf.conformance.workloads.workload import HashOracle, RequestSpec, Workload, run_workload

    config = SchedulerConfig(
        block_size=2, num_gpu_blocks=17, max_num_batched_tokens=32, max_num_seqs=4, max_model_len=16
    )
    workload = Workload(
        config=config,
        profile="vllm-0.33",
        oracle=HashOracle(seed=1, eos_per_mille=0),
        requests=(RequestSpec("a", (11, 12, 13), max_tokens=3), RequestSpec("b", (21, 22, 23, 24, 25), max_tokens=2)),
    )
    trace = run_workload(workload)
    assert [name for name in NAMES if reaches(name, trace)] == []


@pytest.mark.symbolic
@pytest.mark.parametrize("name", NAMES)
def test_z3_still_finds_the_witness(name: str) -> None:
    """Z3 still finds a state for the corner case, and the state satisfies every invariant concretely."""
    from schedconf.spec.ops import ConcreteOps
    from schedconf.spec.symbolic.state import LEMMAS, SymbolicView
    from schedconf.spec.symbolic.witnesses import WITNESSES, find_witness
    from schedconf.spec.v1.invariants import INVARIANTS

    found = find_witness(WITNESSES[name], timeout_s=120)
    assert found is not None, f"Z3 finds no state for {name}"
    state, _, facts = found
    view = SymbolicView(state)
    assert all(fn(view, ConcreteOps()) for fn in INVARIANTS.values())
    assert all(fn(state, ConcreteOps()) for fn in LEMMAS.values())
    assert facts, "the transition's facts are evaluated"
