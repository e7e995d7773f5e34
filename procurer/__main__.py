"""`python -m procurer`: the procurement daemon."""

import sys

from .daemon import main

sys.exit(main())
