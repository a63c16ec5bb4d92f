"""`load(path)`: one trace file or a folder of rank files -> EventTable."""

from __future__ import annotations

import bisect
import itertools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfcast.errors import NotATraceError, OptionError, TraceFormatError, UnreadableTraceError
from perfcast.events import NONE, STEP_PREFIX, EventTable, Iteration, Kind, RankInfo
from perfcast.ingest import reader
from perfcast.ingest.normalize import Interner, RankColumns, extract_rank, printable
from perfcast.ingest.schema import NON_LAUNCHING_CALLS
from perfcast.machine import machine_id
from perfcast.parallel import map_ordered, worker_count
from perfcast.paths import not_a_file

_RANK_IN_NAME = re.compile(r"(?:rank|worker|node|gpu|proc)[-_.]?(\d+)", re.IGNORECASE)
_CPU_KINDS = np.array(
    [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION, Kind.RUNTIME, Kind.DRIVER],
    dtype=np.int8,
)
_GPU_KINDS = np.array([Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET], dtype=np.int8)

ProgressFn = Callable[[str, int, int], None]


def load(path: str | os.PathLike[str], progress: ProgressFn | None = None) -> EventTable:
    """Load a trace file (.json / .json.gz) or a folder of per-rank trace files."""
    if not isinstance(path, (str, os.PathLike)):
        raise OptionError(
            f"a trace is a path (str or pathlib.Path) to a file or folder, not {path!r}"
        )
    if progress is not None and not callable(progress):
        raise OptionError(
            f"progress must be a function (file, done, total) or None, not {progress!r}"
        )
    path = os.fspath(path)
    if not path:
        raise OptionError("the trace path is empty: give a trace file or a folder of them")
    try:
        os.stat(path)
    except (FileNotFoundError, ValueError):  # ValueError: a NUL in the path
        if path == "-":
            # The Unix habit for standard input: say it is not one, not "no such file".
            raise TraceFormatError(
                "'-' (standard input) is not read: a trace is read from a file",
                hint="save the trace to a file and pass its path",
            ) from None
        raise TraceFormatError("no such file or folder", path=path) from None
    except OSError as exc:  # os.path.exists says False here too, which reads as "no file"
        raise TraceFormatError(
            f"cannot be read ({exc.strerror or exc})", path=path, hint=reader.os_error_hint(exc)
        ) from None
    special = not_a_file(path, folders=True)
    if special:
        raise TraceFormatError(special, path=path)
    in_folder = os.path.isdir(path)
    if in_folder:
        try:
            files = reader.trace_files_in(path)
        except OSError as exc:
            raise TraceFormatError(
                f"folder cannot be listed ({exc.strerror or exc})",
                path=path,
                hint="check its permissions",
            ) from None
        if not files:
            cycles = reader.cycle_folders_in(path)
            raise TraceFormatError(
                "folder holds no trace files",
                path=path,
                hint=(
                    f"it holds one folder per profiled cycle ({', '.join(cycles[:3])}"
                    f"{', ...' if len(cycles) > 3 else ''}): pass one of them, e.g. "
                    f"{os.path.join(path, cycles[-1])}"
                    if cycles
                    else "expected *.json or *.json.gz files written by torch.profiler"
                ),
            )
    else:
        files = [path]
    names = Interner()
    parts: list[tuple[RankInfo, RankColumns, dict[str, np.ndarray], list[Iteration]]] = []
    seen: dict[int, str] = {}
    processes: dict[str, str] = {}  # host_pid of a handler-named file numbered by order -> file
    jobs = [(f, i if len(files) > 1 else None, in_folder) for i, f in enumerate(files)]
    not_traces: list[_NotATrace] = []
    for i, (f, loaded) in enumerate(
        zip(files, map_ordered(_load_and_derive, jobs, worker_count(files)))
    ):
        if progress:
            progress(f, i, len(files))
        if isinstance(loaded, _NotATrace):
            not_traces.append(loaded)
            continue
        info, cols, derived, iterations, local_names = loaded
        others = sum(not e.unreadable for e in not_traces)
        if info.rank_by_order and others:
            # Numbered by its place in the folder: among the files that are traces (a rank
            # file that cannot be read still holds its place).
            info.rank = i - others
            for it in iterations:
                it.rank = info.rank
        if info.rank in seen:
            raise TraceFormatError(
                f"claims rank {info.rank}, which {seen[info.rank]} already claims",
                path=f,
                hint="put one trace per rank in the folder",
            )
        seen[info.rank] = f
        # A file that says no rank is numbered by its place; but two files of one process
        # (tensorboard_trace_handler writes one per profiling cycle into the same folder) are
        # two windows of one rank, not two ranks.
        handler = _HANDLER_NAME.fullmatch(os.path.basename(f)) if info.rank_by_order else None
        if handler is not None:
            first = processes.setdefault(handler.group(1), f)
            if first != f:
                raise TraceFormatError(
                    f"is a second trace of the process that wrote {os.path.basename(first)} "
                    f"(both named {handler.group(1)}.<time>.pt.trace.json, as torch.profiler's "
                    "tensorboard_trace_handler names one process's files), not another rank",
                    path=f,
                    hint="a folder holds one trace per rank: pass one of the files, or put "
                    "each profiling cycle's files in a folder of its own",
                )
        _reintern(cols, local_names, names)
        parts.append((info, cols, derived, iterations))
    if progress:
        progress("", len(files), len(files))
    if not parts:  # nothing in the folder is a trace: the first files say why
        raise TraceFormatError(
            f"folder holds no readable trace: {_listed(not_traces)}",
            path=path,
            hint=None
            if all(e.unreadable for e in not_traces)
            else "expected *.json or *.json.gz files written by torch.profiler",
        )
    _note_left_out(parts[0][0], [e for e in not_traces if not e.unreadable])
    _note_left_out(parts[0][0], [e for e in not_traces if e.unreadable])
    if len(files) > 1 or in_folder:
        _note_folder_doubts(path, [p[0] for p in parts])
    _sort_names(parts, names)
    return _concat(parts, names)


@dataclass(frozen=True)
class _NotATrace:
    """A file of a folder that holds no trace, and why (what its NotATraceError said);
    `unreadable`: a rank's trace none of which can be read (UnreadableTraceError), `output`:
    JSON of another kind, likely written into the folder by a command."""

    path: str
    why: str
    unreadable: bool = False
    output: bool = False


def _listed(files: list[_NotATrace]) -> str:
    """The first three files left out, each with why."""
    shown = "; ".join(
        f"{os.path.basename(e.path)}{':' if e.unreadable else ''} {e.why}" for e in files[:3]
    )
    return shown + ("; ..." if len(files) > 3 else "")


def _note_left_out(first: RankInfo, files: list[_NotATrace]) -> None:
    """The folder note for files left out of the ranks: not traces, or unreadable ones."""
    if not files:
        return
    n = len(files)
    many = n > 1
    if files[0].unreadable:
        text = (
            f"{n} rank file{'s' if many else ''} could not be read and "
            f"{'were' if many else 'was'} left out: {_listed(files)}; the other ranks are "
            "read without "
            f"{'them' if many else 'it'}"
        )
    else:
        text = (
            f"{n} file{'s' if many else ''} of the folder {'are' if many else 'is'} no "
            f"profiler trace and {'were' if many else 'was'} not read: {_listed(files)}"
        )
        if any(e.output for e in files):
            text += " (keep outputs out of the trace folder)"
    _folder_note(first, text)


