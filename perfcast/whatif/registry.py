"""Optimization models by name, and `NAME:key=value,...` option parsing."""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
import types
from typing import Any, get_type_hints

import numpy as np

from perfcast.errors import OptionError, OptionValueError, PerfcastError

# name -> module under perfcast.whatif.models; each module defines
# SUMMARY (one line), Options (a dataclass) and apply(graph, options) -> Graph.
MODEL_MODULES: dict[str, str] = {
    "faster-op": "faster_op",
    "amp": "amp",
    "fused-optimizer": "fused_optimizer",
    "cuda-graphs": "cuda_graphs",
    "fuse-elementwise": "fuse_elementwise",
    "torch-compile": "torch_compile",
    "dataloader-overlap": "dataloader_overlap",
    "remove-host-sync": "remove_host_sync",
    "device": "device",
    "ddp": "ddp",
    "activation-checkpointing": "activation_checkpointing",
    "batch-size": "batch_size",
    "zero": "zero",
    "tensor-parallel": "tensor_parallel",
    "pipeline-parallel": "pipeline_parallel",
}


# The order code changes compose in. The program they make together is the same whichever
# order a user names them, but the models read what came before them: activation
# checkpointing needs a backward pass to recompute in (a captured step has none), torch.compile
# compiles what amp cast and checkpointing recomputes, a CUDA graph (torch.compile's
# reduce-overhead too) captures whatever the step has become (a fused optimizer needs no
# capturable per-parameter kernels; a sync removed after a capture would still have split
# it). Applied in the other order, pairs differed by up to 20% on the shared traces.
# DataLoader overlap comes last of all (after faster-op, device and scale-out too): it sizes
# the main thread's wait for a batch from the rest of the step as the graph has it then, so
# no step is shorter than the workers' pace; a change applied after it shortened that rest
# again (cnn + torch-compile on the H200: 5.55x where 4 workers cap the step at 4.87x).
PLAN_ORDER: tuple[str, ...] = (
    "batch-size",
    "fused-optimizer",
    "amp",
    "activation-checkpointing",
    "remove-host-sync",
    "fuse-elementwise",
    "torch-compile",
    "cuda-graphs",
    "dataloader-overlap",
)
_LAST = "dataloader-overlap"


def in_plan_order(specs: list[Spec]) -> list[Spec]:
    """`specs` with those in PLAN_ORDER sorted into it among themselves; the others
    (faster-op, device, scale-out: where they go is the user's to say) keep their places;
    dataloader-overlap after all of them (see PLAN_ORDER)."""
    out = [s for s in specs if s.name != _LAST]
    planned = [i for i, s in enumerate(out) if s.name in PLAN_ORDER]
    ordered = sorted((out[i] for i in planned), key=lambda s: PLAN_ORDER.index(s.name))
    for i, spec in zip(planned, ordered, strict=True):
        out[i] = spec
    return out + [s for s in specs if s.name == _LAST]


def get_model(name: str) -> types.ModuleType:
    mod = MODEL_MODULES.get(name)
    if mod is None:
        known = ", ".join(sorted(MODEL_MODULES))
        raise OptionError(f"unknown optimization '{name}'", hint=f"known: {known}")
    try:
        return importlib.import_module(f"perfcast.whatif.models.{mod}")
    except ModuleNotFoundError as exc:
        raise PerfcastError(
            f"optimization '{name}' is not available in this build ({exc})"
        ) from None


def describe_models() -> list[tuple[str, str]]:
    out = []
    for name in MODEL_MODULES:
        try:
            out.append((name, get_model(name).SUMMARY))
        except PerfcastError:
            continue
    return out


def model_defaults(name: str) -> dict[str, Any]:
    """A model's options and their defaults (None: decided from the trace). Read off a
    default Options, not build_options, whose checks refuse a default some models need
    given (device's target)."""
    options = get_model(name).Options()
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


