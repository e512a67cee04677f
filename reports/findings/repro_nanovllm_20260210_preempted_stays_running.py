"""Reproduction for nano-vllm-fork 20260210: a sequence preempted in the decode loop stays in `running`.

Rule: a preempted sequence leaves the running queue (it is WAITING and holds no blocks); a
    scheduler must never hold one request in two queues.
What nano-vllm does: `Scheduler.schedule()`'s decode loop preempts another sequence with
    `other_seq = temp_running.pop(0); self.preempt(other_seq)` (nanovllm/engine/scheduler.py,
    lines 120-122 and 152-154); `preempt()` sets WAITING, frees the blocks and puts the sequence at
    the front of `waiting`, but nothing removes it from `self.running` (upstream nano-vllm preempts
    with `self.preempt(self.running.pop())`). The sequence is then in both queues; later steps
    schedule it from both, and `may_append` / `allocate` fail on its empty block table.

Run it where nano-vllm-fork==20260210 and pytest are installed (no GPU needed):

    python -m pytest -q THIS_FILE

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
