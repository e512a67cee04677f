"""SGLang's own scheduling classes behind the protocol (``--sut sglang@0.5.23``).

Marked ``engines``. A missing environment is built first (``ensure_env``:
~160 s and 2.5 GB with a warm pip cache: torch 2.13.0 CPU, triton, sglang).
The driver's first ``init`` imports sglang.srt (~12 s); the module then takes
well under a minute, most of it the 150-trace safety campaign.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance.adapters import make_sut
from conformance.adapters.sglang import SglangSut
from conformance.engine_env import REPO_ROOT, ensure_env
from conformance.sut import SutInputError, SutUnsupported

pytestmark = pytest.mark.engines

VERSION = "0.5.23"
SUT_NAME = f"sglang@{VERSION}"
CONFIG = {"block_size": 1, "num_gpu_blocks": 64, "max_num_batched_tokens": 32, "max_num_seqs": 4,
          "max_model_len": 32, "enable_chunked_prefill": False, "long_prefill_token_threshold": 0,
          "enable_prefix_caching": True, "policy": "fcfs", "num_spec_tokens": 0, "num_lookahead_tokens": 0,
          "scheduler_reserve_full_isl": None}
HARNESS_ERROR_KINDS = ("sut_error", "sut_timeout", "sut_exited", "protocol_error", "harness_error")


def request(rid: str, prompt: list[int], max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    event = {"kind": "add_request", "request_id": rid, "prompt_token_ids": prompt, "max_tokens": max_tokens,
             "priority": 0, "arrival_time": 0, "eos_token_id": 1, "ignore_eos": False, "stop_token_ids": [],
             "min_tokens": 0}
    return {**event, **extra}


@pytest.fixture(scope="module")
def sut() -> Iterator[SglangSut]:
    ensure_env("sglang", VERSION)
    s = make_sut(SUT_NAME)
    assert isinstance(s, SglangSut)
    yield s
    s.close()


def test_session_through_the_harness_adapter(sut: SglangSut) -> None:
    """init, add, schedule (a radix prefix hit), update, observe, abort and the refusals."""
    sut.start(dict(CONFIG), "vllm-0.33")
    sut.add_request(request("a", list(range(10, 20)), max_tokens=3))
    first = sut.schedule()
    assert first["scheduled_new_reqs"] == [{"req_id": "a", "block_ids": list(range(1, 11)), "num_computed_tokens": 0}]
    assert first["num_scheduled_tokens"] == {"a": 10}
    with pytest.raises(SutInputError) as err:
        sut.schedule()
    assert err.value.code == "output_not_processed"
    assert sut.update_from_output({"a": [7]}, {}) == [
        {"req_id": "a", "new_token_ids": [7], "finish_reason": None, "stop_reason": None}]
    # b shares a's first 6 tokens: RadixCache hands it a's slots for them
    sut.add_request(request("b", [*range(10, 16), 90, 91], max_tokens=2))
    second = sut.schedule()
    assert [r["req_id"] for r in second["scheduled_new_reqs"]] == ["b"]
    b_new = second["scheduled_new_reqs"][0]
    assert b_new["num_computed_tokens"] == 6 and b_new["block_ids"][:6] == list(range(1, 7))
    assert second["num_scheduled_tokens"] == {"b": 2}  # a prefill step admits b; a waits for the decode step
    sut.update_from_output({"b": [1]}, {})  # b samples its EOS
    third = sut.schedule()
    assert third["finished_req_ids"] == ["b"]
    assert third["num_scheduled_tokens"] == {"a": 1}
    observed = sut.observe()
    assert observed is not None and len(observed["block_tables"]["a"]) == 11  # 10 prompt slots + the decode slot
    # b's own 2 slots went to the radix tree unlocked (evictable): reported free, as vLLM reports cached free blocks
    assert observed["num_free_blocks"] + 11 == CONFIG["num_gpu_blocks"] - 1
    sut.update_from_output({"a": [8]}, {})
    for bad, code in ((request("a", [1]), "duplicate_request_id"), (request("c", []), "empty_prompt"),
                      (request("c", list(range(32))), "prompt_too_long"),
                      (request("c", [1], max_tokens=0), "invalid_max_tokens"),
                      (request("c", [-1]), "invalid_token_id"), (request("", [1]), "invalid_request_id")):
        with pytest.raises(SutInputError) as err:
            sut.add_request(bad)
        assert err.value.code == code, bad
    with pytest.raises(SutInputError) as err:
        sut.abort("never")
    assert err.value.code == "unknown_request_id"
    sut.abort("a")
    fourth = sut.schedule()
    assert fourth["finished_req_ids"] == ["a"] and fourth["num_scheduled_tokens"] == {}
    assert sut.update_from_output({}, {}) == []


@pytest.mark.parametrize("field, value", [("policy", "priority"), ("num_spec_tokens", 2), ("num_lookahead_tokens", 1),
                                          ("long_prefill_token_threshold", 4), ("enable_chunked_prefill", True),
                                          ("block_size", 4)])
def test_unsupported_configs_are_unknown(sut: SglangSut, field: str, value: Any) -> None:
    with pytest.raises(SutUnsupported):
        sut.start({**CONFIG, field: value}, "vllm-0.33")


def test_radix_repointing_is_reported_as_a_replaced_table(sut: SglangSut) -> None:
    """RadixCache.checkpoint repoints a running request's row onto the tree's copy of the same tokens' KV
    (freeing its own duplicate slot): its next step hands the table over whole (``resumed: true``)."""
    sut.start({**CONFIG, "num_gpu_blocks": 8, "max_model_len": 5, "max_num_batched_tokens": 6, "max_num_seqs": 2},
              "vllm-0.33")
    sut.add_request(request("r1", [1000, 1001, 1002], max_tokens=1, eos_token_id=3))
    first = sut.schedule()
    assert first["scheduled_new_reqs"][0]["block_ids"] == [1, 2, 3]
    sut.update_from_output({"r1": [3]}, {})  # r1 ends; its KV stays in the radix tree
    sut.add_request(request("r0", [1000, 1001, 1002], max_tokens=2))
    second = sut.schedule()
    r0 = second["scheduled_new_reqs"][0]
    # SGLang matches at most len - 1 prompt tokens and recomputes the last one into a new slot
    assert r0["num_computed_tokens"] == 2 and r0["block_ids"][:2] == [1, 2] and r0["block_ids"][2] != 3
    sut.update_from_output({"r0": [58]}, {})
    third = sut.schedule()
    entry = third["scheduled_cached_reqs"][0]
    assert entry["resumed"] is True and entry["new_block_ids"][:3] == [1, 2, 3]
    assert entry["num_computed_tokens"] == 3


def test_safety_campaign_has_no_harness_error(tmp_path: Path) -> None:
    """Every generated trace runs to a verdict; no driver crash, timeout or protocol error."""
    ensure_env("sglang", VERSION)
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--sut", SUT_NAME, "--examples", "150",
                           "--comparison", "safety", "--shrink-budget", "0", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    summaries = list(tmp_path.glob("run-*/summary.json"))
    assert summaries, proc.stderr[-3000:]
    summary = json.loads(summaries[0].read_text())
    assert summary["examples_run"] == 150
    harness_level = [f for f in summary["failures"] if f["section"].split(":")[0] in HARNESS_ERROR_KINDS]
    assert not harness_level, [f["message"][:300] for f in harness_level]
    assert summary["passed"] > 0