def _folder_note(first: RankInfo, note: str) -> None:
    """A note about the whole folder, kept on its first rank (every command shows a rank's
    warnings; a summary says these once, above its ranks)."""
    first.warnings.append(note)
    first.folder_notes.append(note)


def _note_folder_doubts(folder: str, infos: list[RankInfo]) -> None:
    """What a folder of ranks leaves in doubt, on its first rank: entries named like traces
    that are no file (never read), and ranks that disagree on the job's size."""
    first = infos[0]
    skipped = reader.not_files_in(folder) if os.path.isdir(folder) else []
    if skipped:
        shown = ", ".join(skipped[:3]) + (", ..." if len(skipped) > 3 else "")
        _folder_note(
            first,
            f"{len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'} of the folder named like "
            f"a trace {'is' if len(skipped) == 1 else 'are'} no file (a folder, a FIFO or a "
            f"broken link) and {'was' if len(skipped) == 1 else 'were'} not read: {shown}",
        )
    sizes = sorted({i.world_size for i in infos if i.world_size})
    if len(sizes) > 1:
        _folder_note(
            first,
            "the ranks disagree on the job's size (distributedInfo world_size "
            f"{', '.join(map(str, sizes))}): traces of different jobs in one folder?",
        )
    elif sizes and len(infos) < sizes[0]:
        # A rank missing from the folder is missing from every comparison of ranks: the
        # straggler it was cannot be named, and collectives wait on it unseen.
        _folder_note(
            first,
            f"the folder holds {len(infos):,} of the job's {sizes[0]:,} ranks "
            "(distributedInfo world_size): stragglers and collectives are those among "
            "these ranks",
        )


# Columns that hold indices into the name table.
_NAME_COLUMNS = (
    "name",
    "shapes",
    "in_types",
    "stack",
    "concrete",
    "coll_name",
    "coll_dtype",
    "coll_ranks",
)


def _load_and_derive(
    job: tuple[str, int | None, bool],
) -> tuple[RankInfo, RankColumns, dict[str, np.ndarray], list[Iteration], list[str]] | _NotATrace:
    """One file, start to finish, with its own name table (runs in a worker process). In a
    folder, a file that holds no trace is returned as its error (the folder goes on)."""
    path, rank_hint, in_folder = job
    names = Interner()
    try:
        info, cols = _load_one(path, names, rank_hint=rank_hint)
    except (NotATraceError, UnreadableTraceError) as exc:
        if not in_folder:
            raise
        why = str(exc).removeprefix(f"{path}: ")
        if isinstance(exc, UnreadableTraceError):  # what to do about it is worth saying
            return _NotATrace(path, why, unreadable=True)
        # A file that is no trace: its hint says what a trace is, which the folder's says.
        why = why.removesuffix(f" ({exc.hint})") if exc.hint else why
        return _NotATrace(path, why, output=exc.output)
    if in_folder and info.n_events == 0:
        # A JSON list of something else (a saved `whatif --list --json`) reads as a trace
        # in Chrome's array form with no events: not one more rank.
        return _NotATrace(path, "holds no trace events", output=True)
    derived, iterations = _derive(cols, names, info)
    return info, cols, derived, iterations, names.names


def _reintern(cols: RankColumns, local: list[str], names: Interner) -> None:
    """Map one file's name indices onto the shared name table."""
    if not local:
        return
    mapping = np.fromiter((names(n) for n in local), dtype=np.int32, count=len(local))
    for key in _NAME_COLUMNS:
        col = cols.cols[key]
        has = col >= 0
        col[has] = mapping[col[has]]


def _sort_names(
    parts: list[tuple[RankInfo, RankColumns, dict[str, np.ndarray], list[Iteration]]],
    names: Interner,
) -> None:
    """Number the names in sorted order, not in the order the files first hold them: rankings
    that break ties by a name's number (most frequent ops, top kernels) then do not change
    when a trace's events are written in another order or its rank files are renamed."""
    order = sorted(range(len(names.names)), key=names.names.__getitem__)
    if order == list(range(len(order))):
        return
    renumber = np.empty(len(order), dtype=np.int32)
    renumber[order] = np.arange(len(order), dtype=np.int32)
    for _, cols, _, _ in parts:
        for key in _NAME_COLUMNS:
            col = cols.cols[key]
            has = col >= 0
            col[has] = renumber[col[has]]
    names.names = [names.names[i] for i in order]
    names.index = {s: int(renumber[i]) for s, i in names.index.items()}


def _load_one(path: str, names: Interner, rank_hint: int | None) -> tuple[RankInfo, RankColumns]:
    # Streamed a few MB at a time (memory stays near the size of the columns); cut-off and
    # damaged files are salvaged on the way (see reader).
    rd = reader.TraceReader(path)
    cols = extract_rank(rd.chunks(), names, rd.event_index)
    _drop_repeated_events(cols)
    decoded = rd.result()
    raw = decoded.header
    if isinstance(raw.otherData, dict) and raw.otherData.get("generator") == "perfcast":
        raise NotATraceError(
            "is a timeline perfcast wrote (--export-trace), not a profiler trace",
            path=path,
            hint="pass the trace torch.profiler wrote; open this one in Perfetto",
            output=True,
        )
    info = RankInfo(rank=0, path=path)
    dist = raw.distributedInfo if isinstance(raw.distributedInfo, dict) else {}
    rank = _int_or_none(dist.get("rank"))
    m = _RANK_IN_NAME.search(os.path.basename(path))
    if rank is not None and 0 <= rank < 1 << 31:  # the rank column is int32
        info.rank = rank
    elif m and int(m.group(1)) < 1 << 31:
        info.rank = int(m.group(1))
    elif rank_hint is not None:
        info.rank = rank_hint
        info.rank_by_order = True
    world = _int_or_none(dist.get("world_size"))
    info.world_size = world if world is not None and 0 < world < 1 << 31 else None
    info.backend = dist.get("backend") if isinstance(dist.get("backend"), str) else None
    info.gloo_subgroups = _gloo_subgroups(dist.get("pg_config"), info.world_size)
    info.device_name = _device_name(raw.deviceProperties)
    props = raw.deviceProperties
    if isinstance(props, list) and props and isinstance(props[0], dict):
        info.device_properties = props[0]
    base = _int_or_none(raw.baseTimeNanoseconds)
    if base is not None and abs(base) < 1 << 62:
        info.base_ns = base
    schema = raw.schemaVersion
    ok = _int_or_none(schema) is not None or isinstance(schema, str)
    info.schema_version = schema if ok else None
    info.machine = _machine_of(raw, path)
    info.unprofiled_step_ms = _read_unprofiled_steps(
        raw.perfcast_unprofiled_step_ms, info, "perfcast_unprofiled_step_ms"
    )
    info.unprofiled_after_step_ms = _read_unprofiled_steps(
        raw.perfcast_unprofiled_after_step_ms, info, "perfcast_unprofiled_after_step_ms"
    )
    info.last_step_open = raw.perfcast_last_step_open is True
    info.truncated = decoded.truncated
    info.tail_lost = decoded.tail_lost
    info.damage = decoded.damage
    info.tail_stop = decoded.stop
    info.salvage_note = decoded.note
    info.warnings.extend(decoded.warnings)
    info.warnings.extend(cols.warnings)
    info.n_events = len(cols.cols["kind"])
    if cols.n_dropped:
        info.warnings.append(
            f"{cols.n_dropped:,} events without a readable time were skipped (the first: "
            f"{cols.first_dropped}; a time is a number of microseconds within 146 years)"
        )
    if cols.negative_dur:
        info.warnings.append(
            f"{cols.negative_dur:,} events with a negative 'dur' were read as 0 long (the "
            f"first: {cols.first_negative})"
        )
    if cols.untimed_gpu:
        info.warnings.append(
            f"{cols.untimed_gpu:,} GPU kernels, copies or memsets have no 'dur': read as taking "
            "no GPU time"
        )
    if cols.untimed_cpu:
        info.warnings.append(
            f"{cols.untimed_cpu:,} CPU "
            f"{'op or range has' if cols.untimed_cpu == 1 else 'ops or ranges have'} no 'dur' "
            f"(the first: {cols.first_untimed}): read as taking no time"
        )
    if info.n_events == 0 and not decoded.truncated:
        info.warnings.append("the trace holds no complete events")
    kinds = cols.cols["kind"]
    n_counters = int((kinds == Kind.GPU_COUNTERS).sum())
    if n_counters:
        untimed = not (kinds == Kind.KERNEL).any()
        info.warnings.append(
            f"{n_counters:,} kernel{'s were' if n_counters != 1 else ' was'} recorded by "
            "CUPTI's range profiler (profiler_metrics)"
            + (
                ": they carry counters, not times, so this trace shows no GPU time"
                if untimed
                else ""
            )
            + "; `perfcast analyze --only counters` (perfcast.gpu_counters() in Python) lists "
            "the counters per kernel and op"
        )
    return info, cols


