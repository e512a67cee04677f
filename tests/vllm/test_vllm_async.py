"""The real vLLM v1 driver running steps in flight (``max_concurrent_batches``, ``-async`` profiles).

Marked ``vllm``: the driver runs in the release's environment (built on demand by
``ensure_vllm_env``, never skipped), one driver process per release for the session (tests/vllm/vllm_drivers.py).
Each test drives the driver through the protocol on a hand-built event sequence
and asserts values derived by hand from vLLM 0.33.0's
``vllm/v1/core/sched/scheduler.py`` and ``async_scheduler.py`` (the contract:
async_contract.md). 0.32.0 runs the same sequences with the same answers: none
of them reaches a rule in which the two releases differ (a stop that trims
drafted tokens; caching after an update, which 0.32 does in AsyncScheduler and
0.33 in Scheduler, agrees without spec decode).

Common notation in the comments: P = prompt length, C = num_computed_tokens,
N = num_tokens (prompt + output), PH = num_output_placeholders, IF =
num_in_flight_tokens, ST = num_stale_output_tokens. The free block queue
starts [1, 2, ...] (block 0 is the null block) and, with prefix caching off,
freed blocks are prepended to its front in reverse order (LIFO reuse).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from vllm_drivers import vllm_sut

from schedconf.conformance.adapters.vllm_v1 import VllmV1Sut
from schedconf.conformance.engines.vllm_env import ensure_vllm_env
from schedconf.conformance.sut import SutInputError, SutUnsupported

pytestmark = pytest.mark.vllm

RELEASES = {"0.33.0": "vllm-0.33", "0.32.0": "vllm-0.32"}


def _sut(version: str) -> VllmV1Sut:
    """The session's driver for ``version`` (shared with the differential tests, closed at the end)."""
    return vllm_sut(version)


@pytest.fixture(params=["0.33.0", "0.32.0"])
def release(request: pytest.FixtureRequest) -> tuple[VllmV1Sut, str]:
    """(the release's driver, its plain profile name)."""
    return _sut(request.param), RELEASES[request.param]


def _config(**changes: Any) -> dict[str, Any]:
    config = {
        "block_size": 4,
        "num_gpu_blocks": 16,
        "max_num_batched_tokens": 16,
        "max_num_seqs": 4,
        "max_model_len": 32,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "enable_prefix_caching": False,
        "policy": "fcfs",
        "num_spec_tokens": 0,
        "num_lookahead_tokens": 0,
        "scheduler_reserve_full_isl": None,
    }
    config.update(changes)
    return config


def _request(rid: str, prompt_len: int, max_tokens: int) -> dict[str, Any]:
    return {
        "request_id": rid,
        "prompt_token_ids": list(range(10, 10 + prompt_len)),
        "max_tokens": max_tokens,
        "priority": 0,
        "arrival_time": 0,
        "eos_token_id": 2,
        "ignore_eos": False,
        "stop_token_ids": [],
        "min_tokens": 0,
    }


def _cached(output: dict[str, Any]) -> dict[str, tuple[bool, list[int], int, int]]:
    """req_id -> (resumed, new_block_ids, num_computed_tokens, num_output_tokens)."""
    return {
        c["req_id"]: (c["resumed"], c["new_block_ids"], c["num_computed_tokens"], c["num_output_tokens"])
        for c in output["scheduled_cached_reqs"]
    }


def _new(output: dict[str, Any]) -> dict[str, list[int]]:
    return {r["req_id"]: r["block_ids"] for r in output["scheduled_new_reqs"]}


def _tokens(outputs: list[dict[str, Any]]) -> dict[str, tuple[list[int], str | None]]:
    return {o["req_id"]: (o["new_token_ids"], o["finish_reason"]) for o in outputs}


