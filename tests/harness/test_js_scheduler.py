"""The JavaScript example scheduler (examples/js-scheduler/) conforms over the protocol.

It is a third-party scheduler in another language, driven as a subprocess
through ``stdio:``. Without prefix caching it must pass every vllm-0.33 corpus
trace and a campaign of generated traces under the ``observable`` comparison,
refuse bad input with the reference's error codes, and answer ``unsupported``
for what it leaves out (prefix caching, other release profiles).
"""

import dataclasses
import os
import shlex
from pathlib import Path

import pytest

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import PASS, UNKNOWN, render_divergence, replay
from schedconf.conformance.sut import SutInputError, SutUnsupported
from schedconf.conformance.traces.trace import read_trace
from schedconf.conformance.traces.vectors import iter_corpus
from schedconf.conformance.workloads.generate import random_workload
from schedconf.conformance.workloads.workload import WorkloadError, run_workload

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "examples" / "js-scheduler" / "scheduler.js"
# The README's `--sut "stdio:node examples/js-scheduler/scheduler.js"`, made
# independent of the directory pytest runs in.
SUT_NAME = f"stdio:node {shlex.quote(str(SCRIPT))}"
NUM_GENERATED = int(os.environ.get("SCHEDCONF_JS_EXAMPLES", "300"))


@pytest.fixture(scope="module")
def js():
    sut = make_sut(SUT_NAME)
    yield sut
    sut.close()


def _corpus_without_prefix_caching():
    entries = [(path, e) for _, path, e in iter_corpus("vllm-0.33") if e["prefix_caching"] is False]
    assert len(entries) >= 5, "the corpus should hold vllm-0.33 traces without prefix caching"
    return entries


def test_passes_the_corpus_without_prefix_caching(js):
    failures = []
    for path, _ in _corpus_without_prefix_caching():
        trace = read_trace(path)
        result = replay(trace, js, "observable")
        if result.verdict != PASS:
            failures.append(render_divergence(trace, result))
    assert not failures, "\n\n".join(failures)


def test_passes_the_corpus_strictly_too(js):
    # With prefix caching off its free list is vLLM's, so block ids and the
    # observed free queue match exactly, not only up to a renaming.
    for path, _ in _corpus_without_prefix_caching():
        trace = read_trace(path)
        result = replay(trace, js, "strict")
        assert result.verdict == PASS, render_divergence(trace, result)
    assert js.capabilities["observe"] is True


def test_passes_generated_traces_without_prefix_caching(js):
    passed, failures = 0, []
    for seed in range(NUM_GENERATED):
        workload = random_workload(seed, in_flight_batches=False)  # the JS example runs one step at a time
        workload = workload.replace(config=dataclasses.replace(workload.config, enable_prefix_caching=False))
        try:
            trace = run_workload(workload)
        except WorkloadError:
            continue  # the reference itself cannot finish it (a livelock): no verdict
        trace.path = f"random_workload({seed}) without prefix caching"
        result = replay(trace, js, "observable")
        if result.verdict == PASS:
            passed += 1
        else:
            failures.append(render_divergence(trace, result))
    assert not failures, f"{len(failures)} failing trace(s); the first:\n" + failures[0]
    assert passed >= NUM_GENERATED * 0.9


def test_keeps_the_safety_properties(js):
    """Under --comparison safety (its own schedule, checked against conformance/CHECKS.md's
    properties): a failure is allowed only where the reference fails the same way, i.e. where both
    model a vLLM bug on purpose (the 0.32/0.33 padded-admission crash)."""
    reference = ReferenceSut()
    checked, failures = 0, []
    for seed in range(NUM_GENERATED):
        workload = random_workload(seed, in_flight_batches=False)  # the JS example runs one step at a time
        workload = workload.replace(config=dataclasses.replace(workload.config, enable_prefix_caching=False))
        try:
            trace = run_workload(workload)
        except WorkloadError:
            continue
        trace.path = f"random_workload({seed}) without prefix caching"
        result = replay(trace, js, "safety")
        if result.verdict == PASS:
            checked += 1
            continue
        ref = replay(trace, reference, "safety")
        if ref.verdict != result.verdict or (ref.divergence and ref.divergence.signature()) != (
            result.divergence and result.divergence.signature()
        ):
            failures.append(render_divergence(trace, result))
    assert not failures, f"{len(failures)} trace(s) break a safety property; the first:\n" + failures[0]
    assert checked >= NUM_GENERATED * 0.9