def _drop_repeated_events(rc: RankColumns) -> None:
    """Keep one of events written twice: the same kind, process, thread, name, start,
    duration, correlation and external id (a file concatenated or merged twice). Only events
    with a duration: instants at one timestamp are legitimately alike (memory events of a
    2021 trace). None of the shared or recorded traces holds such a repeat."""
    c = rc.cols
    rows = np.flatnonzero(c["dur"] > 0)
    if rows.size < 2:
        return
    # One 64-bit hash per event finds the few candidates fast (a full-key sort took 26 s on
    # 5M events); the candidates are then compared on every key.
    h = np.zeros(rows.size, dtype=np.uint64)
    for k, mult in zip(_REPEAT_KEY, _HASH_MULTIPLIERS, strict=True):
        np.bitwise_xor(h, c[k][rows].astype(np.int64, copy=False).view(np.uint64), out=h)
        np.multiply(h, np.uint64(mult), out=h)
    hs = np.sort(h)  # a plain sort: far faster than an argsort
    repeated = hs[1:][hs[1:] == hs[:-1]]
    if not repeated.size:
        return
    cand_rows = rows[np.isin(h, repeated)]
    key = np.stack([c[k][cand_rows].astype(np.int64) for k in _REPEAT_KEY], axis=1)
    _, first = np.unique(key, axis=0, return_index=True)
    if first.size == cand_rows.size:
        return
    keep = np.ones(len(c["kind"]), dtype=bool)
    keep[cand_rows] = False
    keep[cand_rows[first]] = True
    dropped = cand_rows.size - first.size
    for k, v in c.items():
        c[k] = v[keep]
    rc.warnings.append(
        f"{dropped:,} events appear twice (same kind, thread, name, start, "
        "duration and ids): each is counted once"
    )


_REPEAT_KEY = ("kind", "pid", "tid", "ts", "dur", "name", "correlation", "external_id")
# Odd 64-bit constants (splitmix64's and golden-ratio multipliers) to mix the keys.
_HASH_MULTIPLIERS = (
    0x9E3779B97F4A7C15,
    0xBF58476D1CE4E5B9,
    0x94D049BB133111EB,
    0xD6E8FEB86659FD93,
    0xA0761D6478BD642F,
    0xE7037ED1A0B428DB,
    0x8EBC6AF09C88C6E3,
    0x589965CC75374CC3,
)


# torch.profiler.tensorboard_trace_handler names files "{host}_{pid}.{time}.pt.trace.json":
# group 1 is the process (host_pid), group 2 the host.
_HANDLER_NAME = re.compile(r"((.+)_\d+)\.\d{10,}\.pt\.trace\.json(?:\.gz)?")


def _machine_of(raw: Any, path: str) -> dict[str, object] | None:
    """What the trace says about its machine, most specific first; None if nothing."""
    own = raw.perfcast_machine
    if isinstance(own, dict) and isinstance(own.get("host_id"), str):
        keep = ("host_id", "cpu_model", "cores", "torch")
        out: dict[str, object] = {k: own[k] for k in keep if isinstance(own.get(k), (str, int))}
        out["from"] = "the perfcast_machine metadata perfcast profile wrote"
        return out
    for key in ("host_name", "hostname"):
        name = getattr(raw, key)
        if isinstance(name, str) and name.strip():
            return {"host_id": machine_id(name.strip()), "from": f"the trace's '{key}' field"}
    m = _HANDLER_NAME.fullmatch(os.path.basename(path))
    if m:
        return {
            "host_id": machine_id(m.group(2)),
            "from": "its file name (host_pid.time.pt.trace.json, as torch.profiler names it)",
        }
    return None


def _gloo_subgroups(pg_config: object, world: int | None) -> bool:
    """Does distributedInfo's pg_config list a gloo process group smaller than the world?"""
    if isinstance(pg_config, dict):
        groups = list(pg_config.values())
    elif isinstance(pg_config, list):
        groups = pg_config
    else:
        return False
    sizes = [
        size
        for g in groups
        if isinstance(g, dict) and "gloo" in str(g.get("backend_config", ""))
        for size in [_int_or_none(g.get("pg_size"))]
        if size is not None and size > 0
    ]
    # Without a world size, the largest group stands for the world (the default group).
    all_ranks = world if world is not None else max(sizes, default=0)
    return any(size < all_ranks for size in sizes)


def _int_or_none(value: Any) -> int | None:
    """A header value that must be an integer (not a bool, a float or a string)."""
    return value if type(value) is int else None


def _device_name(props: Any) -> str | None:
    if isinstance(props, list) and props:
        first = props[0]
        if isinstance(first, dict) and isinstance(first.get("name"), str):
            return printable(first["name"])
    return None


# Kinds that, starting after the last step, say the program went on (its own ops and ranges);
# Python frames and bare runtime calls there are the profiler's stop (its frames, its
# device synchronize).
_WENT_ON_KINDS = np.array([Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.DRIVER], dtype=np.int8)
# A stop that collects and writes the trace holds its ranges open for milliseconds (1.5 and
# 1.9 ms on our 2-rank gloo capture); ranges that outlast the rest by less are left as they
# are (tracelens_mi300x_resnet_act_ckpt's frames end 0.02 ms after its GPU work).
_STOP_HELD_NS = 100_000


# Step ranges may touch or overlap by clock rounding; past this they overlap for real.
_STEP_OVERLAP_TOL_NS = 1_000


