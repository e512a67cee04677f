"""vLLM 0.10.2's real legacy v0 scheduler behind the protocol (``--sut vllm-v0@0.10.2``).

Marked ``vllm``. A missing environment is built (``ensure_env("vllm", "0.10.2")``,
~2-7 min, network or a local wheel folder), never skipped. One driver process
(``conformance/engines/vllm_v0_driver.py``) serves every test of a session; each
test sends a fresh ``init``.

Every expected value below is derived by hand from vLLM 0.10.2's code (comments
next to each step); the naive GPU allocator hands out the ids of a deque
``[0, 1, ..., N-1]`` from the left and puts freed ids back on the left; a decode
needs one whole free block (``can_append_slots`` counts one touched block even
when the token fits in the last block). What is checked:

* scheduling through the protocol: recompute preemption of the tail and of the
  requester itself, swap out and in with CPU ids, chunked prefill (``do_sample``
  false for a chunk, finishing prefills first), a prefix-cache hit
  (``computed_block_nums``, cached tokens in ``num_batched_tokens``), the stop
  rules, aborts before and during a step, ``finished_requests_ids``, an ignored
  prompt and its request output, a swapped group that can never swap back in;
* engine crashes, each answered with the model's code and then ``engine_dead`` until
  the next ``init``: a swap-out without CPU space (``engine_swap_space_exhausted``), a
  SWAPPED group put into waiting by priority preemption (``engine_swapped_group_in_waiting``),
  the abort of a swapped group with prefix caching (``engine_abort_swapped_prefix_cache``);
* refusals with the protocol's codes (config, add_request, abort, update, schedule),
  each leaving the scheduler unchanged;
* the v0 golden corpus (``conformance/traces/vectors/v0/vllm-0.10``, made by the model)
  replays on the real scheduler with the strict comparison.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schedconf.conformance.adapters.vllm_v0 import VllmV0Sut, make_vllm_v0_sut
from schedconf.conformance.checking.replay import PASS, render_divergence, replay
from schedconf.conformance.engines.engine_env import REPO_ROOT, ensure_env
from schedconf.conformance.sut import SutInputError, SutUnsupported
from schedconf.conformance.traces.trace import read_trace

pytestmark = pytest.mark.vllm

VERSION = "0.10.2"
PROFILE = "vllm-0.10"

_SUTS: dict[str, VllmV0Sut] = {}


@pytest.fixture(scope="module")
def sut() -> Iterator[VllmV0Sut]:
    """The session's v0 driver process, building the environment if needed."""
    if VERSION not in _SUTS:
        ensure_env("vllm", VERSION)
        made = make_vllm_v0_sut(f"vllm-v0@{VERSION}")
        assert isinstance(made, VllmV0Sut)
        _SUTS[VERSION] = made
    yield _SUTS[VERSION]


@pytest.fixture(scope="session", autouse=True)
def _close_driver() -> Iterator[None]:
    yield
    for s in _SUTS.values():
        s.close()
    _SUTS.clear()


def config(**fields: Any) -> dict[str, Any]:
    """A v0 config: 4-token blocks, 2 GPU blocks, no swap space, default scheduler, unless overridden."""
    base = {
        "block_size": 4,
        "num_gpu_blocks": 2,
        "num_cpu_blocks": 0,
        "max_num_batched_tokens": 8,
        "max_num_seqs": 4,
        "max_model_len": 8,
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,
        "policy": "fcfs",
        "preemption_mode": None,
        "max_num_partial_prefills": 1,
        "max_long_partial_prefills": 1,
        "long_prefill_token_threshold": 0,
    }
    return {**base, **fields}


def request(rid: str, prompt: list[int], max_tokens: int, **fields: Any) -> dict[str, Any]:
    return {
        "kind": "add_request",
        "request_id": rid,
        "prompt_token_ids": prompt,
        "max_tokens": max_tokens,
        "priority": 0,
        "arrival_time": 0,
        "eos_token_id": None,
        "stop_token_ids": [],
        "ignore_eos": False,
        "min_tokens": 0,
        **fields,
    }


