"""impl/ with steps in flight: the fast scheduler's async rules by hand, and the overlapped engine.

Scheduler values are derived by hand in the comments from vLLM 0.33.0's
``scheduler.py`` / ``async_scheduler.py`` (the contract: async_contract.md);
the lockstep tests compare with the reference model; engine tokens are
compared with the dense oracle (``impl/dense.py``), never with the engine.

Notation: P = prompt length, C = num_computed, N = tokens (prompt + outputs),
PH = output placeholders, IF = in-flight tokens, ST = stale tokens. Entries
are ``(request, n, computed before, N + PH at scheduling, new blocks)``.
With prefix caching off the free queue starts ``[1, 2, ...]`` and freed
blocks go to its front, the table's tail first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schedconf.conformance.adapters.impl import ImplEngineSut, ImplSchedulerSut
from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import FAIL, PASS, render_divergence, replay
from schedconf.conformance.sut import SutInputError, SutUnsupported
from schedconf.conformance.traces.trace import Trace
from schedconf.conformance.workloads.datadriven import parse_file, parse_tokens
from schedconf.conformance.workloads.generate import random_workload
from schedconf.conformance.workloads.workload import run_workload
from schedconf.gpu_checks.async_check import main as async_check_main
from schedconf.gpu_checks.async_check import random_async_workload, run_overlapped_workload
from schedconf.impl.dense import dense_generate
from schedconf.impl.engine import Engine
from schedconf.impl.scheduler import PREEMPTED, FastScheduler
from schedconf.spec.errors import InvalidConfig, InvalidEvent
from schedconf.spec.v1.config import SchedulerConfig

ROOT = Path(__file__).parents[2]
SCENARIOS = sorted((ROOT / "conformance" / "testdata" / "scenarios").glob("*.txt"))
IN_FLIGHT_SCENARIOS = (
    "async_placeholders.txt",
    "async_stale_output.txt",
    "in_flight_plain.txt",
    "reset_prefix_cache.txt",
    "knobs_0_32.txt",
)


def _sched(profile: str = "vllm-0.33-async", **overrides: Any) -> FastScheduler:
    config = dict(
        block_size=4,
        num_gpu_blocks=9,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        max_model_len=16,
        enable_prefix_caching=False,
        max_concurrent_batches=2,
    )
    config.update(overrides)
    return FastScheduler(SchedulerConfig(**config), profile)


def _entries(out) -> list[tuple[str, int, int, int, list[int]]]:
    return [(r.req_id, n, before, ntok, list(blocks)) for r, n, before, ntok, blocks in out.entries]


def _counters(sched: FastScheduler, rid: str) -> tuple[int, int, int, int, int]:
    r = sched.requests[rid]
    return r.num_computed, len(r.tokens), r.placeholders, r.in_flight, r.stale


def _refused(fn, *args, **kwargs) -> str:
    with pytest.raises(InvalidEvent) as info:
        fn(*args, **kwargs)
    return info.value.code


def _state(sched: FastScheduler) -> tuple:
    """Everything a refusal must leave unchanged."""
    return (
        sched.observe(),
        sched.waiting_ids(),
        [r.req_id for r in sched.running],
        sched.current_step,
        [o.step for o in sched.in_flight],
        {rid: (_counters(sched, rid), r.status) for rid, r in sched.requests.items()},
    )


# ----------------------------------------------------------------- the fast scheduler, by hand


def test_placeholders_skip_rule_and_output_refusals_by_hand():
    sched = _sched()
    sched.add_request("r0", range(4), max_tokens=3)  # P 4, P + max_tokens = 7
    # Step 1: the whole prompt, block 1; C 4 = N: it samples, so PH 0 -> 1, IF 4.
    s1 = sched.schedule()
    assert _entries(s1) == [("r0", 4, 0, 4, [1])]
    assert _counters(sched, "r0") == (4, 4, 1, 4, 0)
    # Step 2 before step 1's output: skip rule 4 + 2 - 1 = 5 < 7, so
    # n = N 4 + PH 1 - C 4 = 1 at position 4: a second block (5 slots > 4).
    # The cached data's num_output_tokens = outputs 0 + PH 1 = 1.
    s2 = sched.schedule()
    assert _entries(s2) == [("r0", 1, 4, 5, [2])]
    assert s2.to_canonical()["scheduled_cached_reqs"][0]["num_output_tokens"] == 1
    assert _counters(sched, "r0") == (5, 4, 2, 5, 0)
    # Two steps in flight = max_concurrent_batches: refused, and so are outputs
    # out of order or for steps never scheduled; none changes anything.
    before = _state(sched)
    assert _refused(sched.schedule) == "output_not_processed"
    assert _refused(sched.get_in_flight_output, 2) == "model_output_out_of_order"
    assert _refused(sched.get_in_flight_output, 3) == "unscheduled_step"
    assert _refused(sched.get_in_flight_output, 0) == "unscheduled_step"
    assert _refused(sched.update_from_output, s2, [[101]]) == "unexpected_model_output"
    assert _state(sched) == before
    assert sched.get_in_flight_output(1) is s1
    # Step 1's output: token 100 (N 5), PH 2 -> 1, IF 5 - 4 = 1.
    assert sched.update_from_output(s1, [[100]]) == [("r0", [100], None, None)]
    assert _counters(sched, "r0") == (5, 5, 1, 1, 0)
    assert _refused(sched.get_in_flight_output, 1) == "duplicate_model_output"
    # Step 3: skip rule 5 + 2 - 1 = 6 < 7; n = 5 + 1 - 5 = 1 (position 5, block 2).
    s3 = sched.schedule()
    assert _entries(s3) == [("r0", 1, 5, 6, [])]
    assert s3.to_canonical()["scheduled_cached_reqs"][0]["num_output_tokens"] == 2  # 1 output + 1 PH
    assert sched.update_from_output(s2, [[101]]) == [("r0", [101], None, None)]
    assert _counters(sched, "r0") == (6, 6, 1, 1, 0)
    # Step 4: 6 + 2 - 1 = 7 >= 7: step 3 will sample the last token; skipped.
    s4 = sched.schedule()
    assert _entries(s4) == [] and s4.total_num_scheduled_tokens == 0
    # Step 3's output: 3 outputs = max_tokens: length; r0 is freed.
    assert sched.update_from_output(s3, [[102]]) == [("r0", [102], "length", None)]
    assert "r0" not in sched.requests and sched.running == []
    assert sched.update_from_output(s4, []) == []
    assert sched.pool.free_queue() == [2, 1, 3, 4, 5, 6, 7, 8]  # table [1, 2] freed tail first, to the front


def test_preemption_with_steps_in_flight_makes_stale_output_by_hand():
    # 4 usable blocks of 4; up to three steps in flight.
    sched = _sched(num_gpu_blocks=5, max_num_batched_tokens=32, max_concurrent_batches=3)
    sched.add_request("r0", range(8), max_tokens=8)
    sched.add_request("r1", range(100, 108), max_tokens=8)
    sched.add_request("r2", range(200, 203), max_tokens=8)
    # Step 1: r0 [1, 2] and r1 [3, 4] (8 tokens each); r2 needs a block, none free.
    s1 = sched.schedule()
    assert _entries(s1) == [("r0", 8, 0, 8, [1, 2]), ("r1", 8, 0, 8, [3, 4])]
    assert _counters(sched, "r1") == (8, 8, 1, 8, 0)
    # Step 2: r0's position 8 needs a third block, none free: the FCFS victim
    # is the tail, r1, with step 1 in flight: ST = IF = 8, PH 0, C 0, back to
    # the head of waiting; its table [3, 4] goes to the front tail first ->
    # [4, 3]; r0 takes 4. No waiting loop in a step that preempted.
    s2 = sched.schedule()
    assert _entries(s2) == [("r0", 1, 8, 9, [4])]
    assert sched.requests["r1"].status == PREEMPTED
    assert _counters(sched, "r1") == (0, 8, 0, 8, 8)
    assert sched.waiting_ids() == ["r1", "r2"]
    # Step 3 (steps 1, 2 in flight): r0 n = 8 + 2 - 9 = 1 at position 9 (block 4).
    # Waiting loop: r1 has stale output in flight: skipped; r2 (3 tokens, one
    # block; free [3]) is admitted; r1 is put back at the head.
    s3 = sched.schedule()
    assert _entries(s3) == [("r0", 1, 9, 10, []), ("r2", 3, 0, 3, [3])]
    assert sched.waiting_ids() == ["r1"]
    # Step 1's output: r1's token is stale: appended (N 9), no counter moves
    # but IF 8 -> 0 and ST 8 -> 0; r0: IF 10 - 8 = 2, PH 3 -> 2.
    assert sched.update_from_output(s1, [[50], [60]]) == [("r0", [50], None, None), ("r1", [60], None, None)]
    assert _counters(sched, "r1") == (0, 9, 0, 0, 0)
    assert sched.requests["r1"].status == PREEMPTED
    assert _counters(sched, "r0") == (10, 9, 2, 2, 0)
    assert sched.num_stale_outputs == 1


def test_a_stale_token_that_stops_a_preempted_request_removes_it_from_waiting():
    sched = _sched(num_gpu_blocks=5, max_num_batched_tokens=32)
    sched.add_request("r0", range(8), max_tokens=8)
    sched.add_request("r1", range(100, 108), max_tokens=1)
    s1 = sched.schedule()  # as above: r0 [1, 2], r1 [3, 4]
    s2 = sched.schedule()  # r1 preempted with step 1 in flight (ST 8)
    assert _entries(s2) == [("r0", 1, 8, 9, [4])] and sched.waiting_ids() == ["r1"]
    # r1's stale token is its first output = max_tokens: length; it leaves waiting.
    outs = sched.update_from_output(s1, [[50], [60]])
    assert outs == [("r0", [50], None, None), ("r1", [60], "length", None)]
    assert sched.waiting_ids() == [] and "r1" not in sched.requests
    s3 = sched.schedule()
    assert s3.to_canonical()["finished_req_ids"] == ["r1"]


def test_plain_profile_with_steps_in_flight_pipelines_prefill_and_skips_decodes_by_hand():
    # Pipeline parallelism's batch queue: the plain Scheduler, no placeholders.
    sched = _sched("vllm-0.33", max_num_batched_tokens=4)
    sched.add_request("r0", range(10), max_tokens=2)
    s1 = sched.schedule()  # chunk [0, 4): C 4 < N 10
    s2 = sched.schedule()  # step 1 in flight: next chunk [4, 8)
    assert _entries(s1) == [("r0", 4, 0, 10, [1])] and _entries(s2) == [("r0", 4, 4, 10, [2])]
    assert _counters(sched, "r0") == (8, 10, 0, 8, 0)
    assert sched.update_from_output(s1, [[]]) == []
    s3 = sched.schedule()  # last chunk [8, 10): it samples
    assert _entries(s3) == [("r0", 2, 8, 10, [3])]
    assert sched.update_from_output(s2, [[]]) == []
    # Step 4: n = N 10 + PH 0 - C 10 = 0 while step 3 samples: skipped.
    s4 = sched.schedule()
    assert _entries(s4) == []
    assert sched.update_from_output(s3, [[7]]) == [("r0", [7], None, None)]
    s5 = sched.schedule()  # now N 11: one decode token
    assert _entries(s5) == [("r0", 1, 10, 11, [])]


def test_cache_blocks_after_an_update_counts_only_settled_tokens():
    # Blocks of 2, prefix caching on. Step 1 schedules the prompt [1, 2, 3]
    # (blocks [1, 2]; block 1 is full and cached when scheduled); step 2 its
    # first decode (position 3, block 2). Step 1's output (token 7) fills
    # block 2 with [3, 7], but step 2 is in flight (IF 1): 0.33 caches up to
    # C 4 - IF 1 = 3 tokens, one block, so block 2 stays uncached; step 2's
    # output settles it (4 - 0 = 4: two blocks). 0.32's AsyncScheduler caches
    # up to C - PH, the same counts here; plain 0.32 never caches after an update.
    for profile, cached_at_the_end in (("vllm-0.33-async", True), ("vllm-0.32-async", True), ("vllm-0.32", False)):
        sched = _sched(profile, block_size=2, enable_prefix_caching=True)
        sched.add_request("r0", [1, 2, 3], max_tokens=5)
        s1 = sched.schedule()
        if profile == "vllm-0.32":  # plain: the decode waits for step 1's token
            assert sched.update_from_output(s1, [[7]]) == [("r0", [7], None, None)]
            s2 = sched.schedule()
            assert sched.pool.block_hash[2] is not None  # cached when step 2 was scheduled (C + n = 4)
            sched.update_from_output(s2, [[8]])
            continue
        s2 = sched.schedule()
        assert _entries(s2) == [("r0", 1, 3, 4, [])]
        assert sched.pool.block_hash[1] is not None and sched.pool.block_hash[2] is None
        sched.update_from_output(s1, [[7]])
        assert sched.pool.block_hash[2] is None, profile
        sched.update_from_output(s2, [[8]])
        assert (sched.pool.block_hash[2] is not None) == cached_at_the_end, profile


def test_request_id_in_flight_covers_every_step_in_flight():
    sched = _sched()
    sched.add_request("r0", range(4), max_tokens=5)
    s1 = sched.schedule()
    s2 = sched.schedule()  # r0 in both steps
    assert sched.abort("r0") == ["r0"]
    # r0 was aborted while steps 1 and 2 scheduled it: a new r0 is refused
    # until both outputs are applied (they are ignored: r0 is gone).
    assert _refused(sched.add_request, "r0", [5], max_tokens=1) == "request_id_in_flight"
    assert sched.update_from_output(s1, [[9]]) == []
    assert _refused(sched.add_request, "r0", [5], max_tokens=1) == "request_id_in_flight"
    assert sched.update_from_output(s2, [[9]]) == []
    sched.add_request("r0", [5], max_tokens=1)
    assert sched.waiting_ids() == ["r0"]


def test_reset_prefix_cache_drops_the_output_in_flight_and_resumes_at_once_by_hand():
    sched = _sched(enable_prefix_caching=True)
    sched.add_request("r0", range(4), max_tokens=5)
    s1 = sched.schedule()  # (r0, 4, 0, 4, [1]); block 1 is full: cached when scheduled
    s2 = sched.schedule()  # (r0, 1, 4, 5, [2]); PH 2, IF 5
    assert sched.pool.block_hash[1] is not None
    # r0 holds blocks: a plain reset fails and changes nothing.
    before = _state(sched)
    assert sched.reset_prefix_cache(False) is False
    assert _state(sched) == before and sched.pool.block_hash[1] is not None
    # Resetting the running requests preempts r0 with its output dropped
    # (ST = IF 5); its table [1, 2] goes back tail first: 2 (no hash) to the
    # front, 1 (hashed) to the back; then every hash is forgotten, the queue
    # keeps its order.
    assert sched.reset_prefix_cache(True) is True
    assert _counters(sched, "r0") == (0, 4, 0, 5, 5) and sched.requests["r0"].drop_stale
    assert sched.pool.free_queue() == [2, 3, 4, 5, 6, 7, 8, 1] and sched.pool.cached == {}
    assert all(h is None for h in sched.pool.block_hash)
    # Step 1's output is stale and dropped: no token, IF 1, ST 1.
    assert sched.update_from_output(s1, [[100]]) == []
    assert _counters(sched, "r0") == (0, 4, 0, 1, 1)
    # Step 3: r0 has stale output in flight, but dropped: it resumes now, its
    # 4 tokens re-prefilled (no hit after the reset) into the front block 2.
    s3 = sched.schedule()
    assert _entries(s3) == [("r0", 4, 0, 4, [2])]
    c3 = s3.to_canonical()
    assert c3["preempted_req_ids"] == ["r0"]
    assert c3["scheduled_cached_reqs"] == [
        {"req_id": "r0", "resumed": True, "new_block_ids": [2], "num_computed_tokens": 0, "num_output_tokens": 0}
    ]
    assert sched.update_from_output(s2, [[101]]) == []  # the last dropped share: ST 1 -> 0
    assert sched.update_from_output(s3, [[102]]) == [("r0", [102], None, None)]
    assert _counters(sched, "r0") == (4, 5, 0, 0, 0)


def test_0_32_scheduler_knobs_by_hand():
    # max_num_active_seqs caps admissions (RUNNING requests) below max_num_seqs.
    sched = _sched("vllm-0.33", max_num_active_seqs=1)
    sched.add_request("r0", range(4), max_tokens=2)
    sched.add_request("r1", range(4), max_tokens=2)
    assert [e[0] for e in _entries(sched.schedule())] == ["r0"]
    # The adaptive threshold: with 2 requests present the cap 2 is floored at
    # 16 // 2 = 8: each 10-token prompt gets an 8-token chunk (without it: 2).
    for adaptive, chunk in ((True, 8), (False, 2)):
        sched = _sched(
            "vllm-0.33",
            num_gpu_blocks=20,
            max_model_len=32,
            long_prefill_token_threshold=2,
            long_prefill_token_threshold_adaptive=adaptive,
        )
        sched.add_request("r0", range(10), max_tokens=2)
        sched.add_request("r1", range(20, 30), max_tokens=2)
        assert [(e[0], e[1]) for e in _entries(sched.schedule())] == [("r0", chunk), ("r1", chunk)]
    # The V2 model runner lists a resumed request after the new ones, as a new
    # request with its whole table (here: preempted by a reset, then resumed).
    sched = _sched(use_v2_model_runner=True)
    sched.add_request("r0", range(4), max_tokens=5)
    sched.update_from_output(sched.schedule(), [[7]])  # r0: 4 tokens in block [1], then 5 tokens
    assert sched.reset_prefix_cache(True) is True  # r0 preempted (nothing in flight); block 1 back to the front
    sched.add_request("r1", range(50, 53), max_tokens=5)
    # Waiting: r0 (at the head) takes [1, 2] for its 5 tokens, r1 then [3];
    # the output lists the new r1 first, then r0.
    c = sched.schedule().to_canonical()
    assert c["scheduled_new_reqs"] == [
        {"req_id": "r1", "block_ids": [3], "num_computed_tokens": 0},
        {"req_id": "r0", "block_ids": [1, 2], "num_computed_tokens": 0},
    ]
    assert c["scheduled_cached_reqs"] == []


def test_async_spec_decode_placeholder_drafts_and_rejections_by_hand():
    # vllm-0.33-async, k = 2, blocks of 4 (free queue [1..8]); P 4, max_tokens 8: P + max_tokens = 12.
    for profile in ("vllm-0.33-async", "vllm-0.32-async"):
        sched = _sched(profile, num_spec_tokens=2, max_model_len=32)
        sched.add_request("r0", range(4), max_tokens=8)
        r0 = sched.requests["r0"]
        # Step 1: the prompt (no padding: nothing runs, no hit), block 1. Not a
        # prefill chunk: PH 0 -> 1 and the worker's next drafts are [-1, -1].
        s1 = sched.schedule()
        assert _entries(s1) == [("r0", 4, 0, 4, [1])] and s1.spec_tokens == {}
        assert _counters(sched, "r0") == (4, 4, 1, 4, 0) and r0.spec == [-1, -1]
        # Step 2, step 1 in flight: skip rule 4 + 2 - 1 = 5 < 12; n = N 4 + drafts 2
        # + PH 1 - C 4 = 3; drafts scheduled n + C - N - PH = 3 + 4 - 4 - 1 = 2: [-1, -1];
        # positions 4..6 -> block 2. PH 1 + 1 + 2 = 4.
        s2 = sched.schedule()
        assert _entries(s2) == [("r0", 3, 4, 5, [2])] and s2.spec_tokens == {"r0": [-1, -1]}
        assert s2.to_canonical()["scheduled_spec_decode_tokens"] == {"r0": [-1, -1]}
        assert _counters(sched, "r0") == (7, 4, 4, 7, 0) and r0.spec == [-1, -1]
        # Drafts under async scheduling are refused (the engine core never hands
        # them over), an empty list is not; an async request that samples must
        # return a token. Nothing changes.
        before = _state(sched)
        assert _refused(sched.validate_model_output, s1, {"r0": [100]}, {"r0": [7]}) == "drafts_under_async_scheduling"
        assert _refused(sched.validate_model_output, s1, {}, {}) == "bad_num_sampled_tokens"
        sched.validate_model_output(s1, {"r0": [100]}, {"r0": []})
        assert _state(sched) == before
        # Step 1's output: [100]: IF 7 - 4 = 3, PH 4 - 1 = 3, N 5.
        assert sched.update_from_output(s1, [[100]]) == [("r0", [100], None, None)]
        assert _counters(sched, "r0") == (7, 5, 3, 3, 0)
        # Step 3: 7 + 2 - 3 = 6 < 12; n = 5 + 2 + 3 - 7 = 3, drafts 7 + 3 - 5 - 3 = 2; block 3 (positions 7..9).
        s3 = sched.schedule()
        assert _entries(s3) == [("r0", 3, 7, 8, [3])] and s3.spec_tokens == {"r0": [-1, -1]}
        assert _counters(sched, "r0") == (10, 5, 6, 6, 0)
        # Step 2's output: 1 of 2 drafts accepted (2 tokens): rejected 1 rolls
        # back C 10 -> 9 and PH 6 -> 5; the two tokens resolve 2: PH 3. C = N + PH - 1.
        assert sched.update_from_output(s2, [[101, 102]]) == [("r0", [101, 102], None, None)]
        assert _counters(sched, "r0") == (9, 7, 3, 3, 0)
        # Step 4: 9 + 2 - 3 = 8 < 12; n = 7 + 2 + 3 - 9 = 3, drafts 2; positions 9..11: no new block.
        s4 = sched.schedule()
        assert _entries(s4) == [("r0", 3, 9, 10, [])]
        # Step 3's output: both drafts rejected: C 12 - 2 = 10, PH 6 - 2 - 1 = 3.
        assert sched.update_from_output(s3, [[103]]) == [("r0", [103], None, None)]
        assert _counters(sched, "r0") == (10, 8, 3, 3, 0)
        # Step 5: n = 8 + 2 + 3 - 10 = 3 (positions 10..12: block 4). Step 4's output: both accepted.
        s5 = sched.schedule()
        assert _entries(s5) == [("r0", 3, 10, 11, [4])]
        assert sched.update_from_output(s4, [[104, 105, 106]]) == [("r0", [104, 105, 106], None, None)]
        assert _counters(sched, "r0") == (13, 11, 3, 3, 0)
        # Step 6: 13 + 2 - 3 = 12 >= 12: step 5 is sure to reach max_tokens: skipped.
        s6 = sched.schedule()
        assert _entries(s6) == []
        # Step 5's output [107, 108, 109]: 107 makes N 12 = P + max_tokens: length;
        # 108 and 109 are dropped. 0.33 trims C by them (13 -> 11) and resolves
        # all 3 placeholders (PH 0); 0.32 does neither: C 13, PH 3 - 1 kept = 2.
        assert sched.update_from_output(s5, [[107, 108, 109]]) == [("r0", [107], "length", None)]
        expected = (11, 0) if profile == "vllm-0.33-async" else (13, 2)
        assert (r0.num_computed, r0.placeholders) == expected, profile
        assert "r0" not in sched.requests and sched.update_from_output(s6, []) == []
        assert sched.pool.free_queue() == [4, 3, 2, 1, 5, 6, 7, 8]  # table freed tail first, to the front


def test_async_spec_decode_drafts_scheduled_count_the_placeholders_by_hand():
    # Budget 2: a decode whose previous step is in flight is cut; its drafts
    # are what the cut leaves past N + PH, not past N (the contract's mutant).
    sched = _sched(num_spec_tokens=2, max_num_batched_tokens=2, max_num_seqs=2, max_model_len=32)
    sched.add_request("r0", range(2), max_tokens=8)
    assert _entries(sched.schedule()) == [("r0", 2, 0, 2, [1])]  # PH 1, drafts [-1, -1] for the next step
    # Step 2: n = 2 + 2 + 1 - 2 = 3, cut to the budget 2; drafts 2 + 2 - 2 - 1 = 1
    # (without "- PH": 2, all of them). PH 1 + 1 + 1 = 3; drafts for next: [-1, -1].
    s2 = sched.schedule()
    assert _entries(s2) == [("r0", 2, 2, 3, [])] and s2.spec_tokens == {"r0": [-1]}
    assert _counters(sched, "r0") == (4, 2, 3, 4, 0) and sched.requests["r0"].spec == [-1, -1]
    # A preemption clears the drafts and the placeholders.
    sched._preempt(sched.running.pop())
    assert _counters(sched, "r0") == (0, 2, 0, 4, 4) and sched.requests["r0"].spec == []


def test_config_refusals():
    _sched(num_spec_tokens=2)  # async + spec decode: modelled
    _sched("vllm-0.32-async", num_spec_tokens=3, max_concurrent_batches=3)
    with pytest.raises(InvalidConfig) as info:
        _sched(max_concurrent_batches=0)
    assert info.value.code == "invalid_max_concurrent_batches"
    with pytest.raises(InvalidConfig) as info:  # the model's check_config_for_profile: not modelled yet
        _sched("vllm-0.33", num_spec_tokens=2)
    assert info.value.code == "in_flight_not_modelled"
    _sched("vllm-0.33", num_spec_tokens=2, max_concurrent_batches=1)


# ----------------------------------------------------------------- against the reference


class _Lockstep:
    """Runs scenario commands on the reference and on impl (``model-output step=N`` included)."""

    def __init__(self) -> None:
        self.ref: ReferenceSut | None = None
        self.impl: ImplSchedulerSut | None = None
        self.compared = 0

    @staticmethod
    def _call(sut: Any, method: str, *args: Any, **kwargs: Any) -> tuple[str, Any]:
        try:
            return "ok", getattr(sut, method)(*args, **kwargs)
        except SutInputError as exc:
            return "error", exc.code

    def run(self, command: str) -> None:
        name, *args = command.split()
        if name == "config":
            kv = dict(a.split("=", 1) for a in args)
            profile = kv.pop("profile", "vllm-0.33")
            fields = {
                k: (v if k == "policy" else (v == "true") if v in ("true", "false") else int(v)) for k, v in kv.items()
            }
            self.ref, self.impl = ReferenceSut(), ImplSchedulerSut()
            ref = self._call(self.ref, "start", fields, profile)
            try:
                got = self._call(self.impl, "start", fields, profile)
            except SutUnsupported:  # vllm-0.11: not comparable, on to the next config
                self.ref = self.impl = None
                return
            assert got == ref, command
            if ref[0] == "error":
                self.ref = self.impl = None
            return
        if self.ref is None or self.impl is None:
            return
        calls: list[tuple[str, tuple, dict]]
        if name == "add-request":
            rid, *rest = args
            opts = dict((a.partition("=")[0], a.partition("=")[2]) for a in rest)
            event = {
                "request_id": rid,
                "prompt_token_ids": parse_tokens(opts["prompt"]),
                "max_tokens": int(opts["max-tokens"]),
                "priority": int(opts.get("priority", 0)),
                "arrival_time": int(opts.get("arrival", 0)),
                "eos_token_id": int(opts["eos"]) if "eos" in opts else None,
                "ignore_eos": "ignore-eos" in opts,
                "stop_token_ids": parse_tokens(opts.get("stop", "-")),
                "min_tokens": int(opts.get("min-tokens", 0)),
            }
            calls = [("add_request", (event,), {})]
        elif name == "abort":
            calls = [("abort", (args[0],), {})]
        elif name in ("schedule", "step", "model-output"):
            sampled: dict[str, list[int]] = {}
            drafts: dict[str, list[int]] = {}
            step = None
            for a in args:
                key, _, value = a.partition("=")
                if key == "step":
                    step = int(value)
                else:
                    target = drafts if key.startswith("drafts:") else sampled
                    target[key.removeprefix("drafts:")] = parse_tokens(value)
            calls = [] if name == "model-output" else [("schedule", (), {})]
            if name != "schedule":
                calls.append(("update_from_output", (sampled, drafts), {"step": step}))
        elif name in ("blocks", "queues"):
            calls = [("observe", (), {})]
        elif name == "reset-prefix-cache":
            calls = [("reset_prefix_cache", ("running" in args,), {})]
        elif name == "stats":
            return  # the model's SchedulerStats: not part of the scheduler-under-test interface
        elif name == "finish":
            # finish_requests with an engine's status is the model's API, not the scheduler-under-test
            # interface (which aborts only): the rest of the file is not comparable
            self.ref = self.impl = None
            return
        else:
            raise AssertionError(f"unknown command {name}")
        for method, call_args, kwargs in calls:
            expected = self._call(self.ref, method, *call_args, **kwargs)
            actual = self._call(self.impl, method, *call_args, **kwargs)
            assert actual == expected, f"{command}: {method}"
            if method == "schedule" and expected[0] == "ok":
                assert self.impl.observe() == self.ref.observe(), f"{command}: free queue"
            self.compared += 1


def test_golden_scenarios_in_lockstep_with_the_reference():
    """Every command of every golden scenario (steps in flight, resets, the 0.32 knobs included) as the reference."""
    compared: dict[str, int] = {}
    for path in SCENARIOS:
        _, blocks = parse_file(path)
        runner = _Lockstep()
        for block in blocks:
            runner.run(block.command)
        compared[path.name] = runner.compared
    assert all(compared[name] >= 10 for name in IN_FLIGHT_SCENARIOS), compared
    assert sum(n > 1 for n in compared.values()) >= len(SCENARIOS) - 2  # the vllm-0.11-only files are not comparable


@pytest.mark.parametrize("profile", ["vllm-0.33-async", "vllm-0.33", "vllm-0.32"])
def test_generated_in_flight_workloads_replay_strict(profile):
    """conformance/workloads/generate.py workloads (async profile: 2-3 steps in flight; plain: some with a batch queue)."""
    failures: list[str] = []
    in_flight = 0
    for seed in range(150):
        trace = run_workload(random_workload(seed, profile))
        in_flight += trace.config.get("max_concurrent_batches", 1) > 1
        result = replay(trace, ImplSchedulerSut(), "strict")
        if result.verdict != PASS and len(failures) < 3:
            failures.append(render_divergence(trace, result))
    assert not failures, "\n\n".join(failures)
    assert in_flight >= (100 if profile.endswith("-async") else 10)


def get_spec_decode_traces(profile: str, seeds: int) -> Iterator[Trace]:
    """Generated workloads of ``profile`` with 1 to 3 speculative tokens (by seed), those impl's scheduler
    accepts the config of, run by the reference."""
    from dataclasses import replace as dc_replace

    for seed in range(seeds):
        workload = random_workload(seed, profile)
        config = dc_replace(workload.config, num_spec_tokens=1 + seed % 3)
        try:
            FastScheduler(config, profile)
        except InvalidConfig:
            continue
        yield run_workload(workload.replace(config=config))


@pytest.mark.parametrize("profile", ["vllm-0.33-async", "vllm-0.32-async"])
def test_generated_async_spec_decode_workloads_replay_strict(profile):
    """Async + spec decode (k = 1..3, 1-3 steps in flight): placeholder drafts, the worker's acceptance."""
    failures: list[str] = []
    multi = 0
    for trace in get_spec_decode_traces(profile, 100):
        multi += sum(
            len(t) > 1 for e in trace.events if e["kind"] == "model_output" for t in e["sampled_token_ids"].values()
        )
        result = replay(trace, ImplSchedulerSut(), "strict")
        if result.verdict != PASS and len(failures) < 3:
            failures.append(render_divergence(trace, result))
    assert not failures, "\n\n".join(failures)
    assert multi > 100  # outputs with accepted drafts