@dataclasses.dataclass
class Spec:
    name: str
    options: dict[str, str]

    def __str__(self) -> str:
        if not self.options:
            return self.name
        return self.name + ":" + ",".join(f"{k}={_quoted(v)}" for k, v in self.options.items())


_OPENERS = {"(": ")", "[": "]", "{": "}", "<": ">"}
_NEXT_KEY = re.compile(r"\s*[A-Za-z_][\w-]*=")


def _split_options(rest: str, strict: bool = False) -> list[str]:
    """`rest` split at its top-level commas. A comma inside quotes or brackets belongs to
    the value: a regex quantifier (`x{2,3}`), a kernel name's template arguments
    (`kernel<4, float>`). Brackets that do not balance split as plain commas; a quote that
    is never closed is an error where `strict` (what the user typed), else plain commas."""
    parts: list[str] = []
    closing: list[str] = []
    quote = ""
    current: list[str] = []
    escaped = False
    for i, ch in enumerate(rest):
        if ch == "," and closing and not quote and not escaped and _NEXT_KEY.match(rest, i + 1):
            closing = []  # `a<b,module=c>d`: a bracket never spans into the next option
        if escaped:  # a regex's `\(` or `\{` is a character, not a bracket
            escaped = False
        elif ch == "\\":
            escaped = True
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"" and (not current or current[-1] == "="):
            quote = ch
        elif ch in _OPENERS:
            closing.append(_OPENERS[ch])
        elif closing and ch == closing[-1]:
            closing.pop()
        elif ch == "," and not closing:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    if quote and strict:
        raise OptionError(
            f"the quote {quote} in '{rest}' is never closed",
            hint="quote a whole value that holds a comma: pattern='a,b'",
        )
    if closing or quote:
        return rest.split(",")
    return parts


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _quoted(value: str) -> str:
    """The value as parse_spec reads it back (quoted when a comma would split it)."""
    if len(_split_options(value)) > 1:
        return f"'{value}'" if "'" not in value else f'"{value}"'
    return value


def parse_spec(text: str) -> Spec:
    """`amp:dtype=bf16,device=h100` -> Spec("amp", {"dtype": "bf16", "device": "h100"}).
    A value may hold commas inside brackets (`pattern=x{2,3}`) or quotes
    (`pattern='gemm,conv'`)."""
    name, _, rest = text.partition(":")
    if not name.strip():
        # `--apply ''` or `:x=1` read as "unknown optimization ''", as if '' were a name.
        known = ", ".join(sorted(MODEL_MODULES))
        raise OptionError(
            f"the what-if '{text}' names no optimization",
            hint=f"write NAME or NAME:key=value, NAME one of: {known}",
        )
    options: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in _split_options(rest, strict=True))):
        key, eq, value = part.partition("=")
        if not eq:
            raise OptionError(
                f"option '{part}' in '{text}' is not key=value",
                hint="write NAME:key=value,key2=value2; quote a value that holds a comma: "
                "pattern='a,b'",
            )
        key = key.strip().replace("-", "_")
        if key in options:  # the last one would win, silently
            raise OptionError(
                f"option '{key}' is given twice in '{text}'", hint="give each option once"
            )
        options[key] = _unquoted(value.strip())
    get_model(name.strip())  # fail early on unknown names
    return Spec(name.strip(), options)


def checked_specs(texts: list[str]) -> list[Spec]:
    """Parse specs and build their options: unknown names, unknown options and values of
    the wrong type fail here, before a trace is read."""
    specs = [parse_spec(t) for t in texts]
    for spec in specs:
        build_options(spec.name, spec.options)
    return specs


def build_options(name: str, raw: dict[str, Any]) -> Any:
    """The model's Options dataclass from string (or typed) values."""
    module = get_model(name)
    cls = module.Options
    hints = get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise OptionError(
                f"'{name}' has no option '{key}'",
                hint="options: " + (", ".join(sorted(fields)) or "none"),
            )
        kwargs[key] = _convert(name, key, value, hints[key])
    options = cls(**kwargs)
    # Values the model cannot take, refused before any trace is read: every caller (whatif,
    # advise, the memory model) gets the same answer.
    check = getattr(module, "check_options", None)
    if check is not None:
        check(options)
    return options


