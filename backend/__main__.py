"""`python -m backend <command> [args]`: see backend.cli (run without arguments for the list)."""

import sys

from backend.cli import main

sys.exit(main())
