"""impl/'s fast scheduler against the reference: strict replay, golden scenarios, hand-derived cases.

Expected values come from the reference model (replays, lockstep runs) or are
derived by hand in comments from the rules of the notes; none is read back
from the fast scheduler itself.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

from schedconf.conformance.adapters.impl import ImplSchedulerSut
from schedconf.conformance.checking.replay import FAIL, PASS, UNKNOWN, render_divergence, replay
from schedconf.conformance.sut import SutUnsupported
from schedconf.conformance.traces.examples import EXAMPLES
from schedconf.conformance.traces.trace import read_trace
from schedconf.conformance.workloads.generate import random_workload as generate_workload
from schedconf.conformance.workloads.generate import workloads
from schedconf.conformance.workloads.tight_workloads import make_tight_workload
from schedconf.conformance.workloads.workload import run_workload
from schedconf.impl.scheduler import FastScheduler
from schedconf.spec.errors import InvalidEvent
from schedconf.spec.v1.config import SchedulerConfig

ROOT = Path(__file__).parents[2]
CORPUS = sorted((ROOT / "conformance" / "traces" / "vectors").rglob("*.jsonl"))


def _replay_all(traces) -> tuple[Counter, list[str]]:
    verdicts: Counter = Counter()
    failures: list[str] = []
    for trace in traces:
        result = replay(trace, ImplSchedulerSut(), "strict")
        verdicts[result.verdict] += 1
        if result.verdict == FAIL and len(failures) < 3:
            failures.append(render_divergence(trace, result))
    return verdicts, failures


def test_impl_campaign_replays_strict():
    """400 seeded conformance/workloads/tight_workloads.py workloads: every step, output and free queue as the reference."""
    traces = [run_workload(make_tight_workload(seed)) for seed in range(400)]
    verdicts, failures = _replay_all(traces)
    assert not failures, "\n\n".join(failures)
    assert verdicts == Counter({PASS: 400})
    # The campaign reaches the hard cases (counted on the reference's expectations).
    seen: Counter = Counter()
    for trace in traces:
        for event in trace.events:
            if event["kind"] != "step":
                continue
            x = event["expect"]
            seen["preemption"] += bool(x["preempted_req_ids"])
            seen["prefix_hit"] += any(r["num_computed_tokens"] for r in x["scheduled_new_reqs"])
            seen["resumed"] += any(r["resumed"] for r in x["scheduled_cached_reqs"])
            seen["drafts"] += bool(x["scheduled_spec_decode_tokens"])
            seen["padded"] += any(-1 in d for d in x["scheduled_spec_decode_tokens"].values())
    assert all(seen[k] > 0 for k in ("preemption", "prefix_hit", "resumed", "drafts", "padded")), seen


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.32"])
def test_generated_corpus_replays_strict(profile):
    """conformance/workloads/generate.py's seeded workloads (the vector corpus generator), both profiles."""
    traces = [run_workload(generate_workload(seed, profile)) for seed in range(250)]
    verdicts, failures = _replay_all(traces)
    assert not failures, "\n\n".join(failures)
    assert verdicts == Counter({PASS: 250})


@settings(max_examples=60)
@given(workload=workloads())
def test_hypothesis_workloads_replay_strict(workload):
    """conformance/workloads/generate.py's Hypothesis strategy (failures shrink)."""
    trace = run_workload(workload)
    result = replay(trace, ImplSchedulerSut(), "strict")
    assert result.verdict == PASS, render_divergence(trace, result)


def test_examples_and_exported_corpus_replay_strict():
    """The built-in examples and every exported vector of the two supported profiles."""
    traces = [run_workload(f()) for _, f in sorted(EXAMPLES.items())]
    traces += [t for t in (read_trace(p) for p in CORPUS) if t.profile in ("vllm-0.33", "vllm-0.32")]
    verdicts, failures = _replay_all(traces)
    assert not failures, "\n\n".join(failures)
    assert verdicts[PASS] == len(traces) >= len(EXAMPLES)


def test_other_profiles_are_unsupported_not_failed():
    workload = EXAMPLES["mixed"]().replace(profile="vllm-0.11")
    result = replay(run_workload(workload), ImplSchedulerSut(), "strict")
    assert result.verdict == UNKNOWN
    with pytest.raises(SutUnsupported):
        ImplSchedulerSut().start(workload.config.to_dict(), "vllm-0.11")


# ----------------------------------------------------------------- golden scenarios in lockstep


# The golden scenarios in lockstep with the reference (steps in flight and resets
# included): tests/engine/test_impl_async.py::test_golden_scenarios_in_lockstep_with_the_reference.


# ----------------------------------------------------------------- hand-derived cases


def _sched(**overrides: Any) -> FastScheduler:
    config = dict(block_size=4, num_gpu_blocks=6, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=16)
    config.update(overrides)
    return FastScheduler(SchedulerConfig(**config))


def _sample_all(sched: FastScheduler, out, token: int = 7):
    return sched.update_from_output(
        out, [[token] if before + n >= ntok else [] for _, n, before, ntok, _ in out.entries]
    )