# ----------------------------------------------------------------- the engine


def test_overlapped_engine_tokens_equal_the_dense_oracle(tiny_model):
    """Async profiles on the worker thread (2 and 3 steps in flight), a plain batch queue, the sync loop, a reset."""
    seen = {"holes_from_runner": 0, "preemptions": 0, "stale": 0, "repaired": 0}
    variants = [
        ("vllm-0.33-async", 2, True, None),
        ("vllm-0.32-async", 2, True, None),
        ("vllm-0.33-async", 3, True, None),
        ("vllm-0.33", 2, True, None),
        ("vllm-0.33-async", 2, False, None),
        ("vllm-0.33-async", 2, True, 4),
    ]  # reset_prefix_cache(True) at the 5th call: dropped output
    for seed in range(12):
        config, arrivals = random_async_workload(seed)
        for profile, batches, overlap, reset_at in variants:
            engine = run_overlapped_workload(
                tiny_model, {**config, "max_concurrent_batches": batches}, arrivals, profile, overlap, reset_at
            )
            for record in engine.records:
                dense = dense_generate(
                    tiny_model, record.prompt, record.max_tokens, max_model_len=40, eos_token_id=record.eos_token_id
                )
                assert record.output_tokens == dense.tokens, (seed, profile, batches, record.req_id)
                assert record.finish_reason == dense.finish_reason
            seen["holes_from_runner"] += engine.runner.num_holes_from_runner
            seen["preemptions"] += engine.scheduler.num_preemptions
            seen["stale"] += engine.scheduler.num_stale_outputs
            seen["repaired"] += engine.stats.num_repaired_tokens
    # The placeholder inputs came from the runner (the scheduler did not have
    # them yet), and preemptions with steps in flight delivered stale tokens.
    assert seen["holes_from_runner"] > 100 and seen["preemptions"] > 10 and seen["stale"] > 0, seen


