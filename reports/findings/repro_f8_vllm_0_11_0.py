"""Reproduction for vLLM 0.11.0: a request preempted in a step keeps the tokens that step scheduled for it.

Rule: every request a step schedules is running when schedule() returns: a request
    the step preempted gives its tokens back with its blocks
What vLLM 0.11.0 does (the assertion this file fails with):
    at step 3: schedule() gave request 'r1' 1 token(s), but it is PREEMPTED and
    not in Scheduler.running: the step runs its tokens on KV blocks it no longer
    holds

Story: priority policy, 5 usable blocks of one token: at step 3 r1 (priority 4) is
    scheduled first and takes the last free block for its decode; r3 (priority
    0) then needs a block for its own and preempts r1, whose token stays in the
    step's num_scheduled_tokens

Run it where vllm==0.11.0 and pytest are installed (no GPU needed):

    python -m pytest -q THIS_FILE

It builds vLLM's own Scheduler the way vLLM's tests do
(tests/v1/core/utils.py: create_scheduler, create_requests), replays the events
below through the scheduler's public API with a fake model runner, and checks
the rule after every call. Written by `schedconf repro F8-priority-victim-keeps-its-tokens.jsonl
--sut vllm-v1@0.11.0 --next-step`; it imports only vLLM, pytest and the standard library.
"""

import json
import os
import tempfile
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the scheduler runs on the CPU platform
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the V1 layout of SchedulerOutput
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local config.json, no weights

from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.utils import sha256  # noqa: E402

CONFIG = {
    "block_size": 1,
    "num_gpu_blocks": 6,
    "max_num_batched_tokens": 2,
    "max_num_seqs": 2,
    "max_model_len": 5,
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0,
    "enable_prefix_caching": False,
    "policy": "priority",
    "num_spec_tokens": 0,
}  # the trace's config

FILLER_TOKEN = 0
"""Sampled for a request that reaches the end of its sequence in a step the trace gave no token for."""

# The events, in order: ("add", id, prompt, options), ("abort", id),
# ("schedule", step) and ("output", step, sampled tokens, draft tokens).
EVENTS = [
    ("add", "r1", [5100, 5101], {"max_tokens": 3, "priority": 4, "arrival_time": 4, "eos_token_id": 1}),
    # Step 1: r1 +2.
    ("schedule", 1),
    ("output", 1, {"r1": [321]}, {}),
    ("add", "r3", [5300], {"max_tokens": 2, "arrival_time": 8, "eos_token_id": 1}),
    # Step 2: r1 +1, r3 +1.
    ("schedule", 2),
    ("output", 2, {"r1": [348], "r3": [155]}, {}),
    # Step 3: the step after the trace, where the safety check stopped.
    ("schedule", 3),
]


def use_cpu_platform():
    """vLLM 0.11 picks its CPU platform only for a "+cpu" build, and that platform
    accepts no block size but 16 (a rule of its attention kernels; no kernel runs
    here). Select it with that one check lifted, before vLLM reads the platform."""
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    class SchedulerOnlyCpuPlatform(CpuPlatform):
        @classmethod
        def check_and_update_config(cls, vllm_config):
            block_size = vllm_config.cache_config.block_size
            vllm_config.cache_config.block_size = 16
            try:
                super().check_and_update_config(vllm_config)
            finally:
                vllm_config.cache_config.block_size = block_size

    vllm.platforms._current_platform = SchedulerOnlyCpuPlatform()


