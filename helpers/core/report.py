"""The report object every helper returns: prints as a table, renders in notebooks, exposes numbers.

A report holds ``rows``: dataclass instances whose shown fields are declared once
with ``column()``, which gives the header and the format, e.g.

    @dataclass
    class Point:
        n: int = column("n", ",")
        seconds: float = column("time", format_seconds)
        note: str = ""          # a plain field: kept in records(), not shown

Columns come from the row's fields only: renaming a field renames its column.
A dict field declared with ``column("N={}", ".3g", spread=True)`` becomes one
column per key (for columns that depend on the data, e.g. one per worker count);
``optional=True`` hides a column that has no value in any row.

``Report.find(n=1024)`` is the one row look-up; a criterion may be a predicate
of the field's value instead of a value: ``find(setup=startswith("fp32"))``.
Subclasses add numbers as attributes and a ``plot()`` method.
"""
from __future__ import annotations

import dataclasses
import html
import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from helpers.core import load

_MISSING = object()


@dataclass(frozen=True)
class Column:
    """One table column: the row field ``key`` (and, for a spread dict field, its ``item``), its ``header`` and format."""

    key: str
    header: str
    fmt: str | Callable[[Any], str] = ""
    item: Any = _MISSING

    def value(self, row: Any) -> Any:
        value = getattr(row, self.key)
        if self.item is not _MISSING:
            value = (value or {}).get(self.item)
        return value

    def render(self, row: Any) -> str:
        value = self.value(row)
        if value is None:
            return "n/a"
        if callable(self.fmt):
            return self.fmt(value)
        if isinstance(value, float) and not self.fmt:
            return f"{value:.4g}"
        return format(value, self.fmt)


def column(header: str, fmt: str | Callable[[Any], str] = "", *, spread: bool = False, optional: bool = False,
           **field_options) -> Any:
    """A dataclass field shown as a table column with ``header`` and ``fmt`` (a format spec or function).

    ``spread=True``: the field holds a dict, shown as one column per key, headed
    ``header.format(key)``. ``optional=True``: the column is left out when no row
    has a value (not None) in it. Other keywords (``default``, ``default_factory``,
    ``init``...) go to ``dataclasses.field``.
    """
    metadata = {"column": (header, fmt), "spread": spread, "optional": optional}
    return dataclasses.field(metadata=metadata, **field_options)


def columns_of(row_type: type, rows: Sequence[Any] = ()) -> tuple[Column, ...]:
    """The table columns a row dataclass declares with ``column()``, in field order (spread and optional ones per ``rows``)."""
    out: list[Column] = []
    for f in dataclasses.fields(row_type):
        if "column" not in f.metadata:
            continue
        header, fmt = f.metadata["column"]
        if f.metadata.get("spread"):
            keys = dict.fromkeys(k for r in rows for k in (getattr(r, f.name) or {}))
            out.extend(Column(f.name, header.format(k), fmt, k) for k in keys)
        elif not f.metadata.get("optional") or any(getattr(r, f.name) is not None for r in rows):
            out.append(Column(f.name, header, fmt))
    return tuple(out)


def startswith(prefix: str) -> Callable[[Any], bool]:
    """A ``Report.find`` criterion: the field's text starts with ``prefix``."""
    return _Predicate(lambda value: str(value).startswith(prefix), f"startswith({prefix!r})")


class _Predicate:
    def __init__(self, test: Callable[[Any], bool], text: str):
        self.test, self.text = test, text

    def __call__(self, value: Any) -> bool:
        return self.test(value)

    def __repr__(self) -> str:
        return self.text


def _matches(value: Any, wanted: Any) -> bool:
    return bool(wanted(value)) if callable(wanted) and not isinstance(wanted, type) else value == wanted


