"""The ``safety`` comparison: policy-independent properties over a scheduler's own schedule.

``properties.py`` states the rules (one ``check_*`` function each);
``drive.py`` runs a scheduler on a trace's inputs, builds the model outputs
from its own schedule and checks the rules after every call.
``conformance/CHECKS.md`` lists them with what each needs. ``v0.py`` checks
a v0 trace's recorded outputs for ``prefix_hit_unwritten`` (a prefix hit on KV
no step has written; vLLM 0.10.2 breaks it: finding V7).

Import from the modules (``schedconf.conformance.checking.safety.drive.run_safety``,
``schedconf.conformance.checking.safety.properties.PROPERTIES``): this package file imports
nothing, so its modules can import each other without a cycle.
"""
