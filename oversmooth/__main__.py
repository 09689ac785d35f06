"""``python -m oversmooth`` is the ``oversmooth`` command."""

import sys

from oversmooth.cli import main

if __name__ == "__main__":
    sys.exit(main())
