"""Hand results and events to pandas, polars or Arrow (optional extra `dataframe`).

Every analysis result is a dataclass whose list-of-row fields are its tables (`Tables`):
`result.table_names()` lists them, `result.to_pandas()` gives the first one as a DataFrame and
`result.to_pandas("by_stream")` a named one. An `EventTable` converts column by column:
numeric columns are handed over without a copy where the library allows it, and names become
categoricals (the interned strings once, plus the int32 codes the table already has).

    >>> import perfcast
    >>> table = perfcast.load("perfcast/examples/ddp_a100_rank0.json.gz")
    >>> df = table.to_pandas()                          # one row per event   # doctest: +SKIP
    >>> perfcast.idle_time(table).to_pandas("by_stream")                     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from perfcast.display import Displayed
from perfcast.errors import NotApplicableError, OptionError, PerfcastError
from perfcast.events import ArrowTable, PandasFrame, PolarsFrame

if TYPE_CHECKING:
    from perfcast.events import EventTable

Columns = dict[str, Any]  # column name -> NumPy array or list


def _need(module: str, extra: str = "dataframe") -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise PerfcastError(
            f"this needs {module.split('.')[0]}, which is not installed",
            # The package's name: perfcast's extra is spelled from a checkout ('.[extra]').
            hint=f"pip install {module.split('.')[0]} (or pip install '.[{extra}]' in "
            "perfcast's checkout for all of that extra)",
        ) from None


# ---------------------------------------------------------------------------------------------
# Results


def _is_row_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and dataclasses.is_dataclass(value[0])
        and not isinstance(value[0], type)
    )


def _scalar(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.name.lower()
    if isinstance(v, (list, tuple, dict)):
        return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
    return v


class TypedColumns(dict[str, Any]):
    """Columns that know the type each row field declares ("float", "int", "bool", "str"):
    a column of Nones, or a table of no rows, still gets its dtype in pandas, polars and
    Arrow (they guessed object, null or float64 from the values, so one table's dtypes
    changed from trace to trace)."""

    def __init__(self, data: dict[str, Any], kinds: dict[str, str]) -> None:
        super().__init__(data)
        self.kinds = kinds


def field_kinds(row_type: type) -> dict[str, str]:
    """Per field of a row dataclass, the scalar kind its annotation declares ("int?" for an
    optional int); enums and containers are "str", as `_scalar` writes them; fields of other
    types are left out."""
    out: dict[str, str] = {}
    try:
        hints = typing.get_type_hints(row_type)
    except (NameError, TypeError):  # an annotation that cannot be resolved: guess as before
        return out
    for name, hint in hints.items():
        origin = typing.get_origin(hint)
        if origin is None:
            args, optional = {hint}, False
        elif origin in (typing.Union, types.UnionType):
            args = set(typing.get_args(hint))
            optional = type(None) in args
            args.discard(type(None))
        elif origin in (list, tuple, dict):  # written as text (`_scalar`)
            out[name] = "str"
            continue
        else:  # Callable[...] and the like: not a column
            continue
        if len(args) == 1 and isinstance(arg := next(iter(args)), type):
            if issubclass(arg, enum.Enum):  # written by name (`_scalar`)
                out[name] = "str"
                continue
            if arg in (list, tuple, dict):
                out[name] = "str"
                continue
        if args == {bool}:
            out[name] = "bool"
        elif args == {int}:
            out[name] = "int?" if optional else "int"
        elif args <= {float, int} and float in args:
            out[name] = "float"
        elif args == {str}:
            out[name] = "str"
    return out


def rows_to_columns(rows: list[Any], row_type: type | None = None) -> Columns:
    """A list of row dataclasses as columns (nested lists become comma-joined text)."""
    if not rows and row_type is None:
        return {}
    kind = row_type or type(rows[0])
    fields = [f.name for f in dataclasses.fields(kind)]
    return TypedColumns(
        {name: [_scalar(getattr(r, name)) for r in rows] for name in fields}, field_kinds(kind)
    )


_ARROW_TYPES = {
    "float": "float64", "int": "int64", "int?": "int64", "bool": "bool_", "str": "string"
}  # fmt: skip
_POLARS_TYPES = {"float": "Float64", "int": "Int64", "int?": "Int64", "bool": "Boolean",
                 "str": "String"}  # fmt: skip


def _pandas_column(values: Any, kind: str | None) -> Any:
    """A column for pandas in its declared dtype: None is NaN in a float column and <NA>
    in an int one (pandas' nullable Int64, for every optional int column, so its dtype does
    not depend on whether a None came up); a column whose values do not fit the declared
    type (an int field holding 1.5) stays as it was."""
    if kind is None or isinstance(values, np.ndarray):
        return values
    try:
        if kind == "float":
            return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        if kind == "int?" or (kind == "int" and any(v is None for v in values)):
            return _need("pandas").array(values, dtype="Int64")  # refuses 1.5
        if kind in ("int", "bool"):
            column = np.array(values)
            want = "iu" if kind == "int" else "b"
            if column.dtype.kind in want:
                return column.astype(np.int64 if kind == "int" else bool)
            if not values:
                return np.zeros(0, dtype=np.int64 if kind == "int" else bool)
        if kind == "str" and not values:  # as pandas reads a column of text
            return _need("pandas").Series([], dtype=str)
    except (TypeError, ValueError, OverflowError):
        pass
    return values


def dicts_to_columns(
    rows: list[dict[str, Any]], keys: Sequence[str], kinds: dict[str, str] | None = None
) -> Columns:
    """Row dicts (each with `keys`) as columns; no rows, the same columns, empty (a table of
    no kernels still has its columns, so code that selects them runs on a CPU-only trace).
    `kinds` declares columns' types (see TypedColumns), for those that can be all None."""
    cols = {k: [r[k] for r in rows] for k in keys}
    return TypedColumns(cols, kinds) if kinds else cols


