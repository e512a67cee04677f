"""Golden scenario files in the datadriven style (cockroachdb/datadriven).

A file is a story of blocks. Each block is a command line, ``----``, and the
output the command must render, ended by a blank line. Lines starting with
``#`` between blocks are comments; they carry the hand derivation of the
expected values::

    # Two 5-token prompts and a budget of 8: r1 gets 5, r2 the remaining 3.
    add-request r1 prompt=0..4 max-tokens=2
    ----
    ok

Commands (all state is per file):

``config [profile=P] key=value ...``
    a new scheduler (SchedulerConfig fields; ``profile`` defaults to vllm-0.33)
``add-request ID prompt=SPEC max-tokens=N [priority=P] [arrival=T] [eos=E] [stop=A,B] [ignore-eos] [min-tokens=M]``
    SPEC is ``+``-joined parts, each ``a..b`` (inclusive) or ``a,b,c``
``abort ID``
``finish ID[,ID...] STATUS``
    ``finish_requests`` from outside with STATUS ``stopped``, ``length-capped``
    or ``aborted`` (an engine stopping a request, as vLLM's own tests do)
``schedule [throttle]``
    ``throttle``: ``schedule(throttle_prefills=True)`` (vLLM 0.32+ data-parallel prefill throttle)
``model-output [step=N] [ID=TOKENS ...] [drafts:ID=TOKENS ...]``
    TOKENS is ``a,b`` or ``-`` for none; the output answers step N (default:
    the oldest step in flight)
``stats``
    the scheduler stats the last update reported (vLLM's SchedulerStats)
``reset-prefix-cache [running]``
    forget the prefix cache (``running``: preempt the running requests first)
``step [ID=TOKENS ...]``
    schedule, then a model-output with the given tokens
``blocks`` / ``queues``
    the free queue and block tables / the queues and request counters (with
    each request's in-flight counters when any is non-zero)

Invalid input renders as ``error: <code>``. Every invariant is checked after
each command; a violation renders as ``invariant violated: <name>: ...``.

Run ``SCHEDCONF_REWRITE=1 pytest tests/model/test_golden.py`` to rewrite the
expected outputs; commit only the diffs you understand.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedconf.spec.errors import InvalidConfig, InvalidEvent, InvariantViolation, SpecError
from schedconf.spec.output import ModelRunnerOutput, SchedulerOutput
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.invariants import check_invariants
from schedconf.spec.v1.render import (
    render_blocks,
    render_in_flight,
    render_queues,
    render_request_outputs,
    render_scheduler_output,
)
from schedconf.spec.v1.request import RequestStatus
from schedconf.spec.v1.scheduler import Scheduler


@dataclass
class Block:
    """One command and its expected output, with the line it starts on."""

    line: int
    command: str
    expected: str


class ScenarioFormatError(Exception):
    """A scenario file that does not parse; the message names file and line."""


def parse_file(path: Path) -> tuple[list[str], list[Block]]:
    """Return the file's lines and its blocks; a file with no block (it would check nothing) is refused."""
    from schedconf.conformance.bounds import InputFileError, read_bounded_text

    try:
        lines = read_bounded_text(path, "scenario file").splitlines()
    except InputFileError as exc:
        raise ScenarioFormatError(str(exc)) from None
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        text = lines[i].strip()
        if not text or text.startswith("#"):
            i += 1
            continue
        start = i
        command = text
        i += 1
        if i >= len(lines) or lines[i].strip() != "----":
            raise ScenarioFormatError(f"{path}:{start + 1}: command {command!r} must be followed by a '----' line")
        i += 1
        expected: list[str] = []
        while i < len(lines) and lines[i].strip() != "":
            expected.append(lines[i].rstrip())
            i += 1
        blocks.append(Block(line=start + 1, command=command, expected="\n".join(expected)))
    if not blocks:
        raise ScenarioFormatError(
            f"{path}: expected at least one command block (a command, a '----' line, its "
            "expected output), found none: an empty scenario checks nothing"
        )
    return lines, blocks


