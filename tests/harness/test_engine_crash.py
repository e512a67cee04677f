"""vLLM 0.32/0.33's engine crash on a cut padded admission, modelled where it happens (issue 15 item 5).

With ``0 < long_prefill_token_threshold <= num_spec_tokens`` vLLM pads a
one-token admission to ``1 + num_spec_tokens``, the threshold cuts it, and
``assert num_new_tokens == 1 + self.num_spec_tokens`` kills the engine core
(reports/findings.md, divergence 3). The model crashes at that step
(``engine_assertion_padded_admission``), then refuses every call
(``engine_dead``); a trace ends with a ``step`` that expects the crash, and the
reference, impl and the JS example all replay it. The vLLM driver side is
checked against real vLLM in tests/vllm (and by ``schedconf run --sut
vllm-v1@0.33.0``); here its classification of the assertion is checked on
synthetic tracebacks.
"""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import replace

import pytest

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import PASS, render_divergence, replay
from schedconf.conformance.engines.vllm_driver import PADDED_ADMISSION_ASSERT, _is_padded_admission_assert
from schedconf.conformance.traces.trace import Trace
from schedconf.conformance.workloads.generate import SPEC_CUT_THRESHOLD_RATE, random_workload
from schedconf.conformance.workloads.workload import (
    HashOracle,
    RequestSpec,
    Workload,
    run_workload,
    workload_from_trace,
)
from schedconf.spec.errors import ERROR_CODES, EngineCrash
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.scheduler import Scheduler

CONFIG = SchedulerConfig(
    block_size=4,
    num_gpu_blocks=20,
    max_num_batched_tokens=16,
    max_num_seqs=4,
    max_model_len=16,
    long_prefill_token_threshold=2,
    enable_prefix_caching=False,
    num_spec_tokens=2,
)
"""The reproduction of reports/findings.md divergence 3."""


def repro(profile: str = "vllm-0.33", config: SchedulerConfig = CONFIG) -> Workload:
    """a decodes in step 2 while b, a one-token prompt, is admitted: padded to 3, cut to 2."""
    return Workload(
        config=config,
        profile=profile,
        oracle=HashOracle(seed=3, eos_per_mille=0),
        origin="hand",
        requests=(RequestSpec("a", (1, 2, 3), 8), RequestSpec("b", (9,), 8, arrival_time=1, at_step=1)),
    )


def test_the_codes_are_in_the_table():
    assert {"engine_assertion_padded_admission", "engine_dead"} <= set(ERROR_CODES)
    assert "threshold_below_spec_tokens" not in ERROR_CODES  # no start-up refusal any more


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.32"])
def test_the_trace_ends_with_the_crash(profile):
    trace = run_workload(repro(profile), check=True)
    steps = [e for e in trace.events if e["kind"] == "step"]
    assert len(steps) == 2
    assert trace.events[-1] == {"kind": "step", "step": 2, "expect_error": "engine_assertion_padded_admission"}
    # Nothing after the crash; the crash's step has no model output.
    assert [e["kind"] for e in trace.events] == ["add_request", "step", "model_output", "add_request", "step"]


def test_0_11_has_no_padding_and_runs_to_the_end():
    trace = run_workload(repro("vllm-0.11"), check=True)
    assert "expect_error" not in trace.events[-1]
    step2 = [e for e in trace.events if e["kind"] == "step"][1]["expect"]
    assert step2["num_scheduled_tokens"]["b"] == 1 and "b" not in step2["scheduled_spec_decode_tokens"]


@pytest.mark.parametrize(
    "change,why",
    [
        (dict(long_prefill_token_threshold=3), "threshold above num_spec_tokens: the padding is kept"),
        (dict(long_prefill_token_threshold=0), "no threshold"),
        (dict(max_num_batched_tokens=3, max_num_seqs=3), "a's 1 + 3 > 3: the padding does not fit, b waits"),
    ],
)
def test_no_crash_unless_the_threshold_cuts_a_padded_admission(change, why):
    trace = run_workload(repro(config=replace(CONFIG, **change)))
    assert "expect_error" not in trace.events[-1], why


def no_blocks_for_b(profile: str = "vllm-0.33") -> Workload:
    """3 usable blocks. Step 1: a (8 tokens, alone) takes blocks 1 and 2. Step 2: a's
    9th token takes block 3, the last; b (one token) is padded to 3, cut to 2 and
    finds no block: vLLM's allocate_slots fails before its assertion, the loop
    ends, nothing crashes. b runs once a has finished (alone then: no padding)."""
    config = replace(CONFIG, num_gpu_blocks=4, max_model_len=12)
    return Workload(
        config=config,
        profile=profile,
        oracle=HashOracle(seed=3, eos_per_mille=0),
        origin="hand",
        requests=(RequestSpec("a", tuple(range(1, 9)), 3), RequestSpec("b", (9,), 2, at_step=1)),
    )


def test_no_crash_when_the_cut_admission_gets_no_blocks():
    trace = run_workload(no_blocks_for_b(), check=True)
    assert "expect_error" not in trace.events[-1]
    steps = [e["expect"] for e in trace.events if e["kind"] == "step"]
    assert steps[1]["num_scheduled_tokens"] == {"a": 1}
    assert steps[1]["scheduled_cached_reqs"][0]["new_block_ids"] == [3]
    assert any("b" in s["num_scheduled_tokens"] for s in steps)  # b runs later


