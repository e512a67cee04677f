"""The trace format and the corpus: what a trace file is, how it is read, written and documented.

``trace`` validates and reads trace files (``trace.schema.json``), ``format_doc`` renders FORMAT.md
from the schema, ``vectors`` holds the golden corpus (``vectors/``), ``examples`` the built-in
demonstration traces. Imports ``schedconf.spec`` and ``schedconf.conformance.bounds``.
"""
