"""v0 coverage: the features of a small hand-written trace, and the run summary's shares, derived by hand."""

import json

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import PASS, replay
from schedconf.conformance.runs.campaign import TraceOutcome, _account, _finish, features_of
from schedconf.conformance.traces.trace import parse_trace_text

CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 4,
    "num_cpu_blocks": 4,
    "max_num_batched_tokens": 16,
    "max_num_seqs": 2,
    "max_model_len": 16,
    "enable_chunked_prefill": False,
    "enable_prefix_caching": False,
    "policy": "fcfs",
    "preemption_mode": "swap",
    "max_num_partial_prefills": 1,
    "max_long_partial_prefills": 1,
    "long_prefill_token_threshold": 0,
}


def _add(rid, prompt):
    return {
        "kind": "add_request",
        "request_id": rid,
        "prompt_token_ids": prompt,
        "max_tokens": 3,
        "priority": 0,
        "arrival_time": 0,
        "eos_token_id": 0,
        "stop_token_ids": [],
        "ignore_eos": False,
        "min_tokens": 0,
    }


def _group(rid, chunk, is_prompt, table):
    return {
        "request_id": rid,
        "token_chunk_size": chunk,
        "is_prompt": is_prompt,
        "do_sample": True,
        "block_table": table,
        "computed_block_nums": [],
    }


def _step(n, groups, gpu, cpu, free_gpu, free_cpu, swap_out=(), finished=(), preempted=0):
    return {
        "kind": "step",
        "step": n,
        "expect": {
            "scheduled_seq_groups": groups,
            "num_prefill_groups": sum(g["is_prompt"] for g in groups),
            "num_batched_tokens": sum(g["token_chunk_size"] for g in groups),
            "blocks_to_swap_in": [],
            "blocks_to_swap_out": [list(p) for p in swap_out],
            "blocks_to_copy": [],
            "ignored_seq_groups": [],
            "num_lookahead_slots": 0,
            "running_queue_size": len(gpu),
            "preempted": preempted,
            "finished_requests_ids": list(finished),
        },
        "observe": {
            "num_free_gpu_blocks": free_gpu,
            "num_free_cpu_blocks": free_cpu,
            "block_tables": gpu,
            "cpu_block_tables": cpu,
        },
    }


def _out(n, tokens, finished=()):
    return {
        "kind": "model_output",
        "step": n,
        "sampled_token_ids": {r: [t] for r, t in tokens.items()},
        "draft_token_ids": {},
        "expect": {
            "outputs": [
                {
                    "req_id": r,
                    "new_token_ids": [t],
                    "finish_reason": "length" if r in finished else None,
                    "stop_reason": None,
                }
                for r, t in tokens.items()
            ]
        },
    }


# Two 7-token prompts in 4 GPU blocks of 4 tokens, swap mode, 3 output tokens each; r2 is aborted while
# swapped out, r3 (added after step 2) while waiting.
HAND_TRACE = [
    {
        "kind": "header",
        "format": "schedconf-trace",
        "version": 1,
        "profile": "vllm-0.10",
        "scheduler": "v0",
        "config": CONFIG,
        "seed": 0,
        "origin": "hand",
    },
    _add("r1", [1, 2, 3, 4, 5, 6, 7]),
    _add("r2", [8, 9, 10, 11, 12, 13, 14]),
    # both prompts fit the pool (2 blocks each) and the budget (14 <= 16): two prefills, no free block left
    _step(1, [_group("r1", 7, True, [0, 1]), _group("r2", 7, True, [2, 3])], {"r1": [0, 1], "r2": [2, 3]}, {}, 0, 4),
    _out(1, {"r1": 22, "r2": 29}),
    # r1's decode needs a free block (can_append_slots counts one touched block): the tail, r2, is swapped
    # out (its GPU blocks 2, 3 to CPU blocks 0, 1); preempted counts it
    _step(
        2,
        [_group("r1", 1, False, [0, 1])],
        {"r1": [0, 1]},
        {"r2": [0, 1]},
        2,
        2,
        swap_out=[(2, 0), (3, 1)],
        preempted=1,
    ),
    _out(2, {"r1": 27}),
    {"kind": "abort", "request_id": "r2"},  # swapped: abort_swapped
    _add("r3", [15, 16]),
    {"kind": "abort", "request_id": "r3"},  # never scheduled: abort_waiting
    # r1's 10th token starts a third block (3: the free list's order); r2 and r3 are reported finished
    _step(3, [_group("r1", 1, False, [0, 1, 3])], {"r1": [0, 1, 3]}, {}, 1, 4, finished=["r2", "r3"]),
    _out(3, {"r1": 4}, finished={"r1"}),
    _step(4, [], {}, {}, 4, 4, finished=["r1"]),
    _out(4, {}),
]


