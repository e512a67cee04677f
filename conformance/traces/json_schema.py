"""JSON Schema validation of trace events and protocol replies, with the format's messages.

The schemas (``trace.schema.json``, ``../protocol.schema.json``) are checked
by fastjsonschema, which compiles each one to Python once per process; this
module turns its first error into the ``(field, expected, found)`` triple
every message of the format is made of (``file:line: field: expected X,
found Y``). Two rules are the format's own, not today's JSON Schema's:

- ``$ref`` names a shape per scheduler: the trace schema's ``schedulers``
  table replaces some ``$defs`` for v0 traces (``config`` by ``v0_config``...);
  each scheduler gets its own compiled validator.
- An integer is never a float: JSON Schema since draft 6 counts ``1.0`` as an
  integer, the format does not. The schemas are compiled with draft 4's
  types, which keep the two apart (their one later keyword, ``const``, is
  compiled as a one-value ``enum`` and reported as ``const``).

Where a trace may hold a float at all (``add_request.arrival_time`` only) is
checked by :func:`find_float`, which ``trace.py`` runs on every event.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import fastjsonschema

Problem = tuple[str, str, str]
"""(field, what was expected, what was found): the parts of a format message."""

_validators: dict[tuple[int, int, int], tuple[Any, ...]] = {}
"""(id of a schema, of its defs, of its renaming table) -> (the schema and the defs, kept so that their ids
stay their own; the validator; the renames it was compiled with, and the table itself, kept likewise)."""


def describe_value(value: Any) -> str:
    """How a message shows a value it did not expect (short; a float says where floats may go)."""
    if isinstance(value, bool):
        return "boolean " + json.dumps(value)
    if isinstance(value, float):
        return f"float {value!r} (floats are allowed only in arrival_time)"
    text = json.dumps(value)
    return (text[:60] + "...") if len(text) > 60 else text


def _get_number_fields(schema: Any) -> set[str]:
    """Names of properties typed ``number`` anywhere in ``schema``."""
    found: set[str] = set()
    if isinstance(schema, dict):
        for name, sub in schema.get("properties", {}).items():
            kinds = sub.get("type") if isinstance(sub, dict) else None
            if kinds == "number" or (isinstance(kinds, list) and "number" in kinds):
                found.add(name)
        for sub in schema.values():
            found |= _get_number_fields(sub)
    elif isinstance(schema, list):
        for sub in schema:
            found |= _get_number_fields(sub)
    return found


_NO_RENAMES: dict[str, str] = {}
DRAFT_4 = "http://json-schema.org/draft-04/schema#"
CONST_MARK = "x-schedconf-const"
"""Marks an ``enum`` that stands for a ``const`` (draft 4 has no ``const``)."""


def _as_draft_4(schema: Any) -> Any:
    """``schema`` with each ``const`` written as a one-value ``enum`` (marked), every other keyword as it is."""
    if isinstance(schema, dict):
        out = {key: _as_draft_4(value) for key, value in schema.items() if key not in ("const", "$schema")}
        if "const" in schema:
            out["enum"] = [schema["const"]]
            out[CONST_MARK] = True
        return out
    if isinstance(schema, list):
        return [_as_draft_4(item) for item in schema]
    return schema


REF_PREFIX = "#/$defs/"


def _inline_refs(schema: Any, defs: dict[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """``schema`` with each ``{"$ref": "#/$defs/NAME"}`` replaced by that definition (itself inlined), except
    where a definition would contain itself (the reference stays).

    Same checks, same error paths: fastjsonschema compiles a reference as a call that formats the
    item's path on every call (``str.format(**locals())``, whether or not it fails), which made a
    1,024-request reply's validation three times slower than the checks themselves.
    """
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith(REF_PREFIX) and len(schema) == 1:
            name = ref[len(REF_PREFIX) :]
            if name in defs and name not in seen:
                return _inline_refs(defs[name], defs, (*seen, name))
            return schema
        return {key: _inline_refs(value, defs, seen) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_inline_refs(item, defs, seen) for item in schema]
    return schema


def _get_validator(schema: dict[str, Any], defs: dict[str, Any], replace: dict[str, str]) -> Callable[[Any], Any]:
    key = (id(schema), id(defs), id(replace))
    entry = _validators.get(key)
    if entry is None or entry[3] != replace:  # a renaming table changed in place compiles anew
        scheduler_defs = {**defs, **{name: defs[other] for name, other in replace.items()}}
        document = _as_draft_4({**_inline_refs(schema, scheduler_defs), "$defs": scheduler_defs})
        document["$schema"] = DRAFT_4
        entry = (schema, defs, fastjsonschema.compile(document, use_default=False), dict(replace), replace)
        _validators[key] = entry
    return entry[2]


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _get_field(where: str, name: str) -> str:
    """The format's field path for fastjsonschema's ``data.a.b[0]`` under the caller's prefix ``where``."""
    rest = name[len("data") :]
    if not rest:
        return where
    if rest.startswith("."):
        return _join(where, rest[1:])
    return where + rest


