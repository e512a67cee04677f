"""``schedconf repro`` against real vLLM: the committed reproductions fail where the bug is.

Marked ``vllm``; a missing environment is built (``ensure_vllm_env``), never
skipped, as in ``test_vllm_differential.py``. CI runs them all: the
committed F7 file fails with its plain-words message at step 6, ``schedconf
repro`` regenerates it byte for byte, the F9 file fails on the output rule, a
trace whose divergence is only the intended 0.32/0.33 difference gets no
reproduction, and the 0.11.0 findings (F4, F5) fail on 0.11.0.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from schedconf.conformance.cli import main
from schedconf.conformance.engines.vllm_env import REPO_ROOT, ensure_vllm_env
from schedconf.conformance.runs.repro import add_next_step, render_repro, run_repro_file
from schedconf.conformance.traces.trace import Trace, read_trace, write_trace

pytestmark = pytest.mark.vllm

FINDINGS = REPO_ROOT / "reports" / "findings"
F7 = FINDINGS / "F7-same-step-priority-victim-cache-hit.jsonl"


def run_committed(name: str, version: str, tmp_path: Path):  # noqa: ANN201
    """Run a committed reproduction from a folder outside the checkout, with the release's interpreter."""
    ensure_vllm_env(version)
    copy = tmp_path / name
    shutil.copy(FINDINGS / name, copy)
    return run_repro_file(copy, version)


def test_the_f7_reproduction_fails_on_033_with_the_plain_words_message(tmp_path):
    outcome = run_committed("repro_f7_vllm_0_33_0.py", "0.33.0", tmp_path)
    assert (outcome.status, outcome.rule, outcome.step) == ("broken", "prefix_hit_kv_was_computed", 6), outcome.output
    assert (
        "request 'r0' is scheduled with 20 computed tokens (a prefix-cache hit or tokens kept from earlier "
        "steps), but block 3, which holds its tokens 16-19, has no KV computed for its token 16"
    ) in outcome.message
    assert "Rule: a request may start or resume with computed tokens only if its blocks hold KV" in outcome.output


