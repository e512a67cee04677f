"""The engine on the CPU: identical scheduler outputs and tokens equal to the dense greedy oracle.

The expected tokens always come from ``impl/dense.py`` (full recompute, one
request, no cache) and the expected scheduler outputs from the reference
``schedconf.spec.v1.scheduler.Scheduler``; the engine's own answers are never the oracle.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
import torch

import schedconf.impl.runner as runner_module
from schedconf.conformance.adapters.impl import ImplEngineSut, ImplSchedulerSut
from schedconf.conformance.checking.replay import FAIL, PASS, replay
from schedconf.conformance.traces.examples import EXAMPLES
from schedconf.conformance.traces.trace import read_trace
from schedconf.conformance.workloads.generate import random_workload as generate_workload
from schedconf.conformance.workloads.tight_workloads import make_tight_workload
from schedconf.conformance.workloads.workload import run_workload, workload_from_trace
from schedconf.gpu_checks.engine_check import check_engine
from schedconf.impl.dense import dense_generate
from schedconf.impl.engine import Engine
from schedconf.impl.model import TINY, LlamaModel
from schedconf.spec.v1.config import SchedulerConfig

ROOT = Path(__file__).parents[2]
CORPUS = sorted((ROOT / "conformance" / "traces" / "vectors").rglob("*.jsonl"))


def _dense(model, record, max_model_len, limit=None):
    return dense_generate(
        model,
        record.prompt,
        record.max_tokens,
        max_model_len=max_model_len,
        eos_token_id=record.eos_token_id,
        ignore_eos=record.ignore_eos,
        stop_token_ids=record.stop_token_ids,
        min_tokens=record.min_tokens,
        limit=limit,
    )


def _run(engine: Engine, arrivals: list[tuple[int, str, list[int], dict]]) -> Counter:
    """Step the engine, adding requests at their steps; count what the steps did."""
    seen: Counter = Counter()
    pending = sorted(arrivals, key=lambda a: a[0])
    step = 0
    while pending or engine.has_requests():
        while pending and pending[0][0] <= step:
            _, rid, prompt, kwargs = pending.pop(0)
            engine.add_request(rid, prompt, **kwargs)
        if engine.has_requests():
            st = engine.step()
            c = st.output.to_canonical()
            seen["preemptions"] += len(c["preempted_req_ids"])
            seen["prefix_hits"] += sum(1 for r in c["scheduled_new_reqs"] if r["num_computed_tokens"] > 0)
            seen["chunks"] += sum(1 for e in st.output.entries if e[2] + e[1] < e[3])
        step += 1
    return seen


def test_engine_tokens_equal_dense_through_chunks_hits_preemption_and_drafts(tiny_model):
    rng = random.Random(3)
    system = [rng.randrange(512) for _ in range(10)]
    # Repetitive prompts give the n-gram drafter matches.
    loop = [rng.randrange(512) for _ in range(5)]
    config = SchedulerConfig(
        block_size=4,
        num_gpu_blocks=16,
        max_num_batched_tokens=12,
        max_num_seqs=4,
        max_model_len=48,
        num_spec_tokens=3,
        long_prefill_token_threshold=8,
    )
    engine = Engine(config, tiny_model)
    arrivals = []
    for i in range(8):
        prompt = system + (loop * 3 if i % 2 else [rng.randrange(512) for _ in range(rng.randrange(2, 12))])
        arrivals.append((i // 2, f"r{i}", prompt, {"max_tokens": 14, "eos_token_id": 1}))
    seen = _run(engine, arrivals)
    assert seen["preemptions"] > 0 and seen["prefix_hits"] > 0 and seen["chunks"] > 0, seen
    stats = engine.stats
    assert 0 < stats.num_drafts_accepted < stats.num_drafts_proposed, stats
    for record in engine.records:
        dense = _dense(tiny_model, record, config.max_model_len)
        assert record.output_tokens == dense.tokens, record.req_id
        assert record.finish_reason == dense.finish_reason


# A priority workload (found by a seeded search) in which request r0 is scheduled,
# caches blocks at scheduling time, and is preempted in the same step by a more
# important request: its cached blocks were never computed, and r0 later resumes
# on a prefix hit of exactly those blocks.
HAZARD_CONFIG = SchedulerConfig(
    block_size=4,
    num_gpu_blocks=12,
    max_num_batched_tokens=16,
    max_num_seqs=4,
    max_model_len=32,
    long_prefill_token_threshold=8,
    policy="priority",
)
HAZARD_REQUESTS = [
    (
        3,
        "r0",
        [36, 1, 508, 69, 69, 8, 201, 328, 237, 177, 435, 503, 100, 245, 402, 355, 79, 264, 370, 437, 224, 118, 386],
        {"max_tokens": 10, "priority": 1, "arrival_time": 3},
    ),
    (
        3,
        "r1",
        [36, 1, 508, 69, 69, 8, 201, 328, 237, 177, 435, 503, 340, 345, 185, 78, 310, 411, 266, 1],
        {"max_tokens": 5, "priority": 1, "arrival_time": 3},
    ),
    (1, "r2", [199, 194, 131], {"max_tokens": 8, "priority": 1, "arrival_time": 1}),
    (1, "r3", [211, 11, 242, 464, 446, 290, 71, 274, 303], {"max_tokens": 10, "priority": 2, "arrival_time": 1}),
]


def test_prefix_hit_on_blocks_of_a_same_step_priority_victim_is_recomputed(tiny_model):
    engine = Engine(HAZARD_CONFIG, tiny_model)
    seen = _run(engine, HAZARD_REQUESTS)
    assert seen["preemptions"] >= 2
    assert engine.stats.num_repaired_tokens > 0
    for record in engine.records:
        assert record.output_tokens == _dense(tiny_model, record, HAZARD_CONFIG.max_model_len).tokens, record.req_id


def test_trusting_every_prefix_hit_gives_wrong_tokens_there(tiny_model):
    """The control: without the repair, the resumed request reads KV that was never written."""
    engine = Engine(HAZARD_CONFIG, tiny_model, repair_prefix_hits=False)
    _run(engine, HAZARD_REQUESTS)
    wrong = [
        r.req_id for r in engine.records if r.output_tokens != _dense(tiny_model, r, HAZARD_CONFIG.max_model_len).tokens
    ]
    assert wrong == ["r0"]


def test_lockstep_engine_check_on_generated_workloads_and_corpus(tiny_model):
    workloads = [(f"gen-{s}-{p}", generate_workload(s, p)) for s in range(20) for p in ("vllm-0.33", "vllm-0.32")]
    workloads += [(f"impl-{s}", make_tight_workload(s, vocab_size=512)) for s in range(12)]
    workloads += [(f"example-{k}", f()) for k, f in sorted(EXAMPLES.items())]
    workloads += [
        (str(p), workload_from_trace(t))
        for p in CORPUS  # refused configs have no workload
        for t in [read_trace(p)]
        if t.profile in ("vllm-0.33", "vllm-0.32") and "expect_error" not in t.header and "liveness_" not in p.name
    ]  # the liveness witnesses never finish (spec/symbolic/LIVENESS.md)
    totals: Counter = Counter()
    for name, workload in workloads:
        report = check_engine(workload, tiny_model, name=name, record_trace=False)
        assert report.ok, (name, report.divergence, report.token_mismatches)
        assert not report.near_ties, (name, report.near_ties)
        totals.update(
            steps=report.steps,
            preemptions=report.num_preemptions,
            accepted=report.num_drafts_accepted,
            proposed=report.num_drafts_proposed,
        )
    assert totals["preemptions"] > 0 and 0 < totals["accepted"] < totals["proposed"], totals


def test_lockstep_trace_replays_on_the_reference_and_on_impl(tiny_model):
    """The lockstep run's trace (engine tokens, reference expectations) is a valid trace for any SUT."""
    from schedconf.conformance.adapters.reference import ReferenceSut

    report = check_engine(generate_workload(7, "vllm-0.33"), tiny_model)
    assert report.ok and report.trace is not None
    assert replay(report.trace, ReferenceSut(), "strict").verdict == PASS
    assert replay(report.trace, ImplSchedulerSut(), "strict").verdict == PASS


