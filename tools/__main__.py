"""``python -m tools``: the ``torch-stablehlo`` command line."""
import sys

from .cli import main

sys.exit(main())
