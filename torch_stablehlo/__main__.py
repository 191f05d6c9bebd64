"""``python -m torch_stablehlo``: the ``torch-stablehlo`` command line."""
import sys

from .tools.cli import main

sys.exit(main())