def result_tables(result: Any) -> dict[str, Columns]:
    """Every table of a result dataclass: its fields that are lists of row dataclasses.

    Empty lists still give a table (with its columns) when the field's row type is known
    from `Tables.ROW_TYPES`.
    """
    out: dict[str, Columns] = {}
    row_types: dict[str, type] = getattr(result, "ROW_TYPES", {})
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if _is_row_list(value):
            out[f.name] = rows_to_columns(value)
        elif isinstance(value, list) and not value and f.name in row_types:
            out[f.name] = rows_to_columns([], row_types[f.name])
    return out


def scalar_columns(result: Any) -> Columns | None:
    """A result's own figures that are not tables (stragglers' candidate ranks, roofline's
    coverage, counts) as one row, lists of numbers joined by spaces; None when it has none.
    Notes are left to the JSON."""
    row: Columns = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if f.name == "notes" or _is_row_list(value):
            continue
        if isinstance(value, (bool, int, float, str)):
            row[f.name] = [value]
        elif isinstance(value, list) and all(
            isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in value
        ):
            if f.name in getattr(result, "ROW_TYPES", {}):
                continue  # an empty table, written as such
            row[f.name] = [" ".join(str(v) for v in value)]
    return row or None


def columns_to_pandas(cols: Columns) -> Any:
    pd = _need("pandas")
    kinds: dict[str, str] = getattr(cols, "kinds", {})
    return pd.DataFrame({k: _pandas_column(v, kinds.get(k)) for k, v in cols.items()}, copy=False)


def columns_to_arrow(cols: Columns) -> Any:
    pa = _need("pyarrow")
    kinds: dict[str, str] = getattr(cols, "kinds", {})
    arrays = {}
    for k, v in cols.items():
        if isinstance(v, np.ndarray):
            arrays[k] = v
            continue
        want = _ARROW_TYPES.get(kinds.get(k, ""))
        try:
            arrays[k] = pa.array(v, type=getattr(pa, want)()) if want else pa.array(v)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            arrays[k] = pa.array(v)
    return pa.table(arrays)


