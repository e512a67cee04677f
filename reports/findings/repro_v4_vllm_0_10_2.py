"""Reproduction for vLLM 0.10.2 (the legacy v0 engine): a prefill that cannot append a slot preempts itself forever.

Rule: a lone request that fits the KV cache finishes: with one request, 4
    GPU blocks of 4 tokens and a 13-token prompt (16 tokens with its 3 output
    tokens), the engine makes progress until the request is done
What vLLM 0.10.2 does (the assertions this file fails with):
    the request never finishes. preemption_mode "recompute": it is admitted
    and computes a 4-token chunk, preempted the next step, re-admitted,
    preempted again, for ever (a livelock: steps alternate 4 tokens / 0
    tokens). preemption_mode "swap": it is swapped out at step 2 and never
    scheduled again (a hang: every later step is empty)

Story: V4: chunked prefill, a 4-token budget, blocks of 4 tokens, 4 GPU
    blocks. At step 1 the 13-token prompt is admitted: the block manager
    allocates blocks for the whole prompt (4 blocks, the last holding 1 token;
    Scheduler._allocate_and_set_running, core/scheduler.py:1717) and computes
    its first 4-token chunk. At step 2 Scheduler._schedule_running asks
    _can_append_slots for the running prefill (core/scheduler.py:729):
    SelfAttnBlockSpaceManager.can_append_slots (core/block_manager.py:207-234)
    counts the blocks touched by appending the sequence's unseen tokens, and
    BlockTable.get_num_blocks_touched_by_append_slots
    (core/block/block_table.py:374-379) gives 1 + ceil((0 - 3) / 4) = 1 block
    for ZERO unseen tokens, since the last block is partly filled. 1 > 0 free
    blocks, and the request is alone in running, so it preempts itself
    (core/scheduler.py:745-751). Recompute: it goes back to waiting, is
    re-admitted at step 3 (all its blocks again) and the same happens at
    step 4, and so on. Swap: it is swapped out, and Scheduler._schedule_swapped
    is called without enable_chunking (core/scheduler.py:1387), so its 9
    uncomputed tokens are never chunked and never fit the 4-token budget:
    nothing is ever scheduled again. A prefill that appends nothing to its
    last block should need no free block.

Run it where vllm==0.10.2 and pytest are installed (no GPU needed):

    python -m pytest -q THIS_FILE      (or: python THIS_FILE)

It builds vLLM's own v0 Scheduler (vllm/core/scheduler.py) with its
SchedulerConfig and CacheConfig, feeds it Sequence/SequenceGroup objects as
LLMEngine.add_request does and plays LLMEngine.step's part around it (the
engine's SingleStepOutputProcessor and StopChecker apply the sampled tokens,
token 9 each time). It imports only vLLM, pytest and the standard library.
The same case is
tests/engine/test_impl_v0.py::test_a_prefill_that_cannot_append_a_slot_is_preempted_forever
of schedconf.
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
    "num_gpu_blocks": 4,
    "num_cpu_blocks": 8,
    "max_num_batched_tokens": 4,
    "max_num_seqs": 4,
    "max_model_len": 16,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": False,
    "policy": "fcfs",
    "preemption_mode": "recompute",  # the swap test sets "swap"
}

PROMPT = list(range(1, 14))  # 13 tokens: 4 blocks, the last one partly filled
MAX_TOKENS = 3  # 16 tokens in all: exactly the 4 blocks
MAX_STEPS = 100  # the request needs 4 prefill chunks and 2 decodes: 6 steps


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
    "a_lone_request_that_fits_finishes": "a lone request whose prompt and outputs fit the KV cache finishes",
}


def rule_broken(step, rule, what):
    raise AssertionError(f"Rule broken at step {step} [{rule}]: {what}. Rule: {RULES[rule]}")


def run_alone(preemption_mode):
    """Run the lone request for up to MAX_STEPS steps; return the group and what each step did."""
    engine = Engine(dict(CONFIG, preemption_mode=preemption_mode))
    engine.run(("add", "a", PROMPT, {"max_tokens": MAX_TOKENS}))
    group = engine.scheduler.waiting[0]
    steps = []
    for _ in range(MAX_STEPS):
        metadata, outputs = engine.schedule()
        steps.append((sum(md.token_chunk_size for md in metadata), outputs.preempted,
                      len(outputs.blocks_to_swap_out)))
        engine.apply_output({md.request_id: [9] for md in metadata if md.do_sample})
        if group.is_finished():
            break
    return group, steps


def explain(group, steps, mode):
    seq = group.first_seq
    shown = ", ".join(f"{t} tok" + (" +preempted" if p else "") + (f" +swap-out {n}" if n else "")
                      for t, p, n in steps[:6])
    return (f"preemption_mode {mode!r}: after {len(steps)} steps request 'a' ({len(PROMPT)}-token prompt, "
            f"max_tokens {MAX_TOKENS}, alone in a 4-block KV cache that holds all {len(PROMPT) + MAX_TOKENS} tokens) "
            f"is {seq.status.name} with {seq.get_output_len()} outputs; steps 1-6: [{shown}], and "
            f"{sum(1 for t, _, _ in steps if t == 0)} of the {len(steps)} steps computed nothing. At step 2 "
            f"SelfAttnBlockSpaceManager.can_append_slots (vllm/core/block_manager.py:221-234) counts 1 touched block "
            f"(BlockTable.get_num_blocks_touched_by_append_slots, core/block/block_table.py:374-379: "
            f"1 + ceil((0 - 3) / 4)) for a running prefill that has no unseen token, its last block being partly "
            f"filled; no block is free, so the request preempts itself (core/scheduler.py:729, 745-751)")


def test_a_lone_prefill_finishes_with_recompute_preemption():
    group, steps = run_alone("recompute")
    if not group.is_finished():
        rule_broken(len(steps), "a_lone_request_that_fits_finishes",
                    explain(group, steps, "recompute") + "; it is re-admitted and preempted again, for ever")


def test_a_lone_prefill_finishes_with_swap_preemption():
    group, steps = run_alone("swap")
    if not group.is_finished():
        rule_broken(len(steps), "a_lone_request_that_fits_finishes",
                    explain(group, steps, "swap") + "; swapped out, it never comes back: Scheduler._schedule_swapped "
                    "is called without enable_chunking (core/scheduler.py:1387), so its 9 uncomputed tokens never "
                    "fit the 4-token budget")


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
