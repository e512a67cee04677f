"""Aphrodite Engine's own scheduler behind the protocol (``--sut aphrodite@0.24.1``).

Marked ``engines``. A missing environment is built first (``ensure_env``:
~3 min and ~2.1 GB with a warm pip cache, the 336 MB aphrodite-engine wheel
otherwise downloaded). After that the module takes about a minute on two
cores, most of it the golden corpus and the 60-trace campaign.

Aphrodite 0.24.1 tracks vLLM 0.32 (``conformance/engines/aphrodite_driver.py``)
and differs from it in one rule the protocol's configs reach:
``long_prefill_token_threshold`` also caps a request that is alone (profile
knob ``exempt_lone_request_from_threshold = False``). The tests pin that
difference down and check that it is the only kind of divergence seen.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.adapters.aphrodite import AphroditeSut
from schedconf.conformance.checking.replay import replay
from schedconf.conformance.engines.engine_env import REPO_ROOT, ensure_env
from schedconf.conformance.sut import SutInputError, SutUnsupported
from schedconf.conformance.traces.trace import read_trace

pytestmark = pytest.mark.engines

VERSION = "0.24.1"
SUT_NAME = f"aphrodite@{VERSION}"
PROFILE = "vllm-0.32"
CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 16,
    "max_num_batched_tokens": 32,
    "max_num_seqs": 4,
    "max_model_len": 32,
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "num_spec_tokens": 0,
    "num_lookahead_tokens": 0,
    "scheduler_reserve_full_isl": None,
}
HARNESS_ERROR_KINDS = ("sut_error", "sut_timeout", "sut_exited", "protocol_error", "harness_error")
GOLDEN = REPO_ROOT / "conformance" / "traces" / "vectors" / "v2" / PROFILE


def request(rid: str, prompt: list[int], max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    event = {
        "request_id": rid,
        "prompt_token_ids": prompt,
        "max_tokens": max_tokens,
        "priority": 0,
        "arrival_time": 0,
        "eos_token_id": 1,
        "ignore_eos": False,
        "stop_token_ids": [],
        "min_tokens": 0,
    }
    return {"kind": "add_request", **event, **extra}


@pytest.fixture(scope="module")
def sut() -> Iterator[AphroditeSut]:
    ensure_env("aphrodite", VERSION)
    s = make_sut(SUT_NAME)
    assert isinstance(s, AphroditeSut)
    yield s
    s.close()


def test_session_through_the_harness_adapter(sut: AphroditeSut) -> None:
    """init, add, schedule, update, observe, abort and the refusals, every reply checked against the protocol schema."""
    sut.start(dict(CONFIG), PROFILE)
    sut.add_request(request("a", list(range(10, 20)), max_tokens=3))
    first = sut.schedule()
    assert first["scheduled_new_reqs"] == [{"req_id": "a", "block_ids": [1, 2, 3], "num_computed_tokens": 0}]
    assert first["num_scheduled_tokens"] == {"a": 10} and first["preempted_req_ids"] == []
    with pytest.raises(SutInputError) as err:
        sut.schedule()
    assert err.value.code == "output_not_processed"
    with pytest.raises(SutInputError) as err:
        sut.update_from_output({"zz": [3]}, {})
    assert err.value.code == "unscheduled_model_output"
    assert sut.update_from_output({"a": [7]}, {}) == [
        {"req_id": "a", "new_token_ids": [7], "finish_reason": None, "stop_reason": None}
    ]
    sut.add_request(request("b", list(range(10, 18)) + [99], max_tokens=1))  # two full blocks shared with a
    second = sut.schedule()
    assert second["scheduled_new_reqs"] == [{"req_id": "b", "block_ids": [1, 2, 4], "num_computed_tokens": 8}]
    assert second["num_scheduled_tokens"] == {"a": 1, "b": 1}
    observed = sut.observe()
    assert observed is not None and observed["num_free_blocks"] == 15 - 4 and observed["free_block_queue"][0] == 5
    outs = sut.update_from_output({"a": [1], "b": [5]}, {})  # a samples its EOS, b reaches max_tokens
    assert outs == [
        {"req_id": "a", "new_token_ids": [1], "finish_reason": "stop", "stop_reason": None},
        {"req_id": "b", "new_token_ids": [5], "finish_reason": "length", "stop_reason": None},
    ]
    for bad, code in (
        (request("c", []), "empty_prompt"),
        (request("c", list(range(32))), "prompt_too_long"),
        (request("c", [1], max_tokens=0), "invalid_max_tokens"),
        (request("c", [-1]), "invalid_token_id"),
        (request("", [1]), "invalid_request_id"),
    ):
        with pytest.raises(SutInputError) as err:
            sut.add_request(bad)
        assert err.value.code == code, bad
    with pytest.raises(SutInputError) as err:
        sut.abort("never")
    assert err.value.code == "unknown_request_id"
    sut.add_request(request("c", [3, 4, 5]))
    sut.abort("c")
    third = sut.schedule()
    assert third["finished_req_ids"] == ["a", "b", "c"] and third["num_scheduled_tokens"] == {}
    assert sut.update_from_output({}, {}) == []
    with pytest.raises(SutInputError) as err:
        sut.update_from_output({}, {})
    assert err.value.code == "unexpected_model_output"


@pytest.mark.parametrize(
    "profile, field, value",
    [("vllm-0.33", None, None), ("vllm-0.11", None, None), (PROFILE, "num_lookahead_tokens", 1)],
)
def test_unsupported_is_unknown(sut: AphroditeSut, profile: str, field: str | None, value: Any) -> None:
    config = dict(CONFIG) if field is None else {**CONFIG, field: value}
    with pytest.raises(SutUnsupported):
        sut.start(config, profile)


def test_config_refusals_use_protocol_codes(sut: AphroditeSut) -> None:
    for config, code in (
        ({**CONFIG, "num_gpu_blocks": 8}, "pool_below_max_model_len"),
        ({**CONFIG, "enable_chunked_prefill": False, "max_num_batched_tokens": 16}, "budget_below_max_model_len"),
        ({**CONFIG, "max_num_batched_tokens": 3}, "budget_below_max_num_seqs"),
        ({**CONFIG, "long_prefill_token_threshold": 33}, "threshold_above_max_model_len"),
        ({**CONFIG, "block_size": 0}, "invalid_block_size"),
    ):
        with pytest.raises(SutInputError) as err:
            sut.start(config, PROFILE)
        assert err.value.code == code


def test_threshold_caps_a_lone_request(sut: AphroditeSut) -> None:
    """Aphrodite's intended difference: the long-prefill cap applies to a request that is alone.

    vLLM 0.32 (and the vllm-0.32 profile) schedule all 10 prompt tokens here
    (``num_eligible_reqs > 1`` is false); Aphrodite schedules 4
    (``aphrodite/v1/core/sched/scheduler.py:924-926``).
    """
    sut.start({**CONFIG, "long_prefill_token_threshold": 4}, PROFILE)
    sut.add_request(request("a", list(range(10, 20))))
    assert sut.schedule()["num_scheduled_tokens"] == {"a": 4}


def test_a_lone_padded_admission_kills_the_engine(sut: AphroditeSut) -> None:
    """vLLM 0.32's padded-admission assertion (reports/findings.md 3) is in Aphrodite, and there a lone request hits it.

    ``b`` is alone and has all but one prompt token in the prefix cache: it is
    padded to ``1 + num_spec_tokens`` = 3 tokens, the threshold (applied to a
    lone request in Aphrodite, not in vLLM 0.32) cuts it to 2, and
    ``schedule()`` fails ``assert num_new_tokens == 1 + self.num_spec_tokens``
    (``aphrodite/v1/core/sched/scheduler.py:1102``). vLLM 0.32 schedules 3 tokens.
    """
    sut.start({**CONFIG, "num_spec_tokens": 2, "long_prefill_token_threshold": 2}, PROFILE)
    sut.add_request(request("a", list(range(11, 19)), max_tokens=1))
    for step in range(4):  # 8 prompt tokens, 2 per step (the threshold caps the lone request)
        assert sut.schedule()["num_scheduled_tokens"] == {"a": 2}
        sut.update_from_output({"a": [5]} if step == 3 else {}, {})
    sut.add_request(request("b", list(range(11, 19)) + [99]))
    with pytest.raises(SutInputError) as err:
        sut.schedule()
    assert err.value.code == "engine_assertion_padded_admission"
    with pytest.raises(SutInputError) as err:
        sut.schedule()
    assert err.value.code == "engine_dead"


def test_golden_corpus_diverges_only_where_the_lone_request_rule_can(sut: AphroditeSut) -> None:
    """Every golden vllm-0.32 trace passes strictly, is unknown (lookahead), or fails with a threshold set."""
    verdicts: dict[str, int] = {}
    for path in sorted(GOLDEN.glob("*.jsonl")):
        trace = read_trace(path)
        result = replay(trace, sut, "strict")
        verdicts[result.verdict] = verdicts.get(result.verdict, 0) + 1
        if result.verdict == "fail":
            assert trace.header["config"]["long_prefill_token_threshold"] > 0, (path.name, result.detail)
            assert result.divergence is not None and result.divergence.to_dict()["kind"] == "scheduler_output"
        elif result.verdict == "unknown":
            assert trace.header["config"]["num_lookahead_tokens"] > 0, (path.name, result.detail)
    assert verdicts.get("pass", 0) >= 20, verdicts


def test_campaign_has_no_harness_error(tmp_path: Path) -> None:
    """60 generated traces run to a verdict; every failure has a threshold set (the lone-request rule)."""
    ensure_env("aphrodite", VERSION)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "schedconf.conformance",
            "run",
            "--sut",
            SUT_NAME,
            "--profile",
            PROFILE,
            "--examples",
            "60",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
    )
    summaries = list(tmp_path.glob("*/summary.json"))
    assert summaries, proc.stderr[-3000:]
    summary = json.loads(summaries[0].read_text())
    assert summary["examples_run"] == 60
    assert summary["passed"] + summary["failed"] + summary["unknown"] == 60
    assert not [f for f in summary["failures"] if f["section"].split(":")[0] in HARNESS_ERROR_KINDS]
    for failure in summary["failures"]:  # only where the lone-request rule can differ
        trace = read_trace(summaries[0].parent / failure["trace_file"])
        assert trace.header["config"]["long_prefill_token_threshold"] > 0, failure
    assert summary["passed"] > 30


def test_strict_under_its_own_profile(tmp_path: Path) -> None:
    """Under aphrodite-0.24 (spec/v1/profiles.py: vllm-0.32 with the lone-request threshold rule)
    Aphrodite passes strict: the one rule explains every divergence from vllm-0.32."""
    ensure_env("aphrodite", VERSION)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "schedconf.conformance",
            "run",
            "--sut",
            SUT_NAME,
            "--profile",
            "aphrodite-0.24",
            "--examples",
            "60",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
    )
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert (summary["examples_run"], summary["passed"]) == (60, 60), summary["failures"][:3]


def test_throttled_steps_are_passed_on_and_agree(sut: AphroditeSut) -> None:
    """Aphrodite 0.24.1's ``schedule`` takes vLLM 0.32's ``throttle_prefills``: the driver passes it on (the
    capability is announced), so a throttled trace gets a verdict, not *unknown*. The generator draws no throttle
    for ``aphrodite-0.24``; the throttled workloads of a ``vllm-0.32`` campaign drawn for this SUT (its forced
    config, as ``schedconf run`` draws them), rerun under ``aphrodite-0.24``, all pass strictly."""
    from schedconf.conformance.runs.campaign import CampaignSpec, fit_spec_to_sut, generate_workloads
    from schedconf.conformance.workloads.workload import run_workload
    from schedconf.spec.errors import SpecError

    spec, _ = fit_spec_to_sut(CampaignSpec(sut=SUT_NAME, profile="vllm-0.32", examples=300, seed=11), sut)
    throttled = [w for w in generate_workloads(spec) if getattr(w, "throttle_cadence", 0)]
    verdicts = []
    for workload in throttled:
        try:
            trace = run_workload(workload.replace(profile="aphrodite-0.24"))
        except SpecError:
            continue  # a workload the aphrodite-0.24 profile refuses (a 0.32 knob it lacks)
        verdicts.append(replay(trace, sut, "strict").verdict)
    assert len(verdicts) >= 20 and set(verdicts) == {"pass"}, verdicts