def _disentangle_steps(
    ordered: list[tuple[str, int]], ts: np.ndarray, dur: np.ndarray, info: RankInfo
) -> list[tuple[str, int]]:
    """Steps one after another, as a training loop runs them: a step range inside another
    (an edited or merged trace) is no step and is left out; one that runs into the next is
    cut where the next begins. Both said. Overlapping ranges gave steps of wrong lengths
    (ProfilerStep#4 lengthened by 100 ms read 322 ms where it ran 222) with no word, and a
    range nested in a step split it and blamed the clocks."""
    kept: list[tuple[str, int]] = []
    for nm, i in ordered:
        if kept:
            prev_nm, p = kept[-1]
            prev_end, start, end = int(ts[p] + dur[p]), int(ts[i]), int(ts[i] + dur[i])
            if end <= prev_end and prev_end - start > _STEP_OVERLAP_TOL_NS:
                info.warnings.append(
                    f"{nm} ({dur[i] / 1e6:,.2f} ms) lies inside {prev_nm}: a step range within "
                    "a step (an edited or merged trace?) is not counted as a step"
                )
                continue
            if prev_end - start > _STEP_OVERLAP_TOL_NS:
                info.warnings.append(
                    f"{prev_nm} runs {(prev_end - start) / 1e6:,.2f} ms into {nm} (overlapping "
                    f"step ranges: an edited or merged trace?): it is cut where {nm} begins"
                )
                dur[p] = start - int(ts[p])
        kept.append((nm, i))
    return kept


def _step_rows(c: dict[str, np.ndarray], names: Interner) -> np.ndarray:
    """The rows of the ProfilerStep ranges (CPU ops or user annotations), by start time; a
    range recorded as both at one time lists its user annotation first."""
    kind = c["kind"]
    step_names = [i for i, nm in enumerate(names.names) if nm.startswith(STEP_PREFIX)]
    rows = np.flatnonzero(
        np.isin(kind, (Kind.USER_ANNOTATION, Kind.CPU_OP)) & np.isin(c["name"], step_names)
    )
    return rows[np.lexsort((kind[rows] != Kind.USER_ANNOTATION, c["ts"][rows]))]


def _clip_ranges_open_at_stop(
    c: dict[str, np.ndarray],
    names: Interner,
    info: RankInfo,
    is_cpu: np.ndarray,
    steps: np.ndarray,
) -> None:
    """Ranges still open when the profiler stopped end at the stop, which can take many
    milliseconds (Kineto collects and writes the trace): the step that ends the profiled
    window is often called inside a range (`perfcast profile`'s optimizer hook runs inside
    the `Optimizer.step#...` range; scripts call `prof.step()` inside their own
    `record_function`), and Python frames (`<module>`) are open then too.

    When no op or range starts after the last step ended (the program went no further), the
    CPU ranges open across that end, and the stop's own frames and calls after it, which end
    after every other event are cut where the other events end (the GPU's last work, when
    the stop waited for it). A trace whose program went on after its last step keeps its
    ranges as they are: what ends late there may really have run that long."""
    ts, dur, kind = c["ts"], c["dur"], c["kind"]
    if steps.size == 0:
        return
    last = int(steps[np.argmax(ts[steps])])
    end = int(ts[last] + dur[last])
    if (np.isin(kind, _WENT_ON_KINDS) & (ts >= end)).any():
        return
    open_across = is_cpu & (ts < end) & (ts + dur > end)
    the_stop = is_cpu & (ts >= end)  # Python frames and runtime calls only, by now
    cut_here = open_across | the_stop
    if not open_across.any():
        return
    rest = ~cut_here
    cut = max(end, int((ts[rest] + dur[rest]).max()))
    over = np.flatnonzero(cut_here & (ts + dur > cut))
    over_open = over[open_across[over]]
    lost_ns = int((ts[over_open] + dur[over_open]).max()) - cut if over_open.size else 0
    if lost_ns < _STOP_HELD_NS:
        return
    # Name the innermost (latest to start) op or range, not a Python frame, where there is one.
    ranges = over_open[kind[over_open] != Kind.PYTHON_FUNCTION]
    pick = ranges if ranges.size else over_open
    named = int(pick[np.argmax(ts[pick])])
    dur[over] = np.maximum(cut - ts[over], 0)
    if _own_hook_range(c, names, info, ranges):
        return  # expected: said nowhere, as every perfcast profile trace would say it
    info.warnings.append(
        f"{over_open.size} range(s) open when the profiler stopped (e.g. "
        f"'{names.names[int(c['name'][named])]}') end where the rest of the trace ends: "
        f"the trace ended them at the stop, {lost_ns / 1e6:.2f} ms later"
    )


def _own_hook_range(
    c: dict[str, np.ndarray], names: Interner, info: RankInfo, ranges: np.ndarray
) -> bool:
    """Whether the only ranges open at the stop are optimizer steps in a trace `perfcast
    profile` wrote: its step hook runs inside `Optimizer.step#...`, so the step that ends
    the window always leaves that range open."""
    if not str((info.machine or {}).get("from", "")).startswith("the perfcast_machine"):
        return False
    return all(names.names[int(c["name"][r])].startswith("Optimizer.step#") for r in ranges)


# Events that are work: ops, ranges, runtime and driver calls, GPU tasks (not Python frames,
# which `prof.step()` itself records, nor memory records).
_WORK_KINDS = np.array(
    [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.RUNTIME, Kind.DRIVER, *_GPU_KINDS], dtype=np.int8
)


def _untimed_steps(
    c: dict[str, np.ndarray],
    names: Interner,
    info: RankInfo,
    step_rows: np.ndarray,
    no_dur: np.ndarray,
) -> tuple[np.ndarray, list[int]]:
    """Step markers written without a duration: their end is unknown (read as 0 long, such
    a step took 0 ms and the next one took in its time), so they are no steps. Returns the
    step rows with a duration, and the starts of the steps left out (a step recorded both
    ways, as a range and an op, keeps the one with a duration)."""
    timed = step_rows[~no_dur[step_rows]]
    timed_names = set(c["name"][timed].tolist())
    left: dict[int, int] = {}  # name -> start of its first marker
    for r in step_rows[no_dur[step_rows]].tolist():
        if int(c["name"][r]) not in timed_names:
            left.setdefault(int(c["name"][r]), int(c["ts"][r]))
    if left:
        shown = [names.names[n] for n in sorted(left, key=left.__getitem__)]
        info.untimed_steps = shown
        n = len(shown)
        info.warnings.append(
            f"{', '.join(shown[:3])}{', ...' if n > 3 else ''} ha{'ve' if n > 1 else 's'} no "
            f"'dur' (the end of the range was not written): {'they are' if n > 1 else 'it is'} "
            "left out of the steps, and the work in "
            f"{'them' if n > 1 else 'it'} belongs to no step"
        )
    return timed, sorted(left.values())


def _launched_work_end(c: dict[str, np.ndarray], launch: np.ndarray, t: int) -> int:
    """When the GPU work launched before time `t` ends (0 if there is none)."""
    rows = np.flatnonzero(launch >= 0)
    rows = rows[c["ts"][launch[rows]] < t]
    return int((c["ts"][rows] + c["dur"][rows]).max()) if rows.size else 0


def _gap_between(gaps: list[int], a: int, b: int) -> bool:
    """Whether a step left out (its start in sorted `gaps`) started between a and b."""
    j = bisect.bisect_right(gaps, a)
    return j < len(gaps) and gaps[j] < b


def _holds_no_work(c: dict[str, np.ndarray], step: int, step_rows: np.ndarray) -> bool:
    """Whether no work starts inside the step's range but the step ranges themselves: the
    last ProfilerStep of a window the profiler stopped as the step began."""
    ts, dur = c["ts"], c["dur"]
    start, end = int(ts[step]), int(ts[step] + dur[step])
    inside = np.isin(c["kind"], _WORK_KINDS) & (ts >= start) & (ts < max(end, start + 1))
    inside[step_rows] = False
    return not inside.any()


