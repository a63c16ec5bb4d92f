"""What-if transformations of the dependency graph, and the optimization models built on them.

`perfcast.whatif(trace, apply)` is `perfcast.predict(trace, apply)`: the command line's name
works in Python too (this package is callable).
"""

import importlib
import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """`perfcast.whatif(trace, apply, correct=True)`: the same as `perfcast.predict`."""
        from perfcast.api import predict

        return predict(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Pickled by name, as a plain module is (cloudpickle ships a function that uses it
        # to Ray, joblib or dask workers), and imported again there.
        return importlib.import_module, (self.__name__,)


# A function named `whatif` in the package would be replaced by this subpackage as soon as
# anything imported it (which depended on what a notebook had run before); the module
# answers the call instead.
sys.modules[__name__].__class__ = _CallableModule
