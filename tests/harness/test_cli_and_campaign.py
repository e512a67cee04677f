"""The CLI end to end: exit codes, reports, JUnit, shrinking, robustness of campaigns."""

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from schedconf.conformance.cli import main
from schedconf.conformance.runs.campaign import CampaignSpec, run_campaign

HERE = Path(__file__).parent


def test_reference_campaign_passes(tmp_path, capsys):
    code = main(
        [
            "run",
            "--sut",
            "reference",
            "--examples",
            "30",
            "--seed",
            "3",
            "--out",
            str(tmp_path),
            "--run-id",
            "ok",
            "--quiet",
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "ok" / "summary.json").read_text())
    assert summary["status"] == "pass" and summary["passed"] + summary["discarded"] == 30
    for name in ("summary.md", "report.html", "sample.jsonl"):
        assert (tmp_path / "ok" / name).exists()
    html = (tmp_path / "ok" / "report.html").read_text()
    assert "<svg" in html and "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")


def test_in_flight_override_skips_configs_the_release_refuses(tmp_path, capsys):
    """--set max_concurrent_batches=2 under vllm-0.33: the drawn configs with spec decode (refused by the
    profile: in_flight_not_modelled) are replaced by fresh draws, and every trace runs two steps in flight."""
    code = main(
        [
            "run",
            "--sut",
            "reference",
            "--examples",
            "40",
            "--seed",
            "5",
            "--out",
            str(tmp_path),
            "--run-id",
            "pp",
            "--quiet",
            "--set",
            "max_concurrent_batches=2",
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "pp" / "summary.json").read_text())
    assert summary["passed"] + summary["discarded"] == 40
    assert summary["features"].get("steps_in_flight", 0) > 0


def test_a_scheduler_without_in_flight_support_gets_no_in_flight_trace(tmp_path, capsys):
    """Campaigns against a scheduler that does not declare in_flight force max_concurrent_batches 1."""
    code = main(
        [
            "run",
            "--sut",
            "module:broken_adapter:OneStepAtATimeSut",
            "--examples",
            "60",
            "--seed",
            "5",
            "--out",
            str(tmp_path),
            "--run-id",
            "sync",
            "--quiet",
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "sync" / "summary.json").read_text())
    assert summary["spec"]["config_overrides"].get("max_concurrent_batches") == 1
    assert summary["unknown"] == 0 and "steps_in_flight" not in summary["features"]


def test_broken_adapter_is_caught_shrunk_and_reported(tmp_path, capsys):
    """The kept broken adapter: exit 1, a minimal trace of <= 10 events, JUnit naming the trace."""
    junit = tmp_path / "junit.xml"
    code = main(
        [
            "run",
            "--sut",
            "module:broken_adapter:BrokenSut",
            "--examples",
            "40",
            "--seed",
            "1",
            "--out",
            str(tmp_path),
            "--run-id",
            "broken",
            "--junit-xml",
            str(junit),
            "--quiet",
            "--shrink-budget",
            "30",
        ]
    )
    assert code == 1
    summary = json.loads((tmp_path / "broken" / "summary.json").read_text())
    assert summary["failed"] > 0
    shrunk = [f for f in summary["failures"] if f["shrunk_file"]]
    assert shrunk and min(f["shrunk_events"] for f in shrunk) <= 10
    best = min(shrunk, key=lambda f: f["shrunk_events"])
    minimal = tmp_path / "broken" / best["shrunk_file"]
    assert minimal.exists()
    tree = ET.parse(junit).getroot()
    failures = [tc for tc in tree.iter("testcase") if tc.find("failure") is not None]
    assert len(failures) == summary["failed"]
    assert any(best["trace_file"] in (tc.find("failure").text or "") for tc in failures)
    # The minimal trace replays to the same failure, and passes on the reference.
    assert main(["replay", str(minimal), "--sut", "module:broken_adapter:BrokenSut"]) == 1
    assert main(["replay", str(minimal), "--sut", "reference"]) == 0


def test_shrink_command(tmp_path, capsys):
    run_campaign(
        CampaignSpec(
            sut="module:broken_adapter:BrokenSut",
            examples=30,
            seed=1,
            out_dir=str(tmp_path),
            run_id="r",
            quiet=True,
            shrink_budget_s=0,
        )
    )
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    original = tmp_path / "r" / summary["failures"][0]["trace_file"]
    out = tmp_path / "min.jsonl"
    assert (
        main(["shrink", str(original), "--sut", "module:broken_adapter:BrokenSut", "--out", str(out), "--budget", "30"])
        == 1
    )
    text = capsys.readouterr().out
    assert out.exists() and "first divergence" in text