def test_allocation_prefix_hit_and_free_queue_order_by_hand():
    sched = _sched()
    # Blocks 1..5 are free, in id order (block 0 is the null block).
    assert sched.observe()["free_block_queue"] == [1, 2, 3, 4, 5]
    sched.add_request("a", range(100, 108), max_tokens=4)
    out = sched.schedule()
    # 8 prompt tokens need ceil(8/4) = 2 blocks, taken from the front.
    assert out.to_canonical()["scheduled_new_reqs"] == [{"req_id": "a", "block_ids": [1, 2], "num_computed_tokens": 0}]
    _sample_all(sched, out)
    sched.abort("a")
    # Both blocks are full and cached when scheduled; freed tail first, hashed
    # blocks go to the back: [3, 4, 5] + [2, 1].
    assert sched.observe()["free_block_queue"] == [3, 4, 5, 2, 1]
    # Same 8 tokens plus one: the hit is capped below 9 tokens, i.e. 2 whole blocks
    # (blocks 1 and 2, taken out of the queue); 1 token left needs a third block,
    # popped from the front: block 3.
    sched.add_request("b", [*range(100, 108), 9], max_tokens=4)
    out = sched.schedule()
    assert out.to_canonical()["scheduled_new_reqs"] == [
        {"req_id": "b", "block_ids": [1, 2, 3], "num_computed_tokens": 8}
    ]
    assert out.to_canonical()["num_scheduled_tokens"] == {"b": 1}
    assert sched.observe()["free_block_queue"] == [4, 5]


def test_fcfs_preempts_the_tail_by_hand():
    # 4 usable blocks of 2 tokens, no prefix caching.
    sched = _sched(block_size=2, num_gpu_blocks=5, max_model_len=8, enable_prefix_caching=False)
    sched.add_request("r1", [1, 2, 3], max_tokens=8)
    sched.add_request("r2", [4, 5, 6], max_tokens=8)
    # Step 1: 3 tokens each need 2 blocks: r1 gets [1, 2], r2 gets [3, 4]; the pool is empty.
    out = sched.schedule()
    assert [r["block_ids"] for r in out.to_canonical()["scheduled_new_reqs"]] == [[1, 2], [3, 4]]
    _sample_all(sched, out)
    # Step 2: 4 tokens still fit in 2 blocks each.
    out = sched.schedule()
    assert out.to_canonical()["preempted_req_ids"] == []
    _sample_all(sched, out)
    # Step 3: r1's 5th token needs a 3rd block: the tail r2 is preempted, its
    # uncached blocks go to the front tail first ([4, 3]) and r1 takes block 4.
    out = sched.schedule()
    canonical = out.to_canonical()
    assert canonical["preempted_req_ids"] == ["r2"]
    assert canonical["num_scheduled_tokens"] == {"r1": 1}
    assert canonical["scheduled_cached_reqs"][0]["new_block_ids"] == [4]
    assert sched.observe()["free_block_queue"] == [3]


def test_input_errors_by_hand():
    sched = _sched()
    sched.add_request("a", [1, 2, 3], max_tokens=2)
    cases = [
        (lambda: sched.add_request("a", [1], max_tokens=1), "duplicate_request_id"),
        (lambda: sched.add_request("b", [], max_tokens=1), "empty_prompt"),
        (lambda: sched.add_request("b", range(16), max_tokens=1), "prompt_too_long"),
        (lambda: sched.add_request("b", [1], max_tokens=0), "invalid_max_tokens"),
        (lambda: sched.add_request("b", [1], max_tokens=2, min_tokens=3), "invalid_min_tokens"),
        (lambda: sched.add_request("b", [1, -1], max_tokens=1), "invalid_token_id"),
        (lambda: sched.abort("never"), "unknown_request_id"),
    ]
    for call, code in cases:
        with pytest.raises(InvalidEvent) as exc:
            call()
        assert exc.value.code == code
    out = sched.schedule()
    with pytest.raises(InvalidEvent) as exc:
        sched.schedule()
    assert exc.value.code == "output_not_processed"
    # "a" reaches the end of its prompt and must sample 1 token (no drafts).
    with pytest.raises(InvalidEvent) as exc:
        sched.validate_model_output(out, {"a": [1, 2]}, {})
    assert exc.value.code == "bad_num_sampled_tokens"
    assert sched.update_from_output(out, [[5]]) == [("a", [5], None, None)]


def test_an_empty_output_with_drafts_wedges_the_request_in_both():
    """vLLM 0.32/0.33 skip the draft rejection on an empty output: the drafts stay computed and
    no later step schedules the request. impl follows the reference, step for step."""
    from schedconf.conformance.adapters.impl import make_scheduler_sut
    from schedconf.conformance.adapters.reference import ReferenceSut
    from schedconf.spec.v1.config import SchedulerConfig

    config = SchedulerConfig(
        block_size=4,
        num_gpu_blocks=17,
        max_num_batched_tokens=32,
        max_num_seqs=4,
        max_model_len=32,
        num_spec_tokens=2,
        enable_prefix_caching=False,
    ).to_dict()
    add = {
        "kind": "add_request",
        "prompt_token_ids": [1, 2, 3, 4],
        "max_tokens": 8,
        "priority": 0,
        "arrival_time": 0,
        "eos_token_id": None,
        "ignore_eos": False,
        "stop_token_ids": [],
        "min_tokens": 0,
    }
    # (sampled, drafts) per step: a and b prefill; a decodes with drafts and samples nothing; b goes on
    outputs = [
        ({"a": [5], "b": [5]}, {"a": [6, 7], "b": [6, 7]}),
        ({"a": [], "b": [6, 7, 8]}, {"b": [9, 9]}),
        ({"b": [9, 9, 9]}, {}),
        ({"b": [1]}, {}),
    ]
    seen = []
    for sut in (ReferenceSut(), make_scheduler_sut()):
        sut.start(config, "vllm-0.33")
        sut.add_request({**add, "request_id": "a"})
        sut.add_request({**add, "request_id": "b"})
        steps = []
        for sampled, drafts in outputs:
            out = sut.schedule()
            sampled = {k: v for k, v in sampled.items() if k in out["num_scheduled_tokens"]}
            steps.append((out, sut.update_from_output(sampled, drafts)))
        seen.append(steps)
        sut.close()
    assert seen[0] == seen[1]
    assert all("a" not in out["num_scheduled_tokens"] for out, _ in seen[0][2:])  # a is never scheduled again
