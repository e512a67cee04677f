"""nano-vllm's own scheduler behind the protocol (``--sut nano-vllm@20260210``).

Marked ``engines``. A missing environment is built first (``ensure_env``:
~20 s and ~260 MB with a warm pip cache; no torch). The whole module takes
about a minute on two cores, most of it the 300-trace campaign.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.adapters.nanovllm import NanoVllmSut
from schedconf.conformance.engines.engine_env import REPO_ROOT, driver_env, ensure_env, env_python
from schedconf.conformance.protocol import validate_reply
from schedconf.conformance.sut import SutInputError, SutUnsupported

pytestmark = pytest.mark.engines

VERSION = "20260210"
SUT_NAME = f"nano-vllm@{VERSION}"
CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 9,
    "max_num_batched_tokens": 32,
    "max_num_seqs": 4,
    "max_model_len": 32,
    "enable_chunked_prefill": False,
    "long_prefill_token_threshold": 0,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "num_spec_tokens": 0,
    "num_lookahead_tokens": 0,
    "scheduler_reserve_full_isl": None,
}
HARNESS_ERROR_KINDS = ("sut_error", "sut_timeout", "sut_exited", "protocol_error", "harness_error")
ENGINE_FAILURE = "nano-vllm's Scheduler.schedule() "
"""How the driver words a failure of nano-vllm's own schedule() (an engine bug, not the driver's)."""


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
    return {**event, **extra}


@pytest.fixture(scope="module")
def sut() -> Iterator[NanoVllmSut]:
    ensure_env("nano-vllm", VERSION)
    s = make_sut(SUT_NAME)
    assert isinstance(s, NanoVllmSut)
    yield s
    s.close()


def test_session_through_the_harness_adapter(sut: NanoVllmSut) -> None:
    """init, add, schedule, update, abort and the refusals, every reply checked against the protocol schema."""
    sut.start(dict(CONFIG), "vllm-0.33")
    sut.add_request({"kind": "add_request", **request("a", list(range(10, 20)), max_tokens=3)})
    sut.add_request({"kind": "add_request", **request("b", list(range(10, 14)), max_tokens=8)})  # shares a block
    first = sut.schedule()
    assert [r["req_id"] for r in first["scheduled_new_reqs"]] == ["a", "b"]
    assert first["scheduled_new_reqs"][0]["block_ids"] == [1, 2, 3]  # nano-vllm block i is protocol block i + 1
    assert first["scheduled_new_reqs"][1] == {"req_id": "b", "block_ids": [1], "num_computed_tokens": 4}
    assert first["num_scheduled_tokens"] == {"a": 10, "b": 0}  # a full prefix hit schedules 0 tokens in nano-vllm
    with pytest.raises(SutInputError) as err:
        sut.schedule()
    assert err.value.code == "output_not_processed"
    with pytest.raises(SutInputError) as err:
        sut.update_from_output({"zz": [3]}, {})
    assert err.value.code == "unscheduled_model_output"
    outs = sut.update_from_output({"a": [7], "b": [1]}, {})  # b samples its EOS
    assert outs == [
        {"req_id": "a", "new_token_ids": [7], "finish_reason": None, "stop_reason": None},
        {"req_id": "b", "new_token_ids": [1], "finish_reason": "stop", "stop_reason": None},
    ]
    second = sut.schedule()
    assert second["finished_req_ids"] == ["b"]
    assert second["scheduled_cached_reqs"] == [
        {"req_id": "a", "resumed": False, "new_block_ids": [], "num_computed_tokens": 10, "num_output_tokens": 1}
    ]
    observed = sut.call("observe", {}) if _schema_knows_block_tables() else _raw_observe_after(second)
    assert observed["block_tables"] == {"a": [1, 2, 3]}
    assert observed["num_free_blocks"] == 5 and observed["free_block_queue"][0] == 4
    sut.update_from_output({"a": [8]}, {})
    for bad, code in (
        (request("a", [1]), "duplicate_request_id"),
        (request("c", []), "empty_prompt"),
        (request("c", list(range(32))), "prompt_too_long"),
        (request("c", [1], max_tokens=0), "invalid_max_tokens"),
        (request("c", [-1]), "invalid_token_id"),
        (request("", [1]), "invalid_request_id"),
    ):
        with pytest.raises(SutInputError) as err:
            sut.add_request({"kind": "add_request", **bad})
        assert err.value.code == code, bad
    with pytest.raises(SutInputError) as err:
        sut.abort("never")
    assert err.value.code == "unknown_request_id"
    sut.abort("a")
    third = sut.schedule()
    assert third["finished_req_ids"] == ["a"] and third["num_scheduled_tokens"] == {}
    assert sut.update_from_output({}, {}) == []
    with pytest.raises(SutInputError) as err:
        sut.update_from_output({}, {})
    assert err.value.code == "unexpected_model_output"


@pytest.mark.parametrize(
    "field, value",
    [
        ("policy", "priority"),
        ("num_spec_tokens", 2),
        ("num_lookahead_tokens", 1),
        ("long_prefill_token_threshold", 4),
        ("enable_chunked_prefill", True),
        ("enable_prefix_caching", False),
        ("block_size", 1),
    ],
)
def test_unsupported_configs_are_unknown(sut: NanoVllmSut, field: str, value: Any) -> None:
    config = {**CONFIG, field: value}
    if field == "block_size":
        config["num_gpu_blocks"] = 40
    with pytest.raises(SutUnsupported):
        sut.start(config, "vllm-0.33")


def test_config_refusals_use_protocol_codes(sut: NanoVllmSut) -> None:
    for config, code in (
        ({**CONFIG, "num_gpu_blocks": 8}, "pool_below_max_model_len"),
        ({**CONFIG, "max_num_batched_tokens": 16}, "budget_below_max_model_len"),
        ({**CONFIG, "block_size": 0}, "invalid_block_size"),
    ):
        with pytest.raises(SutInputError) as err:
            sut.start(config, "vllm-0.33")
        assert err.value.code == code


def test_preemption_is_reported(sut: NanoVllmSut) -> None:
    """Two sequences, two blocks: the first one's second block preempts the other (nano-vllm's decode loop)."""
    sut.start({**CONFIG, "num_gpu_blocks": 3, "max_model_len": 8, "max_num_batched_tokens": 8}, "vllm-0.33")
    sut.add_request({"kind": "add_request", **request("a", [11, 12, 13, 14], max_tokens=3)})
    sut.add_request({"kind": "add_request", **request("b", [21, 22, 23, 24], max_tokens=3)})
    sut.schedule()
    sut.update_from_output({"a": [5], "b": [6]}, {})
    step = sut.schedule()
    assert step["preempted_req_ids"] == ["b"]
    assert step["scheduled_cached_reqs"][0]["req_id"] == "a" and step["scheduled_cached_reqs"][0]["new_block_ids"] == [
        2
    ]


def _schema_knows_block_tables() -> bool:
    schema = json.loads((REPO_ROOT / "conformance" / "traces" / "trace.schema.json").read_text())
    return "block_tables" in schema["$defs"]["observation"].get("properties", {})


def _raw_observe_after(expected_step: dict[str, Any]) -> dict[str, Any]:
    """The driver's observe reply over a raw pipe (the schema does not list ``block_tables`` yet).

    Replays this test's session up to the same point; every other reply is
    still validated against protocol.schema.json.
    """
    python = env_python("nano-vllm", VERSION)
    lines = [
        {"method": "init", "params": {"protocol_version": 1, "profile": "vllm-0.33", "config": CONFIG}},
        {"method": "add_request", "params": request("a", list(range(10, 20)), max_tokens=3)},
        {"method": "add_request", "params": request("b", list(range(10, 14)), max_tokens=8)},
        {"method": "schedule", "params": {}},
        {"method": "update", "params": {"sampled_token_ids": {"a": [7], "b": [1]}, "draft_token_ids": {}}},
        {"method": "schedule", "params": {}},
        {"method": "observe", "params": {}},
        {"method": "shutdown", "params": {}},
    ]
    text = "".join(json.dumps({"id": i + 1, **m}) + "\n" for i, m in enumerate(lines))
    proc = subprocess.run(
        [str(python), "-m", "schedconf.conformance.engines.nanovllm_driver"],
        input=text,
        capture_output=True,
        text=True,
        env={**os.environ, **driver_env("nano-vllm", VERSION)},
        timeout=120,
        check=True,
    )
    replies = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["id"] for r in replies] == list(range(1, len(lines) + 1))
    for msg, reply in zip(lines, replies):
        checked = reply
        if msg["method"] == "observe":
            checked = {**reply, "result": {k: v for k, v in reply["result"].items() if k != "block_tables"}}
        assert validate_reply(msg["method"], checked) is None, (msg, reply)
    assert replies[5]["result"] == expected_step
    return replies[6]["result"]


def test_campaign_of_300_traces_has_no_harness_error(tmp_path: Path) -> None:
    """Every generated trace runs to a verdict; only nano-vllm's own schedule() failures may be sut_error."""
    ensure_env("nano-vllm", VERSION)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "schedconf.conformance",
            "run",
            "--sut",
            SUT_NAME,
            "--examples",
            "300",
            "--comparison",
            "observable",
            "--shrink-budget",
            "0",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
    )
    summaries = list(tmp_path.glob("run-*/summary.json"))
    assert summaries, proc.stderr[-3000:]
    summary = json.loads(summaries[0].read_text())
    assert summary["examples_run"] == 300
    assert summary["passed"] + summary["failed"] + summary["unknown"] == 300
    harness_level = [f for f in summary["failures"] if f["section"].split(":")[0] in HARNESS_ERROR_KINDS]
    not_engine = [f for f in harness_level if not (f["section"] == "sut_error" and ENGINE_FAILURE in f["message"])]
    assert not not_engine, [f["message"][:300] for f in not_engine]
    assert summary["passed"] > 0


