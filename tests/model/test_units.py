"""Unit tests of the reference model's pieces, each against a value derived by hand."""

import pytest

from schedconf.spec.errors import IllegalTransition, InvalidConfig, InvalidEvent
from schedconf.spec.hashing import NONE_HASH, compute_block_hash, extend_block_hashes
from schedconf.spec.v1.block_pool import BlockPool
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.kv_cache import Allocated, KVCacheManager, NoSpace
from schedconf.spec.v1.profiles import PROFILES, VLLM_0_32, VLLM_0_33, get_profile
from schedconf.spec.v1.queues import FCFSRequestQueue, PriorityRequestQueue
from schedconf.spec.v1.request import LEGAL_TRANSITIONS, Request, RequestStatus, SamplingParams


def make_request(rid, tokens, block_size=4, priority=0, arrival=0):
    return Request(rid, tuple(tokens), SamplingParams(max_tokens=4), priority, arrival, block_size)


def test_block_hashes_are_chained_and_only_for_full_blocks():
    r = make_request("a", range(10), block_size=4)
    # 10 tokens = 2 full blocks of 4; the last 2 tokens are not hashed.
    assert len(r.block_hashes) == 2
    assert r.block_hashes[0] == compute_block_hash(NONE_HASH, [0, 1, 2, 3])
    assert r.block_hashes[1] == compute_block_hash(r.block_hashes[0], [4, 5, 6, 7])
    # Same second block after a different first block: different hash (chaining).
    other = make_request("b", [9, 9, 9, 9, 4, 5, 6, 7], block_size=4)
    assert other.block_hashes[1] != r.block_hashes[1]
    # Appending 2 tokens completes block 3.
    r.append_output_token_id(10)
    assert len(r.block_hashes) == 2
    r.append_output_token_id(11)
    assert len(r.block_hashes) == 3


def test_extend_block_hashes_is_incremental():
    hashes = []
    extend_block_hashes(hashes, list(range(8)), 4)
    again = list(hashes)
    extend_block_hashes(again, list(range(8)), 4)
    assert again == hashes and len(hashes) == 2


def test_free_queue_initial_order_and_null_block():
    pool = BlockPool(6, enable_caching=True, free_uncached_to_front=True)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert [b.block_id for b in pool.free_block_queue] == [1, 2, 3, 4, 5]
    assert pool.get_num_free_blocks() == 5


def test_free_blocks_uncached_to_front_hashed_to_back():
    pool = BlockPool(6, enable_caching=True, free_uncached_to_front=True)
    blocks = pool.get_new_blocks(3)  # 1, 2, 3
    blocks[0].block_hash = b"h1"
    pool.cached_block_hash_to_block[b"h1"] = {1: blocks[0]}
    # Freed tail first: 3 (no hash) -> front, 2 (no hash) -> front after 3, 1 (hashed) -> back.
    pool.free_blocks(reversed(blocks))
    assert [b.block_id for b in pool.free_block_queue] == [3, 2, 4, 5, 1]


def test_free_blocks_all_to_back_in_old_releases():
    pool = BlockPool(6, enable_caching=True, free_uncached_to_front=False)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks(reversed(blocks))
    assert [b.block_id for b in pool.free_block_queue] == [4, 5, 3, 2, 1]


def test_get_new_blocks_evicts_cached_hash():
    pool = BlockPool(3, enable_caching=True, free_uncached_to_front=True)
    (b,) = pool.get_new_blocks(1)
    b.block_hash = b"h"
    pool.cached_block_hash_to_block[b"h"] = {b.block_id: b}
    pool.free_blocks([b])
    assert pool.get_cached_block(b"h") is b  # still a hit while free
    pool.get_new_blocks(2)  # pops 2, then the cached block 1
    assert pool.get_cached_block(b"h") is None and b.block_hash is None


