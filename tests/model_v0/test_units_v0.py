"""Unit tests of the v0 building blocks: budget, evictor, allocators, block table, config, stop checker."""

import pytest

from schedconf.spec.errors import InvalidConfig
from schedconf.spec.v0.block_allocator import NaiveBlockAllocator, PrefixCachingBlockAllocator
from schedconf.spec.v0.block_manager import BlockTable
from schedconf.spec.v0.budget import SchedulingBudget
from schedconf.spec.v0.config import V0SchedulerConfig
from schedconf.spec.v0.evictor import LRUEvictor
from schedconf.spec.v0.sequence import SequenceGroup, SequenceStatus, V0SamplingParams
from schedconf.spec.v0.stop import maybe_stop_sequence

BASE = dict(
    block_size=4,
    num_gpu_blocks=8,
    num_cpu_blocks=0,
    max_num_batched_tokens=32,
    max_num_seqs=4,
    max_model_len=32,
    enable_chunked_prefill=False,
    enable_prefix_caching=False,
    policy="fcfs",
    preemption_mode=None,
    max_num_partial_prefills=1,
    max_long_partial_prefills=1,
    long_prefill_token_threshold=0,
)


def test_scheduling_budget_like_vllms_test():
    # tests/core/test_scheduler.py::test_scheduling_budget (0.10.2), token budget 4, 4 seats.
    budget = SchedulingBudget(token_budget=4, max_num_seqs=4)
    assert budget.can_schedule(1, 1)
    assert budget.can_schedule(4, 4)
    assert not budget.can_schedule(1, 5)
    assert not budget.can_schedule(5, 1)
    budget.add_num_batched_tokens("1", 2)
    assert budget.remaining_token_budget() == 2
    budget.add_num_batched_tokens("1", 2)  # same id: no-op
    assert budget.remaining_token_budget() == 2
    budget.subtract_num_batched_tokens("1", 2)
    assert budget.remaining_token_budget() == 4
    budget.subtract_num_batched_tokens("1", 2)  # not recorded any more: no-op
    assert budget.remaining_token_budget() == 4
    budget.add_num_seqs("1", 1)
    budget.add_num_seqs("1", 1)
    assert budget.num_curr_seqs == 1
    budget.subtract_num_seqs("1", 1)
    budget.subtract_num_seqs("1", 1)
    assert budget.num_curr_seqs == 0


def test_cached_tokens_are_reported_not_charged():
    budget = SchedulingBudget(token_budget=4, max_num_seqs=4)
    budget.add_num_batched_tokens("a", 1, 7)
    assert budget.remaining_token_budget() == 3 and budget.num_cached_tokens == 7
    budget.subtract_num_batched_tokens("a", 1)
    assert budget.num_cached_tokens == 7  # cached tokens are never given back


def test_evictor_orders_by_time_then_depth_then_id():
    ev = LRUEvictor()
    ev.add(5, b"a", 4, 2)
    ev.add(3, b"b", 8, 2)
    ev.add(9, b"c", 4, 1)
    ev.add(1, b"d", 4, 2)
    assert ev.get_eviction_order() == [9, 3, 1, 5]
    assert [ev.evict()[0] for _ in range(4)] == [9, 3, 1, 5]


def test_evictor_skips_stale_entries_lazily():
    ev = LRUEvictor()
    ev.add(1, b"x", 2, 1)
    ev.add(2, b"y", 2, 2)
    ev.remove(1)  # revived: its heap entry goes stale
    ev.add(1, b"x", 2, 3)  # freed again later
    assert ev.evict() == (2, b"y")
    assert ev.evict() == (1, b"x")
    assert ev.num_blocks == 0


def test_naive_allocator_reuses_the_last_freed_block_first():
    alloc = NaiveBlockAllocator([0, 1, 2, 3])
    ids = [alloc.allocate_block_id() for _ in range(3)]
    assert ids == [0, 1, 2]
    alloc.free_block_id(0)
    alloc.free_block_id(2)
    assert list(alloc.free_block_ids) == [2, 0, 3]


def test_blocks_touched_by_append_is_one_for_any_decode():
    for bs in (1, 2, 4):
        for filled in range(0, 9):
            table = BlockTable(bs)
            table.num_full_slots = filled
            assert table.get_num_blocks_touched_by_append_slots(1) == 1
            # No token: 0 if the table is block-aligned, else 1.
            assert table.get_num_blocks_touched_by_append_slots(0) == (0 if filled % bs == 0 else 1)


def test_prefix_caching_promotion_deduplicates_a_newly_full_block():
    alloc = PrefixCachingBlockAllocator([0, 1, 2, 3])
    a = BlockTable(2)
    a.allocate([7, 8, 9], alloc)  # block 0 full (cached), block 1 partial
    b = BlockTable(2)
    b.allocate([7, 8, 5], alloc)  # shares block 0, own partial block 2
    assert a.physical_block_ids == [0, 1] and b.physical_block_ids == [0, 2]
    a.append_token_ids([5], alloc)  # a's block 1 becomes (9, 5): new content
    b.append_token_ids([6], alloc)
    assert alloc.refcounts[0] == 2
    # A third table whose second block repeats a's content reuses block 1.
    c = BlockTable(2)
    c.allocate([7, 8, 9], alloc)
    c.append_token_ids([5], alloc)
    assert c.physical_block_ids == [0, 1] and alloc.refcounts[1] == 2


