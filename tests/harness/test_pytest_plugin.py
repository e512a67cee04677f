"""The pytest plugin in a scheduler's own suite: passes the reference, fails a broken one, one item per trace."""

import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


ROOT = HERE.parents[1]


def _plugin_args():
    """Load the plugin explicitly when schedconf is not installed (entry point absent)."""
    from importlib.metadata import entry_points

    installed = any(ep.name == "schedconf" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "schedconf.conformance.pytest_plugin"]


def _run(tmp_path, sut, *extra, examples=20):
    (tmp_path / "conftest.py").write_text("")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *_plugin_args(),
            f"--schedconf-sut={sut}",
            f"--schedconf-examples={examples}",
            f"--schedconf-out={tmp_path / 'out'}",
            *extra,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": f"{HERE}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )


def _items(stdout, outcome):
    """Names of the campaign items with this outcome (from -rA's short summary)."""
    return set(re.findall(rf"^{outcome} \S*(schedconf-campaign\[s\d+-\d{{5}}\])", stdout, re.M))


def test_plugin_passes_the_reference(tmp_path):
    r = _run(tmp_path, "reference", "--schedconf-corpus-filter=prefix_caching=false")
    assert r.returncode == 0, r.stdout + r.stderr
    assert " passed" in r.stdout


def test_reference_gives_one_passing_item_per_generated_trace(tmp_path):
    r = _run(tmp_path, "reference", "--schedconf-no-corpus", "-rA", examples=12)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _items(r.stdout, "PASSED") == {f"schedconf-campaign[s0-{i:05d}]" for i in range(12)}
    assert "12 passed" in r.stdout


def test_plugin_fails_a_broken_scheduler_with_the_trace_path(tmp_path):
    r = _run(tmp_path, "module:broken_adapter:BrokenSut", "--schedconf-no-corpus")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "failing trace:" in r.stdout and "minimal trace" in r.stdout
    assert list((tmp_path / "out").glob("session-*/*.min.jsonl"))


def test_every_failing_trace_is_its_own_failed_item(tmp_path):
    """Shards of 25 showed at most one failure each (2 for 50 traces); one item per trace shows them all."""
    r = _run(tmp_path, "mutant:fcfs_victim_head", "--schedconf-no-corpus", "-rA", examples=50)
    assert r.returncode == 1, r.stdout + r.stderr
    failed = _items(r.stdout, "FAILED")
    assert len(failed) > 2, r.stdout[-3000:]
    assert len(failed) + len(_items(r.stdout, "PASSED")) == 50
    (session,) = (tmp_path / "out").iterdir()
    assert f"this session's failing traces are in {session}/" in r.stdout
    for name in failed:
        index = name[len("schedconf-campaign[s0-") : -1]
        saved = session / f"campaign-s0-{index}.jsonl"
        minimal = session / f"campaign-s0-{index}.min.jsonl"
        assert saved.exists() and minimal.exists()
        assert f"failing trace: {saved}" in r.stdout
        assert re.search(rf"minimal trace \(\d+ events\): {re.escape(str(minimal))}", r.stdout)
    assert r.stdout.count("first divergence at step") >= len(failed)


def test_xdist_workers_and_the_deprecated_shard_size_give_the_same_items(tmp_path):
    serial = _run(tmp_path, "mutant:fcfs_victim_head", "--schedconf-no-corpus", "-rA", examples=50)
    spread = _run(
        tmp_path,
        "mutant:fcfs_victim_head",
        "--schedconf-no-corpus",
        "-rA",
        "-n",
        "2",
        "--schedconf-shard-size=10",
        examples=50,
    )
    assert spread.returncode == 1, spread.stdout + spread.stderr
    assert _items(spread.stdout, "FAILED") == _items(serial.stdout, "FAILED")
    assert len(_items(spread.stdout, "FAILED")) > 2
    assert "--schedconf-shard-size is deprecated and ignored" in spread.stdout + spread.stderr


def test_a_negative_number_of_examples_is_a_usage_error_not_a_green_run(tmp_path):
    r = _run(tmp_path, "reference", "--schedconf-no-corpus", examples=-5)
    assert r.returncode == 4, r.stdout + r.stderr  # pytest's usage error
    assert "--schedconf-examples: expected an integer >= 0, found -5" in r.stderr


def test_two_sessions_keep_their_own_traces(tmp_path):
    """Two sessions with the same --schedconf-out (one of them with xdist workers) save into two folders, and
    each failure message names a trace of its own session's folder: neither overwrites the other's."""
    first = _run(tmp_path, "mutant:fcfs_victim_head", "--schedconf-no-corpus", examples=15)
    second = _run(tmp_path, "mutant:fcfs_victim_head", "--schedconf-no-corpus", "-n", "2", examples=15)
    assert first.returncode == 1 and second.returncode == 1, first.stdout + second.stdout
    sessions = sorted((tmp_path / "out").iterdir())
    assert len(sessions) == 2 and all(s.name.startswith("session-") for s in sessions)
    named = [set(re.findall(r"^failing trace: (\S+\.jsonl)$", run.stdout, re.M)) for run in (first, second)]
    folders = [{Path(p).parent for p in paths} for paths in named]
    assert all(len(f) == 1 for f in folders), folders  # one folder per session, the workers' shared
    assert folders[0] != folders[1]
    for paths in named:
        assert paths and all(Path(p).exists() for p in paths)


STRICT_ADAPTER = '''
from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.spec.errors import InvalidConfig
from schedconf.spec.v1.config import OPTIONAL_FIELDS


class StrictSut(ReferenceSut):
    """The reference, written against the protocol before steps in flight, with no priority policy:
    it says so (forced_config, in_flight) and refuses what it cannot run."""

    forced_config = {"policy": "fcfs"}
    in_flight = False

    def start(self, config, profile):
        if config.get("policy") != "fcfs":
            raise InvalidConfig("invalid_policy", "this scheduler has no priority policy")
        newer = sorted(set(config) & set(OPTIONAL_FIELDS))
        if newer:
            raise InvalidConfig("unknown_config_field", f"unknown config field(s): {newer}")
        super().start(config, profile)
'''


def test_generated_items_respect_what_the_sut_declares(tmp_path):
    """As ``schedconf run`` does, the plugin draws its traces for the SUT: its forced config applied and, for a
    scheduler without steps in flight, the newer optional config fields at their defaults (left out of the
    header). Drawn without them, some of 40 traces of vllm-0.33 have a priority policy or such a field, and
    this scheduler refuses them: a false red."""
    (tmp_path / "strict_adapter.py").write_text(STRICT_ADAPTER)
    r = _run(tmp_path, "module:strict_adapter:StrictSut", "--schedconf-no-corpus", examples=40)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "40 passed" in r.stdout


def test_an_item_is_the_campaigns_trace_of_its_index():
    """Drawn alone, trace i is the campaign's trace i: with no forced value, and with forced values, pool
    headroom and no resets (the safety comparison) that leave every draw valid."""
    from schedconf.conformance.runs.campaign import CampaignSpec, generate_workload, generate_workloads

    for spec in (
        CampaignSpec(sut="reference", examples=30, seed=3),
        CampaignSpec(
            sut="reference",
            examples=30,
            seed=5,
            comparison="safety",
            config_overrides={"policy": "fcfs", "num_spec_tokens": 0},
            pool_headroom_blocks=1,
        ),
    ):
        campaign = generate_workloads(spec)
        assert [generate_workload(spec, i) for i in range(spec.examples)] == campaign