def test_teacher_forced_engine_adapter_replays_traces():
    sut = ImplEngineSut()
    traces = [run_workload(f()) for _, f in sorted(EXAMPLES.items())]
    traces += [run_workload(generate_workload(s, "vllm-0.33")) for s in range(25)]
    traces += [run_workload(make_tight_workload(s)) for s in range(15)]
    traces += [t for t in (read_trace(p) for p in CORPUS) if t.profile in ("vllm-0.33", "vllm-0.32")]
    for trace in traces:
        result = replay(trace, sut, "strict")
        assert result.verdict == PASS, (result.divergence, result.detail[-600:])
    sut.close()
    assert not sut.failures
    assert sut.num_checked_positions > 300
    assert sut.max_abs_diff < 1e-12


class _CorruptingEngineSut(ImplEngineSut):
    """Adds noise to layer 0's keys after the third schedule(): the KV no longer matches the tokens."""

    calls = 0

    def schedule(self):
        out = super().schedule()
        self.calls += 1
        if self.calls == 3:
            self.runner.k_cache[0].add_(0.5)
        return out


def test_teacher_forced_adapter_detects_wrong_kv():
    trace = run_workload(EXAMPLES["mixed"]())
    result = replay(trace, _CorruptingEngineSut(), "strict")
    assert result.verdict == FAIL
    assert result.divergence is not None and result.divergence.kind == "sut_error"
    assert "EngineMismatch" in result.divergence.message