def group(
    rid: str, chunk: int, prompt: bool, table: list[int], sample: bool = True, computed: list[int] | None = None
) -> dict[str, Any]:
    return {
        "request_id": rid,
        "token_chunk_size": chunk,
        "is_prompt": prompt,
        "do_sample": sample,
        "block_table": table,
        "computed_block_nums": computed or [],
    }


def step(
    groups: list[dict[str, Any]],
    *,
    prefills: int = 0,
    tokens: int = 0,
    running: int = 0,
    preempted: int = 0,
    finished: list[str] | None = None,
    ignored: list[str] | None = None,
    swap_in: list[list[int]] | None = None,
    swap_out: list[list[int]] | None = None,
) -> dict[str, Any]:
    return {
        "scheduled_seq_groups": groups,
        "num_prefill_groups": prefills,
        "num_batched_tokens": tokens,
        "blocks_to_swap_in": swap_in or [],
        "blocks_to_swap_out": swap_out or [],
        "blocks_to_copy": [],
        "ignored_seq_groups": ignored or [],
        "num_lookahead_slots": 0,
        "running_queue_size": running,
        "preempted": preempted,
        "finished_requests_ids": finished or [],
    }


def out(rid: str, tokens: list[int], finish: str | None = None, stop: int | None = None) -> dict[str, Any]:
    return {"req_id": rid, "new_token_ids": tokens, "finish_reason": finish, "stop_reason": stop}


def refused(code: str, call: Any, *args: Any) -> None:
    with pytest.raises(SutInputError) as info:
        call(*args)
    assert info.value.code == code, info.value


# ------------------------------------------------------------------ scheduling


def test_recompute_preempts_the_tail_then_the_requester_itself(sut: VllmV0Sut) -> None:
    sut.start(config(), PROFILE)
    sut.add_request(request("a", [1, 2, 3, 4], 3))
    sut.add_request(request("b", [5, 6, 7, 8], 3))
    # 1: both prompts fit one block each (deque [0, 1]): a -> 0, b -> 1; 8 tokens = the budget.
    assert sut.schedule() == step([group("a", 4, True, [0]), group("b", 4, True, [1])], prefills=2, tokens=8, running=2)
    assert sut.update_from_output({"a": [9], "b": [9]}, {}) == [out("a", [9]), out("b", [9])]
    # 2: a's decode needs a free block, none is free: the tail b is preempted (recompute frees block 1,
    # b goes back to waiting with its 5 tokens); a appends into block 1. preempted counts b.
    assert sut.schedule() == step([group("a", 1, False, [0, 1])], tokens=1, running=1, preempted=1)
    assert sut.update_from_output({"a": [9]}, {}) == [out("a", [9])]
    # 3: b (5 tokens) needs 2 blocks, 0 free: LATER. No prefill, so decodes run: a's 7th token would fit
    # in block 1, but a decode counts one touched block and none is free; running is empty, so a preempts
    # itself (frees 0 then 1: deque [1, 0]). Nothing is scheduled; waiting = [a, b].
    assert sut.schedule() == step([], running=0, preempted=1)
    assert sut.update_from_output({}, {}) == []
    # 4: a re-prefills its 6 tokens (4 prompt + 2 outputs) in 2 blocks: 1, 0; b is LATER again.
    assert sut.schedule() == step([group("a", 6, True, [1, 0])], prefills=1, tokens=6, running=1)
    # a's third output: max_tokens reached; its blocks go back (1 then 0: deque [0, 1]).
    assert sut.update_from_output({"a": [9]}, {}) == [out("a", [9], "length")]
    # 5: b re-prefills its 5 tokens in blocks 0, 1; a is reported finished.
    assert sut.schedule() == step([group("b", 5, True, [0, 1])], prefills=1, tokens=5, running=1, finished=["a"])
    assert sut.update_from_output({"b": [9]}, {}) == [out("b", [9])]