def test_touch_unlinks_free_cached_block():
    pool = BlockPool(4, enable_caching=True, free_uncached_to_front=True)
    b1, b2 = pool.get_new_blocks(2)
    pool.free_blocks([b1])
    assert [b.block_id for b in pool.free_block_queue] == [1, 3]
    pool.touch([b1])
    assert b1.ref_cnt == 1 and [b.block_id for b in pool.free_block_queue] == [3]


def test_prefix_hit_capped_below_num_tokens_whole_blocks():
    pool = BlockPool(20, enable_caching=True, free_uncached_to_front=True)
    kv = KVCacheManager(pool, block_size=4, max_model_len=64, enable_caching=True)
    a = make_request("a", range(8))
    assert isinstance(kv.allocate_slots(a, 8), Allocated)
    # Same 8 tokens: the hit is capped at 7 tokens -> 1 whole block (4 tokens).
    b = make_request("b", range(8))
    assert kv.get_computed_blocks(b).num_tokens == 4
    # 9 tokens sharing 8: both blocks hit (cap 8 -> 2 blocks).
    c = make_request("c", list(range(8)) + [99])
    assert kv.get_computed_blocks(c).num_tokens == 8


def test_full_sequence_gate_counts_whole_prompt_and_evictable_hits():
    pool = BlockPool(5, enable_caching=True, free_uncached_to_front=True)  # 4 usable
    kv = KVCacheManager(pool, block_size=4, max_model_len=16, enable_caching=True)
    r = make_request("r", range(13))  # needs 4 blocks in all
    # A 4-token chunk needs 1 block, but the gate wants all 4: fits exactly.
    assert isinstance(kv.allocate_slots(r, 4, full_sequence_must_fit=True), Allocated)
    s = make_request("s", range(100, 105))  # 2 blocks; 3 free
    # 3 free blocks, gate needs 2 -> ok; without enough for the whole sequence it refuses.
    big = make_request("big", range(200, 215))  # 4 blocks > 3 free
    res = kv.allocate_slots(big, 1, full_sequence_must_fit=True)
    assert isinstance(res, NoSpace) and res.gate == "full_sequence" and res.num_blocks_needed == 4
    assert isinstance(kv.allocate_slots(s, 1, full_sequence_must_fit=True), Allocated)


def test_fcfs_prepend_orders():
    reqs = [make_request(str(i), [i]) for i in range(4)]
    q = FCFSRequestQueue()
    for r in reqs[2:]:
        q.add_request(r)
    q.prepend_requests([reqs[0], reqs[1]], "preserve")
    assert [r.request_id for r in q] == ["0", "1", "2", "3"]
    q2 = FCFSRequestQueue()
    q2.add_request(reqs[3])
    q2.prepend_requests([reqs[0], reqs[1]], "reverse")
    assert [r.request_id for r in q2] == ["1", "0", "3"]


def test_priority_queue_key_is_priority_arrival_id():
    q = PriorityRequestQueue()
    q.add_request(make_request("b", [1], priority=1, arrival=0))
    q.add_request(make_request("c", [1], priority=0, arrival=5))
    q.add_request(make_request("a", [1], priority=0, arrival=5))
    q.prepend_request(make_request("z", [1], priority=0, arrival=1))
    assert [r.request_id for r in q] == ["z", "a", "c", "b"]
    assert q.pop_request().request_id == "z"


def test_legal_transitions_table():
    r = make_request("a", [1])
    r.transition(RequestStatus.RUNNING)
    r.transition(RequestStatus.PREEMPTED)
    r.transition(RequestStatus.RUNNING)
    r.transition(RequestStatus.FINISHED_STOPPED)
    with pytest.raises(IllegalTransition):
        r.transition(RequestStatus.RUNNING)
    assert not LEGAL_TRANSITIONS[RequestStatus.WAITING] & {RequestStatus.PREEMPTED}


