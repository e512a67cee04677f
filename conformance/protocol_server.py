"""Serve any Python SchedulerUnderTest over the JSON-lines protocol (PROTOCOL.md).

Standard library only, so it can run inside another project's environment
(vLLM's, for instance) with nothing of schedconf installed but this file's
directory on PYTHONPATH::

    python -m conformance.protocol_server conformance.adapters.reference:ReferenceSut

The server answers one request per line until ``shutdown`` or end of input.
Exceptions with a ``code`` attribute become protocol errors with that code;
any other exception becomes ``internal`` with its traceback on stderr.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from typing import Any, Callable


def serve(factory: Callable[[], Any], stdin=None, stdout=None) -> int:  # noqa: ANN001
    """Answer protocol requests on ``stdin`` with a SUT built by ``factory``."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    sut = None
    for line in stdin:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
            msg_id = msg.get("id")
            method = msg.get("method")
            params = msg.get("params") or {}
        except (json.JSONDecodeError, AttributeError) as exc:
            print(f"protocol_server: bad request line: {exc}", file=sys.stderr)
            continue
        try:
            if method == "init":
                if sut is None:
                    sut = factory()
                sut.start(params["config"], params["profile"])
                caps = {"observe": bool(getattr(sut, "supports_observe", True))}
                result: Any = {"name": getattr(sut, "name", "python-sut"), "capabilities": caps}
            elif sut is None:
                raise RuntimeError("init must come first")
            elif method == "add_request":
                sut.add_request({"kind": "add_request", **params})
                result = None
            elif method == "abort":
                sut.abort(params["request_id"])
                result = None
            elif method == "schedule":
                result = sut.schedule()
            elif method == "update":
                result = {"outputs": sut.update_from_output(params["sampled_token_ids"], params["draft_token_ids"])}
            elif method == "observe":
                result = sut.observe()
            elif method == "shutdown":
                _reply(stdout, {"id": msg_id, "result": None})
                if sut is not None:
                    sut.close()
                return 0
            else:
                raise RuntimeError(f"unknown method {method!r}")
            _reply(stdout, {"id": msg_id, "result": result})
        except Exception as exc:  # noqa: BLE001 - every failure becomes a protocol error
            code = getattr(exc, "code", None)
            if type(exc).__name__ == "SutUnsupported":
                code = "unsupported"
            if not isinstance(code, str):
                code = "internal"
                traceback.print_exc(file=sys.stderr)
            _reply(stdout, {"id": msg_id, "error": {"code": code, "message": str(exc)}})
    return 0


def _reply(stdout, obj: dict[str, Any]) -> None:  # noqa: ANN001
    stdout.write(json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n")
    stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or ":" not in args[0]:
        print("usage: python -m conformance.protocol_server package.module:Factory", file=sys.stderr)
        return 2
    module_name, attr = args[0].split(":", 1)
    factory = getattr(importlib.import_module(module_name), attr)
    return serve(factory)


if __name__ == "__main__":
    sys.exit(main())
