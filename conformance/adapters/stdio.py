"""A scheduler in a subprocess, driven over the JSON-lines protocol (PROTOCOL.md).

A scheduler under test misbehaves by nature, so nothing it does may hang the
harness, outlive it, or be blamed on the wrong request:

* every call has a timeout (``timeout_s``; ``startup_timeout_s`` for the
  first ``init`` of a new process) and an optional absolute ``deadline``
  (the harness's budget for a trace or a shrink); writes to its stdin time
  out too, for a process that stops reading;
* the process runs in its own session (process group): a timeout, a
  protocol error or ``close`` kills the whole group, grandchildren included;
* one reader thread per process, with a queue of its own: after a kill, a
  late answer of the old process can never be read as the reply to a
  request sent to the new one; any broken reply (not JSON, a stray line, a
  wrong id, too long, not matching the protocol's schema) kills the process,
  so the next trace starts from a fresh one;
* every reply is validated against ``protocol.schema.json`` (error codes
  against the spec's table), with ``stdout line N: field: expected ...``;
* an exit is reported with its exit code or signal and the stderr tail.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import queue
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedconf.conformance.protocol import PROTOCOL_VERSION, expand_columns, validate_reply
from schedconf.conformance.protocol_server import render_line
from schedconf.conformance.sut import SutInputError, SutUnsupported

try:
    import fcntl
except ImportError:  # not on Windows
    fcntl = None  # type: ignore[assignment]

DEFAULT_TIMEOUT_S = 30.0
SUPERVISOR = str(Path(__file__).with_name("supervisor.py"))
"""Every scheduler command runs under it (conformance/adapters/supervisor.py): nothing it starts outlives it."""
MAX_REPLY_BYTES = 16 * 1024 * 1024
"""A reply line longer than this is a protocol error (a runaway scheduler must not exhaust memory)."""
STDERR_LINES_KEPT = 200
STDERR_LINE_CHARS = 2000


class SutProtocolError(Exception):
    """The subprocess broke the protocol; carries its stderr. Kind ``protocol_error``."""

    kind = "protocol_error"

    def __init__(self, message: str, stderr: str = "") -> None:
        self.stderr = stderr
        self.plain_message = message
        super().__init__(message + (f"\n--- scheduler stderr (last lines) ---\n{stderr}" if stderr else ""))


class SutTimeout(SutProtocolError):
    """No answer within the call's timeout or the harness's deadline (process killed)."""

    kind = "sut_timeout"


class SutInternalError(SutProtocolError):
    """The scheduler answered ``internal``: it failed on a valid input (a scheduler error, not a protocol one).

    ``reason`` is the error's own message, as the scheduler wrote it.
    """

    kind = "sut_error"

    def __init__(self, message: str, stderr: str = "", reason: str = "") -> None:
        super().__init__(message, stderr)
        self.reason = reason


class SutExited(SutProtocolError):
    """The process exited or could not be started."""

    kind = "sut_exited"


@dataclass
class _Batch:
    """A planned ``batch`` request: its calls, how many were answered, and its id once sent."""

    calls: list[tuple[str, dict[str, Any]]]
    next_index: int = 0
    msg_id: int | None = None
    while_running: Callable[[], None] | None = None

    def is_next(self, method: str, params: dict[str, Any]) -> bool:
        """Is this call the batch's next one?"""
        return self.next_index < len(self.calls) and self.calls[self.next_index] == (method, params)


_PLANNED: dict[str, Any] = {"outputs": [], "success": False}
"""What a call returns while a batch is being planned (enough for the adapter methods to return)."""


@dataclass
class _Process:
    """One child process and what its reader threads collected (never shared with a later process)."""

    proc: subprocess.Popen[bytes]
    replies: queue.Queue[tuple[int, bytes] | None] = field(default_factory=queue.Queue)
    paced_lines: int = 0  # lines of a batch still to come (set when a batch is sent; see _read_replies)
    wanted: threading.Event = field(default_factory=threading.Event)  # the harness waits for a line
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_LINES_KEPT))
    messages: int = 0


