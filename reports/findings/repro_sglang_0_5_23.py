"""Reproductions for SGLang 0.5.23: two admission bugs of `ignore_eos` requests, and one by-design behaviour.

Every class exercised is SGLang's own and unmodified (no model, no GPU): `Req` and `ScheduleBatch`
(srt/managers/schedule_batch.py), `PrefillAdder` (srt/managers/schedule_policy.py), `RadixCache`,
`ReqToTokenPool` and `TokenToKVPoolAllocator` on device="cpu". SGLang's `Scheduler` itself cannot be
built without a model worker; the tests call what its admission loop calls (scheduler.py:4203-4295:
`PrefillAdder.add_one_req` per waiting request, stop on anything but CONTINUE).

1. BUG `test_an_ignore_eos_request_that_intake_accepts_is_admitted`: an `ignore_eos` request that
   intake accepts is never admitted, even on an empty pool, and blocks the FCFS queue behind it.
   Intake clips max_new_tokens to what the pool can hold (`Scheduler.init_req_max_new_tokens`,
   scheduler.py:2693-2736, "Keep this bound consistent with PrefillAdder's admission budget" ->
   `max_new_tokens_for_memory`, mem_cache/allocator/base.py:104: pool - input - page_size - 1). With
   the radix cache disabled, `ignore_eos` requests take `add_one_req_ignore_eos`
   (schedule_policy.py:1401), which requires `min_free_tokens > IGNORE_EOS_RESERVE_TOKENS * bs`
   (:1295-1303, IGNORE_EOS_RESERVE_TOKENS = 1 at :122): one token more than intake left, so it answers
   NO_TOKEN on an empty pool; the admission loop then stops (scheduler.py:4279-4300) and every request
   behind it waits forever. Benchmarks commonly combine ignore_eos, a large max_tokens and
   --disable-radix-cache.
2. BUG `test_the_ignore_eos_path_keeps_max_prefill_tokens`: the `ignore_eos` admission path ignores
   the prefill token budget. The normal path admits a request past the first only while its input
   fits `rem_input_tokens` (schedule_policy.py:1627-1633); `add_one_req_ignore_eos` adds the request
   (:1327-1351) and checks the budget only afterwards (`return self.budget_state()`, :1383), so one
   prefill batch holds more than `max_prefill_tokens`.
3. NOT A BUG (by design) `test_by_design_ignore_eos_also_ignores_stop_token_ids`: under
   `ignore_eos=True`, `Req._check_token_based_finish` returns before it reads `stop_token_ids`
   (schedule_batch.py:1857-1858), so a stop token the client asked for does not stop the request.
   vLLM stops on it; LMDeploy bans stop ids under ignore_eos too (lmdeploy messages.py:91-93). This
   is a semantics choice shared by other engines, not a bug: the test asserts SGLang's behaviour as
   it is and PASSES; it is here to document the difference.

Run it where sglang==0.5.23 and its CPU import chain (torch, transformers) are installed, with or
without pytest:

    python THIS_FILE                 # runs every test_* function, exits 1 if one fails
    python -m pytest -q THIS_FILE

It imports only SGLang, its dependencies and the standard library. Import workaround:
sglang/srt/configs/__init__.py imports torchvision at module level (through
srt/multimodal/internvl_utils.py), for which PyPI has no CPU wheel matching torch 2.13.0; three
placeholder modules stand in for it (nothing on the scheduler's path calls it), installed after
transformers' processing classes are imported so that transformers records torchvision as absent.
SGLang's global ServerArgs (read by the batch code) is published for a folder holding only a
config.json (no weights).
"""

import atexit
import importlib.machinery
import json
import os
import shutil
import sys
import tempfile
import types
import warnings
from array import array

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model folder is a local config.json
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("SGLANG_LOGGING_LEVEL", "error")
warnings.filterwarnings("ignore")

import transformers  # noqa: E402,F401  (before the placeholder: transformers records torchvision as absent)
from transformers import AutoImageProcessor, AutoProcessor  # noqa: E402,F401


def _torchvision_placeholder(name):
    module = types.ModuleType(name)
    module.__path__ = []
    module.__file__ = f"<placeholder for {name}>"
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def absent(attr):  # any public name imports; calling it fails loudly
        if attr.startswith("__"):
            raise AttributeError(attr)

        def call(*args, **kwargs):
            raise RuntimeError(f"{name}.{attr} called, but torchvision is not installed")
        return call

    module.__getattr__ = absent
    return module


if "torchvision" not in sys.modules:
    for _name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
        sys.modules[_name] = _torchvision_placeholder(_name)

import torch  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_MATCHED_TOKEN, Req, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

_MODEL_DIR = tempfile.mkdtemp(prefix="sglang-repro-model-")
atexit.register(shutil.rmtree, _MODEL_DIR, ignore_errors=True)
with open(os.path.join(_MODEL_DIR, "config.json"), "w") as _f:  # a tiny Llama: config only, no weights
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
               "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
               "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "float16"}, _f)
set_global_server_args_for_scheduler(ServerArgs(model_path=_MODEL_DIR, device="cpu"))


class NoStopStringsTokenizer:
    """What `SamplingParams.normalize` wants: a tokenizer to encode stop strings (there are none here)."""

    eos_token_id = None
    additional_stop_token_ids = None

    def encode(self, *args, **kwargs):
        raise RuntimeError("no stop strings to encode")