def _sizes_from_calls(c: dict[str, np.ndarray], launch: np.ndarray) -> None:
    """A copy or memset without its size takes the one its runtime call carries (ROCm 6.2
    writes it there); runtime calls keep none (nbytes is a GPU row's)."""
    kind, nbytes = c["kind"], c["nbytes"]
    calls = kind == Kind.RUNTIME
    if not (calls & (nbytes >= 0)).any():
        return
    moved = np.flatnonzero(np.isin(kind, (Kind.MEMCPY, Kind.MEMSET)) & (nbytes < 0) & (launch >= 0))
    nbytes[moved] = nbytes[launch[moved]]
    nbytes[calls] = NONE


def _derive(
    rc: RankColumns, names: Interner, info: RankInfo
) -> tuple[dict[str, np.ndarray], list[Iteration]]:
    """Per-rank links: parents, launches, forward->backward, iterations (local row ids)."""
    c = rc.cols
    n = len(c["kind"])
    kind = c["kind"]
    ts = c["ts"]
    dur = c["dur"]
    is_cpu = np.isin(kind, _CPU_KINDS)
    is_gpu = np.isin(kind, _GPU_KINDS)
    step_rows = _step_rows(c, names)
    gaps: list[int] = []  # starts of the steps left out for want of a duration
    no_dur = c.pop("no_dur", None)  # not a column of the table
    if no_dur is not None and no_dur[step_rows].any():
        step_rows, gaps = _untimed_steps(c, names, info, step_rows, no_dur)
    _clip_ranges_open_at_stop(c, names, info, is_cpu, step_rows)

    parent = _parents(c["pid"], c["tid"], ts, dur, np.flatnonzero(is_cpu), n)
    launch = _launch_links(c, is_gpu, rc.flows)
    _sizes_from_calls(c, launch)
    # GPU work cannot start before the call that launched it; where the clocks say so
    # (CPU/GPU clock skew, a corrupt time) the link is dropped rather than trusted.
    linked = np.flatnonzero(launch >= 0)
    early = linked[ts[linked] < ts[launch[linked]]]
    if early.size:
        launch[early] = NONE
        info.warnings.append(
            f"{early.size} GPU events start before the call that launched them "
            "(CPU/GPU clock skew?); their launch links were dropped"
        )
    # Synchronizations and event calls launch nothing: such links are mismatched ids.
    linked = np.flatnonzero(launch >= 0)
    if linked.size:
        idle = np.fromiter(
            (bool(NON_LAUNCHING_CALLS.search(names.names[i])) for i in c["name"][launch[linked]]),
            dtype=bool,
            count=linked.size,
        )
        if idle.any():
            launch[linked[idle]] = NONE
            info.warnings.append(
                f"{int(idle.sum())} GPU events were linked to calls that launch nothing "
                "(synchronizations, event records: correlation ids that do not match?); "
                "their launch links were dropped"
            )
    # A stream runs its work in the order it was enqueued; links that say otherwise
    # (correlation ids reused or mismatched by another tool) are dropped.
    disorder = _drop_out_of_order_launches(c, launch, is_gpu)
    if disorder:
        info.warnings.append(
            f"{disorder} GPU events run out of their stream's launch order (correlation ids "
            "that do not match?); their launch links were dropped"
        )
    fwd_bwd = _fwd_bwd_links(c, rc.flows)
    _inherit_collective_args(c, launch, parent)

    # Iterations: ProfilerStep ranges on the CPU side, one per name.
    by_name: dict[str, int] = {}
    for i in step_rows.tolist():
        by_name.setdefault(names.names[c["name"][i]], i)
    iterations: list[Iteration] = []
    after_gap: list[bool] = []
    if by_name:
        ordered = sorted(by_name.items(), key=lambda kv: int(ts[kv[1]]))
        if len(ordered) > 1 and _holds_no_work(c, ordered[-1][1], step_rows):
            nm, i = ordered.pop()
            info.warnings.append(
                f"the last step, {nm} ({dur[i] / 1e6:.2f} ms), holds no work (the profiler "
                "stopped as it began): it is not counted as a step"
            )
        elif len(ordered) > 1 and info.last_step_open:
            nm, i = ordered.pop()
            info.warnings.append(
                f"the last step, {nm} ({dur[i] / 1e6:.2f} ms), was still open when the script "
                "ended (perfcast profile stopped mid-window): it holds what ran after the "
                "training loop, and is not counted as a step"
            )
        elif info.last_step_open:
            nm, i = ordered[-1]
            info.warnings.append(
                f"the only step, {nm} ({dur[i] / 1e6:.2f} ms), was still open when the script "
                "ended (perfcast profile stopped mid-window): it holds what ran after the "
                "training loop, not a training step; profile more steps for a whole one"
            )
        ordered = _disentangle_steps(ordered, ts, dur, info)
        window_end = rc.window_end_ns
        # A step after one left out starts its window at its own start, not at the end of
        # the step before the gap (it would take in the unknown step's time).
        after_gap = [False] + [
            _gap_between(gaps, int(ts[a]), int(ts[b]))
            for (_, a), (_, b) in itertools.pairwise(ordered)
        ]
        for nm, i in ordered:
            s, e = int(ts[i]), int(ts[i] + dur[i])
            if window_end is not None and s < window_end and e > window_end + _STOP_HELD_NS:
                # A step range that outlives the recorded window (Kineto's end marker) holds
                # nothing recorded past it: an HTA sample's ran 13 s past its 2 ms of work.
                info.warnings.append(
                    f"{nm} ends {(e - window_end) / 1e6:,.2f} ms after the profiler's recorded "
                    'window (its "Record Window End" marker): the step is cut there'
                )
                e = window_end
                dur[i] = e - s
            iterations.append(Iteration(info.rank, nm, s, e, cpu_end_ns=e, window_start_ns=s))
    else:
        info.has_steps = False
        # The same kinds the dependency graph replays, so replay and summary agree.
        activity = is_gpu | np.isin(
            kind, [Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.RUNTIME, Kind.DRIVER]
        )
        if activity.any():
            start = int(ts[activity].min())
            end = int((ts[activity] + dur[activity]).max())
            iterations.append(
                Iteration(
                    info.rank, "whole trace", start, end, cpu_end_ns=end, window_start_ns=start
                )
            )

    iteration = np.full(n, NONE, dtype=np.int32)
    if iterations:
        starts = np.array([it.start_ns for it in iterations], dtype=np.int64)
        ends = np.array([it.end_ns for it in iterations], dtype=np.int64)
        idx = np.searchsorted(starts, ts, side="right") - 1
        inside = (idx >= 0) & (ts < ends[np.maximum(idx, 0)])
        # Zero-length events at a step's very end still belong to it.
        iteration = np.where(inside, idx, NONE).astype(np.int32)
        # GPU work belongs to the step that launched it, even when it runs later.
        has_launch = launch >= 0
        iteration[has_launch] = iteration[launch[has_launch]]
        # Work left on a stream from before the window (launched before the profiler's first
        # event, so unlinked, and ahead of every linked task of its stream) belongs to the
        # step before the first: that step completes when it is done.
        backlog = _backlog(c, is_gpu, launch)
        iteration[backlog] = NONE
        # Completion: the step is done when the GPU work it launched is done.
        gpu_in = np.flatnonzero(is_gpu & (iteration >= 0))
        if gpu_in.size:
            gpu_end = np.zeros(len(iterations), dtype=np.int64)
            np.maximum.at(gpu_end, iteration[gpu_in], ts[gpu_in] + dur[gpu_in])
            for k, it in enumerate(iterations):
                it.end_ns = max(it.cpu_end_ns, int(gpu_end[k]))
        if backlog.any() and info.has_steps:
            first = iterations[0]
            first.window_start_ns = max(first.start_ns, int((ts + dur)[backlog].max()))
        early = 0
        for k, (prev, it) in enumerate(itertools.pairwise(iterations), 1):
            # Steps complete in order: one whose work all ended before the previous step's
            # (GPU times that contradict their launches: a damaged trace) took no time.
            if it.end_ns < prev.end_ns:
                it.end_ns = prev.end_ns
                early += 1
            it.window_start_ns = prev.end_ns
            if k < len(after_gap) and after_gap[k]:
                # After a step left out: from when the work launched before this step is
                # done (the unknown step's end, as near as the trace tells it).
                before = _launched_work_end(c, launch, it.start_ns)
                it.window_start_ns = min(max(prev.end_ns, it.start_ns, before), it.end_ns)
        if early:
            # In a salvaged file the usual cause is the GPU side the damage took, not the clocks.
            why = (
                f"{_LOSS_WORDS.get(info.damage or 'damaged', _LOSS_WORDS['damaged'])[0]} "
                "lost their GPU work"
                if info.truncated
                else "GPU times out of order with their launches"
            )
            info.warnings.append(
                f"{early} step(s) completed before the step before them ({why}?): counted as 0 ms"
            )
    _note_unlaunched(c, names, launch, iteration, info)
    if info.truncated:
        _note_gpu_side_lost_at_the_cut(c, parent, iteration, iterations, info)
    if info.tail_lost:
        _note_step_at_the_cut(c, iteration, iterations, info)
    return {"parent": parent, "launch": launch, "fwd_bwd": fwd_bwd, "iteration": iteration}, (
        iterations
    )


