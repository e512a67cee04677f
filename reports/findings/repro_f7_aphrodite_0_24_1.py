"""Reproduction for Aphrodite Engine 0.24.1: a prefix-cache hit serves KV that was never computed.

Rule: a request may start or resume with computed tokens only if its blocks hold KV computed for
    exactly those tokens (a prefix-cache hit must not serve a block whose KV was never computed)
What Aphrodite 0.24.1 does (the assertion this file fails with):
    at step 6: request 'r0' is scheduled with 20 computed tokens (a prefix-cache hit or tokens kept
    from earlier steps), but block 3, which holds its tokens 16-19, has no KV computed for its
    token 16 (nor does this step compute it)

Story: at step 5 r0 is scheduled (an 8-token chunk whose allocation caches the block of tokens
    16-19), then preempted in the same step by r1 under the priority policy; the chunk never runs,
    but the block stays in the prefix cache. At step 6 r0 resumes with a 20-token prefix hit that
    includes that never-computed block: the model attends to garbage for those 4 positions.

Why (file:line in aphrodite-engine 0.24.1):
* `KVCacheManager.allocate_slots` caches the request's full blocks at scheduling time, up to
  `num_computed_tokens + num_new_tokens` (aphrodite/v1/core/kv_cache_manager.py:515-520);
* when the priority victim is already in `scheduled_running_reqs`, `Scheduler.schedule()` takes its
  tokens back out of the step and returns their budget (aphrodite/v1/core/sched/scheduler.py:653-666),
  but not the hashes that allocation registered;
* `_preempt_request` (scheduler.py:672 -> :1296-1308) then frees the blocks into the free queue with
  those hashes, and the victim's resumption hits them.
Fix: when a scheduled victim is removed from the step, uncache the blocks its allocation cached in
this step (or cache blocks only once the step's output is applied).

This is vLLM's bug (vLLM 0.32.0 and 0.33.0 fail the same way at the same step), inherited by
Aphrodite, whose v1 scheduler is vLLM 0.32's renamed. The events are schedconf's trace
F7-same-step-priority-victim-cache-hit.jsonl; this file is repro_f7_vllm_0_33_0.py (written by
`schedconf repro`) with Aphrodite's names (`vllm` -> `aphrodite`, `VllmConfig` -> `AphroditeConfig`,
`vllm_config=` -> `aphrodite_config=`, `VLLM_*` -> `APHRODITE_*`).

Run it where aphrodite-engine==0.24.1 is installed (no GPU needed), with or without pytest:

    python THIS_FILE                 # runs every test_* function, exits 1 if one fails
    python -m pytest -q THIS_FILE

It builds Aphrodite's own Scheduler the way vLLM's tests build vLLM's (tests/v1/core/utils.py:
create_scheduler, create_requests), replays the events below through the scheduler's public API
with a fake model runner, and checks the rule after every call. It imports only Aphrodite and the
standard library.
"""

import json
import os
import tempfile
import traceback

os.environ.setdefault("APHRODITE_TARGET_DEVICE", "cpu")  # the scheduler runs on the CPU platform
os.environ.setdefault("APHRODITE_USE_V2_MODEL_RUNNER", "0")  # the V1 layout of SchedulerOutput
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local config.json, no weights

from aphrodite.config import AphroditeConfig, CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig  # noqa: E402
from aphrodite.sampling_params import SamplingParams  # noqa: E402
from aphrodite.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from aphrodite.v1.core.sched.scheduler import Scheduler  # noqa: E402
from aphrodite.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from aphrodite.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402
from aphrodite.v1.request import Request, RequestStatus  # noqa: E402
from aphrodite.v1.structured_output import StructuredOutputManager  # noqa: E402
from aphrodite.utils.hashing import sha256  # noqa: E402

CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 12,
    "max_num_batched_tokens": 16,
    "max_num_seqs": 4,
    "max_model_len": 32,
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 8,
    "enable_prefix_caching": True,
    "policy": "priority",
    "num_spec_tokens": 0,
}  # the trace's config

FILLER_TOKEN = 0
"""Sampled for a request that reaches the end of its sequence in a step the trace gave no token for."""

