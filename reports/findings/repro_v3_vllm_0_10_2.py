"""Reproduction for vLLM 0.10.2 (the legacy v0 engine): a swapped group that can never swap back in leaks its CPU blocks.

Rule: every block a request holds goes back to its pool when the request ends,
    however it ends (finished, ignored, aborted): once no request is left, the
    CPU swap pool is whole again
What vLLM 0.10.2 does (the assertion this file fails with):
    at step 3: request 'r', swapped out at step 2, is finished as
    FINISHED_IGNORED because it can never swap back in, but its 3 CPU blocks
    are never freed: 1 of 4 CPU blocks stays free, for good (aborting 'r'
    frees nothing either: it is in no queue)

Story: V3: preemption_mode "swap", blocks of 1 token, 3 GPU blocks, 4 CPU
    blocks, max_model_len 3. Request 'r' has a 3-token prompt and
    min_tokens=2. At step 1 it prefills into blocks 0-2 and samples a token:
    4 tokens >= max_model_len, but StopChecker.maybe_stop_sequence returns
    early while the output is shorter than min_tokens
    (engine/output_processor/stop_checker.py:46), before the max_model_len cap
    (85), so 'r' goes on. At step 2 its decode needs a 4th GPU block: 'r'
    swaps itself out (3 blocks -> CPU 0-2). At step 3
    Scheduler._schedule_swapped (core/scheduler.py:812) asks can_swap_in:
    4 blocks of a 3-block GPU is AllocStatus.NEVER
    (core/block_manager.py:510-512), so it sets the sequence FINISHED_IGNORED
    and pops the group from swapped (857-866), with no free_seq: the CPU block
    table stays in SelfAttnBlockSpaceManager.block_tables for ever. No queue
    holds the group any more, so Scheduler.abort_seq_group cannot find it, and
    free_finished_seq_groups only walks running. Each such request costs the
    engine its CPU blocks until it restarts.

Run it where vllm==0.10.2 and pytest are installed (no GPU needed):

    python -m pytest -q THIS_FILE      (or: python THIS_FILE)

It builds vLLM's own v0 Scheduler (vllm/core/scheduler.py) with its
SchedulerConfig and CacheConfig, feeds it Sequence/SequenceGroup objects as
LLMEngine.add_request does and plays LLMEngine.step's and
LLMEngine.abort_request's part around it (the engine's
SingleStepOutputProcessor and StopChecker apply the sampled tokens). It
imports only vLLM, pytest and the standard library. The same events are
test_a_group_that_can_never_swap_back_in_is_ignored_and_its_cpu_blocks_leak of
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
    "block_size": 1,
    "num_gpu_blocks": 3,
    "num_cpu_blocks": 4,
    "max_num_batched_tokens": 3,
    "max_num_seqs": 1,
    "max_model_len": 3,
    "enable_chunked_prefill": False,
    "enable_prefix_caching": False,
    "policy": "fcfs",
    "preemption_mode": "swap",
}

# The events, in order: ("add", id, prompt, options), ("schedule", step),
# ("output", step, sampled tokens) and ("abort", after step, id).
EVENTS = [
    ("add", "r", [5, 6, 7], {"max_tokens": 2, "min_tokens": 2}),
    # Step 1: r +3 in blocks 0, 1, 2; it samples its first token (4 tokens, min_tokens defers every stop rule).
    ("schedule", 1),
    ("output", 1, {"r": [7]}),
    # Step 2: the decode needs a 4th block: r swaps itself out (gpu 0, 1, 2 -> cpu 0, 1, 2). Nothing runs.
    ("schedule", 2),
    ("output", 2, {}),
    # Step 3: swapping r in needs 4 blocks of a 3-block GPU: NEVER, r is ignored (finished).
    ("schedule", 3),
    ("output", 3, {}),
    # The client of r aborts it, for good measure.
    ("abort", 3, "r"),
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
    "blocks_return_to_the_pool": "every block a request holds goes back to its pool when the request ends, however it "
    "ends (finished, ignored, aborted)",
}


def rule_broken(step, rule, what):
    raise AssertionError(f"Rule broken at step {step} [{rule}]: {what}. Rule: {RULES[rule]}")


def test_the_cpu_blocks_of_an_ignored_swapped_request_are_freed():
    engine = Engine(CONFIG)
    s = engine.scheduler
    bm = s.block_manager
    groups = {}
    step = 0
    for event in EVENTS:
        step = event[1] if event[0] in ("schedule", "abort") else step
        result = engine.run(event)
        if event[0] == "add":
            groups[event[1]] = s.waiting[-1]
        if event[0] == "schedule":
            for group in result[1].ignored_seq_groups:
                print(f"step {step}: request {group.request_id!r} ignored, its sequence {group.first_seq.status.name}")
        if event[0] == "abort":  # the end: r was ignored at step 3, then aborted
            live = [g for g in list(s.waiting) + list(s.running) + list(s.swapped) if not g.is_finished()]
            free_cpu = bm.get_num_free_cpu_blocks()
            if not live and free_cpu != CONFIG["num_cpu_blocks"]:
                held = {rid: list(bm.block_tables[g.first_seq.seq_id].physical_block_ids)
                        for rid, g in groups.items() if g.first_seq.seq_id in bm.block_tables}
                rule_broken(step, "blocks_return_to_the_pool",
                            f"no request is left ({', '.join(f'{r!r} {g.first_seq.status.name}' for r, g in groups.items())}), "
                            f"yet only {free_cpu} of {CONFIG['num_cpu_blocks']} CPU blocks are free"
                            f"{' after Scheduler.abort_seq_group' if event[0] == 'abort' else ''}: the block manager "
                            f"still holds the block tables {held} (block ids >= {bm.num_total_gpu_blocks} are CPU "
                            f"blocks). Scheduler._schedule_swapped finishes a swapped group that can never swap in "
                            f"(AllocStatus.NEVER, vllm/core/scheduler.py:857-866) as FINISHED_IGNORED and drops it "
                            f"from swapped without free_seq, so nothing ever frees its CPU blocks")


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
