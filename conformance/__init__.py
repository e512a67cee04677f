"""The conformance harness: traces, systems under test, verdicts (no torch; imports ``schedconf.spec``).

Subpackages, in the order a trace travels through them:

* ``traces``: the trace format (JSON Schema, reader, writer), the golden corpus and the examples;
* ``workloads``: generation of workloads and configs (v1 ``workload``, v0 ``workload_v0``) and the
  data-driven scenario files;
* ``adapters``: systems under test by name (the reference, ``stdio:``, ``module:``, engines);
* ``checking``: replay, the ``strict`` / ``observable`` comparisons, ``safety`` properties,
  shrinking, verdicts and the mutants that test the checks themselves;
* ``runs``: campaigns, reports, JUnit, reproductions, ``schedconf diff``;
* ``engines``: the drivers that run inside engines' environments (they import only the standard
  library, the engine and ``protocol_server``), the environment builder and the pinned lists;
* ``live``: recording a served vLLM and checking the recording.

At this root: the command line (``cli``), the protocol (``protocol``, ``protocol_server``, ``sut``),
bounded reading of inputs (``bounds``), the pytest plugin and the generated reference pages.
"""
