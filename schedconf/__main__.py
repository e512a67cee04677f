"""``python -m schedconf``: the command line, as the ``schedconf`` script runs it."""

import sys

from schedconf.conformance.cli import main

sys.exit(main())
