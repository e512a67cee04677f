"""LMDeploy's own PyTorch-engine scheduler behind the protocol (``--sut lmdeploy@0.18.0``).

Marked ``engines``. A missing environment is built first (``ensure_env``:
~70 s and ~1.5 GB with a warm pip cache: the lmdeploy wheel, CPU torch 2.13.0
and the import chain, all ``--no-deps``). The module takes about half a minute
on two cores once the environment exists (the 200-trace campaign ~10 s).
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
from schedconf.conformance.adapters.lmdeploy import LmdeploySut
from schedconf.conformance.engines.engine_env import REPO_ROOT, ensure_env
from schedconf.conformance.sut import SutInputError, SutUnsupported

pytestmark = pytest.mark.engines

VERSION = "0.18.0"
SUT_NAME = f"lmdeploy@{VERSION}"
CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 12,
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


def request(rid: str, prompt: list[int], max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    event = {
        "kind": "add_request",
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
def sut() -> Iterator[LmdeploySut]:
    ensure_env("lmdeploy", VERSION)
    s = make_sut(SUT_NAME)
    assert isinstance(s, LmdeploySut)
    yield s
    s.close()


def test_session_through_the_harness_adapter(sut: LmdeploySut) -> None:
    """init, add, schedule, update (stop id, EOS), observe, abort and the refusals, replies schema-checked."""
    sut.start(dict(CONFIG), "vllm-0.33")
    sut.add_request(request("a", list(range(10, 20)), max_tokens=3))
    first = sut.schedule()
    # 10 prompt tokens + prefill_interval = min(16, block_size) = 4 preallocated: 4 blocks (LMDeploy block i is i + 1)
    assert first["scheduled_new_reqs"] == [{"req_id": "a", "block_ids": [1, 2, 3, 4], "num_computed_tokens": 0}]
    assert first["num_scheduled_tokens"] == {"a": 10}
    observed = sut.call("observe", {})
    assert observed["block_tables"] == {"a": [1, 2, 3, 4]} and observed["num_free_blocks"] == 7
    sut.add_request(request("b", list(range(10, 18)), max_tokens=8, stop_token_ids=[9]))
    assert sut.update_from_output({"a": [7]}, {}) == [
        {"req_id": "a", "new_token_ids": [7], "finish_reason": None, "stop_reason": None}
    ]
    second = sut.schedule()  # a prefill turn: b hits a's first block, and its second full block is a's (trie dedup)
    assert second["scheduled_new_reqs"] == [{"req_id": "b", "block_ids": [1, 2, 6], "num_computed_tokens": 4}]
    assert second["num_scheduled_tokens"] == {"b": 4}
    with pytest.raises(SutInputError) as err:
        sut.update_from_output({"a": [3]}, {})
    assert err.value.code == "unscheduled_model_output"
    assert sut.update_from_output({"b": [9]}, {}) == [
        {"req_id": "b", "new_token_ids": [9], "finish_reason": "stop", "stop_reason": 9}
    ]
    third = sut.schedule()
    assert third["finished_req_ids"] == ["b"]
    assert third["scheduled_cached_reqs"] == [
        {"req_id": "a", "resumed": False, "new_block_ids": [], "num_computed_tokens": 10, "num_output_tokens": 1}
    ]
    assert sut.update_from_output({"a": [1]}, {}) == [  # EOS
        {"req_id": "a", "new_token_ids": [1], "finish_reason": "stop", "stop_reason": None}
    ]
    assert sut.schedule()["finished_req_ids"] == ["a"]
    sut.update_from_output({}, {})
    idle = sut.call("observe", {})
    assert idle["block_tables"] == {} and idle["num_free_blocks"] == 11  # trie-held blocks count as free
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
    sut.add_request(request("d", [5, 6, 7]))
    with pytest.raises(SutInputError) as err:
        sut.add_request(request("d", [5]))
    assert err.value.code == "duplicate_request_id"
    sut.abort("d")
    step = sut.schedule()
    assert step["finished_req_ids"] == ["d"] and step["num_scheduled_tokens"] == {}
    assert sut.call("observe", {})["num_free_blocks"] == 11


@pytest.mark.parametrize(
    "field, value",
    [("policy", "priority"), ("num_spec_tokens", 2), ("num_lookahead_tokens", 1), ("long_prefill_token_threshold", 4)],
)
def test_unsupported_configs_are_unknown(sut: LmdeploySut, field: str, value: Any) -> None:
    with pytest.raises(SutUnsupported):
        sut.start({**CONFIG, field: value}, "vllm-0.33")


def test_config_refusals_use_protocol_codes(sut: LmdeploySut) -> None:
    for config, code in (
        ({**CONFIG, "num_gpu_blocks": 8}, "pool_below_max_model_len"),
        ({**CONFIG, "max_num_batched_tokens": 16}, "budget_below_max_model_len"),
        ({**CONFIG, "block_size": 0}, "invalid_block_size"),
        # the protocol's codes, not LMDeploy-flavoured ones (an earlier copy of these checks
        # answered invalid_max_num_batched_tokens and invalid_long_prefill_token_threshold)
        ({**CONFIG, "max_num_batched_tokens": 0, "max_num_seqs": 1}, "invalid_token_budget"),
        ({**CONFIG, "long_prefill_token_threshold": -1}, "invalid_threshold"),
        ({**CONFIG, "max_num_seqs": 40}, "budget_below_max_num_seqs"),
    ):
        with pytest.raises(SutInputError) as err:
            sut.start(config, "vllm-0.33")
        assert err.value.code == code


def test_decode_preemption_is_reported_and_resumed(sut: LmdeploySut) -> None:
    """Six usable blocks of 2, two sequences: the last running one preempts itself in schedule_running
    (LMDeploy's decode admission never evicts another running sequence) and is recomputed later."""
    sut.start(
        {
            **CONFIG,
            "block_size": 2,
            "num_gpu_blocks": 7,
            "max_model_len": 8,
            "max_num_batched_tokens": 8,
            "enable_prefix_caching": False,
        },
        "vllm-0.33",
    )
    sut.add_request(request("a", [11, 12, 13], max_tokens=5))
    sut.add_request(request("b", [21, 22, 23], max_tokens=5))
    steps = []
    for _ in range(6):
        out = sut.schedule()
        steps.append(out)
        sut.update_from_output({r: [5] for r in out["num_scheduled_tokens"]}, {})
    assert steps[3]["preempted_req_ids"] == ["b"] and steps[3]["num_scheduled_tokens"] == {"a": 1}
    assert steps[5]["scheduled_cached_reqs"] == [
        {
            "req_id": "b",
            "resumed": True,
            "new_block_ids": [1, 2, 3, 4],
            "num_computed_tokens": 0,
            "num_output_tokens": 3,
        }
    ]


def test_safety_campaign_of_200_traces_passes(tmp_path: Path) -> None:
    """LMDeploy's own schedule keeps every safety property (conformance/CHECKS.md); unknown verdicts are only
    the two documented ones (session length, a stop id under ignore_eos)."""
    ensure_env("lmdeploy", VERSION)
    proc = subprocess.run(
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
    summaries = list(tmp_path.glob("run-*/summary.json"))
    assert summaries, proc.stderr[-3000:]
    summary = json.loads(summaries[0].read_text())
    assert summary["examples_run"] == 200 and summary["passed"] > 100
    assert not summary["failures"], [f["message"][:300] for f in summary["failures"]]
    assert all(
        "caps a session at" in u["reason"]
        or "at its session length" in u["reason"]
        or "under ignore_eos" in u["reason"]
        for u in summary["unknowns"]
    )
    assert summary["features"]["preemption"] > 0 and summary["features"]["prefix_hit"] > 0


def test_prefetched_step_is_scheduled_before_the_previous_output(sut: LmdeploySut) -> None:
    """Two steps in flight, in the engine loop's order (engine_loop.py:484-557): step 2 is prefetched while
    step 1 awaits its output, step 3 while step 2 does; a prefetched decode starts from num_all_ids (the token
    of the step in flight is not applied yet, inputs_maker.py:1188-1193), and a request stopped by step 3's
    output while step 4 (with it) is in flight ends there."""
    sut.start(dict(CONFIG), "vllm-0.33")
    assert sut.in_flight
    sut.add_request(request("a", list(range(10, 20)), max_tokens=3))
    assert sut.schedule()["num_scheduled_tokens"] == {"a": 10}
    sut.add_request(request("b", list(range(30, 36)), max_tokens=2))
    second = sut.schedule()  # prefetched: LMDeploy prefers prefill while a request waits
    assert second["scheduled_new_reqs"] == [{"req_id": "b", "block_ids": [5, 6, 7], "num_computed_tokens": 0}]
    for call, code in (
        (sut.schedule, "output_not_processed"),
        (lambda: sut.update_from_output({"b": [8]}, {}, step=2), "model_output_out_of_order"),
        (lambda: sut.update_from_output({"a": [7]}, {}, step=9), "unscheduled_step"),
    ):
        with pytest.raises(SutInputError) as err:
            call()
        assert err.value.code == code
    assert sut.update_from_output({"a": [7]}, {}, step=1)[0]["new_token_ids"] == [7]
    with pytest.raises(SutInputError) as err:
        sut.update_from_output({"a": [7]}, {}, step=1)
    assert err.value.code == "duplicate_model_output"
    third = sut.schedule()  # prefetched while step 2 (b's prefill) runs
    assert {r["req_id"]: r["num_computed_tokens"] for r in third["scheduled_cached_reqs"]} == {"a": 10, "b": 6}
    sut.update_from_output({"b": [8]}, {}, step=2)
    fourth = sut.schedule()
    assert {r["req_id"]: r["num_computed_tokens"] for r in fourth["scheduled_cached_reqs"]} == {"a": 11, "b": 7}
    assert sut.update_from_output({"a": [9], "b": [9]}, {}, step=3)[1] == {
        "req_id": "b",
        "new_token_ids": [9],
        "finish_reason": "length",
        "stop_reason": None,
    }
    # b is in the step still in flight: its output there is dropped (update_running skips a stopped sequence)
    assert [o["req_id"] for o in sut.update_from_output({"a": [1], "b": [5]}, {}, step=4)] == ["a"]
    assert sut.schedule()["finished_req_ids"] == ["a", "b"]
    sut.update_from_output({}, {}, step=5)
    assert sut.call("observe", {})["num_free_blocks"] == 11


def test_session_cap_is_unknown_only_when_it_ends_a_request(sut: LmdeploySut) -> None:
    """A request that could outgrow LMDeploy's session length runs until the engine actually ends it there."""
    sut.start({**CONFIG, "num_gpu_blocks": 9}, "vllm-0.33")  # session length 32 - 4 = 28
    with pytest.raises(SutUnsupported):
        sut.add_request(request("whole", list(range(28))))  # the cap leaves no token to generate
    sut.add_request(request("long", list(range(2, 26)), max_tokens=6))  # may reach 30 > 28
    out = sut.schedule()
    assert out["num_scheduled_tokens"] == {"long": 24}
    sut.update_from_output({"long": [40]}, {})
    sut.schedule()
    sut.update_from_output({"long": [41]}, {})
    sut.schedule()
    sut.update_from_output({"long": [42]}, {})
    sut.schedule()
    with pytest.raises(SutUnsupported, match="at its session length 28"):
        sut.update_from_output({"long": [43]}, {})
