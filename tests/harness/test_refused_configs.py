"""Traces of configs one unit past a limit: the header expects the refusal, a scheduler must give it.

Every rule of conformance/workloads/config_limits.py is checked on the model (the
trace reads, so the model refuses it with that code) and replayed: the
reference and impl refuse with the code (pass); a scheduler that accepts the
config, or refuses it with another code, fails at line 1. A header that
expects a refusal the model does not make is a malformed trace.
"""

from __future__ import annotations

import json

import pytest

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import FAIL, PASS, render_divergence, replay
from schedconf.conformance.sut import SutInputError
from schedconf.conformance.traces.trace import TraceError, make_header, parse_trace_text, render_trace
from schedconf.conformance.traces.vectors import iter_corpus
from schedconf.conformance.workloads.config_limits import BASE_CONFIG, PAST_THE_LIMIT, make_refused_config_traces


def test_every_rule_makes_a_trace_where_the_release_refuses_it():
    names = {rule for rule, _ in make_refused_config_traces("vllm-0.33")}
    assert names == {rule for rule, _, _ in PAST_THE_LIMIT}
    # 0.11 accepts a threshold above max_model_len (findings.md, divergence 2): no trace for it there
    assert {rule for rule, _ in make_refused_config_traces("vllm-0.11")} == names - {"threshold_vs_max_model_len"}


@pytest.mark.parametrize("sut_name", ["reference", "impl"])
def test_schedulers_that_refuse_with_the_code_pass(sut_name):
    sut = make_sut(sut_name)
    try:
        for rule, trace in make_refused_config_traces("vllm-0.33"):
            again = parse_trace_text(render_trace(trace), f"{rule}.jsonl")  # the written form reads back
            result = replay(again, sut)
            assert result.verdict == PASS, (rule, result.divergence)
    finally:
        sut.close()


class AcceptsAnyConfig(ReferenceSut):
    """Starts on any config: the bug these traces exist to catch."""

    def start(self, config, profile):
        fixed = dict(BASE_CONFIG.to_dict(), policy=config["policy"])
        super().start(fixed, profile)


class RefusesWithTheWrongCode(ReferenceSut):
    def start(self, config, profile):
        raise SutInputError("invalid_config_type", "every config is of the wrong type")


def test_a_scheduler_that_accepts_the_config_fails_at_line_1():
    rule, trace = make_refused_config_traces("vllm-0.33")[0]
    trace.path = f"{rule}.jsonl"
    result = replay(trace, AcceptsAnyConfig())
    assert result.verdict == FAIL and result.divergence.kind == "input_error" and result.divergence.line == 1
    assert "the scheduler accepted the config" in result.divergence.message
    report = render_divergence(trace, result)  # no reference state to show: the reference refuses the config
    assert f"the reference refuses this config: {trace.header['expect_error']}" in report


def test_a_scheduler_that_refuses_with_another_code_fails():
    _, trace = make_refused_config_traces("vllm-0.33")[0]
    result = replay(trace, RefusesWithTheWrongCode())
    assert result.verdict == FAIL and result.divergence.kind == "input_error"
    diff = result.divergence.diffs[0]
    assert (diff.expected, diff.actual) == (trace.header["expect_error"], "invalid_config_type")


def test_a_normal_trace_refused_at_start_is_an_input_error_not_a_crash():
    from schedconf.conformance.traces.examples import EXAMPLES
    from schedconf.conformance.workloads.workload import run_workload

    trace = run_workload(EXAMPLES["mixed"]())
    result = replay(trace, RefusesWithTheWrongCode())
    assert result.verdict == FAIL and result.divergence.kind == "input_error"
    assert "the scheduler refused the config" in result.divergence.message


def _header(config: dict, code: str | None) -> str:
    header = make_header(config, "vllm-0.33", seed=0, origin="test")
    if code:
        header["expect_error"] = code
    return json.dumps(header, sort_keys=True)


def test_a_header_must_expect_exactly_the_models_refusal():
    refused = {**BASE_CONFIG.to_dict(), "block_size": 0}
    parse_trace_text(_header(refused, "invalid_block_size"))  # reads
    with pytest.raises(
        TraceError, match="expect_error: expected the code the model refuses this config with, invalid_block_size"
    ):
        parse_trace_text(_header(refused, "pool_below_max_model_len"))
    with pytest.raises(TraceError, match="expect_error: expected no expect_error: the model accepts this config"):
        parse_trace_text(_header(BASE_CONFIG.to_dict(), "invalid_block_size"))
    step = json.dumps({"kind": "abort", "request_id": "r1"})
    with pytest.raises(TraceError, match=r"<memory>:2: kind: expected no events"):
        parse_trace_text(_header(refused, "invalid_block_size") + "\n" + step)


def test_the_corpus_holds_them_for_every_profile():
    for profile in ("vllm-0.33", "vllm-0.32", "vllm-0.11"):
        names = {path.stem for prof, path, _ in iter_corpus(profile) if path.stem.startswith("refused-")}
        assert names == {f"refused-{rule}" for rule, _ in make_refused_config_traces(profile)}, profile


def test_shrinking_a_refused_config_trace_keeps_its_header(tmp_path, capsys):
    from schedconf.conformance.cli import main
    from schedconf.conformance.traces.trace import write_trace

    _, trace = make_refused_config_traces("vllm-0.33")[0]
    path = tmp_path / "refused.jsonl"
    write_trace(path, trace)
    adapter = tmp_path / "accepting_adapter.py"
    adapter.write_text("from tests.harness.test_refused_configs import AcceptsAnyConfig\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        code = main(
            [
                "shrink",
                str(path),
                "--sut",
                "module:accepting_adapter:AcceptsAnyConfig",
                "--out",
                str(tmp_path / "min.jsonl"),
            ]
        )
    finally:
        sys.path.remove(str(tmp_path))
    out = capsys.readouterr().out
    assert code == 1 and "0 -> 0 events" in out and "the scheduler accepted the config" in out


def test_a_crash_at_start_is_reported_at_the_header_line():
    class CrashesAtStart(ReferenceSut):
        def start(self, config, profile):
            raise RuntimeError("no scheduler today")

    _, trace = make_refused_config_traces("vllm-0.33")[0]
    result = replay(trace, CrashesAtStart())
    assert result.verdict == FAIL and result.divergence.kind == "sut_error" and result.divergence.line == 1