def test_repro_regenerates_the_committed_f7_file(tmp_path, capsys):
    ensure_vllm_env("0.33.0")
    out = tmp_path / "f7.py"
    code = main(
        [
            "repro",
            str(F7.relative_to(REPO_ROOT)) if Path.cwd() == REPO_ROOT else str(F7),
            "--sut",
            "vllm-v1@0.33.0",
            "--out",
            str(out),
            "--no-other-releases",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "vLLM 0.33.0: fails: rule prefix_hit_kv_was_computed broken at step 6" in printed
    assert out.read_text() == (FINDINGS / "repro_f7_vllm_0_33_0.py").read_text()


def test_the_f8_reproduction_fails_on_011_and_passes_on_033(tmp_path):
    """Finding 8's priority victim: 0.11.0 leaves its token scheduled in the step that preempts it; 0.33.0 gives it
    back (the victim repair of 0.29+)."""
    outcome = run_committed("repro_f8_vllm_0_11_0.py", "0.11.0", tmp_path)
    assert (outcome.status, outcome.rule, outcome.step) == ("broken", "scheduled_requests_are_running", 3), (
        outcome.output
    )
    assert (
        "schedule() gave request 'r1' 1 token(s), but it is PREEMPTED and not in Scheduler.running" in outcome.message
    )
    ensure_vllm_env("0.33.0")
    on_033 = tmp_path / "on_033.py"
    trace = add_next_step(read_trace(FINDINGS / "F8-priority-victim-keeps-its-tokens.jsonl"))
    on_033.write_text(render_repro(trace, "0.33.0", ("scheduled_requests_are_running",)))
    assert run_repro_file(on_033, "0.33.0").status == "passed"


def test_repro_next_step_regenerates_the_committed_f8_file(tmp_path, capsys):
    """The F8 trace, saved by a safety campaign, ends before the step that broke the property: --next-step."""
    ensure_vllm_env("0.11.0")
    out = tmp_path / "f8.py"
    trace = FINDINGS / "F8-priority-victim-keeps-its-tokens.jsonl"
    code = main(
        ["repro", str(trace), "--sut", "vllm-v1@0.11.0", "--next-step", "--out", str(out), "--no-other-releases"]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    text = out.read_text().replace(str(trace), "reports/findings/F8-priority-victim-keeps-its-tokens.jsonl")
    committed = (FINDINGS / "repro_f8_vllm_0_11_0.py").read_text()
    assert text == committed


def test_the_a1_reproduction_fails_on_033(tmp_path):
    """Finding A1, written by hand (``schedconf repro`` writes synchronous files): vLLM 0.33.0's AsyncScheduler with
    three steps in flight schedules a request a token past its max_tokens. It imports only vLLM and the standard
    library and, run outside the checkout, exits 1 with its one test failing."""
    from standalone_files import get_imported_top_names, run_standalone

    source = FINDINGS / "repro_a1_vllm_0_33_0.py"
    text = source.read_text()
    assert set(get_imported_top_names(text)) - set(sys.stdlib_module_names) == {"vllm"}
    python = ensure_vllm_env("0.33.0")
    proc = run_standalone(python, source, tmp_path, 300)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert (
        "FAIL test_no_step_is_scheduled_past_max_tokens: with 3 steps in flight the scheduler gave request 'a' "
        "(6 prompt tokens, max_tokens 2) 6, 1 and 1 tokens"
    ) in proc.stdout
    assert "[[None], ['LENGTH'], []]" in proc.stdout


def test_the_f3_reproduction_fails_on_033_with_the_padded_admission_assert(tmp_path):
    """Finding 3: a padded admission cut by the long-prefill threshold fails vLLM 0.33's own assertion at step 2."""
    outcome = run_committed("repro_f3_vllm_0_33_0.py", "0.33.0", tmp_path)
    assert (outcome.status, outcome.rule, outcome.step) == ("broken", "engine_does_not_crash", 2), outcome.output
    assert "schedule() raised AssertionError() at vllm/v1/core/sched/scheduler.py:1579" in outcome.message


def test_the_f9_reproduction_fails_on_the_output_rule(tmp_path):
    outcome = run_committed("repro_f9_vllm_0_33_0.py", "0.33.0", tmp_path)
    assert (outcome.status, outcome.rule, outcome.step) == ("broken", "output_goes_to_its_request", 1), outcome.output
    assert "yet update_from_output() gave it that step's tokens [5]" in outcome.message


def test_a_model_difference_gets_no_reproduction(tmp_path, capsys):
    """The vllm-0.32 trace of the self-preemption scenario, announced as 0.33, diverges on 0.33.0 at step 3
    by the intended release difference (break vs continue): no rule breaks, nothing is written, exit 1."""
    from test_vllm_differential import scenario_traces

    ensure_vllm_env("0.33.0")
    path = REPO_ROOT / "conformance" / "testdata" / "scenarios" / "profile_priority_self_preemption.txt"
    (t32,) = [t for t in scenario_traces(path) if t.profile == "vllm-0.32"]
    trace_path = tmp_path / "self_preemption_032.jsonl"
    write_trace(trace_path, Trace(header={**t32.header, "profile": "vllm-0.33"}, events=t32.events))
    out = tmp_path / "none.py"
    code = main(["repro", str(trace_path), "--sut", "vllm-v1@0.33.0", "--out", str(out), "--no-other-releases"])
    printed = capsys.readouterr().out
    assert code == 1, printed
    assert (
        "the engine keeps every rule a reproduction can assert on this trace; the divergence at step 3 is a "
        "difference from the reference model (a model error or an intended difference), not an engine bug: "
        "no reproduction written"
    ) in printed
    assert not out.exists()


@pytest.mark.parametrize(
    "name,rule,step",
    [
        ("repro_f4_vllm_0_11_0.py", "engine_does_not_crash", 1),
        ("repro_f5_vllm_0_11_0.py", "lone_request_is_served", 2),
    ],
)
def test_the_011_reproductions_fail_on_011(name, rule, step, tmp_path):
    outcome = run_committed(name, "0.11.0", tmp_path)
    assert (outcome.status, outcome.rule, outcome.step) == ("broken", rule, step), outcome.output


@pytest.mark.parametrize("name,version", [("repro_f4_vllm_0_11_0.py", "0.33.0")])
def test_a_fixed_release_passes(name, version, tmp_path):
    """F4 is fixed in 0.33 (Request.__lt__); the 0.11 file uses 0.11's API, so the check is the
    0.33-rendered file: ``schedconf repro`` runs it on every other built release."""
    ensure_vllm_env(version)
    out = tmp_path / "f4_033.py"
    code = main(
        [
            "repro",
            str(FINDINGS / "F4-priority-tie-crash.jsonl"),
            "--sut",
            f"vllm-v1@{version}",
            "--out",
            str(out),
            "--no-other-releases",
        ]
    )
    assert code == 1 and not out.exists()
    assert name.startswith("repro_f4")
