"""Standalone reproductions for engine maintainers: ``schedconf repro TRACE --sut vllm-v1@VERSION``.

A failing (or minimal) trace says where the engine and the reference model
part ways. A maintainer needs something else: one Python test file in the
engine's own API, that fails only if the engine breaks a rule every correct
scheduler keeps. This module writes that file from a trace and keeps it only if
it does fail.

The file (``templates/repro_vllm.py.j2``) imports only vLLM, pytest and the
standard library. It builds vLLM's ``Scheduler`` the way vLLM's tests do
(``tests/v1/core/utils.py``: ``create_scheduler`` / ``create_requests``, for the
API of the chosen release), replays the trace's events as a literal list
(``add_request``, ``schedule``, ``update_from_output`` with a
``ModelRunnerOutput`` of the trace's sampled tokens, ``update_draft_token_ids``,
``finish_requests`` for aborts) and checks a rule after every call:

``engine_does_not_crash``
    no engine call raises on a config the engine accepted (findings 3 and 4);
``prefix_hit_kv_was_computed``
    a request's computed tokens have KV computed for exactly those tokens in
    its blocks (finding 7): the file records, per KV slot, the token sequence a
    step wrote there when that step's output is applied;
``output_goes_to_its_request``
    ``update_from_output`` changes only the request objects scheduled in that
    step (finding 9: an abort, then a re-add under the same id while the step
    runs);
``lone_request_is_served``
    a request alone in an engine that accepted the pool for one
    ``max_model_len`` sequence is scheduled within ``LIVENESS_STEPS`` steps
    (finding 5).

Classification is by running: a candidate with every rule is run in the
release's environment; the first rule it breaks is the one the final file
asserts (alone), and the final file is run again and must break it at the same
step. Input events the trace marks ``expect_error`` are dropped (the engine's
front end validates those), except a re-add under an id still in flight
(``request_id_in_flight``), which finding 9 needs: a second candidate keeps
those. If no rule breaks, nothing is written: the divergence is a difference
from the reference model, not an engine bug.

A trace whose header config the model refuses (``expect_error``: no events)
gets one lone request of ``max_model_len - 1`` tokens: the largest the engine
must serve once it accepts the config.

Nothing here imports vLLM: the files run as subprocesses with the release's
interpreter (``schedconf.conformance.engines.vllm_env``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedconf.conformance.adapters import UnknownSut
from schedconf.conformance.traces.trace import Trace

REPRO_TIMEOUT_S = 300.0
"""One run of a reproduction file (importing vLLM takes ~10-20 s on two cores)."""

LIVENESS_STEPS = 2

RULES: dict[str, str] = {
    "engine_does_not_crash": "a scheduler must not crash on valid input to a config it accepted",
    "prefix_hit_kv_was_computed": (
        "a request may start or resume with computed tokens only if its blocks hold KV"
        " computed for exactly those tokens (a prefix-cache hit must not serve a block"
        " whose KV was never computed)"
    ),
    "output_goes_to_its_request": (
        "a step's model output is applied only to the requests scheduled in that step,"
        " never to a request added later under the same id"
    ),
    "lone_request_is_served": (
        "a request alone in the engine, which accepted a pool that holds one max_model_len"
        " sequence, is scheduled within a few steps"
    ),
    "scheduled_requests_are_running": (
        "every request a step schedules is running when schedule() returns: a request the"
        " step preempted gives its tokens back with its blocks"
    ),
}
"""Every rule a reproduction can assert, in plain words (the crash rule is checked by every file)."""

RULE_TITLES: dict[str, str] = {
    "engine_does_not_crash": "the scheduler crashes on a config it accepted",
    "prefix_hit_kv_was_computed": "a prefix-cache hit serves KV that was never computed",
    "output_goes_to_its_request": "a step's output is applied to another request under the same id",
    "lone_request_is_served": "a lone request is never scheduled",
    "scheduled_requests_are_running": "a request preempted in a step keeps the tokens that step scheduled for it",
}

CHECKED_RULES = (
    "scheduled_requests_are_running",
    "prefix_hit_kv_was_computed",
    "output_goes_to_its_request",
    "lone_request_is_served",
)
"""The rules with a check function in the file (the crash rule wraps every engine call)."""

KEPT_REFUSALS = {"request_id_in_flight": "output_goes_to_its_request"}
"""Refused inputs the engine itself accepts and a rule needs: code -> rule."""

SKIPPED_STEP_CODES = frozenset({"output_not_processed"})
"""Step-level refusals that are about the caller's order of calls; any other step
``expect_error`` (the model expects the engine to fail there) is replayed."""

RELEASE_API: dict[str, dict[str, Any]] = {
    "0.33.0": {
        "check_module": "vllm.v1.core.kv_cache_planning",
        "hash_module": "vllm.utils.hashing",
        "eos_on_request": False,
        "scheduler_block_size": True,
        "encoder_decoder_flag": True,
        "cpu_platform_patch": False,
        "runner_output_extra": "",
        "resolve_layout": True,
    },
    "0.32.0": {
        "check_module": "vllm.v1.core.kv_cache_utils",
        "hash_module": "vllm.utils.hashing",
        "eos_on_request": False,
        "scheduler_block_size": True,
        "encoder_decoder_flag": True,
        "cpu_platform_patch": False,
        "runner_output_extra": "",
        "resolve_layout": True,
    },
    "0.11.0": {
        "check_module": "vllm.v1.core.kv_cache_utils",
        "hash_module": "vllm.utils",
        "eos_on_request": True,
        "scheduler_block_size": False,
        "encoder_decoder_flag": False,
        "cpu_platform_patch": True,
        "runner_output_extra": "logprobs=None, prompt_logprobs_dict={}, pooler_output=[]",
        "resolve_layout": False,
    },
}
"""What differs between the releases' scheduler APIs (read from their sources)."""