def _trace():
    return parse_trace_text("\n".join(json.dumps(e) for e in HAND_TRACE) + "\n", "hand.jsonl")


def test_the_hand_trace_is_what_the_model_does():
    result = replay(_trace(), ReferenceSut(), "strict")
    assert result.verdict == PASS, result.divergence


def test_features_of_the_hand_trace():
    # swap_out: step 2's pairs; abort_swapped: r2 is in step 2's cpu_block_tables when aborted;
    # abort_waiting: r3 was added after the last step; no swap-in (r2 never comes back), no recompute
    # (swap mode, and no request is scheduled as a prompt again), nothing ignored, no prompt chunk, no
    # computed blocks; no priority preemption (one request lost its GPU blocks, r2, to CPU: preempted = 1)
    assert features_of(_trace()) == ["abort", "abort_swapped", "abort_waiting", "swap_out"]


def test_the_run_summary_states_the_v0_coverage_shares():
    # Four traces: the hand trace (swap_out), the same trace cut after step 1 (none of the six), and two
    # more, each with one more feature: a swap-in and a prefix hit.
    hand = _trace()
    cut = parse_trace_text("\n".join(json.dumps(e) for e in HAND_TRACE[:5]) + "\n", "cut.jsonl")
    outcomes = [
        TraceOutcome(index=0, verdict=PASS, steps=4, events=12, features=features_of(hand)),
        TraceOutcome(index=1, verdict=PASS, steps=1, events=4, features=features_of(cut)),
        TraceOutcome(index=2, verdict=PASS, steps=1, events=1, features=["swap_in", "swap_out"]),
        TraceOutcome(index=3, verdict=PASS, steps=1, events=1, features=["prefix_hit"]),
    ]
    assert features_of(cut) == []
    summary = {
        "spec": {"profile": "vllm-0.10"},
        "examples_run": 0,
        "passed": 0,
        "failed": 0,
        "unknown": 0,
        "discarded": 0,
        "features": {},
        "interrupted": False,
        "failures": [],
        "unknowns": [],
        "replay_s": 1.0,
    }
    for o in outcomes:
        _account(summary, o, None, [])  # type: ignore[arg-type]  # no failure, so no run folder is written
    _finish(summary, outcomes, 0.0)
    # swap_out: traces 0 and 2 of 4 = 0.5; swap_in: trace 2 = 0.25; prefix_hit: trace 3 = 0.25; the rest 0
    assert summary["coverage"] == {
        "swap_out": 0.5,
        "swap_in": 0.25,
        "recompute": 0.0,
        "ignored": 0.0,
        "partial_prefills": 0.0,
        "prefix_hit": 0.25,
    }
    assert summary["features"]["abort_swapped"] == 1 and summary["feature_shares"]["abort_waiting"] == 0.25


def test_a_v1_summary_has_no_v0_coverage():
    summary = {
        "spec": {"profile": "vllm-0.33"},
        "examples_run": 1,
        "passed": 1,
        "failed": 0,
        "unknown": 0,
        "discarded": 0,
        "features": {"preemption": 1},
        "interrupted": False,
        "failures": [],
        "unknowns": [],
        "replay_s": 1.0,
    }
    _finish(summary, [], 0.0)
    assert "coverage" not in summary