# The events, in order: ("add", id, prompt, options), ("abort", id),
# ("schedule", step) and ("output", step, sampled tokens, draft tokens).
EVENTS = [
    ("add", "r2", [199, 194, 131], {"max_tokens": 8, "priority": 1, "arrival_time": 1}),
    ("add", "r3", [211, 11, 242, 464, 446, 290, 71, 274, 303], {"max_tokens": 10, "priority": 2, "arrival_time": 1}),
    # Step 1: r2 +3, r3 +8.
    ("schedule", 1),
    ("output", 1, {"r2": [29]}, {}),
    # Step 2: r2 +1, r3 +1.
    ("schedule", 2),
    ("output", 2, {"r2": [51], "r3": [30]}, {}),
    ("add", "r0", [36, 1, 508, 69, 69, 8, 201, 328, 237, 177, 435, 503, 100, 245, 402, 355, 79, 264, 370, 437, 224, 118, 386], {"max_tokens": 10, "priority": 1, "arrival_time": 3}),
    ("add", "r1", [36, 1, 508, 69, 69, 8, 201, 328, 237, 177, 435, 503, 340, 345, 185, 78, 310, 411, 266, 1], {"max_tokens": 5, "priority": 1, "arrival_time": 3}),
    # Step 3: r0 +8, r1 +6 (prefix hit of 8), r2 +1, r3 +1.
    ("schedule", 3),
    ("output", 3, {"r2": [29], "r3": [45]}, {}),
    # Step 4: r0 +8, r1 +6, r2 +1; preempted: r3.
    ("schedule", 4),
    ("output", 4, {"r1": [4], "r2": [13]}, {}),
    # Step 5: r1 +1, r2 +1; preempted: r0.
    ("schedule", 5),
    ("output", 5, {"r1": [27], "r2": [25]}, {}),
    # Step 6: r0 +3 (resumes with 20 computed), r1 +1, r2 +1.
    ("schedule", 6),
    ("output", 6, {"r0": [26], "r1": [20], "r2": [12]}, {}),
]


def create_scheduler(config):
    """Aphrodite's Scheduler for `config`, built as vLLM's tests build vLLM's (tests/v1/core/utils.py)."""
    model_dir = tempfile.mkdtemp()
    with open(os.path.join(model_dir, "config.json"), "w") as f:  # a tiny Llama: config only
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
                   "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 1 << 20,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}, f)
    scheduler_config = SchedulerConfig(
        max_num_seqs=config["max_num_seqs"],
        max_num_batched_tokens=config["max_num_batched_tokens"],
        max_model_len=config["max_model_len"],
        enable_chunked_prefill=config["enable_chunked_prefill"],
        long_prefill_token_threshold=config["long_prefill_token_threshold"],
        policy=config["policy"],
        is_encoder_decoder=False,
        async_scheduling=False,
    )
    model_config = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=config["max_model_len"],
                               dtype="float32", seed=0)
    cache_config = CacheConfig(block_size=config["block_size"], enable_prefix_caching=config["enable_prefix_caching"])
    speculative_config = None
    if config["num_spec_tokens"]:  # ngram: drafts come from the events, no draft model
        speculative_config = SpeculativeConfig(method="ngram", num_speculative_tokens=config["num_spec_tokens"],
                                               prompt_lookup_max=1, prompt_lookup_min=1)
    aphrodite_config = AphroditeConfig(model_config=model_config, cache_config=cache_config,
                             scheduler_config=scheduler_config, speculative_config=speculative_config)
    spec = FullAttentionSpec(block_size=config["block_size"], num_kv_heads=1, head_size=1,
                             dtype=model_config.dtype)  # float32
    cache_config.num_gpu_blocks = config["num_gpu_blocks"]
    kv_cache_config = KVCacheConfig(num_blocks=config["num_gpu_blocks"], kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return Scheduler(aphrodite_config=aphrodite_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(aphrodite_config),
                     block_size=config["block_size"],
                     log_stats=False)


def create_request(request_id, prompt, options):
    """A Request as the engine makes one (as in vLLM's tests/v1/core/utils.py: create_requests)."""
    eos = options.get("eos_token_id")
    params = SamplingParams(max_tokens=options["max_tokens"], min_tokens=options.get("min_tokens", 0),
                            stop_token_ids=options.get("stop_token_ids", []),
                            ignore_eos=options.get("ignore_eos", False))
    if eos is not None:
        params.update_from_generation_config({}, eos)
    block_hasher = None
    if CONFIG["enable_prefix_caching"]:
        init_none_hash(sha256)
        block_hasher = get_request_block_hasher(CONFIG["block_size"], sha256)
    return Request(request_id=request_id, prompt_token_ids=list(prompt), sampling_params=params,
                   pooling_params=None, arrival_time=options.get("arrival_time", 0),
                   priority=options.get("priority", 0),
                   block_hasher=block_hasher)


def make_runner_output(scheduler_output, samples, sampled):
    """What a model runner returns for the step: each scheduled request's sampled
    tokens (none for a prefill chunk that does not reach the end of the sequence)."""
    req_ids = list(scheduler_output.num_scheduled_tokens)
    tokens = []
    for rid in req_ids:
        drafts = scheduler_output.scheduled_spec_decode_tokens.get(rid, [])
        tokens.append(list(sampled.get(rid) or [FILLER_TOKEN])[: 1 + len(drafts)] if samples[rid] else [])
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                             sampled_token_ids=tokens)


RULES = {
    "engine_does_not_crash": "a scheduler must not crash on valid input to a config it accepted",
    "prefix_hit_kv_was_computed": "a request may start or resume with computed tokens only if its blocks hold KV computed for exactly those tokens (a prefix-cache hit must not serve a block whose KV was never computed)",
}


