"""Drivers of real engines behind the JSON-lines protocol (PROTOCOL.md).

Each driver runs INSIDE its engine's own virtual environment (built by
``schedconf env FAMILY VERSION``, see :mod:`schedconf.conformance.engines.engine_env`), imports
the engine and :mod:`schedconf.conformance.protocol_server`, and never imports ``spec/``.
This package's ``__init__`` imports nothing, so a driver can run with only the
standard library and the engine installed.
"""
