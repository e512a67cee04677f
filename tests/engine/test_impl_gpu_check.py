"""gpu_checks/engine_gpu.py without a GPU: it says so and exits 0; its logic runs as a CPU dry run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "schedconf.gpu_checks.engine_gpu", "--out", str(tmp_path), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_without_a_gpu_it_checks_nothing_and_says_so(tmp_path):
    proc = _run([], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device" in proc.stdout
    report = json.loads((tmp_path / "engine_gpu.json").read_text())
    assert report["verdict"] == "skipped" and report["ran"] is False
    assert "throughput" not in report


def test_cpu_dry_run_runs_every_stage(tmp_path):
    # The exported corpus is checked by test_impl_engine.py; here an empty folder keeps the run short.
    proc = _run(
        [
            "--device",
            "cpu",
            "--allow-cpu",
            "--seeds",
            "2",
            "--batch-sizes",
            "1,4",
            "--corpus",
            str(tmp_path / "no-corpus"),
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "engine_gpu.json").read_text())
    assert report["info"]["dry_run_on_cpu"] is True
    assert report["verdict"] == "pass"
    assert report["conformance"]["failed"] == 0 and report["conformance"]["workloads"] >= 3
    assert report["replay"]["verdicts"] == {"pass": report["replay"]["traces"]}
    assert report["replay"]["max_abs_logit_diff"] < 1e-12
    rows = report["throughput"]["rows"]
    assert [r["batch_size"] for r in rows] == [1, 4]
    assert all(r["generated_tokens"] == r["batch_size"] * report["throughput"]["output_len"] for r in rows)
    assert all(r["tokens_per_s"] > 0 for r in rows)
