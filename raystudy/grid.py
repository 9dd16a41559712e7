"""``python -m raystudy.grid``: the study grid, as ``raystudy grid`` (``raystudy.commands.grid``)."""

import sys

from raystudy.commands.grid import main

if __name__ == "__main__":
    sys.exit(main())
