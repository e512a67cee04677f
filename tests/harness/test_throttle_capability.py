"""A step with ``throttle_prefills`` reaches only schedulers that take it; for the others the trace is unknown.

Over the protocol (``module:``, a child process behind protocol_server) and in process; a scheduler
that takes the parameter passes, one whose ``schedule()`` has none gets verdict unknown, never a pass
on a step it could not run as asked.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import replay
from schedconf.conformance.checking.verdict import PASS, UNKNOWN
from schedconf.conformance.workloads.generate import random_workload
from schedconf.conformance.workloads.workload import run_workload


def _throttled_trace():
    workload = random_workload(3, "vllm-0.33", invalid_inputs=False)
    workload = replace(workload, throttle_cadence=2)
    trace = run_workload(workload)
    steps = [e for e in trace.events if e["kind"] == "step"]
    # every odd step is throttled (the cadence releases each 2nd), so the trace carries the flag
    assert any(e.get("throttle_prefills") for e in steps) and not all(e.get("throttle_prefills") for e in steps)
    return trace


class NoThrottle(ReferenceSut):
    """The reference, but its schedule() takes no throttle_prefills."""

    def schedule(self):  # type: ignore[override]
        return super().schedule()


def test_in_process_a_scheduler_with_the_parameter_passes_and_one_without_is_unknown():
    trace = _throttled_trace()
    assert replay(trace, ReferenceSut()).verdict == PASS
    result = replay(trace, NoThrottle())
    assert result.verdict == UNKNOWN and "throttle_prefills" in result.detail


@pytest.mark.parametrize("with_parameter, verdict", [(True, PASS), (False, UNKNOWN)])
def test_over_the_protocol_the_capability_decides(tmp_path, with_parameter, verdict):
    trace = _throttled_trace()
    body = "    def schedule(self):\n        return super().schedule()\n" if not with_parameter else "    pass\n"
    (tmp_path / "throttle_sut.py").write_text(
        "from schedconf.conformance.adapters.reference import ReferenceSut\n"
        f"class Sut(ReferenceSut):\n    name = 'throttle-sut'\n{body}"
    )
    sys.path.insert(0, str(tmp_path))
    sut = make_sut("module:throttle_sut:Sut")
    try:
        sut.start(dict(trace.config), trace.profile)
        assert bool(sut.capabilities.get("throttle_prefills")) is with_parameter
        assert replay(trace, sut).verdict == verdict
    finally:
        sut.close()
        sys.path.remove(str(tmp_path))
