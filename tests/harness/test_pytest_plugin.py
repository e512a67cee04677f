"""The pytest plugin in a scheduler's own suite: passes the reference, fails a broken one."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


ROOT = HERE.parents[1]


def _plugin_args():
    """Load the plugin explicitly when schedconf is not installed (entry point absent)."""
    from importlib.metadata import entry_points

    installed = any(ep.name == "schedconf" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "conformance.pytest_plugin"]


def _run(tmp_path, sut, *extra):
    (tmp_path / "conftest.py").write_text("")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *_plugin_args(), f"--schedconf-sut={sut}",
         "--schedconf-examples=20", "--schedconf-shard-size=10", f"--schedconf-out={tmp_path / 'out'}", *extra],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={"PYTHONPATH": f"{HERE}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )


def test_plugin_passes_the_reference(tmp_path):
    r = _run(tmp_path, "reference", "--schedconf-corpus-filter=prefix_caching=false")
    assert r.returncode == 0, r.stdout + r.stderr
    assert " passed" in r.stdout


def test_plugin_fails_a_broken_scheduler_with_the_trace_path(tmp_path):
    r = _run(tmp_path, "module:broken_adapter:BrokenSut", "--schedconf-no-corpus")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "failing trace:" in r.stdout and "minimal trace" in r.stdout
    assert list((tmp_path / "out").glob("*.min.jsonl"))
