"""A Hypothesis state machine that drives the reference and a SUT through the same random inputs.

Rules add requests, abort live ones, and step (schedule, then a model output
drawn by the rule: sampled tokens and drafts). After every rule the two
outputs are compared (strict) and every invariant of the reference is checked.
On the first difference the inputs so far are written as a trace file (the
reference's outputs as expectations) and the assertion names the file and the
command that replays it.

``make_diff_machine("impl")`` returns a machine class for one SUT; run it with
``run_state_machine_as_test`` or its ``TestCase``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from schedconf.conformance.adapters import make_sut
from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.compare import Comparator
from schedconf.conformance.sut import SutInputError
from schedconf.conformance.traces.trace import Trace, make_header, write_trace
from schedconf.conformance.workloads.generate import HypothesisChooser, build_config
from schedconf.spec.v1.invariants import check_invariants

TOKENS = st.integers(0, 15)
EOS, STOP = 1, 2
FAILURE_DIR = Path(os.environ.get("SCHEDCONF_FAILURE_DIR", "reports/failures"))


class DiffMachineBase(RuleBasedStateMachine):
    """See the module docstring. Subclasses set ``sut_name`` and ``profile``."""

    sut_name = "reference"
    profile = "vllm-0.33"

    @initialize(data=st.data())
    def init(self, data: Any) -> None:
        self.config = build_config(HypothesisChooser(data.draw), data.draw(st.sampled_from(["mixed", "pressure"])))
        self.ref = ReferenceSut()
        self.ref.start(self.config.to_dict(), self.profile)
        self.sut = make_sut(self.sut_name)
        self.sut.start(self.config.to_dict(), self.profile)
        self.comparator = Comparator("strict")
        self.events: list[dict[str, Any]] = []
        self.next_id = 0
        self.clock = 0

    # ------------------------------------------------------------ helpers

    def _fail(self, message: str) -> None:
        trace = Trace(
            header=make_header(
                self.config.to_dict(),
                self.profile,
                0,
                "stateful",
                description=f"stateful diff vs {self.sut_name}: {message}",
            ),
            events=self.events,
        )
        FAILURE_DIR.mkdir(parents=True, exist_ok=True)
        path = FAILURE_DIR / f"stateful-{self.sut_name.replace(':', '_').replace('/', '_')}-{len(self.events)}.jsonl"
        write_trace(path, trace)
        raise AssertionError(f"{message}\ntrace: {path}\nreplay: schedconf replay {path} --sut {self.sut_name}")

    def _both(self, kind: str, event: dict[str, Any], call_ref, call_sut) -> Any:  # noqa: ANN001
        try:
            expected = call_ref()
            ref_error = None
        except SutInputError as exc:
            expected, ref_error = None, exc.code
        try:
            actual = call_sut()
            sut_error = None
        except SutInputError as exc:
            actual, sut_error = None, exc.code
        if ref_error:
            event["expect_error"] = ref_error
        self.events.append(event)
        if ref_error != sut_error:
            self._fail(f"{kind}: the reference answered {ref_error or 'ok'}, the SUT {sut_error or 'ok'}")
        return expected, actual

    # -------------------------------------------------------------- rules

    @rule(data=st.data())
    def add_request(self, data: Any) -> None:
        length = data.draw(st.integers(1, max(1, self.config.max_model_len - 1)), label="prompt_len")
        if data.draw(st.booleans(), label="shared_prefix"):
            prompt = list(range(100, 100 + length))
        else:
            prompt = data.draw(st.lists(TOKENS, min_size=length, max_size=length))
        self.clock += data.draw(st.integers(0, 1), label="tick")
        event = {
            "kind": "add_request",
            "request_id": f"r{self.next_id}",
            "prompt_token_ids": prompt,
            "max_tokens": data.draw(st.integers(1, 12), label="max_tokens"),
            "priority": data.draw(st.integers(0, 2), label="priority"),
            "arrival_time": self.clock,
            "eos_token_id": EOS,
            "stop_token_ids": [STOP] if data.draw(st.booleans(), label="stop") else [],
            "ignore_eos": data.draw(st.booleans(), label="ignore_eos"),
            "min_tokens": 0,
        }
        self.next_id += 1
        self._both("add_request", event, lambda: self.ref.add_request(event), lambda: self.sut.add_request(event))

    @precondition(lambda self: bool(self.ref.scheduler and self.ref.scheduler.requests))
    @rule(data=st.data())
    def abort(self, data: Any) -> None:
        rid = data.draw(st.sampled_from(sorted(self.ref.scheduler.requests)), label="abort_id")
        event = {"kind": "abort", "request_id": rid}
        self._both("abort", event, lambda: self.ref.abort(rid), lambda: self.sut.abort(rid))

    @precondition(lambda self: bool(self.ref.scheduler and self.ref.scheduler.has_requests()))
    @rule(data=st.data())
    def step(self, data: Any) -> None:
        expected, actual = self._both(
            "step", {"kind": "step", "step": self.ref.scheduler.current_step + 1}, self.ref.schedule, self.sut.schedule
        )
        if expected is None:
            return  # both engines died at this step (an engine crash both model): later calls must say engine_dead
        self.events[-1]["expect"] = expected
        diffs = self.comparator.compare_scheduler_output(expected, actual)
        if diffs:
            self._fail(
                f"step {self.events[-1]['step']}: "
                + "; ".join(f"{d.field}: {d.expected} != {d.actual}" for d in diffs[:5])
            )
        record = self.ref.scheduler.last_step
        sampled: dict[str, list[int]] = {}
        drafts: dict[str, list[int]] = {}
        for rid, samples in record.samples.items():
            if samples:
                n = len(expected["scheduled_spec_decode_tokens"].get(rid, ()))
                k = data.draw(st.integers(0, n), label="accepted")
                sampled[rid] = data.draw(st.lists(TOKENS, min_size=k + 1, max_size=k + 1))
        if self.config.num_spec_tokens:
            for rid in expected["num_scheduled_tokens"]:
                n = data.draw(st.integers(0, self.config.num_spec_tokens), label="drafts")
                drafts[rid] = data.draw(st.lists(TOKENS, min_size=n, max_size=n))
        event = {
            "kind": "model_output",
            "step": expected and self.events[-1]["step"],
            "sampled_token_ids": sampled,
            "draft_token_ids": drafts,
        }
        expected_out, actual_out = self._both(
            "model_output",
            event,
            lambda: self.ref.update_from_output(sampled, drafts),
            lambda: self.sut.update_from_output(sampled, drafts),
        )
        event["expect"] = {"outputs": expected_out or []}
        diffs = self.comparator.compare_request_outputs(expected_out or [], actual_out or [])
        if diffs:
            self._fail("model output: " + "; ".join(f"{d.field}: {d.expected} != {d.actual}" for d in diffs[:5]))

    @invariant()
    def reference_invariants(self) -> None:
        if getattr(self, "ref", None) is not None and self.ref.scheduler is not None:
            check_invariants(self.ref.scheduler)

    def teardown(self) -> None:
        if getattr(self, "sut", None) is not None:
            self.sut.close()


def make_diff_machine(sut_name: str, profile: str = "vllm-0.33") -> type[DiffMachineBase]:
    """A machine class comparing ``sut_name`` with the reference under ``profile``."""
    return type(
        f"DiffMachine_{sut_name.replace(':', '_').replace('-', '_')}",
        (DiffMachineBase,),
        {"sut_name": sut_name, "profile": profile},
    )
