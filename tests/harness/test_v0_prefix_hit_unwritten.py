"""The v0 safety property ``prefix_hit_unwritten`` (``conformance/checking/safety/v0.py``) and finding V7.

vLLM 0.10.2's v0 block manager counts every full block of a prompt as computed
at the end of the ``schedule()`` of its first chunk; a prefix hit can then skip
positions whose KV no step has written. The committed trace
``reports/findings/V7-v0-prefix-hit-on-unwritten-kv.jsonl`` shows it; the model
is faithful to vLLM there (strict replay passes), so the property flags the
trace and reports it as a known violation of profile ``vllm-0.10``. The
variants without chunked prefill, without prefix caching, or with the sharer
arriving after the prefill, hit only written KV and are not flagged.
"""

from __future__ import annotations

from typing import Any

import pytest

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.checking.replay import PASS, replay
from schedconf.conformance.checking.safety.v0 import (
    KNOWN_VIOLATIONS,
    V0_PROPERTIES,
    check_prefix_hit_unwritten,
    get_computed_positions,
    get_known_violation,
    get_unexpected_violations,
)
from schedconf.conformance.traces.trace import read_trace, render_trace
from schedconf.conformance.workloads.workload import (
    AbortSpec,
    HashOracle,
    RequestSpec,
    Workload,
    WorkloadError,
    run_v0_workload,
)
from schedconf.conformance.workloads.workload_v0 import V0_PROFILE, make_v0_config, random_v0_workload

V7 = "reports/findings/V7-v0-prefix-hit-on-unwritten-kv.jsonl"
SHARED = tuple(range(10, 26))  # four full blocks of 4 tokens

V7_CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 10,
    "num_cpu_blocks": 0,
    "max_num_batched_tokens": 8,
    "max_num_seqs": 2,
    "max_model_len": 32,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "preemption_mode": None,
    "max_num_partial_prefills": 2,
    "max_long_partial_prefills": 2,
    "long_prefill_token_threshold": 8,
}


def v7_workload(b_at_step: int = 1, **config: Any) -> Workload:
    """The V7 workload: a (20 tokens) is chunked 8 + 4 + 8; b (17 tokens) shares a's first 16 and arrives after ``b_at_step`` steps."""
    return Workload(
        config=make_v0_config({**V7_CONFIG, **config}),
        profile=V0_PROFILE,
        requests=(
            RequestSpec("a", SHARED + (1, 2, 3, 4), max_tokens=1, ignore_eos=True),
            RequestSpec("b", SHARED + (5,), max_tokens=1, ignore_eos=True, at_step=b_at_step),
        ),
        oracle=HashOracle(seed=7, eos_per_mille=0),
        origin="hand",
        description="V7: a (20 tokens) computes 8 in step 1; b shares a's first 16 tokens and arrives for step 2, "
        "where its prefix hit covers block 3 (tokens 12-15), which a computes only in step 3",
    )


def test_the_committed_trace_is_what_the_model_records() -> None:
    assert render_trace(run_v0_workload(v7_workload(), check=True)) == render_trace(read_trace(V7))


def test_the_v7_trace_is_flagged_at_bs_hit_on_block_3() -> None:
    trace = read_trace(V7)
    result = check_prefix_hit_unwritten(trace)
    assert (result.num_steps, result.num_hits, result.stopped_at) == (4, 1, None)
    assert [(v.kind, v.step, v.request_id) for v in result.violations] == [("safety:prefix_hit_unwritten", 2, "b")]
    assert result.violations[0].message == (
        "request 'b' is scheduled with a prefix hit of 16 tokens (computed_block_nums [0, 1, 2, 3]), so the model "
        "runner skips its positions 0-15; but block 3 (its table index 3, positions 12-15) holds, at position 12, "
        "no KV (no step has computed that slot), nor does this step compute it"
    )


def test_v7_is_a_known_violation_of_vllm_0_10_and_the_model_stays_faithful() -> None:
    """The model matches vLLM 0.10.2 (strict replay passes); the violation is known for its profile, and only there."""
    trace = read_trace(V7)
    assert replay(trace, make_sut("reference"), "strict").verdict == PASS
    result = check_prefix_hit_unwritten(trace)
    assert get_unexpected_violations(result, "vllm-0.10") == []
    assert "V7" in (get_known_violation("vllm-0.10", "prefix_hit_unwritten") or "")
    assert get_unexpected_violations(result, "some-fixed-release") == result.violations
    assert set(V0_PROPERTIES) >= {p for known in KNOWN_VIOLATIONS.values() for p in known}