def parse_tokens(spec: str) -> list[int]:
    """Parse ``0..3+7,8`` into ``[0, 1, 2, 3, 7, 8]``; ``-`` is empty."""
    from schedconf.conformance.bounds import MAX_SCENARIO_TOKENS

    if spec in ("-", ""):
        return []
    tokens: list[int] = []
    for part in spec.split("+"):
        if ".." in part:
            lo, hi = part.split("..")
            if int(hi) - int(lo) + 1 + len(tokens) > MAX_SCENARIO_TOKENS:
                raise ScenarioFormatError(
                    f"tokens {spec[:60]!r}: expected at most {MAX_SCENARIO_TOKENS} tokens (docs/reference/bounds.md)"
                )
            tokens.extend(range(int(lo), int(hi) + 1))
        else:
            tokens.extend(int(t) for t in part.split(","))
    return tokens


def check_scenario_config_bounds(fields: dict[str, Any]) -> None:
    """Raise ScenarioFormatError for a config past schedconf's bounds (``schedconf.conformance.bounds``)."""
    from schedconf.conformance.bounds import check_config_bounds

    past_bound = check_config_bounds(fields)
    if past_bound is not None:
        field_name, expected, found = past_bound
        raise ScenarioFormatError(f"{field_name}: expected {expected}, found {found}")


def _parse_int(value: str) -> int | bool:
    if value in ("true", "false"):
        return value == "true"
    return int(value)


class ScenarioRunner:
    """Runs the commands of one scenario file against one reference scheduler."""

    def __init__(self) -> None:
        self.scheduler: Scheduler | None = None
        self.pending: SchedulerOutput | None = None

    def run(self, command: str) -> str:
        """Execute one command line and return its rendered output."""
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
        try:
            self.check_state()
        except InvariantViolation as exc:
            return out + f"\ninvariant violated: {exc.invariant}: {exc.message}"
        return out

    def check_state(self) -> None:
        """Every invariant of the scheduler's state (raises InvariantViolation)."""
        if self.scheduler is not None:
            check_invariants(self.scheduler)

    def _sched(self) -> Scheduler:
        if self.scheduler is None:
            raise ScenarioFormatError("a 'config' command must come first")
        return self.scheduler

    def cmd_config(self, args: list[str]) -> str:
        kv = dict(a.split("=", 1) for a in args)
        profile = kv.pop("profile", "vllm-0.33")
        fields = {k: (v if k == "policy" else _parse_int(v)) for k, v in kv.items()}
        check_scenario_config_bounds(fields)
        self.scheduler = None
        self.scheduler = Scheduler(SchedulerConfig.from_dict(fields), profile)
        self.pending = None
        return "ok"

    def cmd_add_request(self, args: list[str]) -> str:
        rid, *rest = args
        opts: dict[str, str] = {}
        for a in rest:
            key, _, value = a.partition("=")
            opts[key] = value
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
        finished = self._sched().abort(args[0])
        return "aborted: " + (" ".join(finished) or "-")

    def cmd_finish(self, args: list[str]) -> str:
        ids, status = args[0].split(","), args[1]
        statuses = {
            "stopped": RequestStatus.FINISHED_STOPPED,
            "length-capped": RequestStatus.FINISHED_LENGTH_CAPPED,
            "aborted": RequestStatus.FINISHED_ABORTED,
        }
        if status not in statuses:
            raise ScenarioFormatError(f"finish: expected a status of {', '.join(statuses)}, found {status!r}")
        finished = self._sched().finish_requests(ids, statuses[status])
        return "finished: " + (" ".join(finished) or "-")

    def cmd_stats(self, args: list[str]) -> str:
        stats = self._sched().last_scheduler_stats
        if stats is None:
            return "no stats"
        pc, sd = stats["prefix_cache"], stats["spec_decoding"]
        lines = [
            f"running={stats['num_running_reqs']} waiting={stats['num_waiting_reqs']}"
            + (f" skipped={stats['num_skipped_waiting_reqs']}" if stats["num_skipped_waiting_reqs"] else ""),
            "prefix cache: " + " ".join(f"{k}={v}" for k, v in pc.items()),
        ]
        if sd is not None:
            lines.append(
                "spec decoding: " + " ".join(f"{k}={v}" for k, v in sd.items()).replace(" ", " ").replace(", ", ",")
            )
        return "\n".join(lines)

    def cmd_reset_prefix_cache(self, args: list[str]) -> str:
        ok = self._sched().reset_prefix_cache(reset_running_requests="running" in args)
        return "reset: ok" if ok else "reset: refused (blocks in use)"

    def cmd_schedule(self, args: list[str]) -> str:
        if args not in ([], ["throttle"]):
            raise ScenarioFormatError(f"schedule: expected nothing or 'throttle', found {' '.join(args)!r}")
        self.pending = self._sched().schedule(throttle_prefills=bool(args))
        return render_scheduler_output(self.pending)

    def cmd_model_output(self, args: list[str]) -> str:
        sampled: dict[str, tuple[int, ...]] = {}
        drafts: dict[str, tuple[int, ...]] = {}
        step: int | None = None
        for a in args:
            key, _, value = a.partition("=")
            if key == "step":
                step = int(value)
            elif key.startswith("drafts:"):
                drafts[key.removeprefix("drafts:")] = tuple(parse_tokens(value))
            else:
                sampled[key] = tuple(parse_tokens(value))
        sched = self._sched()
        outputs = sched.update_from_output(self.get_output_to_apply(step), ModelRunnerOutput(sampled, drafts))
        return render_request_outputs(outputs)

    def get_output_to_apply(self, step: int | None) -> SchedulerOutput:
        """The scheduler output a ``model-output`` applies (``step=N``, else the oldest in flight)."""
        return self._sched().get_output_to_apply(step)

    def cmd_step(self, args: list[str]) -> str:
        scheduled = self.cmd_schedule([])
        return scheduled + "\n" + self.cmd_model_output(args)

    def cmd_blocks(self, args: list[str]) -> str:
        return render_blocks(self._sched().observe())

    def cmd_queues(self, args: list[str]) -> str:
        sched = self._sched()
        return render_queues(sched.observe()) + render_in_flight(sched)