def test_answers_unsupported_for_what_it_leaves_out(js):
    prefix_cached = next(path for _, path, e in iter_corpus("vllm-0.33") if e["prefix_caching"])
    assert replay(read_trace(prefix_cached), js, "observable").verdict == UNKNOWN
    other_profile = next(path for _, path, e in iter_corpus("vllm-0.32") if not e["prefix_caching"])
    result = replay(read_trace(other_profile), js, "observable")
    assert result.verdict == UNKNOWN and "vllm-0.33" in result.detail
    # A session goes on after an unsupported init.
    config = dict(BASE_CONFIG, enable_prefix_caching=True)
    with pytest.raises(SutUnsupported):
        js.start(config, "vllm-0.33")
    js.start(BASE_CONFIG, "vllm-0.33")


# ------------------------------------------------ bad input, against the reference

BASE_CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 20,
    "max_num_batched_tokens": 16,
    "max_num_seqs": 4,
    "max_model_len": 16,
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0,
    "enable_prefix_caching": False,
    "policy": "fcfs",
    "num_spec_tokens": 2,
    "num_lookahead_tokens": 0,
    "scheduler_reserve_full_isl": None,
}


def _outcome(call):
    try:
        return ("ok", call())
    except SutInputError as exc:
        return ("error", exc.code)
    except SutUnsupported:
        return ("unsupported", None)


BAD_CONFIGS = [
    {"block_size": 0},
    {"num_gpu_blocks": 1},
    {"max_num_batched_tokens": 0},
    {"max_num_seqs": 0},
    {"max_model_len": 0},
    {"long_prefill_token_threshold": -1},
    {"num_spec_tokens": -1},
    {"num_lookahead_tokens": -1},
    {"policy": "lifo"},
    {"bogus_field": 1},
    {"block_size": "4"},
    {"block_size": True},
    {"block_size": 4.0},
    {"enable_chunked_prefill": 1},
    {"scheduler_reserve_full_isl": 0},
    {"num_gpu_blocks": 4},
    {"enable_chunked_prefill": False, "max_num_batched_tokens": 8},
]


