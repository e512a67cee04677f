"""Shared strategies for the symbolic tests: small schedulers driven a few events.

``driven_schedulers`` draws a configuration whose pool and request slots fit
a symbolic shape (``R = 4`` slots, 3 to 6 usable blocks), then a short random
program of ``add_request`` / ``abort`` / steps, and stops either between
steps (IDLE) or with a step's output pending (PENDING). Pools are drawn tight
and outputs long so that preemption and prefix hits happen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.scheduler import Scheduler

NUM_SLOTS = 4
EOS, STOP = 1, 2
SHARED_PREFIX = tuple(range(10, 60))


@st.composite
def configs(
    draw: st.DrawFn,
    policies: tuple[str, ...] = ("fcfs", "priority"),
    prefill_schedule_intervals: tuple[int, ...] = (1,),
) -> SchedulerConfig:
    """A small, tight configuration (the symbolic encoding has no spec decode).

    ``prefill_schedule_intervals``: the local prefill cadences to draw from (drawn last, and only
    when there is a choice, so that the other draws stay those of the default).
    """
    block_size = draw(st.sampled_from([1, 2, 3]))
    num_blocks = draw(st.integers(3, 6))
    max_model_len = draw(st.integers(max(2, (num_blocks - 2) * block_size), num_blocks * block_size))
    chunked = draw(st.integers(0, 4)) != 0
    budget = draw(st.integers(max_model_len if not chunked else 1, max_model_len + 3))
    return SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=num_blocks + 1,
        max_num_batched_tokens=budget,
        max_num_seqs=draw(st.integers(1, min(NUM_SLOTS, budget))),
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 2])),
        enable_prefix_caching=draw(st.integers(0, 5)) != 0,
        policy=draw(st.sampled_from(policies)),
        num_lookahead_tokens=draw(st.sampled_from([0, 0, 1])),
        prefill_schedule_interval=(
            draw(st.sampled_from(prefill_schedule_intervals))
            if len(prefill_schedule_intervals) > 1
            else prefill_schedule_intervals[0]
        ),
    )


@dataclass
class Driven:
    """A scheduler after a random program, and the program's log (for failure messages)."""

    sched: Scheduler
    log: list[str] = field(default_factory=list)
    next_id: int = 0
    clock: int = 0


def add_random_request(data: st.DataObject, d: Driven) -> str:
    """Add one request: a prompt that shares a prefix with others half of the time."""
    cfg = d.sched.config
    length = data.draw(st.integers(1, cfg.max_model_len - 1), label="prompt_len")
    if data.draw(st.booleans(), label="shared"):
        prompt = list(SHARED_PREFIX[:length])
    else:
        prompt = data.draw(st.lists(st.integers(3, 9), min_size=length, max_size=length), label="prompt")
    rid = f"r{d.next_id}"
    d.next_id += 1
    d.clock += data.draw(st.integers(0, 1), label="tick")
    d.sched.add_request(
        rid,
        prompt,
        data.draw(st.integers(1, 2 * cfg.max_model_len), label="max_tokens"),
        priority=data.draw(st.integers(0, 2), label="priority"),
        arrival_time=d.clock,
        eos_token_id=EOS,
        stop_token_ids=[STOP],
    )
    d.log.append(f"add {rid} len={length}")
    return rid


def sample_outputs(data: st.DataObject, sched: Scheduler) -> dict[str, tuple[int, ...]]:
    """One token per request that samples this step; a stop token one time in eight."""
    assert sched.last_step is not None
    return {
        rid: (data.draw(st.sampled_from([EOS, STOP] + [7] * 14), label=f"token {rid}"),)
        for rid, samples in sched.last_step.samples.items()
        if samples
    }


def drive(
    data: st.DataObject, config: SchedulerConfig, max_events: int = 12, end_pending: bool | None = None
) -> Driven:
    """Run a random program on a fresh scheduler; end IDLE or PENDING as drawn."""
    d = Driven(Scheduler(config, "vllm-0.33"))
    for _ in range(data.draw(st.integers(0, max_events), label="num_events")):
        kind = data.draw(st.sampled_from(["add", "add", "step", "step", "step", "abort"]), label="event")
        live = sorted(d.sched.requests)
        if kind == "add" and len(live) < NUM_SLOTS and config.max_model_len >= 2:
            add_random_request(data, d)
        elif kind == "abort" and live:
            rid = data.draw(st.sampled_from(live), label="abort")
            d.sched.abort(rid)
            d.log.append(f"abort {rid}")
        elif kind == "step" and d.sched.has_requests():
            out = d.sched.schedule()
            d.sched.update_from_output(out, ModelRunnerOutput(sample_outputs(data, d.sched)))
            d.log.append("step")
    pending = data.draw(st.booleans(), label="end_pending") if end_pending is None else end_pending
    if pending and d.sched.has_requests():
        d.sched.schedule()
        d.log.append("schedule (pending)")
    return d
