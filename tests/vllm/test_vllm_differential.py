"""The reference model against the real vLLM v1 scheduler (``--sut vllm-v1@VERSION``).

Marked ``vllm``. A missing environment is built (``build_vllm_env``, ~2-3 min and
~2 GB per release, network access to PyPI), never skipped. One driver process
per release serves every test of a session.

What is checked:

* the driver speaks the protocol (init / add_request / schedule / update /
  observe / stats, the error codes, ``unsupported`` for a foreign profile);
* the golden scenarios (turned into traces by the reference) and generated
  traces replay against vLLM 0.33.0 (and 0.32.0, 0.11.0) with the ``strict``
  comparison and pass;
* the known 0.32 vs 0.33 difference (priority self-preemption) tells the two
  releases apart: a trace made under one profile passes on its release and
  fails on the other.

Sizes: ``SCHEDCONF_VLLM_TRACES`` generated traces per release (default 300 for
0.33.0, a third of that for 0.32.0 and 0.11.0; every third one an extended
trace, see :func:`run_extended`). The ``deep`` campaign (``pytest -m deep
tests/vllm -k campaign -s``) runs ``SCHEDCONF_VLLM_CAMPAIGN`` seeds per release
(default 1000; two traces per seed: generated and extended) from
``SCHEDCONF_VLLM_SEED`` (default 100000) and writes its summary to
``reports/vllm-campaign/<release>.json`` (git-ignored).

Select these tests with ``-m "vllm and not deep"``: a bare ``-m vllm`` replaces
the default ``-m 'not deep'`` and runs the long campaign too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from vllm_drivers import vllm_sut

from schedconf.conformance.checking.replay import FAIL, PASS, UNKNOWN, render_divergence, replay
from schedconf.conformance.engines.vllm_env import REPO_ROOT
from schedconf.conformance.sut import add_request_kwargs
from schedconf.conformance.traces.trace import Trace, make_header, read_trace
from schedconf.conformance.workloads.datadriven import parse_file, parse_tokens
from schedconf.conformance.workloads.workload import (
    OBSERVE_MAX_BLOCKS,
    AbortSpec,
    HashOracle,
    InvalidInput,
    RequestSpec,
    Workload,
    WorkloadError,
    respond,
    run_workload,
)
from schedconf.spec.errors import InvalidConfig, InvalidEvent
from schedconf.spec.output import ModelRunnerOutput
from schedconf.spec.v1.config import SchedulerConfig, cdiv
from schedconf.spec.v1.scheduler import Scheduler

pytestmark = pytest.mark.vllm

V033, V032, V011 = "0.33.0", "0.32.0", "0.11.0"
PROFILE = {V033: "vllm-0.33", V032: "vllm-0.32", V011: "vllm-0.11"}
SCENARIOS = sorted((REPO_ROOT / "conformance" / "testdata" / "scenarios").glob("*.txt"))
NUM_TRACES = int(os.environ.get("SCHEDCONF_VLLM_TRACES", "300"))


# ------------------------------------------------------------------ fixtures

# ------------------------------------------------------- scenario -> traces


def _observe(sched: Scheduler) -> dict[str, Any] | None:
    if sched.config.num_gpu_blocks > OBSERVE_MAX_BLOCKS:
        return None
    obs = sched.observe()
    return {"free_block_queue": obs["free_block_queue"], "num_free_blocks": obs["num_free_blocks"]}


def scenario_traces(path: Path, default_profile: str = "vllm-0.33") -> list[Trace]:
    """Record each ``config`` section of a golden scenario file as a trace, with the reference.

    A section without ``profile=`` is recorded under ``default_profile``.

    Commands map to events (``add-request``, ``abort``, ``schedule``,
    ``model-output`` (with ``step=N``: an older step in flight), ``step``,
    ``reset-prefix-cache``); refused inputs carry ``expect_error``; ``blocks``,
    ``queues`` and ``stats`` only inspect and are dropped (the stats of every
    update are in its ``expect``). A section whose
    config the reference refuses cannot be a trace and is skipped.
    """
    _, blocks = parse_file(path)
    traces: list[Trace] = []
    sched: Scheduler | None = None
    pending = None
    events: list[dict[str, Any]] = []
    header: dict[str, Any] | None = None

    def flush() -> None:
        if header is not None and events:
            traces.append(Trace(header=header, events=list(events), path=f"{path.name}#{len(traces) + 1}"))

    def model_output(args: list[str]) -> None:
        nonlocal pending
        assert sched is not None
        sampled: dict[str, list[int]] = {}
        drafts: dict[str, list[int]] = {}
        step = sched.in_flight[0].step if sched.in_flight else sched.current_step
        for a in args:
            key, _, value = a.partition("=")
            if key == "step":
                step = int(value)
            elif key.startswith("drafts:"):
                drafts[key.removeprefix("drafts:")] = parse_tokens(value)
            else:
                sampled[key] = parse_tokens(value)
        event: dict[str, Any] = {
            "kind": "model_output",
            "step": step,
            "sampled_token_ids": dict(sorted(sampled.items())),
            "draft_token_ids": dict(sorted(drafts.items())),
        }
        try:
            output = sched.get_in_flight_output(step)
            outputs = sched.update_from_output(
                output,
                ModelRunnerOutput({k: tuple(v) for k, v in sampled.items()}, {k: tuple(v) for k, v in drafts.items()}),
            )
            pending = sched.pending_output
            event["expect"] = {"outputs": [o.to_canonical() for o in outputs]}
            if sched.last_scheduler_stats is not None:
                event["expect"]["stats"] = sched.last_scheduler_stats
        except InvalidEvent as exc:
            event["expect_error"] = exc.code
        events.append(event)

    def schedule() -> None:
        nonlocal pending
        assert sched is not None
        try:
            pending = sched.schedule()
            event: dict[str, Any] = {"kind": "step", "step": pending.step, "expect": pending.to_canonical()}
            obs = _observe(sched)
            if obs is not None:
                event["observe"] = obs
        except InvalidEvent as exc:
            event = {"kind": "step", "step": sched.current_step + 1, "expect_error": exc.code}
        events.append(event)

    for block in blocks:
        name, *args = block.command.split()
        if name == "config":
            flush()
            events, sched, pending, header = [], None, None, None
            kv = dict(a.split("=", 1) for a in args)
            profile = kv.pop("profile", default_profile)
            fields = {
                k: (v if k == "policy" else (v == "true" if v in ("true", "false") else int(v))) for k, v in kv.items()
            }
            try:
                config = SchedulerConfig.from_dict(fields)
                sched = Scheduler(config, profile)
            except InvalidConfig:
                continue
            header = make_header(config.to_dict(), profile, 0, "hand", description=f"{path.name}:{block.line}")
        elif sched is None:
            continue
        elif name == "add-request":
            rid, *rest = args
            opts = dict(a.partition("=")[::2] for a in rest)
            event: dict[str, Any] = {
                "kind": "add_request",
                "request_id": rid,
                "prompt_token_ids": parse_tokens(opts["prompt"]),
                "max_tokens": int(opts["max-tokens"]),
                "priority": int(opts.get("priority", 0)),
                "arrival_time": int(opts.get("arrival", 0)),
                "eos_token_id": int(opts["eos"]) if "eos" in opts else None,
                "stop_token_ids": parse_tokens(opts.get("stop", "-")),
                "ignore_eos": "ignore-eos" in opts,
                "min_tokens": int(opts.get("min-tokens", 0)),
            }
            try:
                sched.add_request(**add_request_kwargs(event))
            except InvalidEvent as exc:
                event["expect_error"] = exc.code
            events.append(event)
        elif name == "abort":
            event = {"kind": "abort", "request_id": args[0]}
            try:
                sched.abort(args[0])
            except InvalidEvent as exc:
                event["expect_error"] = exc.code
            events.append(event)
        elif name == "schedule":
            schedule()
        elif name == "reset-prefix-cache":
            running = "running" in args
            events.append(
                {
                    "kind": "reset_prefix_cache",
                    "reset_running_requests": running,
                    "expect": {"success": sched.reset_prefix_cache(running)},
                }
            )
        elif name == "model-output":
            model_output(args)
        elif name == "step":
            schedule()
            if events[-1].get("expect_error") is None:
                model_output(args)
    flush()
    return traces


def all_scenario_traces(default_profile: str = "vllm-0.33") -> list[Trace]:
    return [t for path in SCENARIOS for t in scenario_traces(path, default_profile)]


# --------------------------------------------------------------- generation


def vllm_compatible(config: SchedulerConfig) -> SchedulerConfig:
    """The nearest config vLLM can run: no lookahead, ``max_num_seqs <= budget``,
    threshold within ``max_model_len`` (vLLM refuses the others, see vllm_driver)."""
    threshold = config.long_prefill_token_threshold
    if threshold > config.max_model_len:
        threshold = 0
    return dataclasses.replace(
        config,
        num_lookahead_tokens=0,
        long_prefill_token_threshold=threshold,
        max_num_seqs=min(config.max_num_seqs, config.max_num_batched_tokens),
    )


def stress_workload(seed: int, profile: str) -> Workload:
    """A seeded workload aimed at the scheduler's edges: more requests than seats,
    pools that force preemption, shared prefixes, priorities, drafts, stops and aborts."""
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 4, 8, 16])
    max_model_len = rng.randint(block_size + 2, 16 * block_size)
    min_blocks = cdiv(max_model_len, block_size)
    chunked = rng.random() < 0.75
    num_spec = rng.choice([0, 0, 1, 2, 4])
    if chunked:
        budget = rng.randint(max(2, num_spec + 2), max_model_len * 2)
    else:
        budget = rng.randint(max_model_len, 3 * max_model_len)
    threshold = min(max_model_len, rng.choice([0, 0, 0, num_spec + 1, num_spec + block_size, max_model_len // 2]))
    if threshold <= num_spec:
        threshold = 0
    config = SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=1 + min_blocks + rng.choice([0, 0, 1, 2, 3, min_blocks, 4 * min_blocks]),
        max_num_batched_tokens=budget,
        max_num_seqs=rng.randint(1, min(12, budget)),
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        enable_prefix_caching=rng.random() < 0.7,
        policy=rng.choice(["fcfs", "priority"]),
        num_spec_tokens=num_spec,
        num_lookahead_tokens=0,
        scheduler_reserve_full_isl=rng.choice([None, None, True, False]),
    )
    oracle = HashOracle(
        seed=rng.randint(0, 2**16),
        vocab_size=rng.choice([4, 16, 64]),
        eos_token_id=1,
        eos_per_mille=rng.choice([0, 10, 50, 200]),
        draft_accuracy_per_mille=rng.choice([0, 300, 700, 1000]),
    )
    max_prompt = max_model_len - 1
    bases = [tuple(range(100 * (b + 1), 100 * (b + 1) + max_prompt)) for b in range(3)]
    requests: list[RequestSpec] = []
    step = arrival = 0
    for i in range(rng.randint(1, 14)):
        length = rng.choice(
            [1, 2, block_size, block_size + 1, rng.randint(1, max_prompt), max_prompt, max(1, max_prompt // 2)]
        )
        length = max(1, min(length, max_prompt))
        if rng.random() < 0.5:
            shared = rng.choice([length, length - 1, length // block_size * block_size, rng.randint(0, length)])
            prompt = rng.choice(bases)[:shared] + tuple(5000 + 50 * i + j for j in range(length - shared))
        else:
            prompt = tuple(5000 + 50 * i + j for j in range(length))
        step += rng.choice([0, 0, 0, 1, 1, 2, 4])
        arrival += rng.choice([0, 1, 1, 2])
        rid = f"r{i}"
        max_tokens = rng.choice([1, 2, 3, 5, 8, 16, max_model_len])
        stops = (oracle.token(rid, rng.randint(0, 4)),) if rng.random() < 0.15 else ()
        requests.append(
            RequestSpec(
                request_id=rid,
                prompt_token_ids=prompt,
                max_tokens=max_tokens,
                priority=rng.choice([0, 0, 1, 2, 3]),
                arrival_time=arrival,
                eos_token_id=rng.choice([1, 1, None]),
                stop_token_ids=stops,
                ignore_eos=rng.random() < 0.1,
                min_tokens=min(max_tokens, rng.choice([0, 0, 0, 1, 4])),
                at_step=step,
            )
        )
    aborts = [AbortSpec(r.request_id, r.at_step + rng.randint(0, 6)) for r in requests if rng.random() < 0.12]
    if rng.random() < 0.1:  # abort of an id never added
        aborts.append(AbortSpec("ghost", rng.randint(0, 3)))
    workload = Workload(
        config=config,
        profile=profile,
        requests=tuple(requests),
        aborts=(),
        oracle=oracle,
        seed=seed,
        origin="generate",
        description="stress",
    )
    # An abort of an unknown id is an invalid input; keep it out of AbortSpec.
    valid = tuple(a for a in aborts if a.request_id != "ghost")
    invalid = tuple(
        InvalidInput({"kind": "abort", "request_id": "ghost"}, a.at_step) for a in aborts if a.request_id == "ghost"
    )
    return workload.replace(aborts=valid, invalid_inputs=invalid)


def for_release(workload: Workload) -> Workload:
    """Adapt a workload to what its release can run at all.

    vLLM 0.11 crashes (``TypeError`` in its priority heap) when two waiting
    requests tie on ``(priority, arrival_time)``, and has no full-sequence
    admission gate: its workloads get distinct arrival times (order kept) and
    ``scheduler_reserve_full_isl`` at the profile default. See reports/findings.md.
    """
    if workload.profile != "vllm-0.11":
        return workload
    requests = tuple(
        dataclasses.replace(r, arrival_time=len(workload.requests) * r.arrival_time + i)
        for i, r in enumerate(workload.requests)
    )
    config = workload.config
    if config.scheduler_reserve_full_isl:
        config = dataclasses.replace(config, scheduler_reserve_full_isl=None)
    return workload.replace(requests=requests, config=config)


def generated_workload(seed: int, profile: str) -> Workload:
    """Even seeds: schedconf.conformance.workloads.generate's biased generator (if present); odd seeds: :func:`stress_workload`."""
    if seed % 2 == 0:
        try:
            from schedconf.conformance.workloads import generate
        except ImportError:  # the richer generator is optional
            generate = None  # type: ignore[assignment]
        if generate is not None and hasattr(generate, "random_workload"):
            w = generate.random_workload(seed, profile=profile)
            return for_release(w.replace(config=vllm_compatible(w.config)))
    return for_release(stress_workload(seed, profile))


