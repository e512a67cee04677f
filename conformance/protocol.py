"""The JSON-lines protocol's replies: their schema and their validation.

``protocol.schema.json`` beside this file states what a scheduler may answer
to each method (the result shapes reuse the trace format's definitions); a
reply is checked as strictly as a trace line: integers never floats, no
unknown fields, an error code from the spec's table (``FORMAT.md``) or one of
``unsupported`` / ``internal``.

A v0 scheduler (profile ``vllm-0.10``) answers ``schedule`` and ``observe``
with the v0 shapes (``trace.schema.json``'s ``schedulers`` table). The caller
may say which scheduler it talks to; when it does not, the reply's own keys
tell (a v0 output has ``scheduled_seq_groups``, a v0 observation
``num_free_gpu_blocks``), so a v1 reply is checked exactly as before.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from schedconf.conformance.traces.json_schema import describe_value
from schedconf.conformance.traces.trace import SCHEDULER_KINDS, validate_value
from schedconf.spec.errors import ERROR_CODES

PROTOCOL_VERSION = 1
SCHEMA: dict[str, Any] = json.loads(Path(__file__).with_name("protocol.schema.json").read_text())
PROTOCOL_ONLY_CODES = ("unsupported", "internal")


def _resolve_local(schema: dict[str, Any]) -> dict[str, Any]:
    """Follow this file's own ``#/name`` references (``#/$defs/...`` stay for the trace validator)."""
    ref = schema.get("$ref", "")
    if ref.startswith("#/") and not ref.startswith("#/$defs/"):
        return SCHEMA[ref[2:]]
    return schema


def get_known_error_codes() -> list[str]:
    return [*ERROR_CODES, *PROTOCOL_ONLY_CODES]


ENVELOPE: dict[str, Any] = dict(
    SCHEMA["envelope"],
    properties={
        "id": SCHEMA["envelope"]["properties"]["id"],
        "result": {},
        "error": _resolve_local(SCHEMA["error"]),
    },
)
"""A reply's outer shape; its ``result`` is checked against the method's schema afterwards."""

V0_MARKERS = {"schedule": "scheduled_seq_groups", "observe": "num_free_gpu_blocks"}
"""The key that marks a v0 result of these methods (when the caller does not name the scheduler)."""


def get_reply_scheduler(method: str, reply: dict[str, Any]) -> str:
    """``v0`` if the result of ``method`` has the v0 marker key, else ``v1``."""
    result = reply.get("result")
    marker = V0_MARKERS.get(method)
    return "v0" if marker and isinstance(result, dict) and marker in result else "v1"


def validate_reply(method: str, reply: dict[str, Any], scheduler: str | None = None) -> str | None:
    """``field: expected X, found Y`` for the first thing wrong with ``reply`` to ``method``, or None.

    ``scheduler`` (``v1`` or ``v0``) picks the result shapes; None: the reply's keys tell.
    """
    if not _is_plain_result(reply):  # the common reply, {id, result}, is one the envelope accepts
        problem = validate_value(reply, ENVELOPE, "")
        if problem:
            return _words(problem)
        if ("result" in reply) == ("error" in reply):
            return "(reply): expected exactly one of result and error"
        if "error" in reply:
            code = reply["error"]["code"]
            if code not in ERROR_CODES and code not in PROTOCOL_ONLY_CODES:
                return (
                    f"error.code: unknown error code {code!r}; expected one of the codes in FORMAT.md's table "
                    f"or {', '.join(PROTOCOL_ONLY_CODES)}"
                )
            return None
    schema = SCHEMA["results"].get(method)
    if schema is None or (reply["result"] is None and method in NULL_METHODS):
        return None
    kind = scheduler if scheduler is not None and scheduler in SCHEDULER_KINDS else get_reply_scheduler(method, reply)
    problem = validate_value(reply["result"], schema, "result", kind)
    return _words(problem) if problem else None


COLUMN_FIELDS: dict[str, tuple[str, ...]] = {
    "schedule": ("scheduled_new_reqs", "scheduled_cached_reqs"),
    "update": ("outputs",),
}
"""The lists of request objects that a scheduler which lists ``capabilities.columns`` may send in column
form (PROTOCOL.md, "Column form"): one list per field instead of one object per request."""


