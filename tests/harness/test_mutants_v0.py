"""The v0 mutants (vLLM 0.10.2's legacy scheduler with one rule broken) are killed and shrunk.

Same targets as test_mutants.py: each mutant killed by the campaign of its
profile (``vllm-0.10``: the v0 generator, differential against the v0
reference, the v0 invariants) within 30 s on 2 cores, its failure shrunk to at
most 10 events, derandomized (a fixed seed).

``v0_watermark_ignored`` needs a pool the watermark binds: the watermark is
``int(0.01 * num_gpu_blocks)``, 0 below 100 blocks, so the generator's
watermark pools (100+ one-token blocks, sequences up to about the whole pool)
are the only ones that can tell it from the reference; a hand-made trace below
kills it directly too.
"""

import pytest

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.checking.mutant_kill import kill_one, run_model
from schedconf.conformance.checking.mutants import MUTANTS, get_mutant_names
from schedconf.conformance.checking.replay import PASS, replay
from schedconf.conformance.checking.shrink import shrink_trace
from schedconf.conformance.sut import SutUnsupported
from schedconf.conformance.workloads.workload import HashOracle, RequestSpec, Workload
from schedconf.spec.schedulers import make_config


@pytest.mark.parametrize("name", get_mutant_names("v0"))
def test_v0_mutant_is_killed_and_shrunk(name):
    row = kill_one(MUTANTS[name], examples=1500, shrink_budget_s=15, seed=0, max_failures=4)
    assert row.killed, f"{name} survived {row.traces_tried} traces"
    assert row.seconds_to_kill is not None and row.seconds_to_kill <= 30, row
    assert row.shrunk_events is not None and row.shrunk_events <= 10, (row.killed_by, row.shrunk_events)
    assert row.minimal_trace is not None and row.minimal_trace.scheduler == "v0"
    print(
        f"\n{name}: killed by {row.killed_by} in {row.seconds_to_kill:.2f} s "
        f"after {row.traces_to_kill} traces; minimal trace {row.shrunk_events} events"
    )


def test_the_v0_mutants_are_registered_for_the_v0_profile():
    names = get_mutant_names("v0")
    assert len(names) >= 4
    assert all(MUTANTS[n].profile == "vllm-0.10" for n in names)
    assert not set(names) & set(get_mutant_names("v1"))


def _watermark_workload() -> Workload:
    # 100 GPU blocks of 1 token: watermark int(0.01 * 100) = 1 block. A 100-token
    # prompt (= max_model_len, accepted at add) needs all 100 blocks, so
    # can_allocate says total - required = 0 < 1: NEVER, the reference finishes it
    # as ignored at step 1. With the watermark at 0 the mutant says OK and
    # prefills it (scheduled_seq_groups ["w"], 100 tokens).
    config = make_config(
        {
            "block_size": 1,
            "num_gpu_blocks": 100,
            "num_cpu_blocks": 0,
            "max_num_batched_tokens": 100,
            "max_num_seqs": 2,
            "max_model_len": 100,
            "enable_chunked_prefill": False,
            "enable_prefix_caching": False,
            "policy": "fcfs",
            "preemption_mode": None,
            "max_num_partial_prefills": 1,
            "max_long_partial_prefills": 1,
            "long_prefill_token_threshold": 0,
        },
        "vllm-0.10",
    )
    return Workload(
        config=config,
        profile="vllm-0.10",
        requests=(RequestSpec("w", tuple(range(100, 200)), max_tokens=1),),
        oracle=HashOracle(seed=0, eos_per_mille=0),
        origin="example",
    )


def test_watermark_mutant_is_killed_by_a_pool_the_watermark_binds():
    trace = run_model(_watermark_workload())
    step = next(e for e in trace.events if e["kind"] == "step")
    assert step["expect"]["ignored_seq_groups"] == ["w"] and step["expect"]["scheduled_seq_groups"] == []
    sut = make_sut("mutant:v0_watermark_ignored")
    result = replay(trace, sut, "strict")
    assert result.verdict != PASS and result.divergence is not None
    assert result.divergence.step == 1
    shrunk = shrink_trace(trace, sut, "strict", time_budget_s=10)
    assert shrunk.num_events <= 10


def test_a_v0_mutant_is_unsupported_on_a_v1_trace():
    sut = make_sut("mutant:v0_recompute_keeps_computed")
    with pytest.raises(SutUnsupported):
        sut.start(
            {
                "block_size": 4,
                "num_gpu_blocks": 8,
                "max_num_batched_tokens": 16,
                "max_num_seqs": 2,
                "max_model_len": 16,
                "enable_prefix_caching": False,
                "policy": "fcfs",
            },
            "vllm-0.33",
        )
