"""Reproduction for vLLM 0.10.2 (the legacy v0 engine): aborting a swapped group with prefix caching raises KeyError.

Rule: a request can be aborted in any state; aborting a swapped-out request
    frees its CPU blocks and the engine keeps running
What vLLM 0.10.2 does (the assertion this file fails with):
    after step 2: Scheduler.abort_seq_group('b') raises KeyError inside
    PrefixCachingBlockAllocator.mark_blocks_as_accessed
    (vllm/core/block/prefix_caching_block.py:573): the engine is dead, and b's
    CPU blocks are never freed

Story: V2: prefix caching and preemption_mode "swap", 2 GPU blocks of 4
    tokens, 4 CPU blocks. At step 1 'a' and 'b' (4 tokens each) run in blocks
    0 and 1. At step 2 a's decode needs a new block, none is free: 'b', the
    tail of running, is swapped out (gpu 1 -> cpu 0). Aborting 'b' then calls
    Scheduler.free_seq -> SelfAttnBlockSpaceManager.free
    (core/block_manager.py:254), which first marks the sequence's blocks as
    accessed at its last access time (262-263,
    LastAccessBlocksTracker.update_seq_blocks_last_access,
    core/block/prefix_caching_block.py:1128). That goes to the GPU allocator
    whatever the device (CpuGpuBlockAllocator.mark_blocks_as_accessed,
    core/block/cpu_gpu_block_allocator.py:314-319, "Prefix caching only
    supported on GPU"), but b's table now holds CPU block ids (2, the first CPU
    block after the 2 GPU ones), which the GPU allocator's _block_tracker does
    not know: KeyError (prefix_caching_block.py:573). free() never reaches
    block_tables[seq_id].free() (270). LLMEngine.abort_request is what a client
    disconnect calls, so any client that gives up on a request while it is
    swapped out kills a v0 engine with prefix caching and swap space.

Run it where vllm==0.10.2 and pytest are installed (no GPU needed):

    python -m pytest -q THIS_FILE      (or: python THIS_FILE)

It builds vLLM's own v0 Scheduler (vllm/core/scheduler.py) with its
SchedulerConfig and CacheConfig, feeds it Sequence/SequenceGroup objects as
LLMEngine.add_request does and plays LLMEngine.step's and
LLMEngine.abort_request's part around it (the engine's
SingleStepOutputProcessor and StopChecker apply the sampled tokens). It
imports only vLLM, pytest and the standard library. The same events are
test_aborting_a_swapped_group_with_prefix_caching_kills_the_engine of
schedconf's tests/vllm/test_vllm_v0.py.
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
    "block_size": 4,
    "num_gpu_blocks": 2,
    "num_cpu_blocks": 4,
    "max_num_batched_tokens": 8,
    "max_num_seqs": 4,
    "max_model_len": 8,
    "enable_chunked_prefill": False,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "preemption_mode": "swap",
}

# The events, in order: ("add", id, prompt, options), ("schedule", step),
# ("output", step, sampled tokens) and ("abort", after step, id).
EVENTS = [
    ("add", "a", [1, 2, 3, 4], {"max_tokens": 5}),
    ("add", "b", [5, 6, 7, 8], {"max_tokens": 5}),
    # Step 1: a +4 in block 0, b +4 in block 1.
    ("schedule", 1),
    ("output", 1, {"a": [9], "b": [9]}),
    # Step 2: a's decode needs a block, none is free: b is swapped out (gpu 1 -> cpu 0); a decodes in block 1.
    ("schedule", 2),
    ("output", 2, {"a": [9]}),
    # The client of b gives up.
    ("abort", 2, "b"),
    # Step 3: a decodes on.
    ("schedule", 3),
    ("output", 3, {"a": [9]}),
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
    "abort_of_a_swapped_request": "a request can be aborted in any state: aborting a swapped-out request frees its "
    "CPU blocks, and the engine keeps running",
}


def rule_broken(step, rule, what):
    raise AssertionError(f"Rule broken at step {step} [{rule}]: {what}. Rule: {RULES[rule]}")


def describe(event):
    """The vLLM call an event makes."""
    return {"add": "Scheduler.add_seq_group", "abort": f"Scheduler.abort_seq_group({event[-1]!r})",
            "schedule": "Scheduler.schedule()", "output": "the engine's output processing"}[event[0]]


def test_aborting_a_swapped_request_with_prefix_caching():
    engine = Engine(CONFIG)
    bm = engine.scheduler.block_manager
    step = 0
    for event in EVENTS:
        step = event[1] if event[0] in ("schedule", "abort") else step
        try:
            engine.run(event)
        except Exception as exc:
            rule_broken(step, "abort_of_a_swapped_request",
                        f"{describe(event)} raised "
                        f"{type(exc).__name__}({str(exc)!r}) in {where_vllm_raised(exc)}: "
                        f"SelfAttnBlockSpaceManager.free (vllm/core/block_manager.py:262-263) marks the swapped "
                        f"sequence's blocks as accessed in the GPU allocator (core/block/cpu_gpu_block_allocator.py:319), "
                        f"but they are CPU block ids the prefix-caching GPU allocator does not know")
        if event[0] == "abort":
            free_cpu = bm.get_num_free_cpu_blocks()
            if free_cpu != CONFIG["num_cpu_blocks"]:
                rule_broken(step, "abort_of_a_swapped_request",
                            f"after aborting {event[2]!r}, {free_cpu} of {CONFIG['num_cpu_blocks']} CPU blocks are "
                            f"free")


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
