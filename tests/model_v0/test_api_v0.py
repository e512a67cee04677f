"""The v0 public API: the scheduler kinds, refused calls change nothing, engine crashes are terminal."""

import copy

import pytest

from schedconf.spec.errors import EngineCrash, InvalidConfig, InvalidEvent
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.schedulers import get_scheduler_kind, make_config, make_scheduler
from schedconf.spec.v0.config import V0SchedulerConfig
from schedconf.spec.v0.scheduler import Scheduler
from schedconf.spec.v1.scheduler import Scheduler as V1Scheduler

CFG = dict(
    block_size=4,
    num_gpu_blocks=8,
    num_cpu_blocks=4,
    max_num_batched_tokens=32,
    max_num_seqs=4,
    max_model_len=32,
    enable_chunked_prefill=False,
    enable_prefix_caching=True,
    policy="fcfs",
    preemption_mode=None,
    max_num_partial_prefills=1,
    max_long_partial_prefills=1,
    long_prefill_token_threshold=0,
)


def _state(s: Scheduler):
    return (
        s.observe(),
        s.get_queues(),
        s.current_step,
        s.pending is None,
        list(s._finished_requests_ids),
        sorted(s.seen_request_ids),
    )


def test_scheduler_kinds():
    assert get_scheduler_kind("vllm-0.10") == "v0"
    assert get_scheduler_kind("vllm-0.33") == "v1"
    with pytest.raises(InvalidConfig):
        get_scheduler_kind("vllm-0.9")
    assert isinstance(make_scheduler(CFG, "vllm-0.10"), Scheduler)
    assert isinstance(make_config(CFG, "vllm-0.10"), V0SchedulerConfig)
    assert isinstance(make_scheduler({}, "vllm-0.33"), V1Scheduler)
    with pytest.raises(InvalidConfig):
        make_scheduler({**CFG, "block_size": 0}, "vllm-0.10")


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.add_request("", [1], 1),
        lambda s: s.add_request("a", [1], 1),
        lambda s: s.add_request("b", [], 1),
        lambda s: s.add_request("b", list(range(33)), 1),
        lambda s: s.add_request("b", [1], 0),
        lambda s: s.add_request("b", [1], 2, min_tokens=3),
        lambda s: s.add_request("b", [-1], 2),
        lambda s: s.add_request("b", [1], 2, eos_token_id=2**31),
        lambda s: s.add_request("b", "abc", 2),
        lambda s: s.add_request("b", [1], 2, arrival_time=float("nan")),
        lambda s: s.add_request("b", [1], 2, priority=1),
        lambda s: s.abort("never"),
        lambda s: s.update_from_output(None, ModelRunnerOutput()),
    ],
)
def test_refused_calls_change_nothing(call):
    s = Scheduler(V0SchedulerConfig(**CFG))
    s.add_request("a", [1, 2, 3, 4, 5], 3)
    out = s.schedule()
    s.update_from_output(out, ModelRunnerOutput({"a": (7,)}))
    before = copy.deepcopy(_state(s))
    with pytest.raises(InvalidEvent):
        call(s)
    assert _state(s) == before


@pytest.mark.parametrize(
    "sampled, drafts",
    [
        ({}, {}),
        ({"a": (1, 2)}, {}),
        ({"a": (1,), "b": (1,)}, {}),
        ({"a": (-1,)}, {}),
        ({"a": (1,)}, {"a": (2,)}),
    ],
)
def test_refused_model_outputs_change_nothing(sampled, drafts):
    s = Scheduler(V0SchedulerConfig(**CFG))
    s.add_request("a", [1, 2, 3], 3)
    out = s.schedule()
    before = copy.deepcopy(_state(s))
    with pytest.raises(InvalidEvent):
        s.update_from_output(out, ModelRunnerOutput(sampled, drafts))
    assert _state(s) == before
    with pytest.raises(InvalidEvent) as exc:
        s.schedule()
    assert exc.value.code == "output_not_processed"
    assert [o.req_id for o in s.update_from_output(out, ModelRunnerOutput({"a": (7,)}))] == ["a"]


def test_aborted_between_schedule_and_update_is_skipped():
    s = Scheduler(V0SchedulerConfig(**CFG))
    s.add_request("a", [1, 2, 3], 3)
    s.add_request("b", [4, 5, 6], 3)
    out = s.schedule()
    assert s.abort("a") == ["a"]
    outputs = s.update_from_output(out, ModelRunnerOutput({"a": (7,), "b": (8,)}))
    assert [o.req_id for o in outputs] == ["b"]
    assert s.schedule().finished_requests_ids == ("a",)


def test_engine_crash_is_terminal():
    cfg = {
        **CFG,
        "num_gpu_blocks": 8,
        "num_cpu_blocks": 0,
        "preemption_mode": "swap",
        "max_model_len": 16,
        "enable_prefix_caching": False,
    }
    s = Scheduler(V0SchedulerConfig(**cfg))
    s.add_request("a", list(range(16)), 4, min_tokens=2)
    s.add_request("b", list(range(16)), 4, min_tokens=2)
    out = s.schedule()  # both take 4 blocks each: the pool is full
    s.update_from_output(out, ModelRunnerOutput({"a": (1,), "b": (1,)}))
    with pytest.raises(EngineCrash) as exc:
        s.schedule()  # a needs a block: b must swap out, there is no CPU block
    assert exc.value.code == "engine_swap_space_exhausted"
    for call in (s.schedule, lambda: s.abort("a"), lambda: s.add_request("c", [1], 1)):
        with pytest.raises(EngineCrash) as exc:
            call()
        assert exc.value.code == "engine_dead"