def generated_trace(seed: int, profile: str) -> Trace | None:
    """The reference's trace of workload ``seed``, or None if the workload cannot run."""
    try:
        return run_workload(generated_workload(seed, profile))
    except (WorkloadError, InvalidConfig):
        return None


def run_extended(workload: Workload, seed: int, max_steps: int = 2000) -> Trace | None:
    """Run ``workload`` on the reference like ``run_workload``, plus inputs its engine loop never makes.

    Real engines do these too: an abort that arrives while a step executes
    (vLLM's ``EngineCore.step`` applies it between the forward pass and
    ``update_from_output``), a request id reused once its first request has
    finished, drafts proposed after a prefill chunk (which the scheduler must
    drop), and drafts longer than what the next step can take.
    """
    rng = random.Random(seed)
    config = workload.config
    sched = Scheduler(config, workload.profile)
    observe = config.num_gpu_blocks <= OBSERVE_MAX_BLOCKS
    events: list[dict[str, Any]] = []
    pending_adds = sorted(workload.requests, key=lambda r: r.at_step)
    last_arrival = max((r.arrival_time for r in workload.requests), default=0)
    reuse = [
        dataclasses.replace(r, at_step=r.at_step + rng.randint(2, 12), arrival_time=last_arrival + 1 + i)
        for i, r in enumerate(workload.requests)
        if rng.random() < 0.2
    ]
    pending_adds = sorted(pending_adds + reuse, key=lambda r: r.at_step)
    aborts = sorted(
        (rng.randint(0, 12), rng.random() < 0.6, r.request_id) for r in workload.requests if rng.random() < 0.25
    )
    now = 0

    def abort(rid: str) -> dict[str, Any]:
        event: dict[str, Any] = {"kind": "abort", "request_id": rid}
        try:
            sched.abort(rid)
        except InvalidEvent as exc:  # not added yet
            event["expect_error"] = exc.code
        return event

    for _ in range(max_steps):
        if not sched.has_requests() and (pending_adds or aborts):
            now = max(now, min([r.at_step for r in pending_adds] + [a[0] for a in aborts]))
        while pending_adds and pending_adds[0].at_step <= now:
            r = pending_adds.pop(0)
            event = r.to_event()
            try:
                sched.add_request(
                    r.request_id,
                    r.prompt_token_ids,
                    r.max_tokens,
                    priority=r.priority,
                    arrival_time=r.arrival_time,
                    eos_token_id=r.eos_token_id,
                    ignore_eos=r.ignore_eos,
                    stop_token_ids=r.stop_token_ids,
                    min_tokens=r.min_tokens,
                )
            except InvalidEvent as exc:
                event["expect_error"] = exc.code
            events.append(event)
        while aborts and aborts[0][0] <= now and (not aborts[0][1] or not sched.has_requests()):
            events.append(abort(aborts.pop(0)[2]))
        if not sched.has_requests():
            if pending_adds or aborts:
                now += 1
                continue
            break
        output = sched.schedule()
        step_event: dict[str, Any] = {"kind": "step", "step": output.step, "expect": output.to_canonical()}
        obs = _observe(sched) if observe else None
        if obs is not None:
            step_event["observe"] = obs
        events.append(step_event)
        assert sched.last_step is not None
        samples = dict(sched.last_step.samples)
        # Aborts that arrive while the step executes.
        while aborts and aborts[0][0] <= now:
            events.append(abort(aborts.pop(0)[2]))
        sampled, drafts = respond(workload.oracle, output, samples, config.num_spec_tokens)
        drafts = dict(drafts)
        if config.num_spec_tokens:
            for rid in output.num_scheduled_tokens:
                if not samples[rid] and rng.random() < 0.5:  # drafts after a prefill chunk
                    drafts[rid] = tuple(rng.randint(2, 9) for _ in range(rng.randint(0, config.num_spec_tokens)))
        outputs = sched.update_from_output(output, ModelRunnerOutput(sampled, drafts))
        events.append(
            {
                "kind": "model_output",
                "step": output.step,
                "sampled_token_ids": {k: list(v) for k, v in sorted(sampled.items())},
                "draft_token_ids": {k: list(v) for k, v in sorted(drafts.items())},
                "expect": {"outputs": [o.to_canonical() for o in outputs]},
            }
        )
        now += 1
    else:
        return None
    header = make_header(config.to_dict(), workload.profile, seed, "generate", description="extended")
    return Trace(header=header, events=events)


