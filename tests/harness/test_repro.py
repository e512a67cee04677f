"""``schedconf repro``: the parts that need no vLLM (``tests/vllm/test_vllm_repro.py`` runs the files).

What is checked: a written file imports nothing of schedconf (only vLLM, pytest
and the standard library), holds the events as a literal list and tells the
story in comments; input events the model refuses are dropped unless the rule
needs them; the committed F7 reproduction is what the template renders; SUTs
without an engine API and missing environments are refused with one clear line
(exit 2); pytest outputs are classified by the rule assertion they carry.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from standalone_files import get_imported_top_names

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.cli import main
from schedconf.conformance.engines.vllm_env import REPO_ROOT
from schedconf.conformance.runs import repro
from schedconf.conformance.runs.repro import (
    CHECKED_RULES,
    RULES,
    get_divergence_where,
    get_outcome,
    make_event_lines,
    render_no_repro_message,
    render_repro,
)
from schedconf.conformance.traces.examples import EXAMPLES
from schedconf.conformance.traces.trace import Trace, read_trace
from schedconf.conformance.workloads.workload import run_workload
from schedconf.spec.errors import InvalidConfig

FINDINGS = REPO_ROOT / "reports" / "findings"
F7 = FINDINGS / "F7-same-step-priority-victim-cache-hit.jsonl"
F7_REPRO = FINDINGS / "repro_f7_vllm_0_33_0.py"
F9 = FINDINGS / "F9-output-to-readded-request.jsonl"
F5 = FINDINGS / "F5-pool-without-null-block.jsonl"
ALLOWED_TOP_LEVEL = {"vllm", "pytest"}


def get_events(text: str) -> list:
    (events,) = [
        n.value
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "EVENTS" for t in n.targets)
    ]
    assert isinstance(events, ast.List)
    return ast.literal_eval(events)


@pytest.mark.parametrize("version", sorted(repro.RELEASE_API))
@pytest.mark.parametrize("checks", [CHECKED_RULES, (), ("prefix_hit_kv_was_computed",)])
def test_a_written_file_imports_only_vllm_pytest_and_the_standard_library(version, checks):
    text = render_repro(read_trace(F7), version, checks)
    modules = get_imported_top_names(text)
    foreign = {m for m in modules if m not in ALLOWED_TOP_LEVEL and m not in sys.stdlib_module_names}
    assert not foreign, foreign
    assert "vllm" in modules and not modules & {"conformance", "spec", "impl", "schedconf", "torch"}
    compile(text, "repro.py", "exec")


def test_the_events_are_a_literal_list_with_the_story_in_comments():
    trace = read_trace(F7)
    text = render_repro(trace, "0.33.0", ("prefix_hit_kv_was_computed",))
    events = get_events(text)
    assert [e[0] for e in events].count("schedule") == trace.num_steps() == 6
    assert events[0] == ("add", "r2", [199, 194, 131], {"max_tokens": 8, "priority": 1, "arrival_time": 1})
    assert ("output", 6, {"r0": [26], "r1": [20], "r2": [12]}, {}) in events
    assert "# Step 5: r1 +1, r2 +1; preempted: r0." in text
    assert "# Step 6: r0 +3 (resumes with 20 computed), r1 +1, r2 +1." in text
    assert trace.header["description"][:40] in " ".join(text.split())
    # One rule, its check, and nothing of the other rules.
    assert "class WrittenKv" in text and "check_lone_request_is_served" not in text
    assert "check_outputs_went_to_their_requests" not in text


def test_the_committed_f7_reproduction_is_what_the_template_renders():
    """The file cannot drift from the template and the trace (the message comes from the run:
    tests/vllm/test_vllm_repro.py regenerates the whole file against vLLM)."""
    committed = F7_REPRO.read_text()
    message = re.search(r"this file fails with\):\n(.*?)\n\n", committed, re.S)
    assert message is not None
    text = " ".join(message.group(1).split())
    assert text.startswith("at step 6: request 'r0' is scheduled with 20 computed tokens")
    assert render_repro(read_trace(F7), "0.33.0", ("prefix_hit_kv_was_computed",), message=text) == committed


def test_refused_inputs_are_dropped_unless_the_rule_needs_them():
    trace = read_trace(F9)
    dropped, kept_any = make_event_lines(trace, keep_refused=False)
    kept, kept_flag = make_event_lines(trace, keep_refused=True)
    adds = lambda lines: [ln for ln in lines if ln.startswith('("add"')]  # noqa: E731
    assert len(adds(dropped)) == 1 and not kept_any
    assert len(adds(kept)) == 2 and kept_flag
    assert any("request_id_in_flight" in ln for ln in kept)
    # Other refusals (invalid inputs the engine's front end checks) never travel.
    other = Trace(
        header=trace.header,
        events=[
            {**trace.events[0], "request_id": "x", "prompt_token_ids": [], "expect_error": "empty_prompt"},
            {"kind": "abort", "request_id": "nope", "expect_error": "unknown_request_id"},
            {"kind": "step", "step": 1, "expect_error": "output_not_processed"},
            {"kind": "step", "step": 1, "expect_error": "some_new_engine_failure"},
        ],
    )
    lines, _ = make_event_lines(other, keep_refused=True)
    assert [ln for ln in lines if not ln.startswith("#")] == ['("schedule", 1),']
    assert "# Step 1: the reference expects this step to fail (some_new_engine_failure)." in lines


def test_a_config_the_model_refuses_gets_one_lone_request_of_max_model_len_minus_one_tokens():
    trace = read_trace(F5)
    text = render_repro(trace, "0.11.0", ("lone_request_is_served",))
    events = get_events(text)
    assert events[0] == ("add", "a", list(range(15)), {"max_tokens": 1})
    assert [e[0] for e in events[1:]] == ["schedule", "output"] * (repro.LIVENESS_STEPS + 1)
    assert "check_enough_kv_cache_memory" in text and "use_cpu_platform" in text


def test_outcomes_are_classified_by_the_rule_assertion():
    line = (
        "E   AssertionError: Rule broken at step 6 [prefix_hit_kv_was_computed]: request 'r0' is "
        "scheduled with 20 computed tokens. Rule: " + RULES["prefix_hit_kv_was_computed"]
    )
    broken = get_outcome(1, "F\n" + line + "\n1 failed in 3.0s")
    assert (broken.status, broken.rule, broken.step) == ("broken", "prefix_hit_kv_was_computed", 6)
    assert broken.message == "request 'r0' is scheduled with 20 computed tokens"
    assert get_outcome(1, "E   TypeError: unexpected keyword\n1 failed").status == "error"
    assert get_outcome(0, "1 passed in 2s").status == "passed"
    assert get_outcome(0, "1 skipped in 2s").status == "skipped"
    assert get_outcome(2, "ImportError while importing test module").status == "error"


def test_the_no_reproduction_message_is_one_clear_line():
    text = render_no_repro_message("at step 3")
    assert "\n" not in text and "divergence at step 3 is a difference from the reference model" in text
    assert text.endswith("no reproduction written")
    assert render_no_repro_message(None).endswith("the trace replays without divergence: no reproduction written")


class RefusesEveryConfig(ReferenceSut):
    """The reference, except that it refuses every config: it diverges at init, before any step."""

    def start(self, config, profile):  # noqa: ANN001, ANN201
        raise InvalidConfig("invalid_block_size", "refused on purpose")


def test_a_divergence_before_the_first_step_is_named_not_a_crash():
    """No step number to print: the words say where instead (once ``int(None)`` raised TypeError here)."""
    trace = run_workload(EXAMPLES["mixed"]())
    where = get_divergence_where(trace, "module:tests.harness.test_repro:RefusesEveryConfig")
    assert where == "before the first step (at init or an input event)"
    assert get_divergence_where(trace, "reference") is None
    assert "divergence before the first step" in render_no_repro_message(where)


@pytest.mark.parametrize(
    "sut",
    [
        "stdio:node examples/js-scheduler/scheduler.js",
        "module:my_adapter:MySut",
        "reference",
        "impl",
        "mutant:fcfs_victim_head",
    ],
)
def test_a_sut_without_an_engine_api_is_refused(sut, capsys, tmp_path):
    out = tmp_path / "x.py"
    code = main(["repro", str(F7), "--sut", sut, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "has none; supported: vllm-v1@0.11.0, vllm-v1@0.32.0, vllm-v1@0.33.0" in err
    assert not out.exists()


def test_an_unknown_release_and_a_missing_environment_are_refused(capsys, monkeypatch):
    assert main(["repro", str(F7), "--sut", "vllm-v1@9.9.9"]) == 2
    assert "no reproduction template for vLLM 9.9.9; supported: vllm-v1@0.11.0" in capsys.readouterr().err
    monkeypatch.setattr("schedconf.conformance.engines.vllm_env.is_vllm_env_ready", lambda version, root=None: False)
    assert main(["repro", str(F7), "--sut", "vllm-v1@0.33.0"]) == 2
    err = capsys.readouterr().err
    assert "the vLLM 0.33.0 environment is not built" in err and "schedconf env vllm 0.33.0" in err


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--timeout", "0"], "expected a finite number of seconds > 0"),
        (["--timeout", "x"], "expected a number of seconds"),
    ],
)
def test_bad_numbers_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["repro", str(F7), "--sut", "vllm-v1@0.33.0", *argv])
    assert exc.value.code == 2 and words in capsys.readouterr().err


def test_a_malformed_trace_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "header",\n')
    assert main(["repro", str(bad), "--sut", "vllm-v1@0.33.0"]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err


def test_the_repo_test_run_never_collects_a_reproduction():
    text = (REPO_ROOT / "pyproject.toml").read_text()
    assert 'testpaths = ["tests"]' in text
    assert all(not p.name.startswith("test_") for p in FINDINGS.glob("*.py"))
    assert {p.name for p in FINDINGS.glob("repro_*.py")} >= {F7_REPRO.name}
    assert isinstance(Path, type)


def test_next_step_schedules_the_step_after_the_last_output():
    """A trace saved by a safety campaign ends with the model output before the step that broke a property:
    ``add_next_step`` appends that step (no expected output), once, and the file schedules it."""
    from schedconf.conformance.runs.repro import add_next_step

    trace = read_trace(FINDINGS / "F8-priority-victim-keeps-its-tokens.jsonl")
    assert trace.events[-1]["kind"] == "model_output" and trace.events[-1]["step"] == 2
    longer = add_next_step(trace)
    assert longer.events[-1] == {"kind": "step", "step": 3} and len(longer.events) == len(trace.events) + 1
    assert add_next_step(longer).events == longer.events
    text = render_repro(longer, "0.11.0", ("scheduled_requests_are_running",))
    assert '    # Step 3: the step after the trace, where the safety check stopped.\n    ("schedule", 3),\n]' in text
    assert "--sut vllm-v1@0.11.0 --next-step`" in text
    assert "def check_scheduled_requests_are_running(scheduler, out, step):" in text
    assert "def check_scheduled_requests_are_running" not in render_repro(trace, "0.11.0", ("lone_request_is_served",))
