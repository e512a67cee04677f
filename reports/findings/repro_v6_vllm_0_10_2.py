"""Reproduction for vLLM 0.10.2 (the legacy v0 engine): two ways a swapped-out request kills the engine with prefix caching.

Rule: a request preempted by swapping (in the middle of its chunked prefill,
    or as a decode) waits in swapped and can be swapped back in; scheduling a
    valid workload never raises
What vLLM 0.10.2 does (the two assertions this file fails with):
    at step 4 of the first test: Scheduler.schedule() raises
    AssertionError("Number of cached tokens should not be less than the
    number of computed tokens for a sequence that's still in prefill. But
    there are 0 cached tokens and 4 computed tokens ...") in
    Scheduler._get_num_new_uncached_and_cached_tokens
    (vllm/core/scheduler.py:1939); at step 11 of the second:
    Scheduler.schedule() raises AssertionError in
    ComputedBlocksTracker.remove_seq
    (vllm/core/block/prefix_caching_block.py:1086). Either way the engine is
    dead

Story: V6 (the engine_cached_below_computed crash): chunked prefill, prefix
    caching and preemption_mode "swap"; blocks of 2 tokens, 6 GPU blocks, a
    4-token budget. At step 1 'D' (2 tokens, block 0) runs whole and 'A'
    (8 tokens) is admitted with a first chunk of 2: its whole prompt is
    allocated (blocks 1-4). ComputedBlocksTracker.get_num_cached_tokens
    records A's cached-token count, 0, and freezes it while A is in prefill
    (core/block/prefix_caching_block.py:1059-1071). At step 2 A computes 2
    more tokens (4 of 8) and D's decode takes the last free block. At step 3
    D's decode finds no free block (can_append_slots counts a touched block),
    so the tail of running, A, a prefill chunk, is swapped out. At step 4
    running is empty and Scheduler._schedule_swapped (core/scheduler.py:812)
    looks at A: it can swap in, so it counts A's tokens
    (_get_num_new_uncached_and_cached_tokens, 1863): cached 0 (frozen) <
    computed 4, and vLLM's sanity check (1930-1945) allows that only for a
    RUNNING chunked prefill: A is SWAPPED, so the assertion fails.

    The other crash of V6 (test_a_swapped_decode_waits_for_a_seat_without_crashing):
    a swapped decode 'r2' that could swap back in finds both seats
    (max_num_seqs=2) taken at steps 10 and 11. Each time _schedule_swapped
    drops it from the ComputedBlocksTracker (core/scheduler.py:890-896). A
    decode is never tracked again (_get_num_new_uncached_and_cached_tokens
    counts it as 1 uncached token without get_num_cached_tokens,
    core/scheduler.py:1908-1912), so the second drop fails the assertion of
    ComputedBlocksTracker.remove_seq (core/block/prefix_caching_block.py:1086).

Run it where vllm==0.10.2 and pytest are installed (no GPU needed):

    python -m pytest -q THIS_FILE      (or: python THIS_FILE)

It builds vLLM's own v0 Scheduler (vllm/core/scheduler.py) with its
SchedulerConfig and CacheConfig, feeds it Sequence/SequenceGroup objects as
LLMEngine.add_request does and plays LLMEngine.step's part around it (the
engine's SingleStepOutputProcessor and StopChecker apply the sampled tokens).
It imports only vLLM, pytest and the standard library. The same events are
schedconf's golden scenario
conformance/testdata/scenarios_v0/crash_swapped_prefill_chunk.txt.
"""

import os
import sys
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the scheduler runs on the CPU platform
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

from vllm.config import CacheConfig, SchedulerConfig  # noqa: E402
from vllm.core.scheduler import Scheduler  # noqa: E402
from vllm.engine.output_processor.single_step import SingleStepOutputProcessor  # noqa: E402
from vllm.engine.output_processor.stop_checker import StopChecker  # noqa: E402
from vllm.inputs.data import token_inputs  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.sequence import (  # noqa: E402
    CompletionSequenceGroupOutput,
    Logprob,
    Sequence,
    SequenceGroup,
    SequenceOutput,
    SequenceStatus,
)
from vllm.utils import Counter  # noqa: E402

CONFIG = {
    "block_size": 2,
    "num_gpu_blocks": 6,
    "num_cpu_blocks": 16,
    "max_num_batched_tokens": 4,
    "max_num_seqs": 4,
    "max_model_len": 12,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "preemption_mode": "swap",
}

