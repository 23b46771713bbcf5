"""The report object every helper returns: prints as a table, renders in notebooks, exposes numbers.

A report holds ``rows``: dataclass instances whose shown fields are declared once
with ``column()``, which gives the header and the format, e.g.

    @dataclass
    class Point:
        n: int = column("n", ",")
        seconds: float = column("time", format_seconds)
        note: str = ""          # a plain field: kept in records(), not shown

``Report.find(n=1024)`` is the one row look-up. Subclasses add numbers as
attributes and a ``plot()`` method.
"""
from __future__ import annotations

import dataclasses
import html
import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class Column:
    """One table column: the row field ``key``, its ``header`` and a format spec or function."""

    key: str
    header: str
    fmt: str | Callable[[Any], str] = ""

    def render(self, row: Any) -> str:
        value = field(row, self.key)
        if value is None:
            return "n/a"
        if callable(self.fmt):
            return self.fmt(value)
        if isinstance(value, float) and not self.fmt:
            return f"{value:.4g}"
        return format(value, self.fmt)


def column(header: str, fmt: str | Callable[[Any], str] = "", **field_options) -> Any:
    """A dataclass field shown as a table column with ``header`` and ``fmt`` (a format spec or function)."""
    metadata = {"column": (header, fmt)}
    return dataclasses.field(metadata=metadata, **field_options)


def columns_of(row_type: type) -> tuple[Column, ...]:
    """The table columns a row dataclass declares with ``column()``, in field order."""
    return tuple(Column(f.name, *f.metadata["column"]) for f in dataclasses.fields(row_type) if "column" in f.metadata)


def field(row: Any, key: str) -> Any:
    """Read ``key`` from a dict row or an attribute row."""
    return row[key] if isinstance(row, dict) else getattr(row, key)


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


class Report:
    """Base class: a titled table of rows plus notes; subclasses add numbers and ``plot()``."""

    title: str = ""
    columns: Sequence[Column] = ()  # legacy: explicit columns; new reports declare them on the row with column()

    def __init__(self, rows: Sequence[Any], notes: Sequence[str] = ()):
        self.rows = list(rows)
        self.notes = list(notes)
        if not self.columns and self.rows and dataclasses.is_dataclass(self.rows[0]):
            self.columns = columns_of(type(self.rows[0]))

    def find(self, **criteria: Any) -> Any:
        """The one row whose fields equal ``criteria``; a clear error when none or several match."""
        matches = [r for r in self.rows if all(field(r, k) == v for k, v in criteria.items())]
        if len(matches) == 1:
            return matches[0]
        wanted = ", ".join(f"{k}={v!r}" for k, v in criteria.items())
        if not matches:
            shown = "; ".join(", ".join(f"{k}={field(r, k)!r}" for k in criteria) for r in self.rows[:12])
            raise LookupError(f"{type(self).__name__}: no row with {wanted}. Rows have: {shown or 'no rows'}")
        raise LookupError(f"{type(self).__name__}: {len(matches)} rows have {wanted}; add a field to tell them apart")

    def shown_rows(self) -> list[Any]:
        """The rows the table and HTML show (all of them; a report with very many rows may show fewer)."""
        return self.rows

    def table(self) -> str:
        text = format_table(self.columns, self.shown_rows(), self.title)
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
        return [r if isinstance(r, dict) else dataclasses.asdict(r) for r in self.rows]

    def to_json(self) -> str:
        return json.dumps({"title": self.title, "rows": self.records(), "notes": self.notes}, indent=2, default=str)

    def plot(self, ax=None):
        raise NotImplementedError(f"{type(self).__name__} has no chart")