def format_table(columns: Sequence[Column], rows: Sequence[Any], title: str = "") -> str:
    """Plain-text table with right-aligned numbers and a rule under the header."""
    cells = [[c.header for c in columns]] + [[c.render(r) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    numeric = [all(_looks_numeric(line[i]) for line in cells[1:]) for i in range(len(columns))]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [title] if title else []
    out.append(line(cells[0]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(values) for values in cells[1:])
    return "\n".join(out)


def _looks_numeric(text: str) -> bool:
    stripped = text.replace(",", "").replace("%", "").replace("x", "").strip()
    try:
        float(stripped)
        return True
    except ValueError:
        return text == "n/a"


def format_bytes(n: float | None) -> str:
    """Human-readable binary size: 1536 -> '1.50 KiB'."""
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_seconds(s: float | None) -> str:
    """Seconds with a unit that keeps three significant digits: 0.00012 -> '120 us'."""
    if s is None:
        return "n/a"
    for scale, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")):
        if abs(s) >= scale or unit == "ns":
            return f"{s / scale:.3g} {unit}"
    raise AssertionError("unreachable")


_NO_COLUMNS = ("declare the fields it shows on the row dataclass with column(header, fmt) "
               "(helpers.core.report); explicit Column tuples are gone")


class Report:
    """Base class: a titled table of rows plus notes; subclasses add numbers and ``plot()``.

    The one way to build one: ``Report(rows, notes)`` (a subclass sets ``title``
    and passes its rows up), rows being instances of one dataclass whose shown
    fields are declared with ``column()``.
    """

    title: str = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "columns" in cls.__dict__:
            raise TypeError(f"{cls.__name__} sets `columns`: {_NO_COLUMNS}")

    def __init__(self, rows: Sequence[Any], notes: Sequence[str] = (), notice: str | None = None):
        self.rows = list(rows)
        self.notes = list(notes) + list(filter(None, [load.take_load_note()]))  # timings since the last table ran beside other work
        self.notice = notice  # a GPU-only demo's one-line "ran on the CPU" notice (helpers.core.device.gpu_notice), or None
        types = {type(r) for r in self.rows}
        if len(types) > 1 or not all(dataclasses.is_dataclass(t) for t in types):
            raise TypeError(f"{type(self).__name__}: rows must be instances of one dataclass, got "
                            f"{sorted(t.__name__ for t in types)}; {_NO_COLUMNS}")
        for t in types:
            if not any("column" in f.metadata for f in dataclasses.fields(t)):
                raise TypeError(f"{type(self).__name__}: its row {t.__name__} has no column() fields; {_NO_COLUMNS}")

    @property
    def columns(self) -> tuple[Column, ...]:
        """The table's columns, from the row dataclass's ``column()`` fields."""
        return columns_of(type(self.rows[0]), self.rows) if self.rows else ()

    @columns.setter
    def columns(self, value: Any) -> None:
        raise TypeError(f"{type(self).__name__} sets `columns`: {_NO_COLUMNS}")

    def find(self, **criteria: Any) -> Any:
        """The one row whose fields match ``criteria``: each a value (equality) or a predicate of the value.

        ``find(setup="fp32")``, ``find(setup=startswith("fp32"), workers=2)``,
        ``find(seconds=lambda s: s > 1)``. Raises LookupError, naming the rows
        there are, when none or several match.
        """
        names = {f.name for f in dataclasses.fields(self.rows[0])} if self.rows else set(criteria)
        unknown = sorted(set(criteria) - names)
        if unknown:
            raise LookupError(f"{type(self).__name__}: its rows have no field {', '.join(unknown)}; fields: {', '.join(sorted(names))}")
        matches = [r for r in self.rows if all(_matches(getattr(r, k), v) for k, v in criteria.items())]
        if len(matches) == 1:
            return matches[0]
        wanted = ", ".join(f"{k}={v!r}" for k, v in criteria.items())
        if not matches:
            shown = "; ".join(", ".join(f"{k}={getattr(r, k)!r}" for k in criteria) for r in self.rows[:12])
            raise LookupError(f"{type(self).__name__}: no row with {wanted}. Rows have: {shown or 'no rows'}")
        raise LookupError(f"{type(self).__name__}: {len(matches)} rows have {wanted}; add a field to tell them apart")

    def shown_rows(self) -> list[Any]:
        """The rows the table and HTML show (all of them; a report with very many rows may show fewer)."""
        return self.rows

    def table(self) -> str:
        text = format_table(self.columns, self.shown_rows(), self.title) if self.rows else "\n".join([*filter(None, [self.title]), "(no rows)"])
        return "\n".join([text, *self.notes])

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        rows = [[c.render(r) for c in self.columns] for r in self.shown_rows()]
        # Jupyter's stylesheet right-aligns every cell: text columns are set left, numbers right, as in table().
        align = ["right" if rows and all(_looks_numeric(line[i]) for line in rows) else "left" for i in range(len(self.columns))]
        head = "".join(f"<th style='text-align:{a}'>{html.escape(c.header)}</th>" for c, a in zip(self.columns, align))
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:{a}'>{html.escape(v)}</td>" for v, a in zip(line, align)) + "</tr>"
            for line in rows
        )
        caption = f"<caption style='text-align:left'><b>{html.escape(self.title)}</b></caption>" if self.title else ""
        notes = "".join(f"<p><i>{html.escape(n)}</i></p>" for n in self.notes)
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}"

    def records(self) -> list[dict]:
        """Rows as plain dicts (for JSON, pandas, tests)."""
        return [dataclasses.asdict(r) for r in self.rows]

    def to_json(self) -> str:
        return json.dumps({"title": self.title, "rows": self.records(), "notes": self.notes}, indent=2, default=str)

    def plot(self, ax=None):
        raise NotImplementedError(f"{type(self).__name__} has no chart")
