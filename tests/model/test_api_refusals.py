"""Every refusal of the reference model's API changes nothing (issue 10 items a-d).

For each input error code in ``schedconf.spec.errors.ERROR_CODES`` (configuration and
protocol-only codes excepted) one case builds a state, snapshots the whole
object graph of the scheduler (every request field, both queues, the block
pool with its free-queue links and hash map, the pending step, counters), makes
the refused call and checks the snapshot is identical afterwards.
A code added to the table without a case here fails ``test_every_input_code_has_a_case``.

The engine-crash codes are no refusals that change nothing: the modelled
release's engine dies. They have their own table (``CRASH_CASES``): the call
raises the code, and afterwards the scheduler is dead (every call refused with
``engine_dead``, its state frozen).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable

import pytest

from schedconf.spec.errors import ERROR_CODES, EngineCrash, InvalidEvent
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.v1.block_pool import FreeKVCacheBlockQueue, KVCacheBlock
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.request import RequestStatus
from schedconf.spec.v1.scheduler import Scheduler

# Codes raised at construction (config) or only by the JSON-lines protocol.
NOT_API_CODES = {
    "invalid_config_type",
    "unknown_config_field",
    "unknown_profile",
    "invalid_block_size",
    "invalid_num_gpu_blocks",
    "invalid_token_budget",
    "invalid_max_num_seqs",
    "invalid_max_model_len",
    "invalid_threshold",
    "invalid_num_spec_tokens",
    "invalid_num_lookahead_tokens",
    "invalid_policy",
    "budget_below_max_model_len",
    "pool_below_max_model_len",
    "threshold_above_max_model_len",
    "budget_below_max_num_seqs",
    "unsupported",
    "internal",
    "invalid_max_concurrent_batches",
    "in_flight_not_modelled",
    "invalid_max_num_active_seqs",
    "knob_not_in_release",  # config: tests/model/test_in_flight.py; schedule(): tests/model/test_prefill_deferral.py
    "invalid_pipeline_parallel_size",  # config: tests/model/test_prefill_deferral.py
    "invalid_prefill_schedule_interval",
    "pipeline_parallel_not_modelled",
} | {code for code, meaning in ERROR_CODES.items() if meaning.startswith("(v0")}  # v0 model: tests/model_v0


def deep_state(root: object) -> object:
    """The scheduler's whole object graph as plain nested values.

    Objects are numbered in first-visit order, so shared references and cycles
    (the free queue's links) are part of the dump; a change anywhere shows.
    """
    seen: dict[int, int] = {}

    def walk(obj: object) -> object:
        if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
            return obj
        if isinstance(obj, enum.Enum):
            return ("enum", type(obj).__name__, obj.name)
        if id(obj) in seen:
            return ("ref", seen[id(obj)])
        seen[id(obj)] = len(seen)
        if isinstance(obj, (list, tuple)):
            return (type(obj).__name__, [walk(x) for x in obj])
        if isinstance(obj, (set, frozenset)):
            return (type(obj).__name__, sorted((walk(x) for x in obj), key=repr))
        if isinstance(obj, dict):
            return ("dict", [(walk(k), walk(v)) for k, v in obj.items()])
        if hasattr(obj, "__iter__") and not hasattr(obj, "__dict__"):
            return (type(obj).__name__, [walk(x) for x in obj])  # deques
        fields = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
        for cls in type(obj).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if hasattr(obj, name):
                    fields[name] = getattr(obj, name)
        return (type(obj).__name__, [(k, walk(v)) for k, v in sorted(fields.items()) if not callable(v)])

    return walk(root)


def snapshot(sched: Scheduler) -> tuple[object, object]:
    return deep_state(sched), sched.observe()


CFG = dict(block_size=4, num_gpu_blocks=9, max_num_batched_tokens=32, max_num_seqs=4, max_model_len=16)


def base(**overrides: object) -> Scheduler:
    """a (4 tokens, running after one step) and w (waiting: no seat), pending output none."""
    sched = Scheduler(SchedulerConfig(**{**CFG, "max_num_seqs": 1, **overrides}))
    sched.add_request("a", [1, 2, 3, 4], max_tokens=4)
    out = sched.schedule()
    sched.update_from_output(out, ModelRunnerOutput({"a": (5,)}))
    sched.add_request("w", [7, 8], max_tokens=2)
    return sched


def pending(**overrides: object) -> Scheduler:
    """``base`` plus a scheduled step whose output is pending (a decodes 1 token)."""
    sched = base(**overrides)
    sched.schedule()
    return sched


def with_drafts() -> Scheduler:
    """Spec decode: a holds 2 drafts scheduled in the pending step."""
    sched = Scheduler(SchedulerConfig(**{**CFG, "num_spec_tokens": 2}))
    sched.add_request("a", [1, 2, 3, 4], max_tokens=8)
    out = sched.schedule()
    sched.update_from_output(out, ModelRunnerOutput({"a": (5,)}, {"a": (6, 7)}))
    out = sched.schedule()
    assert out.scheduled_spec_decode_tokens == {"a": (6, 7)}
    return sched


def async_with_drafts() -> Scheduler:
    """vllm-0.33-async, k=2: a's prefill (step 1) and its first decode (step 2, with 2 placeholder drafts) in flight."""
    sched = Scheduler(SchedulerConfig(**{**CFG, "num_spec_tokens": 2, "max_concurrent_batches": 2}), "vllm-0.33-async")
    sched.add_request("a", [1, 2, 3, 4], max_tokens=8)
    sched.schedule()
    out = sched.schedule()
    assert out.scheduled_spec_decode_tokens == {"a": (-1, -1)}
    return sched


def update(sched: Scheduler, sampled: dict, drafts: dict | None = None) -> Callable[[], object]:
    return lambda: sched.update_from_output(sched.pending_output, ModelRunnerOutput(sampled, drafts or {}))


def in_flight() -> Scheduler:
    sched = pending()
    sched.abort("a")
    return sched


def two_in_flight() -> Scheduler:
    """max_concurrent_batches 2: steps 2 and 3 in flight (a's prompt of 12 in chunks of 4; step 1 applied)."""
    sched = Scheduler(SchedulerConfig(**{**CFG, "max_num_batched_tokens": 4, "max_concurrent_batches": 2}))
    sched.add_request("a", range(1, 13), max_tokens=2)
    sched.update_from_output(sched.schedule(), ModelRunnerOutput())
    sched.schedule()
    sched.schedule()
    return sched


# (code, label, build the state, the refused call on that state)
CASES: list[tuple[str, str, Callable[[], Scheduler], Callable[[Scheduler], object]]] = [
    ("duplicate_request_id", "live id", base, lambda s: s.add_request("w", [1], max_tokens=1)),
    ("empty_prompt", "no tokens", base, lambda s: s.add_request("x", [], max_tokens=1)),
    ("prompt_too_long", "max_model_len tokens", base, lambda s: s.add_request("x", range(16), max_tokens=1)),
    ("invalid_max_tokens", "0", base, lambda s: s.add_request("x", [1], max_tokens=0)),
    ("invalid_min_tokens", "above max_tokens", base, lambda s: s.add_request("x", [1], max_tokens=1, min_tokens=2)),
    ("invalid_token_id", "negative", base, lambda s: s.add_request("x", [1, -1], max_tokens=1)),
    ("invalid_token_id", "10**30 in a prompt", base, lambda s: s.add_request("x", [1, 10**30], max_tokens=1)),
    (
        "invalid_token_id",
        "2**31 as a stop id",
        base,
        lambda s: s.add_request("x", [1], max_tokens=1, stop_token_ids=[2**31]),
    ),
    ("invalid_token_id", "10**30 sampled", pending, lambda s: update(s, {"a": (10**30,)})()),
    ("invalid_token_id", "10**30 drafted", with_drafts, lambda s: update(s, {"a": (9,)}, {"a": (10**30,)})()),
    ("invalid_request_id", "empty id", base, lambda s: s.add_request("", [1], max_tokens=1)),
    ("invalid_field_type", "NaN arrival", base, lambda s: s.add_request("x", [1], max_tokens=1, arrival_time=math.nan)),
    ("invalid_field_type", "inf arrival", base, lambda s: s.add_request("x", [1], max_tokens=1, arrival_time=math.inf)),
    ("invalid_field_type", "bool arrival", base, lambda s: s.add_request("x", [1], max_tokens=1, arrival_time=True)),
    ("invalid_field_type", "str max_tokens", base, lambda s: s.add_request("x", [1], max_tokens="2")),
    ("unknown_request_id", "abort", base, lambda s: s.abort("never")),
    ("request_id_in_flight", "re-add", in_flight, lambda s: s.add_request("a", [1], max_tokens=1)),
    ("output_not_processed", "schedule twice", pending, lambda s: s.schedule()),
    ("output_not_processed", "a third step with 2 in flight", two_in_flight, lambda s: s.schedule()),
    ("unscheduled_step", "step 4 of 3", two_in_flight, lambda s: s.get_in_flight_output(4)),
    ("unscheduled_step", "step 0", two_in_flight, lambda s: s.get_in_flight_output(0)),
    ("duplicate_model_output", "step 1 again", two_in_flight, lambda s: s.get_in_flight_output(1)),
    ("model_output_out_of_order", "step 3 before 2", two_in_flight, lambda s: s.get_in_flight_output(3)),
    (
        "unexpected_model_output",
        "newest step's object",
        two_in_flight,
        lambda s: s.update_from_output(s.last_step.output, ModelRunnerOutput()),
    ),
    (
        "unexpected_model_output",
        "no step",
        base,
        lambda s: s.update_from_output(s.last_step.output, ModelRunnerOutput()),
    ),
    ("bad_num_sampled_tokens", "too many", pending, lambda s: update(s, {"a": (1, 2)})()),
    ("unscheduled_model_output", "waiting w", pending, lambda s: update(s, {"a": (1,), "w": (2,)})()),
    ("unscheduled_draft_tokens", "waiting w", with_drafts, lambda s: update(s, {"a": (9,)}, {"w": (1,)})()),
    ("too_many_draft_tokens", "3 > 2", with_drafts, lambda s: update(s, {"a": (9,)}, {"a": (1, 2, 3)})()),
    (
        "drafts_under_async_scheduling",
        "worker drafts handed over",
        async_with_drafts,
        lambda s: s.update_from_output(s.get_output_to_apply(), ModelRunnerOutput({"a": (5,)}, {"a": (6, 7)})),
    ),
    ("drafts_without_spec_decode", "k = 0", pending, lambda s: update(s, {"a": (1,)}, {"a": (2,)})()),
    ("invalid_finish_status", "not a finished status", base, lambda s: s.finish_requests("a", RequestStatus.RUNNING)),
]


def crash_at_step_2() -> Scheduler:
    """spec decode k=2, threshold 2: a decodes in step 2 while b (one token) is padded to 3, cut to 2."""
    sched = Scheduler(SchedulerConfig(**{**CFG, "num_spec_tokens": 2, "long_prefill_token_threshold": 2}))
    sched.add_request("a", [1, 2, 3], max_tokens=8)
    out = sched.schedule()  # a alone: the threshold does not apply, 3 tokens
    sched.update_from_output(out, ModelRunnerOutput({"a": (5,)}))
    sched.add_request("b", [9], max_tokens=8)
    return sched


def crashed() -> Scheduler:
    sched = crash_at_step_2()
    with pytest.raises(EngineCrash):
        sched.schedule()
    return sched


# (code, label, build the state, the call that crashes or meets the dead engine)
CRASH_CASES: list[tuple[str, str, Callable[[], Scheduler], Callable[[Scheduler], object]]] = [
    ("engine_assertion_padded_admission", "padded 3, cut to 2", crash_at_step_2, lambda s: s.schedule()),
    ("engine_dead", "schedule", crashed, lambda s: s.schedule()),
    ("engine_dead", "add_request", crashed, lambda s: s.add_request("x", [1], max_tokens=1)),
    ("engine_dead", "abort", crashed, lambda s: s.abort("a")),
    ("engine_dead", "finish_requests", crashed, lambda s: s.finish_requests(None, RequestStatus.FINISHED_ABORTED)),
    ("engine_dead", "model output", crashed, lambda s: s.update_from_output(s.last_step.output, ModelRunnerOutput())),
]


def test_every_input_code_has_a_case():
    assert {c[0] for c in CASES} | {c[0] for c in CRASH_CASES} == set(ERROR_CODES) - NOT_API_CODES
    assert not {c[0] for c in CASES} & {c[0] for c in CRASH_CASES}


@pytest.mark.parametrize("code,label,build,call", CRASH_CASES, ids=[f"{c[0]}:{c[1]}" for c in CRASH_CASES])
def test_crash_is_terminal(code, label, build, call):
    sched = build()
    with pytest.raises(EngineCrash) as exc:
        call(sched)
    assert exc.value.code == code
    # Dead from now on: every call is refused with engine_dead and changes nothing.
    after = snapshot(sched)
    for later in (
        lambda s: s.schedule(),
        lambda s: s.add_request("y", [1], max_tokens=1),
        lambda s: s.abort("a"),
        lambda s: s.update_from_output(s.last_step.output, ModelRunnerOutput()),
    ):
        with pytest.raises(EngineCrash) as dead:
            later(sched)
        assert dead.value.code == "engine_dead"
        assert snapshot(sched) == after


@pytest.mark.parametrize("code,label,build,call", CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_refusal_changes_nothing(code, label, build, call):
    sched = build()
    before = snapshot(sched)
    with pytest.raises(InvalidEvent) as exc:
        call(sched)
    assert exc.value.code == code
    assert snapshot(sched) == before


def test_deep_state_sees_a_change():
    # The snapshot is not blind: one moved counter or one reordered free block shows.
    sched = base()
    before = snapshot(sched)
    sched.requests["a"].num_preemptions += 1
    assert snapshot(sched) != before
    sched = base()
    before = snapshot(sched)
    queue = sched.block_pool.free_block_queue
    queue.append_n([queue.popleft()])
    assert snapshot(sched) != before


# ---------------------------------------------------------------- item 10 a


def test_finish_requests_takes_one_str_id_as_one_id():
    # vLLM: ``if isinstance(request_ids, str): request_ids = (request_ids,)``.
    sched = Scheduler(SchedulerConfig(**CFG))
    for rid in ("10", "1", "0"):
        sched.add_request(rid, [1], max_tokens=1)
    assert sched.finish_requests("10", RequestStatus.FINISHED_ABORTED) == ["10"]
    assert [r.request_id for r in sched.waiting] == ["1", "0"]


def test_finish_requests_none_means_all():
    sched = Scheduler(SchedulerConfig(**CFG))
    sched.add_request("a", [1, 2], max_tokens=2)
    sched.add_request("b", [3], max_tokens=2)
    out = sched.schedule()
    sched.update_from_output(out, ModelRunnerOutput({"a": (4,), "b": (5,)}))
    sched.add_request("c", [6], max_tokens=2)
    assert sched.finish_requests(None, RequestStatus.FINISHED_ABORTED) == ["a", "b", "c"]
    assert not sched.has_unfinished_requests()
    assert sched.block_pool.get_num_free_blocks() == CFG["num_gpu_blocks"] - 1


@pytest.mark.parametrize("status", [RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED])
def test_a_waiting_request_may_be_stopped_from_outside(status):
    """vLLM's finish_requests sets any finished status on any live request (its own
    test_get_num_unfinished_requests stops waiting requests): w leaves the waiting queue
    holding no block, a keeps running, and w's id is in the next step's finished_req_ids."""
    sched = base()
    free_before = sched.block_pool.get_num_free_blocks()
    assert sched.finish_requests(["a", "w"] if status is RequestStatus.FINISHED_STOPPED else "w", status) == (
        ["a", "w"] if status is RequestStatus.FINISHED_STOPPED else ["w"]
    )
    assert list(sched.waiting) == [] and "w" not in sched.requests
    out = sched.schedule()
    assert "w" in out.finished_req_ids
    if status is RequestStatus.FINISHED_STOPPED:  # a too: its one block is back in the pool
        assert not sched.has_unfinished_requests()
        assert sched.block_pool.get_num_free_blocks() == free_before + 1
    else:
        assert [r.request_id for r in sched.running] == ["a"] and out.num_scheduled_tokens == {"a": 1}


def test_empty_output_with_drafts_leaves_the_request_unscheduled_for_good():
    """vLLM 0.32/0.33 skip the draft rejection when a request samples nothing: a (4 prompt + 1
    output = 5 tokens, 2 drafts) had 4 computed, 3 scheduled: 7 computed stay, 2 past its 5 tokens.
    Its next count is 5 + 2 new drafts - 7 = 0 (or 5 - 7 < 0 without drafts, clamped to 0):
    no later step schedules it; it keeps its seat and its blocks until it is aborted."""
    sched = with_drafts()
    blocks = sched.observe()["block_tables"]["a"]
    assert update(sched, {"a": ()}, {"a": (8, 9)})() == []
    assert sched.last_scheduler_stats["spec_decoding"] is None  # vLLM counts no drafts for an empty output
    a = sched.requests["a"]
    assert (a.status, a.num_tokens, a.num_computed_tokens) == (RequestStatus.RUNNING, 5, 7)
    for _ in range(3):
        out = sched.schedule()
        assert out.num_scheduled_tokens == {} and out.scheduled_spec_decode_tokens == {}
        sched.update_from_output(out, ModelRunnerOutput())
    assert [r.request_id for r in sched.running] == ["a"] and sched.observe()["block_tables"]["a"] == blocks
    sched.abort("a")
    assert "a" in sched.schedule().finished_req_ids


def test_empty_output_with_drafts_and_no_new_drafts_clamps_the_count_at_zero():
    sched = with_drafts()
    update(sched, {"a": ()})()
    a = sched.requests["a"]
    assert a.num_tokens_with_spec - a.num_computed_tokens == 5 - 7  # negative: clamped, not scheduled
    assert sched.schedule().num_scheduled_tokens == {}


# ---------------------------------------------------------------- item 10 c


def test_empty_sample_at_end_of_sequence_is_skipped():
    # vLLM update_from_output: ``if new_token_ids:`` guards the append and the
    # stop check; no output is emitted for the request. It keeps running with
    # nothing left to compute, so the next step skips it (num_new_tokens == 0).
    sched = pending()
    before = sched.requests["a"].num_tokens
    assert sched.update_from_output(sched.pending_output, ModelRunnerOutput({"a": ()})) == []
    req = sched.requests["a"]
    assert (req.status, req.num_tokens, req.num_computed_tokens) == (RequestStatus.RUNNING, before, before)
    out = sched.schedule()
    assert "a" not in out.num_scheduled_tokens


def test_empty_sample_with_drafts_rolls_back_under_0_11():
    # vLLM 0.11 update_from_output: num_accepted = len(generated) - 1 = -1,
    # num_rejected = 2 - (-1) = 3. a had 5 tokens + 2 drafts computed = 7;
    # 7 - 3 = 4 = num_tokens - 1: the last token is recomputed next step.
    sched = Scheduler(SchedulerConfig(**{**CFG, "num_spec_tokens": 2}), profile="vllm-0.11")
    sched.add_request("a", [1, 2, 3, 4], max_tokens=8)
    out = sched.schedule()
    sched.update_from_output(out, ModelRunnerOutput({"a": (5,)}, {"a": (6, 7)}))
    out = sched.schedule()
    assert out.scheduled_spec_decode_tokens == {"a": (6, 7)}
    assert sched.requests["a"].num_computed_tokens == 7
    assert sched.update_from_output(out, ModelRunnerOutput({"a": ()})) == []
    assert sched.requests["a"].num_computed_tokens == 4


# ---------------------------------------------------------------- item 10 d


def test_popleft_on_an_empty_free_queue_raises_value_error():
    queue = FreeKVCacheBlockQueue([KVCacheBlock(block_id=1)])
    queue.popleft()
    with pytest.raises(ValueError, match="No free blocks available"):
        queue.popleft()