def columns_to_polars(cols: Columns) -> Any:
    pl = _need("polars")
    kinds: dict[str, str] = getattr(cols, "kinds", {})
    series = []
    for k, v in cols.items():
        want = _POLARS_TYPES.get(kinds.get(k, ""))
        try:
            series.append(pl.Series(k, v, dtype=getattr(pl, want) if want else None))
        except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
            series.append(pl.Series(k, v))
    return pl.DataFrame(series)


class Tables(Displayed):
    """Mixin for result dataclasses: their list-of-row fields as DataFrames.

    Example:
        >>> r = perfcast.kernel_breakdown("trace.json.gz")      # doctest: +SKIP
        >>> r.table_names()                                     # doctest: +SKIP
        ['by_kind', 'overlap', 'top', 'across_ranks']
        >>> r.to_pandas("top").head()                           # doctest: +SKIP
    """

    ROW_TYPES: dict[str, type] = {}  # noqa: RUF012  (class-level metadata, never mutated)

    def _tables(self) -> dict[str, Columns]:
        """Every table of the result by name, the main one first (a result whose rows nest,
        as a summary's steps inside its ranks, flattens them here)."""
        return result_tables(self)

    def table_names(self) -> list[str]:
        """Names of this result's tables, the main one first."""
        return list(self._tables())

    def table(self, name: str | None = None) -> Columns:
        """One table as plain columns (lists), the first one when `name` is None."""
        tables = self._tables()
        if not tables:
            raise NotApplicableError(f"{type(self).__name__} has no rows to tabulate")
        if name is None:
            return next(iter(tables.values()))
        if not isinstance(name, str) or name not in tables:
            raise OptionError(
                f"{type(self).__name__} has no table {name!r}", hint=f"one of {list(tables)}"
            )
        return tables[name]

    def to_pandas(self, name: str | None = None) -> PandasFrame:
        """One table as a pandas DataFrame (needs pandas)."""
        return columns_to_pandas(self.table(name))

    def to_polars(self, name: str | None = None) -> PolarsFrame:
        """One table as a polars DataFrame."""
        return columns_to_polars(self.table(name))

    def to_arrow(self, name: str | None = None) -> ArrowTable:
        """One table as a pyarrow Table."""
        return columns_to_arrow(self.table(name))


def short_repr(result: Any) -> str:
    """`Name(table: N rows, ...; notes: K)`: what a result holds, never its whole content."""
    parts = []
    for f in dataclasses.fields(result):
        v = getattr(result, f.name)
        if isinstance(v, list):
            if _is_row_list(v):
                parts.append(f"{f.name}: {len(v)} rows")
            elif len(repr(v)) < 60:
                parts.append(f"{f.name}={v!r}")
            else:
                parts.append(f"{f.name}: {len(v)} items")
        elif dataclasses.is_dataclass(v):
            parts.append(f"{f.name}: {type(v).__name__}")
        elif v is None or isinstance(v, (int, float, str, bool)):
            text = repr(v)
            parts.append(f"{f.name}={text if len(text) < 60 else text[:57] + '...'}")
    return f"{type(result).__name__}({', '.join(parts)})"


# ---------------------------------------------------------------------------------------------
# Events

# Columns handed over as they are (one value per event).
_PLAIN = (
    "rank", "pid", "tid", "ts", "dur", "correlation", "external_id", "seq", "fwd_tid",
    "parent", "iteration", "nbytes", "mem_total", "mem_device", "coll_in", "coll_out",
    "coll_group", "wait_stream", "wait_corr", "launch",
)  # fmt: skip
# Columns that index `names` (NONE = -1 where absent).
_NAMED = (
    "name", "shapes", "in_types", "stack", "concrete", "coll_name", "coll_dtype", "coll_ranks",
)  # fmt: skip


def event_columns(table: EventTable) -> dict[str, Any]:
    """The table's columns: plain arrays, plus (codes, names) pairs for the named ones."""
    cols: dict[str, Any] = {"kind": table.kind}
    for c in _PLAIN:
        cols[c] = getattr(table, c)
    for c in _NAMED:
        cols[c] = (getattr(table, c), table.names)
    return cols


