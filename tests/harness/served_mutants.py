"""Factories the protocol server runs for ``test_batch_protocol.py``: the reference, and mutants of it
(``python -m schedconf.conformance.protocol_server tests.harness.served_mutants:NAME``)."""

from __future__ import annotations

from typing import Any

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.mutants import MutantSut, make_mutant_sut
from schedconf.conformance.protocol import COLUMN_FIELDS


def reference() -> ReferenceSut:
    return ReferenceSut()


def fcfs_victim_head() -> MutantSut:
    return make_mutant_sut("mutant:fcfs_victim_head")


def free_head_first() -> MutantSut:
    return make_mutant_sut("mutant:free_head_first")


def stale_output_applied_as_fresh() -> MutantSut:
    return make_mutant_sut("mutant:stale_output_applied_as_fresh")


def get_columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """A list of objects with the same keys as one list per key (the column form)."""
    return {key: [row[key] for row in rows] for key in rows[0]} if rows else {}


class ColumnsSut:
    """A scheduler that answers in the column form where the harness asks for it at ``init``, built from the
    rows of the one it wraps. ``ragged_at``: the step (counted from init) whose cached requests' column
    ``num_computed_tokens`` loses its last value, a column form that is not one."""

    supports_columns = True

    def __init__(self, inner: Any, ragged_at: int | None = None) -> None:
        self.inner = inner
        self.ragged_at = ragged_at
        self.columns = False
        self.steps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def start(self, config: dict[str, Any], profile: str) -> None:
        self.steps = 0
        self.inner.start(config, profile)

    def schedule(self, throttle_prefills: bool = False) -> dict[str, Any]:
        output = self.inner.schedule(throttle_prefills=True) if throttle_prefills else self.inner.schedule()
        self.steps += 1
        if not self.columns:
            return output
        output = {**output, **{name: get_columns(output[name]) for name in COLUMN_FIELDS["schedule"] if name in output}}
        cached = output["scheduled_cached_reqs"]
        if self.steps == self.ragged_at and cached:
            cached["num_computed_tokens"].pop()
        return output

    def update_from_output(self, sampled: Any, drafts: Any, **step: Any) -> Any:
        outputs = self.inner.update_from_output(sampled, drafts, **step)
        return get_columns(outputs) if self.columns else outputs


def reference_columns() -> ColumnsSut:
    return ColumnsSut(ReferenceSut())


def free_head_first_columns() -> ColumnsSut:
    return ColumnsSut(make_mutant_sut("mutant:free_head_first"))


def ragged_columns() -> ColumnsSut:
    return ColumnsSut(ReferenceSut(), ragged_at=3)
