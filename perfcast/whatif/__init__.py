"""What-if transformations of the dependency graph, and the optimization models built on them.

`perfcast.whatif(trace, apply)` is `perfcast.predict(trace, apply)`: the command line's name
works in Python too (this package is callable; see perfcast._CALLABLE_PACKAGES).
"""

from perfcast import _make_callable

_make_callable(__name__)
