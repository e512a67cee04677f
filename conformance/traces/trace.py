"""Trace files, format version 1: read, validate, write.

``trace.schema.json`` beside this file is the single source of the format:
validation checks events against it (``json_schema.py``: a compiled JSON
Schema validator and the format's messages) and ``FORMAT.md`` is generated
from it (``python -m schedconf.conformance.traces.format_doc``).

A malformed trace raises :class:`TraceError` naming the file, the line, the
field and what was expected; the CLI turns it into exit code 2. That includes a
header whose config the model refuses (``spec/v1/config.py``, the profile's
start-up checks): ``config.block_size: expected ... (invalid_block_size)``.

Two schedulers share the format: a header without ``scheduler`` (or with
``"scheduler": "v1"``) is a v1 trace, as every trace written before v0 support;
``"scheduler": "v0"`` is a trace of vLLM's legacy v0 scheduler (profile
``vllm-0.10``), whose config, step output and observation use the v0 shapes of
the schema (its ``schedulers`` table names the replacements). The header's
scheduler and profile must agree (``schedconf.spec.schedulers.get_scheduler_kind``).

Numbers are integers everywhere except ``add_request.arrival_time``, which is
any finite number (vLLM's arrival times are floats): a float anywhere else, or
NaN/Infinity anywhere, is refused.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedconf.conformance.traces import json_schema
from schedconf.conformance.traces.json_schema import describe_value
from schedconf.spec.errors import InvalidConfig
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.profiles import PROFILES, check_config_for_profile

FORMAT_NAME = "schedconf-trace"
FORMAT_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("trace.schema.json")
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
EVENT_KINDS = tuple(k for k in SCHEMA["events"] if k != "header")
SCHEDULER_KINDS = tuple(SCHEMA["schedulers"])
"""``v1`` (the default: a header without ``scheduler``) and ``v0``."""


class TraceError(Exception):
    """A trace that cannot be read: file, line, field, what was expected, what was found."""

    def __init__(self, path: str, line: int, field: str, expected: str, found: str = "") -> None:
        self.path, self.line, self.field, self.expected, self.found = path, line, field, expected, found
        msg = f"{path}:{line}: {field}: expected {expected}" if line else f"{path}: {field}: expected {expected}"
        if found:
            msg += f", found {found}"
        super().__init__(msg)


@dataclass
class Trace:
    """A header and its events (plain dicts, in file order)."""

    header: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    path: str = "<memory>"
    lines: list[int] = field(default_factory=list)
    """Line number of each event in its file (for error messages)."""

    @property
    def config(self) -> dict[str, Any]:
        return self.header["config"]

    @property
    def profile(self) -> str:
        return self.header["profile"]

    @property
    def scheduler(self) -> str:
        """``v1`` or ``v0``: the header's ``scheduler`` (absent = v1)."""
        return get_header_scheduler(self.header)

    @property
    def is_in_flight(self) -> bool:
        """Does the trace run steps in flight (``max_concurrent_batches > 1`` or an ``-async`` profile)?"""
        return is_in_flight_header(self.header)

    def num_steps(self) -> int:
        return sum(1 for e in self.events if e["kind"] == "step")

    def line_of(self, index: int) -> int:
        """The file line of event ``index`` (the header is line 1)."""
        return self.lines[index] if index < len(self.lines) else index + 2


# ---------------------------------------------------------------- validation


def is_in_flight_header(header: dict[str, Any]) -> bool:
    """True for a header whose trace runs steps in flight: a config with
    ``max_concurrent_batches > 1`` or a profile driven by AsyncScheduler."""
    profile = PROFILES.get(header.get("profile", ""))
    return header.get("config", {}).get("max_concurrent_batches", 1) > 1 or bool(profile and profile.async_scheduling)


def get_header_scheduler(header: dict[str, Any]) -> str:
    """The scheduler kind a header declares: ``v0``, or ``v1`` when it says none."""
    kind = header.get("scheduler", "v1")
    return kind if kind in SCHEDULER_KINDS else "v1"


def validate_value(
    value: Any, schema: dict[str, Any], where: str, scheduler: str = "v1"
) -> tuple[str, str, str] | None:
    """Return ``(field, expected, found)`` for the first mismatch, or None.

    ``scheduler`` picks the shapes a ``$ref`` means (the schema's ``schedulers`` table).
    """
    return json_schema.validate_value(value, schema, where, SCHEMA["$defs"], SCHEMA["schedulers"][scheduler]["replace"])


