"""``python -m tfmatcomp ...`` (and ``torchrun ... -m tfmatcomp train ...``): the command line."""

import sys

from tfmatcomp.cli import main

if __name__ == "__main__":
    sys.exit(main())