# Numeric options are bounded: a factor of 1e26 overflowed durations (int64 ns), inf and
# nan are no size at all.
MAX_OPTION = 1e6
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _option_type(hint: Any) -> tuple[str | None, bool]:
    """The option's type as one of bool, int, float, str (None: another type, taken as
    given) and whether it may be None; `hint` is a type or, under postponed annotations,
    its text ("int | None")."""
    text = str(hint)
    base = text.removesuffix(" | None").removeprefix("<class '").removesuffix("'>")
    return (base if base in _TYPE_HINTS else None), text.endswith(" | None")


# What to give, per option type, when a value is of another.
_TYPE_HINTS = {
    "bool": "give True or False",
    "int": "give a whole number",
    "float": "give a number",
    "str": "give a string",
}


def _typed(model: str, key: str, value: Any, hint: Any) -> Any:
    """A value given as a Python object (the API's `(name, {key: value})`), checked against
    the option's type, and numbers against the same bounds as text."""
    kind, optional = _option_type(hint)
    if value is None:
        if optional:
            return None
        raise OptionError(
            f"option {key}=None of '{model}' needs a value",
            hint=_TYPE_HINTS.get(kind or "", "see perfcast whatif --list"),
        )
    if kind is None:
        return value
    if kind == "bool":
        ok = isinstance(value, (bool, np.bool_))
    elif kind == "str":
        ok = isinstance(value, str)
    else:
        numeric = (np.integer,) if kind == "int" else (float, np.integer, np.floating)
        ok = isinstance(value, (int, *numeric)) and not isinstance(value, bool)
    if not ok:
        raise OptionError(
            f"option {key}={value!r} of '{model}' has the wrong type ({type(value).__name__})",
            hint=_TYPE_HINTS[kind],
        )
    if kind == "bool":
        return bool(value)
    if kind == "str":
        return value
    _check_number(model, key, value, float(value))
    return int(value) if kind == "int" else float(value)


def _check_number(model: str, key: str, value: Any, number: float) -> None:
    if not abs(number) <= MAX_OPTION:  # also nan
        raise OptionError(
            f"option {key}={value} of '{model}' is out of range",
            hint=f"a finite number of at most {MAX_OPTION:,.0f} in size",
        )
    if number < 0:  # no option counts, sizes or times below zero
        # Said as what it is, not ">= 0": some options take no 0 either (tp, gpus).
        raise OptionValueError(f"{model}: {key} cannot be negative ({value})")


def _convert(model: str, key: str, value: Any, hint: Any) -> Any:
    if not isinstance(value, str):
        return _typed(model, key, value, hint)
    kind, _ = _option_type(hint)
    try:
        if kind == "bool":
            word = value.strip().lower()
            if word not in _TRUE + _FALSE:
                raise OptionError(
                    f"option {key}={value} of '{model}' is not true or false",
                    hint=f"write {key}=true or {key}=false",
                )
            return word in _TRUE
        if kind == "int":
            number: float = _whole(model, key, value)
        elif kind == "float":
            number = float(value)
        else:
            return value
    except ValueError:
        raise OptionError(f"option {key}={value} of '{model}' is not a number") from None
    _check_number(model, key, value, number)
    return int(number) if kind == "int" else number


def _whole(model: str, key: str, value: str) -> int | float:
    try:
        return int(value)
    except ValueError:
        number = float(value)  # not a number at all: the caller says so
    if number.is_integer():  # 1e3, 8.0: whole, written another way
        return number  # the caller bounds it, then makes it an int
    if not math.isfinite(number):  # inf, nan: the caller's bounds say so
        return number
    raise OptionError(f"option {key}={value} of '{model}' is not a whole number")
