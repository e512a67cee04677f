"""The JavaScript example keeps up with every trace the generator can write.

Whatever profile, scheduler kind or config field a fresh trace uses, the
example (examples/js-scheduler/) either runs it and conforms, or answers
``unsupported`` at ``init`` (verdict *unknown*); it never fails a valid
trace. A config one unit past a limit is refused with the rule's code, as
the reference refuses it (or, for the v0 scheduler it does not implement,
answered ``unsupported``).
"""

import dataclasses
import shlex
from pathlib import Path

import pytest

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.checking.replay import PASS, UNKNOWN, render_divergence, replay
from schedconf.conformance.runs.campaign import CampaignSpec, run_campaign
from schedconf.conformance.traces.trace import read_trace
from schedconf.conformance.traces.vectors import iter_corpus
from schedconf.conformance.workloads.config_limits import make_refused_config_traces, make_v0_refused_config_traces
from schedconf.conformance.workloads.workload import WorkloadError, run_workload
from schedconf.conformance.workloads.workload_v0 import make_random_workload
from schedconf.spec.v0.profiles import V0_PROFILES
from schedconf.spec.v1.profiles import PROFILES

SCRIPT = Path(__file__).parents[2] / "examples" / "js-scheduler" / "scheduler.js"
SUT_NAME = f"stdio:node {shlex.quote(str(SCRIPT))}"
EVERY_PROFILE = [*PROFILES, *V0_PROFILES]
KNOBS_0_32 = ("max_num_active_seqs", "long_prefill_token_threshold_adaptive", "use_v2_model_runner")


@pytest.fixture(scope="module")
def js():
    sut = make_sut(SUT_NAME)
    yield sut
    sut.close()


def _verdicts(js, traces, comparison="observable"):
    """{trace path: verdict}, and the divergence reports of the failures."""
    verdicts, failures = {}, []
    for trace in traces:
        result = replay(trace, js, comparison)
        verdicts[trace.path] = result.verdict
        if result.verdict not in (PASS, UNKNOWN):
            failures.append(render_divergence(trace, result))
    return verdicts, failures


def _generated(profile, seeds, **config_changes):
    """Fresh traces of ``profile`` as ``schedconf generate`` draws them (optionally with config changes)."""
    traces = []
    for seed in seeds:
        workload = make_random_workload(seed, profile)
        if config_changes:
            workload = workload.replace(config=dataclasses.replace(workload.config, **config_changes))
        try:
            trace = run_workload(workload)
        except WorkloadError:
            continue  # the reference itself cannot finish it: no verdict
        trace.path = (
            f"make_random_workload({seed}, {profile!r}){' with ' + str(config_changes) if config_changes else ''}"
        )
        traces.append(trace)
    return traces


@pytest.mark.parametrize("profile", EVERY_PROFILE)
def test_fresh_traces_of_every_profile_pass_or_are_unsupported(js, profile):
    traces = _generated(profile, range(8))
    assert len(traces) >= 6
    verdicts, failures = _verdicts(js, traces)
    assert not failures, f"{len(failures)} failing trace(s); the first:\n" + failures[0]
    if profile != "vllm-0.33":  # the one profile it implements
        assert set(verdicts.values()) == {UNKNOWN}


def test_runs_the_0_32_knobs_it_implements(js):
    """Generated vllm-0.33 configs without prefix caching, one step at a time: the knobs vLLM 0.32 added
    (max_num_active_seqs, the adaptive threshold, the V2 runner's layout) pass, strictly."""
    traces = _generated("vllm-0.33", range(150), enable_prefix_caching=False, max_concurrent_batches=1)
    verdicts, failures = _verdicts(js, traces, "strict")
    assert not failures, f"{len(failures)} failing trace(s); the first:\n" + failures[0]
    for knob in KNOBS_0_32:
        passed = [t for t in traces if t.config.get(knob) not in (None, False) and verdicts[t.path] == PASS]
        assert len(passed) >= 3, f"{knob}: {len(passed)} passing trace(s) use it"


@pytest.mark.parametrize("profile", EVERY_PROFILE)
def test_refuses_configs_past_each_limit_with_the_rules_code(js, profile):
    """A config one unit past a start-up limit (conformance/workloads/config_limits.py): refused with the rule's code
    under every v1 profile (each profile's own rules too); the v0 scheduler's answer is unsupported."""
    if profile in V0_PROFILES:
        refused = make_v0_refused_config_traces(profile)
    else:
        refused = make_refused_config_traces(profile)
    assert refused
    traces = []
    for rule, trace in refused:
        trace.path = f"{profile} refused-{rule}"
        traces.append(trace)
    verdicts, failures = _verdicts(js, traces)
    assert not failures, "\n\n".join(failures)
    assert set(verdicts.values()) == ({UNKNOWN} if profile in V0_PROFILES else {PASS}), verdicts


BASE_CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 9,
    "max_num_batched_tokens": 16,
    "max_num_seqs": 4,
    "max_model_len": 32,
    "enable_prefix_caching": False,
}

