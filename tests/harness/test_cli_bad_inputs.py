"""The README's promise, for every subcommand: bad input exits 2 with one clear line, never a traceback.

Each row is a command line and words its error must contain. The rows cover
every subcommand, every numeric option's range (a typo in CI must never go
green: ``--examples 0`` used to print ``PASS: 0 passed``), files that are
missing, folders that are files, malformed traces and summaries, unknown
names, and unknown flags of a subcommand (answered with that subcommand's
usage, not the top-level one).
"""

from __future__ import annotations

import json
import sys

import pytest

from schedconf.conformance.cli import main

HEADER = {
    "kind": "header",
    "format": "schedconf-trace",
    "version": 1,
    "profile": "vllm-0.33",
    "seed": 0,
    "origin": "test",
}


def config(**fields):
    base = {
        "block_size": 4,
        "num_gpu_blocks": 17,
        "max_num_batched_tokens": 32,
        "max_num_seqs": 4,
        "max_model_len": 32,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "policy": "fcfs",
        "long_prefill_token_threshold": 0,
        "num_spec_tokens": 0,
        "num_lookahead_tokens": 0,
        "scheduler_reserve_full_isl": None,
    }
    base.update(fields)
    return base


@pytest.fixture
def files(tmp_path):
    (tmp_path / "a_file").write_text("not a folder\n")
    (tmp_path / "not_json.jsonl").write_text('{"kind": "header",\n')
    (tmp_path / "bad_config.jsonl").write_text(json.dumps({**HEADER, "config": config(block_size=-1)}) + "\n")
    (tmp_path / "bad_scenario.txt").write_text("add-request id=r1\n")
    from schedconf.conformance.traces.trace import write_trace
    from schedconf.conformance.workloads.config_limits import make_refused_config_traces

    write_trace(tmp_path / "valid.jsonl", make_refused_config_traces("vllm-0.33")[0][1])
    run = tmp_path / "broken_run"
    run.mkdir()
    (run / "summary.json").write_text("{broken")
    taken = tmp_path / "reports" / "taken"
    taken.mkdir(parents=True)
    (taken / "summary.json").write_text("{}")
    return tmp_path


# (argv, words the error must contain); {tmp} is the fixture's folder
ROWS = [
    (["--bogus"], "the following arguments are required: COMMAND"),
    (["run", "--sut", "reference", "--bogus"], "schedconf run: error: unrecognized arguments: --bogus"),
    (["replay", "{tmp}/x.jsonl", "--bogus"], "schedconf replay: error: unrecognized arguments"),
    (["vectors", "export", "{tmp}/v", "--bogus"], "schedconf vectors export: error: unrecognized arguments"),
    (["run", "--sut", "reference", "--examples", "0"], "--examples: expected an integer >= 1, found 0"),
    (["run", "--sut", "vllm-v1@0.10.2"], "use vllm-v0@0.10.2"),  # 0.10.2 ships the v0 scheduler
    (["run", "--sut", "vllm-v0@0.33.0", "--profile", "vllm-0.10"], "the legacy scheduler was removed in 0.11.0"),
    (["run", "--sut", "reference", "--examples", "-5"], "--examples: expected an integer >= 1, found -5"),
    (["run", "--sut", "reference", "--examples", "many"], "--examples: expected an integer, found 'many'"),
    (["run", "--sut", "reference", "--jobs", "0"], "--jobs: expected an integer >= 1, found 0"),
    (["run", "--sut", "reference", "--jobs", "-3"], "--jobs: expected an integer >= 1, found -3"),
    (["run", "--sut", "reference", "--timeout", "-1"], "--timeout: expected a finite number of seconds > 0"),
    (["run", "--sut", "reference", "--timeout", "0"], "--timeout: expected a finite number of seconds > 0"),
    (["run", "--sut", "reference", "--timeout", "nan"], "--timeout: expected a finite number of seconds > 0"),
    (
        ["run", "--sut", "reference", "--shrink-budget", "-1"],
        "--shrink-budget: expected a finite number of seconds >= 0",
    ),
    (["run", "--sut", "nonsense"], "unknown --sut 'nonsense'"),
    (["run", "--sut", "stdio:"], "expected stdio:'COMMAND ARGS'"),
    (["run", "--sut", "module:no_such_module_here:Factory"], "cannot import"),
    (["run", "--sut", "reference", "--profile", "vllm-9.9"], "--profile 'vllm-9.9': unknown profile"),
    (["run", "--sut", "reference", "--set", "nonsense"], "expected KEY=VALUE"),
    (
        ["run", "--sut", "reference", "--examples", "1", "--set", "block_size=-1", "--out", "{tmp}/r"],
        "block_size must be >= 1",
    ),
    (["run", "--sut", "reference", "--examples", "1", "--out", "{tmp}/a_file"], "--out {tmp}/a_file: not a folder"),
    (["run", "--sut", "reference", "--examples", "1", "--out", "/proc/no/such/place"], "cannot create the folder"),
    (
        ["run", "--sut", "reference", "--examples", "1", "--out", "{tmp}/reports", "--run-id", "taken"],
        "already holds a run",
    ),
    (
        ["run", "--sut", "reference", "--examples", "1", "--out", "{tmp}/reports", "--run-id", "../escape"],
        "expected a plain folder name",
    ),
    (["replay", "{tmp}/missing.jsonl"], "{tmp}/missing.jsonl"),
    (["replay", "{tmp}"], "{tmp}: (file): expected a regular trace file, found a folder"),
    (["replay", "{tmp}/not_json.jsonl"], "{tmp}/not_json.jsonl:1"),
    (["replay", "{tmp}/bad_config.jsonl"], "{tmp}/bad_config.jsonl:1: config.block_size"),
    (["replay", "{tmp}/bad_config.jsonl", "--timeout", "-2"], "--timeout: expected"),
    (["shrink", "{tmp}/missing.jsonl", "--sut", "reference"], "{tmp}/missing.jsonl"),
    (["shrink", "{tmp}/missing.jsonl", "--sut", "reference", "--budget", "0"], "--budget: expected"),
    (["generate", "--examples", "0", "--out", "{tmp}/g"], "--examples: expected an integer >= 1"),
    (["generate", "--examples", "2", "--out", "{tmp}/a_file"], "--out {tmp}/a_file: not a folder"),
    (["generate", "--examples", "2", "--profile", "nope", "--out", "{tmp}/g"], "unknown profile"),
    (["report", "{tmp}/missing_run"], "no summary.json"),
    (["report", "{tmp}/broken_run"], "not a schedconf run summary"),
    (["vectors", "export", "{tmp}/a_file"], "DIR {tmp}/a_file: not a folder"),
    (["scenario", "{tmp}/missing.txt"], "{tmp}/missing.txt"),
    (["scenario", "{tmp}/bad_scenario.txt"], "{tmp}/bad_scenario.txt:1"),
    (["env", "vllm", "9.9.9"], "no pinned environment"),
    (["mutants", "no_such_mutant"], "unknown mutant(s) no_such_mutant"),
    (["mutants", "--examples", "0"], "--examples: expected an integer >= 1"),
    (["repro", "{tmp}/not_json.jsonl", "--sut", "vllm-v1@0.33.0"], "{tmp}/not_json.jsonl:1"),
    (["repro", "{tmp}/valid.jsonl", "--sut", "stdio:./my-scheduler"], "supported: vllm-v1@"),
    (["demo", "--example", "nope"], "unknown example 'nope'"),
    (["diff", "--sut", "reference"], "the following arguments are required: --against"),
    (["diff", "--sut", "reference", "--against", "stdio:no-such-program-xq7"], "no such program on PATH"),
    (["demo", "--examples", "-1"], "--examples: expected an integer >= 0"),
    (["check", "{tmp}/missing.jsonl"], "{tmp}/missing.jsonl: cannot read"),
    (["record", "--", "true"], "the following arguments are required: --out"),
    (["record", "--out", "{tmp}/rec", "--", "/no/such/program-xq7"], "/no/such/program-xq7: No such file"),
    (["live", "--release", "9.9.9", "--requests", "1"], "no pinned environment"),
]