SUT_PREFIX = "vllm-v1@"
BROKEN_RE = re.compile(r"Rule broken at step (\d+) \[(\w+)\]: (.*?)\. Rule: ")
ADD_DEFAULTS: dict[str, Any] = {"eos_token_id": None, "stop_token_ids": [], "ignore_eos": False, "min_tokens": 0}


class ReproUnsupported(UnknownSut):
    """A SUT that has no engine API a reproduction could target."""


@dataclass
class RunOutcome:
    """The result of running one reproduction file with pytest."""

    status: str
    """``broken`` (a rule assertion), ``passed``, ``skipped`` (the engine refuses the config) or ``error``."""
    rule: str = ""
    step: int = 0
    message: str = ""
    output: str = ""

    def describe(self) -> str:
        if self.status == "broken":
            return f"fails: rule {self.rule} broken at step {self.step}: {self.message}"
        if self.status == "passed":
            return "passes: no rule is broken (not affected)"
        if self.status == "skipped":
            return "passes: the engine refuses this config at start-up (not affected)"
        return (
            "error: the file did not run to a verdict: " + self.output.strip().splitlines()[-1:][0][:300]
            if self.output.strip()
            else "error: no output"
        )


@dataclass
class ReproResult:
    """What ``make_repro`` found: the file text (or None) and the outcome per release."""

    version: str
    text: str | None
    outcome: RunOutcome
    kept_refused: bool = False
    others: dict[str, RunOutcome] = field(default_factory=dict)


# ------------------------------------------------------------------ the SUT


def get_repro_version(sut: str) -> str:
    """The vLLM release of ``vllm-v1@VERSION``; refuse every other SUT and a missing environment."""
    from schedconf.conformance.engines.vllm_env import is_vllm_env_ready, not_ready_message, supported_versions

    supported = ", ".join(f"{SUT_PREFIX}{v}" for v in supported_versions() if v in RELEASE_API)
    if not sut.startswith(SUT_PREFIX):
        raise ReproUnsupported(
            f"--sut {sut!r}: a reproduction is written in an engine's own API, and this SUT "
            f"has none; supported: {supported}"
        )
    version = sut.removeprefix(SUT_PREFIX)
    if version not in RELEASE_API or version not in supported_versions():
        raise ReproUnsupported(
            f"--sut {sut!r}: no reproduction template for vLLM {version or '(none)'}; supported: {supported}"
        )
    if not is_vllm_env_ready(version):
        from schedconf.conformance.adapters.vllm_v1 import VllmEnvNotReady

        raise VllmEnvNotReady(f"--sut {sut!r}: {not_ready_message(version)}")
    return version


# ------------------------------------------------------------- the events