def make_req(rid, prompt, max_new_tokens, ignore_eos, stop_token_ids=None, eos_token_ids=None):
    """A Req as the tokenizer manager hands one to the Scheduler."""
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos)
    params.normalize(NoStopStringsTokenizer())
    return Req(rid, "", array("q", prompt), params, eos_token_ids=eos_token_ids, vocab_size=None)


def make_pools(num_tokens, max_running):
    """A token-granular KV pool of `num_tokens` slots with the radix cache DISABLED (--disable-radix-cache)."""
    req_to_token = ReqToTokenPool(size=max_running, max_context_len=8, device="cpu", enable_memory_saver=False)
    allocator = TokenToKVPoolAllocator(size=num_tokens, dtype=torch.float16, device="cpu", kvcache=None,
                                       need_sort=False)
    tree = RadixCache(CacheInitParams(disable=True, req_to_token_pool=req_to_token,
                                      token_to_kv_pool_allocator=allocator, page_size=1))
    return allocator, tree


def make_adder(tree, allocator, max_prefill_tokens, max_running):
    """The PrefillAdder `Scheduler._get_new_batch_prefill_raw` builds for one step, nothing running."""
    running = ScheduleBatch(reqs=[], batch_is_full=False)
    return PrefillAdder(1, tree, allocator, running, 0.7, max_prefill_tokens, None, 0, 0, max_prefill_bs=0,
                        max_running_requests=max_running)


def add(adder, tree, req):
    req.init_next_round_input(tree)
    return adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)


def test_an_ignore_eos_request_that_intake_accepts_is_admitted():
    pool, prompt = 4, [5300]
    allocator, tree = make_pools(pool, max_running=1)
    # Scheduler.init_req_max_new_tokens (scheduler.py:2723-2729) with the pool as token_capacity
    max_new = allocator.max_new_tokens_for_memory(len(prompt), 1, token_capacity=pool, sliding_window_size=None,
                                                  chunk_size=None)
    assert max_new == 1  # intake accepts the request unclipped: it fits the pool
    control = add(make_adder(tree, allocator, 16, 1), tree, make_req("plain", prompt, max_new, ignore_eos=False))
    assert control == AddReqResult.CONTINUE  # the same request without ignore_eos is admitted
    allocator, tree = make_pools(pool, max_running=1)
    result = add(make_adder(tree, allocator, 16, 1), tree, make_req("ie", prompt, max_new, ignore_eos=True))
    assert result == AddReqResult.CONTINUE, (
        f"PrefillAdder.add_one_req answered {result} for an ignore_eos request on an EMPTY pool of {pool} KV "
        f"slots ({len(prompt)}-token prompt, max_new_tokens={max_new}, which intake's max_new_tokens_for_memory "
        "left unclipped; radix cache disabled): add_one_req_ignore_eos wants one free token more than intake "
        "reserves (IGNORE_EOS_RESERVE_TOKENS), so the request is never admitted and the FCFS admission loop stops "
        "on it: it and every request behind it wait forever (the same request without ignore_eos: CONTINUE)")


def test_the_ignore_eos_path_keeps_max_prefill_tokens():
    max_prefill_tokens = 4
    for ignore_eos in (False, True):  # first the control: the normal path keeps the budget
        allocator, tree = make_pools(11, max_running=2)
        adder = make_adder(tree, allocator, max_prefill_tokens, max_running=2)
        first = add(adder, tree, make_req("e", [1000, 5100], 1, ignore_eos=False, eos_token_ids={1}))
        assert first == AddReqResult.CONTINUE  # 2 tokens, within the budget of 4
        second = add(adder, tree, make_req("f", [1000, 1001, 1002], 1, ignore_eos=ignore_eos, eos_token_ids={1}))
        if not ignore_eos:
            assert second == AddReqResult.OTHER and [r.rid for r in adder.can_run_list] == ["e"]
    admitted = [r.rid for r in adder.can_run_list]
    tokens = sum(len(r.origin_input_ids) for r in adder.can_run_list)
    assert len(admitted) == 1 or tokens <= max_prefill_tokens, (
        f"one prefill batch admitted {admitted} = {tokens} prompt tokens under max_prefill_tokens="
        f"{max_prefill_tokens}: the ignore_eos path (add_one_req_ignore_eos) adds the 3-token request before it "
        "checks the budget, where the normal path stops a request past the first whose input does not fit "
        "rem_input_tokens (the same request without ignore_eos is answered OTHER and waits for the next step)")


def test_by_design_ignore_eos_also_ignores_stop_token_ids():
    """NOT A BUG: SGLang's documented-by-code semantics, shared by LMDeploy; this test passes."""
    stopped = make_req("b", [5000, 5001], 8, ignore_eos=False, stop_token_ids=[7])
    stopped.output_ids.append(7)
    stopped.update_finish_state(1)
    assert isinstance(stopped.finished_reason, FINISH_MATCHED_TOKEN)  # stop_token_ids=[7]: 7 stops it
    ignored = make_req("a", [5000, 5001], 8, ignore_eos=True, stop_token_ids=[7])
    ignored.output_ids.append(7)
    ignored.update_finish_state(1)
    assert not ignored.finished(), "under ignore_eos=True SGLang now stops on stop_token_ids (vLLM's semantics)"


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
