"""Serve any Python SchedulerUnderTest over the JSON-lines protocol (PROTOCOL.md).

Standard library only, so it can run inside another project's environment
(vLLM's, for instance) with nothing of schedconf installed but this file's
directory on PYTHONPATH::

    python -m schedconf.conformance.protocol_server schedconf.conformance.adapters.reference:ReferenceSut

The server answers one request per line until ``shutdown`` or end of input. A ``batch`` request
carries a list of calls; they run in order and each one's reply is written (and flushed) as soon as it
is known, with the call's ``index``, then one closing line (:func:`serve_batch`).
Exceptions with a ``code`` attribute become protocol errors with that code;
any other exception becomes ``internal`` with its traceback on stderr.
A request line that is not a JSON object is answered with an ``internal``
error (id ``null``), so the harness sees the problem instead of waiting.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import inspect
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn


def accepts_throttle_prefills(sut: Any) -> bool:
    """Does ``sut.schedule`` take ``throttle_prefills`` (announced as a capability at ``init``)?"""
    schedule = getattr(sut, "schedule", None)
    if schedule is None:
        return False
    try:
        return "throttle_prefills" in inspect.signature(schedule).parameters
    except (TypeError, ValueError):
        return False


class ProtocolSession:
    """One scheduler behind the protocol: ``process_message`` answers one request."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory
        self.sut: Any = None
        self.shut_down = False

    def process_message(self, msg: Any) -> dict[str, Any]:
        """The reply object to one request (``shut_down`` is set by ``shutdown``)."""
        if not isinstance(msg, dict):
            return {"id": None, "error": {"code": "internal", "message": "a request must be a JSON object"}}
        msg_id = msg.get("id")
        method = msg.get("method")
        params = msg.get("params") or {}
        try:
            return {"id": msg_id, "result": self._dispatch(method, params)}
        except Exception as exc:  # noqa: BLE001 - every failure becomes a protocol error
            code = getattr(exc, "code", None)
            if type(exc).__name__ == "SutUnsupported":
                code = "unsupported"
            if not isinstance(code, str):
                code = "internal"
                traceback.print_exc(file=sys.stderr)
            return {"id": msg_id, "error": {"code": code, "message": str(exc)}}

    def _dispatch(self, method: Any, params: dict[str, Any]) -> Any:
        if method == "init":
            if self.sut is None:
                self.sut = self.factory()
            self.sut.start(params["config"], params["profile"])
            # Column form (PROTOCOL.md): when the harness asks for it and the scheduler builds it itself.
            columns = params.get("columns") is True and bool(getattr(self.sut, "supports_columns", False))
            if hasattr(self.sut, "supports_columns"):
                self.sut.columns = columns
            caps = {
                "observe": bool(getattr(self.sut, "supports_observe", True)),
                "in_flight": bool(getattr(self.sut, "in_flight", False)),
                "reset_prefix_cache": hasattr(self.sut, "reset_prefix_cache"),
                "throttle_prefills": accepts_throttle_prefills(self.sut),
                "batch": True,
                "columns": columns,
            }
            return {"name": getattr(self.sut, "name", "python-sut"), "capabilities": caps}
        if method == "shutdown":
            self.shut_down = True
            if self.sut is not None:
                self.sut.close()
            return None
        if self.sut is None:
            raise RuntimeError("init must come first")
        if method == "add_request":
            self.sut.add_request({"kind": "add_request", **params})
            return None
        if method == "abort":
            self.sut.abort(params["request_id"])
            return None
        if method == "schedule":
            if params.get("throttle_prefills") is True:
                return self.sut.schedule(throttle_prefills=True)
            return self.sut.schedule()
        if method == "update":
            # "step" (the step the output answers) only reaches SUTs that run in-flight steps.
            in_flight = getattr(self.sut, "in_flight", False) and params.get("step") is not None
            step = {"step": params["step"]} if in_flight else {}
            result: dict[str, Any] = {
                "outputs": self.sut.update_from_output(params["sampled_token_ids"], params["draft_token_ids"], **step)
            }
            stats = self.sut.get_scheduler_stats() if hasattr(self.sut, "get_scheduler_stats") else None
            if stats is not None:
                result["stats"] = stats
            return result
        if method == "observe":
            return self.sut.observe()
        if method == "reset_prefix_cache":
            return {"success": bool(self.sut.reset_prefix_cache(params["reset_running_requests"]))}
        raise RuntimeError(f"unknown method {method!r}")


def serve(
    factory: Callable[[], Any] | None,
    stdin=None,
    stdout=None,
    session: ProtocolSession | None = None,  # noqa: ANN001
    render: Callable[[dict[str, Any]], str] | None = None,
    collect_after_batch: bool = False,
) -> int:
    """Answer protocol requests on ``stdin`` with a SUT built by ``factory`` (or with ``session``'s).

    ``render`` turns a reply into its line (default: :func:`render_line`). ``collect_after_batch``:
    see :func:`serve_batch`.
    """
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    if session is None:
        assert factory is not None, "serve needs a factory or a session"
        session = ProtocolSession(factory)
    render = render or render_line
    for line in stdin:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
        except json.JSONDecodeError as exc:
            print(f"protocol_server: bad request line: {exc}", file=sys.stderr)
            msg = None
        if isinstance(msg, dict) and msg.get("method") == "batch":
            serve_batch(session, msg, stdout, render, collect_after=collect_after_batch)
        else:
            _write_line(stdout, render(session.process_message(msg)))
        if session.shut_down:
            return 0
    return 0