def test_profiles_table_names_and_differences():
    assert set(PROFILES) == {
        "vllm-0.33",
        "vllm-0.32",
        "vllm-0.11",
        "aphrodite-0.24",
        "vllm-0.33-async",
        "vllm-0.32-async",
    }
    # An async profile is its release with AsyncScheduler's placeholders, nothing else.
    for release in ("vllm-0.33", "vllm-0.32"):
        a, r = PROFILES[f"{release}-async"], PROFILES[release]
        assert [k for k in r.knob_names() if getattr(a, k) != getattr(r, k)] == ["async_scheduling"]
    diff = [k for k in VLLM_0_33.knob_names() if getattr(VLLM_0_33, k) != getattr(VLLM_0_32, k)]
    # The differences found by diffing the 0.32.0 and 0.33.0 wheels. The two
    # stop-trim knobs were missed at first: 0.32.0's _update_request_with_output
    # has no trim of num_computed_tokens and its async_scheduler.py:68-71
    # resolves only the kept tokens' placeholders; together they cancel in the
    # one place that reads them (see the knobs' docstrings). The local prefill cadence
    # (prefill_schedule_interval) is new in 0.33.0's config/scheduler.py and scheduler.py:404.
    assert diff == [
        "priority_self_preemption",
        "trim_computed_on_stop",
        "resolve_trimmed_placeholders",
        "cache_blocks_after_spec_update",
        "local_prefill_cadence",
    ]
    aphrodite = PROFILES["aphrodite-0.24"]
    # Aphrodite 0.24.1 is vLLM 0.32 but for the long-prefill cap on a lone request
    # (and the knobs whose Aphrodite counterparts were not checked: not modelled for it).
    assert [k for k in VLLM_0_32.knob_names() if getattr(VLLM_0_32, k) != getattr(aphrodite, k)] == [
        "exempt_lone_request_from_threshold",
        "has_0_32_scheduler_knobs",
        "models_in_flight",
    ]
    with pytest.raises(InvalidConfig) as e:
        get_profile("vllm-9")
    assert e.value.code == "unknown_profile"


def test_every_knob_cites_its_source():
    import schedconf.spec.v1.profiles as p

    src = open(p.__file__).read()
    for knob in VLLM_0_33.knob_names():
        doc_start = src.index(f"    {knob}:")
        doc = src[doc_start : src.index('"""', src.index('"""', doc_start) + 3)]
        # A section of the notes, or where in the released code it was read.
        assert "§" in doc or "read in 0.33.0" in doc or "findings.md" in doc, knob


@pytest.mark.parametrize(
    "fields, code",
    [
        (dict(block_size=0), "invalid_block_size"),
        (dict(num_gpu_blocks=1), "invalid_num_gpu_blocks"),
        (dict(max_num_batched_tokens=0), "invalid_token_budget"),
        (dict(max_num_seqs=0), "invalid_max_num_seqs"),
        (dict(max_model_len=0), "invalid_max_model_len"),
        (dict(long_prefill_token_threshold=-1), "invalid_threshold"),
        (dict(num_gpu_blocks=3, block_size=4, max_model_len=16), "pool_below_max_model_len"),
        (dict(enable_chunked_prefill=False, max_num_batched_tokens=8, max_model_len=16), "budget_below_max_model_len"),
        (dict(policy="lifo"), "invalid_policy"),
        (dict(block_size="4"), "invalid_config_type"),
        (dict(max_num_seqs=17), "budget_below_max_num_seqs"),
        (dict(max_concurrent_batches=0), "invalid_max_concurrent_batches"),
        (dict(max_num_active_seqs=0), "invalid_max_num_active_seqs"),
        (dict(max_num_seqs=4, max_num_active_seqs=5), "invalid_max_num_active_seqs"),  # vLLM: above max_num_seqs
        (dict(max_num_active_seqs=True), "invalid_config_type"),
        (dict(use_v2_model_runner=1), "invalid_config_type"),
    ],
)
def test_config_errors(fields, code):
    base = dict(block_size=4, num_gpu_blocks=20, max_num_batched_tokens=16, max_model_len=16)
    base.update(fields)
    with pytest.raises(InvalidConfig) as e:
        SchedulerConfig(**base)
    assert e.value.code == code