def test_overlapped_loop_runs_the_forward_on_the_worker_while_scheduling(tiny_model):
    """Step N+1 is scheduled before step N's output is applied, with N's forward on another thread."""
    import threading

    config, arrivals = random_async_workload(3)
    engine = Engine(SchedulerConfig(**config, max_concurrent_batches=2), tiny_model, profile="vllm-0.33-async")
    threads: set[str] = set()
    run = engine.runner.run

    def spy(step, **kwargs):
        threads.add(threading.current_thread().name)
        return run(step, **kwargs)

    engine.runner.run = spy  # type: ignore[method-assign]
    in_flight_after_schedule: list[int] = []
    schedule = engine.schedule

    def count():
        out = schedule()
        in_flight_after_schedule.append(len(engine.scheduler.in_flight))
        return out

    engine.schedule = count  # type: ignore[method-assign]
    for _, rid, prompt, kwargs in arrivals:
        engine.add_request(rid, prompt, **kwargs)
    while engine.has_requests() or engine.batch_queue:
        engine.step_overlapped()
    engine.close()
    assert max(in_flight_after_schedule) == 2 and in_flight_after_schedule.count(2) > len(in_flight_after_schedule) / 2
    assert threads and all(name.startswith("impl-forward") for name in threads)


def test_teacher_forced_engine_adapter_replays_async_traces():
    """impl-engine on async traces: scheduler outputs as the trace, logits as the dense forward."""
    checked = holes = 0
    for seed in range(25):
        trace = run_workload(random_workload(seed, "vllm-0.33-async"))
        sut = ImplEngineSut()
        unresolved: list[Any] = []
        result = replay(trace, _spy_holes(sut, unresolved), "strict")
        assert result.verdict == PASS, render_divergence(trace, result)
        assert not sut.failures
        checked += sut.num_checked_positions
        holes += sut.runner.num_holes_from_scheduler
        # Teacher forced, a placeholder is the trace's token, except where the
        # request ended before that token came (its later outputs are dropped).
        assert all(req.is_finished for req in unresolved)
    assert checked > 200 and holes > 100


