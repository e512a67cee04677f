"""The safety comparison: policy-independent properties over a scheduler's own schedule."""

from __future__ import annotations

import glob
import sys
from pathlib import Path

import pytest

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.checking.replay import FAIL, PASS, replay
from schedconf.conformance.checking.safety.properties import PROPERTIES, compute_liveness_bound
from schedconf.conformance.cli import build_parser
from schedconf.conformance.runs.campaign import CampaignSpec, run_campaign
from schedconf.conformance.traces.trace import read_trace

sys.path.insert(0, str(Path(__file__).parent))

CORPUS = sorted(glob.glob("conformance/traces/vectors/v2/**/*.jsonl", recursive=True))
F7 = "reports/findings/F7-same-step-priority-victim-cache-hit.jsonl"


@pytest.mark.parametrize("sut_name", ["reference", "impl"])
def test_golden_corpus_passes_safety(sut_name: str) -> None:
    sut = make_sut(sut_name)
    verdicts = {path: replay(read_trace(path), sut, "safety") for path in CORPUS}
    assert len(verdicts) > 100
    failed = {p: r.divergence.message for p, r in verdicts.items() if r.verdict == FAIL}
    # The liveness witnesses (spec/symbolic/LIVENESS.md) never finish: they fail `liveness` by design.
    never_finish = {p for p in CORPUS if "witness-liveness_" in p}
    assert {p for p in failed if p not in never_finish} == set(), failed
    assert all(": liveness: " in failed[p] for p in never_finish if p in failed), failed
    assert sut_name != "reference" or set(failed) == never_finish
    assert sum(r.verdict == PASS for r in verdicts.values()) >= (119 if sut_name == "reference" else 90)


def test_reference_safety_run_reproduces_the_trace_schedule() -> None:
    """Driven by its own schedule with the trace's tokens (no drafts), the reference needs no more steps than
    its trace, and most often exactly those (a trace's steps that only report finished or aborted ids are not run)."""
    checked = same = 0
    for path in CORPUS:
        trace = read_trace(path)
        if (
            "expect_error" in trace.header
            or trace.config["num_spec_tokens"]
            or "witness-liveness_" in path
            or any("expect_error" in e for e in trace.events if e["kind"] == "step")
        ):
            continue  # (the liveness witnesses never finish: test_golden_corpus_passes_safety)
        result = replay(trace, make_sut("reference"), "safety")
        assert result.verdict == PASS and 0 < result.steps_run <= trace.num_steps(), path
        checked += 1
        same += trace.num_steps() - result.steps_run <= 1
    assert checked >= 30 and same >= 0.85 * checked


def test_f7_trace_fails_computed_kv_on_the_reference() -> None:
    result = replay(read_trace(F7), make_sut("reference"), "safety")
    assert result.verdict == FAIL and result.divergence is not None
    assert result.divergence.section() == "safety:computed_kv"
    assert result.divergence.step == 6 and "'r0' claims 20 computed tokens" in result.divergence.message
    assert replay(read_trace(F7), make_sut("reference"), "strict").verdict == PASS  # faithful to vLLM 0.33


def test_reference_passes_safety_on_200_generated_traces(tmp_path: Path) -> None:
    summary = run_campaign(
        CampaignSpec(
            sut="reference",
            examples=200,
            seed=0,
            comparison="safety",
            out_dir=str(tmp_path),
            quiet=True,
            shrink_budget_s=0,
        )
    )
    assert (summary["passed"], summary["failed"]) == (200, 0)


BROKEN = [
    ("OverBudgetSut", "token_budget", set()),
    ("ExtraSeatSut", "seats", set()),
    ("ZeroTokensSut", "progress", set()),
    ("IgnoreAbortSut", "known_requests", {"request_lifecycle", "blocks_return"}),  # an abort ignored shows all three
    ("UncomputedHitSut", "computed_kv", set()),
    ("DoubleHandSut", "block_exclusivity", set()),
    ("FreeCountOffSut", "block_conservation", set()),
    ("LeakSut", "blocks_return", {"block_conservation", "block_exclusivity"}),
    ("DropFinishedSut", "request_lifecycle", set()),
    ("FinishedTwiceSut", "request_lifecycle", set()),
    ("IgnoreStopSut", "stop_rules", set()),
    ("StarveSut", "liveness", set()),
    # (module:Class: the block-id schedulers live with their own tests)
    ("test_safety_block_ids:OffsetBlockIdsSut", "block_ids", set()),
    ("test_safety_block_ids:SwappedTablesSut", "block_tables", {"block_exclusivity"}),  # swapped shared prefixes
]


