"""Factories the protocol server runs for ``test_batch_protocol.py``: the reference, and mutants of it
(``python -m schedconf.conformance.protocol_server tests.harness.served_mutants:NAME``)."""

from __future__ import annotations

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.mutants import MutantSut, make_mutant_sut


def reference() -> ReferenceSut:
    return ReferenceSut()


def fcfs_victim_head() -> MutantSut:
    return make_mutant_sut("mutant:fcfs_victim_head")


def free_head_first() -> MutantSut:
    return make_mutant_sut("mutant:free_head_first")


def stale_output_applied_as_fresh() -> MutantSut:
    return make_mutant_sut("mutant:stale_output_applied_as_fresh")