def test_invalid_event_leaves_state_unchanged():
    from schedconf.spec.v1.scheduler import Scheduler

    s = Scheduler(SchedulerConfig(block_size=4, num_gpu_blocks=20, max_num_batched_tokens=16, max_model_len=16))
    s.add_request("a", [1, 2], max_tokens=2)
    before = s.observe()
    for kwargs, code in [
        (dict(request_id="a", prompt_token_ids=[1], max_tokens=1), "duplicate_request_id"),
        (dict(request_id="b", prompt_token_ids=[-1], max_tokens=1), "invalid_token_id"),
        (dict(request_id="", prompt_token_ids=[1], max_tokens=1), "invalid_request_id"),
        (dict(request_id="b", prompt_token_ids=[1], max_tokens=True), "invalid_field_type"),
    ]:
        with pytest.raises(InvalidEvent) as e:
            s.add_request(**kwargs)
        assert e.value.code == code
        assert s.observe() == before


@pytest.mark.parametrize(
    "fields, code, refused_by",
    [
        # 0.32/0.33 accept a threshold of at most num_spec_tokens at start (they
        # crash later, in schedule(): tests/harness/test_engine_crash.py).
        # A batch queue with spec decode is modelled under AsyncScheduler only.
        (
            dict(num_spec_tokens=2, max_concurrent_batches=2),
            "in_flight_not_modelled",
            {"vllm-0.33", "vllm-0.32", "vllm-0.11", "aphrodite-0.24"},
        ),
        # vLLM 0.32+ refuse a threshold above max_model_len (verify_max_model_len); so does
        # Aphrodite 0.24, which tracks 0.32 (its config refusals are 0.32's: tests/engines/test_aphrodite.py).
        (
            dict(long_prefill_token_threshold=17),
            "threshold_above_max_model_len",
            {"vllm-0.33", "vllm-0.32", "aphrodite-0.24", "vllm-0.33-async", "vllm-0.32-async"},
        ),
        # Knobs vLLM 0.32 added (0.11.0 has none of them); Aphrodite's were not checked.
        (dict(max_num_active_seqs=1), "knob_not_in_release", {"vllm-0.11", "aphrodite-0.24"}),
        (dict(long_prefill_token_threshold_adaptive=True), "knob_not_in_release", {"vllm-0.11", "aphrodite-0.24"}),
        (dict(use_v2_model_runner=True), "knob_not_in_release", {"vllm-0.11", "aphrodite-0.24"}),
        # Steps in flight: modelled for 0.32/0.33 only.
        (dict(max_concurrent_batches=2), "in_flight_not_modelled", {"vllm-0.11", "aphrodite-0.24"}),
    ],
)
def test_profile_dependent_config_checks(fields, code, refused_by):
    from schedconf.spec.v1.scheduler import Scheduler

    config = SchedulerConfig(
        **{**dict(block_size=4, num_gpu_blocks=20, max_num_batched_tokens=16, max_model_len=16), **fields}
    )
    for profile in PROFILES:
        if profile in refused_by:
            with pytest.raises(InvalidConfig) as e:
                Scheduler(config, profile)
            assert e.value.code == code
        else:
            Scheduler(config, profile)  # accepted