# The events, in order: ("add", id, prompt, options), ("schedule", step) and
# ("output", step, sampled tokens).
EVENTS = [
    ("add", "D", [0, 1], {"max_tokens": 3}),
    ("add", "A", [20, 21, 22, 23, 24, 25, 26, 27], {"max_tokens": 2}),
    # Step 1: D +2 (block 0), A +2 of 8 (no sample; its whole prompt allocated: blocks 1-4). 1 block free.
    ("schedule", 1),
    ("output", 1, {"D": [100]}),
    # Step 2: A +2 (4 of 8 computed), D's decode takes the last free block (5).
    ("schedule", 2),
    ("output", 2, {"D": [101]}),
    # Step 3: D's decode needs a free block, none: the tail A (a prefill chunk) is swapped out.
    # D samples its 3rd token (max_tokens): it finishes.
    ("schedule", 3),
    ("output", 3, {"D": [102]}),
    # Step 4: A can swap in; counting its tokens trips vLLM's assertion.
    ("schedule", 4),
]


TRACKER_CONFIG = {
    "block_size": 2,
    "num_gpu_blocks": 8,
    "num_cpu_blocks": 5,
    "max_num_batched_tokens": 4,
    "max_num_seqs": 2,
    "max_model_len": 12,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "preemption_mode": "swap",
}

TRACKER_EVENTS = [
    ("add", "r0", [1000, 1001, 1002], {"max_tokens": 9, "arrival_time": 1}),
    ("add", "r1", [5100], {"max_tokens": 7, "arrival_time": 2}),
    ("add", "r2", [2000, 2001], {"max_tokens": 3, "arrival_time": 5}),
    ("add", "r3", [5300], {"max_tokens": 3, "arrival_time": 6}),
    # Steps 1-6: r0 and r1 run (one prefill at a time: r1 is admitted at step 2), filling the GPU pool.
    ("schedule", 1), ("output", 1, {"r0": [5]}),
    ("schedule", 2), ("output", 2, {"r0": [2], "r1": [6]}),
    ("schedule", 3), ("output", 3, {"r0": [3], "r1": [3]}),
    ("schedule", 4), ("output", 4, {"r0": [2], "r1": [7]}),
    ("schedule", 5), ("output", 5, {"r0": [2], "r1": [4]}),
    ("schedule", 6), ("output", 6, {"r0": [4], "r1": [7]}),
    # Step 7: r0's decode needs a block: r1 is swapped out; r2's prefill runs.
    ("schedule", 7), ("output", 7, {"r0": [5], "r2": [7]}),
    ("schedule", 8), ("output", 8, {"r0": [3], "r2": [3]}),
    # Step 9: r2 (now a decode) is swapped out; r3's prefill runs; r0 finishes (max_tokens).
    ("schedule", 9), ("output", 9, {"r0": [4], "r3": [2]}),
    # Step 10: r1 swaps back in; r2, next in swapped, could swap in but both seats are taken:
    # dropped from the ComputedBlocksTracker.
    ("schedule", 10), ("output", 10, {"r1": [6], "r3": [6]}),
    # Step 11: the same again: the second drop asserts.
    ("schedule", 11),
]


def create_scheduler(config):
    """vLLM's v0 Scheduler for `config`, with the block counts set as the engine sets them after profiling."""
    scheduler_config = SchedulerConfig(
        max_num_seqs=config["max_num_seqs"],
        max_num_batched_tokens=config["max_num_batched_tokens"],
        max_model_len=config["max_model_len"],
        enable_chunked_prefill=config["enable_chunked_prefill"],
        policy=config["policy"],
        preemption_mode=config["preemption_mode"],
    )
    cache_config = CacheConfig(block_size=config["block_size"], enable_prefix_caching=config["enable_prefix_caching"])
    cache_config.num_gpu_blocks = config["num_gpu_blocks"]
    cache_config.num_cpu_blocks = config["num_cpu_blocks"]
    return Scheduler(scheduler_config, cache_config, None)