_LIVE: set[int] = set()
"""Process groups started by this process and not yet killed (killed at exit, whatever happens)."""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _LIVE.discard(pid)


def kill_all_started() -> None:
    """Kill every scheduler process group this process started (at exit, and on a worker's way out)."""
    for pid in list(_LIVE):
        try:
            os.kill(pid, signal.SIGTERM)  # the supervisor: it kills the daemons outside the group too
        except OSError:
            pass
    for pid in list(_LIVE):
        _kill_group(pid)


def stop_supervised(proc: subprocess.Popen[bytes]) -> None:
    """Stop a scheduler started under the supervisor: SIGTERM to the supervisor, which kills the command and
    every descendant (detached daemons included) and exits; then SIGKILL to the whole process group, in case
    the supervisor itself could not act."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
    _kill_group(proc.pid)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


atexit.register(kill_all_started)


def describe_ending(code: int | None) -> str:
    """``exited with exit code 3``, ``was killed by SIGABRT``, or ``closed its stdout`` (still running)."""
    if code is None:
        return "closed its stdout"
    return f"was {describe_exit(code)}" if code < 0 else f"exited with {describe_exit(code)}"


def describe_exit(code: int | None) -> str:
    """``exit code 3``, ``killed by SIGABRT`` or ``still running``."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class StdioSut:
    """Starts ``command`` and speaks the protocol with it.

    One subprocess serves many traces: ``start`` sends a fresh ``init`` for
    every trace. A timeout or any broken reply kills it; the next ``start``
    starts a new one.
    """

    enforces_timeouts = True
    """The harness sets ``timeout_s`` and ``deadline`` instead of using alarms around the calls."""

    honours_late_unsupported = False
    """Is ``unsupported`` after ``init`` taken as *unknown*? Never for a scheduler under test (it could give
    up wherever it would fail); True only in this repository's engine adapters, whose drivers answer it
    for inputs their fake model runner cannot produce (a class attribute: no process can claim it)."""

    def __init__(
        self,
        command: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        env: dict[str, str] | None = None,
        name: str | None = None,
        startup_timeout_s: float | None = None,
    ) -> None:
        self.command = command
        self.argv = shlex.split(command)
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.deadline: float | None = None
        self.env = env
        self.name = name or f"stdio:{command}"
        self.child: _Process | None = None
        self._last_stderr: deque[str] = deque(maxlen=STDERR_LINES_KEPT)
        self._next_id = 0
        self.capabilities: dict[str, Any] = {}
        self.use_batch = os.environ.get("SCHEDCONF_PROTOCOL_BATCH", "1") != "0"
        """Send a trace's calls as one ``batch`` where the scheduler takes it (PROTOCOL.md); off, one
        request per call, as for a scheduler without the capability."""
        self.use_columns = os.environ.get("SCHEDCONF_PROTOCOL_COLUMNS", "1") != "0"
        """Ask at ``init`` for the column form of the lists of requests (PROTOCOL.md); off, never asked."""
        self.columns = False
        """Did the scheduler's last ``init`` reply list ``capabilities.columns`` (after being asked)?"""
        self._planning: list[tuple[str, dict[str, Any]]] | None = None
        self._batch: _Batch | None = None
        self.last_stats: dict[str, Any] | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.child.proc if self.child else None

    # -------------------------------------------------------------- process

    def _spawn(self) -> None:
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        argv = [sys.executable, "-I", "-S", SUPERVISOR, str(os.getpid()), "--", *self.argv]
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise SutExited(f"{self.name}: cannot start {self.command!r}: {exc.strerror or exc}") from None
        _LIVE.add(proc.pid)
        assert proc.stdin is not None and proc.stdout is not None
        os.set_blocking(proc.stdin.fileno(), False)
        for pipe in (proc.stdin, proc.stdout):
            _widen_pipe(pipe.fileno())
        child = _Process(proc)
        self._last_stderr = child.stderr
        threading.Thread(target=_read_replies, args=(child,), daemon=True).start()
        threading.Thread(target=_read_stderr, args=(child,), daemon=True).start()
        self.child = child

    def stderr_tail(self, n: int = 40) -> str:
        """The last ``n`` lines the (current or last) process wrote to stderr."""
        return "\n".join(list(self._last_stderr)[-n:])

    def kill(self) -> None:
        """Kill the process and its whole group; a later ``start`` starts a new one."""
        child, self.child = self.child, None
        self._batch = None
        if child is None:
            return
        stop_supervised(child.proc)
        for stream in (child.proc.stdin, child.proc.stdout, child.proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        time.sleep(0)  # let the reader threads see the closed pipes

    def _broken(self, exc_type: type[SutProtocolError], message: str) -> SutProtocolError:
        """Kill the process (its state is unknown now) and build the error to raise."""
        time.sleep(0.05)  # a crashing process may still be writing its last words to stderr
        self.kill()
        return exc_type(f"{self.name}: {message}", self.stderr_tail())

    def _wait_for_stderr(self, limit_s: float = 1.0) -> None:
        """Let the stderr reader take in what the process wrote before its reply (a traceback before an
        ``internal`` answer): the two pipes are read by two threads, so the reply can arrive first."""
        child = self.child
        if child is None or child.proc.stderr is None:
            return
        deadline = time.monotonic() + limit_s
        fd = child.proc.stderr.fileno()
        try:
            while time.monotonic() < deadline and select.select([fd], [], [], 0)[0]:
                time.sleep(0.005)  # bytes still in the pipe: the reader has not taken them yet
        except (OSError, ValueError):
            return
        time.sleep(0.005)  # the line it is taking in

    def _limit(self, timeout_s: float) -> tuple[float, str]:
        """Seconds to wait for an answer, and what the limit is called in a message."""
        if self.deadline is not None and self.deadline - time.monotonic() < timeout_s:
            return max(self.deadline - time.monotonic(), 0.0), "the harness's deadline"
        return timeout_s, f"{timeout_s:g} s"

    def _exited(self, method: str) -> SutProtocolError:
        assert self.child is not None
        try:
            code = self.child.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        return self._broken(SutExited, f"the process {describe_ending(code)} before answering {method}")

    def call(self, method: str, params: dict[str, Any], timeout_s: float | None = None) -> Any:
        """Send one request and return its validated result (SutInputError for an error reply).

        While a batch is planned (:meth:`plan_batch`), a call that is the plan's next one is answered
        from the batch's replies instead (the first such call sends the batch). ``init`` and ``shutdown``
        first finish the batch (:meth:`end_batch`); any other call off the plan is the harness's bug
        (RuntimeError, the process killed).
        """
        if self._planning is not None:
            self._planning.append((method, params))
            return _PLANNED
        batch = self._batch
        if batch is not None:
            if batch.is_next(method, params):
                return self._call_batched(batch, method, timeout_s)
            if method not in ("init", "shutdown"):
                # The scheduler has run the planned calls ahead of this one: answering it now would answer
                # it in another state. A plan that is not the replay's own calls is the harness's bug.
                self.kill()
                raise RuntimeError(f"{self.name}: {method} is not the next call of the planned batch")
            self.end_batch()
        msg_id, started, wait_s, limit_words = self._send(method, params, timeout_s)
        return self._receive(method, msg_id, started, wait_s, limit_words)

    def _running_child(self) -> _Process:
        """The live process, or SutExited (the process is gone or was never started)."""
        child = self.child
        if child is None or child.proc.poll() is not None:
            code = child.proc.poll() if child else None
            self.kill()
            state = describe_exit(code) if child else "not started"
            raise SutExited(f"{self.name}: the scheduler process is not running ({state})", self.stderr_tail())
        return child

    def _send(
        self, method: str, params: dict[str, Any], timeout_s: float | None, label: str = ""
    ) -> tuple[int, float, float, str]:
        """Write one request; its id, when it was sent, the seconds to wait for its answer and their name.
        ``label`` names the call in messages (default: ``method``; a batch is named by its first call)."""
        child = self._running_child()
        self._next_id += 1
        msg_id = self._next_id
        child.messages += 1
        wait_s, limit_words = self._limit(timeout_s or self.timeout_s)
        line = render_line({"id": msg_id, "method": method, "params": params})
        started = time.monotonic()
        label = label or method
        try:
            _write_all(child.proc, (line + "\n").encode(), started + wait_s)
        except TimeoutError:
            raise self._broken(
                SutTimeout, f"no answer to {label} within {limit_words}: it stopped reading its stdin (process killed)"
            ) from None
        except (BrokenPipeError, OSError):
            raise self._exited(label) from None
        return msg_id, started, wait_s, limit_words

    def _read_reply(
        self, label: str, msg_id: int, started: float, wait_s: float, limit_words: str
    ) -> tuple[dict[str, Any], str]:
        """The next reply line as an object with the id ``msg_id``, and where it was read (for messages)."""
        child = self.child
        assert child is not None
        if child.paced_lines > PACED_TAIL and child.replies.empty():
            child.wanted.set()  # a reader between looks into the pipe looks now (it waits nowhere else)
        try:
            item = child.replies.get(timeout=max(wait_s - (time.monotonic() - started), 0.0))
        except queue.Empty:
            raise self._broken(SutTimeout, f"no answer to {label} within {limit_words} (process killed)") from None
        if item is None:
            raise self._exited(label)
        stdout_line, raw = item
        where = f"reply to {label} (request id {msg_id}, stdout line {stdout_line})"
        if len(raw) > MAX_REPLY_BYTES:
            raise self._broken(SutProtocolError, f"{where}: longer than {MAX_REPLY_BYTES} bytes")
        try:
            reply = json.loads(
                raw.decode("utf-8"), parse_constant=_refuse_constant, object_pairs_hook=_refuse_duplicate_keys
            )
        except DuplicateKey as exc:
            raise self._broken(
                SutProtocolError, f"{where}: key {str(exc)!r} twice in one object (each key once)"
            ) from None
        except RecursionError:
            raise self._broken(SutProtocolError, f"{where}: JSON nested too deeply to read") from None
        except (UnicodeDecodeError, ValueError):
            shown = raw[:200].decode("utf-8", "replace").rstrip("\n")
            raise self._broken(
                SutProtocolError,
                f"{where}: not JSON (stdout carries only protocol lines; write logs to stderr): {shown!r}",
            ) from None
        if not isinstance(reply, dict):
            raise self._broken(
                SutProtocolError, f"{where}: expected a JSON object with id {msg_id}, found {json.dumps(reply)[:80]}"
            )
        if "id" not in reply:
            raise self._broken(SutProtocolError, f"{where}: the reply has no id (expected id {msg_id})")
        if reply["id"] != msg_id:
            raise self._broken(
                SutProtocolError, f"{where}: wrong id: expected {msg_id}, found {json.dumps(reply['id'])[:80]}"
            )
        return reply, where

    def _receive(
        self, method: str, msg_id: int, started: float, wait_s: float, limit_words: str, index: int | None = None
    ) -> Any:
        """Read, check and return the answer to ``method`` (call ``index`` of a batch, when given)."""
        reply, where = self._read_reply(method, msg_id, started, wait_s, limit_words)
        if index is not None:
            found = reply.pop("index", None)
            if found != index:
                shown = "no index (the batch's closing line)" if found is None else json.dumps(found)[:80]
                raise self._broken(SutProtocolError, f"{where}: expected the reply with index {index}, found {shown}")
        problem = (expand_columns(method, reply) if self.columns else None) or self.check_reply(method, reply)
        if problem:
            raise self._broken(SutProtocolError, f"{where}: {problem}")
        if "error" in reply:
            err = reply["error"]
            code, message = err["code"], err.get("message", "")
            if code == "unsupported" and (method == "init" or self.honours_late_unsupported):
                raise SutUnsupported(message or "unsupported")
            if code == "unsupported":
                raise self._broken(
                    SutProtocolError,
                    f"{where}: answered unsupported ({message or 'no reason'}): "
                    "unsupported is an answer to init only; once a trace has "
                    "started, the scheduler answers every call (PROTOCOL.md)",
                )
            if code == "internal":
                self._wait_for_stderr()
                raise SutInternalError(
                    f"{self.name}: internal error in {method}: {message}", self.stderr_tail(), reason=message
                )
            raise SutInputError(code, message)
        return reply["result"]

    # ---------------------------------------------------------------- batch

    @property
    def supports_batch(self) -> bool:
        """Are a trace's calls sent as one ``batch``? When the scheduler's ``init`` reply lists
        ``capabilities.batch``, unless ``use_batch`` is off (``SCHEDCONF_PROTOCOL_BATCH=0``)."""
        return self.use_batch and bool(self.capabilities.get("batch"))

    @contextmanager
    def planning(self) -> Iterator[list[tuple[str, dict[str, Any]]]]:
        """Record, instead of sending, the requests the calls made inside this block would send.

        The calls return placeholders; what they record is what the same calls will send later (the
        harness plans a trace's replay with the very code that replays it).
        """
        recorded: list[tuple[str, dict[str, Any]]] = []
        self._planning = recorded
        try:
            yield recorded
        finally:
            self._planning = None
            self.last_stats = None

    def plan_batch(
        self, calls: list[tuple[str, dict[str, Any]]], while_running: Callable[[], None] | None = None
    ) -> None:
        """Answer the coming calls, while they are these, from one ``batch`` request (PROTOCOL.md).

        Nothing is sent yet: the first of these calls sends the whole batch, so a scheduler that is gone
        or stops reading is reported at that call, as it would be without a batch. Each call then reads
        its own reply line, with the call's own timeout and checks. A scheduler without
        ``capabilities.batch`` is called one request at a time, as before.

        ``while_running`` is called once, right after the batch is sent, before the first reply is read:
        the harness's own work (a campaign generates its next trace) while the scheduler runs the batch.
        It must not raise but to stop everything (an interrupt); its time is not charged to the call.
        """
        self.end_batch()
        if calls and self.supports_batch:
            self._batch = _Batch(calls, while_running=while_running)

    def _call_batched(self, batch: _Batch, method: str, timeout_s: float | None) -> Any:
        index = batch.next_index
        if batch.msg_id is None:
            params = {"calls": [{"method": m, "params": p} for m, p in batch.calls]}
            if self.child is not None:
                self.child.paced_lines = len(batch.calls) + 1  # a reply per call and the closing line
            batch.msg_id, _, _, _ = self._send("batch", params, timeout_s, label=method)
            work, batch.while_running = batch.while_running, None
            if work is not None:
                work()
        batch.next_index += 1
        wait_s, limit_words = self._limit(timeout_s or self.timeout_s)
        try:
            return self._receive(method, batch.msg_id, time.monotonic(), wait_s, limit_words, index=index)
        except (SutProtocolError, SutUnsupported):
            if self.child is None:  # killed: nothing more to read
                self._batch = None
            raise

    def end_batch(self) -> None:
        """Finish the planned batch: read the replies of the calls the harness did not make (it stopped
        early) and the closing line. A scheduler that does not finish it in time, or breaks the protocol
        there, is killed quietly (the next trace starts a fresh process): the verdict was decided by
        the calls that were made."""
        batch, self._batch = self._batch, None
        if batch is None or batch.msg_id is None or self.child is None:
            return
        try:
            while True:
                wait_s, limit_words = self._limit(self.timeout_s)
                reply, _ = self._read_reply("the rest of a batch", batch.msg_id, time.monotonic(), wait_s, limit_words)
                if "index" not in reply:
                    if validate_reply("batch", reply) is not None:
                        self.kill()
                    return
        except SutProtocolError:
            self.kill()

    def check_reply(self, method: str, reply: dict[str, Any]) -> str | None:
        """What is wrong with a reply (an object with the request's id) to ``method``, or None: the protocol's
        schema (:func:`schedconf.conformance.protocol.validate_reply`)."""
        return validate_reply(method, reply)

    # ------------------------------------------------------ SchedulerUnderTest

    def start(self, config: dict[str, Any], profile: str) -> None:
        timeout_s = None
        if self.child is None or self.child.proc.poll() is not None:
            self.kill()
            self._spawn()
            timeout_s = self.startup_timeout_s
        params: dict[str, Any] = {"protocol_version": PROTOCOL_VERSION, "config": config, "profile": profile}
        if self.use_columns:
            params["columns"] = True
        self.columns = False
        result = self.call("init", params, timeout_s=timeout_s)
        self.capabilities = (result or {}).get("capabilities", {})
        self.columns = self.use_columns and self.capabilities.get("columns") is True

    def add_request(self, event: dict[str, Any]) -> None:
        self.call("add_request", {k: v for k, v in event.items() if k not in ("kind", "expect_error")})

    def abort(self, request_id: str) -> None:
        self.call("abort", {"request_id": request_id})

    def schedule(self, throttle_prefills: bool = False) -> dict[str, Any]:
        """``schedule``; a throttled step only for schedulers whose ``init`` reply lists ``throttle_prefills``."""
        if not throttle_prefills:
            return self.call("schedule", {})
        if not self.capabilities.get("throttle_prefills"):
            raise SutUnsupported("the scheduler does not list throttle_prefills in its capabilities")
        return self.call("schedule", {"throttle_prefills": True})

    def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        """The optional ``reset_prefix_cache`` method, for schedulers whose ``init`` reply lists it."""
        if not self.capabilities.get("reset_prefix_cache"):
            raise SutUnsupported("the scheduler does not list reset_prefix_cache in its capabilities")
        return bool(self.call("reset_prefix_cache", {"reset_running_requests": reset_running_requests})["success"])

    @property
    def in_flight(self) -> bool:
        """Does the scheduler run steps in flight? Its ``init`` reply says so (``capabilities.in_flight``)."""
        return bool(self.capabilities.get("in_flight"))

    def update_from_output(
        self, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]], step: int | None = None
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"sampled_token_ids": sampled_token_ids, "draft_token_ids": draft_token_ids}
        if step is not None:
            params["step"] = step
        result = self.call("update", params)
        self.last_stats = result.get("stats")
        return result["outputs"]

    def get_scheduler_stats(self) -> dict[str, Any] | None:
        """The ``stats`` of the last ``update`` reply, if the scheduler sent them."""
        return self.last_stats

    def observe(self) -> dict[str, Any] | None:
        if not self.capabilities.get("observe"):
            return None
        return self.call("observe", {})

    def close(self) -> None:
        """Ask the process to shut down, then kill its group whatever it did (grandchildren too)."""
        if self._batch is not None and self._batch.msg_id is not None:
            self.kill()  # it may still be running the batch: no waiting for it to finish (SIGTERM, Ctrl-C)
        child = self.child
        if child is not None and child.proc.poll() is None:
            self.deadline = None
            try:
                self.call("shutdown", {}, timeout_s=2.0)
                if self.child is not None:
                    self.child.proc.wait(timeout=2)
            except (SutProtocolError, SutInputError, SutUnsupported, subprocess.TimeoutExpired):
                pass
        self.kill()


