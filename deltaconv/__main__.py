"""``python -m deltaconv``: the ``deltaconv`` command line (see :mod:`deltaconv.cli`)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
