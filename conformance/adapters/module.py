"""Python schedulers under test: ``module:`` in a child process (the default), ``inprocess:`` in the harness.

``module:package.module:factory`` runs the factory's scheduler in a child
process (``conformance/adapters/module_host.py``) behind the protocol, with
everything a ``stdio:`` scheduler gets: a timeout on every call that holds
even in native code, a process that can exit, crash or hang without taking
the harness with it, SIGTERM and Ctrl-C honoured at once, and every reply
checked as strictly as a stdio reply (integers never floats, no unknown
field, JSON only). What a campaign reads of the scheduler before any trace
(``forced_config``, ``in_flight``) comes from the child's ``describe``
answer; a module that cannot be imported or built is a set-up error.

``inprocess:package.module:factory`` calls the scheduler in the harness's own
process, through :class:`GuardedSut`: faster (``bench/bench_module_sut.py``
measures by how much), and its replies are checked as strictly, but it trusts
the scheduler: a hang in native code cannot be interrupted, and ``os._exit``
ends the harness. Use it for a scheduler you trust, once ``module:`` passes.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import traceback
from pathlib import Path
from typing import Any

from schedconf.conformance.adapters import UnknownSut
from schedconf.conformance.adapters.module_host import NOT_JSON_MARK, SetUpError, build_scheduler
from schedconf.conformance.adapters.stdio import DEFAULT_TIMEOUT_S, StdioSut, SutInternalError, SutProtocolError
from schedconf.conformance.protocol import find_not_json, validate_reply
from schedconf.conformance.sut import SutInputError, SutUnsupported, accepts_throttle_prefills

DESCRIBE_TIMEOUT_S = 120.0
"""Seconds a module may take to be imported and its scheduler built (a first import of torch can take a while)."""


def get_target(name: str, prefix: str) -> str:
    """``package.module:factory`` from a SUT name; UnknownSut when it is not of that shape."""
    target = name.removeprefix(prefix)
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise UnknownSut(f"--sut {name!r}: expected {prefix}package.module:factory")
    return target


class ModuleSut(StdioSut):
    """A Python scheduler in a child process, served by ``module_host`` (see the module docstring)."""

    def __init__(self, target: str, timeout_s: float = DEFAULT_TIMEOUT_S, folder: str | None = None) -> None:
        folder = folder or os.getcwd()
        argv = [sys.executable, "-m", "schedconf.conformance.adapters.module_host", "--path", folder, target]
        env = {"PYTHONPATH": get_child_path()}
        super().__init__(
            shlex.join(argv),
            timeout_s=timeout_s,
            env=env,
            name=f"module:{target}",
            startup_timeout_s=DESCRIBE_TIMEOUT_S,
        )
        self.target = target
        self.description = self._describe()
        self.forced_config: dict[str, Any] = self.description["forced_config"]

    def _describe(self) -> dict[str, Any]:
        """Start the child and ask what it runs; any failure is a set-up error (UnknownSut)."""
        self._spawn()
        try:
            answer = self.call("describe", {}, timeout_s=DESCRIBE_TIMEOUT_S)
        except SutInternalError as exc:  # the host could not import the module or build the scheduler
            self.kill()
            raise UnknownSut(f"--sut {self.name!r}: {exc.reason}") from None
        except (SutProtocolError, SutInputError) as exc:
            self.kill()
            stderr = getattr(exc, "stderr", "")
            tail = f"; its stderr ends: {stderr.splitlines()[-1]}" if stderr.strip() else ""
            what = getattr(exc, "plain_message", str(exc)).removeprefix(self.name + ": ")
            raise UnknownSut(
                f"--sut {self.name!r}: while importing the module and building the scheduler, {what}{tail}"
            ) from None
        problem = _check_description(answer)
        if problem:
            self.kill()
            raise UnknownSut(f"--sut {self.name!r}: {problem}")
        return answer

    @property
    def in_flight(self) -> bool:  # type: ignore[override]
        """Does the scheduler run steps in flight? Known from ``describe``, before any trace starts."""
        return bool(self.description["in_flight"])

    def check_reply(self, method: str, reply: dict[str, Any]) -> str | None:
        """The protocol's check, and the host's word that the scheduler's answer is not JSON (``NOT_JSON_MARK``)."""
        result = reply.get("result")
        if isinstance(result, str) and result.startswith(NOT_JSON_MARK):
            return f"the scheduler's answer is not JSON: {result.removeprefix(NOT_JSON_MARK)}"
        return super().check_reply(method, reply)


