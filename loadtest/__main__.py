"""`python -m loadtest EXPERIMENT [--short]`: see loadtest/cli.py."""

import sys

from loadtest.cli import main

sys.exit(main(sys.argv[1:]))