def test_safety_campaign_finds_only_the_two_known_bugs(tmp_path: Path) -> None:
    """Under --comparison safety (nano-vllm's own schedule, conformance/CHECKS.md) the violations
    are the fork's two bugs of reports/findings.md ('Other engines') and nothing else:
    a wholly cached block-aligned prompt scheduled for 0 tokens (progress), and a preempted
    sequence left in Scheduler.running, which later crashes its schedule() (sut_error), gets
    scheduled in the very step that preempts it (progress) or gets a finished request scheduled
    again (known_requests). A driver mistake would show as any other kind, and a fixed fork as no
    progress failure."""
    ensure_env("nano-vllm", VERSION)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "schedconf.conformance",
            "run",
            "--sut",
            SUT_NAME,
            "--examples",
            "200",
            "--comparison",
            "safety",
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
    summary = json.loads(next(tmp_path.glob("run-*/summary.json")).read_text())
    assert summary["examples_run"] == 200 and summary["passed"] > 100
    unexplained = [
        f
        for f in summary["failures"]
        if not (
            (f["signature"] == "sut_error" and ENGINE_FAILURE in f["message"])
            or (f["signature"] == "safety:progress" and "is scheduled for 0 tokens" in f["message"])
            or (f["signature"] == "safety:progress" and "in the step that preempts it" in f["message"])
            or f["signature"] == "safety:known_requests"
        )
    ]
    assert not unexplained, [f["message"][:300] for f in unexplained]
    assert any("is scheduled for 0 tokens" in f["message"] for f in summary["failures"])


