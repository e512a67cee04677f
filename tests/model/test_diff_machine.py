"""The stateful comparison machine: our fast scheduler agrees step by step; a mutant is caught and saved."""

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from schedconf.conformance.runs.diff_machine import make_diff_machine
from schedconf.conformance.traces.trace import read_trace

TestImplAgrees = make_diff_machine("impl").TestCase


def test_a_mutant_is_caught_and_saved_as_a_replayable_trace(tmp_path, monkeypatch):
    import schedconf.conformance.runs.diff_machine as dm

    monkeypatch.setattr(dm, "FAILURE_DIR", tmp_path)
    with pytest.raises(AssertionError) as exc:
        # No shrinking phase: finding and saving the failure is what is tested here.
        run_state_machine_as_test(
            make_diff_machine("mutant:fcfs_victim_head"),
            settings=settings(
                max_examples=300,
                phases=[Phase.generate],
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    message = str(exc.value)
    assert "schedconf replay" in message and "preempted_req_ids" in message
    saved = sorted(tmp_path.glob("*.jsonl"))
    assert saved
    from schedconf.conformance.adapters import make_sut
    from schedconf.conformance.checking.replay import replay

    trace = read_trace(saved[-1])
    assert replay(trace, make_sut("mutant:fcfs_victim_head"), "strict").verdict == "fail"
    assert replay(trace, make_sut("reference"), "strict").verdict == "pass"