def _explain(trace: Trace, result: Any) -> str:
    return render_divergence(trace, result) + "\n" + json.dumps(trace.header, sort_keys=True)


# -------------------------------------------------------------------- tests


def test_driver_speaks_the_protocol() -> None:
    sut = vllm_sut(V033)
    config = SchedulerConfig(
        block_size=4, num_gpu_blocks=9, max_num_batched_tokens=8, max_num_seqs=4, max_model_len=16
    ).to_dict()
    sut.start(config, "vllm-0.33")
    assert sut.capabilities.get("observe") is True
    event = {
        "request_id": "a",
        "prompt_token_ids": [1, 2, 3, 4, 5, 6],
        "max_tokens": 2,
        "priority": 0,
        "arrival_time": 0,
        "eos_token_id": None,
        "stop_token_ids": [],
        "ignore_eos": False,
        "min_tokens": 0,
    }
    sut.call("add_request", event)
    # Input errors carry the protocol's codes, and change nothing.
    from schedconf.conformance.sut import SutInputError

    for bad, code in (
        ({**event}, "duplicate_request_id"),
        ({**event, "request_id": "b", "prompt_token_ids": []}, "empty_prompt"),
        ({**event, "request_id": "b", "prompt_token_ids": list(range(16))}, "prompt_too_long"),
        ({**event, "request_id": "b", "max_tokens": 0}, "invalid_max_tokens"),
        ({**event, "request_id": "b", "min_tokens": 3}, "invalid_min_tokens"),
        ({**event, "request_id": "b", "prompt_token_ids": [-1]}, "invalid_token_id"),
        ({**event, "request_id": ""}, "invalid_request_id"),
    ):
        with pytest.raises(SutInputError) as info:
            sut.call("add_request", bad)
        assert info.value.code == code
    with pytest.raises(SutInputError) as info:
        sut.abort("never-added")
    assert info.value.code == "unknown_request_id"
    with pytest.raises(SutInputError) as info:
        sut.update_from_output({}, {})
    assert info.value.code == "unexpected_model_output"

    out = sut.schedule()
    assert out["num_scheduled_tokens"] == {"a": 6}
    assert out["scheduled_new_reqs"] == [{"req_id": "a", "block_ids": [1, 2], "num_computed_tokens": 0}]
    assert out["preempted_req_ids"] == [] and out["finished_req_ids"] == []
    assert sut.observe() == {"free_block_queue": [3, 4, 5, 6, 7, 8], "num_free_blocks": 6}
    with pytest.raises(SutInputError) as info:
        sut.schedule()
    assert info.value.code == "output_not_processed"
    with pytest.raises(SutInputError) as info:
        sut.update_from_output({"a": [7, 8]}, {})  # no drafts were scheduled: 1 token at most
    assert info.value.code == "bad_num_sampled_tokens"
    assert sut.update_from_output({"a": [7]}, {}) == [
        {"req_id": "a", "new_token_ids": [7], "finish_reason": None, "stop_reason": None}
    ]
    out = sut.schedule()
    assert out["scheduled_cached_reqs"] == [
        {"req_id": "a", "resumed": False, "new_block_ids": [], "num_computed_tokens": 6, "num_output_tokens": 1}
    ]
    assert sut.update_from_output({"a": [9]}, {}) == [
        {"req_id": "a", "new_token_ids": [9], "finish_reason": "length", "stop_reason": None}
    ]
    assert sut.schedule()["finished_req_ids"] == ["a"]
    sut.update_from_output({}, {})
    stats = sut.stats()
    assert stats["steps"] == 3 and stats["scheduler_seconds"] > 0

    # An id aborted during the pending step comes back only after the update.
    sut.start(config, "vllm-0.33")
    sut.add_request({**event, "request_id": "x"})
    sut.schedule()
    sut.abort("x")
    with pytest.raises(SutInputError) as info:
        sut.add_request({**event, "request_id": "x"})
    assert info.value.code == "request_id_in_flight"
    assert sut.update_from_output({"x": [3]}, {}) == []
    sut.add_request({**event, "request_id": "x"})

    # A profile of another release, and lookahead, are unknown, not failures.
    from schedconf.conformance.sut import SutUnsupported

    with pytest.raises(SutUnsupported):
        sut.start(config, "vllm-0.32")
    with pytest.raises(SutUnsupported):
        sut.start({**config, "num_lookahead_tokens": 2}, "vllm-0.33")
    # A config error vLLM refuses too gets the protocol's code.
    with pytest.raises(SutInputError) as info:
        sut.start({**config, "num_gpu_blocks": 4}, "vllm-0.33")
    assert info.value.code == "pool_below_max_model_len"


