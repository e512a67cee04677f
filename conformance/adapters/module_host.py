"""The child process a ``module:`` scheduler runs in: it imports the user's factory and serves it over the protocol.

``python -m conformance.adapters.module_host --path FOLDER package.module:factory``
puts ``FOLDER`` (the harness's current folder) first on ``sys.path``, keeps
stdout for protocol lines (a scheduler's prints go to stderr), and answers
the protocol (PROTOCOL.md) with :class:`conformance.protocol_server.ProtocolSession`,
plus one request of its own, ``describe``, sent once before any ``init``:
it imports the module, builds the scheduler, and answers what a campaign
reads of it before the first trace (its name, ``in_flight``,
``forced_config``, its optional methods). A failure to import or build
answers an error whose message says what went wrong; the harness makes that
a set-up error.

Nothing a scheduler does here can harm the harness: an exit, an
``os._exit``, a hang in native code or an exception that is not an
``Exception`` ends or stalls this process only, and the harness's
:class:`~conformance.adapters.stdio.StdioSut` reports it as ``sut_exited`` or
``sut_timeout``. A result that is not JSON is sent with each offending
value replaced by the text ``<not JSON: ...>``, so the reply check names the
field.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any, Callable

from conformance.protocol_server import ProtocolSession, serve, take_protocol_stdout


def import_factory(target: str, folder: str) -> Callable[[], Any]:
    """The factory ``package.module:attr``, with ``folder`` first on ``sys.path`` (ImportError when it is not there)."""
    module_name, _, attr = target.partition(":")
    if folder not in sys.path:
        sys.path.insert(0, folder)
        importlib.invalidate_caches()
    try:
        return getattr(importlib.import_module(module_name), attr)
    except AttributeError as exc:
        raise ImportError(str(exc)) from None


class ModuleSession(ProtocolSession):
    """A ProtocolSession whose scheduler is imported on ``describe`` (or on the first ``init``)."""

    def __init__(self, target: str, folder: str) -> None:
        super().__init__(self._build)
        self.target = target
        self.folder = folder

    def _build(self) -> Any:
        return import_factory(self.target, self.folder)()

    def _dispatch(self, method: Any, params: dict[str, Any]) -> Any:
        if method == "describe":
            return self.describe()
        return super()._dispatch(method, params)

    def describe(self) -> dict[str, Any]:
        """Import and build the scheduler; what a campaign reads of it before any trace."""
        if self.sut is None:
            try:
                self.sut = self._build()
            except ImportError as exc:
                raise DescribeError(f"cannot import {self.target}: {exc} (searched the current folder "
                                    f"{self.folder} first, then sys.path)") from None
            except Exception as exc:  # noqa: BLE001 - the user's factory failed: a set-up error
                raise DescribeError(f"{self.target}() failed: {type(exc).__name__}: {exc}") from None
            except SystemExit as exc:
                raise DescribeError(f"{self.target}: the module exited while imported or built "
                                    f"(SystemExit {exc.code!r})") from None
        sut = self.sut
        forced = getattr(sut, "forced_config", None) or {}
        return {
            "name": str(getattr(sut, "name", "python-sut")),
            "in_flight": bool(getattr(sut, "in_flight", False)),
            "forced_config": dict(forced),
            "capabilities": {"observe": bool(getattr(sut, "supports_observe", True)),
                             "reset_prefix_cache": hasattr(sut, "reset_prefix_cache"),
                             "stats": hasattr(sut, "get_scheduler_stats")},
        }


class DescribeError(Exception):
    """The module could not be imported or its scheduler built (answered as an ``internal`` error)."""

    code = "internal"


def render_reply(reply: dict[str, Any]) -> str:
    """One reply line; a value that is not JSON becomes the text ``<not JSON: ...>`` (the reply check names it)."""
    def stand_in(value: Any) -> str:
        return f"<not JSON: {type(value).__name__} {value!r}"[:200] + ">"

    return json.dumps(reply, sort_keys=True, separators=(",", ":"), default=stand_in, allow_nan=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.adapters.module_host")
    parser.add_argument("--path", default=os.getcwd(), help="the folder searched first for the module")
    parser.add_argument("target", help="package.module:factory")
    args = parser.parse_args(argv)
    proto = take_protocol_stdout()
    return serve(None, sys.stdin, proto, session=ModuleSession(args.target, args.path), render=render_reply)


if __name__ == "__main__":
    sys.exit(main())
