"""helpers.core.report: the table every report prints."""
from __future__ import annotations

from dataclasses import dataclass

from helpers.core.report import Column, Report, format_bytes, format_seconds, format_table


@dataclass
class Row:
    name: str
    value: float | None


def test_table_aligns_numbers_right_and_text_left():
    text = format_table([Column("name", "name"), Column("value", "value", ",.1f")], [Row("a", 1234.5), Row("long name", 2.0)])
    lines = text.splitlines()
    assert lines[0].startswith("name") and set(lines[1]) <= {"-", " "}
    assert lines[2].endswith("1,234.5") and lines[3].endswith("2.0")
    assert lines[3].startswith("long name")


def test_missing_values_print_as_na():
    assert "n/a" in format_table([Column("value", "v")], [Row("x", None)])


def test_units():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_seconds(0.5) == "500 ms"
    assert format_seconds(2.5e-6) == "2.5 us"


def test_report_exports_records_and_html():
    class Demo(Report):
        title = "demo"
        columns = (Column("name", "name"),)

    report = Demo([Row("x", 1.0)], notes=["a note"])
    assert report.records() == [{"name": "x", "value": 1.0}]
    assert "<table>" in report._repr_html_() and "a note" in str(report)
