import sys

from .daemon import main

sys.exit(main())