def test_near_ties_are_reported_with_their_margin():
    model = LlamaModel(TINY)
    model.lm_head.zero_()  # every logit is 0: every choice is a tie
    config = SchedulerConfig(block_size=4, num_gpu_blocks=20, max_num_batched_tokens=16, max_model_len=32)
    engine = Engine(config, model)
    engine.add_request("a", [5, 6, 7], max_tokens=4)
    engine.run()
    # argmax of equal values is the lowest id: token 0, runner-up 1, margin 0, at every output.
    assert engine.records[0].output_tokens == [0, 0, 0, 0]
    assert [(t.output_index, t.token, t.runner_up, t.margin) for t in engine.stats.near_ties] == [
        (i, 0, 1, 0.0) for i in range(4)
    ]
    dense = _dense(model, engine.records[0], 32)
    assert dense.tokens == [0, 0, 0, 0] and len(dense.near_ties) == 4


def test_min_tokens_masks_the_stop_tokens(tiny_model):
    prompt = [17, 4, 250, 33]
    first = int(tiny_model.forward_dense(prompt)[-1].argmax())  # the unmasked greedy first token
    config = SchedulerConfig(block_size=4, num_gpu_blocks=20, max_num_batched_tokens=16, max_model_len=32)
    engine = Engine(config, tiny_model)
    engine.add_request("stops", prompt, max_tokens=6, eos_token_id=first)
    engine.add_request("held", prompt, max_tokens=6, eos_token_id=first, min_tokens=3)
    engine.run()
    stops, held = engine.records
    assert stops.output_tokens == [first] and stops.finish_reason == "stop"
    assert held.output_tokens[0] != first and len(held.output_tokens) >= 3
    assert held.output_tokens == _dense(tiny_model, held, 32).tokens


def test_abort_keeps_a_prefix_of_the_dense_tokens(tiny_model):
    config = SchedulerConfig(block_size=4, num_gpu_blocks=20, max_num_batched_tokens=16, max_model_len=64)
    engine = Engine(config, tiny_model)
    engine.add_request("a", [9, 8, 7, 6, 5], max_tokens=30)
    for _ in range(6):
        engine.step()
    engine.abort("a")
    record = engine.records[0]
    assert record.finish_reason == "abort" and len(record.output_tokens) == 6
    assert record.output_tokens == _dense(tiny_model, record, 64, limit=6).tokens


def test_long_segments_split_their_queries(tiny_model, monkeypatch):
    """A small score budget forces the query split used for long prefills on the GPU."""
    monkeypatch.setattr(runner_module, "MAX_SCORE_ELEMENTS", 200)
    config = SchedulerConfig(block_size=4, num_gpu_blocks=40, max_num_batched_tokens=64, max_model_len=96)
    engine = Engine(config, tiny_model)
    prompts = [[(7 * i + j) % 500 for j in range(40 + i)] for i in range(3)]
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", p, max_tokens=5)
    engine.run()
    for record in engine.records:
        assert record.output_tokens == _dense(tiny_model, record, 96).tokens


@pytest.mark.parametrize("dtype", [torch.float32])
def test_lower_precision_engine_runs_and_reports(dtype):
    """float32: the engine runs the same batches; agreement with float32 dense is reported, not assumed."""
    model = LlamaModel(TINY, dtype=dtype)
    config = SchedulerConfig(block_size=4, num_gpu_blocks=40, max_num_batched_tokens=16, max_model_len=48)
    engine = Engine(config, model)
    for i in range(4):
        engine.add_request(f"r{i}", [i + 1, 2 * i + 3, 40 + i], max_tokens=10)
    engine.run()
    for record in engine.records:
        dense = _dense(model, record, 48)
        if record.output_tokens != dense.tokens:
            # Allowed only where a near tie was reported, at or before the first difference.
            first = next(i for i, (a, b) in enumerate(zip(record.output_tokens, dense.tokens + [-1])) if a != b)
            ties = [
                t
                for t in engine.stats.near_ties + dense.near_ties
                if t.req_id in (record.req_id, "") and t.output_index <= first
            ]
            assert ties, (record.req_id, first)
