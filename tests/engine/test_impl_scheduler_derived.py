"""impl/'s fast scheduler keeps its derived state true: the fields its hot loops read instead of recomputing.

The strict replays (test_impl_scheduler.py, test_impl_async.py) show that the
decisions equal the reference's; these tests show, after every call of the same
kinds of campaigns, that the shortcuts behind those decisions rest on true
facts, so a campaign that happens to miss a case cannot hide a stale one:

* ``Req.room`` (the running loop's steady-decode test): -1 for a request
  without blocks, with drafts or in a prefill chunk; otherwise at most
  ``FastScheduler._room``, the bound on the one-token steps that need no new
  block and fill no block to cache;
* the lazy prefix-cache index: a block is in ``BlockPool.unindexed`` exactly
  when its hash is ``NOT_HASHED``, and the request and index recorded for it
  name a full block of that request's tokens, held there or freed; the indexed
  blocks are exactly those listed in ``cached`` under their hash;
* ``StepOutput.changed_in_flight``: a step whose flag is still clear when its
  model output is applied holds no request that finished or has stale output
  (``update_from_output``'s plain path skips both checks);
* ``Req.in_flight`` stays 0 in the synchronous loop (``count_in_flight`` off).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest

from schedconf.conformance.adapters.impl import ImplSchedulerSut
from schedconf.conformance.checking.replay import PASS, render_divergence, replay
from schedconf.conformance.workloads.generate import random_workload
from schedconf.conformance.workloads.tight_workloads import make_tight_workload
from schedconf.conformance.workloads.workload import run_workload
from schedconf.impl.scheduler import FINISHED_STOPPED, NOT_HASHED, FastScheduler, StepOutput
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.scheduler import Scheduler
from tests.engine.test_impl_async import get_spec_decode_traces


def check_derived(sched: FastScheduler) -> None:
    """Raise AssertionError if a derived field of ``sched`` is not what its definition says."""
    pool = sched.pool
    for req in sched.requests.values():
        if not sched.count_in_flight:
            assert req.in_flight == 0, (req.req_id, req.in_flight)
        if req.blocks is None or req.is_prefill_chunk or req.spec:
            assert req.room == -1, (req.req_id, req.room)
        else:
            assert req.room <= sched._room(req), (req.req_id, req.room, sched._room(req))
    for b, (req, i) in pool.unindexed.items():
        assert pool.block_hash[b] is NOT_HASHED, b
        assert len(req.tokens) >= (i + 1) * sched.bs, (b, req.req_id, i)
        # With prefix caching on, the request still holds the block where it cached it, or has
        # freed its blocks (a resumed request looked the cache up, which indexed them). Off, the
        # blocks an update caches (0.33 spec decode, async) are never looked up nor indexed.
        assert not sched.caching or req.blocks is None or req.blocks[i] == b, (b, req.req_id, i)
    indexed = {b for b, h in enumerate(pool.block_hash) if h is not None and h is not NOT_HASHED}
    assert {b for b, h in enumerate(pool.block_hash) if h is NOT_HASHED} == set(pool.unindexed)
    assert indexed == {b for blocks in pool.cached.values() for b in blocks}
    for h, blocks in pool.cached.items():
        assert blocks and all(pool.block_hash[b] == h for b in blocks), h


def check_plain_precondition(out: StepOutput) -> None:
    """A step not flagged ``changed_in_flight`` holds only live requests without stale output."""
    if out.changed_in_flight:
        return
    for entry in out.entries:
        req = entry[0]
        assert req.status < FINISHED_STOPPED and req.stale == 0, (out.step, req.req_id, req.status, req.stale)


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Check the derived state after every call that changes a FastScheduler; yields the count of checks."""
    count = [0]

    def wrap(name: str) -> None:
        original = getattr(FastScheduler, name)

        @functools.wraps(original)  # the adapter reads schedule()'s signature
        def checked_call(self: FastScheduler, *args: Any, **kwargs: Any) -> Any:
            if name == "update_from_output" and self.in_flight and args and args[0] is self.in_flight[0]:
                check_plain_precondition(args[0])
            try:
                return original(self, *args, **kwargs)
            finally:
                if self.crashed is None:
                    check_derived(self)
                    count[0] += 1

        monkeypatch.setattr(FastScheduler, name, checked_call)

    for name in ("add_request", "abort", "reset_prefix_cache", "schedule", "update_from_output"):
        wrap(name)
    yield count


