"""perfcast: predict how much faster a PyTorch training step gets, from its profiler trace."""

import importlib
import inspect
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfcast.api import (
        advise,
        analyze,
        collectives,
        dependency_graph,
        diff,
        gpu_counters,
        idle_time,
        kernel_breakdown,
        launch_queue,
        launch_stats,
        memory,
        op_kernels,
        predict,
        replay,
        roofline,
        scopes,
        stragglers,
        summary,
        tree,
    )
    from perfcast.api import predict as whatif
    from perfcast.plan import plan_trace as plan
from perfcast.errors import (
    InternalError,
    NotApplicableError,
    OptionError,
    PerfcastError,
    TraceFormatError,
)
from perfcast.events import EventTable, Kind
from perfcast.ingest import load

__version__ = "0.1.0"

__all__ = [
    "EventTable",
    "InternalError",
    "Kind",
    "NotApplicableError",
    "OptionError",
    "PerfcastError",
    "TraceFormatError",
    "__version__",
    "advise",
    "analyze",
    "collectives",
    "dependency_graph",
    "diff",
    "gpu_counters",
    "idle_time",
    "kernel_breakdown",
    "launch_queue",
    "launch_stats",
    "load",
    "memory",
    "op_kernels",
    "plan",
    "predict",
    "replay",
    "roofline",
    "scopes",
    "stragglers",
    "summary",
    "tree",
    "whatif",
]

# The API's functions are imported on first use: the command line imports this package for
# its version, and the API's module imports every result type (so that
# typing.get_type_hints resolves them), which costs ~0.4 s the command line need not pay.
_API_FUNCTIONS = frozenset(
    name for name in __all__ if name not in globals() and name not in ("plan", "whatif")
)


# Subpackages named as the command line's commands, callable: perfcast.whatif(...) is
# perfcast.predict(...), perfcast.plan(...) is perfcast.plan.plan_trace(...). A function of
# that name in this package would be replaced by the subpackage as soon as anything imported
# it (so what a notebook saw depended on what it had run before): the module answers the call.
_CALLABLE_PACKAGES = {"whatif": "perfcast.api:predict", "plan": "perfcast.plan:plan_trace"}


class _CommandModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, function = _CALLABLE_PACKAGES[self.__name__.rpartition(".")[2]].split(":")
        return getattr(importlib.import_module(module), function)(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        # What help(), a notebook's `?` and tab completion show: the function's own.
        module, function = _CALLABLE_PACKAGES[self.__name__.rpartition(".")[2]].split(":")
        return inspect.signature(getattr(importlib.import_module(module), function))

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Pickled by name, as a plain module is (cloudpickle ships a function that uses it
        # to Ray, joblib or dask workers), and imported again there.
        return importlib.import_module, (self.__name__,)


def _make_callable(module_name: str) -> None:
    """Called by the subpackages in _CALLABLE_PACKAGES as they are imported."""
    sys.modules[module_name].__class__ = _CommandModule


def __getattr__(name: str) -> object:
    if name in _CALLABLE_PACKAGES:
        return importlib.import_module(f"perfcast.{name}")
    if name in _API_FUNCTIONS or name == "api":
        # import_module, not `from perfcast import api`: that asks this hook for "api" again
        api = importlib.import_module("perfcast.api")
        return api if name == "api" else getattr(api, name)
    raise AttributeError(f"module 'perfcast' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _API_FUNCTIONS | set(_CALLABLE_PACKAGES) | {"api"})
