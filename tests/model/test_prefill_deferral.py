"""The prefill throttle, the local prefill cadence and the decode stagger: refusals and the invariant.

The rules' behaviour step by step is in the golden scenarios (prefill_throttle.txt,
local_prefill_cadence.txt, pp_decode_stagger.txt, log_stats_off.txt); here: what is refused,
and that the deferral invariant can fail.
"""

from __future__ import annotations

import dataclasses

import pytest

from schedconf.spec.errors import InvalidConfig, InvalidEvent, InvariantViolation
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.invariants import check_invariants
from schedconf.spec.v1.scheduler import Scheduler

CFG = dict(block_size=4, num_gpu_blocks=17, max_num_batched_tokens=16, max_num_seqs=2, max_model_len=32)


def test_throttle_must_be_a_boolean_and_leaves_the_scheduler_unchanged():
    sched = Scheduler(SchedulerConfig(**CFG))
    with pytest.raises(InvalidEvent) as exc:
        sched.schedule(throttle_prefills=1)  # type: ignore[arg-type]
    assert exc.value.code == "invalid_field_type"
    assert sched.current_step == 0


def test_a_release_without_the_throttle_refuses_it():
    sched = Scheduler(SchedulerConfig(**CFG), "vllm-0.11")
    with pytest.raises(InvalidEvent) as exc:
        sched.schedule(throttle_prefills=True)
    assert exc.value.code == "knob_not_in_release"
    assert sched.schedule(throttle_prefills=False).total_num_scheduled_tokens == 0


@pytest.mark.parametrize(
    "fields, profile, code",
    [
        (dict(pipeline_parallel_size=0), "vllm-0.33-async", "invalid_pipeline_parallel_size"),
        (dict(pipeline_parallel_size=2), "vllm-0.33", "pipeline_parallel_not_modelled"),
        (dict(pipeline_parallel_size=2), "vllm-0.11", "pipeline_parallel_not_modelled"),
        (dict(prefill_schedule_interval=0), "vllm-0.33", "invalid_prefill_schedule_interval"),
        (dict(prefill_schedule_interval=2), "vllm-0.32", "knob_not_in_release"),
        (dict(log_stats=1), "vllm-0.33", "invalid_config_type"),
    ],
)
def test_config_refusals(fields, profile, code):
    with pytest.raises(InvalidConfig) as exc:
        Scheduler(SchedulerConfig(**{**CFG, **fields}), profile)
    assert exc.value.code == code


def test_pipeline_parallelism_is_accepted_under_async_profiles_of_both_releases():
    for profile in ("vllm-0.33-async", "vllm-0.32-async"):
        Scheduler(SchedulerConfig(**{**CFG, "pipeline_parallel_size": 3, "use_v2_model_runner": True}), profile)


def test_the_deferral_invariant_fails_on_a_deferred_step_that_admits_a_prompt():
    # A normal step admits r0's 8 prompt tokens; had the step deferred prefill, at most
    # 1 + num_spec_tokens = 1 token per request would be allowed.
    sched = Scheduler(SchedulerConfig(**CFG))
    sched.add_request("r0", list(range(8)), max_tokens=2)
    sched.schedule()
    check_invariants(sched)
    assert sched.last_step is not None
    sched.last_step = dataclasses.replace(sched.last_step, defer_prefills=True)
    with pytest.raises(InvariantViolation) as exc:
        check_invariants(sched)
    assert exc.value.invariant == "deferred_step_carries_no_prefill"


def test_without_log_stats_an_update_reports_no_stats_and_with_it_one():
    for log_stats, reported in ((True, True), (False, False)):
        sched = Scheduler(SchedulerConfig(**CFG, log_stats=log_stats))
        sched.add_request("r0", [1, 2, 3, 4], max_tokens=2)
        out = sched.schedule()
        sched.update_from_output(out, ModelRunnerOutput({"r0": (5,)}))
        assert (sched.last_scheduler_stats is not None) is reported
