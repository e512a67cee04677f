"""The child process a ``module:`` scheduler runs in: it imports the user's factory and serves it over the protocol.

``python -m schedconf.conformance.adapters.module_host --path FOLDER package.module:factory``
puts ``FOLDER`` (the harness's current folder) first on ``sys.path``, keeps
stdout for protocol lines (a scheduler's prints go to stderr), and answers
the protocol (PROTOCOL.md) with :class:`schedconf.conformance.protocol_server.ProtocolSession`,
plus one request of its own, ``describe``, sent once before any ``init``:
it imports the module, builds the scheduler, and answers what a campaign
reads of it before the first trace (its name, ``in_flight``,
``forced_config``, its optional methods). A failure to import or build
answers an error whose message says what went wrong
(:func:`build_scheduler`, which ``inprocess:`` uses too); the harness makes
that a set-up error.

Nothing a scheduler does here can harm the harness: an exit, an
``os._exit``, a hang in native code or an exception that is not an
``Exception`` ends or stalls this process only, and the harness's
:class:`~schedconf.conformance.adapters.stdio.StdioSut` reports it as ``sut_exited`` or
``sut_timeout``; a ``SystemExit`` first writes on stderr where the
scheduler raised it, which the report shows. A result that JSON cannot carry is answered as the
text :data:`NOT_JSON_MARK` and the field it fails at, which the ``module:``
adapter reports as a protocol error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from schedconf.conformance.protocol import find_not_json
from schedconf.conformance.protocol_server import (
    ProtocolSession,
    accepts_throttle_prefills,
    serve,
    take_protocol_stdout,
)


class SetUpError(Exception):
    """The module could not be imported or its scheduler built: a set-up error, with a one-line message."""

    code = "internal"


def import_factory(target: str, folder: str) -> Callable[[], Any]:
    """The factory ``package.module:attr``, with ``folder`` first on ``sys.path``.

    SetUpError when the module cannot be imported (or raises, or exits,
    while imported) or has no such attribute.
    """
    module_name, _, attr = target.partition(":")
    if folder not in sys.path:
        sys.path.insert(0, folder)
        importlib.invalidate_caches()
    searched = f"(searched the current folder {folder} first, then sys.path)"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SetUpError(f"cannot import {target}: {exc} {searched}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed while imported
        raise SetUpError(
            f"cannot import {target}: importing {module_name} raised {type(exc).__name__}: {exc}"
        ) from None
    except SystemExit as exc:
        raise SetUpError(
            f"cannot import {target}: the module exited while imported (SystemExit {exc.code!r})"
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise SetUpError(f"cannot import {target}: {exc} {searched}") from None


def build_scheduler(target: str, folder: str) -> Any:
    """The scheduler ``package.module:factory`` builds, the module looked up in ``folder`` first (SetUpError if not)."""
    factory = import_factory(target, folder)
    try:
        return factory()
    except Exception as exc:  # noqa: BLE001 - the user's factory failed: a set-up error
        raise SetUpError(f"{target}() failed: {type(exc).__name__}: {exc}") from None
    except SystemExit as exc:
        raise SetUpError(f"{target}() exited while building the scheduler (SystemExit {exc.code!r})") from None


class ModuleSession(ProtocolSession):
    """A ProtocolSession whose scheduler is imported on ``describe`` (or on the first ``init``)."""

    def __init__(self, target: str, folder: str) -> None:
        super().__init__(self._build)
        self.target = target
        self.folder = folder

    def _build(self) -> Any:
        return build_scheduler(self.target, self.folder)

    def process_message(self, msg: Any) -> dict[str, Any]:
        """As ProtocolSession's; a scheduler that exits leaves on stderr where it called exit, then the process
        exits with its code (the harness reports ``exited with exit code N``)."""
        try:
            return super().process_message(msg)
        except SystemExit as exc:
            method = msg.get("method") if isinstance(msg, dict) else None
            print(f"module_host: the scheduler raised SystemExit({exc.code!r}) in {method}:", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            raise

    def _dispatch(self, method: Any, params: dict[str, Any]) -> Any:
        if method == "describe":
            return self.describe()
        return super()._dispatch(method, params)

    def describe(self) -> dict[str, Any]:
        """Import and build the scheduler; what a campaign reads of it before any trace."""
        if self.sut is None:
            self.sut = self._build()
        sut = self.sut
        forced = getattr(sut, "forced_config", None) or {}
        return {
            "name": str(getattr(sut, "name", "python-sut")),
            "in_flight": bool(getattr(sut, "in_flight", False)),
            "forced_config": dict(forced),
            "capabilities": {
                "observe": bool(getattr(sut, "supports_observe", True)),
                "reset_prefix_cache": hasattr(sut, "reset_prefix_cache"),
                "stats": hasattr(sut, "get_scheduler_stats"),
                "throttle_prefills": accepts_throttle_prefills(sut),
            },
        }


NOT_JSON_MARK = "<not JSON> "
"""The start of the text answered in place of a result JSON cannot carry (the ``module:`` adapter reads it)."""


def render_reply(reply: dict[str, Any]) -> str:
    """One reply line. A result JSON cannot carry (a set, NaN, an integer key, an object, nesting without end)
    is answered as :data:`NOT_JSON_MARK` and what is wrong with it: ``result.finished_req_ids: expected a JSON
    value, found set()``."""
    if "result" in reply:
        problem = find_not_json(reply["result"])
        if problem:
            reply = {**reply, "result": NOT_JSON_MARK + problem}
    return json.dumps(reply, sort_keys=True, separators=(",", ":"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m schedconf.conformance.adapters.module_host")
    parser.add_argument("--path", default=os.getcwd(), help="the folder searched first for the module")
    parser.add_argument("target", help="package.module:factory")
    args = parser.parse_args(argv)
    proto = take_protocol_stdout()
    return serve(None, sys.stdin, proto, session=ModuleSession(args.target, args.path), render=render_reply)


if __name__ == "__main__":
    sys.exit(main())
