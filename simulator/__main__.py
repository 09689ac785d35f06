"""``python -m simulator`` is the ``oversmooth`` command."""

import sys

from simulator.cli import main

sys.exit(main())
