"""Comparison profiles: what must be equal between the expected and the actual output.

``strict``: the canonical outputs are equal as they are (block ids, list
orders), and when both sides observe it, the free-queue order too. This is
vLLM-exact.

``observable``: what a user of the scheduler can see: scheduled ids and token
counts, prefix hits (``num_computed_tokens``), output counts, drafts,
preempted and finished sets, sampled tokens and finish reasons, and the
*number* of blocks each request gets. Block ids must agree only up to one
consistent renaming over the whole trace; list orders are not compared.

A v0 output (``scheduled_seq_groups``, vLLM's legacy scheduler) is compared
the same way: ``strict`` as it is; ``observable`` per scheduled group
(token chunk size, prompt or not, sampling, the number of blocks and computed
blocks, GPU block ids up to the renaming), the step's counts, the ignored and
finished sets, and the number of swap and copy pairs; its observation by the
free GPU and CPU block counts.

Divergences are values (:class:`Divergence`), never exceptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COMPARISONS = ("strict", "observable")
"""The comparisons made by :class:`Comparator`; ``safety`` (``conformance/checking/safety/``) compares nothing with the trace."""


@dataclass(frozen=True)
class FieldDiff:
    """One field that differs: its path, the expected and the actual value."""

    field: str
    expected: Any
    actual: Any


@dataclass(frozen=True)
class Divergence:
    """The first place a scheduler under test departed from the trace.

    ``kind`` is one of: ``scheduler_output``, ``observation``,
    ``request_outputs``, ``input_error`` (an error code expected or not),
    ``sut_error`` (the scheduler raised, or answered ``internal``),
    ``sut_timeout`` (no answer in time), ``sut_exited`` (the process exited
    or could not start), ``protocol_error`` (a reply that breaks the
    protocol: not JSON, a stray line, a wrong id, too long, off-schema).
    """

    event_index: int
    line: int
    step: int | None
    kind: str
    diffs: tuple[FieldDiff, ...] = ()
    message: str = ""

    def signature(self) -> str:
        """The *kind* of divergence, independent of request ids and sizes.

        The divergence kind plus its most telling field (generalized: request
        ids and list positions removed), by the order of SIGNATURE_FIELDS: a
        wrong victim shows first as ``preempted_req_ids``, a wrong block as
        ``block_ids``. Shrinking keeps a smaller trace only if its first
        divergence has the same signature.
        """
        names = {_generalize(d.field) for d in self.diffs}
        if not names:
            return self.kind
        return f"{self.kind}:{min(names, key=_field_rank)}"

    def section(self) -> str:
        """A coarser signature: the kind and the top-level part of the telling field.

        ``scheduler_output:scheduled_cached_reqs`` covers a wrong
        ``num_computed_tokens`` and a wrong block of a running request alike.
        """
        sig = self.signature()
        return sig.split(".")[0]

    def fields(self) -> list[str]:
        """Every differing field, generalized and sorted."""
        return sorted({_generalize(d.field) for d in self.diffs})

    def to_dict(self) -> dict[str, Any]:
        return {
            "event_index": self.event_index,
            "line": self.line,
            "step": self.step,
            "kind": self.kind,
            "message": self.message,
            "signature": self.signature(),
            "fields": self.fields(),
            "diffs": [{"field": d.field, "expected": d.expected, "actual": d.actual} for d in self.diffs],
        }


# Most telling first: what went wrong in a divergence is named by the first
# of these fields that differs.
SIGNATURE_FIELDS = (
    "error",
    "preempted_req_ids",
    "finished_req_ids",
    "scheduled_new_reqs",
    "scheduled_cached_reqs",
    "outputs",
    "num_scheduled_tokens",
    "scheduled_new_reqs.num_computed_tokens",
    "scheduled_cached_reqs.resumed",
    "scheduled_cached_reqs.num_computed_tokens",
    "scheduled_cached_reqs.num_output_tokens",
    "scheduled_spec_decode_tokens",
    "scheduled_new_reqs.num_blocks",
    "scheduled_cached_reqs.num_blocks",
    "scheduled_new_reqs.block_ids",
    "scheduled_cached_reqs.new_block_ids",
    "outputs.finish_reason",
    "outputs.stop_reason",
    "outputs.new_token_ids",
    "observe.num_free_blocks",
    "observe.free_block_queue",
    "total_num_scheduled_tokens",
    # v0 (vLLM's legacy scheduler): the same idea, its own fields.
    "preempted",
    "blocks_to_swap_out",
    "blocks_to_swap_in",
    "ignored_seq_groups",
    "finished_requests_ids",
    "scheduled_seq_groups",
    "scheduled_seq_groups.request_id",
    "scheduled_seq_groups.token_chunk_size",
    "scheduled_seq_groups.is_prompt",
    "scheduled_seq_groups.do_sample",
    "num_prefill_groups",
    "scheduled_seq_groups.computed_block_nums",
    "scheduled_seq_groups.num_computed_blocks",
    "scheduled_seq_groups.num_blocks",
    "scheduled_seq_groups.block_table",
    "blocks_to_copy",
    "num_batched_tokens",
    "running_queue_size",
    "num_lookahead_slots",
    "observe.num_free_gpu_blocks",
    "observe.num_free_cpu_blocks",
    "observe.block_tables",
    "observe.cpu_block_tables",
)


def _field_rank(name: str) -> tuple[int, str]:
    return (SIGNATURE_FIELDS.index(name) if name in SIGNATURE_FIELDS else len(SIGNATURE_FIELDS), name)


def _generalize(path: str) -> str:
    """Drop request ids (``<id>``) and list positions (``[i]``) from a field path."""
    import re

    parts = [re.sub(r"\[\d+\]", "", part) for part in path.split(".") if not part.startswith("<")]
    return ".".join(p for p in parts if p)


@dataclass
class BlockRenaming:
    """A bijection between expected and actual block ids, grown as the trace goes."""

    forward: dict[int, int] = field(default_factory=dict)
    backward: dict[int, int] = field(default_factory=dict)

    def match(self, expected: list[int], actual: list[int]) -> bool:
        """True if the lists are equal under the renaming (extended as needed)."""
        if len(expected) != len(actual):
            return False
        for e, a in zip(expected, actual):
            if self.forward.setdefault(e, a) != a or self.backward.setdefault(a, e) != e:
                return False
        return True


# Canonical dicts whose keys are request ids (paths show them as <id>).
ID_KEYED = {"num_scheduled_tokens", "scheduled_spec_decode_tokens"}


def _diff_values(path: str, expected: Any, actual: Any, out: list[FieldDiff]) -> None:
    """Append the leaf-level differences between two canonical values.

    Paths name dict keys (``<id>`` for request ids) and list positions
    (``[i]``); lists of different lengths differ as a whole.
    """
    if isinstance(expected, dict) and isinstance(actual, dict):
        id_keyed = path.split(".")[-1] in ID_KEYED
        for key in sorted(set(expected) | set(actual), key=str):
            name = f"<{key}>" if id_keyed else str(key)
            sub = f"{path}.{name}" if path else name
            if key not in actual:
                out.append(FieldDiff(sub, expected[key], "<missing>"))
            elif key not in expected:
                out.append(FieldDiff(sub, "<missing>", actual[key]))
            else:
                _diff_values(sub, expected[key], actual[key], out)
    elif (
        isinstance(expected, list)
        and isinstance(actual, list)
        and len(expected) == len(actual)
        and any(isinstance(x, dict) for x in expected)
    ):
        for i, (e, a) in enumerate(zip(expected, actual)):
            _diff_values(f"{path}[{i}]", e, a, out)
    elif expected != actual:
        out.append(FieldDiff(path, expected, actual))


def _by_id(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["req_id"]: item for item in items}


class Comparator:
    """Compares one trace's outputs under a comparison profile, keeping state (renaming)."""

    def __init__(self, comparison: str) -> None:
        if comparison not in COMPARISONS:
            raise ValueError(f"unknown comparison {comparison!r}; known: {', '.join(COMPARISONS)}")
        self.comparison = comparison
        self.renaming = BlockRenaming()

    def compare_scheduler_output(self, expected: dict[str, Any], actual: Any) -> list[FieldDiff]:
        """Differences between an expected and an actual canonical SchedulerOutput."""
        if expected == actual:
            # Keep the renaming in step even when equal (identity on these ids).
            if self.comparison == "observable":
                if "scheduled_seq_groups" in expected:
                    self._compare_v0_observable(expected, actual)
                else:
                    self._rename_blocks(expected, actual, [])
            return []
        if not isinstance(actual, dict):
            return [FieldDiff("(output)", "a SchedulerOutput object", actual)]
        diffs: list[FieldDiff] = []
        if self.comparison == "strict":
            _diff_values("", expected, actual, diffs)
            return diffs
        if "scheduled_seq_groups" in expected:
            return self._compare_v0_observable(expected, actual)
        for key in ("num_scheduled_tokens", "total_num_scheduled_tokens", "scheduled_spec_decode_tokens"):
            _diff_values(key, expected.get(key), actual.get(key), diffs)
        for key in ("finished_req_ids", "preempted_req_ids"):
            e, a = expected.get(key), actual.get(key)
            if (sorted(e) if e is not None else None) != (sorted(a) if a is not None else None):
                diffs.append(FieldDiff(key, e, a))
        for group, fields in (
            ("scheduled_new_reqs", ("num_computed_tokens",)),
            ("scheduled_cached_reqs", ("resumed", "num_computed_tokens", "num_output_tokens")),
        ):
            exp, act = _by_id(expected.get(group, [])), _by_id(actual.get(group, []))
            if set(exp) != set(act):
                diffs.append(FieldDiff(f"{group}.<ids>", sorted(exp), sorted(act)))
                continue
            for rid in sorted(exp):
                for f in fields:
                    if exp[rid].get(f) != act[rid].get(f):
                        diffs.append(FieldDiff(f"{group}.{f}.<{rid}>", exp[rid].get(f), act[rid].get(f)))
        self._rename_blocks(expected, actual, diffs)
        return diffs

    def _rename_blocks(self, expected: dict[str, Any], actual: dict[str, Any], diffs: list[FieldDiff]) -> None:
        for group, key in (("scheduled_new_reqs", "block_ids"), ("scheduled_cached_reqs", "new_block_ids")):
            exp, act = _by_id(expected.get(group, [])), _by_id(actual.get(group, []))
            for rid in sorted(set(exp) & set(act)):
                e, a = exp[rid][key], act[rid][key]
                if len(e) != len(a):
                    diffs.append(FieldDiff(f"{group}.num_blocks.<{rid}>", len(e), len(a)))
                elif not self.renaming.match(e, a):
                    diffs.append(FieldDiff(f"{group}.{key}.<{rid}>", e, a))

    def _compare_v0_observable(self, expected: dict[str, Any], actual: dict[str, Any]) -> list[FieldDiff]:
        """The observable comparison of a v0 output (see the module docstring)."""
        diffs: list[FieldDiff] = []
        for key in (
            "num_prefill_groups",
            "num_batched_tokens",
            "preempted",
            "running_queue_size",
            "num_lookahead_slots",
        ):
            if expected.get(key) != actual.get(key):
                diffs.append(FieldDiff(key, expected.get(key), actual.get(key)))
        for key in ("ignored_seq_groups", "finished_requests_ids"):
            e, a = expected.get(key), actual.get(key)
            if sorted(e or ()) != sorted(a or ()):
                diffs.append(FieldDiff(key, e, a))
        for key in ("blocks_to_swap_out", "blocks_to_swap_in", "blocks_to_copy"):
            e, a = expected.get(key) or [], actual.get(key) or []
            if len(e) != len(a):
                diffs.append(FieldDiff(key, e, a))
        exp = {g["request_id"]: g for g in expected.get("scheduled_seq_groups", [])}
        act = {g.get("request_id"): g for g in actual.get("scheduled_seq_groups") or [] if isinstance(g, dict)}
        if set(exp) != set(act):
            diffs.append(FieldDiff("scheduled_seq_groups.<ids>", sorted(exp), sorted(map(str, act))))
            return diffs
        for rid in sorted(exp):
            e, a = exp[rid], act[rid]
            for f in ("token_chunk_size", "is_prompt", "do_sample"):
                if e.get(f) != a.get(f):
                    diffs.append(FieldDiff(f"scheduled_seq_groups.{f}.<{rid}>", e.get(f), a.get(f)))
            if len(e["computed_block_nums"]) != len(a.get("computed_block_nums") or []):
                diffs.append(
                    FieldDiff(
                        f"scheduled_seq_groups.num_computed_blocks.<{rid}>",
                        len(e["computed_block_nums"]),
                        len(a.get("computed_block_nums") or []),
                    )
                )
            table = a.get("block_table") or []
            if len(e["block_table"]) != len(table):
                diffs.append(FieldDiff(f"scheduled_seq_groups.num_blocks.<{rid}>", len(e["block_table"]), len(table)))
            elif not self.renaming.match(e["block_table"], table):
                diffs.append(FieldDiff(f"scheduled_seq_groups.block_table.<{rid}>", e["block_table"], table))
        return diffs

    def compare_observation(self, expected: dict[str, Any] | None, actual: dict[str, Any] | None) -> list[FieldDiff]:
        """Strict: the free queue in order. Observable: the number of free blocks."""
        if expected is None or actual is None or expected == actual:
            return []
        # a trace's observation has the free queue; what else a SUT reports (block_tables) is for safety
        actual = {k: v for k, v in actual.items() if k in expected} if isinstance(actual, dict) else actual
        if expected == actual:
            return []
        if self.comparison == "strict":
            diffs: list[FieldDiff] = []
            _diff_values("observe", expected, actual, diffs)
            return diffs
        if "num_free_gpu_blocks" in expected:  # v0: the free GPU and CPU block counts
            return [
                FieldDiff(f"observe.{key}", expected.get(key), actual.get(key))
                for key in ("num_free_gpu_blocks", "num_free_cpu_blocks")
                if expected.get(key) != actual.get(key)
            ]
        if expected.get("num_free_blocks") != actual.get("num_free_blocks"):
            return [
                FieldDiff("observe.num_free_blocks", expected.get("num_free_blocks"), actual.get("num_free_blocks"))
            ]
        return []

    def compare_request_outputs(self, expected: list[dict[str, Any]], actual: Any) -> list[FieldDiff]:
        """Sampled tokens kept, finish and stop reasons, per request (order too under strict)."""
        if expected == actual:
            return []
        if not isinstance(actual, list):
            return [FieldDiff("(outputs)", "a list of request outputs", actual)]
        diffs: list[FieldDiff] = []
        exp, act = _by_id(expected), _by_id(actual)
        if set(exp) != set(act):
            diffs.append(FieldDiff("outputs.<ids>", sorted(exp), sorted(act)))
        for rid in sorted(set(exp) & set(act)):
            for f in ("new_token_ids", "finish_reason", "stop_reason"):
                if exp[rid].get(f) != act[rid].get(f):
                    diffs.append(FieldDiff(f"outputs.{f}.<{rid}>", exp[rid].get(f), act[rid].get(f)))
        if not diffs and self.comparison == "strict":
            diffs.append(FieldDiff("outputs.<order>", [o["req_id"] for o in expected], [o["req_id"] for o in actual]))
        return diffs