def _note_unlaunched(
    c: dict[str, np.ndarray],
    names: Interner,
    launch: np.ndarray,
    iteration: np.ndarray,
    info: RankInfo,
) -> None:
    """Say so when GPU work inside the steps has no launching call, in a trace that records
    launches: it is placed by its GPU times alone, with no host side (whole traces link all
    of theirs; work from before or after the steps may go unlinked, and is not counted)."""
    kind = c["kind"]
    work = np.isin(kind, _GPU_KINDS) & (iteration >= 0)
    orphans = np.flatnonzero(work & (launch < 0))
    if orphans.size == 0 or not np.isin(kind, (Kind.RUNTIME, Kind.DRIVER)).any():
        return
    where = "in the steps" if info.has_steps else "in the trace"
    first = names.names[int(c["name"][orphans[0]])]
    info.warnings.append(
        f"{orphans.size:,} of the {int(work.sum()):,} GPU kernels, copies and memsets {where} "
        f"ha{'s' if orphans.size == 1 else 've'} no launching call in the trace (the first: "
        f"'{first[:80]}'; no runtime call "
        "carries its correlation id, no flow leads to it): each is placed by its GPU time "
        "alone, without the host work that launched it"
    )


# By Decoded.damage: what lost events, and what to do for a whole trace.
_LOSS_WORDS = {
    "cut": (
        "the cut",
        "record fewer active steps, or let the job finish the trace, so the file is written whole",
    ),
    "corrupt": (
        "the corrupt gzip data",
        "copy the file again from where torch.profiler wrote it (`gunzip -t` checks a copy)",
    ),
    "invalid": (
        "the skipping of events holding NaN or Infinity",
        "the program that wrote the trace should write null or a number there",
    ),
    "damaged": (
        "the damage",
        "copy the file again from where torch.profiler wrote it, or record the trace again",
    ),
}


# In complete traces, the share of ops that launched something (among ops whose name launched
# somewhere in the file) is the same in every step: to 0.1% on 35 of the 36 traces checked;
# the first step of the other read 0.63 against 0.85. A cut file's steps that differ by more
# than this lost launches at the cut.
_SHARE_SPREAD = 0.1


def _note_gpu_side_lost_at_the_cut(
    c: dict[str, np.ndarray],
    parent: np.ndarray,
    iteration: np.ndarray,
    iterations: list[Iteration],
    info: RankInfo,
) -> None:
    """Say so when a truncated file lost GPU-side events of its steps.

    Kineto writes a step's CPU ops and its runtime calls and kernels apart (the GPU side
    after all CPU ops, in buffers not in time order), so a cut can keep every op of a step
    and few or none of its launches: the step then reads as an idle GPU and a prediction
    starts from it. Nothing is removed (a step left out would leave its work in its
    neighbours' replay windows, and the steps kept can have lost launches too); the note
    gives each step's share of ops with a launch, which a complete trace has equal in
    every step.
    """
    kind = c["kind"]
    noun, fix = _LOSS_WORDS.get(info.damage or "damaged", _LOSS_WORDS["damaged"])
    # A lost end took what Kineto writes last; damage inside took what it happened to hit.
    why = " (Kineto writes them after all CPU ops)" if info.tail_lost else ""
    runtime_parent = parent[(kind == Kind.RUNTIME) & (parent >= 0)]
    action = f"GPU time, idle time and predictions from this file are unreliable: {fix}"
    if runtime_parent.size == 0:
        if info.device_name is not None:  # a GPU run cut before its GPU side was written
            gpu_left = int(np.isin(kind, _GPU_KINDS).sum())
            what = (
                f"only {gpu_left:,} GPU event{'s' * (gpu_left != 1)} and no runtime call"
                if gpu_left
                else "no runtime call or GPU event"
            )
            info.warnings.append(
                f"{what} survived {noun}{why}: the GPU side of the steps is "
                f"{'mostly ' if gpu_left else ''}lost; {action}"
            )
        return
    if len(iterations) < 2:
        return
    launched = np.zeros(kind.size, dtype=bool)
    launched[runtime_parent] = True
    launching_names = np.unique(c["name"][runtime_parent])
    candidate = (kind == Kind.CPU_OP) & np.isin(c["name"], launching_names) & (iteration >= 0)
    n = len(iterations)
    ops = np.bincount(iteration[candidate], minlength=n)
    hits = np.bincount(iteration[candidate & launched], minlength=n)
    has_ops = ops > 0  # a step without such ops (CPU-only, evaluation) says nothing
    if has_ops.sum() < 2:
        return
    share = hits[has_ops] / ops[has_ops]
    if float(share.max() - share.min()) <= _SHARE_SPREAD * float(share.max()):
        return
    shares = ", ".join(
        f"{iterations[k].name} {s:.0%}"
        for k, s in zip(np.flatnonzero(has_ops).tolist(), share.tolist(), strict=True)
    )
    why = " (Kineto writes runtime calls and kernels after all CPU ops)" if info.tail_lost else ""
    info.warnings.append(
        f"{noun} lost GPU-side events of some steps{why}: the share of ops with a launch "
        f"recorded, equal in every step of a complete trace, is {shares}; {action}"
    )


def _note_step_at_the_cut(
    c: dict[str, np.ndarray], iteration: np.ndarray, iterations: list[Iteration], info: RankInfo
) -> None:
    """Name the step a cut fell in: the step of the last event the file holds (rows are in
    file order). Kineto writes a step's launches and kernels together, so a cut drops both
    and leaves nothing dangling: a step that lost its last kernels reads as complete, only
    shorter, and the share check above misses a small loss and cannot judge a single step."""
    kind = c["kind"]
    if info.device_name is not None and not (kind == Kind.RUNTIME).any():
        return  # "no runtime call survived the cut" says more
    stepped = np.flatnonzero(iteration >= 0)
    if stepped.size == 0 or not info.has_steps:
        return
    k = int(iteration[stepped[-1]])
    later = len(iterations) - 1 - k
    name = iterations[k].name
    after = f" and the {later:,} step{'s' * (later != 1)} after it" if later else ""
    info.cut_steps = [it.name for it in iterations[k:]]
    stop = info.tail_stop or "the file is cut off"
    point = "the cut" if stop == "the file is cut off" else "that point"
    info.warnings.append(
        f"{stop} while {name}'s events were being written (the last event read belongs to "
        f"{name}): {name}{after} may be missing events written after {point}, so their step "
        "time, GPU time and predictions from them may read low"
    )