def test_every_property_has_a_broken_scheduler() -> None:
    assert {prop for _, prop, _ in BROKEN} | {"max_model_len"} == set(PROPERTIES)


def _broken_sut_name(name: str) -> str:
    return f"module:{name}" if ":" in name else f"module:broken_safety_sut:{name}"


@pytest.mark.parametrize(("name", "prop", "also"), BROKEN, ids=[b[0].split(":")[-1] for b in BROKEN])
def test_broken_scheduler_is_caught_by_its_property_and_shrinks(
    name: str, prop: str, also: set[str], tmp_path: Path
) -> None:
    summary = run_campaign(
        CampaignSpec(
            sut=_broken_sut_name(name),
            examples=40,
            seed=3,
            comparison="safety",
            out_dir=str(tmp_path),
            quiet=True,
            shrink_budget_s=20,
        )
    )
    sections = [f["section"] for f in summary["failures"]]
    safety = {s.removeprefix("safety:") for s in sections if s.startswith("safety:")}
    assert prop in safety and safety <= {prop} | also
    # the other failures are the engine's own modelled crash (vLLM 0.32/0.33's padded admission), never a safety one
    assert {s for s in sections if not s.startswith("safety:")} <= {"sut_error:error", "input_error:error"}
    shrunk = [f for f in summary["failures"] if f["section"] == f"safety:{prop}" and f.get("shrunk_events")]
    assert shrunk and min(f["shrunk_events"] for f in shrunk) <= 10
    best = min(shrunk, key=lambda f: f["shrunk_events"])
    minimal = read_trace(str(Path(summary["run_dir"]) / best["shrunk_file"]))
    again = replay(minimal, make_sut(_broken_sut_name(name)), "safety")
    assert again.divergence is not None and again.divergence.section() == f"safety:{prop}"


def test_liveness_bound_grows_with_the_work_and_the_requests() -> None:
    from schedconf.conformance.checking.safety.properties import RequestRecord

    def rec(rid: str, prompt: int, max_tokens: int) -> RequestRecord:
        return RequestRecord(rid, [5] * prompt, prompt, max_tokens, 0, None, (), 0)

    # W = min(prompt + max_tokens, max_model_len) - 1; bound = sum_i (W_i + sum_{j>i} (W_j + 1)), W ascending.
    assert compute_liveness_bound([rec("a", 3, 2)], 100) == 4  # W_a = 5 - 1
    # W_a = 4, W_b = min(60, 32) - 1 = 31: (4 + (31 + 1)) + 31
    assert compute_liveness_bound([rec("a", 3, 2), rec("b", 10, 50)], 32) == 67


@pytest.mark.parametrize("command", ["run", "replay", "shrink"])
def test_cli_accepts_the_safety_comparison(command: str) -> None:
    argv = {
        "run": ["run", "--sut", "reference"],
        "replay": ["replay", "x.jsonl", "--sut", "reference"],
        "shrink": ["shrink", "x.jsonl", "--sut", "reference"],
    }[command]
    assert build_parser().parse_args([*argv, "--comparison", "safety"]).comparison == "safety"


def test_max_model_len_catches_a_step_past_the_last_computable_position():
    """max_model_len has no broken scheduler of its own (under the safety driver, progress or
    stop_rules report such a scheduler first: CHECKS.md), so the check itself is held to a step
    that a scheduler with drafts of its own could schedule: 14 computed + 2 new tokens with
    max_model_len 16 puts the next sampled token at position 16, past the last one (15)."""
    from schedconf.conformance.checking.safety.properties import check_max_model_len

    def step(computed: int, n: int) -> dict:
        return {
            "scheduled_new_reqs": [],
            "num_scheduled_tokens": {"r0": n},
            "scheduled_cached_reqs": [
                {
                    "req_id": "r0",
                    "resumed": False,
                    "new_block_ids": [],
                    "num_computed_tokens": computed,
                    "num_output_tokens": 1,
                }
            ],
        }

    assert check_max_model_len(step(14, 1), 16) == []  # positions 14..14, the sampled token at 15
    problems = check_max_model_len(step(14, 2), 16)
    assert len(problems) == 1 and "positions 14..15" in problems[0] and "max_model_len - 2 = 14" in problems[0]
