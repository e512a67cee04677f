"""A scheduler in a subprocess, driven over the JSON-lines protocol (PROTOCOL.md)."""

from __future__ import annotations

import json
import os
import queue
import shlex
import subprocess
import threading
from typing import Any

from conformance.sut import SutInputError, SutUnsupported

PROTOCOL_VERSION = 1
DEFAULT_TIMEOUT_S = 30.0


class SutProtocolError(Exception):
    """The subprocess broke the protocol, crashed or timed out; carries its stderr."""

    def __init__(self, message: str, stderr: str = "") -> None:
        self.stderr = stderr
        super().__init__(message + (f"\n--- scheduler stderr (last lines) ---\n{stderr}" if stderr else ""))


class StdioSut:
    """Starts ``command`` once and speaks the protocol with it.

    One subprocess serves a whole campaign: ``start`` sends a fresh ``init``
    for every trace. A message that gets no answer within ``timeout_s``
    kills the process (it is restarted on the next ``start``).
    """

    def __init__(self, command: str, timeout_s: float = DEFAULT_TIMEOUT_S, env: dict[str, str] | None = None,
                 name: str | None = None) -> None:
        self.command = command
        self.argv = shlex.split(command)
        self.timeout_s = timeout_s
        self.env = env
        self.name = name or f"stdio:{command}"
        self.proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._next_id = 0
        self.capabilities: dict[str, Any] = {}

    # -------------------------------------------------------------- process

    def _spawn(self) -> None:
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, bufsize=1, env=env,
            )
        except OSError as exc:
            raise SutProtocolError(f"cannot start {self.command!r}: {exc}") from None
        self._lines = queue.Queue()
        self._stderr = []
        threading.Thread(target=self._pump_stdout, args=(self.proc,), daemon=True).start()
        threading.Thread(target=self._pump_stderr, args=(self.proc,), daemon=True).start()

    def _pump_stdout(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _pump_stderr(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self._stderr.append(line.rstrip("\n"))
            if len(self._stderr) > 2000:
                del self._stderr[:1000]

    def stderr_tail(self, n: int = 40) -> str:
        """The last ``n`` lines the process wrote to stderr."""
        return "\n".join(self._stderr[-n:])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def call(self, method: str, params: dict[str, Any], timeout_s: float | None = None) -> Any:
        """Send one request and return its result (raising SutInputError for an error reply)."""
        if self.proc is None or self.proc.poll() is not None:
            raise SutProtocolError(f"{self.name}: the scheduler process is not running", self.stderr_tail())
        self._next_id += 1
        msg_id = self._next_id
        line = json.dumps({"id": msg_id, "method": method, "params": params}, sort_keys=True, separators=(",", ":"))
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise SutProtocolError(f"{self.name}: cannot write {method}: {exc}", self.stderr_tail()) from None
        try:
            reply_line = self._lines.get(timeout=timeout_s or self.timeout_s)
        except queue.Empty:
            self.kill()
            raise SutProtocolError(
                f"{self.name}: no answer to {method} within {timeout_s or self.timeout_s:.0f} s (process killed)",
                self.stderr_tail(),
            ) from None
        if reply_line is None:
            code = self.proc.poll() if self.proc else None
            raise SutProtocolError(f"{self.name}: the process exited (code {code}) instead of answering {method}",
                                   self.stderr_tail())
        try:
            reply = json.loads(reply_line)
        except json.JSONDecodeError:
            raise SutProtocolError(f"{self.name}: answer to {method} is not JSON: {reply_line[:200]!r}",
                                   self.stderr_tail()) from None
        if not isinstance(reply, dict) or reply.get("id") != msg_id:
            raise SutProtocolError(f"{self.name}: answer to {method} (id {msg_id}) has the wrong id: {reply_line[:200]!r}",
                                   self.stderr_tail())
        if "error" in reply:
            err = reply["error"] or {}
            code = err.get("code", "internal")
            if code == "unsupported":
                raise SutUnsupported(err.get("message", "unsupported"))
            if code == "internal":
                raise SutProtocolError(f"{self.name}: internal error in {method}: {err.get('message', '')}",
                                       self.stderr_tail())
            raise SutInputError(code, err.get("message", ""))
        return reply.get("result")

    # ------------------------------------------------------ SchedulerUnderTest

    def start(self, config: dict[str, Any], profile: str) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._spawn()
        result = self.call("init", {"protocol_version": PROTOCOL_VERSION, "config": config, "profile": profile},
                           timeout_s=max(self.timeout_s, 120.0))
        self.capabilities = (result or {}).get("capabilities", {})

    def add_request(self, event: dict[str, Any]) -> None:
        self.call("add_request", {k: v for k, v in event.items() if k not in ("kind", "expect_error")})

    def abort(self, request_id: str) -> None:
        self.call("abort", {"request_id": request_id})

    def schedule(self) -> dict[str, Any]:
        return self.call("schedule", {})

    def update_from_output(self, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]]) -> list[dict[str, Any]]:
        result = self.call("update", {"sampled_token_ids": sampled_token_ids, "draft_token_ids": draft_token_ids})
        return (result or {}).get("outputs", [])

    def observe(self) -> dict[str, Any] | None:
        if not self.capabilities.get("observe"):
            return None
        return self.call("observe", {})

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.call("shutdown", {}, timeout_s=5.0)
            except (SutProtocolError, SutInputError):
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None