def test_swap_out_and_in_with_cpu_block_ids(sut: VllmV0Sut) -> None:
    sut.start(
        config(num_gpu_blocks=4, num_cpu_blocks=4, max_num_batched_tokens=16, max_model_len=16, preemption_mode="swap"),
        PROFILE,
    )
    sut.add_request(request("a", [10, 11, 12, 13], 5))
    sut.add_request(request("b", [10, 11, 12, 13], 5))
    assert sut.schedule() == step([group("a", 4, True, [0]), group("b", 4, True, [1])], prefills=2, tokens=8, running=2)
    sut.update_from_output({"a": [7], "b": [7]}, {})
    # 2: each decode starts a new block (2 free): a -> 2, b -> 3.
    assert sut.schedule() == step([group("a", 1, False, [0, 2]), group("b", 1, False, [1, 3])], tokens=2, running=2)
    sut.update_from_output({"a": [7], "b": [7]}, {})
    # 3: no free block for a's decode: the tail b is swapped out (CPU deque [0..3]: 1 -> cpu 0, 3 -> cpu 1;
    # GPU frees 1 then 3: deque [3, 1]); a's token fits in block 2.
    assert sut.schedule() == step(
        [group("a", 1, False, [0, 2])], tokens=1, running=1, preempted=1, swap_out=[[1, 0], [3, 1]]
    )
    assert sut.observe() == {
        "num_free_gpu_blocks": 2,
        "num_free_cpu_blocks": 2,
        "block_tables": {"a": [0, 2]},
        "cpu_block_tables": {"b": [0, 1]},
    }
    sut.update_from_output({"a": [7]}, {})
    # 4: no prefill while a group is swapped; a decodes (one free block needed, 2 free), then b swaps in:
    # 1 touched block + 1 full block to copy = 2 <= 2 free: cpu 0 -> gpu 3, cpu 1 -> gpu 1.
    assert sut.schedule() == step(
        [group("a", 1, False, [0, 2]), group("b", 1, False, [3, 1])], tokens=2, running=2, swap_in=[[0, 3], [1, 1]]
    )
    sut.update_from_output({"a": [7], "b": [7]}, {})
    # 5: a needs a block again, none free: b swaps out (CPU deque [1, 0, 2, 3] after the swap-in freed 0
    # then 1): gpu 3 -> cpu 1, gpu 1 -> cpu 0.
    assert sut.schedule() == step(
        [group("a", 1, False, [0, 2])], tokens=1, running=1, preempted=1, swap_out=[[3, 1], [1, 0]]
    )
    # a's fifth output ends it (length); its blocks 0, 2 go back: GPU deque [2, 0, 1, 3].
    assert sut.update_from_output({"a": [7]}, {}) == [out("a", [7], "length")]
    # 6: b swaps in to gpu 2 and 0.
    assert sut.schedule() == step(
        [group("b", 1, False, [2, 0])], tokens=1, running=1, finished=["a"], swap_in=[[1, 2], [0, 0]]
    )
    assert sut.update_from_output({"b": [7]}, {}) == [out("b", [7])]


def test_swap_out_without_cpu_space_kills_the_engine_until_the_next_init(sut: VllmV0Sut) -> None:
    sut.start(config(preemption_mode="swap"), PROFILE)
    sut.add_request(request("a", [1, 2, 3, 4], 3))
    sut.add_request(request("b", [5, 6, 7, 8], 3))
    sut.schedule()
    sut.update_from_output({"a": [9], "b": [9]}, {})
    # 2: b must swap out 1 full block + 1 touched block to a CPU pool of 0 blocks: vLLM's _swap_out raises
    # RuntimeError("Aborted due to the lack of CPU swap space...").
    refused("engine_swap_space_exhausted", sut.schedule)
    refused("engine_dead", sut.schedule)
    refused("engine_dead", sut.add_request, request("c", [1], 1))
    refused("engine_dead", sut.abort, "a")
    refused("engine_dead", sut.update_from_output, {}, {})
    sut.start(config(), PROFILE)  # a fresh engine
    assert sut.schedule() == step([])