class Engine:
    """LLMEngine's part around the scheduler (engine/llm_engine.py: add_request, step, _process_model_outputs)."""

    def __init__(self, config):
        self.config = config
        self.scheduler = create_scheduler(config)
        self.seq_counter = Counter()
        stop_checker = StopChecker(config["max_model_len"], lambda seq: None)
        self.output_processor = SingleStepOutputProcessor(self.scheduler.scheduler_config, None, [self.scheduler],
                                                          self.seq_counter, stop_checker)
        self.pending = None

    def add_request(self, request_id, prompt, options):
        seq = Sequence(next(self.seq_counter), token_inputs(list(prompt)), self.config["block_size"], None)
        params = SamplingParams(max_tokens=options["max_tokens"], min_tokens=options.get("min_tokens", 0),
                                ignore_eos=True)
        params.update_from_generation_config({}, None)
        self.scheduler.add_seq_group(SequenceGroup(request_id=request_id, seqs=[seq],
                                                   arrival_time=options.get("arrival_time", 0),
                                                   sampling_params=params, priority=options.get("priority", 0)))

    def schedule(self):
        metadata, outputs, _ = self.scheduler.schedule()
        self.scheduler.get_and_reset_finished_requests_ids()
        self.pending = (metadata, outputs)
        return metadata, outputs

    def apply_output(self, sampled):
        """_process_model_outputs for the pending step, without async output processing."""
        (metadata, outputs), self.pending = self.pending, None
        finished = False
        for md, scheduled in zip(metadata, outputs.scheduled_seq_groups):
            group = scheduled.seq_group
            if group.is_finished():
                continue
            group.update_num_computed_tokens(md.token_chunk_size)
            if md.do_sample:
                token = sampled[md.request_id][0]
                sample = SequenceOutput(group.first_seq.seq_id, token, {token: Logprob(logprob=0.0)})
                self.output_processor.process_outputs(group, [CompletionSequenceGroupOutput([sample], None)], False)
            finished = finished or group.is_finished()
        if finished:
            self.scheduler.free_finished_seq_groups()

    def run(self, event):
        if event[0] == "add":
            self.add_request(*event[1:])
        elif event[0] == "abort":
            self.scheduler.abort_seq_group(event[2])
        elif event[0] == "schedule":
            return self.schedule()
        elif event[0] == "output":
            self.apply_output(event[2])
        return None


def where_vllm_raised(exc):
    """'function (vllm/...py:line)' of the innermost frame inside vLLM."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = frame.filename.replace(os.sep, "/")
        if "/vllm/" in path:
            return f"{frame.name} (vllm/{path.rsplit('/vllm/', 1)[1]}:{frame.lineno})"
    return "outside vLLM"


RULES = {
    "engine_survives": "scheduling a valid workload never raises inside vLLM: a request swapped out (in the middle "
    "of its chunked prefill, or as a decode) waits in swapped and is swapped back in",
}


def rule_broken(step, rule, what):
    raise AssertionError(f"Rule broken at step {step} [{rule}]: {what}. Rule: {RULES[rule]}")


def test_a_swapped_prefill_chunk_is_swapped_back_in():
    engine = Engine(CONFIG)
    a = None
    for event in EVENTS:
        if event[0] == "schedule" and a is not None:
            state = (f"request 'A' is {a.first_seq.status.name} with {a.first_seq.data.get_num_computed_tokens()} of "
                     f"{a.first_seq.get_prompt_len()} prompt tokens computed")
        try:
            engine.run(event)
        except Exception as exc:
            rule_broken(event[1], "engine_survives",
                        f"Scheduler.schedule() raised {type(exc).__name__}({str(exc)!r}) in {where_vllm_raised(exc)}. "
                        f"Before the step, {state}: swapped out in the middle of its chunked prefill at step 3. "
                        f"Scheduler._schedule_swapped counts its tokens, and ComputedBlocksTracker.get_num_cached_tokens "
                        f"returns the count it froze when A's prefill began (0; "
                        f"vllm/core/block/prefix_caching_block.py:1064-1071), below its computed tokens; vLLM's "
                        f"sanity check (core/scheduler.py:1930-1945) accepts that only for a RUNNING chunked prefill")
        if event[0] == "add" and event[1] == "A":
            a = engine.scheduler.waiting[-1]
    assert a is not None and a.first_seq.status == SequenceStatus.RUNNING, "A was swapped back in"


def test_a_swapped_decode_waits_for_a_seat_without_crashing():
    engine = Engine(TRACKER_CONFIG)
    for event in TRACKER_EVENTS:
        try:
            engine.run(event)
        except Exception as exc:
            rule_broken(event[1], "engine_survives",
                        f"Scheduler.schedule() raised {type(exc).__name__}({str(exc)!r}) in {where_vllm_raised(exc)}. "
                        f"Request 'r2', swapped out as a decode at step 9, could swap back in at steps 10 and 11 but "
                        f"found both seats (max_num_seqs=2) taken; each time Scheduler._schedule_swapped dropped it "
                        f"from the ComputedBlocksTracker (core/scheduler.py:890-896), and a decode is never tracked "
                        f"again (_get_num_new_uncached_and_cached_tokens counts it without get_num_cached_tokens), "
                        f"so the second drop fails ComputedBlocksTracker.remove_seq's assertion")
    assert [g.request_id for g in engine.scheduler.swapped] == ["r2"], "r2 waits in swapped for a seat"


def main():
    failed = 0
    for name, test in list(globals().items()):
        if name.startswith("test_") and callable(test):
            try:
                test()
            except AssertionError as exc:
                failed += 1
                print(f"FAIL {name}: {exc}")
            else:
                print(f"PASS {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
