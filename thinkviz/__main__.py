"""``python -m thinkviz``."""

import sys

from .cli import main

sys.exit(main())