def test_priority_preemption_in_swap_mode_puts_a_swapped_group_into_waiting(sut: VllmV0Sut) -> None:
    sut.start(config(num_cpu_blocks=4, policy="priority", preemption_mode="swap"), PROFILE)
    sut.add_request(request("a", [1, 2, 3, 4], 5, priority=5))
    assert sut.schedule() == step([group("a", 4, True, [0])], prefills=1, tokens=4, running=1)
    sut.update_from_output({"a": [9]}, {})
    sut.add_request(request("b", list(range(1, 9)), 5, arrival_time=1))
    # 2: b needs 2 blocks, 1 is free: LATER, no prefill. _schedule_priority_preemption: a (5, 0) is worse
    # than b (0, 1) and b cannot be allocated, so a is preempted, in swap mode: gpu 0 -> cpu 0, a mapping
    # vLLM drops (not in blocks_to_swap_out, not counted in preempted), and a SWAPPED group is put into
    # waiting. Nothing runs.
    assert sut.schedule() == step([])
    assert sut.observe() == {
        "num_free_gpu_blocks": 2,
        "num_free_cpu_blocks": 3,
        "block_tables": {},
        "cpu_block_tables": {"a": [0]},
    }
    assert sut.update_from_output({}, {}) == []
    # 3: b is admitted, then a, still SWAPPED, heads waiting: vLLM asserts it has one WAITING sequence.
    refused("engine_swapped_group_in_waiting", sut.schedule)
    refused("engine_dead", sut.schedule)


def test_aborting_a_swapped_group_with_prefix_caching_kills_the_engine(sut: VllmV0Sut) -> None:
    sut.start(config(num_cpu_blocks=4, enable_prefix_caching=True, preemption_mode="swap"), PROFILE)
    sut.add_request(request("a", [1, 2, 3, 4], 5))
    sut.add_request(request("b", [5, 6, 7, 8], 5))
    assert sut.schedule() == step([group("a", 4, True, [0]), group("b", 4, True, [1])], prefills=2, tokens=8, running=2)
    sut.update_from_output({"a": [9], "b": [9]}, {})
    # 2: b is swapped out (gpu 1 -> cpu 0) for a's decode, which takes block 1. a's full first block is
    # cached and computed: computed_block_nums [0].
    assert sut.schedule() == step(
        [group("a", 1, False, [0, 1], computed=[0])], tokens=1, running=1, preempted=1, swap_out=[[1, 0]]
    )
    sut.update_from_output({"a": [9]}, {})
    # Freeing b marks its CPU block ids as accessed in the GPU allocator: KeyError inside vLLM.
    refused("engine_abort_swapped_prefix_cache", sut.abort, "b")
    refused("engine_dead", sut.schedule)