# ------------------------------------------------------------ guidance pairs

CFG_ENV = "SCHEDCONF_NANOVLLM_CFG_SCALE"


@pytest.fixture()
def cfg_sut(monkeypatch: pytest.MonkeyPatch) -> Iterator[NanoVllmSut]:
    """A driver whose every request is a classifier-free-guidance pair (the fork's cfg_scale > 1)."""
    ensure_env("nano-vllm", VERSION)
    monkeypatch.setenv(CFG_ENV, "3")
    s = make_sut(SUT_NAME)
    assert isinstance(s, NanoVllmSut)
    yield s
    s.close()


def test_guidance_pair_runs_with_its_twin_and_shares_its_token(cfg_sut: NanoVllmSut) -> None:
    """The twin (same prompt, LLMEngine.add_request's fallback) is internal: the request alone is reported,
    its twin's blocks are counted in the pool (a fully shared prompt block, a block of its own), and the twin
    ends with it."""
    cfg_sut.start({**CONFIG, "num_gpu_blocks": 17}, "vllm-0.33")
    cfg_sut.add_request({"kind": "add_request", **request("a", list(range(10, 16)), max_tokens=2)})
    first = cfg_sut.schedule()
    assert first["num_scheduled_tokens"] == {"a": 6} and first["scheduled_new_reqs"][0]["block_ids"] == [1, 2]
    # a's two blocks, the twin's prefix hit on block 1 and its own partial block: 3 of 16 held
    assert cfg_sut.call("observe", {})["num_free_blocks"] == 13
    assert cfg_sut.update_from_output({"a": [7]}, {}) == [
        {"req_id": "a", "new_token_ids": [7], "finish_reason": None, "stop_reason": None}
    ]
    assert cfg_sut.schedule()["num_scheduled_tokens"] == {"a": 1}
    assert cfg_sut.update_from_output({"a": [8]}, {})[0]["finish_reason"] == "length"
    assert cfg_sut.schedule()["finished_req_ids"] == ["a"]
    assert cfg_sut.call("observe", {})["num_free_blocks"] == 16  # the twin's blocks came back too


