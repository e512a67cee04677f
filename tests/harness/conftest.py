"""Fixtures the fault-injection suites share."""

from __future__ import annotations

import os
import signal

import pytest

from tests.harness.test_fault_injection import survivors


@pytest.fixture
def pid_dir(tmp_path, monkeypatch):
    """A folder where every process a misbehaving scheduler starts records its pid (``$FAULTY_SUT_PIDS``);
    whatever is still alive at the end is killed, even when the test fails."""
    folder = tmp_path / "pids"
    folder.mkdir()
    monkeypatch.setenv("FAULTY_SUT_PIDS", str(folder))
    yield folder
    for pid in survivors(folder):
        os.kill(pid, signal.SIGKILL)
