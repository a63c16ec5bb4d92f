"""``python -m benchmarks.accuracy``."""

import sys

from benchmarks.accuracy.runner import main

sys.exit(main())
