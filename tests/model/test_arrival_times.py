"""Arrival times are any finite number, as in vLLM (issue 10 item 11).

vLLM's ``Request.arrival_time`` is a float (``time.time()``), and the priority
queue orders by ``(priority, arrival_time, request_id)`` with the float as is.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from schedconf.conformance.adapters.impl import make_scheduler_sut
from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import replay
from schedconf.conformance.traces.examples import example_mixed
from schedconf.conformance.traces.trace import TraceError, parse_trace_text, render_trace
from schedconf.conformance.workloads.workload import run_workload
from schedconf.impl.scheduler import FastScheduler
from schedconf.spec.errors import InvalidEvent
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.scheduler import Scheduler

CFG = SchedulerConfig(
    block_size=4, num_gpu_blocks=9, max_num_batched_tokens=32, max_num_seqs=1, max_model_len=16, policy="priority"
)


@pytest.mark.parametrize("cls", [Scheduler, FastScheduler])
def test_priority_orders_by_the_float_arrival(cls):
    # Same priority: the earlier arrival 1.25 goes first although added second.
    # Truncated to ints both would be 1 and the id order ("a" < "b") would put
    # a first. One seat: only the head is admitted.
    sched = cls(CFG)
    sched.add_request("a", [1, 2], max_tokens=2, arrival_time=1.5)
    sched.add_request("b", [3, 4], max_tokens=2, arrival_time=1.25)
    out = sched.schedule()
    assert (
        list(out.num_scheduled_tokens) == ["b"]
        if cls is Scheduler
        else out.to_canonical()["num_scheduled_tokens"] == {"b": 2}
    )
    if cls is Scheduler:
        assert [r.request_id for r in sched.waiting] == ["a"]


def test_priority_victim_uses_the_float_arrival():
    # Priority preemption takes max (priority, arrival_time): 2.75 > 2.5.
    sched = Scheduler(dataclasses.replace(CFG, max_num_seqs=2, num_gpu_blocks=3, max_model_len=8))
    sched.add_request("late", [1, 2, 3, 4], max_tokens=4, arrival_time=2.75)
    sched.add_request("early", [5, 6, 7, 8], max_tokens=4, arrival_time=2.5)
    out = sched.schedule()
    sched.update_from_output(out, ModelRunnerOutput({"late": (9,), "early": (9,)}))
    sched.schedule()  # both need a second block, none free
    assert [(p.victim_id) for p in sched.last_step.preemptions] == ["late"]


@pytest.mark.parametrize("cls", [Scheduler, FastScheduler])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, True, "1.5", None])
def test_non_finite_or_non_number_arrival_refused(cls, bad):
    sched = cls(CFG)
    with pytest.raises(InvalidEvent) as exc:
        sched.add_request("a", [1], max_tokens=1, arrival_time=bad)
    assert exc.value.code == "invalid_field_type"


@pytest.mark.parametrize("cls", [Scheduler, FastScheduler])
def test_huge_token_id_refused_typed(cls):
    sched = cls(CFG)
    for kwargs in (
        {"prompt_token_ids": [1, 10**30]},
        {"prompt_token_ids": [2**31]},
        {"prompt_token_ids": [1], "eos_token_id": 10**30},
    ):
        with pytest.raises(InvalidEvent) as exc:
            sched.add_request("a", max_tokens=1, **kwargs)
        assert exc.value.code == "invalid_token_id"
    sched.add_request("a", [2**31 - 1], max_tokens=1)  # the largest int32 id is fine


def _float_trace_text() -> str:
    """The built-in example with every arrival moved by +0.5 (order unchanged, so outputs too)."""
    lines = render_trace(run_workload(example_mixed())).splitlines()
    out = []
    for line in lines:
        event = json.loads(line)
        if event["kind"] == "add_request":
            event["arrival_time"] = event["arrival_time"] + 0.5
        out.append(json.dumps(event, sort_keys=True, separators=(",", ":")))
    return "\n".join(out) + "\n"


def test_float_arrival_trace_replays_on_reference_and_impl():
    text = _float_trace_text()
    assert '"arrival_time":0.5' in text or ".5," in text
    trace = parse_trace_text(text, "float.jsonl")
    assert all(isinstance(e["arrival_time"], float) for e in trace.events if e["kind"] == "add_request")
    for sut in (ReferenceSut(), make_scheduler_sut()):
        result = replay(trace, sut)
        assert result.verdict == "pass", (sut.name, result.detail, result.divergence)


def test_float_outside_arrival_time_still_refused():
    text = _float_trace_text().replace('"max_tokens":', '"max_tokens":0.5,"x":', 1)
    with pytest.raises(TraceError):
        parse_trace_text(text, "t")
    lines = _float_trace_text().splitlines()
    event = json.loads(lines[1])
    event["priority"] = 1.0
    with pytest.raises(TraceError) as exc:
        parse_trace_text("\n".join([lines[0], json.dumps(event)]), "t")
    assert exc.value.field == "priority" and "float" in str(exc.value)
    for constant in ("NaN", "Infinity", "1e400"):
        with pytest.raises(TraceError):
            parse_trace_text(
                "\n".join([lines[0], lines[1].replace('"arrival_time":0.5', f'"arrival_time":{constant}')]), "t"
            )