def test_bad_input_exits_2_without_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind":"header","format":"schedconf-trace","version":1}\n')
    assert main(["replay", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:1: profile" in err and "Traceback" not in err
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["run", "--sut", "nonsense", "--examples", "1"]) == 2
    assert main(["report", str(tmp_path)]) == 2


def test_raising_sut_is_a_recorded_failure_and_the_campaign_goes_on(tmp_path):
    summary = run_campaign(
        CampaignSpec(
            sut="module:broken_adapter:RaisingSut",
            examples=12,
            seed=2,
            out_dir=str(tmp_path),
            run_id="raise",
            quiet=True,
            shrink_budget_s=0,
        )
    )
    assert summary["examples_run"] == 12
    crashes = [f for f in summary["failures"] if f["signature"] == "sut_error"]
    assert crashes
    report = (tmp_path / "raise" / crashes[0]["report_file"]).read_text()
    assert "boom in schedule()" in report and "Traceback" in report


def test_hanging_sut_hits_the_step_timeout(tmp_path):
    summary = run_campaign(
        CampaignSpec(
            sut="module:broken_adapter:HangingSut",
            examples=2,
            seed=2,
            step_timeout=0.5,
            out_dir=str(tmp_path),
            run_id="hang",
            quiet=True,
            shrink_budget_s=0,
        )
    )
    assert summary["failed"] >= 1
    report = (tmp_path / "hang" / summary["failures"][0]["report_file"]).read_text()
    assert summary["failures"][0]["signature"] == "sut_timeout" and "no answer to schedule within 0.5 s" in report


def test_interrupt_leaves_a_valid_report(tmp_path, monkeypatch):
    import schedconf.conformance.runs.campaign as campaign

    calls = {"n": 0}
    real = campaign.run_one

    def interrupting(index, workload, *following):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return real(index, workload, *following)

    monkeypatch.setattr(campaign, "run_one", interrupting)
    summary = run_campaign(CampaignSpec(sut="reference", examples=20, out_dir=str(tmp_path), run_id="int", quiet=True))
    on_disk = json.loads((tmp_path / "int" / "summary.json").read_text())
    assert on_disk["interrupted"] is True and on_disk["examples_run"] == 5 and summary["status"] == "interrupted"
    assert (tmp_path / "int" / "report.html").exists()


def test_generate_and_vectors_export(tmp_path, capsys):
    assert main(["generate", "--examples", "5", "--seed", "4", "--out", str(tmp_path / "g")]) == 0
    files = sorted((tmp_path / "g").glob("*.jsonl"))
    assert len(files) >= 4
    assert main(["replay", *map(str, files), "--sut", "reference"]) == 0
    assert main(["vectors", "export", str(tmp_path / "v"), "--profile", "vllm-0.32"]) == 0
    manifest = json.loads((tmp_path / "v" / "manifest.json").read_text())
    assert list(manifest["profiles"]) == ["vllm-0.32"]
    for entry in manifest["profiles"]["vllm-0.32"]:
        assert (tmp_path / "v" / "vllm-0.32" / entry["file"]).exists()


def test_jobs_two_gives_the_same_verdicts(tmp_path):
    one = run_campaign(
        CampaignSpec(
            sut="module:broken_adapter:BrokenSut",
            examples=20,
            seed=5,
            jobs=1,
            out_dir=str(tmp_path),
            run_id="j1",
            quiet=True,
            shrink_budget_s=0,
        )
    )
    two = run_campaign(
        CampaignSpec(
            sut="module:broken_adapter:BrokenSut",
            examples=20,
            seed=5,
            jobs=2,
            out_dir=str(tmp_path),
            run_id="j2",
            quiet=True,
            shrink_budget_s=0,
        )
    )
    assert sorted(f["index"] for f in one["failures"]) == sorted(f["index"] for f in two["failures"])
    assert one["passed"] == two["passed"]


@pytest.fixture(autouse=True)
def _importable_broken_adapter(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", str(HERE) + ":" + ":".join(p for p in sys.path if p))


def test_pool_headroom_adds_blocks_to_every_generated_pool_and_keeps_forced_ones():
    from dataclasses import replace

    from schedconf.conformance.runs.campaign import CampaignSpec, generate_workloads

    base = CampaignSpec(sut="reference", examples=40, seed=3)
    plain = generate_workloads(base)
    roomy = generate_workloads(replace(base, pool_headroom_blocks=2))
    assert len(plain) == len(roomy)
    grown = [
        (a.config.num_gpu_blocks, b.config.num_gpu_blocks)
        for a, b in zip(plain, roomy)
        if a.config.num_gpu_blocks != b.config.num_gpu_blocks
    ]
    # every pool that can take two more blocks gets them (a refused-config pool is drawn after, from its own stream)
    assert len(grown) >= len(plain) // 2 and all(b == a + 2 for a, b in grown)
    forced = generate_workloads(replace(base, pool_headroom_blocks=2, config_overrides={"num_gpu_blocks": 64}))
    assert {w.config.num_gpu_blocks for w in forced[:1]} == {64}  # a pool size the user forced stays as forced
