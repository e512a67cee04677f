"""Reproduction for vLLM 0.10.2 (the legacy v0 engine): priority preemption in swap mode puts a SWAPPED group into waiting.

Rule: a group that priority preemption takes off the GPU is either recomputed
    (its sequence WAITING, its blocks freed) or swapped out (its sequence
    SWAPPED, the group in the swapped queue, its GPU->CPU copies in the step's
    blocks_to_swap_out); the engine keeps running either way
What vLLM 0.10.2 does (the assertions this file fails with):
    at step 2: request 'a' sits in Scheduler.waiting with its sequence SWAPPED,
    its KV mapped to CPU block(s) that no blocks_to_swap_out of the step copies;
    at step 3: schedule() raises AssertionError("Waiting sequence group should
    have only one prompt sequence.") in Scheduler._schedule_prefills
    (vllm/core/scheduler.py:1078): the engine is dead

Story: V1: policy "priority", preemption_mode "swap", 2 GPU blocks of 4 tokens.
    At step 1 'a' (priority 5, 4 tokens) runs in block 0. Then 'b' arrives
    with priority 0 (better) and an 8-token prompt that needs 2 blocks, 1 free.
    At step 2 Scheduler._schedule_priority_preemption (core/scheduler.py:959)
    preempts 'a' with self._preempt(vseq_group, blocks_to_swap_out) (1012):
    in swap mode that is _swap_out (1824), which maps a's block to the CPU and
    sets its sequence SWAPPED; but blocks_to_swap_out is a local list (977)
    that the function drops, and the victim goes to
    waiting_queue.appendleft(vseq_group) (1013) whatever the mode. At step 3
    'b' is admitted and then _schedule_prefills looks at 'a', whose sequence is
    not WAITING: assert len(waiting_seqs) == 1 (1078) fails. (Had 'b' not
    been admitted first, BlockSpaceManager.can_allocate would raise IndexError
    on the SWAPPED group instead.)

Run it where vllm==0.10.2 and pytest are installed (no GPU needed):

    python -m pytest -q THIS_FILE      (or: python THIS_FILE)

It builds vLLM's own v0 Scheduler (vllm/core/scheduler.py) with its
SchedulerConfig and CacheConfig, feeds it Sequence/SequenceGroup objects as
LLMEngine.add_request does and plays LLMEngine.step's part around schedule()
(the engine's SingleStepOutputProcessor and StopChecker apply the sampled
tokens). It imports only vLLM, pytest and the standard library. The same
events are test_priority_preemption_in_swap_mode_puts_a_swapped_group_into_waiting
of schedconf's tests/vllm/test_vllm_v0.py.
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
    "enable_prefix_caching": False,
    "policy": "priority",
    "preemption_mode": "swap",
}

# The events, in order: ("add", id, prompt, options), ("schedule", step) and
# ("output", step, sampled tokens).
EVENTS = [
    ("add", "a", [1, 2, 3, 4], {"max_tokens": 5, "priority": 5}),
    # Step 1: a +4 in block 0.
    ("schedule", 1),
    ("output", 1, {"a": [9]}),
    ("add", "b", [1, 2, 3, 4, 5, 6, 7, 8], {"max_tokens": 5, "priority": 0, "arrival_time": 1}),
    # Step 2: b needs 2 blocks, 1 is free; a (priority 5) is worse than b (priority 0): a is preempted
    # by swapping (gpu 0 -> cpu 0, a mapping vLLM drops) and put into waiting. Nothing runs.
    ("schedule", 2),
    ("output", 2, {}),
    # Step 3: b is admitted; then a, SWAPPED, heads waiting: vLLM's assertion.
    ("schedule", 3),
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
    "preempted_group_is_waiting_or_swapped": "a group that priority preemption takes off the GPU is either "
    "recomputed (in waiting, its sequence WAITING, no blocks) or swapped out (in swapped, its sequence SWAPPED, "
    "its GPU->CPU copies in the step's blocks_to_swap_out)",
    "engine_survives": "scheduling a valid workload never raises inside vLLM",
}


def rule_broken(step, rule, what):
    raise AssertionError(f"Rule broken at step {step} [{rule}]: {what}. Rule: {RULES[rule]}")


def check_waiting_queue(engine, step, outputs, swapped_out):
    """Every group in waiting has its sequence WAITING and holds no CPU blocks nobody copied."""
    s = engine.scheduler
    bm = s.block_manager
    swapped_out.update(cpu for _, cpu in outputs.blocks_to_swap_out)
    for group in s.waiting:
        seq = group.first_seq
        table = bm.block_tables.get(seq.seq_id)
        cpu_ids = [b - bm.num_total_gpu_blocks for b in (table.physical_block_ids if table else [])
                   if b >= bm.num_total_gpu_blocks]
        if seq.status != SequenceStatus.WAITING:
            rule_broken(step, "preempted_group_is_waiting_or_swapped",
                        f"request {group.request_id!r} is in Scheduler.waiting but its sequence is {seq.status.name}, "
                        f"its KV mapped to CPU block(s) {cpu_ids}, of which {sorted(set(cpu_ids) - swapped_out)} "
                        f"no blocks_to_swap_out ever copied (this step's: {list(outputs.blocks_to_swap_out)}): "
                        f"Scheduler._schedule_priority_preemption swaps the victim out into a local "
                        f"blocks_to_swap_out list it throws away (vllm/core/scheduler.py:977, 1012) and puts it "
                        f"into waiting whatever the preemption mode (waiting_queue.appendleft, 1013)")


def test_a_priority_preempted_group_is_waiting_or_swapped():
    engine = Engine(CONFIG)
    swapped_out = set()
    for event in EVENTS:
        result = engine.run(event)
        if event[0] == "schedule":
            check_waiting_queue(engine, event[1], result[1], swapped_out)


def test_the_engine_survives_priority_preemption_in_swap_mode():
    engine = Engine(CONFIG)
    for event in EVENTS:
        try:
            engine.run(event)
        except Exception as exc:
            rule_broken(event[1], "engine_survives",
                        f"Scheduler.schedule() raised {type(exc).__name__}({str(exc)!r}) in "
                        f"{where_vllm_raised(exc)}: request 'a', preempted by priority in swap mode at step 2, is "
                        f"a SWAPPED group in Scheduler.waiting (vllm/core/scheduler.py:1013), and the next look at "
                        f"it asserts that a waiting group has one WAITING sequence")


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