class DuplicateKey(ValueError):
    """A reply object names a key twice (JSON parsers disagree on which value wins)."""


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def _refuse_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


PIPE_BYTES = 1 << 20
"""Pipe buffer asked for (Linux; 64 KiB by default). A scheduler answering a batch writes ahead while the
harness checks earlier replies; with 64 KiB a 1,024-request step filled the pipe, and the scheduler
waited for the harness's reader thread to get its turn at the interpreter lock."""


def _widen_pipe(fd: int) -> None:
    """Ask for a :data:`PIPE_BYTES` buffer on a pipe (where the system allows it; otherwise as it was)."""
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
    if set_size is None:
        return
    try:
        fcntl.fcntl(fd, set_size, PIPE_BYTES)
    except OSError:
        pass


def _write_all(proc: subprocess.Popen[bytes], data: bytes, deadline: float) -> None:
    """Write ``data`` to the non-blocking stdin of ``proc`` before ``deadline`` (TimeoutError after)."""
    assert proc.stdin is not None
    fd = proc.stdin.fileno()
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        _, writable, _ = select.select([], [fd], [], left)
        if not writable:
            continue
        try:
            sent = os.write(fd, view)
        except BlockingIOError:
            continue
        view = view[sent:]


def _read_replies(child: _Process) -> None:
    """Queue each stdout line (with its number) of one process; None at its end.

    While more than :data:`PACED_TAIL` lines of a batch are still to come (``child.paced_lines``), the
    reader does not wait inside a read, where each line the scheduler writes would have to wake it: it
    looks into the pipe every :data:`READ_PAUSE_S`, or at once when the harness waits for a line
    (``child.wanted``), and takes what is there. After :data:`EMPTY_LOOKS` looks in a row find nothing
    (a slow call) it waits inside the read again.
    """
    stream = child.proc.stdout
    assert isinstance(stream, io.BufferedReader)  # Popen's default buffering
    number = 0
    pending = bytearray()
    empty_looks = 0
    try:
        while True:
            if child.paced_lines > PACED_TAIL and empty_looks < EMPTY_LOOKS:
                child.wanted.wait(READ_PAUSE_S)
                child.wanted.clear()
                if not select.select([stream], [], [], 0)[0]:
                    empty_looks += 1
                    continue
            empty_looks = 0
            chunk = stream.read1(READ_CHUNK_BYTES)
            if not chunk:
                break
            pending += chunk
            lines: list[bytes] = []
            start = 0
            while (end := pending.find(b"\n", start)) >= 0:
                lines.append(bytes(pending[start : end + 1]))
                start = end + 1
            del pending[:start]
            child.paced_lines -= len(lines)  # before the lines are handed over: the next batch sets it anew
            for raw in lines:
                number += 1
                if len(raw) > MAX_REPLY_BYTES:
                    child.replies.put((number, raw))  # reported as too long; the process is killed
                    raise EOFError
                if raw.strip():
                    child.replies.put((number, raw))
            if len(pending) > MAX_REPLY_BYTES:  # no end of line in sight
                child.replies.put((number + 1, bytes(pending)))
                raise EOFError
        if pending.strip():  # the last line, without its end of line
            child.replies.put((number + 1, bytes(pending)))
    except (OSError, ValueError, EOFError):
        pass
    child.replies.put(None)


READ_CHUNK_BYTES = 1 << 20
"""The most one read takes from a scheduler's stdout (the pipe holds :data:`PIPE_BYTES`)."""

READ_PAUSE_S = 0.0005
"""How often the reader looks into the pipe while a batch has more than :data:`PACED_TAIL` lines to come. A
pipe write that wakes a reader waiting inside a read cost the writer 14 µs (a 100-byte line) to 30 µs (6 KB)
on a 2-core VM, against 1 µs with none waiting: at 64 requests, 5% of vLLM's own time per step."""

EMPTY_LOOKS = 4
"""Looks in a row that find the pipe empty before the reader waits inside a read (a call that takes long)."""

PACED_TAIL = 2
"""Lines at the end of a batch read as soon as they come (the last call's reply and the closing line)."""


def _read_stderr(child: _Process) -> None:
    stream = child.proc.stderr
    assert stream is not None
    try:
        while raw := stream.readline(4 * STDERR_LINE_CHARS):
            child.stderr.append(raw.decode("utf-8", "replace").rstrip("\n")[:STDERR_LINE_CHARS])
    except (OSError, ValueError):
        pass
