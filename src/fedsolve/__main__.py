"""``python -m fedsolve ...``: the ``fedsolve`` command without an installed entry point."""

import sys

from fedsolve.cli import main

if __name__ == "__main__":
    sys.exit(main())
