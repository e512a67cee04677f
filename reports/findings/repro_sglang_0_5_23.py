"""SGLang 0.5.23's own classes (schedconf only for the import workaround): three findings.
Run: .venvs/sglang-0.5.23/bin/python reports/findings/repro_sglang_0_5_23.py
1. ignore_eos=True also disables stop_token_ids (schedule_batch.py:1857).
2. an ignore_eos request that intake accepts (Scheduler.init_req_max_new_tokens clip, scheduler.py:2709-2735
   -> allocator.max_new_tokens_for_memory, allocator/base.py:104) is never admitted by PrefillAdder's
   ignore_eos path when the radix cache is disabled (schedule_policy.py:1401, 1290-1296, IGNORE_EOS_RESERVE_TOKENS=1)."""
import os, sys
from pathlib import Path
# schedconf's driver is used only for its import workaround (torchvision placeholders, a config-only model
# folder for ServerArgs); every class exercised below is SGLang's own.
sys.path.insert(0, os.environ.get("SCHEDCONF_ROOT", str(Path(__file__).resolve().parents[2])))
from conformance.engines.sglang_driver import _Sgl, _NO_STOP_STRINGS_TOKENIZER  # only for the import workaround
from array import array
g = _Sgl()
# 1.
sp = g.SamplingParams(max_new_tokens=8, stop_token_ids=[7], ignore_eos=True); sp.normalize(_NO_STOP_STRINGS_TOKENIZER)
req = g.Req("a", "", array("q", [5000, 5001]), sp, eos_token_ids=None, vocab_size=None)
req.output_ids.append(7); req.update_finish_state(1)
print("1. ignore_eos=True, stop_token_ids=[7], sampled 7 -> finished:", req.finished(), req.finished_reason)
sp = g.SamplingParams(max_new_tokens=8, stop_token_ids=[7], ignore_eos=False); sp.normalize(_NO_STOP_STRINGS_TOKENIZER)
req = g.Req("b", "", array("q", [5000, 5001]), sp, eos_token_ids=None, vocab_size=None)
req.output_ids.append(7); req.update_finish_state(1)
print("   ignore_eos=False, same token -> finished:", req.finished(), req.finished_reason)
# 2.
size = 4
rtp = g.ReqToTokenPool(size=1, max_context_len=8, device="cpu", enable_memory_saver=False)
alloc = g.TokenToKVPoolAllocator(size=size, dtype=g.torch.float16, device="cpu", kvcache=None, need_sort=False)
tree = g.RadixCache(g.CacheInitParams(disable=True, req_to_token_pool=rtp, token_to_kv_pool_allocator=alloc, page_size=1))
prompt = [5300]
max_new = alloc.max_new_tokens_for_memory(len(prompt), 1, token_capacity=size, sliding_window_size=None, chunk_size=None)
print(f"2. pool of {size} tokens, prompt of 1, max_new_tokens=1: intake clip keeps max_new_tokens={max_new}")
sp = g.SamplingParams(max_new_tokens=max_new, ignore_eos=True); sp.normalize(_NO_STOP_STRINGS_TOKENIZER)
req = g.Req("c", "", array("q", prompt), sp, eos_token_ids=None, vocab_size=None)
running = g.ScheduleBatch(reqs=[], batch_is_full=False)
adder = g.PrefillAdder(1, tree, alloc, running, 0.7, 16, None, 0, 0, max_prefill_bs=0, max_running_requests=1)
req.init_next_round_input(tree)
print("   PrefillAdder.add_one_req on the EMPTY pool ->", adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None),
      "(NO_TOKEN on an empty pool: it waits forever)")
sp = g.SamplingParams(max_new_tokens=max_new, ignore_eos=False); sp.normalize(_NO_STOP_STRINGS_TOKENIZER)
req = g.Req("d", "", array("q", prompt), sp, eos_token_ids=None, vocab_size=None)
adder = g.PrefillAdder(1, tree, alloc, running, 0.7, 16, None, 0, 0, max_prefill_bs=0, max_running_requests=1)
req.init_next_round_input(tree)
print("   same request with ignore_eos=False ->", adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None))
# 3. the ignore_eos admission path (radix cache disabled) skips the prefill token budget check of the normal
#    path (schedule_policy.py:1624-1629: rem_chunk_tokens is None and can_run_list and input >= rem_input -> OTHER)
size = 11
rtp = g.ReqToTokenPool(size=2, max_context_len=8, device="cpu", enable_memory_saver=False)
alloc = g.TokenToKVPoolAllocator(size=size, dtype=g.torch.float16, device="cpu", kvcache=None, need_sort=False)
tree = g.RadixCache(g.CacheInitParams(disable=True, req_to_token_pool=rtp, token_to_kv_pool_allocator=alloc, page_size=1))
running = g.ScheduleBatch(reqs=[], batch_is_full=False)
adder = g.PrefillAdder(1, tree, alloc, running, 0.7, 4, None, 0, 0, max_prefill_bs=0, max_running_requests=2)  # max_prefill_tokens=4
for rid, prompt, ie in (("e", [1000, 5100], False), ("f", [1000, 1001, 1002], True)):
    sp = g.SamplingParams(max_new_tokens=1, ignore_eos=ie); sp.normalize(_NO_STOP_STRINGS_TOKENIZER)
    r = g.Req(rid, "", array("q", prompt), sp, eos_token_ids={1}, vocab_size=None)
    r.init_next_round_input(tree)
    print(f"3. add {rid} ({len(prompt)} tokens, ignore_eos={ie}) ->", adder.add_one_req(r, has_chunked_req=False, truncation_align_size=None))
print("   admitted", [r.rid for r in adder.can_run_list], "=", sum(len(r.origin_input_ids) for r in adder.can_run_list),
      "prefill tokens with max_prefill_tokens=4")
