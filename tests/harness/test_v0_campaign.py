"""v0 campaigns end to end: `schedconf run --profile vllm-0.10` on the reference, and the CLI around it."""

import json

import pytest

from schedconf.conformance.cli import main
from schedconf.conformance.runs.campaign import CampaignSpec, generate_workloads, run_campaign
from schedconf.conformance.traces.trace import read_trace
from schedconf.conformance.workloads.workload_v0 import V0_COVERAGE


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    code = main(
        [
            "run",
            "--profile",
            "vllm-0.10",
            "--examples",
            "50",
            "--seed",
            "7",  # --sut: reference by default
            "--out",
            str(out),
            "--run-id",
            "v0",
            "--quiet",
        ]
    )
    return code, out / "v0"


def test_a_v0_campaign_of_50_traces_passes_on_the_reference(run):
    code, run_dir = run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and summary["status"] == "pass"
    assert summary["failed"] == 0 and summary["unknown"] == 0
    # livelocks the reference cannot finish are discarded, never more than a few
    assert summary["passed"] + summary["discarded"] == 50 and summary["passed"] >= 45
    sample = read_trace(run_dir / "sample.jsonl")
    assert sample.scheduler == "v0" and sample.profile == "vllm-0.10"


def test_the_summary_states_the_v0_coverage_shares(run):
    _, run_dir = run
    summary = json.loads((run_dir / "summary.json").read_text())
    coverage = summary["coverage"]
    assert set(coverage) == set(V0_COVERAGE)
    for name, share in coverage.items():
        assert share == round(summary["features"].get(name, 0) / summary["examples_run"], 3)
    # the generator reaches every one of them in 50 traces
    assert all(share > 0 for share in coverage.values()), coverage
    md = (run_dir / "summary.md").read_text()
    assert "## v0 coverage" in md
    rows = [f"| {name} | {round(100 * coverage[name], 1)}% |" for name in V0_COVERAGE]
    assert "\n".join(rows) in md  # in the order
    html = (run_dir / "report.html").read_text()
    assert "<h2>v0 coverage</h2>" in html and "v0-steps" in html  # the sample trace's step table


def test_the_same_seed_draws_the_same_v0_workloads():
    spec = CampaignSpec(sut="reference", profile="vllm-0.10", examples=5, seed=11)
    first, second = generate_workloads(spec), generate_workloads(spec)
    assert first == second
    assert all(w.profile == "vllm-0.10" and hasattr(w.config, "num_cpu_blocks") for w in first)


def test_config_overrides_and_the_hypothesis_generator_work_for_v0(tmp_path):
    summary = run_campaign(
        CampaignSpec(
            sut="reference",
            profile="vllm-0.10",
            examples=6,
            seed=2,
            generator="hypothesis",
            out_dir=str(tmp_path),
            run_id="h",
            quiet=True,
            config_overrides={"enable_prefix_caching": False},
        )
    )
    assert summary["status"] == "pass" and summary["examples_run"] == 6
    failing = tmp_path / "h" / "sample.jsonl"
    assert read_trace(failing).config["enable_prefix_caching"] is False


def test_the_cli_generates_replays_and_exports_v0_traces(tmp_path, capsys):
    assert (
        main(["generate", "--profile", "vllm-0.10", "--examples", "4", "--seed", "3", "--out", str(tmp_path / "g")])
        == 0
    )
    files = sorted((tmp_path / "g").glob("*.jsonl"))
    assert files and all(read_trace(f).scheduler == "v0" for f in files)
    assert main(["replay", *map(str, files), "--sut", "reference"]) == 0
    assert main(["vectors", "export", str(tmp_path / "v"), "--profile", "vllm-0.10"]) == 0
    manifest = json.loads((tmp_path / "v" / "manifest.json").read_text())
    assert list(manifest["profiles"]) == ["vllm-0.10"] and manifest["v0_corpus_version"] >= 1
    for entry in manifest["profiles"]["vllm-0.10"]:
        assert (tmp_path / "v" / "vllm-0.10" / entry["file"]).exists()
    capsys.readouterr()
    # v0 fields for --set under a v0 profile; a v1-only field is refused with the v0 list
    assert (
        main(
            [
                "run",
                "--sut",
                "reference",
                "--profile",
                "vllm-0.10",
                "--examples",
                "1",
                "--set",
                "num_spec_tokens=1",
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 2
    )
    assert "num_cpu_blocks" in capsys.readouterr().err
