"""Reproductions for nano-vllm-fork 20260210: a preempted sequence stays in `running`; a wholly cached prompt
computes nothing; a classifier-free-guidance pair overfills the batch.

Rule: a preempted sequence leaves the running queue (it is WAITING and holds no blocks); a
    scheduler must never hold one request in two queues.
What nano-vllm does: `Scheduler.schedule()`'s decode loop preempts another sequence with
    `other_seq = temp_running.pop(0); self.preempt(other_seq)` (nanovllm/engine/scheduler.py,
    lines 120-122 and 152-154); `preempt()` sets WAITING, frees the blocks and puts the sequence at
    the front of `waiting`, but nothing removes it from `self.running` (upstream nano-vllm preempts
    with `self.preempt(self.running.pop())`). The sequence is then in both queues; later steps
    schedule it from both, and `may_append` / `allocate` fail on its empty block table.

Run it where nano-vllm-fork==20260210 is installed (no GPU needed), with or without pytest:

    python THIS_FILE                 # runs every test_* function, exits 1 if one fails
    python -m pytest -q THIS_FILE

It imports only nano-vllm and the standard library.

nanovllm/__init__.py imports the whole engine (triton, flash_attn); the scheduler does not need
it, so the package is registered with its real path and only the scheduler modules are imported.
"""

import importlib.util
import sys
import types
from types import SimpleNamespace

spec = importlib.util.find_spec("nanovllm")
package = types.ModuleType("nanovllm")
package.__path__ = list(spec.submodule_search_locations)
sys.modules.setdefault("nanovllm", package)

from nanovllm.engine.scheduler import Scheduler  # noqa: E402
from nanovllm.engine.sequence import Sequence, SequenceStatus  # noqa: E402
from nanovllm.sampling_params import SamplingParams  # noqa: E402


def test_a_preempted_sequence_leaves_the_running_queue():
    Sequence.block_size = 4
    # Two blocks of 4 tokens; Config is bypassed (it wants a model folder): these are the fields
    # Scheduler reads.
    scheduler = Scheduler(SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=64, eos=-1,
                                          num_kvcache_blocks=2, kvcache_block_size=4))
    a = Sequence([1, 2, 3, 4], SamplingParams(max_tokens=10))
    b = Sequence([9, 8, 7, 6], SamplingParams(max_tokens=10))
    scheduler.add(a)
    scheduler.add(b)
    # Step 1: both prompts are prefilled, one block each; each samples one token (5 tokens now).
    seqs, _ = scheduler.schedule()
    scheduler.postprocess(seqs, [0] * len(seqs))
    # Step 2: a needs a second block, none is free: the decode loop preempts b.
    seqs, _ = scheduler.schedule()
    assert [s.seq_id for s in seqs] == [a.seq_id]
    assert b.status == SequenceStatus.WAITING and b in scheduler.waiting
    assert b not in scheduler.running, (
        "b was preempted (WAITING, blocks freed, at the front of waiting) but is still in "
        "Scheduler.running: it is in two queues at once")


def test_a_wholly_cached_prompt_still_computes_a_token():
    """The second finding (safety property `progress`): a block-aligned prompt found whole in the
    prefix cache is scheduled for 0 tokens. BlockManager.allocate (block_manager.py:59-82) counts
    every full cached block, the last one included, so num_cached_tokens == len(seq); the model
    runner's prepare_prefill (model_runner.py:251-255) then adds no query token for it, and
    ParallelLMHead (embed_head.py:59) samples at cu_seqlens_q[1:] - 1: the previous sequence's last
    position. vLLM caps a hit at num_tokens - 1 so that one token is always computed."""
    Sequence.block_size = 4
    scheduler = Scheduler(SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=64, eos=-1,
                                          num_kvcache_blocks=8, kvcache_block_size=4))
    first = Sequence([1, 2, 3, 4, 5, 6, 7, 8], SamplingParams(max_tokens=4))
    scheduler.add(first)
    seqs, _ = scheduler.schedule()  # first computes its 8 tokens; its two full blocks are cached
    scheduler.postprocess(seqs, [0] * len(seqs))
    again = Sequence([1, 2, 3, 4, 5, 6, 7, 8], SamplingParams(max_tokens=4))
    scheduler.add(again)
    seqs, prefill = scheduler.schedule()
    assert prefill and again in seqs
    assert again.num_cached_tokens < len(again), (
        f"the prompt of {len(again)} tokens is wholly served from the prefix cache "
        f"(num_cached_tokens={again.num_cached_tokens}): no token is computed for it, so the model "
        "has no position of its own to sample its first output token from")


def test_a_guidance_pair_keeps_the_batch_within_max_num_seqs():
    """Classifier-free guidance (cfg_scale > 1): LLMEngine.add_request (llm_engine.py:62-69) adds a request and
    its unconditional twin, and the scheduler admits the two together. It checks the seat cap once per pair
    (scheduler.py:31 for prefill, :95 for decode) and then adds both sequences (:55-63, :137-141)."""
    Sequence.block_size = 4
    scheduler = Scheduler(SimpleNamespace(max_num_seqs=3, max_num_batched_tokens=64, eos=1,
                                          num_kvcache_blocks=16, kvcache_block_size=4))
    for prompt in ([1, 2, 3], [4, 5, 6]):  # two pairs, built as LLMEngine.add_request builds them
        params = SamplingParams(max_tokens=4, cfg_scale=3.0)
        twin = Sequence(prompt, params, is_unconditional=True)
        request = Sequence(prompt, params, conditional_seq=twin)
        twin.paired_seq = request
        scheduler.add(request)
        scheduler.add(twin)
    seqs, _ = scheduler.schedule()
    assert len(seqs) <= scheduler.max_num_seqs, (
        f"the prefill batch holds {len(seqs)} sequences with max_num_seqs={scheduler.max_num_seqs}: the seat "
        "check runs once per guidance pair and then both sequences are added; the model runner sizes its "
        "buffers to max_num_seqs (model_runner.py:118)")


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
