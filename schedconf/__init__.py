"""schedconf: the executable specification and conformance suite for LLM-serving schedulers.

Everything importable lives under this name: ``schedconf.spec`` (the reference models),
``schedconf.conformance`` (traces, the harness, the command line, the engine drivers),
``schedconf.impl`` (our torch engine) and ``schedconf.gpu_checks``. The repository keeps them
as top-level folders (``spec/``, ``conformance/``, ...). In a checkout, ``schedconf/spec`` and
its siblings are symbolic links to those folders, so the checkout imports (and type-checks)
as it installs; an installed wheel holds the folders themselves (``[tool.setuptools]
package-dir`` in ``pyproject.toml``).
"""
