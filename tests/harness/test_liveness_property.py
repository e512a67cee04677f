"""The ``liveness`` property (conformance/CHECKS.md, spec/symbolic/LIVENESS.md) on the reference.

Under ``--comparison safety`` every SUT is held to the policy-independent
bound; for the reference it is also a model property of its own strict
traces: vllm-0.33 and vllm-0.32 generated traces end within their policy's
bound (FCFS, or priority with distinct keys) and always within the
any-order bound, and the vllm-0.11 witness never ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import FAIL, PASS, replay
from schedconf.conformance.checking.safety.properties import RequestRecord, check_liveness
from schedconf.conformance.traces.trace import read_trace
from schedconf.conformance.workloads.generate import random_workload
from schedconf.conformance.workloads.workload import WorkloadError, run_workload
from schedconf.spec.symbolic.liveness_bound import (
    compute_any_order_bound,
    compute_policy_bound,
    compute_work,
    get_trace_tail,
    has_distinct_keys,
)

WITNESS_DIR = Path(__file__).resolve().parents[2] / "conformance" / "traces" / "vectors" / "witnesses"
NUM_SEEDS = 300


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.32"])
def test_generated_traces_end_within_the_bound(profile: str) -> None:
    checked = theorem = 0
    for seed in range(NUM_SEEDS):
        try:
            # The bound is derived for synchronous steps (one in flight).
            trace = run_workload(random_workload(seed, profile, in_flight_batches=False), max_steps=3000)
        except WorkloadError as exc:  # pragma: no cover - would be a liveness failure of the model
            pytest.fail(f"seed {seed}: {exc}")
        tail = get_trace_tail(trace.events)
        if not tail.live or tail.steps_to_finish is None:
            continue  # nothing live at the last input, or the engine died (a crash trace)
        cfg = trace.config
        steps = tail.steps_to_finish
        works = [compute_work(r.num_prompt_tokens, r.max_tokens, cfg["max_model_len"]) for r in tail.live]
        assert steps <= compute_any_order_bound(works), f"seed {seed}: {steps} steps"
        checked += 1
        if cfg["num_spec_tokens"] == 0 and (cfg["policy"] == "fcfs" or has_distinct_keys(tail.live)):
            assert steps <= compute_policy_bound(tail.live, cfg), f"seed {seed}: {steps} steps ({cfg['policy']})"
            theorem += 1
    assert checked >= NUM_SEEDS // 2 and theorem >= NUM_SEEDS // 5, (checked, theorem)


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.32"])
def test_reference_keeps_liveness_under_the_safety_comparison(profile: str) -> None:
    for seed in range(100):
        try:
            trace = run_workload(random_workload(seed, profile, in_flight_batches=False))
        except WorkloadError:  # pragma: no cover
            pytest.fail(f"seed {seed} does not finish")
        result = replay(trace, ReferenceSut(), "safety")
        assert result.verdict == PASS, (seed, result.divergence)


def test_thrash_witness_fails_liveness() -> None:
    trace = read_trace(WITNESS_DIR / "liveness_thrash_0_11.jsonl")
    assert trace.profile == "vllm-0.11"
    assert get_trace_tail(trace.events).steps_to_finish is None  # strict: the trace stops with both live
    result = replay(trace, ReferenceSut(), "safety")
    assert result.verdict == FAIL and result.divergence.section() == "safety:liveness", result.divergence


def test_check_liveness_fails_at_the_deadline_not_before() -> None:
    rec = RequestRecord("a", [5, 5, 5], 3, 2, 0, None, (), 0)
    assert check_liveness(9, 10, {"a": rec}, num_usable_blocks=4, block_size=2, last_input_step=6) == []
    [message] = check_liveness(10, 10, {"a": rec}, num_usable_blocks=4, block_size=2, last_input_step=6)
    assert "4 steps after the last input (bound 4 steps)" in message
    rec.ended = "finished (length)"
    assert check_liveness(10, 10, {"a": rec}, num_usable_blocks=4, block_size=2, last_input_step=6) == []