def test_chunked_prefill_chunks_and_finishing_prefills_first(sut: VllmV0Sut) -> None:
    sut.start(
        config(num_gpu_blocks=8, max_num_batched_tokens=6, max_model_len=32, enable_chunked_prefill=True), PROFILE
    )
    sut.add_request(request("a", list(range(1, 11)), 2))
    sut.add_request(request("b", [1, 2, 3], 1))
    # 1: a's 10 tokens are cut to the budget 6 (all 3 blocks allocated at once); it does not sample.
    # b gets a chunk of 0 and the full budget stops the loop.
    assert sut.schedule() == step([group("a", 6, True, [0, 1, 2], sample=False)], prefills=1, tokens=6, running=1)
    assert sut.update_from_output({}, {}) == []
    # 2: running first: a's last 4 tokens (it samples); then b gets the remaining 2 of its 3 tokens.
    # New prefills are listed before running prefills.
    assert sut.schedule() == step(
        [group("b", 2, True, [3], sample=False), group("a", 4, True, [0, 1, 2])], prefills=2, tokens=6, running=2
    )
    assert sut.update_from_output({"a": [7]}, {}) == [out("a", [7])]
    # 3: running = [a, b] (a finished its prompt, so it was put first); a decodes, b's last token samples.
    # Prefills come first in the output.
    assert sut.schedule() == step(
        [group("b", 1, True, [3]), group("a", 1, False, [0, 1, 2])], prefills=1, tokens=2, running=2
    )
    # Both reach max_tokens; outputs in scheduled order, finished ids in running order.
    assert sut.update_from_output({"a": [7], "b": [8]}, {}) == [out("b", [8], "length"), out("a", [7], "length")]
    assert sut.schedule() == step([], finished=["a", "b"])


def test_a_prefix_cache_hit_is_counted_and_reported(sut: VllmV0Sut) -> None:
    sut.start(
        config(num_gpu_blocks=8, max_num_batched_tokens=16, max_model_len=16, enable_prefix_caching=True), PROFILE
    )
    sut.add_request(request("a", list(range(1, 9)), 1))
    # 1: nothing cached yet: two full blocks 0, 1.
    assert sut.schedule() == step([group("a", 8, True, [0, 1])], prefills=1, tokens=8, running=1)
    assert sut.update_from_output({"a": [9]}, {}) == [out("a", [9], "length")]
    # a's blocks stay cached in the evictor; b shares its first 8 tokens: 8 cached tokens, 2 uncached
    # (charged), chunk 10; blocks 0, 1 are reused, the partial third block is 2.
    sut.add_request(request("b", [*range(1, 9), 20, 21], 1))
    assert sut.schedule() == step(
        [group("b", 10, True, [0, 1, 2], computed=[0, 1])], prefills=1, tokens=10, running=1, finished=["a"]
    )
    assert sut.observe() == {
        "num_free_gpu_blocks": 5,
        "num_free_cpu_blocks": 0,
        "block_tables": {"b": [0, 1, 2]},
        "cpu_block_tables": {},
    }


def test_stop_rules(sut: VllmV0Sut) -> None:
    sut.start(config(num_gpu_blocks=16, max_num_batched_tokens=40, max_model_len=32), PROFILE)
    sut.add_request(request("e", [1, 2, 3], 5, eos_token_id=2, min_tokens=2))
    sut.add_request(request("s", [4, 5], 5, stop_token_ids=[7]))
    sut.add_request(request("i", [6], 2, eos_token_id=2, ignore_eos=True))
    sut.add_request(request("m", list(range(31)), 5))
    # 1: 3 + 2 + 1 + 31 = 37 tokens <= 40; blocks 0, 1, 2, then 3..10 for m.
    assert sut.schedule() == step(
        [
            group("e", 3, True, [0]),
            group("s", 2, True, [1]),
            group("i", 1, True, [2]),
            group("m", 31, True, list(range(3, 11))),
        ],
        prefills=4,
        tokens=37,
        running=4,
    )
    # e: EOS before min_tokens is no stop; s: stop id 7 (stop_reason 7); i: EOS ignored; m: 32 tokens = max_model_len.
    assert sut.update_from_output({"e": [2], "s": [7], "i": [2], "m": [9]}, {}) == [
        out("e", [2]),
        out("s", [7], "stop", 7),
        out("i", [2]),
        out("m", [9], "length"),
    ]
    # 2: e and i decode in their blocks; s and m are reported finished (running order).
    assert sut.schedule() == step(
        [group("e", 1, False, [0]), group("i", 1, False, [2])], tokens=2, running=2, finished=["s", "m"]
    )
    # e: EOS at min_tokens stops it (no stop_reason); i: max_tokens.
    assert sut.update_from_output({"e": [2], "i": [2]}, {}) == [out("e", [2], "stop"), out("i", [2], "length")]
    assert sut.schedule() == step([], finished=["e", "i"])


