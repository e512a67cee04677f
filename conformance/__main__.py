import sys

from schedconf.conformance.cli import main

sys.exit(main())
