"""Reproduction for vLLM 0.10.2 (the legacy v0 engine): a prefix-cache hit serves KV that was never computed.

Rule: a request may start or resume with computed tokens only if its blocks hold
    KV computed for exactly those tokens (a prefix-cache hit must not serve a
    block whose KV was never computed)
What vLLM 0.10.2 does (the assertion this file fails with):
    at step 2: request 'b' is scheduled with a prefix hit of 16 tokens
    (computed_block_nums [0, 1, 2, 3]), so the model runner skips its positions
    0-15; but block 3, which holds its tokens 12-15, has no KV computed for its
    token 12 (nor does this step compute it)

Story: V7: chunked prefill and prefix caching. At step 1 'a' (20 tokens) is
    admitted: the block manager allocates all its blocks and registers the four
    full ones in the prefix cache; the step computes a's first 8 tokens (blocks 0
    and 1), yet at the end of schedule() every registered block is marked
    computed (Scheduler.schedule -> SelfAttnBlockSpaceManager.mark_blocks_as_computed
    -> PrefixCachingBlockAllocator.mark_blocks_as_computed, which ignores the
    chunk size). At step 2 'b', sharing a's first 16 tokens, gets a hit on all
    four blocks; a's chunk in that step writes block 2 only, and block 3 is
    written at step 3, after b has already sampled its token from it.

Run it where vllm==0.10.2 and pytest are installed (no GPU needed):

    python -m pytest -q THIS_FILE

It builds vLLM's own v0 Scheduler (vllm/core/scheduler.py) with its
SchedulerConfig and CacheConfig, feeds it Sequence/SequenceGroup objects as
LLMEngine.add_request does, plays LLMEngine.step's part around schedule() (the
engine's SingleStepOutputProcessor and StopChecker apply the sampled tokens),
and checks the rule after every schedule(): the positions each group computes
are the ones vLLM's ModelRunner._compute_for_prefix_cache_hit picks. It imports
only vLLM, pytest and the standard library (trace:
V7-v0-prefix-hit-on-unwritten-kv.jsonl, which `schedconf replay --sut
vllm-v0@0.10.2` replays on this scheduler with identical outputs).
"""

import os

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
)
from vllm.utils import Counter  # noqa: E402

CONFIG = {
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
}  # the trace's config

SHARED = list(range(10, 26))  # 16 tokens: four full blocks of 4

# The events, in order: ("add", id, prompt, options), ("schedule", step) and
# ("output", step, sampled tokens).
EVENTS = [
    ("add", "a", SHARED + [1, 2, 3, 4], {"max_tokens": 1, "ignore_eos": True}),
    # Step 1: a +8 (a prompt chunk: no token).
    ("schedule", 1),
    ("output", 1, {}),
    ("add", "b", SHARED + [5], {"max_tokens": 1, "ignore_eos": True}),
    # Step 2: b +17 (a prefix hit of 16: computed_block_nums [0, 1, 2, 3]), a +4.
    ("schedule", 2),
    ("output", 2, {"b": [16]}),
    # Step 3: a +8.
    ("schedule", 3),
    ("output", 3, {"a": [22]}),
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
        max_num_partial_prefills=config["max_num_partial_prefills"],
        max_long_partial_prefills=config["max_long_partial_prefills"],
        long_prefill_token_threshold=config["long_prefill_token_threshold"],
    )
    cache_config = CacheConfig(block_size=config["block_size"], enable_prefix_caching=config["enable_prefix_caching"])
    cache_config.num_gpu_blocks = config["num_gpu_blocks"]
    cache_config.num_cpu_blocks = config["num_cpu_blocks"]
    return Scheduler(scheduler_config, cache_config, None)