def run_file(path: Path, rewrite: bool | None = None, runner_class: type[ScenarioRunner] = ScenarioRunner) -> list[str]:
    """Run a scenario file; return mismatch reports (empty when it passes).

    With ``rewrite`` (default: the SCHEDCONF_REWRITE environment variable) the
    file is rewritten with the actual outputs instead.
    """
    if rewrite is None:
        rewrite = os.environ.get("SCHEDCONF_REWRITE") == "1"
    lines, blocks = parse_file(path)
    runner = runner_class()
    failures: list[str] = []
    actuals: list[str] = []
    for block in blocks:
        try:
            actual = runner.run(block.command)
        except SpecError as exc:  # pragma: no cover - a bug in the model
            actual = f"unexpected error: {exc}"
        except ScenarioFormatError as exc:
            raise ScenarioFormatError(f"{path}:{block.line}: {block.command.split()[0]}: {exc}") from None
        actuals.append(actual)
        if actual != block.expected and not rewrite:
            import difflib

            diff = "\n".join(
                difflib.unified_diff(
                    block.expected.splitlines(), actual.splitlines(), "expected", "actual", lineterm=""
                )
            )
            failures.append(f"{path}:{block.line}: {block.command}\n{diff}")
    if rewrite:
        _rewrite(path, lines, blocks, actuals)
    return failures


def _rewrite(path: Path, lines: list[str], blocks: list[Block], actuals: list[str]) -> None:
    out: list[str] = []
    i = 0
    for block, actual in zip(blocks, actuals):
        start = block.line - 1
        out.extend(lines[i:start])
        out.extend([block.command, "----", *actual.splitlines()])
        j = start + 2
        while j < len(lines) and lines[j].strip() != "":
            j += 1
        i = j
    out.extend(lines[i:])
    path.write_text("\n".join(out) + "\n")