def test_aborts_before_and_during_a_step(sut: VllmV0Sut) -> None:
    sut.start(config(num_gpu_blocks=8, max_num_batched_tokens=16, max_model_len=16), PROFILE)
    sut.add_request(request("a", [1, 2], 4))
    sut.add_request(request("b", [3, 4], 4))
    sut.add_request(request("c", [5], 4))
    sut.abort("c")  # still waiting: removed, reported at the next schedule
    assert sut.schedule() == step(
        [group("a", 2, True, [0]), group("b", 2, True, [1])], prefills=2, tokens=4, running=2, finished=["c"]
    )
    sut.abort("a")  # aborted during the step: block 0 goes back at once (deque [0, 2, ...])
    # The engine skips a finished group: its token may be given, and it gets no output.
    assert sut.update_from_output({"a": [5], "b": [5]}, {}) == [out("b", [5])]
    refused("unknown_request_id", sut.abort, "zz")
    sut.abort("a")  # already finished: nothing happens
    # 2: b decodes (its token fits in block 1); a is reported.
    assert sut.schedule() == step([group("b", 1, False, [1])], tokens=1, running=1, finished=["a"])
    sut.update_from_output({"b": [5]}, {})
    # A finished id can be used again; the new a prefills (block 0), which starves b's decode.
    sut.add_request(request("a", [1, 2], 4))
    assert sut.schedule() == step([group("a", 2, True, [0])], prefills=1, tokens=2, running=2)


def test_an_ignored_prompt_gets_a_length_output(sut: VllmV0Sut) -> None:
    # 100 blocks: watermark int(0.01 * 100) = 1. A 100-token prompt needs all 100 blocks:
    # 100 - 100 < 1 -> NEVER -> FINISHED_IGNORED (the engine accepts a prompt of exactly max_model_len).
    sut.start(config(block_size=1, num_gpu_blocks=100, max_num_batched_tokens=100, max_model_len=100), PROFILE)
    sut.add_request(request("x", [1] * 100, 3))
    sut.add_request(request("y", [2] * 3, 3))
    assert sut.schedule() == step([group("y", 3, True, [0, 1, 2])], prefills=1, tokens=3, running=1, ignored=["x"])
    # LLMEngine emits a RequestOutput for each ignored group, after the scheduled ones.
    assert sut.update_from_output({"y": [9]}, {}) == [out("y", [9]), out("x", [], "length")]
    # An ignored group is never in finished_requests_ids (vLLM frees nothing for it).
    assert sut.schedule()["finished_requests_ids"] == []


def test_a_group_that_can_never_swap_back_in_is_ignored_and_its_cpu_blocks_leak(sut: VllmV0Sut) -> None:
    sut.start(
        config(
            block_size=1,
            num_gpu_blocks=3,
            num_cpu_blocks=4,
            max_num_batched_tokens=3,
            max_num_seqs=1,
            max_model_len=3,
            preemption_mode="swap",
        ),
        PROFILE,
    )
    sut.add_request(request("r", [5, 6, 7], 2, min_tokens=2))
    assert sut.schedule() == step([group("r", 3, True, [0, 1, 2])], prefills=1, tokens=3, running=1)
    # 4 tokens >= max_model_len 3, but min_tokens 2 defers every stop rule.
    assert sut.update_from_output({"r": [7]}, {}) == [out("r", [7])]
    # 2: the decode needs a 4th block: r swaps itself out (1 touched + 3 full blocks <= 4 free CPU blocks).
    assert sut.schedule() == step([], preempted=1, swap_out=[[0, 0], [1, 1], [2, 2]])
    assert sut.observe() == {
        "num_free_gpu_blocks": 3,
        "num_free_cpu_blocks": 1,
        "block_tables": {},
        "cpu_block_tables": {"r": [0, 1, 2]},
    }
    sut.update_from_output({}, {})
    # 3: swapping in needs 4 blocks of a 3-block GPU: NEVER, r is ignored. vLLM never frees its CPU table:
    # it is in no queue (not listed) and its 3 CPU blocks stay used.
    assert sut.schedule() == step([], ignored=["r"])
    assert sut.observe() == {
        "num_free_gpu_blocks": 3,
        "num_free_cpu_blocks": 1,
        "block_tables": {},
        "cpu_block_tables": {},
    }
    assert sut.update_from_output({}, {}) == [out("r", [], "length")]