def test_guidance_pairs_overflow_max_num_seqs(cfg_sut: NanoVllmSut) -> None:
    """Scheduler.schedule checks num_seqs < max_num_seqs once per pair, then admits two sequences
    (scheduler.py:31 and 54-63): two pairs under max_num_seqs=3 make a batch of four."""
    cfg_sut.start({**CONFIG, "num_gpu_blocks": 17, "max_num_seqs": 3}, "vllm-0.33")
    cfg_sut.add_request({"kind": "add_request", **request("a", [1, 2, 3])})
    cfg_sut.add_request({"kind": "add_request", **request("b", [4, 5, 6])})
    with pytest.raises(Exception, match=r"seats .*4 sequences \['a', 'b', 'a~uncond', 'b~uncond'\].*max_num_seqs=3"):
        cfg_sut.schedule()


def test_guidance_pair_safety_campaign(tmp_path: Path) -> None:
    """Every request a guidance pair: the failures are the fork's known bugs and the pair seat overflow."""
    ensure_env("nano-vllm", VERSION)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "schedconf.conformance",
            "run",
            "--sut",
            SUT_NAME,
            "--examples",
            "300",
            "--comparison",
            "safety",
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
        env={**os.environ, CFG_ENV: "3"},
    )
    summary = json.loads(next(tmp_path.glob("run-*/summary.json")).read_text())
    assert summary["examples_run"] == 300 and summary["passed"] > 10
    unexplained = [
        f
        for f in summary["failures"]
        if not (
            (
                f["signature"] == "sut_error"
                and ("guidance-pair safety property seats" in f["message"] or ENGINE_FAILURE in f["message"])
            )
            or (f["signature"] == "safety:progress" and "is scheduled for 0 tokens" in f["message"])
            or (f["signature"] == "safety:progress" and "in the step that preempts it" in f["message"])
            or f["signature"] == "safety:known_requests"
        )
    ]
    assert not unexplained, [f["message"][:300] for f in unexplained]
    assert any("guidance-pair safety property seats" in f["message"] for f in summary["failures"])
