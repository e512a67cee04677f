"""Workload generation: random and tight workloads, configs, and the data-driven scenario files.

v1 and v0 modules sit side by side under the same names (``workload`` / ``workload_v0``,
``datadriven`` / ``datadriven_v0``); ``generate`` runs the model on a workload to write a trace;
``config_limits`` makes the configurations a scheduler must refuse. Imports ``schedconf.spec`` and
``schedconf.conformance.traces``.
"""