def validate_event(event: Any, path: str, line: int, is_header: bool, scheduler: str = "v1") -> None:
    """Raise TraceError unless ``event`` matches the schema of its kind.

    ``scheduler`` is the trace's (its header's) scheduler kind; a header
    brings its own.
    """
    if not isinstance(event, dict):
        raise TraceError(path, line, "(line)", "a JSON object", describe_value(event))
    kind = event.get("kind")
    if is_header:
        if kind != "header":
            raise TraceError(path, line, "kind", 'the header ("kind": "header") on line 1', describe_value(kind))
        if event.get("format") != FORMAT_NAME:
            raise TraceError(path, line, "format", json.dumps(FORMAT_NAME), describe_value(event.get("format")))
        version = event.get("version")
        if version != FORMAT_VERSION:
            raise TraceError(
                path,
                line,
                "version",
                f"format version {FORMAT_VERSION} (this schedconf reads only version {FORMAT_VERSION}; "
                "a newer trace needs a newer schedconf)",
                describe_value(version),
            )
        schema = SCHEMA["events"]["header"]
        scheduler = get_header_scheduler(event)
        if isinstance(event.get("profile"), str):  # before the shapes: a v0 config in a v1 header says why
            validate_header_scheduler(event, path, line)
    else:
        if kind not in EVENT_KINDS:
            raise TraceError(path, line, "kind", "one of " + ", ".join(EVENT_KINDS), describe_value(kind))
        schema = SCHEMA["events"][kind]
    problem = validate_value(event, schema, "", scheduler) or json_schema.find_float(event, "", schema, SCHEMA["$defs"])
    if problem:
        raise TraceError(path, line, *problem)
    if not is_header and kind in ("step", "model_output") and "expect" not in event and "expect_error" not in event:
        raise TraceError(path, line, "expect", "expect (or expect_error)", "nothing")
    if is_header:
        validate_header_config(event, path, line)


def get_profile_scheduler(profile: str) -> str | None:
    """``v1`` or ``v0`` for a profile the model knows, None for an unknown one.

    The v1 profiles are answered without importing the v0 model.
    """
    if profile in PROFILES:
        return "v1"
    from schedconf.spec.errors import SpecError
    from schedconf.spec.schedulers import get_scheduler_kind

    try:
        return get_scheduler_kind(profile)
    except (SpecError, KeyError, ValueError):
        return None


def get_known_profiles() -> list[str]:
    """Every profile a trace may name: the v1 profiles, then the v0 ones."""
    from schedconf.spec.v0.profiles import V0_PROFILES

    return [*PROFILES, *(p for p in V0_PROFILES if p not in PROFILES)]


def validate_header_scheduler(header: dict[str, Any], path: str, line: int) -> None:
    """Raise TraceError unless the header's scheduler and profile agree.

    A v0 trace names a v0 profile; a v0 profile needs ``"scheduler": "v0"``.
    A profile the model does not know (a newer release's) is refused with
    the known ones: the expected outputs of such a trace cannot be checked.
    """
    kind = get_header_scheduler(header)
    profile_kind = get_profile_scheduler(header["profile"])
    if profile_kind is None:
        raise TraceError(
            path,
            line,
            "profile",
            "one of " + ", ".join(json.dumps(p) for p in get_known_profiles()),
            describe_value(header["profile"]),
        )
    if kind == "v0" and profile_kind != "v0":
        raise TraceError(
            path,
            line,
            "profile",
            'a v0 profile (vllm-0.10) for a trace with "scheduler": "v0"',
            describe_value(header["profile"]),
        )
    if kind == "v1" and profile_kind == "v0":
        raise TraceError(
            path,
            line,
            "scheduler",
            f'"v0" (profile {header["profile"]} is a v0 profile)',
            describe_value(header.get("scheduler")) if "scheduler" in header else "nothing",
        )


def _parse_config(config: dict[str, Any], profile: str, scheduler: str) -> None:
    """Raise InvalidConfig unless the model accepts ``config`` under ``profile``."""
    if scheduler == "v0":
        from schedconf.spec.schedulers import make_config

        make_config(config, profile)
        return
    parsed = SchedulerConfig.from_dict(config)
    if profile in PROFILES:
        check_config_for_profile(parsed, PROFILES[profile])


def validate_header_config(header: dict[str, Any], path: str, line: int) -> None:
    """Raise TraceError unless the model accepts the header's config (and, for a
    known profile, that release's start-up checks), or, when the header has
    ``expect_error``, refuses it with exactly that code.

    The field is ``config.<name>`` for a one-field rule, ``config`` for a rule
    over several fields; the expected text names the error code.
    """
    from schedconf.conformance.bounds import check_config_bounds

    config = header["config"]
    past_bound = check_config_bounds(config)
    if past_bound is not None:
        raise TraceError(path, line, *past_bound)
    expected = header.get("expect_error")
    try:
        _parse_config(config, header["profile"], get_header_scheduler(header))
    except InvalidConfig as exc:
        if expected == exc.code:
            return  # a refused-config trace: the refusal is what it checks
        if expected is not None:
            raise TraceError(
                path,
                line,
                "expect_error",
                f"the code the model refuses this config with, {exc.code}",
                json.dumps(expected),
            ) from None
        name = exc.context.get("field")
        if isinstance(name, str):
            field_name, found = f"config.{name}", describe_value(config.get(name))
        else:
            field_name = "config"
            found = ", ".join(f"{k}={describe_value(v)}" for k, v in sorted(exc.context.items()))
        wanted = f"a config the model accepts: {exc.message} ({exc.code})"
        raise TraceError(path, line, field_name, wanted, found) from None
    if expected is not None:
        raise TraceError(
            path, line, "expect_error", "no expect_error: the model accepts this config", json.dumps(expected)
        )