def create_scheduler(config):
    """vLLM's Scheduler for `config` (tests/v1/core/utils.py: create_scheduler)."""
    use_cpu_platform()
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
        async_scheduling=False,
    )
    model_config = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=config["max_model_len"],
                               dtype="float32", seed=0)
    cache_config = CacheConfig(block_size=config["block_size"], enable_prefix_caching=config["enable_prefix_caching"])
    speculative_config = None
    if config["num_spec_tokens"]:  # ngram: drafts come from the events, no draft model
        speculative_config = SpeculativeConfig(method="ngram", num_speculative_tokens=config["num_spec_tokens"],
                                               prompt_lookup_max=1, prompt_lookup_min=1)
    vllm_config = VllmConfig(model_config=model_config, cache_config=cache_config,
                             scheduler_config=scheduler_config, speculative_config=speculative_config)
    spec = FullAttentionSpec(block_size=config["block_size"], num_kv_heads=1, head_size=1,
                             dtype=model_config.dtype)  # float32
    cache_config.num_gpu_blocks = config["num_gpu_blocks"]
    kv_cache_config = KVCacheConfig(num_blocks=config["num_gpu_blocks"], kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config),
                     log_stats=False)


def create_request(request_id, prompt, options):
    """A Request as the engine makes one (tests/v1/core/utils.py: create_requests)."""
    eos = options.get("eos_token_id")
    params = SamplingParams(max_tokens=options["max_tokens"], min_tokens=options.get("min_tokens", 0),
                            stop_token_ids=options.get("stop_token_ids", []),
                            ignore_eos=options.get("ignore_eos", False))
    block_hasher = None
    if CONFIG["enable_prefix_caching"]:
        init_none_hash(sha256)
        block_hasher = get_request_block_hasher(CONFIG["block_size"], sha256)
    return Request(request_id=request_id, prompt_token_ids=list(prompt), sampling_params=params,
                   pooling_params=None, arrival_time=options.get("arrival_time", 0),
                   priority=options.get("priority", 0), eos_token_id=eos,
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
                             sampled_token_ids=tokens, logprobs=None, prompt_logprobs_dict={}, pooler_output=[])


RULES = {
    "engine_does_not_crash": "a scheduler must not crash on valid input to a config it accepted",
    "scheduled_requests_are_running": "every request a step schedules is running when schedule() returns: a request the step preempted gives its tokens back with its blocks",
}


def rule_broken(step, rule, what):
    raise AssertionError(f"Rule broken at step {step} [{rule}]: {what}. Rule: {RULES[rule]}")


def call_engine(step, what, fn, *args):
    """Call vLLM; an exception is a crash on a config it accepted (rule: the engine does not crash)."""
    try:
        return fn(*args)
    except Exception as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = frame.filename[frame.filename.rfind("vllm/"):] if "vllm/" in frame.filename else frame.filename
        rule_broken(step, "engine_does_not_crash",
                    f"{what} raised {type(exc).__name__}({exc}) at {where}:{frame.lineno}")


def check_scheduled_requests_are_running(scheduler, out, step):
    """Every request this step schedules is RUNNING when schedule() returns (a request it preempted has no tokens)."""
    running = {request.request_id for request in scheduler.running}
    preempted = set(getattr(out, "preempted_req_ids", None) or ())
    for rid, n in out.num_scheduled_tokens.items():
        request = scheduler.requests.get(rid)
        if request is not None and request.status == RequestStatus.RUNNING and rid in running:
            continue
        status = request.status.name if request is not None else "no longer in Scheduler.requests"
        rule_broken(step, "scheduled_requests_are_running", f"schedule() gave request {rid!r} {n} token(s), but it is"
                    f" {status}{' (preempted in this very step)' if rid in preempted else ''} and not in"
                    f" Scheduler.running: the step runs its tokens on KV blocks it no longer holds")


def test_scheduled_requests_are_running():
    scheduler = create_scheduler(CONFIG)
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
            check_scheduled_requests_are_running(scheduler, out, step)
        elif event[0] == "output":
            _, step, sampled, drafts = event
            call_engine(step, "update_from_output()", scheduler.update_from_output, out,
                        make_runner_output(out, samples, sampled))
            if drafts and out.total_num_scheduled_tokens:
                call_engine(step, "update_draft_token_ids()", scheduler.update_draft_token_ids,
                            DraftTokenIds(list(drafts), list(drafts.values())))
            step += 1
