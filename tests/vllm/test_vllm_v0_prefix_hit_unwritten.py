"""Finding V7 on vLLM 0.10.2's real v0 scheduler: a prefix hit on KV that no step has written.

Marked ``vllm``. A missing environment is built (``ensure_env("vllm", "0.10.2")``),
never skipped, as in ``test_vllm_v0.py``. What is checked:

* the committed trace ``reports/findings/V7-v0-prefix-hit-on-unwritten-kv.jsonl``
  replays on ``--sut vllm-v0@0.10.2`` with the strict comparison (the model is
  faithful to vLLM here);
* vLLM's own outputs for the trace's inputs (recorded from the driver, not
  read from the trace) break ``prefix_hit_unwritten`` at step 2, and only in
  the way profile ``vllm-0.10`` is known to (``conformance/checking/safety/v0.py``);
* the standalone reproduction ``reports/findings/repro_v7_vllm_0_10_2.py``
  (vLLM's API only) fails on 0.10.2 with its plain-words message.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schedconf.conformance.adapters.vllm_v0 import VllmV0Sut, make_vllm_v0_sut
from schedconf.conformance.checking.replay import PASS, render_divergence, replay
from schedconf.conformance.checking.safety.v0 import check_prefix_hit_unwritten, get_unexpected_violations
from schedconf.conformance.engines.engine_env import REPO_ROOT, ensure_env
from schedconf.conformance.runs.repro import run_repro_file
from schedconf.conformance.traces.trace import Trace, read_trace

pytestmark = pytest.mark.vllm

VERSION = "0.10.2"
FINDINGS = REPO_ROOT / "reports" / "findings"
V7 = FINDINGS / "V7-v0-prefix-hit-on-unwritten-kv.jsonl"
REPRO = "repro_v7_vllm_0_10_2.py"


@pytest.fixture(scope="module")
def sut() -> Iterator[VllmV0Sut]:
    """One v0 driver process for this module, building the environment if needed."""
    ensure_env("vllm", VERSION)
    made = make_vllm_v0_sut(f"vllm-v0@{VERSION}")
    assert isinstance(made, VllmV0Sut)
    yield made
    made.close()


def record_outputs(trace: Trace, sut: VllmV0Sut) -> Trace:
    """The trace's inputs fed to ``sut``; every step's expect and observe is what the SUT answered."""
    sut.start(trace.config, trace.profile)
    events: list[dict[str, Any]] = []
    for event in trace.events:
        if event["kind"] == "add_request":
            sut.add_request(event)
            events.append(event)
        elif event["kind"] == "abort":
            sut.abort(event["request_id"])
            events.append(event)
        elif event["kind"] == "step":
            out = sut.schedule()
            events.append({"kind": "step", "step": event["step"], "expect": out, "observe": sut.observe()})
        elif event["kind"] == "model_output":
            outputs = sut.update_from_output(event["sampled_token_ids"], event["draft_token_ids"])
            events.append({**event, "expect": {"outputs": outputs}})
    return Trace(header=trace.header, events=events)


def test_the_v7_trace_replays_strictly_on_vllm_0_10_2(sut: VllmV0Sut) -> None:
    trace = read_trace(V7)
    result = replay(trace, sut)
    assert result.verdict == PASS, render_divergence(trace, result)


def test_vllms_own_outputs_give_a_hit_on_kv_never_written(sut: VllmV0Sut) -> None:
    recorded = record_outputs(read_trace(V7), sut)
    step2 = next(e for e in recorded.events if e["kind"] == "step" and e["step"] == 2)
    assert [
        (g["request_id"], g["token_chunk_size"], g["computed_block_nums"])
        for g in step2["expect"]["scheduled_seq_groups"]
    ] == [("b", 17, [0, 1, 2, 3]), ("a", 4, [])]
    result = check_prefix_hit_unwritten(recorded)
    assert [(v.kind, v.step, v.request_id) for v in result.violations] == [("safety:prefix_hit_unwritten", 2, "b")]
    assert "block 3 (its table index 3, positions 12-15) holds, at position 12, no KV" in result.violations[0].message
    assert get_unexpected_violations(result, "vllm-0.10") == []


def test_the_v7_reproduction_fails_on_0_10_2(tmp_path: Path) -> None:
    """Run from a folder outside the checkout, with the release's interpreter (no schedconf on the path)."""
    ensure_env("vllm", VERSION)
    copy = tmp_path / REPRO
    shutil.copy(FINDINGS / REPRO, copy)
    outcome = run_repro_file(copy, VERSION)
    assert (outcome.status, outcome.rule, outcome.step) == ("broken", "prefix_hit_kv_was_computed", 2), outcome.output
    assert (
        "request 'b' is scheduled with a prefix hit of 16 tokens (computed_block_nums [0, 1, 2, 3]), so the "
        "model runner skips its positions 0-15; but block 3, which holds its tokens 12-15, has no KV computed "
        "for its token 12"
    ) in outcome.message
