"""Reproduction for vLLM 0.33.0's AsyncScheduler: with three steps in flight, a request is scheduled a token past max_tokens.

Rule: a step schedules a decode only for a request whose steps in flight do
    not already produce its last token (max_tokens)
What vLLM 0.33.0 does (the assertion this file fails with):
    a request with a 6-token prompt and max_tokens=2 is scheduled in each of
    three steps taken before any output comes back (6, 1 and 1 tokens); steps
    1 and 2 sample its two tokens, and step 2's output finishes it (length), so
    step 3's token is computed and thrown away

Story: finding A1 of schedconf's reports/findings.md. AsyncScheduler skips a
    running request when its steps in flight are sure to reach max_tokens:
    placeholders > 0 and num_computed_tokens + 2 - placeholders >=
    num_prompt_tokens + max_tokens (vllm/v1/core/sched/scheduler.py:801-807).
    The "- placeholders + 2" treats all placeholders but one as drafts that
    may be rejected; without spec decode each placeholder is a sure token. At
    step 3 the request has 7 computed tokens and 2 placeholders: 7 + 2 - 2 =
    7 < 8, so it is scheduled again. Two steps in flight (async scheduling
    with the V1 model runner) never reach this; three do (pipeline
    parallelism, whose engine keeps a deeper batch queue). The cost is compute,
    not a wrong output: the engine ignores the extra token.

Run it where vllm==0.33.0 and pytest are installed (no GPU needed):

    python -m pytest -q THIS_FILE      (or: python THIS_FILE)

It builds vLLM's own AsyncScheduler the way vLLM's tests build a Scheduler
(tests/v1/core/utils.py: create_scheduler, create_requests) and plays the
engine's batch queue: three schedule() calls, then the three outputs in
order. It imports only vLLM and the standard library.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the scheduler runs on the CPU platform
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the V1 layout of SchedulerOutput
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local config.json, no weights

from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402

CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 8,
    "max_num_batched_tokens": 16,
    "max_num_seqs": 2,
    "max_model_len": 16,
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0,
    "enable_prefix_caching": False,
    "policy": "fcfs",
    "num_spec_tokens": 0,
}
STEPS_IN_FLIGHT = 3


def create_scheduler(config):
    """vLLM's AsyncScheduler for `config`, built as tests/v1/core/utils.py builds a Scheduler."""
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
    vllm_config = VllmConfig(model_config=model_config, cache_config=cache_config,
                             scheduler_config=scheduler_config, speculative_config=speculative_config)
    spec = FullAttentionSpec(block_size=config["block_size"], num_kv_heads=1, head_size=1,
                             dtype=model_config.dtype)  # float32
    cache_config.num_gpu_blocks = config["num_gpu_blocks"]
    kv_cache_config = KVCacheConfig(num_blocks=config["num_gpu_blocks"], kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return AsyncScheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config),
                     block_size=config["block_size"],
                     log_stats=False)


def create_request(request_id, prompt, options):
    """A Request as the engine makes one (tests/v1/core/utils.py: create_requests)."""
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


def runner_output(scheduler_output, token):
    """The model runner's answer to a step: one sampled token per scheduled request."""
    req_ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                             sampled_token_ids=[[token] for _ in req_ids])


def test_no_step_is_scheduled_past_max_tokens():
    scheduler = create_scheduler(CONFIG)
    scheduler.add_request(create_request("a", [5] * 6, {"max_tokens": 2}))
    steps = [scheduler.schedule() for _ in range(STEPS_IN_FLIGHT)]  # the batch queue: no output back yet
    scheduled = [dict(step.num_scheduled_tokens) for step in steps]
    finishes = []
    for step in steps:  # the outputs, oldest first, as EngineCore applies them
        outputs = scheduler.update_from_output(step, runner_output(step, 7))
        reasons = [o.finish_reason for eco in outputs.values() for o in eco.outputs]
        finishes.append([getattr(reason, "name", reason) for reason in reasons])
    assert "a" not in scheduled[2], (
        f"with {STEPS_IN_FLIGHT} steps in flight the scheduler gave request 'a' (6 prompt tokens, max_tokens 2) "
        f"{scheduled[0].get('a')}, {scheduled[1].get('a')} and {scheduled[2].get('a')} tokens, though steps 1 and 2 "
        f"already sample both of its outputs; the outputs' finish reasons, step by step: {finishes} (step 2 "
        "finishes it by length, step 3's token is computed and ignored). AsyncScheduler's skip "
        "(num_computed_tokens + 2 - placeholders >= prompt + max_tokens, scheduler.py:801-807) counts all "
        "placeholders but one as drafts that may be rejected; without spec decode none is"
    )


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