def test_the_v0_golden_corpus_passes_on_vllm_0_10_2(sut: VllmV0Sut) -> None:
    """Every trace of the v0 golden corpus (made by the model) replays on the real scheduler, strict."""
    paths = sorted((REPO_ROOT / "conformance" / "traces" / "vectors" / "v0" / "vllm-0.10").glob("*.jsonl"))
    assert len(paths) >= 50, "the v0 corpus is missing"
    failed = {}
    for path in paths:
        trace = read_trace(path)
        result = replay(trace, sut)
        if result.verdict != PASS:
            failed[path.name] = render_divergence(trace, result)
    assert not failed, "\n\n".join(f"{name}:\n{text}" for name, text in failed.items())


# -------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"num_gpu_blocks": 0}, "invalid_num_gpu_blocks"),
        ({"num_cpu_blocks": -1}, "invalid_num_cpu_blocks"),
        ({"preemption_mode": "evict"}, "invalid_preemption_mode"),
        ({"policy": "lifo"}, "invalid_policy"),
        ({"enable_prefix_caching": 1}, "invalid_config_type"),
        ({"max_num_batched_tokens": 7}, "budget_below_max_model_len"),
        ({"max_num_seqs": 9, "max_num_batched_tokens": 8}, "budget_below_max_num_seqs"),
        ({"max_num_partial_prefills": 0}, "invalid_max_num_partial_prefills"),
        ({"max_num_partial_prefills": 2}, "partial_prefills_without_chunked_prefill"),
        (
            {"max_num_partial_prefills": 2, "enable_chunked_prefill": True, "long_prefill_token_threshold": 9},
            "threshold_above_max_model_len",
        ),
        ({"max_long_partial_prefills": 2}, "invalid_max_long_partial_prefills"),
        ({"max_model_len": 9, "max_num_batched_tokens": 9}, "pool_below_max_model_len"),  # 4 * 2 = 8 < 9
        ({"spec_tokens": 1}, "unknown_config_field"),
    ],
)
def test_config_refusals(sut: VllmV0Sut, fields: dict[str, Any], code: str) -> None:
    refused(code, sut.start, config(**fields), PROFILE)


def test_a_missing_config_field_and_another_profile(sut: VllmV0Sut) -> None:
    cfg = config()
    del cfg["num_cpu_blocks"]
    refused("missing_config_field", sut.start, cfg, PROFILE)
    with pytest.raises(SutUnsupported, match="vllm-0.10"):
        sut.start(config(), "vllm-0.33")


def test_add_request_refusals_change_nothing(sut: VllmV0Sut) -> None:
    sut.start(config(), PROFILE)
    sut.add_request(request("a", [1, 2], 1))
    refused("duplicate_request_id", sut.add_request, request("a", [3], 1))
    refused("empty_prompt", sut.add_request, request("b", [], 1))
    refused("prompt_too_long", sut.add_request, request("b", [1] * 9, 1))  # max_model_len 8: 9 is refused
    refused("invalid_token_id", sut.add_request, request("b", [1, -1], 1))
    refused("invalid_max_tokens", sut.add_request, request("b", [1], 0))
    refused("invalid_min_tokens", sut.add_request, request("b", [1], 2, min_tokens=3))
    refused("invalid_field_type", sut.add_request, request("b", [1], 2, arrival_time="now"))
    # LLMEngine.add_request: "Got priority 1 but Priority scheduling is not enabled."
    refused("priority_without_priority_policy", sut.add_request, request("b", [1], 1, priority=1))
    sut.add_request(request("b", [1] * 8, 1))  # exactly max_model_len: the v0 engine accepts it
    # Only a and b were queued: a takes block 0; b needs 2 blocks, 1 is free: LATER.
    assert sut.schedule() == step([group("a", 2, True, [0])], prefills=1, tokens=2, running=1)