def _spy_holes(sut: ImplEngineSut, unresolved: list[Any]) -> ImplEngineSut:
    """Record the requests whose placeholder input the trace never supplied (after ``start``)."""
    start = sut.start

    def start_and_spy(config: dict[str, Any], profile: str) -> None:
        start(config, profile)
        run = sut.runner.run

        def spy(step, **kwargs):
            unresolved.extend(req for _, req, pos in step.hole_rows if pos >= len(req.tokens))
            return run(step, **kwargs)

        sut.runner.run = spy

    sut.start = start_and_spy  # type: ignore[method-assign]
    return sut


class _WrongPlaceholderSut(ImplEngineSut):
    """Fills placeholder inputs with a wrong token: the dense check must notice."""

    def start(self, config: dict[str, Any], profile: str) -> None:
        super().start(config, profile)
        run = self.runner.run

        def corrupt(step, **kwargs):
            if step.hole_rows:
                step.ids = list(step.ids)
                for row, req, pos in step.hole_rows:
                    step.ids[row] = (req.tokens[pos] + 1) if pos < len(req.tokens) else 0
                step.hole_rows = []
            return run(step, **kwargs)

        self.runner.run = corrupt


def test_teacher_forced_adapter_detects_wrong_placeholder_inputs():
    from dataclasses import replace as dc_replace

    failed = 0
    for seed in range(10):
        workload = random_workload(seed, "vllm-0.33-async")  # without spec decode: the holes are hole_rows
        trace = run_workload(workload.replace(config=dc_replace(workload.config, num_spec_tokens=0)))
        sut = _WrongPlaceholderSut()
        result = replay(trace, sut, "strict")
        failed += result.verdict == FAIL or bool(sut.failures)
        if result.verdict == FAIL:
            assert (
                "EngineMismatch" in result.detail or "engine logits" in result.detail or "greedy token" in result.detail
            ), result.detail
    assert failed >= 5


