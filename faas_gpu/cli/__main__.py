"""`python -m faas_gpu.cli`: the same as the `faas-gpu` console script."""

import sys

from . import main

sys.exit(main())