def events_to_pandas(table: EventTable) -> Any:
    """One row per event; `kind` and the name columns are categoricals, times in ns. A copy:
    editing the frame leaves the table (and what perfcast computes from it) unchanged.
    Integer columns hold -1 where a value is absent (no correlation id, no parent, no byte
    count, ...), as the table does: filter on `>= 0` before summing."""
    pd = _need("pandas")
    from perfcast.events import Kind

    kinds = [k.name.lower() for k in Kind]
    data: dict[str, Any] = {}
    for key, col in event_columns(table).items():
        if key == "kind":
            data[key] = pd.Categorical.from_codes(col.astype(np.int16), categories=kinds)
        elif isinstance(col, tuple):
            codes, names = col
            # from_codes wants unique categories; interned names are unique by construction.
            data[key] = pd.Categorical.from_codes(codes, categories=pd.Index(names))
        else:
            data[key] = col
    # copy=True: pandas' copy-on-write guards frames from each other, not a numpy array
    # the frame was built on, so an in-place edit (df.loc[:, "ts"] = 0) reached the table.
    return pd.DataFrame(data, copy=True)


def events_to_arrow(table: EventTable) -> Any:
    """One row per event as a pyarrow Table; name columns are dictionary-encoded."""
    pa = _need("pyarrow")
    from perfcast.events import Kind

    kinds = pa.array([k.name.lower() for k in Kind])
    names = pa.array(table.names, type=pa.string())
    arrays: dict[str, Any] = {}
    for key, col in event_columns(table).items():
        if key == "kind":
            arrays[key] = pa.DictionaryArray.from_arrays(pa.array(col), kinds)
        elif isinstance(col, tuple):
            codes = col[0]
            idx = pa.array(codes, mask=codes < 0)  # absent -> null
            arrays[key] = pa.DictionaryArray.from_arrays(idx, names)
        else:
            arrays[key] = pa.array(col)
    return pa.table(arrays)


def events_to_polars(table: EventTable) -> Any:
    """One row per event as a polars DataFrame (via Arrow: categoricals kept)."""
    pl = _need("polars")
    return pl.from_arrow(events_to_arrow(table))


# ---------------------------------------------------------------------------------------------
# Files


def write_tables(tables: dict[str, Columns], folder: str, fmt: str) -> list[str]:
    """Write each table to FOLDER/<name>.csv or .parquet; the paths written.

    CSV needs nothing beyond the standard library; Parquet needs pyarrow.
    """
    import csv
    import os

    if os.path.exists(folder) and not os.path.isdir(folder):
        raise PerfcastError("not a folder", path=folder)
    os.makedirs(folder, exist_ok=True)
    written = []
    for name, cols in tables.items():
        path = os.path.join(folder, f"{name}.{fmt}")
        if fmt == "csv":
            keys = list(cols)
            n = len(cols[keys[0]]) if keys else 0
            with open(path, "w", newline="", encoding="utf-8") as fh:
                w = csv.writer(fh)
                w.writerow(keys)
                columns = [list(cols[k]) for k in keys]
                for i in range(n):
                    w.writerow([c[i] for c in columns])
        elif fmt == "parquet":
            pq = _need("pyarrow.parquet")
            pq.write_table(columns_to_arrow(cols), path)
        else:
            raise OptionError(f"unknown table format {fmt!r}")
        written.append(path)
    return written


def plain(obj: Any) -> Any:
    """Replace NumPy scalars inside a result (dataclasses and lists, in place) by Python
    numbers, so msgspec and json can encode it; returns `obj`."""
    if isinstance(obj, list):
        for i, v in enumerate(obj):
            if isinstance(v, np.generic):
                obj[i] = v.item()
            elif isinstance(v, list) or (dataclasses.is_dataclass(v) and not isinstance(v, type)):
                plain(v)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if isinstance(v, np.generic):
                setattr(obj, f.name, v.item())
            elif isinstance(v, list) or (dataclasses.is_dataclass(v) and not isinstance(v, type)):
                plain(v)
    return obj