def test_crash_and_dead_engine_on_the_model():
    sched = Scheduler(CONFIG)
    for event in run_workload(repro()).events[:-1]:
        if event["kind"] == "add_request":
            sched.add_request(event["request_id"], event["prompt_token_ids"], event["max_tokens"])
        elif event["kind"] == "step":
            out = sched.schedule()
        else:
            from schedconf.spec.output import ModelRunnerOutput

            sched.update_from_output(
                out, ModelRunnerOutput({k: tuple(v) for k, v in event["sampled_token_ids"].items()})
            )
    with pytest.raises(EngineCrash) as crash:
        sched.schedule()
    assert crash.value.code == "engine_assertion_padded_admission" and sched.crashed
    with pytest.raises(EngineCrash) as dead:
        sched.add_request("z", [1], max_tokens=1)
    assert dead.value.code == "engine_dead"


def _suts():
    suts = [ReferenceSut(), make_sut("impl")]
    if shutil.which("node"):
        suts.append(make_sut("stdio:node examples/js-scheduler/scheduler.js"))
    return suts


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.32"])
def test_every_scheduler_crashes_at_the_same_step(profile):
    trace = run_workload(repro(profile))
    for sut in _suts():
        if profile != "vllm-0.33" and getattr(sut, "name", "").startswith("stdio"):
            continue  # the JS example implements vllm-0.33 only
        try:
            result = replay(trace, sut, "strict")
        finally:
            sut.close()
        assert result.verdict == PASS, render_divergence(trace, result)


def test_crashing_where_none_is_expected_and_the_converse_fail():
    # Threshold 2 crashes in step 2, threshold 3 keeps b's padding (3 tokens);
    # step 1 is the same (a alone). Each trace fails on the other config, at step 2.
    for made, replayed in ((2, 3), (3, 2)):
        trace = run_workload(repro(config=replace(CONFIG, long_prefill_token_threshold=made)))
        assert ("expect_error" in trace.events[-1]) == (made == 2)
        config = {**trace.config, "long_prefill_token_threshold": replayed}
        other = Trace(header={**trace.header, "config": config}, events=trace.events)
        result = replay(other, ReferenceSut(), "strict")
        assert result.verdict != PASS and result.divergence.kind == "input_error", (made, result)
        assert result.divergence.step == 2


def test_a_crash_trace_rebuilds_into_the_same_trace():
    trace = run_workload(repro())
    again = run_workload(workload_from_trace(trace))
    assert again.events == trace.events


# ------------------------------------------------------------------ the generator

SEEDS = range(600)


@pytest.fixture(scope="module")
def drawn() -> list[tuple[int, Workload]]:
    return [(seed, random_workload(seed)) for seed in SEEDS]


def test_the_generator_draws_cut_thresholds(drawn):
    cut = [(s, w) for s, w in drawn if 0 < w.config.long_prefill_token_threshold <= w.config.num_spec_tokens]
    spec = [w for _, w in drawn if w.config.num_spec_tokens > 0]
    # SPEC_CUT_THRESHOLD_RATE (0.1) of the spec-decode configs, about 5% of all (measured: 32 of 600).
    assert 0.5 * SPEC_CUT_THRESHOLD_RATE <= len(cut) / len(spec) <= 2 * SPEC_CUT_THRESHOLD_RATE, (len(cut), len(spec))
    assert 0.025 <= len(cut) / len(drawn) <= 0.1
    outcomes = Counter()
    failures = []
    for seed, w in cut:
        trace = run_workload(w)
        outcomes["crash" if "expect_error" in trace.events[-1] else "end"] += 1
        trace.path = f"random_workload({seed})"
        for sut in (ReferenceSut(), make_sut("impl")):
            result = replay(trace, sut, "strict")
            if result.verdict != PASS:
                failures.append(render_divergence(trace, result))
    assert not failures, "\n\n".join(failures[:3])
    # Both: configs checked to the end, and crashes (measured: 4 of 32).
    assert outcomes["crash"] >= 2 and outcomes["end"] >= 10, outcomes


def test_other_workloads_keep_their_bytes():
    """The draw is on a forked stream: a workload that does not get it is unchanged by it."""
    from schedconf.conformance.workloads import generate

    rate = generate.SPEC_CUT_THRESHOLD_RATE
    try:
        generate.SPEC_CUT_THRESHOLD_RATE = 0.0
        before = {s: random_workload(s) for s in range(200)}
    finally:
        generate.SPEC_CUT_THRESHOLD_RATE = rate
    changed = [s for s in range(200) if random_workload(s) != before[s]]
    for s in changed:
        c = random_workload(s).config
        assert 0 < c.long_prefill_token_threshold <= c.num_spec_tokens, s


# ------------------------------------------------------------------ the vLLM driver

VLLM_FILE = "/venv/lib/python3.11/site-packages/vllm/v1/core/sched/scheduler.py"


def _raise_at(source_line: str, function: str = "schedule", filename: str = VLLM_FILE) -> BaseException:
    """The exception raised by ``source_line`` as the innermost frame of ``function`` in ``filename``."""
    import linecache
    from types import SimpleNamespace

    code = f"def {function}(self, num_new_tokens=2, token_budget=-1):\n    {source_line}\n"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(code, filename, "exec"), namespace)  # noqa: S102 - a synthetic traceback
    try:
        namespace[function](SimpleNamespace(num_spec_tokens=2))
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise RuntimeError("did not raise")


def test_driver_identifies_only_this_assertion():
    assert _is_padded_admission_assert(_raise_at(PADDED_ADMISSION_ASSERT))
    # Any other failure of schedule() is internal, not this code.
    assert not _is_padded_admission_assert(_raise_at("assert token_budget >= 0"))
    assert not _is_padded_admission_assert(_raise_at(PADDED_ADMISSION_ASSERT, function="_schedule_other"))
    assert not _is_padded_admission_assert(_raise_at(PADDED_ADMISSION_ASSERT, filename="/x/mine/scheduler.py"))
    assert not _is_padded_admission_assert(_raise_at("raise RuntimeError('x')"))
