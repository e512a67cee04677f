"""schedconf's bounds on its inputs: what it reads, how large a config it models, how many workers it starts.

Every input of the harness is bounded, so that no file, stream or config can
make it read, allocate or wait without end. Each bound is a constant here,
refused past it with the rule and the number; ``docs/reference/bounds.md`` is the table
of them all (with the protocol's and the timeouts), and
``tests/harness/test_bounds.py`` checks each one.

These are schedconf's limits, not vLLM's rules: a config past them is one the
harness will not model, not one vLLM refuses (``spec/v1/config.py`` states
those). They are set well above real deployments.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 256 * 1024 * 1024
"""An input file (trace, scenario, run summary) larger than this is refused without being read whole."""

MAX_LINE_BYTES = 16 * 1024 * 1024
"""A trace line longer than this is refused (the protocol bounds a reply line the same way)."""

MAX_POOL_BLOCKS = 2**21
"""The most KV-cache blocks a config may ask for (``num_gpu_blocks``, v0's ``num_cpu_blocks``).

The reference model holds every block as an object (about 120 bytes each:
2,097,152 blocks are about 250 MB and 1.5 s to build, for each trace). A
small model on a 141 GB GPU has a few hundred thousand blocks of 16 tokens
(0.5 B parameters: 12 KB of KV cache per token, 11 M tokens, 0.7 M blocks);
the bound leaves room above that."""

POOL_FIELDS = ("num_gpu_blocks", "num_cpu_blocks")
"""The config fields whose size the model materialises (one object per block)."""

MAX_SCENARIO_TOKENS = 2**20
"""The most tokens one token list of a scenario file may spell (``0..1048575``): a range is expanded."""

MAX_SAFETY_STEPS = 20_000
"""The most steps a ``--comparison safety`` run drives; past it the verdict is unknown.

Under the safety comparison the scheduler's own schedule sets the run's
length (a request of ``max_tokens`` 10^9 decodes 10^9 steps), and checking
one step costs time that grows with the tokens held: 20,000 one-token steps
of one request take about 25 s. Generated traces need at most a few hundred
steps (412 in 600 traces of two profiles); strict and observable replays are
bounded by the trace's own events."""

MAX_DUMP_LINES = 40
"""A state dump in a divergence report shows at most this many lines ..."""

MAX_DUMP_LINE_CHARS = 400
"""... each cut to this many characters, saying how much was left out."""

MAX_RUN_ID_CHARS = 200
"""A ``--run-id`` is a folder name: printable, no separator, at most this long."""


class InputFileError(Exception):
    """A file the harness will not read: not a regular file, unreadable, or past a bound.

    ``expected`` and ``found`` say why, ``line`` where (0: the file as a whole).
    """

    def __init__(self, path: str | os.PathLike[str], expected: str, found: str, line: int = 0) -> None:
        self.path, self.expected, self.found, self.line = str(path), expected, found, line
        where = f"{path}:{line}" if line else f"{path}"
        super().__init__(f"{where}: expected {expected}, found {found}")


def read_bounded_bytes(path: str | os.PathLike[str], what: str = "file", max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``path``; a device, FIFO or folder, or a file over ``max_bytes``, is refused.

    The file is opened without blocking (a FIFO with no writer would block an
    ordinary open) and checked with ``fstat`` before anything is read; at
    most ``max_bytes + 1`` bytes are ever read, so an endless stream cannot
    fill the memory.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise InputFileError(p, f"a readable {what}", exc.strerror or str(exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(p, f"a regular {what}", describe_file_type(info.st_mode))
        if info.st_size > max_bytes:
            raise InputFileError(
                p, f"a {what} of at most {max_bytes} bytes (docs/reference/bounds.md)", f"{info.st_size} bytes"
            )
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise InputFileError(
                p,
                f"a {what} of at most {max_bytes} bytes (docs/reference/bounds.md)",
                "more (it grew while being read)",
            )
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_bounded_text(path: str | os.PathLike[str], what: str = "file", max_bytes: int = MAX_FILE_BYTES) -> str:
    """:func:`read_bounded_bytes` decoded as UTF-8 (a decoding error names the line and the byte)."""
    data = read_bounded_bytes(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputFileError(path, "UTF-8 text", f"byte 0x{data[exc.start]:02x}", line) from None


def describe_file_type(mode: int) -> str:
    """``a folder``, ``a FIFO (named pipe)``, ``a character device`` ..."""
    for test, words in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return words
    return "not a regular file"


def check_config_bounds(config: dict[str, Any]) -> tuple[str, str, str] | None:
    """``(field, expected, found)`` for the first config size past schedconf's bounds, else None."""
    for name in POOL_FIELDS:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_POOL_BLOCKS:
            return (
                f"config.{name}",
                f"at most {MAX_POOL_BLOCKS} blocks (schedconf's bound on the pool it models, docs/reference/bounds.md)",
                str(value),
            )
    return None


def compute_jobs(requested: int, num_traces: int, cpus: int | None) -> tuple[int, str | None]:
    """The worker processes to start for ``num_traces`` traces, and a warning to print, or None.

    Never more workers than traces (an idle worker only costs its start);
    more than the CPUs is allowed but said, since workers then share cores.
    """
    jobs = max(1, min(requested, num_traces))
    warning = None
    if cpus and jobs > cpus:
        warning = (
            f"--jobs {requested}: {jobs} workers on {cpus} CPU(s); they share the cores, so a campaign "
            f"is usually fastest with --jobs {cpus}"
        )
    return jobs, warning


def render_truncated_lines(
    text: str, max_lines: int = MAX_DUMP_LINES, max_chars: int = MAX_DUMP_LINE_CHARS
) -> list[str]:
    """The lines of a state dump, at most ``max_lines``, each at most ``max_chars``, saying what was left out."""
    lines = text.splitlines()
    out = []
    for line in lines[:max_lines]:
        if len(line) > max_chars:
            line = f"{line[:max_chars]} ... ({len(line) - max_chars} more characters)"
        out.append(line)
    if len(lines) > max_lines:
        out.append(f"... ({len(lines) - max_lines} more lines)")
    return out


def check_run_id(run_id: str) -> str | None:
    """What is wrong with ``run_id`` as a run folder's name, or None."""
    if not run_id or run_id in (".", ".."):
        return "expected a plain folder name"
    if "/" in run_id or os.sep in run_id:
        return "expected a plain folder name, without a path separator"
    bad = next((ch for ch in run_id if not ch.isprintable()), None)
    if bad is not None:
        return f"expected printable characters only, found {bad!r}"
    if len(run_id) > MAX_RUN_ID_CHARS:
        return f"expected at most {MAX_RUN_ID_CHARS} characters, found {len(run_id)}"
    return None
