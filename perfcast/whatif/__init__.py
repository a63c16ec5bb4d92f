"""What-if transformations of the dependency graph, and the optimization models built on them.

`perfcast.whatif(trace, apply)` is `perfcast.predict(trace, apply)`: the command line's name
works in Python too (this package is callable).
"""

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """`perfcast.whatif(trace, apply, correct=True)`: the same as `perfcast.predict`."""
        from perfcast.api import predict

        return predict(*args, **kwargs)


# A function named `whatif` in the package would be replaced by this subpackage as soon as
# anything imported it (which depended on what a notebook had run before); the module
# answers the call instead.
sys.modules[__name__].__class__ = _CallableModule
