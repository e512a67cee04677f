"""Checking one trace: replay against a system under test, compare, shrink, decide the verdict.

``replay`` drives a SUT through a trace, ``compare`` holds the ``strict`` and ``observable``
comparisons, ``safety/`` the policy-independent properties, ``shrink`` minimises a failing trace,
``verdict`` names the outcomes; ``mutants`` / ``mutant_kill`` are deliberately broken schedulers
that show each check can fail. Imports ``schedconf.spec``, ``traces`` and ``adapters``.
"""