def test_model_output_refusals_change_nothing(sut: VllmV0Sut) -> None:
    sut.start(
        config(num_gpu_blocks=8, max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=True), PROFILE
    )
    refused("unexpected_model_output", sut.update_from_output, {}, {})
    sut.add_request(request("a", [1, 2], 2))
    sut.add_request(request("b", list(range(20, 34)), 2))
    # Budget 16: a takes 2 tokens, b the remaining 14 = all of its prompt, so both sample.
    first = sut.schedule()
    assert [g["do_sample"] for g in first["scheduled_seq_groups"]] == [True, True]
    refused("output_not_processed", sut.schedule)
    refused("bad_num_sampled_tokens", sut.update_from_output, {"a": [5]}, {})  # b's token is missing
    refused("bad_num_sampled_tokens", sut.update_from_output, {"a": [5, 6], "b": [5]}, {})
    refused("unscheduled_model_output", sut.update_from_output, {"a": [5], "b": [5], "z": [5]}, {})
    refused("invalid_token_id", sut.update_from_output, {"a": [-5], "b": [5]}, {})
    refused("drafts_without_spec_decode", sut.update_from_output, {"a": [5], "b": [5]}, {"a": [1]})
    assert sut.update_from_output({"a": [5], "b": [6]}, {}) == [out("a", [5]), out("b", [6])]


# -------------------------------------------------------------------- campaigns


def _run_v0_campaign(tmp_path: Path, examples: int, seed: int, jobs: int) -> dict[str, Any]:
    from schedconf.conformance.runs.campaign import CampaignSpec, run_campaign

    ensure_env("vllm", VERSION)
    return run_campaign(
        CampaignSpec(
            sut=f"vllm-v0@{VERSION}",
            profile=PROFILE,
            examples=examples,
            seed=seed,
            jobs=jobs,
            out_dir=str(tmp_path),
            run_id="v0",
            quiet=True,
        )
    )


def test_a_generated_campaign_passes_on_vllm_0_10_2(tmp_path: Path) -> None:
    """300 generated v0 traces (the issue asks CI for a few hundred), strict, against the real scheduler.

    What the generator aims at must actually be reached, or the campaign proves
    little: each v0 coverage share of the run summary is above zero (in the
    10,000-trace run of the README they are 10-21%).
    """
    summary = _run_v0_campaign(tmp_path, examples=300, seed=7, jobs=2)
    assert summary["failed"] == 0 and summary["unknown"] == 0, summary.get("failures")
    assert summary["passed"] >= 250, {k: summary[k] for k in ("passed", "discarded")}
    coverage = summary["coverage"]
    for case in ("swap_out", "swap_in", "recompute", "ignored", "partial_prefills", "prefix_hit"):
        assert coverage[case] > 0, (case, coverage)


@pytest.mark.deep
def test_a_ten_thousand_trace_campaign_passes_on_vllm_0_10_2(tmp_path: Path) -> None:
    """The README's figure: 10,000 generated traces, strict (``SCHEDCONF_V0_SEED`` picks the seed)."""
    summary = _run_v0_campaign(
        tmp_path, examples=10_000, seed=int(os.environ.get("SCHEDCONF_V0_SEED", "20261201")), jobs=2
    )
    assert summary["failed"] == 0 and summary["unknown"] == 0, summary.get("failures")