def _replay_checked(traces: list[Any]) -> None:
    failures = []
    for trace in traces:
        result = replay(trace, ImplSchedulerSut(), "strict")
        if result.verdict != PASS and len(failures) < 3:
            failures.append(render_divergence(trace, result))
    assert not failures, "\n\n".join(failures)


def test_derived_state_holds_over_the_tight_campaign(checked):
    """Tight pools: preemption (FCFS and priority), prefix hits, resumes, drafts, padded admissions."""
    _replay_checked([run_workload(make_tight_workload(seed)) for seed in range(150)])
    assert checked[0] > 5000


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.32", "vllm-0.33-async", "vllm-0.32-async"])
def test_derived_state_holds_over_generated_workloads(checked, profile):
    """The generator's workloads: steps in flight, stale output, aborts and resets, the async placeholders."""
    _replay_checked([run_workload(random_workload(seed, profile)) for seed in range(60)])
    assert checked[0] > 1000


@pytest.mark.parametrize("profile", ["vllm-0.33-async", "vllm-0.32-async"])
def test_derived_state_holds_with_async_spec_decode(checked, profile):
    """Async + spec decode: placeholder drafts keep requests off the steady-decode test."""
    _replay_checked(list(get_spec_decode_traces(profile, 40)))
    assert checked[0] > 500


def test_decode_blocks_are_hashed_only_when_a_lookup_needs_them_by_hand():
    """A block that fills in decode is cached at once but hashed at the next lookup, which hits it."""
    config = SchedulerConfig(
        block_size=4, num_gpu_blocks=16, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=32
    )
    sched, ref = FastScheduler(config), Scheduler(config)
    for s in (sched, ref):
        s.add_request("r0", (1, 2, 3, 4, 5), max_tokens=8)

    def step(token: int) -> StepOutput:
        out = sched.schedule()
        ref_out = ref.schedule()
        assert out.to_canonical() == ref_out.to_canonical()
        sampled = [(token,) if before + n >= ntok else () for _, n, before, ntok, _ in out.entries]
        sched.update_from_output(out, sampled)
        assert ref.last_step is not None
        ref_sampled = {rid: (token,) for rid, samples in ref.last_step.samples.items() if samples}
        ref.update_from_output(ref_out, ModelRunnerOutput(sampled_token_ids=ref_sampled))
        return out

    # Step 1: the prompt into blocks [1, 2]; block 1 is full: cached, not hashed (r0's own
    # lookup hashed its prompt's first block before, to look it up).
    assert step(6).entries[0][4] == [1, 2]
    assert sched.pool.unindexed == {1: (sched.requests["r0"], 0)} and sched.pool.cached == {}
    # Steps 2-4 decode 6, 7, 8; step 4 (8 tokens computed) fills block 2: cached, not hashed.
    step(7)
    step(8)
    step(9)
    r0 = sched.requests["r0"]
    assert sched.pool.unindexed == {1: (r0, 0), 2: (r0, 1)} and len(r0.hashes) == 1
    assert sched.pool.block_hash[2] is NOT_HASHED and sched.pool.cached == {}
    # Step 5: r0 takes block 3; r1's lookup hashes and indexes blocks 1 and 2 first and hits
    # both (its 8 first tokens are r0's), so it computes its last token only, in block 4.
    for s in (sched, ref):
        s.add_request("r1", (1, 2, 3, 4, 5, 6, 7, 8, 99), max_tokens=2)
    out = step(10)
    assert [(e[0].req_id, e[1], e[2], e[3], list(e[4])) for e in out.entries] == [
        ("r0", 1, 8, 9, [3]),
        ("r1", 1, 8, 9, [1, 2, 4]),
    ]
    assert sched.pool.unindexed == {} and sorted(b for bs in sched.pool.cached.values() for b in bs) == [1, 2]
    assert len(r0.hashes) == 2