class _OracleDrafter:
    """Drafts from the dense oracle's sequence (some made wrong): many accepted, some rejected midway."""

    def __init__(self, truth: dict[str, list[int]], k: int) -> None:
        self.truth, self.k = truth, k
        self.lengths: dict[str, tuple[int, int]] = {}

    def propose(self, req_id: str, tokens: list[int], new_tokens: list[int], limit: int) -> list[int]:
        n, last = self.lengths.get(req_id, (len(tokens), tokens[-1] if tokens else -1))
        n += len(new_tokens)
        self.lengths[req_id] = (n, new_tokens[-1] if new_tokens else last)
        drafts = self.truth[req_id][n : n + min(limit, self.k)]
        return [t + 1 if (n + j) % 5 == 3 else t for j, t in enumerate(drafts)]  # every 5th position wrong

    def context_tail(self, req_id: str) -> tuple[int, int] | None:
        return self.lengths.get(req_id)

    def forget(self, req_id: str) -> None:
        self.lengths.pop(req_id, None)


def test_overlapped_engine_with_async_spec_decode_equals_the_dense_oracle(tiny_model):
    """AsyncScheduler + spec decode: the runner's drafts replace the -1s, positions move back over rejections."""
    seen = {"shifted": 0, "substituted": 0, "accepted": 0, "holes_from_runner": 0, "stale": 0}
    # (profile, steps in flight, k, overlapped loop, reset at call, oracle drafter)
    variants = [
        ("vllm-0.33-async", 2, 2, True, None, False),
        ("vllm-0.32-async", 2, 3, True, None, False),
        ("vllm-0.33-async", 3, 3, True, None, True),
        ("vllm-0.32-async", 2, 2, True, None, True),
        ("vllm-0.33-async", 2, 1, False, None, True),
        ("vllm-0.33-async", 2, 2, True, 4, True),
    ]  # reset_prefix_cache(True): dropped output
    for seed in range(8):
        config, arrivals = random_async_workload(seed)
        dense = {
            rid: dense_generate(tiny_model, prompt, kw["max_tokens"], max_model_len=40, eos_token_id=kw["eos_token_id"])
            for _, rid, prompt, kw in arrivals
        }
        truth = {rid: list(prompt) + dense[rid].tokens for _, rid, prompt, _ in arrivals}
        for profile, batches, k, overlap, reset_at, oracle in variants:
            engine = run_overlapped_workload(
                tiny_model,
                {**config, "max_concurrent_batches": batches, "num_spec_tokens": k},
                arrivals,
                profile,
                overlap,
                reset_at,
                drafter=_OracleDrafter(truth, k) if oracle else None,
            )
            for record in engine.records:
                assert record.output_tokens == dense[record.req_id].tokens, (seed, profile, batches, k, record.req_id)
                assert record.finish_reason == dense[record.req_id].finish_reason
            seen["shifted"] += engine.runner.num_shifted_segments
            seen["substituted"] += engine.runner.num_drafts_substituted
            seen["accepted"] += engine.stats.num_drafts_accepted
            seen["holes_from_runner"] += engine.runner.num_holes_from_runner
            seen["stale"] += engine.scheduler.num_stale_outputs
    # Steps ran moved back over their predecessors' rejected drafts, with the
    # drafter's proposals in place of -1s, many accepted; tokens from the runner.
    assert seen["shifted"] > 200 and seen["substituted"] > 300 and seen["accepted"] > 150, seen
    assert seen["holes_from_runner"] > 100 and seen["stale"] > 0, seen