def run_main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors
        return int(exc.code or 0)


@pytest.mark.parametrize("argv,words", ROWS, ids=[" ".join(r[0])[:60] for r in ROWS])
def test_bad_input_exits_2_with_a_clear_line(argv, words, files, capsys, monkeypatch):
    monkeypatch.chdir(files)
    argv = [a.replace("{tmp}", str(files)) for a in argv]
    code = run_main(argv)
    captured = capsys.readouterr()
    err = captured.err + captured.out
    assert code == 2, err
    assert words.replace("{tmp}", str(files)) in err, err
    assert "Traceback" not in err


def test_every_subcommand_has_a_row():
    from schedconf.conformance.cli import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)  # noqa: SLF001
    covered = {argv[0] for argv, _ in ROWS}
    assert commands <= covered, commands - covered


def test_version(capsys):
    assert run_main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("schedconf ") and "trace format 1" in out and "protocol 1" in out


def test_two_runs_in_the_same_second_get_two_folders(tmp_path, monkeypatch):
    import schedconf.conformance.runs.campaign as campaign

    monkeypatch.setattr(campaign, "make_run_id", lambda spec: "run-fixed")  # the same second, twice
    first = campaign.run_campaign(campaign.CampaignSpec(sut="reference", examples=2, out_dir=str(tmp_path), quiet=True))
    second = campaign.run_campaign(
        campaign.CampaignSpec(sut="reference", examples=2, out_dir=str(tmp_path), quiet=True)
    )
    assert first["run_dir"] != second["run_dir"]
    assert (tmp_path / "run-fixed" / "summary.json").exists() and (tmp_path / "run-fixed-2" / "summary.json").exists()


def test_a_campaign_spec_of_zero_traces_is_refused():
    from schedconf.conformance.runs.campaign import CampaignSpec

    for bad in ({"examples": 0}, {"jobs": 0}, {"step_timeout": -1.0}, {"shrink_budget_s": -1.0}):
        with pytest.raises(ValueError):
            CampaignSpec(sut="reference", **bad)


def test_all_unknown_exits_2_as_documented(tmp_path, capsys):
    """A run where no trace is conclusive must not pass: exit 2, and the help says so."""
    from schedconf.conformance.cli import build_parser

    adapter = tmp_path / "unsupported_adapter.py"
    adapter.write_text(
        "from schedconf.conformance.sut import SutUnsupported\n"
        "class Nope:\n"
        "    name = 'nope'\n"
        "    def start(self, config, profile): raise SutUnsupported('no config is supported')\n"
        "    def close(self): pass\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        code = run_main(
            [
                "run",
                "--sut",
                "module:unsupported_adapter:Nope",
                "--examples",
                "3",
                "--out",
                str(tmp_path / "r"),
                "--quiet",
            ]
        )
    finally:
        sys.path.remove(str(tmp_path))
    out = capsys.readouterr().out
    assert code == 2 and out.startswith("UNKNOWN: 0 passed, 0 failed, 3 unknown"), out
    assert "every trace unknown" in build_parser().format_help()
