"""``python -m benchmarks.accuracy [live] ...``: score the recorded pairs (default), or measure
new ones on this machine (``live``)."""

import sys

if sys.argv[1:2] == ["live"]:
    from benchmarks.accuracy.runner import main

    sys.exit(main(sys.argv[2:]))
else:
    from benchmarks.accuracy.recorded import run

    sys.exit(run(sys.argv[1:]))
