"""A Python scheduler's answer that JSON cannot carry is a protocol error naming the field, in both modes.

JSON carries None, booleans, integers, finite floats, strings, lists and
objects with string keys. A Python scheduler can answer anything else: NaN,
an integer key (``json.dumps`` would quietly make it the string ``"0"``), a
list nested without end or a dict that holds itself (``json.dumps`` then
raises RecursionError or ValueError). Through ``module:`` the child process
must still answer (the scheduler's answer is not its own crash), and
in-process the check must not fail with an error of its own; in both modes
the verdict is a ``protocol_error`` that names the field, as a stdio reply's
schema error does.
"""

from __future__ import annotations

import pytest

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import FAIL, replay
from schedconf.conformance.protocol import JSON_DEPTH_LIMIT, find_not_json
from schedconf.conformance.traces.examples import EXAMPLES
from schedconf.conformance.workloads.workload import run_workload
from tests.harness.test_fault_injection import REPO

MODULE = "tests.harness.test_module_replies"


class _FirstScheduleWrong(ReferenceSut):
    """The reference, except that its first ``schedule()`` answer is spoiled by ``spoil``."""

    def schedule(self):  # noqa: ANN201
        return self.spoil(dict(super().schedule()))

    def spoil(self, result):  # noqa: ANN001, ANN201
        return result


class NotANumber(_FirstScheduleWrong):
    def spoil(self, result):  # noqa: ANN001, ANN201
        return {**result, "total_num_scheduled_tokens": float("nan")}


class IntegerKey(_FirstScheduleWrong):
    def spoil(self, result):  # noqa: ANN001, ANN201
        return {
            **result,
            "num_scheduled_tokens": {index: n for index, n in enumerate(result["num_scheduled_tokens"].values())},
        }


class DeepList(_FirstScheduleWrong):
    def spoil(self, result):  # noqa: ANN001, ANN201
        nested: list = []
        for _ in range(100_000):
            nested = [nested]
        return {**result, "finished_req_ids": nested}


class HoldsItself(_FirstScheduleWrong):
    def spoil(self, result):  # noqa: ANN001, ANN201
        result["scheduled_new_reqs"] = [result]
        return result


# class -> words the divergence message must hold (after "not JSON: ")
CASES = {
    "NotANumber": "result.total_num_scheduled_tokens: expected a finite number, found float nan",
    "IntegerKey": "result.num_scheduled_tokens: expected string keys, found key int 0",
    "DeepList": f"result.finished_req_ids[0][0][0][0][0][0...: expected at most {JSON_DEPTH_LIMIT} levels of "
    "nesting, found more",
    "HoldsItself": f"result.scheduled_new_reqs[0].scheduled_n...: expected at most {JSON_DEPTH_LIMIT} levels of "
    "nesting, found more",
}


@pytest.fixture(scope="module")
def trace():
    return run_workload(EXAMPLES["mixed"]())


@pytest.mark.parametrize("mode", ["module", "inprocess"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_an_answer_json_cannot_carry_is_a_protocol_error(name, mode, trace, monkeypatch):
    monkeypatch.chdir(REPO)
    sut = make_sut(f"{mode}:{MODULE}:{name}")
    try:
        result = replay(trace, sut, "strict", step_timeout=5.0)
    finally:
        sut.close()
    assert result.verdict == FAIL, result
    assert result.divergence.kind == "protocol_error", result.divergence
    assert "not JSON: " + CASES[name] in result.divergence.message, result.divergence.message
    assert result.divergence.message.startswith("step: "), result.divergence.message  # the first schedule()


@pytest.mark.parametrize(
    "value,problem",
    [
        ({"a": [1, "x", None, True, 1.5, (2, 3)], "b": {}}, None),
        ({"a": [1, {2}]}, "result.a[1]: expected a JSON value, found set {2}"),
        ({"a": set()}, "result.a: expected a JSON value, found set()"),
        ({"a": float("inf")}, "result.a: expected a finite number, found float inf"),
        ({(1, 2): 1}, "result: expected string keys, found key tuple (1, 2)"),
        (object(), "result: expected a JSON value, found <object object at"),
    ],
)
def test_find_not_json_names_the_first_field_json_cannot_carry(value, problem):
    found = find_not_json(value)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem), found
