"""The recorder's line writer: lines reach the file in order, and a call that raises is on disk before it returns.

The recorder writes on a thread of its own (``conformance/live/recorder.py``,
``LineWriter``) so that the file's write leaves the engine's step. What must
not change with that: the order of the lines, nothing lost at a drain (the
process's exit drains), and the line of a scheduler call that raised written
before the exception reaches the engine, which may die of it.
"""

from __future__ import annotations

import json
import time

from schedconf.conformance.live.recorder import LineWriter, Recording


def test_lines_are_written_in_order_and_all_of_them_by_a_drain(tmp_path):
    path = tmp_path / "rec.jsonl"
    writer = LineWriter(str(path))
    for i in range(2000):
        writer.put(f'{{"seq":{i}}}\n')
    writer.drain()
    assert [json.loads(line)["seq"] for line in path.read_text().splitlines()] == list(range(2000))


class _FakeScheduler:
    """Enough of a scheduler for Recording's start line (read_config fails on it: an ``error`` start line)."""


class _SlowFile:
    """A file whose every write takes 0.3 s: a line is on disk at once only if someone waited for it."""

    def __init__(self, file):  # noqa: ANN001
        self.file = file

    def write(self, text: str) -> int:
        time.sleep(0.3)
        return self.file.write(text)

    def flush(self) -> None:
        self.file.flush()


def test_a_call_that_raised_is_on_disk_before_the_recorder_returns(tmp_path):
    rec = Recording(_FakeScheduler(), str(tmp_path))
    rec.writer.drain()
    rec.writer.file = _SlowFile(rec.writer.file)
    rec.emit({"call": "schedule", "raised": "AssertionError: boom"}, lambda: {"step": 1})
    lines = [json.loads(line) for line in open(rec.path)]
    assert [line["seq"] for line in lines] == [0, 1]
    assert lines[1]["call"] == "schedule" and lines[1]["raised"] == "AssertionError: boom"
    # A call that did not raise only queues its line: with the slow file it is not on disk yet.
    rec.emit({"call": "schedule"}, lambda: {"step": 2})
    assert len(open(rec.path).read().splitlines()) == 2
    rec.writer.drain()
    assert len(open(rec.path).read().splitlines()) == 3
