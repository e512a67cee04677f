"""Reproduction for Aphrodite Engine 0.24.1: the scheduler crashes on a config it accepted, with one request.

Rule: a scheduler must not crash on valid input to a config it accepted.
What Aphrodite 0.24.1 does: `Scheduler.schedule()` raises AssertionError at
    aphrodite/v1/core/sched/scheduler.py:1102 (`assert num_new_tokens == 1 + self.num_spec_tokens`).

Story (speculative decoding with num_spec_tokens=2, long_prefill_token_threshold=2, prefix caching):
    `a` (8 prompt tokens, max_tokens=1) runs and finishes; its two full blocks stay in the prefix
    cache. `b` (the same 8 tokens + 1) is then the only request: its prefix hit leaves one token to
    compute, so the waiting loop pads it to 1 + num_spec_tokens = 3 tokens (scheduler.py:905-922),
    the long-prefill threshold cuts that to 2 (:924-926), allocate_slots succeeds and the
    admission asserts 2 == 3: the engine core dies.

This is vLLM 0.32/0.33's padded-admission crash (schedconf reports/findings.md, finding 3),
inherited by Aphrodite, in a wider form: vLLM lifts the threshold for a request that is alone
(`num_eligible_reqs > 1`), so there a lone request never crashes; Aphrodite applies the
threshold to every request, so a single client's request kills the engine. Upstream fix: apply
the threshold before padding, or do not pad when 0 < threshold <= num_spec_tokens.

Run it where aphrodite-engine==0.24.1 is installed (no GPU needed), with or without pytest:

    python THIS_FILE                 # runs every test_* function, exits 1 if one fails
    python -m pytest -q THIS_FILE

It imports only Aphrodite and the standard library.
"""

import json
import os
import tempfile
import traceback

os.environ.setdefault("APHRODITE_TARGET_DEVICE", "cpu")  # the scheduler runs on the CPU platform
os.environ.setdefault("APHRODITE_USE_V2_MODEL_RUNNER", "0")  # the V1 layout of SchedulerOutput
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local config.json, no weights

import torch  # noqa: E402
from aphrodite.config import AphroditeConfig, CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig  # noqa: E402
from aphrodite.sampling_params import SamplingParams  # noqa: E402
from aphrodite.utils.hashing import get_hash_fn_by_name  # noqa: E402
from aphrodite.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from aphrodite.v1.core.sched.scheduler import Scheduler  # noqa: E402
from aphrodite.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from aphrodite.v1.outputs import ModelRunnerOutput  # noqa: E402
from aphrodite.v1.request import Request  # noqa: E402
from aphrodite.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK_SIZE = 4
MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 2,
         "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
         "bos_token_id": 1, "eos_token_id": 2}


def make_scheduler() -> Scheduler:
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(MODEL, f)
    config = AphroditeConfig(
        model_config=ModelConfig(model=folder, skip_tokenizer_init=True, max_model_len=32, dtype="float32", seed=0),
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32,
                                         enable_chunked_prefill=True, long_prefill_token_threshold=2,
                                         is_encoder_decoder=False, async_scheduling=False),
        speculative_config=SpeculativeConfig(method="ngram", num_speculative_tokens=2,
                                             prompt_lookup_max=1, prompt_lookup_min=1),
    )
    config.cache_config.num_gpu_blocks = 16
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return Scheduler(aphrodite_config=config, kv_cache_config=kv,
                     structured_output_manager=StructuredOutputManager(config), block_size=BLOCK_SIZE, log_stats=False)


def make_request(rid: str, prompt: list[int], max_tokens: int) -> Request:
    params = SamplingParams(max_tokens=max_tokens)
    params.update_from_generation_config({}, 2)
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    return Request(request_id=rid, prompt_token_ids=prompt, sampling_params=params, pooling_params=None,
                   arrival_time=0, block_hasher=get_request_block_hasher(BLOCK_SIZE, hash_fn))


def run_step(scheduler: Scheduler, sampled: dict[str, list[int]]):
    out = scheduler.schedule()
    ids = list(out.num_scheduled_tokens)
    scheduler.update_from_output(out, ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[sampled.get(r, []) for r in ids]))
    return out


def test_a_lone_request_with_a_prefix_hit_does_not_crash_the_scheduler():
    scheduler = make_scheduler()
    prompt = list(range(11, 19))
    scheduler.add_request(make_request("a", prompt, max_tokens=1))
    for step in range(4):  # the threshold caps even this lone request: 2 prompt tokens per step
        out = run_step(scheduler, {"a": [5]} if step == 3 else {})
        assert out.num_scheduled_tokens == {"a": 2}
    assert "a" not in scheduler.requests or scheduler.requests["a"].is_finished()
    scheduler.add_request(make_request("b", prompt + [99], max_tokens=4))  # alone; 8 of 9 tokens cached
    try:
        out = scheduler.schedule()
    except AssertionError as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = frame.filename[max(frame.filename.rfind("aphrodite/"), 0):] + f":{frame.lineno}"
        raise AssertionError(
            f"Aphrodite's schedule() crashed on a lone request: AssertionError at {where} "
            f"({frame.line}): the padded admission 1 + num_spec_tokens = 3 was cut to 2 by "
            "long_prefill_token_threshold; a scheduler must not crash on valid input to a config it accepted"
        ) from exc
    assert out.num_scheduled_tokens["b"] >= 1


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