def expand_columns(method: str, reply: dict[str, Any]) -> str | None:
    """Turn the column forms in a ``result`` of ``method`` back into lists of objects, in place.

    Returns ``field: expected ..., found ...`` for a column form that is not one (a column that is not a
    list, columns of different lengths), else None. A field already in list form is left as it is; the
    objects built here are then checked by :func:`validate_reply` like any others.
    """
    result = reply.get("result")
    if not isinstance(result, dict):
        return None
    for name in COLUMN_FIELDS.get(method, ()):
        columns = result.get(name)
        if not isinstance(columns, dict):
            continue
        lengths: dict[str, int] = {}
        for key, values in columns.items():
            if not isinstance(values, list):
                return f"result.{name}.{key}: expected a list (one value per request, column form), found {describe_value(values)}"
            lengths[key] = len(values)
        if len(set(lengths.values())) > 1:
            by_length: dict[int, list[str]] = {}
            for key, n in lengths.items():
                by_length.setdefault(n, []).append(key)
            shown = " and ".join(
                f"{n} value{'' if n == 1 else 's'} in {', '.join(keys)}"
                for n, keys in sorted(by_length.items(), key=lambda item: -len(item[1]))
            )
            return f"result.{name}: expected columns of one length (column form), found {shown}"
        keys = list(columns)
        result[name] = [dict(zip(keys, values)) for values in zip(*columns.values())]
    return None


NULL_METHODS = frozenset(method for method, schema in SCHEMA["results"].items() if schema == {"type": "null"})
"""The methods whose result schema is ``null`` alone (add_request, abort, shutdown): a ``null`` answer needs no
validator call."""


def _is_plain_result(reply: dict[str, Any]) -> bool:
    """``{"id": <integer>, "result": ...}`` and nothing else: a reply the envelope's schema accepts."""
    return len(reply) == 2 and "result" in reply and type(reply.get("id")) is int


JSON_DEPTH_LIMIT = 64
"""Nesting a Python answer may have (the protocol's shapes need five levels; a cycle has no end)."""


def find_not_json(value: Any, where: str = "result") -> str | None:
    """``where.field: expected ..., found ...`` for the first part of a Python value JSON cannot carry, or None.

    JSON carries None, booleans, integers, finite floats, strings, lists (and
    tuples, as lists) and objects with string keys, nested at most
    :data:`JSON_DEPTH_LIMIT` levels; anything else (a set, NaN, an integer
    key, a numpy integer, an object, a cycle) is named here.
    """
    found = _find_not_json(value, 0)
    if found is None:
        return None
    steps, problem = found
    path = where + "".join(reversed(steps))
    return f"{path if len(path) <= 60 else path[:40] + '...'}: {problem}"


_PLAIN = frozenset((str, int, bool, type(None)))
"""Types that are JSON whatever their value (checked by identity first: the common case, and the fast one)."""


def _find_not_json(value: Any, depth: int) -> tuple[list[str], str] | None:
    """The path (innermost step first) and the problem of the first part of ``value`` JSON cannot carry."""
    if type(value) in _PLAIN or isinstance(value, (str, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else ([], f"expected a finite number, found float {value!r}")
    if isinstance(value, (dict, list, tuple)) and depth >= JSON_DEPTH_LIMIT:
        return [], f"expected at most {JSON_DEPTH_LIMIT} levels of nesting, found more (a cycle?)"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return [], f"expected string keys, found key {_short_repr(key)}"
            found = None if type(item) in _PLAIN else _find_not_json(item, depth + 1)
            if found is not None:
                found[0].append(f".{key}")
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = None if type(item) in _PLAIN else _find_not_json(item, depth + 1)
            if found is not None:
                found[0].append(f"[{index}]")
                return found
        return None
    return [], f"expected a JSON value, found {_short_repr(value)}"


def _short_repr(value: Any) -> str:
    """``set()``, ``int64 5``, ``<object object at 0x...>``: the value's repr, with its type unless the repr names it."""
    name = type(value).__name__
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a user's object whose repr fails is still named by its type
        return f"{name} (no repr)"
    text = text if len(text) <= 60 else text[:57] + "..."
    return text if name in text else f"{name} {text}"


def _words(problem: tuple[str, str, str]) -> str:
    where, expected, found = problem
    return f"{where or '(reply)'}: expected {expected}" + (f", found {found}" if found else "")