def get_child_path() -> str:
    """The child's PYTHONPATH: this process's, then every folder of this process's ``sys.path``.

    What the harness can import, the child can: a module found through a
    path pytest or the user's script added, and ``conformance`` itself.
    """
    root = str(Path(__file__).resolve().parents[2])
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    for entry in [*sys.path, root]:
        if entry and entry not in entries and os.path.isdir(entry):
            entries.append(entry)
    return os.pathsep.join(entries)


def _check_description(answer: Any) -> str | None:
    """What is wrong with a ``describe`` answer, or None."""
    if not isinstance(answer, dict):
        return f"describe answered {answer!r}, expected an object"
    if not isinstance(answer.get("forced_config"), dict):
        return "forced_config must be a dict of config fields"
    if not isinstance(answer.get("in_flight"), bool):
        return "in_flight must be true or false"
    return None


def make_module_sut(name: str) -> ModuleSut:
    """``module:PKG.MOD:FACTORY``: the factory's scheduler in a child process."""
    return ModuleSut(get_target(name, "module:"))


# ------------------------------------------------------------------ in-process


class SutCallExited(Exception):
    """The scheduler raised SystemExit in a call (kind ``sut_exited``)."""

    kind = "sut_exited"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.plain_message = message


class SutCallError(SutCallExited):
    """The scheduler raised a BaseException that is not an Exception (kind ``sut_error``)."""

    kind = "sut_error"


class SutReplyError(SutCallExited):
    """The scheduler broke the protocol in-process: a reply of the wrong shape, or a late ``unsupported``."""

    kind = "protocol_error"