def test_optional_config_fields_are_left_out_at_their_defaults():
    """Traces written before these knobs existed keep their bytes: to_dict omits a knob at its default."""
    from schedconf.spec.v1.config import OPTIONAL_FIELDS

    base = SchedulerConfig(block_size=4, num_gpu_blocks=20, max_num_batched_tokens=16, max_model_len=16)
    assert not set(OPTIONAL_FIELDS) & set(base.to_dict())
    changed = SchedulerConfig(
        **{
            **base.to_dict(),
            "max_concurrent_batches": 2,
            "max_num_active_seqs": 1,
            "long_prefill_token_threshold_adaptive": True,
            "use_v2_model_runner": True,
            "pipeline_parallel_size": 2,
            "prefill_schedule_interval": 3,
            "log_stats": False,
        }
    )
    assert set(OPTIONAL_FIELDS) <= set(changed.to_dict())
    assert SchedulerConfig.from_dict(changed.to_dict()) == changed


def test_allocate_slots_keeps_reserved_blocks_free_but_the_full_sequence_gate_ignores_them():
    """vLLM 0.33 allocate_slots(reserved_blocks=...): the slots gate needs free - reserved blocks; the
    full-sequence gate counts all free blocks (kv_cache_manager.py: it checks get_num_free_blocks())."""
    from schedconf.spec.v1.block_pool import BlockPool
    from schedconf.spec.v1.kv_cache import Allocated, KVCacheManager, NoSpace
    from schedconf.spec.v1.request import Request, SamplingParams

    def fresh() -> tuple[KVCacheManager, Request]:
        pool = BlockPool(num_gpu_blocks=6, enable_caching=False, free_uncached_to_front=True)  # 5 usable
        kv = KVCacheManager(pool, block_size=4, max_model_len=32, enable_caching=False)
        return kv, Request("r", tuple(range(12)), SamplingParams(max_tokens=4), 0, 0, 4)

    # 12 tokens need 3 blocks; 5 are free.
    kv, req = fresh()
    assert isinstance(kv.allocate_slots(req, 12, reserved_blocks=2), Allocated)  # 5 - 2 = 3 suffice
    kv, req = fresh()
    refused = kv.allocate_slots(req, 12, reserved_blocks=3)  # 5 - 3 = 2 < 3
    assert isinstance(refused, NoSpace) and refused.gate == "slots" and kv.pool.get_num_free_blocks() == 5
    # A first chunk of 4 tokens (1 block): the full-sequence gate (3 blocks <= 5 free) passes whatever is
    # reserved; the slots gate decides: 5 - 5 = 0 < 1 refuses, 5 - 4 = 1 admits.
    kv, req = fresh()
    assert kv.allocate_slots(req, 4, full_sequence_must_fit=True, reserved_blocks=5).gate == "slots"
    kv, req = fresh()
    assert isinstance(kv.allocate_slots(req, 4, full_sequence_must_fit=True, reserved_blocks=4), Allocated)


def test_async_empty_draft_lists_keep_the_placeholder_drafts():
    """Under AsyncScheduler the engine core never calls update_draft_token_ids: an empty draft
    list in a model output neither is refused nor clears the [-1]*k drafts the schedule set."""
    from schedconf.spec.output import ModelRunnerOutput
    from schedconf.spec.v1.scheduler import Scheduler

    sched = Scheduler(
        SchedulerConfig(
            block_size=4,
            num_gpu_blocks=16,
            max_num_batched_tokens=16,
            max_num_seqs=4,
            max_model_len=32,
            num_spec_tokens=2,
            max_concurrent_batches=2,
        ),
        "vllm-0.33-async",
    )
    sched.add_request("a", [1, 2, 3, 4], max_tokens=8)
    sched.schedule()  # the prompt: afterwards spec_token_ids [-1, -1], 1 placeholder
    sched.update_from_output(sched.get_output_to_apply(), ModelRunnerOutput({"a": (5,)}, {"a": ()}))
    assert sched.requests["a"].spec_token_ids == [-1, -1]
    # num_tokens 5 + 2 drafts + 0 placeholders - computed 4 = 3 tokens, 2 of them drafts.
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 3}
    assert out.scheduled_spec_decode_tokens == {"a": (-1, -1)}