BATCH_STOPS = ("internal", "unsupported")
"""Error codes that end a batch: the harness stops its replay at either, so nothing after it is run."""


def serve_batch(
    session: ProtocolSession,
    msg: dict[str, Any],
    stdout,  # noqa: ANN001
    render: Callable[[dict[str, Any]], str],
    collect_after: bool = False,
) -> None:
    """Run a ``batch`` request's calls in order, one reply line each as it is known, then the closing line.

    Each call's reply is the one it would get on its own, with ``"index"`` (its place in the list) added,
    flushed before the next call runs: a call that hangs or kills the process is the one whose reply
    never comes. An ``internal`` or ``unsupported`` error ends the batch. The closing line is
    ``{"id": ID, "result": {"calls_run": N}}``.

    ``collect_after``: Python's cyclic garbage collector does not run during the calls; it collects
    once, before the closing line. Reference counting still frees at once everything that holds no
    cycle. For an engine whose heap is large (vLLM's, with a 1,024-request step) the collections
    that the replies' allocations triggered between calls cost several percent of the engine's time.
    """
    msg_id = msg.get("id")
    calls = (msg.get("params") or {}).get("calls")
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        error = {"code": "internal", "message": "batch: params.calls must be a list of {method, params} objects"}
        _write_line(stdout, render({"id": msg_id, "error": error}))
        return
    run = 0
    paused = collect_after and gc.isenabled()
    if paused:
        gc.disable()
    try:
        for index, call in enumerate(calls):
            reply = session.process_message({"id": msg_id, "method": call.get("method"), "params": call.get("params")})
            reply["index"] = index
            _write_line(stdout, render(reply))
            run += 1
            if session.shut_down or ("error" in reply and reply["error"].get("code") in BATCH_STOPS):
                break
    finally:
        if paused:
            gc.enable()
            gc.collect(0)
    if not session.shut_down:
        _write_line(stdout, render({"id": msg_id, "result": {"calls_run": run}}))


def take_protocol_stdout():  # noqa: ANN201 - a text file
    """Keep fd 1 for protocol lines only: return a private copy of it, and send everything else
    (an engine's prints, its libraries' banners) to stderr, which the harness keeps for reports."""
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def _get_fast_encoder() -> Callable[[Any], bytes] | None:
    """msgspec's JSON encoder with sorted keys, where the environment has msgspec (schedconf's own,
    vLLM's and its forks': vLLM depends on it); None elsewhere. It writes the same line as ``json.dumps``
    with sorted keys and no spaces, except that text outside ASCII stays UTF-8 instead of ``\\u`` escapes
    (the same JSON), about seven times faster on a 1,024-request step."""
    try:
        import msgspec
    except ImportError:
        return None
    return msgspec.json.Encoder(order="sorted").encode


_FAST_ENCODE = _get_fast_encoder()


def render_line(obj: dict[str, Any]) -> str:
    """One request or reply as its protocol line (without the newline): sorted keys, no spaces."""
    if _FAST_ENCODE is not None:
        try:
            return _FAST_ENCODE(obj).decode()
        except (TypeError, ValueError, OverflowError):
            pass  # what msgspec cannot write (an integer past 64 bits), json says in its own way
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def write_reply(stdout, obj: dict[str, Any]) -> None:  # noqa: ANN001
    """One reply line, flushed."""
    _write_line(stdout, render_line(obj))


def _write_line(stdout, line: str) -> None:  # noqa: ANN001
    """A protocol line, flushed at once (the harness waits for it)."""
    stdout.write(line + "\n")
    stdout.flush()


OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
"""What a driver without its own settings needs: no model hub, quiet transformers."""


def run_driver(
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    engine: str,
    default_env: dict[str, str],
    self_check: Callable[[str | None], int],
    serve_stdio: Callable[[], int],
    describe: Callable[[], int] | None = None,
) -> NoReturn:
    """The command line every engine driver shares, then exit without the interpreter's teardown.

    ``--self-check [--expect-version V]`` builds one scheduler and runs two steps
    (what ``schedconf env`` runs after a build); otherwise the driver serves the
    protocol on stdin/stdout. ``default_env`` fills unset environment variables
    first. Every reply is flushed, so the process ends with ``os._exit``: an
    engine's (torch's) teardown is slow and has nothing left to say.
    """
    for key, value in default_env.items():
        os.environ.setdefault(key, value)
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--self-check", action="store_true", help="build one scheduler, run two steps, exit")
    parser.add_argument("--expect-version", default=None, help=f"with --self-check: the {engine} version required")
    if describe is not None:
        parser.add_argument(
            "--describe",
            action="store_true",
            help=f"print what this environment's {engine} is (one JSON line) and exit",
        )
    args = parser.parse_args(argv)
    if describe is not None and args.describe:
        code = describe()
    else:
        code = self_check(args.expect_version) if args.self_check else serve_stdio()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or ":" not in args[0]:
        print("usage: python -m schedconf.conformance.protocol_server package.module:Factory", file=sys.stderr)
        return 2
    module_name, attr = args[0].split(":", 1)
    factory = getattr(importlib.import_module(module_name), attr)
    return serve(factory)


if __name__ == "__main__":
    sys.exit(main())