class GuardedSut:
    """A Python scheduler called in the harness's process, its answers checked as the protocol checks replies.

    Every result is round-tripped through JSON and validated with
    :func:`schedconf.conformance.protocol.validate_reply`. An exception with an error
    ``code`` is read as ``protocol_server`` answers it: a code outside the
    table is a protocol error, ``internal`` a ``sut_error``, and
    ``SutUnsupported`` (code ``unsupported``) after ``start`` a protocol
    error (it is an answer to ``init`` only). ``SystemExit`` is a
    ``sut_exited`` failure and any other BaseException but KeyboardInterrupt
    a ``sut_error``, never a harness crash; their traceback is the SUT's
    ``stderr_tail``, as a child process would have printed it. The errors
    raised are plain, picklable exceptions (campaign workers send results
    between processes).
    """

    def __init__(self, inner: Any, name: str) -> None:
        self.inner = inner
        self.name = name
        self.last_words = ""
        self.forced_config = dict(getattr(inner, "forced_config", None) or {})
        self.in_flight = bool(getattr(inner, "in_flight", False))
        self.supports_observe = bool(getattr(inner, "supports_observe", True))
        if hasattr(inner, "reset_prefix_cache"):
            self.reset_prefix_cache = self._reset_prefix_cache
        if hasattr(inner, "get_scheduler_stats"):
            self.get_scheduler_stats = self._get_scheduler_stats

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            code = "unsupported" if isinstance(exc, SutUnsupported) else getattr(exc, "code", None)
            if not isinstance(code, str):
                raise  # the scheduler's own bug: a sut_error with its traceback
            raise self._refusal(what, exc, code) from None
        except SystemExit as exc:
            self.last_words = _render_traceback(exc)
            raise SutCallExited(f"{self.name}: the scheduler called exit ({exc.code!r}) in {what}") from None
        except BaseException as exc:  # noqa: BLE001 - a scheduler's own BaseException: its failure, not ours
            self.last_words = _render_traceback(exc)
            raise SutCallError(f"{self.name}: {what} raised {type(exc).__name__}: {exc}") from None

    def _refusal(self, what: str, exc: Exception, code: str) -> Exception:
        """What the protocol makes of an exception with an error ``code`` (protocol_server's error reply)."""
        problem = validate_reply(what, {"id": 0, "error": {"code": code, "message": str(exc)}})
        if problem:
            return SutReplyError(f"{self.name}: {what} raised {type(exc).__name__} ({exc}): {problem}")
        if code == "unsupported" and what == "start":
            return exc if isinstance(exc, SutUnsupported) else SutUnsupported(str(exc))
        if code == "unsupported":
            return SutReplyError(
                f"{self.name}: {what} raised {type(exc).__name__} ({exc}): unsupported is an "
                "answer to init only; once a trace has started, the scheduler answers every call"
            )
        if code == "internal":
            return SutCallError(f"{self.name}: internal error in {what}: {exc}")
        return exc if isinstance(exc, SutInputError) else SutInputError(code, str(exc))

    def stderr_tail(self, n: int = 40) -> str:
        """The traceback of the last exit or BaseException the scheduler raised (what its process would print)."""
        return "\n".join(self.last_words.splitlines()[-n:])

    def _checked(self, method: str, result: Any) -> Any:
        """``result`` as the protocol would carry it (through JSON), or SutReplyError naming the field."""
        problem = find_not_json(result)
        if problem:
            raise SutReplyError(f"{self.name}: the answer to {method} is not JSON: {problem}")
        carried = json.loads(json.dumps(result))
        problem = validate_reply(method, {"id": 0, "result": carried})
        if problem:
            raise SutReplyError(f"{self.name}: the answer to {method}: {problem}")
        return carried

    def start(self, config: dict[str, Any], profile: str) -> None:
        self._call("start", self.inner.start, config, profile)

    def add_request(self, event: dict[str, Any]) -> None:
        self._call("add_request", self.inner.add_request, event)

    def abort(self, request_id: str) -> None:
        self._call("abort", self.inner.abort, request_id)

    def schedule(self, throttle_prefills: bool = False) -> dict[str, Any]:
        if not throttle_prefills:
            return self._checked("schedule", self._call("schedule", self.inner.schedule))
        if not accepts_throttle_prefills(self.inner):
            raise SutUnsupported(f"{self.name}: this scheduler's schedule() takes no throttle_prefills")
        return self._checked("schedule", self._call("schedule", self.inner.schedule, throttle_prefills=True))

    def update_from_output(
        self, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]], step: int | None = None
    ) -> list[dict[str, Any]]:
        kwargs = {"step": step} if self.in_flight else {}
        outputs = self._call("update", self.inner.update_from_output, sampled_token_ids, draft_token_ids, **kwargs)
        return self._checked("update", {"outputs": outputs})["outputs"]

    def observe(self) -> dict[str, Any] | None:
        if not self.supports_observe:
            return None
        result = self._call("observe", self.inner.observe)
        return None if result is None else self._checked("observe", result)

    def _reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        result = self._call("reset_prefix_cache", self.inner.reset_prefix_cache, reset_running_requests)
        return bool(self._checked("reset_prefix_cache", {"success": bool(result)})["success"])

    def _get_scheduler_stats(self) -> dict[str, Any] | None:
        stats = self._call("update", self.inner.get_scheduler_stats)
        return None if stats is None else self._checked("update", {"outputs": [], "stats": stats})["stats"]

    def close(self) -> None:
        """Close the scheduler; what it raises there is ignored, as a process's ``shutdown`` failures are."""
        try:
            self._call("close", self.inner.close)
        except Exception:  # noqa: BLE001 - nothing is checked after the last trace
            pass


def _render_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as the interpreter prints it, without this module's frame."""
    tb = exc.__traceback__
    return "".join(traceback.format_exception(type(exc), exc, tb.tb_next if tb is not None else None))


def make_inprocess_sut(name: str) -> GuardedSut:
    """``inprocess:PKG.MOD:FACTORY``: the factory's scheduler in this process, its answers checked."""
    target = get_target(name, "inprocess:")
    try:
        inner = build_scheduler(target, os.getcwd())
    except SetUpError as exc:
        raise UnknownSut(f"--sut {name!r}: {exc}") from None
    return GuardedSut(inner, name)