class _UnshiftedRunnerSut(ImplEngineSut):
    """A runner that forgets to move a step back over the drafts its predecessors rejected."""

    def start(self, config: dict[str, Any], profile: str) -> None:
        super().start(config, profile)
        settle = self.runner._settle

        def unshifted(step, ids, given):
            for seg in step.fixups:
                seg.sources = []
            return settle(step, ids, given)

        self.runner._settle = unshifted


def test_teacher_forced_adapter_runs_async_spec_decode_traces_and_catches_unmoved_positions():
    """impl-engine on async + spec traces: the trace's acceptance moves later steps; an unmoved runner fails."""
    from dataclasses import replace as dc_replace

    checked = shifted = caught = 0
    for seed in range(40):
        profile = ("vllm-0.33-async", "vllm-0.32-async")[seed % 2]
        workload = random_workload(seed, profile)
        config = dc_replace(workload.config, num_spec_tokens=2)
        try:
            FastScheduler(config, profile)
        except InvalidConfig:
            continue
        trace = run_workload(workload.replace(config=config))
        sut = ImplEngineSut()
        result = replay(trace, sut, "strict")
        assert result.verdict == PASS and not sut.failures, render_divergence(trace, result)
        checked += sut.num_checked_positions
        shifted += sut.runner.num_shifted_segments
        wrong = _UnshiftedRunnerSut()
        caught += replay(trace, wrong, "strict").verdict == FAIL or bool(wrong.failures)
    assert checked > 300 and shifted > 20 and caught >= 3, (checked, shifted, caught)