def _get_problem(error: fastjsonschema.JsonSchemaValueException, where: str) -> Problem:
    """The format's triple for fastjsonschema's first error."""
    field = _get_field(where, error.name or "data")
    rule, wanted, value, definition = error.rule, error.rule_definition, error.value, error.definition or {}
    if rule == "type":
        kinds = wanted if isinstance(wanted, list) else [wanted]
        return field, " or ".join(kinds), describe_value(value)
    if rule == "const" or (rule == "enum" and definition.get(CONST_MARK)):
        return field, json.dumps(wanted[0] if rule == "enum" else wanted), describe_value(value)
    if rule == "enum":
        return field, "one of " + ", ".join(json.dumps(e) for e in wanted), describe_value(value)
    if rule == "required":
        missing = next(name for name in wanted if name not in value)
        return _join(field, missing), "a value (required field)", "nothing"
    if rule == "additionalProperties":
        known_names = definition.get("properties", {})
        extra = next(name for name in value if name not in known_names)
        known = ", ".join(sorted(known_names)) or "none"
        return _join(field, extra), f"no such field (known fields: {known})", describe_value(value[extra])
    if rule in ("minItems", "maxItems"):
        low, high = definition.get("minItems", 0), definition.get("maxItems")
        wanted_text = (
            f"{low} items" if low == high else f"{low} to {high if high is not None else 'any number of'} items"
        )
        return field, wanted_text, describe_value(value)
    return field, f"a value the schema accepts ({rule}: {json.dumps(wanted)})", describe_value(value)


_SCALARS = frozenset((int, str, bool, type(None)))
"""Value types that need no look inside (a list of token ids is passed over at C speed)."""


def _find_float(value: Any, numbers: frozenset[str], is_number: bool = False) -> tuple[list[str], float, bool] | None:
    """The first float outside a ``number`` field, or a non-finite one inside: (the steps of its path, innermost
    first, built only on the way back from a find; the float; whether it sits in a ``number`` field).

    Subclasses count (numpy's float64 is a float; an in-process SUT may answer
    an OrderedDict), so ``isinstance``.
    """
    if isinstance(value, float):
        return None if is_number and math.isfinite(value) else ([], value, is_number)
    if isinstance(value, dict):
        if _SCALARS.issuperset(map(type, value.values())):
            return None
        for name, item in value.items():
            if isinstance(item, (float, dict, list)):
                found = _find_float(item, numbers, name in numbers)
                if found:
                    found[0].append(f".{name}")
                    return found
    elif isinstance(value, list) and not _SCALARS.issuperset(map(type, value)):
        for i, item in enumerate(value):
            if isinstance(item, (float, dict, list)):
                found = _find_float(item, numbers)
                if found:
                    found[0].append(f"[{i}]")
                    return found
    return None


def validate_value(
    value: Any,
    schema: dict[str, Any],
    where: str,
    defs: dict[str, Any],
    replace: dict[str, str] | None = None,
) -> Problem | None:
    """``(field, expected, found)`` for the first thing wrong with ``value``, or None.

    ``schema`` is one shape; ``defs`` are the ``$defs`` its ``$ref`` names,
    ``replace`` renames some of them (a scheduler's shapes). ``where`` prefixes
    every field path (``result`` for a protocol reply). The schema must be a
    long-lived object: its validator is compiled once and kept under its id.
    """
    validate = _get_validator(schema, defs, replace or _NO_RENAMES)
    try:
        validate(value)
    except fastjsonschema.JsonSchemaValueException as error:
        return _get_problem(error, where)
    return None


def find_float(value: Any, where: str, schema: dict[str, Any], defs: dict[str, Any]) -> Problem | None:
    """The first float in ``value`` outside a property ``schema`` types ``number``, or a non-finite one inside."""
    entry = _number_fields.get(id(schema))
    if entry is None:
        entry = _number_fields[id(schema)] = (schema, frozenset(_get_number_fields({**schema, "$defs": defs})))
    found = _find_float(value, entry[1])
    if found is None:
        return None
    steps, number, in_number_field = found
    path = "".join(reversed(steps))
    field = where + path if where else path.removeprefix(".")
    return field, "a finite number" if in_number_field else "integer", describe_value(number)


_number_fields: dict[int, tuple[dict[str, Any], frozenset[str]]] = {}
"""id of a schema -> (the schema, kept; the names of its ``number`` properties)."""