def rule_broken(step, rule, what):
    raise AssertionError(f"Rule broken at step {step} [{rule}]: {what}. Rule: {RULES[rule]}")


def call_engine(step, what, fn, *args):
    """Call Aphrodite; an exception is a crash on a config it accepted (rule: the engine does not crash)."""
    try:
        return fn(*args)
    except Exception as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = (frame.filename[frame.filename.rfind("aphrodite/"):] if "aphrodite/" in frame.filename
                 else frame.filename)
        rule_broken(step, "engine_does_not_crash",
                    f"{what} raised {type(exc).__name__}({exc}) at {where}:{frame.lineno}")


class WrittenKv:
    """Which tokens each KV slot was computed for: slot (block, offset) holds the
    token sequence up to and including its position, as written by the step that
    ran it. A step writes its scheduled tokens when its output is applied, unless
    the request was preempted or finished in that step (then it did not run them);
    a request may read KV the same step writes (one forward pass computes both)."""

    def __init__(self, block_size):
        self.block_size = block_size
        self.slots = {}  # (block id, offset) -> tuple of token ids up to that position
        self.pending = {}

    def on_schedule(self, scheduler, out, step):
        """Note what this step writes, then check every scheduled request's computed tokens."""
        self.pending, computed = {}, {}
        for rid, n in out.num_scheduled_tokens.items():
            request = scheduler.requests[rid]
            if request.status != RequestStatus.RUNNING:
                continue
            blocks = scheduler.kv_cache_manager.get_block_ids(rid)[0]
            tokens = list(request.all_token_ids) + list(out.scheduled_spec_decode_tokens.get(rid, []))
            start = request.num_computed_tokens - n  # schedule() already counted this step's tokens
            computed[rid] = (blocks, tokens, start)
            for pos in range(start, start + n):
                self.pending[(blocks[pos // self.block_size], pos % self.block_size)] = tuple(tokens[: pos + 1])
        for rid, (blocks, tokens, start) in computed.items():
            for pos in range(start):
                block = blocks[pos // self.block_size]
                slot = (block, pos % self.block_size)
                if tuple(tokens[: pos + 1]) not in (self.slots.get(slot), self.pending.get(slot)):
                    first = pos // self.block_size * self.block_size
                    rule_broken(step, "prefix_hit_kv_was_computed",
                                f"request {rid!r} is scheduled with {start} computed tokens (a prefix-cache"
                                f" hit or tokens kept from earlier steps), but block {block}, which holds its"
                                f" tokens {first}-{first + self.block_size - 1}, has no KV computed for its"
                                f" token {pos} (nor does this step compute it)")

    def on_output(self):
        self.slots.update(self.pending)
        self.pending = {}


def test_prefix_hit_kv_was_computed():
    scheduler = create_scheduler(CONFIG)
    kv = WrittenKv(CONFIG["block_size"])
    out, samples, step = None, {}, 1  # an add or abort belongs to the step it comes before (or during)
    for event in EVENTS:
        if event[0] == "add":
            _, rid, prompt, options = event
            call_engine(step, f"add_request({rid!r})", scheduler.add_request, create_request(rid, prompt, options))
        elif event[0] == "abort":
            call_engine(step, f"finish_requests({event[1]!r})", scheduler.finish_requests, event[1],
                        RequestStatus.FINISHED_ABORTED)
        elif event[0] == "schedule":
            step = event[1]
            out = call_engine(step, "schedule()", scheduler.schedule)
            # A request samples when this step's tokens reach the end of its sequence.
            samples = {rid: scheduler.requests[rid].num_computed_tokens >= scheduler.requests[rid].num_tokens
                       for rid in out.num_scheduled_tokens}
            kv.on_schedule(scheduler, out, step)
        elif event[0] == "output":
            _, step, sampled, drafts = event
            call_engine(step, "update_from_output()", scheduler.update_from_output, out,
                        make_runner_output(out, samples, sampled))
            kv.on_output()
            if drafts and out.total_num_scheduled_tokens:
                call_engine(step, "update_draft_token_ids()", scheduler.update_draft_token_ids,
                            DraftTokenIds(list(drafts), list(drafts.values())))
            step += 1


if __name__ == "__main__":  # without pytest: run every test_* function, exit 1 if one fails
    import sys
    import traceback

    failed = 0
    for name, test in [(n, f) for n, f in list(globals().items()) if n.startswith("test_") and callable(f)]:
        try:
            test()
        except AssertionError as exc:
            failed += 1
            print(f"FAIL {name}: {exc}", flush=True)
        except Exception:  # noqa: BLE001 - an error, not the assertion: show where
            failed += 1
            print(f"ERROR {name}:\n{traceback.format_exc()}", flush=True)
        else:
            print(f"PASS {name}", flush=True)
    sys.exit(1 if failed else 0)