# ----------------------------------------------------------------- gpu_checks/async_check.py without a GPU


def test_async_check_without_a_gpu_checks_nothing_and_says_so(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "schedconf.gpu_checks.async_check", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device" in proc.stdout
    report = json.loads((tmp_path / "async_check.json").read_text())
    assert report == {"verdict": "skipped", "reason": report["reason"], "ran": False}


def test_async_check_cpu_dry_run_runs_every_stage(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # bench/ is imported from the repository root, as on the GPU machine
    assert (
        async_check_main(
            ["--out", str(tmp_path), "--device", "cpu", "--allow-cpu", "--seeds", "2", "--batch-sizes", "4"]
        )
        == 0
    )
    report = json.loads((tmp_path / "async_check.json").read_text())
    assert report["info"]["dry_run_on_cpu"] is True and report["verdict"] == "pass"
    # 2 seeds x (4 variants + a reset + 2 with spec decode)
    assert report["tokens"]["failed"] == 0 and report["tokens"]["workloads"] == 14
    assert report["tokens"]["spec_workloads"] == 4 and report["tokens"]["segments_moved_back"] > 0
    # 2 seeds x (async, plain, async + spec decode under 0.33 and 0.32)
    assert report["replay"]["verdicts"] == {"pass": 8} and report["replay"]["max_abs_logit_diff"] < 1e-12
    (row,) = report["throughput"]["rows"]
    assert row["requests"] == 4 and row["tokens_equal"] and row["sync_tps"] > 0 and row["overlapped_tps"] > 0


def test_impl_engine_passes_the_async_corpus_and_300_generated_async_traces(tmp_path):
    """The issue's CI check: ``--sut impl-engine`` on the async corpus (both async profiles) and 300
    generated ``vllm-0.33-async`` traces, teacher forced: scheduler outputs as the trace, and the engine's
    greedy tokens (placeholder inputs filled by its runner) checked against the trace's at every sample."""
    from pathlib import Path

    from schedconf.conformance.runs.campaign import CampaignSpec, run_campaign
    from schedconf.conformance.traces.trace import read_trace

    root = Path(__file__).parents[2] / "conformance" / "traces" / "vectors" / "async"
    corpus = sorted(root.glob("*/*.jsonl"))
    assert len(corpus) >= 60
    for path in corpus:
        result = replay(read_trace(path), ImplEngineSut())
        assert result.verdict == PASS, (path.name, result.divergence)
    summary = run_campaign(
        CampaignSpec(
            sut="impl-engine",
            profile="vllm-0.33-async",
            examples=300,
            seed=13,
            jobs=1,
            out_dir=str(tmp_path),
            run_id="impl-async",
            quiet=True,
        )
    )
    assert summary["failed"] == 0 and summary["unknown"] == 0, summary.get("failures")
    assert summary["passed"] >= 290 and summary["features"].get("stale_output", 0) > 0, summary["features"]