def render_literal(value: Any) -> str:
    """A short Python literal: double-quoted strings, lists and dicts on one line."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(render_literal(v) for v in value)
        return (
            f"({inner},)"
            if isinstance(value, tuple) and len(value) == 1
            else (f"({inner})" if isinstance(value, tuple) else f"[{inner}]")
        )
    if isinstance(value, dict):
        return "{" + ", ".join(f"{render_literal(k)}: {render_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no literal for {type(value).__name__}")


def render_config_literal(config: dict[str, Any]) -> str:
    """The CONFIG dict, one field per line."""
    return "{\n" + "".join(f"    {render_literal(k)}: {render_literal(v)},\n" for k, v in config.items()) + "}"


def add_next_step(trace: Trace) -> Trace:
    """``trace`` with one more step after its last model output (no expected output: the engine's own answer)."""
    from dataclasses import replace as dc_replace

    last = max((e["step"] for e in trace.events if e["kind"] == "model_output"), default=0)
    if any(e["kind"] == "step" and e["step"] > last for e in trace.events):
        return trace
    return dc_replace(trace, events=[*trace.events, {"kind": "step", "step": last + 1}])


def is_added_step(event: dict[str, Any]) -> bool:
    """A step :func:`add_next_step` appended: no expected output and no expected error."""
    return event["kind"] == "step" and "expect" not in event and "expect_error" not in event


def render_step_story(expect: dict[str, Any]) -> str:
    """One line: what the trace records for a step (scheduled tokens, hits, resumes, preemptions)."""
    hits = {r["req_id"]: r["num_computed_tokens"] for r in expect.get("scheduled_new_reqs", [])}
    resumed = {r["req_id"]: r["num_computed_tokens"] for r in expect.get("scheduled_cached_reqs", []) if r["resumed"]}
    parts = []
    for rid, n in expect.get("num_scheduled_tokens", {}).items():
        note = ""
        if hits.get(rid):
            note = f" (prefix hit of {hits[rid]})"
        elif rid in resumed:
            note = f" (resumes with {resumed[rid]} computed)"
        parts.append(f"{rid} +{n}{note}")
    text = ", ".join(parts) or "nothing scheduled"
    if expect.get("preempted_req_ids"):
        text += "; preempted: " + ", ".join(expect["preempted_req_ids"])
    if expect.get("finished_req_ids"):
        text += "; finished: " + ", ".join(expect["finished_req_ids"])
    return text


def make_event_lines(trace: Trace, keep_refused: bool) -> tuple[list[str], bool]:
    """The literal EVENTS list, with comments; and whether a kept refused input is in it."""
    lines: list[str] = []
    kept = False
    if "expect_error" in trace.header:
        n = trace.config["max_model_len"] - 1
        lines.append(f"# The reference model refuses this config ({trace.header['expect_error']}); vLLM accepts it.")
        lines.append(
            f"# One lone request of {n} tokens, the largest a config with max_model_len "
            f"{trace.config['max_model_len']} must serve:"
        )
        lines.append(render_literal(("add", "a", list(range(n)), {"max_tokens": 1})) + ",")
        for step in range(1, LIVENESS_STEPS + 2):
            lines.append(render_literal(("schedule", step)) + ",")
            lines.append(render_literal(("output", step, {}, {})) + ",")
        return lines, kept
    for event in trace.events:
        kind, code = event["kind"], event.get("expect_error")
        if kind == "add_request":
            if code is not None and not (keep_refused and code in KEPT_REFUSALS):
                continue
            options = {"max_tokens": event["max_tokens"]}
            options.update({k: event[k] for k in ("priority", "arrival_time") if event[k]})
            options.update({k: event[k] for k, default in ADD_DEFAULTS.items() if event[k] != default})
            if code is not None:
                kept = True
                lines.append(f"# The reference refuses this add ({code}); vLLM's scheduler takes it:")
            lines.append(render_literal(("add", event["request_id"], event["prompt_token_ids"], options)) + ",")
        elif kind == "abort":
            if code is None:
                lines.append(render_literal(("abort", event["request_id"])) + ",")
        elif kind == "step":
            if code in SKIPPED_STEP_CODES:
                continue
            if code is not None:
                story = f"the reference expects this step to fail ({code})"
            elif is_added_step(event):
                story = "the step after the trace, where the safety check stopped"
            else:
                story = render_step_story(event["expect"])
            lines.append(f"# Step {event['step']}: {story}.")
            lines.append(render_literal(("schedule", event["step"])) + ",")
        elif kind == "model_output" and code is None:
            lines.append(
                render_literal(("output", event["step"], event["sampled_token_ids"], event["draft_token_ids"])) + ","
            )
    return lines, kept


# --------------------------------------------------------------- rendering


def render_repro(
    trace: Trace, version: str, checks: tuple[str, ...], keep_refused: bool = False, message: str = ""
) -> str:
    """The text of a reproduction file for vLLM ``version`` checking ``checks`` (and the crash rule)."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(
        loader=FileSystemLoader(Path(__file__).with_name("templates")),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    lines, _ = make_event_lines(trace, keep_refused)
    one_rule = checks[0] if len(checks) == 1 else ("engine_does_not_crash" if not checks else None)
    rule_names = ["engine_does_not_crash", *checks]
    story = trace.header.get("description") or f"the events of {Path(trace.path).name}"
    config = trace.config
    reserve = config.get("scheduler_reserve_full_isl")
    return env.get_template("repro_vllm.py.j2").render(
        version=version,
        title=RULE_TITLES[one_rule] if one_rule else "the rules every scheduler keeps",
        rule_text=RULES[one_rule] if one_rule else "each rule in RULES below",
        message=message,
        story=story,
        source=Path(trace.path).name if trace.path != "<memory>" else "TRACE",
        api=RELEASE_API[version],
        config_literal=render_config_literal(
            {
                k: config[k]
                for k in (
                    "block_size",
                    "num_gpu_blocks",
                    "max_num_batched_tokens",
                    "max_num_seqs",
                    "max_model_len",
                    "enable_chunked_prefill",
                    "long_prefill_token_threshold",
                    "enable_prefix_caching",
                    "policy",
                    "num_spec_tokens",
                )
            }
        ),
        reserve_full_isl=reserve if reserve is not None and version != "0.11.0" else None,
        filler=True,
        liveness_steps=LIVENESS_STEPS,
        event_lines=lines,
        checks=checks,
        next_step=any(is_added_step(e) for e in trace.events),
        rule_texts=[(name, RULES[name]) for name in rule_names],
        test_name=one_rule or "rules",
    )


# ----------------------------------------------------------------- running


def run_repro_file(path: Path, version: str, timeout_s: float = REPRO_TIMEOUT_S) -> RunOutcome:
    """Run ``path`` with pytest in vLLM ``version``'s interpreter (cwd: the file's folder, no PYTHONPATH)."""
    from schedconf.conformance.engines.vllm_env import driver_env, vllm_python

    env = {**os.environ, **driver_env(version)}
    env.pop("PYTHONPATH", None)  # the file must run on its own, without this checkout
    # the environment's own pytest (pinned in conformance/engines/envs/), as a maintainer would run it
    argv = [str(vllm_python(version)), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", path.name]
    try:
        proc = subprocess.run(
            argv,
            cwd=path.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return RunOutcome("error", output=f"timed out after {timeout_s:.0f} s")
    if "No module named pytest" in proc.stdout:
        raise ReproRunError(
            f"the vLLM {version} environment has no pytest: it was built before pytest was pinned; "
            f"rebuild it: schedconf env vllm {version}"
        )
    return get_outcome(proc.returncode, proc.stdout)


def get_outcome(returncode: int, output: str) -> RunOutcome:
    """Classify a pytest run of one reproduction file."""
    match = BROKEN_RE.search(output)
    if returncode == 1 and match:
        return RunOutcome(
            "broken", rule=match.group(2), step=int(match.group(1)), message=match.group(3), output=output
        )
    if returncode == 0:
        return RunOutcome("skipped" if " skipped" in output and " passed" not in output else "passed", output=output)
    return RunOutcome("error", output=output)


def compute_repro(trace: Trace, version: str, workdir: Path, timeout_s: float = REPRO_TIMEOUT_S) -> ReproResult:
    """Find the rule the engine breaks on ``trace``; the final file's text, or None if no rule breaks."""
    candidates = [False]
    if any(e["kind"] == "add_request" and e.get("expect_error") in KEPT_REFUSALS for e in trace.events):
        candidates.append(True)
    outcome = RunOutcome("passed")
    for keep in candidates:
        path = workdir / "candidate_repro.py"
        path.write_text(render_repro(trace, version, CHECKED_RULES, keep_refused=keep))
        outcome = run_repro_file(path, version, timeout_s)
        if outcome.status == "error":
            raise ReproRunError(f"the candidate reproduction did not run on vLLM {version}: " + _tail(outcome.output))
        if outcome.status == "broken":
            break
    else:
        return ReproResult(version, None, outcome)
    checks = () if outcome.rule == "engine_does_not_crash" else (outcome.rule,)
    text = render_repro(trace, version, checks, keep_refused=keep, message=f"at step {outcome.step}: {outcome.message}")
    path = workdir / "final_repro.py"
    path.write_text(text)
    final = run_repro_file(path, version, timeout_s)
    if final.status != "broken" or (final.rule, final.step) != (outcome.rule, outcome.step):
        raise ReproRunError(
            f"the reproduction broke rule {outcome.rule} at step {outcome.step} with every check, "
            f"but alone it {final.describe()}"
        )
    return ReproResult(version, text, final, kept_refused=keep)