@pytest.mark.parametrize(
    ("name", "config", "b_at_step", "num_hits"),
    [
        # Without chunked prefill a prompt is computed whole in the step that allocates it (budget >= max_model_len).
        (
            "no chunked prefill",
            {
                "enable_chunked_prefill": False,
                "max_num_batched_tokens": 32,
                "max_num_partial_prefills": 1,
                "max_long_partial_prefills": 1,
                "long_prefill_token_threshold": 0,
            },
            1,
            1,
        ),
        ("no prefix caching", {"enable_prefix_caching": False}, 1, 0),
        ("b after a's prefill", {}, 3, 1),
    ],
)
def test_variants_that_hit_only_written_kv_are_not_flagged(
    name: str, config: dict[str, Any], b_at_step: int, num_hits: int
) -> None:
    result = check_prefix_hit_unwritten(run_v0_workload(v7_workload(b_at_step, **config), check=True))
    assert (result.violations, result.num_hits, result.stopped_at) == ([], num_hits, None), name


def test_a_hit_on_a_block_the_same_step_writes_is_not_flagged() -> None:
    """a (13 tokens) computes 8, then 4 (block 2) in the step where b hits blocks 0-2: one forward pass
    writes block 2 before attention reads it."""
    w = Workload(
        config=make_v0_config(
            {**V7_CONFIG, "max_model_len": 16, "num_gpu_blocks": 8, "long_prefill_token_threshold": 4}
        ),
        profile=V0_PROFILE,
        oracle=HashOracle(seed=7, eos_per_mille=0),
        origin="hand",
        requests=(
            RequestSpec("a", SHARED[:12] + (1,), max_tokens=1, ignore_eos=True),
            RequestSpec("b", SHARED[:12] + (2,), max_tokens=1, ignore_eos=True, at_step=1),
        ),
    )
    trace = run_v0_workload(w, check=True)
    step2 = next(e for e in trace.events if e["kind"] == "step" and e["step"] == 2)
    assert [
        (g["request_id"], g["token_chunk_size"], g["computed_block_nums"])
        for g in step2["expect"]["scheduled_seq_groups"]
    ] == [("b", 13, [0, 1, 2]), ("a", 4, [])]
    result = check_prefix_hit_unwritten(trace)
    assert (result.violations, result.num_hits) == ([], 1)


def test_without_concurrent_prefills_an_abort_mid_prefill_leaves_unwritten_hits_too() -> None:
    """Reach: with one partial prefill (the default), a is aborted after its first chunk; its blocks go to
    the evictor with their hashes, all counted computed, and b hits all four."""
    w = v7_workload(max_num_partial_prefills=1, max_long_partial_prefills=1, long_prefill_token_threshold=0)
    w = w.replace(aborts=(AbortSpec("a", 1),))
    result = check_prefix_hit_unwritten(run_v0_workload(w, check=True))
    assert [(v.step, v.request_id) for v in result.violations] == [(2, "b")]
    assert "block 2 (its table index 2, positions 8-11) holds, at position 8, no KV" in result.violations[0].message


@pytest.mark.parametrize(
    ("computed", "chunk", "is_prompt", "hit", "first"),
    [
        (0, 8, True, 0, 0),  # no hit
        (8, 4, True, 8, 8),  # the hit is behind the computed tokens
        (0, 17, True, 16, 16),  # a partial hit: compute from its end
        (0, 16, True, 16, 15),  # the whole chunk is a hit: recompute the last position only
        (4, 4, True, 16, 7),
        (9, 1, False, 8, 9),  # a decode never skips
    ],
)
def test_computed_positions_follow_vllms_model_runner(
    computed: int, chunk: int, is_prompt: bool, hit: int, first: int
) -> None:
    assert get_computed_positions(computed, chunk, is_prompt, hit) == first


def test_generated_traces_are_flagged_only_with_chunked_prefill_and_prefix_caching() -> None:
    """300 generated v0 traces (every feature, swaps and preemptions included): the check always settles every
    count (observe is recorded), and flags only configs with both chunked prefill and prefix caching."""
    flagged, checked = [], 0
    for seed in range(300):
        try:
            trace = run_v0_workload(random_v0_workload(seed))
        except WorkloadError:
            continue
        if not trace.events:
            continue
        result = check_prefix_hit_unwritten(trace)
        checked += 1
        assert result.stopped_at is None, (seed, result.stop_reason)
        if result.violations:
            flagged.append(seed)
            assert trace.config["enable_chunked_prefill"] and trace.config["enable_prefix_caching"], seed
    assert checked > 250 and flagged, (checked, flagged)


def test_a_v1_trace_is_refused() -> None:
    trace = read_trace("reports/findings/F7-same-step-priority-victim-cache-hit.jsonl")
    with pytest.raises(ValueError, match="v0 traces"):
        check_prefix_hit_unwritten(trace)
