"""Golden scenario files for the v0 model (``conformance/testdata/scenarios_v0/*.txt``).

Same file format as :mod:`conformance.datadriven` (blocks of ``command``,
``----``, expected output; ``#`` comments carry the hand derivations) and the
same parser and rewrite mode; only the commands differ:

``config key=value ...``
    a new v0 scheduler; every ``V0SchedulerConfig`` field may be given, the
    others take :data:`DEFAULTS` (``preemption_mode=none`` for null)
``add-request ID prompt=SPEC max-tokens=N [priority=P] [arrival=T] [eos=E] [stop=A,B] [ignore-eos] [min-tokens=M]``
``abort ID``
``schedule`` / ``model-output [ID=TOKEN ...]`` / ``step [ID=TOKEN ...]``
``blocks``
    free blocks, block tables, and the evictor order with prefix caching
``queues``
    waiting, running, swapped and each group's counters

Errors render as ``error: <code>`` (an engine crash too); every v0 invariant
is checked after each command. ``SCHEDCONF_REWRITE=1`` rewrites the outputs.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from conformance.datadriven import ScenarioFormatError, _rewrite, parse_file, parse_tokens
from spec.errors import InvalidConfig, InvalidEvent, InvariantViolation, SpecError
from spec.output import ModelRunnerOutput
from spec.render import render_request_outputs
from spec.v0.config import V0SchedulerConfig
from spec.v0.invariants import check_invariants
from spec.v0.output import V0SchedulerOutput
from spec.v0.render import render_v0_blocks, render_v0_queues, render_v0_scheduler_output
from spec.v0.scheduler import Scheduler

DEFAULTS: dict[str, Any] = {
    "block_size": 4,
    "num_gpu_blocks": 8,
    "num_cpu_blocks": 0,
    "max_num_batched_tokens": 64,
    "max_num_seqs": 4,
    "max_model_len": 32,
    "enable_chunked_prefill": False,
    "enable_prefix_caching": False,
    "policy": "fcfs",
    "preemption_mode": None,
    "max_num_partial_prefills": 1,
    "max_long_partial_prefills": 1,
    "long_prefill_token_threshold": 0,
}


def _parse_value(key: str, value: str) -> Any:
    if key == "policy":
        return value
    if key == "preemption_mode":
        return None if value == "none" else value
    if value in ("true", "false"):
        return value == "true"
    return int(value)


class V0ScenarioRunner:
    """Runs the commands of one scenario file against one v0 model."""

    def __init__(self) -> None:
        self.scheduler: Scheduler | None = None
        self.pending: V0SchedulerOutput | None = None

    def run(self, command: str) -> str:
        name, *args = command.split()
        handler = getattr(self, "cmd_" + name.replace("-", "_"), None)
        if handler is None:
            raise ScenarioFormatError(f"unknown command {name!r}")
        try:
            out = handler(args)
        except (InvalidEvent, InvalidConfig) as exc:
            return f"error: {exc.code}"
        except InvariantViolation as exc:
            return f"invariant violated: {exc.invariant}: {exc.message}"
        if self.scheduler is not None and self.scheduler.crashed is None:
            try:
                check_invariants(self.scheduler)
            except InvariantViolation as exc:
                return out + f"\ninvariant violated: {exc.invariant}: {exc.message}"
        return out

    def _sched(self) -> Scheduler:
        if self.scheduler is None:
            raise ScenarioFormatError("a 'config' command must come first")
        return self.scheduler

    def cmd_config(self, args: list[str]) -> str:
        fields = dict(DEFAULTS)
        for a in args:
            key, _, value = a.partition("=")
            fields[key] = _parse_value(key, value)
        self.scheduler = None
        self.scheduler = Scheduler(V0SchedulerConfig.from_dict(fields))
        self.pending = None
        return "ok"

    def cmd_add_request(self, args: list[str]) -> str:
        rid, *rest = args
        opts = dict(a.partition("=")[::2] for a in rest)
        self._sched().add_request(
            rid,
            parse_tokens(opts["prompt"]),
            int(opts["max-tokens"]),
            priority=int(opts.get("priority", 0)),
            arrival_time=int(opts.get("arrival", 0)),
            eos_token_id=int(opts["eos"]) if "eos" in opts else None,
            ignore_eos="ignore-eos" in opts,
            stop_token_ids=parse_tokens(opts.get("stop", "-")),
            min_tokens=int(opts.get("min-tokens", 0)),
        )
        return "ok"

    def cmd_abort(self, args: list[str]) -> str:
        return "aborted: " + (" ".join(self._sched().abort(args[0])) or "-")

    def cmd_schedule(self, args: list[str]) -> str:
        self.pending = self._sched().schedule()
        return render_v0_scheduler_output(self.pending)

    def cmd_model_output(self, args: list[str]) -> str:
        sampled = {}
        for a in args:
            key, _, value = a.partition("=")
            sampled[key] = tuple(parse_tokens(value))
        if self.pending is None:
            raise InvalidEvent("unexpected_model_output", "model-output without a pending schedule")
        outputs = self._sched().update_from_output(self.pending, ModelRunnerOutput(sampled, {}))
        self.pending = None
        return render_request_outputs(outputs)

    def cmd_step(self, args: list[str]) -> str:
        scheduled = self.cmd_schedule([])
        return scheduled + "\n" + self.cmd_model_output(args)

    def cmd_blocks(self, args: list[str]) -> str:
        sched = self._sched()
        return render_v0_blocks(sched.observe(), sched.get_evictor_order())

    def cmd_queues(self, args: list[str]) -> str:
        return render_v0_queues(self._sched().get_queues())


def run_file(path: Path, rewrite: bool | None = None) -> list[str]:
    """Run a v0 scenario file; return mismatch reports (empty when it passes)."""
    if rewrite is None:
        rewrite = os.environ.get("SCHEDCONF_REWRITE") == "1"
    lines, blocks = parse_file(path)
    runner = V0ScenarioRunner()
    failures: list[str] = []
    actuals: list[str] = []
    for block in blocks:
        try:
            actual = runner.run(block.command)
        except SpecError as exc:  # pragma: no cover - a bug in the model
            actual = f"unexpected error: {exc}"
        actuals.append(actual)
        if actual != block.expected and not rewrite:
            diff = "\n".join(difflib.unified_diff(block.expected.splitlines(), actual.splitlines(),
                                                  "expected", "actual", lineterm=""))
            failures.append(f"{path}:{block.line}: {block.command}\n{diff}")
    if rewrite:
        _rewrite(path, lines, blocks, actuals)
    return failures