def test_scenario_conversion_replays_on_the_reference() -> None:
    from schedconf.conformance.adapters.reference import ReferenceSut

    traces = all_scenario_traces()
    assert len(traces) >= len(SCENARIOS)
    for trace in traces:
        result = replay(trace, ReferenceSut(), "strict")
        assert result.verdict == PASS, _explain(trace, result)


# CI runs the differential for every release whose v1 scheduler the model tracks.
RELEASES = [V033, V032, V011]


@pytest.mark.parametrize("version", RELEASES)
def test_golden_scenarios_replay_on_vllm(version: str) -> None:
    sut = vllm_sut(version)
    verdicts: Counter[str] = Counter()
    for trace in all_scenario_traces(PROFILE[version]):
        if trace.profile != PROFILE[version]:
            continue
        result = replay(trace, sut, "strict")
        verdicts[result.verdict] += 1
        if result.verdict == UNKNOWN:
            # Only configs vLLM itself refuses (documented in vllm_driver) may be unknown.
            assert "refuses" in result.detail, result.detail
            continue
        assert result.verdict == PASS, _explain(trace, result)
    assert verdicts[PASS] >= 10, verdicts


@pytest.mark.parametrize("version", RELEASES)
def test_generated_traces_replay_on_vllm(version: str) -> None:
    sut = vllm_sut(version)
    n = NUM_TRACES if version == V033 else max(1, NUM_TRACES // 3)
    verdicts: Counter[str] = Counter()
    for seed in range(n):
        # Every third trace also carries mid-step aborts, reused ids and stray drafts.
        trace = (
            run_extended(generated_workload(seed, PROFILE[version]), seed)
            if seed % 3 == 2
            else generated_trace(seed, PROFILE[version])
        )
        if trace is None:
            continue
        result = replay(trace, sut, "strict")
        verdicts[result.verdict] += 1
        assert result.verdict == PASS, f"seed {seed}:\n" + _explain(trace, result)
    assert verdicts[PASS] >= n * 0.9, verdicts


@pytest.mark.parametrize("version", RELEASES)
def test_golden_corpus_replays_on_vllm(version: str) -> None:
    """Every trace of the release's golden corpus (conformance/traces/vectors/v2), the Z3 witnesses included."""
    from schedconf.conformance.traces.vectors import iter_corpus

    sut = vllm_sut(version)
    names = []
    for _, path, entry in iter_corpus(PROFILE[version]):
        name = entry["file"]
        trace = read_trace(path)
        result = replay(trace, sut, "strict")
        if version == V011 and name in ("refused-pool_blocks.jsonl", "refused-pool_tokens.jsonl"):
            # findings.md F5: vLLM 0.11 accepts a pool that cannot hold one max_model_len sequence
            # (it does not hold the null block back); the model, as 0.32/0.33, refuses it.
            assert result.verdict == FAIL and "pool_below_max_model_len" in str(result.divergence), name
            continue
        if version == V011 and name.startswith("witness-liveness_thrash"):
            # Tied (priority, arrival_time) keys, which the 0.11 thrash needs: real 0.11.0
            # crashes in its priority heap first (findings.md F4, F8; spec/symbolic/LIVENESS.md).
            assert result.verdict == FAIL and "not supported between instances" in str(result.divergence), name
            continue
        if result.verdict == UNKNOWN:
            # Configs vLLM refuses or cannot express (model-only lookahead, findings.md
            # F6; no admission gate knob in 0.11), as the driver declares them.
            assert "refuses" in result.detail or result.detail.startswith("unsupported:"), f"{name}: {result.detail}"
            continue
        assert result.verdict == PASS, f"{name}:\n" + _explain(trace, result)
        names.append(name)
    assert len(names) >= 10 and (version != V033 or sum(n.startswith("witness-") for n in names) == 6), names


def _relabel(trace: Trace, profile: str) -> Trace:
    """The same events and expectations, announced for another release."""
    return Trace(header={**trace.header, "profile": profile}, events=trace.events, path=trace.path)


def test_priority_self_preemption_tells_032_from_033() -> None:
    path = REPO_ROOT / "conformance" / "testdata" / "scenarios" / "profile_priority_self_preemption.txt"
    by_profile = {t.profile: t for t in scenario_traces(path)}
    assert set(by_profile) == {"vllm-0.33", "vllm-0.32"}
    for own, other in ((V033, V032), (V032, V033)):
        trace = by_profile[PROFILE[own]]
        assert replay(trace, vllm_sut(own), "strict").verdict == PASS
        result = replay(_relabel(trace, PROFILE[other]), vllm_sut(other), "strict")
        assert result.verdict == FAIL, f"{PROFILE[own]} trace passed on vLLM {other}"
        assert result.divergence is not None and result.divergence.step == 3
        assert result.divergence.kind == "scheduler_output"


def test_generated_profile_difference_tells_releases_apart() -> None:
    """Find generated workloads whose reference traces differ between the two
    profiles; each trace must pass on its own release and fail on the other."""
    found = 0
    for seed in range(1, 4000, 2):  # stress workloads
        w33 = stress_workload(seed, "vllm-0.33")
        if w33.config.policy != "priority":
            continue
        try:
            t33 = run_workload(w33)
            t32 = run_workload(w33.replace(profile="vllm-0.32"))
        except (WorkloadError, InvalidConfig):
            continue
        if t33.events == t32.events:
            continue
        for own, other, trace in ((V033, V032, t33), (V032, V033, t32)):
            assert replay(trace, vllm_sut(own), "strict").verdict == PASS, f"seed {seed} on {own}"
            result = replay(_relabel(trace, PROFILE[other]), vllm_sut(other), "strict")
            assert result.verdict == FAIL, f"seed {seed}: the {PROFILE[own]} trace passed on {other}"
        found += 1
        if found == 3:
            break
    assert found >= 1, "no generated workload separates the two profiles"


# ------------------------------------------------------- the deep campaign


def _features(trace: Trace) -> list[str]:
    c = trace.config
    steps = [e for e in trace.events if e["kind"] == "step" and "expect" in e]
    return [
        k
        for k, on in (
            ("priority", c["policy"] == "priority"),
            ("chunked_off", not c["enable_chunked_prefill"]),
            ("prefix_caching", c["enable_prefix_caching"]),
            ("spec_decode", c["num_spec_tokens"] > 0),
            ("threshold", c["long_prefill_token_threshold"] > 0),
            ("preemption", any(e["expect"]["preempted_req_ids"] for e in steps)),
            ("prefix_hit", any(r["num_computed_tokens"] > 0 for e in steps for r in e["expect"]["scheduled_new_reqs"])),
            ("resumed", any(r["resumed"] for e in steps for r in e["expect"]["scheduled_cached_reqs"])),
            ("drafts", any(e["expect"]["scheduled_spec_decode_tokens"] for e in steps)),
            ("input_error", any("expect_error" in e for e in trace.events)),
            (
                "mid_step_abort",
                any(e["kind"] == "abort" and prev["kind"] == "step" for prev, e in zip(trace.events, trace.events[1:])),
            ),
        )
        if on
    ]


@pytest.mark.deep
@pytest.mark.parametrize("version", [V033, V032, V011])
def test_campaign(version: str) -> None:
    """A long differential campaign: for each seed, the generated trace and the
    extended one (:func:`run_extended`), replayed strict. Writes
    reports/vllm-campaign/<release>.json (git-ignored)."""
    n = int(os.environ.get("SCHEDCONF_VLLM_CAMPAIGN", "1000"))
    first = int(os.environ.get("SCHEDCONF_VLLM_SEED", "100000"))
    sut = vllm_sut(version)
    profile = PROFILE[version]
    verdicts: Counter[str] = Counter()
    features: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    started = time.monotonic()
    steps = 0
    for seed in range(first, first + n):
        for kind in ("generated", "extended"):
            trace = (
                generated_trace(seed, profile)
                if kind == "generated"
                else run_extended(generated_workload(seed, profile), seed)
            )
            if trace is None:
                verdicts["not_generated"] += 1
                continue
            features.update(_features(trace))
            result = replay(trace, sut, "strict")
            verdicts[result.verdict] += 1
            steps += result.steps_run
            if result.verdict != PASS:
                failures.append(
                    {
                        "seed": seed,
                        "kind": kind,
                        "verdict": result.verdict,
                        "detail": result.detail[:500],
                        "divergence": result.divergence.to_dict() if result.divergence else None,
                    }
                )
    summary = {
        "release": version,
        "profile": profile,
        "first_seed": first,
        "seeds": n,
        "traces": 2 * n,
        "verdicts": dict(verdicts),
        "features": dict(features),
        "steps": steps,
        "seconds": round(time.monotonic() - started, 1),
        "failures": failures[:50],
    }
    out = REPO_ROOT / "reports" / "vllm-campaign" / f"{version}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "failures"}, sort_keys=True))
    assert not failures, json.dumps(failures[:5], indent=1)


def test_finding_f7_same_step_priority_victim_cache_hit_is_real_vllm_behaviour() -> None:
    """reports/findings.md F7: vLLM 0.33 serves a prefix hit on a block whose KV was never computed.

    From the trace alone: r0 computes 8 + 8 tokens in steps 3 and 4, is
    scheduled and then preempted in step 5 (its tokens given back), and in step
    6 resumes with a 20-token prefix hit, more than the 16 tokens it ever
    computed. vLLM 0.33.0 replays the trace exactly (strict).
    """

    trace = read_trace(REPO_ROOT / "reports" / "findings" / "F7-same-step-priority-victim-cache-hit.jsonl")
    computed = 0
    for e in trace.events:
        if e["kind"] != "step":
            continue
        x = e["expect"]
        if e["step"] < 5:
            computed += x["num_scheduled_tokens"].get("r0", 0)
        if e["step"] == 5:
            assert "r0" in x["preempted_req_ids"] and "r0" not in x["num_scheduled_tokens"]
        if e["step"] == 6:
            (resumed,) = [c for c in x["scheduled_cached_reqs"] if c["req_id"] == "r0"]
            assert resumed["resumed"] and resumed["num_computed_tokens"] == 20 > computed == 16
    assert replay(trace, vllm_sut(V033), "strict").verdict == PASS