def test_find_cached_blocks_prefix_is_vllms_bisection():
    alloc = PrefixCachingBlockAllocator([0, 1, 2])
    table = BlockTable(1)
    table.allocate([1, 2, 3], alloc)
    alloc.mark_blocks_as_computed()
    hashes = [b.content_hash for b in table.blocks]
    assert alloc.find_cached_blocks_prefix(hashes) == hashes
    # Forget the first block only: a non-prefix cache. bisect_left probes
    # index 1 (cached -> lo = 2), then index 2 (cached -> lo = 3): it reports
    # all 3 blocks although the first is not cached (a linear scan says 0).
    del alloc.cached_blocks[hashes[0]]
    assert len(alloc.find_cached_blocks_prefix(hashes)) == 3


@pytest.mark.parametrize(
    "change, code",
    [
        (dict(block_size=0), "invalid_block_size"),
        (dict(num_gpu_blocks=0), "invalid_num_gpu_blocks"),
        (dict(num_cpu_blocks=-1), "invalid_num_cpu_blocks"),
        (dict(max_num_batched_tokens=16), "budget_below_max_model_len"),
        (dict(max_num_seqs=64), "budget_below_max_num_seqs"),
        (dict(max_num_partial_prefills=0), "invalid_max_num_partial_prefills"),
        (dict(max_num_partial_prefills=2), "partial_prefills_without_chunked_prefill"),
        (
            dict(max_num_partial_prefills=2, enable_chunked_prefill=True, long_prefill_token_threshold=40),
            "threshold_above_max_model_len",
        ),
        (dict(max_long_partial_prefills=2), "invalid_max_long_partial_prefills"),
        (dict(num_gpu_blocks=7), "pool_below_max_model_len"),
        (dict(policy="lifo"), "invalid_policy"),
        (dict(preemption_mode="never"), "invalid_preemption_mode"),
        (dict(enable_prefix_caching=1), "invalid_config_type"),
    ],
)
def test_config_refusals(change, code):
    with pytest.raises(InvalidConfig) as exc:
        V0SchedulerConfig(**{**BASE, **change})
    assert exc.value.code == code


def test_config_from_dict_needs_every_field():
    with pytest.raises(InvalidConfig) as exc:
        V0SchedulerConfig.from_dict({k: v for k, v in BASE.items() if k != "policy"})
    assert exc.value.code == "missing_config_field"
    with pytest.raises(InvalidConfig) as exc:
        V0SchedulerConfig.from_dict({**BASE, "num_spec_tokens": 0})
    assert exc.value.code == "unknown_config_field"
    assert V0SchedulerConfig.from_dict(BASE).to_dict() == BASE


def test_default_long_prefill_threshold_and_watermark():
    cfg = V0SchedulerConfig(
        **{
            **BASE,
            "enable_chunked_prefill": True,
            "max_num_partial_prefills": 2,
            "max_model_len": 100,
            "num_gpu_blocks": 250,
            "max_num_batched_tokens": 100,
        }
    )
    assert cfg.effective_long_prefill_token_threshold == 4
    assert cfg.watermark_blocks == 2
    assert V0SchedulerConfig(**BASE).effective_long_prefill_token_threshold == 0


def _seq(max_tokens=4, min_tokens=0, eos=None, stops=(), ignore_eos=False, prompt=(1, 2)):
    return SequenceGroup("r", 0, tuple(prompt), V0SamplingParams(max_tokens, min_tokens, eos, ignore_eos, stops), 0, 0)


def test_stop_checker_order():
    s = _seq(min_tokens=2, eos=5)
    s.append_token_id(5)
    maybe_stop_sequence(s, 100)
    assert s.status is SequenceStatus.WAITING  # below min_tokens: even EOS waits
    s.append_token_id(5)
    maybe_stop_sequence(s, 100)
    assert s.status is SequenceStatus.FINISHED_STOPPED and s.stop_reason is None
    s = _seq(max_tokens=1, stops=(9,))
    s.append_token_id(9)
    maybe_stop_sequence(s, 3)  # stop id, max_model_len and max_tokens all hold: the stop id wins
    assert s.status is SequenceStatus.FINISHED_STOPPED and s.stop_reason == 9
    s = _seq(max_tokens=3, min_tokens=2)
    s.append_token_id(7)
    maybe_stop_sequence(s, 3)  # len 3 >= 3, but 1 < 2 outputs
    assert s.status is SequenceStatus.WAITING
    s.append_token_id(7)
    maybe_stop_sequence(s, 3)
    assert s.status is SequenceStatus.FINISHED_LENGTH_CAPPED
    s = _seq(max_tokens=1, eos=5, ignore_eos=True)
    s.append_token_id(5)
    maybe_stop_sequence(s, 100)
    assert s.status is SequenceStatus.FINISHED_LENGTH_CAPPED
