"""Golden scenario files for the v0 model (``conformance/testdata/scenarios_v0/*.txt``).

Same file format as :mod:`schedconf.conformance.workloads.datadriven` (blocks of ``command``,
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

from pathlib import Path
from typing import Any

from schedconf.conformance.workloads.datadriven import ScenarioFormatError, ScenarioRunner, check_scenario_config_bounds
from schedconf.conformance.workloads.datadriven import run_file as run_scenario_file
from schedconf.spec.errors import InvalidEvent
from schedconf.spec.v0.config import V0SchedulerConfig
from schedconf.spec.v0.invariants import check_invariants
from schedconf.spec.v0.output import V0SchedulerOutput
from schedconf.spec.v0.render import render_v0_blocks, render_v0_queues, render_v0_scheduler_output
from schedconf.spec.v0.scheduler import Scheduler

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


class V0ScenarioRunner(ScenarioRunner):
    """Runs the commands of one scenario file against one v0 model (the v1 runner's commands, v0 config and renderings)."""

    scheduler: Scheduler | None  # type: ignore[assignment]
    pending: V0SchedulerOutput | None  # type: ignore[assignment]

    def check_state(self) -> None:
        # A crashed engine is dead: its state is whatever vLLM left behind.
        if self.scheduler is not None and self.scheduler.crashed is None:
            check_invariants(self.scheduler)

    def _sched(self) -> Scheduler:  # type: ignore[override]  # a v0 Scheduler, as `scheduler` above
        if self.scheduler is None:
            raise ScenarioFormatError("a 'config' command must come first")
        return self.scheduler

    def cmd_config(self, args: list[str]) -> str:
        fields = dict(DEFAULTS)
        for a in args:
            key, _, value = a.partition("=")
            fields[key] = _parse_value(key, value)
        check_scenario_config_bounds(fields)
        self.scheduler = None
        self.scheduler = Scheduler(V0SchedulerConfig.from_dict(fields))
        self.pending = None
        return "ok"

    def cmd_schedule(self, args: list[str]) -> str:
        self.pending = self._sched().schedule()
        return render_v0_scheduler_output(self.pending)

    def cmd_model_output(self, args: list[str]) -> str:
        rendered = super().cmd_model_output(args)
        self.pending = None  # applied (a refused output leaves it pending)
        return rendered

    def get_output_to_apply(self, step: int | None) -> V0SchedulerOutput:  # type: ignore[override]
        """The v0 engine runs one step at a time: the output of the last ``schedule``."""
        if self.pending is None:
            raise InvalidEvent("unexpected_model_output", "model-output without a pending schedule")
        return self.pending

    def cmd_blocks(self, args: list[str]) -> str:
        sched = self._sched()
        return render_v0_blocks(sched.observe(), sched.get_evictor_order())

    def cmd_queues(self, args: list[str]) -> str:
        return render_v0_queues(self._sched().get_queues())


def run_file(path: Path, rewrite: bool | None = None) -> list[str]:
    """Run a v0 scenario file; return mismatch reports (empty when it passes)."""
    return run_scenario_file(path, rewrite, runner_class=V0ScenarioRunner)