@pytest.mark.parametrize("override", BAD_CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_init_refuses_bad_configs_like_the_reference(js, override):
    config = dict(BASE_CONFIG, **override)
    expected = _outcome(lambda: ReferenceSut().start(config, "vllm-0.33"))
    assert expected[0] == "error"
    assert _outcome(lambda: js.start(config, "vllm-0.33")) == expected


def test_init_refuses_an_unknown_profile(js):
    assert _outcome(lambda: js.start(BASE_CONFIG, "vllm-0.1")) == ("error", "unknown_profile")


def _request(rid="a", **changes):
    event = {
        "kind": "add_request",
        "request_id": rid,
        "prompt_token_ids": [5, 6, 7, 8, 9],
        "max_tokens": 4,
        "priority": 0,
        "arrival_time": 0,
        "eos_token_id": 1,
        "stop_token_ids": [],
        "ignore_eos": False,
        "min_tokens": 0,
    }
    event.update(changes)
    return event


# One session: each call goes to the reference and to the JS scheduler; the
# outcomes (result or error code) must be equal, and since a refused input
# changes nothing, the valid calls after it must still agree.
SESSION = [
    ("update", {"a": [3]}, {}),  # unexpected_model_output: no pending step
    ("abort", "nobody"),  # unknown_request_id
    ("add", _request(prompt_token_ids=[])),  # empty_prompt
    ("add", _request(prompt_token_ids=list(range(16)))),  # prompt_too_long
    ("add", _request(max_tokens=0)),  # invalid_max_tokens
    ("add", _request(min_tokens=5)),  # invalid_min_tokens
    ("add", _request(min_tokens=-1)),  # invalid_min_tokens
    ("add", _request(prompt_token_ids=[5, -1])),  # invalid_token_id
    ("add", _request(stop_token_ids=[-2])),  # invalid_token_id
    ("add", _request(eos_token_id=-1)),  # invalid_token_id
    ("add", _request(rid="")),  # invalid_request_id
    ("add", _request(max_tokens="4")),  # invalid_field_type
    ("add", _request(priority=True)),  # invalid_field_type
    ("add", _request(arrival_time="1.5")),  # invalid_field_type (a float 1.5 is valid)
    ("add", _request(max_tokens=4.0)),  # invalid_field_type: a float, even if integral
    ("add", _request(prompt_token_ids=[5, 6.0])),  # invalid_token_id
    ("add", _request()),
    ("add", _request()),  # duplicate_request_id
    ("add", _request(rid="b", prompt_token_ids=[11, 12])),
    ("schedule",),
    ("schedule",),  # output_not_processed
    ("update", {"nobody": [3]}, {}),  # unscheduled_model_output
    ("update", {"a": [3, 4]}, {}),  # bad_num_sampled_tokens: no drafts were scheduled
    ("update", {"a": [3], "b": [-4]}, {}),  # invalid_token_id
    ("update", {"a": [3], "b": [4]}, {"nobody": [1]}),  # unscheduled_draft_tokens
    ("update", {"a": [3], "b": [4]}, {"a": [1, 2, 3]}),  # too_many_draft_tokens
    ("update", {"a": [3], "b": [4]}, {"a": [7, 8], "b": [9]}),
    ("update", {"a": [3]}, {}),  # unexpected_model_output: already applied
    ("schedule",),  # a gets its 2 drafts scheduled
    ("update", {"a": [7, 8, 6], "b": [1]}, {}),  # a: both drafts accepted, max_tokens; b: EOS
    ("abort", "a"),  # already finished: accepted, no effect
    ("add", _request()),  # a finished id may be used again
    ("add", _request(rid="c", arrival_time=2.5)),  # a float arrival time, as vLLM's time.time()
    ("abort", "c"),  # aborted while waiting
    ("schedule",),
    ("update", {"a": [3]}, {}),
]


def _apply(sut, op):
    kind = op[0]
    if kind == "add":
        return lambda: sut.add_request(op[1])
    if kind == "abort":
        return lambda: sut.abort(op[1])
    if kind == "schedule":
        return sut.schedule
    return lambda: sut.update_from_output(op[1], op[2])


def test_bad_input_is_refused_with_the_reference_codes(js):
    ref = ReferenceSut()
    ref.start(BASE_CONFIG, "vllm-0.33")
    js.start(BASE_CONFIG, "vllm-0.33")
    codes = set()
    for i, op in enumerate(SESSION):
        expected = _outcome(_apply(ref, op))
        assert _outcome(_apply(js, op)) == expected, (i, op)
        if expected[0] == "error":
            codes.add(expected[1])
    assert len(codes) >= 12, sorted(codes)


def test_drafts_without_spec_decode_are_refused(js):
    config = dict(BASE_CONFIG, num_spec_tokens=0)
    ref = ReferenceSut()
    for sut in (ref, js):
        sut.start(config, "vllm-0.33")
        sut.add_request(_request())
        sut.schedule()
    op = ("update", {"a": [3]}, {"a": [4]})
    assert _outcome(_apply(js, op)) == _outcome(_apply(ref, op)) == ("error", "drafts_without_spec_decode")
    op = ("update", {"a": [3]}, {})
    assert _outcome(_apply(js, op)) == _outcome(_apply(ref, op))
    assert _outcome(_apply(js, ("update", {}, {}))) == ("error", "unexpected_model_output")