# (profile, config changes): each start-up rule that differs between profiles, and the 0.32 fields' own checks.
INIT_CASES = [
    ("vllm-0.11", {"long_prefill_token_threshold": 33}),  # 0.11 accepts a threshold above max_model_len
    ("vllm-0.32", {"long_prefill_token_threshold": 33}),  # 0.32 refuses it
    ("vllm-0.11", {"max_num_active_seqs": 2}),  # a 0.32 knob under an older release
    ("aphrodite-0.24", {"use_v2_model_runner": True}),
    ("aphrodite-0.24", {"long_prefill_token_threshold": 4, "long_prefill_token_threshold_adaptive": True}),
    ("vllm-0.11", {"max_concurrent_batches": 2}),  # steps in flight, not modelled for 0.11
    ("vllm-0.33", {"max_concurrent_batches": 2, "num_spec_tokens": 1}),  # nor with spec decode, unless async
    ("vllm-0.33-async", {"max_concurrent_batches": 2, "num_spec_tokens": 1}),
    ("vllm-0.33", {"max_concurrent_batches": 2}),
    ("vllm-0.33", {"max_concurrent_batches": 0}),
    ("vllm-0.33", {"max_num_active_seqs": 5}),  # above max_num_seqs
    ("vllm-0.33", {"max_num_active_seqs": 0}),
    ("vllm-0.33", {"max_num_active_seqs": "2"}),
    ("vllm-0.33", {"use_v2_model_runner": 1}),
    (
        "vllm-0.33",
        {
            "max_num_active_seqs": 2,
            "use_v2_model_runner": True,
            "long_prefill_token_threshold": 4,
            "long_prefill_token_threshold_adaptive": True,
        },
    ),
    ("vllm-0.33", {"max_num_active_seqs": 2, "enable_prefix_caching": True}),
    ("vllm-0.33", {"enable_prefix_caching": True, "max_num_active_seqs": 9}),  # invalid and unsupported: the error
]


def _init_outcome(sut, config, profile):
    from schedconf.conformance.sut import SutInputError, SutUnsupported

    try:
        sut.start(config, profile)
        return ("ok", None)
    except SutInputError as exc:
        return ("error", exc.code)
    except SutUnsupported:
        return ("unsupported", None)


@pytest.mark.parametrize(
    "profile, changes", INIT_CASES, ids=[f"{p}-{','.join(f'{k}={v}' for k, v in c.items())}" for p, c in INIT_CASES]
)
def test_init_answers_like_the_reference_or_unsupported(js, profile, changes):
    """The reference's refusal, with its code; a config the reference accepts runs or is unsupported at init."""
    from schedconf.conformance.adapters.reference import ReferenceSut

    config = dict(BASE_CONFIG, **changes)
    expected = _init_outcome(ReferenceSut(), config, profile)
    actual = _init_outcome(js, config, profile)
    if expected[0] == "error":
        assert actual == expected
    else:
        assert actual[0] in ("ok", "unsupported"), actual
        # It runs exactly the vllm-0.33 configs without prefix caching and without steps in flight.
        runs = (
            profile == "vllm-0.33"
            and not config["enable_prefix_caching"]
            and config.get("max_concurrent_batches", 1) == 1
        )
        assert actual[0] == ("ok" if runs else "unsupported")


def test_init_answers_unsupported_for_the_v0_scheduler(js):
    from schedconf.conformance.workloads.config_limits import V0_BASE_CONFIG

    [profile] = V0_PROFILES
    assert _init_outcome(js, dict(V0_BASE_CONFIG), profile) == ("unsupported", None)


def test_the_corpus_refused_config_traces_pass_or_are_unsupported(js):
    paths = [path for _, path, entry in iter_corpus() if entry["file"].startswith("refused-")]
    assert len(paths) >= 40
    verdicts, failures = _verdicts(js, [read_trace(p) for p in paths])
    assert not failures, "\n\n".join(failures)
    v1 = [v for p, v in verdicts.items() if "/vllm-0.10/" not in str(p)]
    assert v1 and set(v1) == {PASS}


@pytest.mark.parametrize("profile", EVERY_PROFILE)
@pytest.mark.parametrize("overrides", [{"enable_prefix_caching": False}, {}], ids=["set-no-prefix-caching", "no-set"])
def test_a_campaign_of_every_profile_never_fails(tmp_path, profile, overrides):
    """`schedconf run --sut "stdio:node .../scheduler.js" --profile P --comparison observable [--set ...]`."""
    summary = run_campaign(
        CampaignSpec(
            sut=SUT_NAME,
            profile=profile,
            examples=4,
            seed=11,
            comparison="observable",
            config_overrides=dict(overrides),
            out_dir=str(tmp_path),
            run_id="js",
            quiet=True,
            shrink_budget_s=0,
        )
    )
    reports = [(tmp_path / "js" / f["report_file"]).read_text() for f in summary["failures"]]
    assert summary["failed"] == 0 and not summary.get("harness_error"), "\n\n".join(reports)
    assert summary["passed"] + summary["unknown"] + summary["discarded"] == 4
    if profile == "vllm-0.33" and overrides:
        assert summary["passed"] >= 1
    assert summary["status"] in ("pass", "unknown")