_MAX_UNPROFILED_STEPS = 10_000


def _read_unprofiled_steps(value: object, info: RankInfo, key: str) -> list[float]:
    """Steps perfcast's capture timed without the profiler (a JSON list of ms, or its text);
    kept only when every value is a plausible step time. An empty list is none timed."""
    if isinstance(value, str) and len(value) < 1_000_000:
        import json

        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if value is None or value == []:
        return []
    if isinstance(value, list) and len(value) <= _MAX_UNPROFILED_STEPS:
        good = [
            float(x)
            for x in value
            if isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 1e9
        ]
        if len(good) == len(value):
            return good
    info.warnings.append(
        f"the trace's unprofiled step times ({key}) are unreadable (each must be a step time "
        "in ms, above 0): not used, so the profiler's cost is not fitted to them"
    )
    return []


def _backlog(c: dict[str, np.ndarray], is_gpu: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """GPU rows without a launch that run before every launched row of their stream."""
    out = np.zeros(is_gpu.shape[0], dtype=bool)
    gpu = np.flatnonzero(is_gpu)
    if gpu.size == 0 or (launch[gpu] >= 0).all():
        return out
    key = c["pid"][gpu] * 1_000_003 + c["tid"][gpu]
    for k in np.unique(key).tolist():
        rows = gpu[key == k]
        linked = rows[launch[rows] >= 0]
        if linked.size == 0:
            continue  # no links on this stream at all: nothing tells what came before
        first = c["ts"][linked].min()
        out[rows[(launch[rows] < 0) & (c["ts"][rows] < first)]] = True
    return out


def _inherit_collective_args(
    c: dict[str, np.ndarray], launch: np.ndarray, parent: np.ndarray
) -> None:
    """Collective kernels without their own args take them from `record_param_comms` above."""
    coll_cols = ("coll_name", "coll_in", "coll_out", "coll_group", "coll_dtype", "coll_ranks")
    kernels = np.flatnonzero((c["kind"] == Kind.KERNEL) & (c["coll_name"] == NONE) & (launch >= 0))
    if kernels.size == 0 or not (c["coll_name"] >= 0).any():
        return
    for k in kernels.tolist():
        row = int(launch[k])
        for _ in range(8):  # the op sits a few levels above the launch
            row = int(parent[row])
            if row < 0:
                break
            if c["coll_name"][row] >= 0:
                for col in coll_cols:
                    c[col][k] = c[col][row]
                break


def _parents(
    pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, dur: np.ndarray, rows: np.ndarray, n: int
) -> np.ndarray:
    """Enclosing CPU event of each CPU event (interval nesting per thread)."""
    parent = np.full(n, NONE, dtype=np.int32)
    if rows.size == 0:
        return parent
    order = rows[np.lexsort((-dur[rows], ts[rows], tid[rows], pid[rows]))]
    o_pid = pid[order].tolist()
    o_tid = tid[order].tolist()
    o_ts = ts[order].tolist()
    o_end = (ts[order] + dur[order]).tolist()
    out = parent
    stack: list[int] = []  # positions in `order`
    ends: list[int] = []
    prev_thread = None
    res = [NONE] * len(o_ts)
    for k in range(len(o_ts)):
        thread = (o_pid[k], o_tid[k])
        if thread != prev_thread:
            stack.clear()
            ends.clear()
            prev_thread = thread
        t = o_ts[k]
        while ends and ends[-1] <= t and not (ends[-1] == t and o_ts[stack[-1]] == t):
            stack.pop()
            ends.pop()
        # An event that outlives its would-be parent is not nested in it (bad clocks).
        while ends and o_end[k] > ends[-1]:
            stack.pop()
            ends.pop()
        if stack:
            res[k] = stack[-1]
        stack.append(k)
        ends.append(o_end[k])
    res_arr = np.array(res, dtype=np.int64)
    has = res_arr >= 0
    out[order[has]] = order[res_arr[has]]
    return out


def _launch_links(
    c: dict[str, np.ndarray], is_gpu: np.ndarray, flows: dict[str, Any]
) -> np.ndarray:
    """GPU row -> runtime row that launched it: by correlation id, else by ac2g flows."""
    n = len(c["kind"])
    launch = np.full(n, NONE, dtype=np.int32)
    kind = c["kind"]
    corr = c["correlation"]
    launcher = np.flatnonzero(((kind == Kind.RUNTIME) | (kind == Kind.DRIVER)) & (corr >= 0))
    gpu = np.flatnonzero(is_gpu & (corr >= 0))
    if launcher.size and gpu.size:
        order = launcher[np.argsort(corr[launcher], kind="stable")]
        keys = corr[order]
        pos = np.searchsorted(keys, corr[gpu])
        pos_c = np.minimum(pos, keys.size - 1)
        hit = keys[pos_c] == corr[gpu]
        launch[gpu[hit]] = order[pos_c[hit]]
    # Flows cover traces whose runtime events lack a correlation argument.
    missing = np.flatnonzero(is_gpu & (launch == NONE))
    if missing.size and flows["launch_s"] and flows["launch_f"]:
        # A flow starts on a runtime/driver call and ends on a GPU row; other rows can share
        # the (pid, tid, ts) of an end point (the op around a launch, a gpu_user_annotation
        # starting with its first kernel), so each end is looked up among its own kinds only.
        def at(rows: np.ndarray) -> dict[tuple[int, int, int], int]:
            cols = (c["pid"][rows].tolist(), c["tid"][rows].tolist(), c["ts"][rows].tolist())
            keys = zip(*cols, strict=True)
            return dict(zip(keys, rows.tolist(), strict=True))

        src_at = at(np.flatnonzero((kind == Kind.RUNTIME) | (kind == Kind.DRIVER)))
        dst_at = at(missing)
        src = {fid: src_at.get((p, t, s)) for p, t, s, fid in flows["launch_s"]}
        for p, t, s, fid in flows["launch_f"]:
            row = dst_at.get((p, t, s))
            r = src.get(fid)
            if row is not None and r is not None and launch[row] == NONE:
                launch[row] = r
    return launch


def _drop_out_of_order_launches(
    c: dict[str, np.ndarray], launch: np.ndarray, is_gpu: np.ndarray
) -> int:
    """Unlink GPU rows whose launch contradicts their stream's order; how many.

    Per stream, in order of start, the launch calls must start in order too: the longest
    run that does (longest non-decreasing subsequence) keeps its links. A dropped link is
    kept after all if its call overlaps those of its kept neighbours (calls from two
    threads may enqueue in either order). Real traces have no such contradictions.
    """
    rows = np.flatnonzero(is_gpu & (launch >= 0))
    if rows.size < 2:
        return 0
    ts, dur, pid, tid = c["ts"], c["dur"], c["pid"], c["tid"]
    rows = rows[np.lexsort((rows, ts[rows], tid[rows], pid[rows]))]
    lt = ts[launch[rows]]
    same = (pid[rows][1:] == pid[rows][:-1]) & (tid[rows][1:] == tid[rows][:-1])
    if not (same & (lt[1:] < lt[:-1])).any():
        return 0
    cuts = np.flatnonzero(~same) + 1
    dropped = 0
    for part in np.split(np.arange(rows.size), cuts):
        keys = lt[part].tolist()
        if all(a <= b for a, b in itertools.pairwise(keys)):
            continue
        keep = _longest_non_decreasing(keys)
        lrow = launch[rows[part]]
        end = (ts[lrow] + dur[lrow]).tolist()
        kept = [k for k in range(len(keys)) if keep[k]]
        for k in range(len(keys)):
            if keep[k]:
                continue
            j = bisect.bisect_left(kept, k)
            before = kept[j - 1] if j > 0 else None
            after = kept[j] if j < len(kept) else None
            if (before is None or keys[before] <= end[k]) and (
                after is None or keys[k] <= end[after]
            ):
                continue  # overlapping calls: either could have enqueued first
            launch[rows[part[k]]] = NONE
            dropped += 1
    return dropped


def _longest_non_decreasing(keys: list[int]) -> list[bool]:
    """Which items form a longest non-decreasing subsequence (patience sorting)."""
    tails: list[int] = []  # smallest tail value of a subsequence of each length
    tail_at: list[int] = []  # ... and its index
    prev = [-1] * len(keys)
    for i, key in enumerate(keys):
        j = bisect.bisect_right(tails, key)
        if j:
            prev[i] = tail_at[j - 1]
        if j == len(tails):
            tails.append(key)
            tail_at.append(i)
        else:
            tails[j] = key
            tail_at[j] = i
    keep = [False] * len(keys)
    i = tail_at[-1] if tail_at else -1
    while i >= 0:
        keep[i] = True
        i = prev[i]
    return keep


def _fwd_bwd_links(c: dict[str, np.ndarray], flows: dict[str, Any]) -> np.ndarray:
    """(forward op, backward op) pairs from fwdbwd flows, else from sequence numbers."""
    kind = c["kind"]
    ops = np.flatnonzero(kind == Kind.CPU_OP)
    pairs: list[tuple[int, int]] = []
    if flows["fwdbwd_s"] and flows["fwdbwd_f"]:
        # Ops sorted by start, innermost last, so the dict keeps the innermost at a ts.
        order = ops[np.lexsort((-c["dur"][ops], c["ts"][ops]))]
        at = {
            (p, t, s): i
            for i, p, t, s in zip(
                order.tolist(),
                c["pid"][order].tolist(),
                c["tid"][order].tolist(),
                c["ts"][order].tolist(),
                strict=False,
            )
        }
        src = {fid: at.get((p, t, s)) for p, t, s, fid in flows["fwdbwd_s"]}
        for p, t, s, fid in flows["fwdbwd_f"]:
            b = at.get((p, t, s))
            f = src.get(fid)
            if b is not None and f is not None:
                pairs.append((f, b))
    else:
        # As Kineto draws its flows: a backward op carries its forward thread's id (> 0; a
        # forward op none or 0, as 2021-era traces write it), and the link runs from the
        # *latest* forward op holding the sequence number (the innermost, which made the
        # autograd node: a BatchNorm's `aten::add_` on num_batches_tracked comes first with
        # the same number) to the innermost backward op (the node, not the engine's
        # `evaluate_function` wrapper around it).
        seq = c["seq"]
        fwd_tid = c["fwd_tid"]
        by_start = ops[np.lexsort((-c["dur"][ops], c["ts"][ops]))]
        has_seq = seq[by_start] >= 0
        backward = fwd_tid[by_start] > 0
        last_fwd = {int(seq[i]): i for i in by_start[has_seq & ~backward].tolist()}
        last_bwd = {int(seq[i]): i for i in by_start[has_seq & backward].tolist()}
        pairs = [(last_fwd[s], b) for s, b in last_bwd.items() if s in last_fwd]
    return np.array(pairs, dtype=np.int32).reshape(-1, 2)


def _concat(
    parts: list[tuple[RankInfo, RankColumns, dict[str, np.ndarray], list[Iteration]]],
    names: Interner,
) -> EventTable:
    cols: dict[str, list[np.ndarray]] = {}
    derived: dict[str, list[np.ndarray]] = {
        "parent": [],
        "launch": [],
        "fwd_bwd": [],
        "iteration": [],
    }
    ranks: list[RankInfo] = []
    iterations: list[Iteration] = []
    rank_col: list[np.ndarray] = []
    thread_names: dict[tuple[int, int, int], str] = {}
    offset = 0
    for info, rc, d, its in sorted(parts, key=lambda p: p[0].rank):
        n = len(rc.cols["kind"])
        for k, v in rc.cols.items():
            cols.setdefault(k, []).append(v)
        for k in ("parent", "launch", "fwd_bwd"):
            v = d[k]
            derived[k].append(np.where(v >= 0, v + offset, v).astype(np.int32))
        it = d["iteration"]
        derived["iteration"].append(np.where(it >= 0, it + len(iterations), it).astype(np.int32))
        iterations.extend(its)
        rank_col.append(np.full(n, info.rank, dtype=np.int32))
        for (p, t), nm in rc.thread_names.items():
            thread_names[(info.rank, p, t)] = nm
        ranks.append(info)
        offset += n

    def cat(key: str, dtype: Any, shape: tuple[int, ...] = ()) -> np.ndarray:
        arrs = cols.get(key) or derived.get(key) or []
        if not arrs:
            return np.zeros((0, *shape), dtype=dtype)
        return np.concatenate(arrs).astype(dtype, copy=False)

    table = EventTable(
        names=names.names,
        kind=cat("kind", np.int8),
        rank=np.concatenate(rank_col) if rank_col else np.zeros(0, np.int32),
        pid=cat("pid", np.int64),
        tid=cat("tid", np.int64),
        ts=cat("ts", np.int64),
        dur=cat("dur", np.int64),
        name=cat("name", np.int32),
        correlation=cat("correlation", np.int64),
        external_id=cat("external_id", np.int64),
        seq=cat("seq", np.int64),
        fwd_tid=cat("fwd_tid", np.int64),
        parent=cat("parent", np.int32),
        iteration=cat("iteration", np.int32),
        grid=cat("grid", np.int32, (3,)),
        block=cat("block", np.int32, (3,)),
        nbytes=cat("nbytes", np.int64),
        mem_total=cat("mem_total", np.int64),
        mem_device=cat("mem_device", np.int16),
        shapes=cat("shapes", np.int32),
        in_types=cat("in_types", np.int32),
        stack=cat("stack", np.int32),
        concrete=cat("concrete", np.int32),
        wait_stream=cat("wait_stream", np.int64),
        wait_corr=cat("wait_corr", np.int64),
        coll_name=cat("coll_name", np.int32),
        coll_in=cat("coll_in", np.int64),
        coll_out=cat("coll_out", np.int64),
        coll_group=cat("coll_group", np.int32),
        coll_dtype=cat("coll_dtype", np.int32),
        coll_ranks=cat("coll_ranks", np.int32),
        launch=cat("launch", np.int32),
        fwd_bwd=np.concatenate(derived["fwd_bwd"]).reshape(-1, 2)
        if derived["fwd_bwd"]
        else np.zeros((0, 2), np.int32),
        ranks=ranks,
        iterations=iterations,
        thread_names=thread_names,
    )
    return table