class ReproRunError(Exception):
    """A reproduction file that did not run to a verdict (a harness or environment problem)."""


def _tail(output: str, lines: int = 6) -> str:
    return " | ".join(ln.strip() for ln in output.strip().splitlines()[-lines:])


def compute_other_releases(
    trace: Trace, version: str, workdir: Path, timeout_s: float = REPRO_TIMEOUT_S
) -> dict[str, RunOutcome]:
    """Run the reproduction, rendered for each other built release's API, with every check."""
    from schedconf.conformance.engines.vllm_env import is_vllm_env_ready

    others: dict[str, RunOutcome] = {}
    for other in RELEASE_API:
        if other == version or not is_vllm_env_ready(other):
            continue
        keep = any(e["kind"] == "add_request" and e.get("expect_error") in KEPT_REFUSALS for e in trace.events)
        path = workdir / f"other_{other.replace('.', '_')}.py"
        path.write_text(render_repro(trace, other, CHECKED_RULES, keep_refused=keep))
        others[other] = run_repro_file(path, other, timeout_s)
    return others


def make_repro(trace: Trace, sut: str, check_others: bool = True, timeout_s: float = REPRO_TIMEOUT_S) -> ReproResult:
    """Classify ``trace`` on ``sut`` (``vllm-v1@VERSION``) and, if a rule breaks, return the file's text."""
    version = get_repro_version(sut)
    if trace.is_in_flight or any(e["kind"] == "reset_prefix_cache" for e in trace.events):
        raise ReproUnsupported(
            "the reproduction template drives vLLM's scheduler one step at a time, without "
            "reset_prefix_cache: a trace with steps in flight or a reset is not supported yet"
        )
    with tempfile.TemporaryDirectory(prefix="schedconf-repro-") as tmp:
        result = compute_repro(trace, version, Path(tmp), timeout_s)
        if result.text is not None and check_others:
            result.others = compute_other_releases(trace, version, Path(tmp), timeout_s)
    return result


def get_divergence_where(trace: Trace, sut: str) -> str | None:
    """Where ``sut`` and the trace first disagree, in words (None: the trace replays).

    A divergence before the first step (a config refused or accepted against
    the header, an input event answered otherwise) has no step number.
    """
    from schedconf.conformance.adapters import make_sut
    from schedconf.conformance.checking.replay import FAIL, replay

    s = make_sut(sut)
    try:
        result = replay(trace, s, trace.header.get("comparison", "strict"))
    finally:
        s.close()
    if result.verdict != FAIL or result.divergence is None:
        return None
    step = result.divergence.step
    return f"at step {step}" if step is not None else "before the first step (at init or an input event)"


def render_no_repro_message(where: str | None) -> str:
    """The one line printed when no rule breaks (``where``: from :func:`get_divergence_where`)."""
    where = (
        f"the divergence {where} is a difference from the reference model (a model error or an "
        f"intended difference), not an engine bug"
        if where is not None
        else "the trace replays without divergence"
    )
    return f"the engine keeps every rule a reproduction can assert on this trace; {where}: no reproduction written"