def _refused(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(SutInputError) as info:
        call(*args, **kwargs)
    return info.value.code


# --------------------------------------------------------------- async decode


def test_async_decode_scheduled_twice_with_its_placeholder_counted(release: tuple[VllmV1Sut, str]) -> None:
    sut, profile = release
    sut.start(_config(max_concurrent_batches=2), f"{profile}-async")
    sut.add_request(_request("a", 4, 5))

    # Step 1: a's prefill, 4 tokens, block [1]. After: C=4, is_prefill_chunk =
    # 4 < N 4 + PH 0 = False (samples), so AsyncScheduler adds PH=1.
    s1 = sut.schedule()
    assert s1["num_scheduled_tokens"] == {"a": 4}
    assert _new(s1) == {"a": [1]}

    # Step 2, step 1 still in flight: skip rule 4 + 2 - 1 = 5 >= P 4 + 5 = 9? no.
    # num_new = N 4 + PH 1 - C 4 = 1 (the placeholder counts). Position 4 opens
    # block 2. CachedRequestData.num_output_tokens = 0 output + PH 1 = 1.
    s2 = sut.schedule()
    assert s2["num_scheduled_tokens"] == {"a": 1}
    assert _cached(s2) == {"a": (False, [2], 4, 1)}

    # Two steps in flight = max_concurrent_batches: a third schedule is refused.
    assert _refused(sut.schedule) == "output_not_processed"

    # Step 1's token: appended, PH 2 -> 1 (C=5, N=5).
    assert _tokens(sut.update_from_output({"a": [100]}, {}, step=1)) == {"a": ([100], None)}
    # Step 3: num_new = N 5 + PH 1 - C 5 = 1; cached num_output_tokens = 1 + 1 = 2.
    s3 = sut.schedule()
    assert s3["num_scheduled_tokens"] == {"a": 1}
    assert _cached(s3) == {"a": (False, [], 5, 2)}


def test_async_skip_rule_when_steps_in_flight_reach_max_tokens(release: tuple[VllmV1Sut, str]) -> None:
    sut, profile = release
    sut.start(_config(max_concurrent_batches=2), f"{profile}-async")
    sut.add_request(_request("a", 4, 3))  # P=4, max_tokens=3: P + max_tokens = 7
    sut.add_request(_request("b", 4, 20))

    # Step 1: a 4 (block 1), b 4 (block 2); both sample: PH=1 each, C=4.
    assert sut.schedule()["num_scheduled_tokens"] == {"a": 4, "b": 4}
    # Step 2: a: 4 + 2 - 1 = 5 >= 7? no -> 1 token (C=5, PH=2); b likewise.
    assert sut.schedule()["num_scheduled_tokens"] == {"a": 1, "b": 1}
    # Step 1 returns: PH 2 -> 1, N=5 for both.
    assert _tokens(sut.update_from_output({"a": [100], "b": [200]}, {}, step=1)) == {
        "a": ([100], None),
        "b": ([200], None),
    }
    # Step 3: a: C 5 + 2 - PH 1 = 6 >= 7? no -> 1 token (C=6, PH=2).
    assert sut.schedule()["num_scheduled_tokens"] == {"a": 1, "b": 1}
    # Step 2 returns: a N=6, PH 2 -> 1.
    sut.update_from_output({"a": [101], "b": [201]}, {}, step=2)
    # Step 4: a: C 6 + 2 - PH 1 = 7 >= 7: the in-flight step 3 samples a's last
    # token, so a is skipped (without the rule num_new = N 6 + PH 1 - C 6 = 1).
    # b: 6 + 2 - 1 = 7 >= 4 + 20? no -> 1 token.
    s4 = sut.schedule()
    assert s4["num_scheduled_tokens"] == {"b": 1}
    # Step 3's token is a's third: finished by length.
    assert _tokens(sut.update_from_output({"a": [102], "b": [202]}, {}, step=3)) == {
        "a": ([102], "length"),
        "b": ([202], None),
    }
    # Step 5: a is gone; its finished id is reported once.
    s5 = sut.schedule()
    assert s5["num_scheduled_tokens"] == {"b": 1}
    assert s5["finished_req_ids"] == ["a"]


def test_async_update_caches_the_block_its_token_completes(release: tuple[VllmV1Sut, str]) -> None:
    # Both releases cache blocks when an async step's output arrives (0.33:
    # Scheduler.update_from_output, C - IF; 0.32: AsyncScheduler's
    # _update_request_with_output, C - PH); the token that fills a block only
    # becomes known then, after allocate_slots last cached (min(C + n, N)).
    sut, profile = release
    sut.start(_config(enable_prefix_caching=True, max_concurrent_batches=2), f"{profile}-async")
    sut.add_request(_request("a", 3, 2))  # prompt [10, 11, 12]
    # Step 1: 3 tokens, block [1]; allocate_slots caches min(3, N 3) = 3: no full block.
    assert _new(sut.schedule()) == {"a": [1]}
    # Step 2: 1 token at position 3 (block 1); caches min(3 + 1, N 3) = 3: still none.
    assert sut.schedule()["num_scheduled_tokens"] == {"a": 1}
    # Step 1 returns 100 (N=4): cache up to C 4 - IF 1 (0.33) = C 4 - PH 1 (0.32) = 3: none.
    sut.update_from_output({"a": [100]}, {}, step=1)
    # Step 2 returns 101: a's second token, max_tokens: finished. Cache up to
    # 4 - 0 = 4: block 1 = [10, 11, 12, 100] is hashed, so freeing it appends it
    # at the back of the free queue (a block without a hash would go to the front).
    assert _tokens(sut.update_from_output({"a": [101]}, {}, step=2)) == {"a": ([101], "length")}
    assert sut.observe()["free_block_queue"] == [*range(2, 16), 1]
    # b shares those 4 tokens: a prefix hit of one block (computed 4); its fifth
    # token takes block 2 from the front.
    sut.add_request({**_request("b", 5, 2), "prompt_token_ids": [10, 11, 12, 100, 50]})
    s3 = sut.schedule()
    assert s3["scheduled_new_reqs"] == [{"req_id": "b", "block_ids": [1, 2], "num_computed_tokens": 4}]
    assert s3["num_scheduled_tokens"] == {"b": 1}


# ------------------------------------------------------- stale output (preempt)


def test_preempted_with_steps_in_flight_gets_stale_tokens_and_waits_until_drained(
    release: tuple[VllmV1Sut, str],
) -> None:
    sut, profile = release
    # 4 usable blocks of 4 tokens; three steps may be in flight (the -async
    # profile with a deeper queue, as V2 runner + pipeline parallelism gives).
    sut.start(_config(num_gpu_blocks=5, max_model_len=16, max_concurrent_batches=3), f"{profile}-async")
    sut.add_request(_request("a", 7, 10))
    sut.add_request(_request("b", 4, 10))

    # Step 1: a 7 tokens (blocks [1, 2]), b 4 (block [3]). Both sample, PH=1.
    s1 = sut.schedule()
    assert s1["num_scheduled_tokens"] == {"a": 7, "b": 4}
    assert _new(s1) == {"a": [1, 2], "b": [3]}
    # Step 2: a 1 token at position 7 (block 2 has room), b 1 token at
    # position 4: block [4], the last free one. C: a 8, b 5; PH 2 each.
    s2 = sut.schedule()
    assert s2["num_scheduled_tokens"] == {"a": 1, "b": 1}
    assert _cached(s2) == {"a": (False, [], 7, 1), "b": (False, [4], 4, 1)}
    # Step 3: a at position 8 needs a third block, none is free: b (the last
    # running) is preempted: C=0, ST = IF = 4 + 1 = 5, PH=0, its blocks [3, 4]
    # freed to the front in reverse ([4, 3]); a takes 4. The waiting loop does
    # not run in a step that preempted. a: cached num_output_tokens = 0 + PH 2.
    s3 = sut.schedule()
    assert s3["num_scheduled_tokens"] == {"a": 1}
    assert s3["preempted_req_ids"] == ["b"]
    assert _cached(s3) == {"a": (False, [4], 8, 2)}
    assert sut.observe() == {"free_block_queue": [3], "num_free_blocks": 1}

    # Step 1 returns. b's share: IF 5 -> 1, ST 5 -> 1: stale, its token is still
    # appended (N=5) without touching C or PH. a: PH 3 -> 2.
    assert _tokens(sut.update_from_output({"a": [100], "b": [200]}, {}, step=1)) == {
        "a": ([100], None),
        "b": ([200], None),
    }
    # a is aborted (steps 2 and 3 still carry it): its blocks [1, 2, 4] go to
    # the front reversed: free queue [4, 2, 1, 3], room for b (N=5: 2 blocks).
    sut.abort("a")
    assert sut.observe() == {"free_block_queue": [4, 2, 1, 3], "num_free_blocks": 4}
    sut.add_request(_request("c", 4, 10))
    # Step 4: running is empty; waiting [b, c]: b still has ST=1 in flight and
    # is skipped (not a break: c behind it is admitted, block [4]); b goes back
    # to the head of the queue.
    s4 = sut.schedule()
    assert s4["num_scheduled_tokens"] == {"c": 4}
    assert _new(s4) == {"c": [4]}
    assert s4["finished_req_ids"] == ["a"]

    # Step 2 returns: a is gone (its token ignored); b IF 1 -> 0, ST 1 -> 0,
    # stale again: token appended, N=6.
    assert _tokens(sut.update_from_output({"a": [101], "b": [201]}, {}, step=2)) == {"b": ([201], None)}
    # Step 5: c decodes: N 4 + PH 1 - C 4 = 1 at position 4, block [2];
    # b has drained and resumes: C=0, num_new = N 6 (prompt 4 + its two stale
    # tokens), blocks [1, 3]; num_output_tokens = 2 outputs + PH 0.
    s5 = sut.schedule()
    assert s5["num_scheduled_tokens"] == {"b": 6, "c": 1}
    assert _cached(s5) == {"c": (False, [2], 4, 1), "b": (True, [1, 3], 0, 2)}
    # Step 3, in flight, scheduled the aborted a: its id cannot come back yet.
    assert _refused(sut.add_request, _request("a", 3, 2)) == "request_id_in_flight"
    assert sut.update_from_output({"a": [102]}, {}, step=3) == []
    sut.add_request(_request("a", 3, 2))  # step 4 and 5 do not schedule "a"
    assert _tokens(sut.update_from_output({"c": [300]}, {}, step=4)) == {"c": ([300], None)}
    assert _tokens(sut.update_from_output({"b": [202], "c": [301]}, {}, step=5)) == {
        "b": ([202], None),
        "c": ([301], None),
    }


def test_reset_prefix_cache_drops_the_output_in_flight_and_resumes_at_once(release: tuple[VllmV1Sut, str]) -> None:
    sut, profile = release
    sut.start(_config(max_concurrent_batches=2), f"{profile}-async")
    sut.add_request(_request("a", 4, 5))
    # Step 1: a 4 tokens, block [1]; C=4, PH=1, IF=4.
    assert _new(sut.schedule()) == {"a": [1]}
    # reset_prefix_cache(reset_running_requests=True): a is preempted with
    # drop_stale_output: C=0, PH=0, ST = IF = 4, block 1 freed; nothing holds
    # a block any more, so the cache resets (success).
    assert sut.reset_prefix_cache(True) is True
    # Step 2, step 1 still in flight: a dropped (not deliverable) stale share
    # does not hold a back in the waiting loop: it resumes at once, N 4 - C 0
    # = 4 tokens, block [1] again; num_output_tokens 0 + PH 0.
    s2 = sut.schedule()
    assert s2["num_scheduled_tokens"] == {"a": 4}
    assert _cached(s2) == {"a": (True, [1], 0, 0)}
    # Step 1 returns: IF 8 -> 4, ST 4 -> 0, stale and dropped: no token, no output.
    assert sut.update_from_output({"a": [100]}, {}, step=1) == []
    # Step 2 returns: not stale: 101 is a's first token (PH 1 -> 0).
    assert _tokens(sut.update_from_output({"a": [101]}, {}, step=2)) == {"a": ([101], None)}
    # Step 3: num_new = N 5 + PH 0 - C 4 = 1 at position 4: a second block,
    # [2] (the front of the free queue); num_output_tokens 1.
    s3 = sut.schedule()
    assert _cached(s3) == {"a": (False, [2], 4, 1)}


# ---------------------------------------------- plain scheduler, batch queue


def test_plain_scheduler_in_flight_skips_decode_and_schedules_prefill_chunk_again(
    release: tuple[VllmV1Sut, str],
) -> None:
    sut, profile = release
    # The plain Scheduler with two steps in flight (pipeline parallelism's batch queue).
    sut.start(_config(max_num_batched_tokens=8, max_concurrent_batches=2), profile)
    sut.add_request(_request("a", 4, 10))
    sut.add_request(_request("b", 12, 10))

    # Step 1: a 4 (block 1, samples: C 4 = N 4); b gets the rest of the budget,
    # 4 tokens (block 2), a prefill chunk (C 4 < N 12).
    s1 = sut.schedule()
    assert s1["num_scheduled_tokens"] == {"a": 4, "b": 4}
    # Step 2, step 1 in flight: a: num_new = N 4 + PH 0 - C 4 = 0 -> skipped;
    # b's next chunk: 12 - 4 = 8 = the budget (blocks 3, 4); C 12 = N 12: samples.
    s2 = sut.schedule()
    assert s2["num_scheduled_tokens"] == {"b": 8}
    assert _cached(s2) == {"b": (False, [3, 4], 4, 0)}
    # b ran a prefill chunk in step 1: a token for it is refused, nothing changes.
    assert _refused(sut.update_from_output, {"a": [100], "b": [5]}, {}, step=1) == "bad_num_sampled_tokens"
    assert _tokens(sut.update_from_output({"a": [100]}, {}, step=1)) == {"a": ([100], None)}
    # Step 3: a: 5 - 4 = 1 token (block 5), num_output_tokens 1 (no placeholders
    # in the plain scheduler); b: N 12 - C 12 = 0, its step 2 in flight: skipped.
    s3 = sut.schedule()
    assert s3["num_scheduled_tokens"] == {"a": 1}
    assert _cached(s3) == {"a": (False, [5], 4, 1)}
    assert _tokens(sut.update_from_output({"b": [200]}, {}, step=2)) == {"b": ([200], None)}


# ---------------------------------------------------------------- refusals


def test_each_refusal_changes_nothing(release: tuple[VllmV1Sut, str]) -> None:
    sut, profile = release
    sut.start(_config(max_concurrent_batches=2), f"{profile}-async")
    sut.add_request(_request("a", 4, 10))
    # Nothing in flight: an output without a step is unexpected; one naming a
    # step is for a step never scheduled.
    assert _refused(sut.update_from_output, {}, {}) == "unexpected_model_output"
    assert _refused(sut.update_from_output, {}, {}, step=1) == "unscheduled_step"

    assert sut.schedule()["num_scheduled_tokens"] == {"a": 4}  # step 1 (PH=1)
    assert sut.schedule()["num_scheduled_tokens"] == {"a": 1}  # step 2 (PH=2)
    free = sut.observe()
    assert _refused(sut.schedule) == "output_not_processed"
    for bad_step in (0, 3, -1):
        assert _refused(sut.update_from_output, {"a": [100]}, {}, step=bad_step) == "unscheduled_step"
    assert _refused(sut.update_from_output, {"a": [100]}, {}, step=2) == "model_output_out_of_order"
    # Step 1 samples a: at most 1 token, and under async at least 1 (an empty
    # list would leave its placeholder unresolved for good).
    assert _refused(sut.update_from_output, {"a": [100, 101]}, {}, step=1) == "bad_num_sampled_tokens"
    assert _refused(sut.update_from_output, {"a": []}, {}, step=1) == "bad_num_sampled_tokens"
    assert _refused(sut.update_from_output, {}, {}, step=1) == "bad_num_sampled_tokens"
    assert _refused(sut.update_from_output, {"zz": [1]}, {}, step=1) == "unscheduled_model_output"
    assert sut.observe() == free
    # None of that changed anything: step 1 applies as it would have.
    assert _tokens(sut.update_from_output({"a": [100]}, {}, step=1)) == {"a": ([100], None)}
    assert _refused(sut.update_from_output, {"a": [100]}, {}, step=1) == "duplicate_model_output"
    # Step 3: num_new = N 5 + PH 1 - C 5 = 1, cached num_output_tokens 1 + 1 = 2.
    s3 = sut.schedule()
    assert s3["num_scheduled_tokens"] == {"a": 1}
    assert _cached(s3) == {"a": (False, [], 5, 2)}
    # Aborted while steps 2 and 3 (both scheduled it) are in flight.
    sut.abort("a")
    assert _refused(sut.add_request, _request("a", 4, 10)) == "request_id_in_flight"
    # A harness that sends no step applies the oldest in flight (step 2); a is
    # gone, so its token is ignored.
    assert sut.update_from_output({"a": [101]}, {}) == []
    assert _refused(sut.add_request, _request("a", 4, 10)) == "request_id_in_flight"
    assert sut.update_from_output({}, {}, step=3) == []
    sut.add_request(_request("a", 4, 10))
    s4 = sut.schedule()
    assert _new(s4) == {"a": [2]}  # a's old blocks [1, 2] came back reversed: [2, 1, ...]
    assert s4["finished_req_ids"] == ["a"]


def test_async_spec_decode_placeholder_drafts(release: tuple[VllmV1Sut, str]) -> None:
    """AsyncScheduler with k=2: the story of conformance/testdata/scenarios/async_spec_decode.txt,
    each value derived there (C computed, N num_tokens, PH placeholders)."""
    sut, profile = release
    sut.start(_config(num_spec_tokens=2, max_concurrent_batches=2), f"{profile}-async")
    sut.add_request(_request("a", 4, 10))
    # Step 1: the prompt; afterwards PH=1 and spec_token_ids = [-1, -1].
    s1 = sut.schedule()
    assert s1["num_scheduled_tokens"] == {"a": 4} and _new(s1) == {"a": [1]}
    # Step 2: N 4 + 2 + PH 1 - C 4 = 3 tokens, drafts 3 + 4 - 4 - 1 = 2 placeholders.
    s2 = sut.schedule()
    assert s2["num_scheduled_tokens"] == {"a": 3}
    assert s2["scheduled_spec_decode_tokens"] == {"a": [-1, -1]}
    assert _cached(s2) == {"a": (False, [2], 4, 1)}
    # The engine core never hands drafts to an AsyncScheduler: refused, nothing changed.
    assert _refused(sut.update_from_output, {"a": [100]}, {"a": [5, 6]}, step=1) == "drafts_under_async_scheduling"
    assert _tokens(sut.update_from_output({"a": [100]}, {}, step=1)) == {"a": ([100], None)}
    # Step 3: N 5 + 2 + PH 3 - C 7 = 3, drafts 2; num_output_tokens 1 + 3 = 4.
    s3 = sut.schedule()
    assert s3["num_scheduled_tokens"] == {"a": 3} and s3["scheduled_spec_decode_tokens"] == {"a": [-1, -1]}
    assert _cached(s3) == {"a": (False, [3], 7, 4)}
    # Step 2's output: both drafts rejected (C 10 -> 8, PH 6 -> 4 -> 3). An empty
    # draft list changes nothing under async (the engine core never calls
    # update_draft_token_ids): step 4 still counts a's 2 placeholder drafts.
    assert _tokens(sut.update_from_output({"a": [101]}, {"a": []}, step=2)) == {"a": ([101], None)}
    # Step 4: 6 + 2 + 3 - 8 = 3 tokens, no new block; num_output_tokens 2 + 3 = 5.
    s4 = sut.schedule()
    assert s4["num_scheduled_tokens"] == {"a": 3} and _cached(s4) == {"a": (False, [], 8, 5)}
    # Step 3: both accepted; step 4: one accepted (C 11 -> 10, PH 3 -> 0).
    assert _tokens(sut.update_from_output({"a": [102, 103, 104]}, {}, step=3)) == {"a": ([102, 103, 104], None)}
    assert _tokens(sut.update_from_output({"a": [105, 106]}, {}, step=4)) == {"a": ([105, 106], None)}
    # Step 5: 11 + 2 + 0 - 10 = 3 tokens, 2 drafts, block 4; step 6: 11 + 2 + 3 - 13 = 3.
    s5 = sut.schedule()
    assert s5["num_scheduled_tokens"] == {"a": 3} and _cached(s5) == {"a": (False, [4], 10, 7)}
    s6 = sut.schedule()
    assert s6["num_scheduled_tokens"] == {"a": 3} and _cached(s6) == {"a": (False, [], 13, 10)}
    # Step 5's 3 tokens reach max_tokens 10; step 6's output is for a finished request.
    assert _tokens(sut.update_from_output({"a": [107, 108, 109]}, {}, step=5)) == {"a": ([107, 108, 109], "length")}
    assert sut.update_from_output({"a": [110]}, {}, step=6) == []


def test_async_spec_decode_no_drafts_for_a_decode_max_model_len_cuts(release: tuple[VllmV1Sut, str]) -> None:
    """Prompt 1, max_model_len 3, k=3: step 2's decode is cut to 1 token, so 1 + 1 - 1 - PH 1 = 0 drafts
    (the mutant async_drafts_with_placeholders_pending schedules one)."""
    sut, profile = release
    sut.start(
        _config(
            block_size=1,
            num_gpu_blocks=4,
            max_num_batched_tokens=3,
            max_num_seqs=1,
            max_model_len=3,
            enable_chunked_prefill=False,
            num_spec_tokens=3,
            max_concurrent_batches=2,
        ),
        f"{profile}-async",
    )
    sut.add_request(_request("z", 1, 2))
    assert sut.schedule()["num_scheduled_tokens"] == {"z": 1}
    s2 = sut.schedule()
    assert s2["num_scheduled_tokens"] == {"z": 1}
    assert s2["scheduled_spec_decode_tokens"] == {}


def test_config_refusals(release: tuple[VllmV1Sut, str]) -> None:
    sut, profile = release
    with pytest.raises(SutInputError) as info:
        sut.start(_config(max_concurrent_batches=0), profile)
    assert info.value.code == "invalid_max_concurrent_batches"
    with pytest.raises(SutInputError) as info:
        sut.start(_config(max_concurrent_batches=True), profile)
    assert info.value.code == "invalid_config_type"
    # Steps in flight with spec decode on the plain scheduler: the model refuses
    # them (in_flight_not_modelled); AsyncScheduler with spec decode is accepted.
    sut.start(_config(num_spec_tokens=2, max_concurrent_batches=2), f"{profile}-async")
    with pytest.raises(SutUnsupported):
        sut.start(_config(num_spec_tokens=2, max_concurrent_batches=2), profile)
    # Absent means 1: a second schedule before the first output is refused.
    sut.start(_config(), profile)
    sut.add_request(_request("a", 4, 10))
    sut.schedule()
    assert _refused(sut.schedule) == "output_not_processed"
    assert _tokens(sut.update_from_output({"a": [100]}, {}, step=1)) == {"a": ([100], None)}


@pytest.mark.parametrize("profile,batches", [("vllm-0.33-async", None), ("vllm-0.33", 2)])
def test_generated_in_flight_traces_pass_strict_on_vllm_0_33(tmp_path, profile: str, batches: int | None) -> None:
    """The issue's CI check: a few hundred generated async traces (2, 3 or 1 steps in flight, aborts and
    re-adds in flight, resets, the 0.32 knobs, scheduler stats) and a plain batch queue of two, strict
    against vLLM 0.33.0's own AsyncScheduler / Scheduler."""
    from schedconf.conformance.runs.campaign import CampaignSpec, run_campaign

    n = int(os.environ.get("SCHEDCONF_VLLM_TRACES", "300")) // (1 if batches is None else 3)
    overrides = {} if batches is None else {"max_concurrent_batches": batches}
    ensure_vllm_env("0.33.0")
    summary = run_campaign(
        CampaignSpec(
            sut="vllm-v1@0.33.0",
            profile=profile,
            examples=n,
            seed=101,
            jobs=2,
            out_dir=str(tmp_path),
            run_id="async",
            quiet=True,
            shrink_budget_s=5,
            config_overrides=overrides,
        )
    )
    assert summary["failed"] == 0 and summary["unknown"] == 0, summary.get("failures")
    assert summary["passed"] >= n - 2
    assert summary["features"].get("steps_in_flight", 0) > n // 2, summary["features"]