# ------------------------------------------------------------------ reading


def parse_trace_text(text: str, path: str = "<memory>") -> Trace:
    """Parse and validate a whole trace from its text."""
    header: dict[str, Any] | None = None
    events: list[dict[str, Any]] = []
    lines: list[int] = []
    from schedconf.conformance.bounds import MAX_LINE_BYTES

    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        if len(raw) > MAX_LINE_BYTES // 4 and len(raw.encode("utf-8")) > MAX_LINE_BYTES:
            raise TraceError(
                path,
                number,
                "(line)",
                f"a line of at most {MAX_LINE_BYTES} bytes (docs/reference/bounds.md)",
                f"{len(raw.encode('utf-8'))} bytes",
            )
        try:
            event = json.loads(
                raw,
                parse_float=_finite_float(path, number),
                parse_constant=_refuse_constant(path, number),
                object_pairs_hook=_refuse_duplicate_keys(path, number),
            )
            validate_event(
                event,
                path,
                number,
                is_header=header is None,
                scheduler=get_header_scheduler(header) if header is not None else "v1",
            )
        except json.JSONDecodeError as exc:
            raise TraceError(path, number, f"(column {exc.colno})", "valid JSON", exc.msg) from None
        except RecursionError:
            raise TraceError(
                path,
                number,
                "(line)",
                "JSON nested as deep as the trace format needs (a few levels)",
                "nesting too deep to read",
            ) from None
        if header is None:
            header = event
        else:
            events.append(event)
            lines.append(number)
    if header is None:
        raise TraceError(path, 1, "(file)", "a header line", "an empty file")
    if not events and "expect_error" not in header:
        raise TraceError(
            path,
            1,
            "(file)",
            "at least one event after the header (a trace of no events checks "
            "nothing; only a refused config, with expect_error, has none)",
            "the header alone",
        )
    if "expect_error" in header and events:
        raise TraceError(
            path,
            lines[0],
            "kind",
            "no events: the header's config is refused (expect_error)",
            describe_value(events[0]["kind"]),
        )
    return Trace(header=header, events=events, path=path, lines=lines)


def _finite_float(path: str, line: int):
    """Parse a JSON float; one too large for a double (``1e400``) is refused.

    Which fields may hold a float is the schema's business (only
    ``add_request.arrival_time``); validate_event refuses the others.
    """

    def parse(text: str) -> Any:
        value = float(text)
        if not math.isfinite(value):
            raise TraceError(path, line, "(number)", "a finite number", text)
        return value

    return parse


def _refuse_duplicate_keys(path: str, line: int):
    """A ``json.loads`` object hook: an object naming a key twice is refused (JSON parsers disagree on which wins)."""

    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise TraceError(path, line, key, "each key once per object", "it twice")
            out[key] = value
        return out

    return build


def _refuse_constant(path: str, line: int):
    def parse(text: str) -> Any:
        raise TraceError(path, line, "(number)", "a finite number (NaN and Infinity are not JSON)", text)

    return parse


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace file (a regular file within ``schedconf.conformance.bounds``' size bounds)."""
    from schedconf.conformance.bounds import InputFileError, read_bounded_text

    try:
        text = read_bounded_text(path, "trace file")
    except InputFileError as exc:
        field_name = "(bytes)" if exc.line else "(file)"
        raise TraceError(exc.path, exc.line, field_name, exc.expected, exc.found) from None
    return parse_trace_text(text, str(Path(path)))


# ------------------------------------------------------------------ writing


def dump_line(obj: dict[str, Any]) -> str:
    """One event as a canonical line: sorted keys, no spaces."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def render_trace(trace: Trace) -> str:
    """The whole trace as text, one line per event."""
    return "\n".join(dump_line(e) for e in [trace.header, *trace.events]) + "\n"


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (never half-written)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600: reports and traces are for reading
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_trace(path: str | os.PathLike[str], trace: Trace) -> None:
    """Write a trace atomically."""
    write_atomic(path, render_trace(trace))


def make_header(config: dict[str, Any], profile: str, seed: int, origin: str, **extra: Any) -> dict[str, Any]:
    """A version-1 header."""
    return {
        "kind": "header",
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "profile": profile,
        "config": dict(config),
        "seed": seed,
        "origin": origin,
        **extra,
    }