class Engine:
    """LLMEngine's part around the scheduler (engine/llm_engine.py: add_request, step, _process_model_outputs)."""

    def __init__(self, config):
        self.scheduler = create_scheduler(config)
        self.seq_counter = Counter()
        stop_checker = StopChecker(config["max_model_len"], lambda seq: None)
        self.output_processor = SingleStepOutputProcessor(self.scheduler.scheduler_config, None, [self.scheduler],
                                                          self.seq_counter, stop_checker)

    def add_request(self, request_id, prompt, options):
        seq = Sequence(next(self.seq_counter), token_inputs(list(prompt)), CONFIG["block_size"],
                       options.get("eos_token_id"))
        params = SamplingParams(max_tokens=options["max_tokens"], min_tokens=options.get("min_tokens", 0),
                                stop_token_ids=options.get("stop_token_ids", []),
                                ignore_eos=options.get("ignore_eos", False))
        params.update_from_generation_config({}, options.get("eos_token_id"))
        self.scheduler.add_seq_group(SequenceGroup(request_id=request_id, seqs=[seq], arrival_time=0,
                                                   sampling_params=params))

    def apply_output(self, metadata, outputs, sampled):
        """_process_model_outputs for one step without async output processing."""
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


RULES = {
    "prefix_hit_kv_was_computed": "a request may start or resume with computed tokens only if its blocks hold KV computed for exactly those tokens (a prefix-cache hit must not serve a block whose KV was never computed)",
}


def rule_broken(step, rule, what):
    raise AssertionError(f"Rule broken at step {step} [{rule}]: {what}. Rule: {RULES[rule]}")


class WrittenKv:
    """Which tokens each KV slot was computed for: slot (block, offset) holds the token
    sequence up to and including its position, as written by the step that ran it.
    A step writes the positions its model runner computes when its output is applied;
    a group may read KV the same step writes (one forward pass writes each layer's KV
    before attention reads it)."""

    def __init__(self, block_size):
        self.block_size = block_size
        self.slots = {}  # (block id, offset) -> tuple of token ids up to that position
        self.pending = {}

    def on_schedule(self, metadata, outputs, step):
        """Note what this step computes, then check every position a prefix hit skips."""
        bs = self.block_size
        self.pending, reads = {}, []
        for md, scheduled in zip(metadata, outputs.scheduled_seq_groups):
            seq = scheduled.seq_group.first_seq
            table = md.block_tables[seq.seq_id]
            tokens = seq.get_token_ids()
            computed = seq.data.get_num_computed_tokens()  # v0 counts the chunk only after the step
            seq_len = computed + md.token_chunk_size
            first = computed
            num_hit = len(md.computed_block_nums or []) * bs
            # ModelRunner._compute_for_prefix_cache_hit (vllm/worker/model_runner.py)
            if md.is_prompt and num_hit > computed:
                first = num_hit if num_hit < seq_len else seq_len - 1
                reads.append((md, table, tokens, computed, first))
            for pos in range(first, seq_len):
                self.pending[(table[pos // bs], pos % bs)] = tuple(tokens[: pos + 1])
        for md, table, tokens, computed, first in reads:
            for pos in range(computed, first):
                slot = (table[pos // bs], pos % bs)
                if tuple(tokens[: pos + 1]) not in (self.slots.get(slot), self.pending.get(slot)):
                    j = pos // bs
                    rule_broken(step, "prefix_hit_kv_was_computed",
                                f"request {md.request_id!r} is scheduled with a prefix hit of"
                                f" {len(md.computed_block_nums) * bs} tokens (computed_block_nums"
                                f" {list(md.computed_block_nums)}), so the model runner skips its positions"
                                f" {computed}-{first - 1}; but block {table[j]}, which holds its tokens"
                                f" {j * bs}-{j * bs + bs - 1}, has no KV computed for its token {pos}"
                                f" (nor does this step compute it)")

    def on_output(self):
        self.slots.update(self.pending)
        self.pending = {}


def test_prefix_hit_kv_was_computed():
    engine = Engine(CONFIG)
    kv = WrittenKv(CONFIG["block_size"])
    metadata = outputs = None
    for event in EVENTS:
        if event[0] == "add":
            _, rid, prompt, options = event
            engine.add_request(rid, prompt, options)
        elif event[0] == "schedule":
            metadata, outputs, _ = engine.scheduler.schedule()
            engine.scheduler.get_and_reset_finished_requests_ids()
            kv.on_schedule(metadata, outputs, event[1])
        elif event[0] == "output":
            engine.apply_output(metadata, outputs, event[2])
            kv.on_output()
