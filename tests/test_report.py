"""helpers.core.report: the table every report prints, its columns declared once, its one look-up."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from helpers.core.report import Column, Report, column, columns_of, format_bytes, format_seconds, format_table, startswith


@dataclass
class Row:
    name: str = column("name")
    value: float | None = column("value", ",.1f")
    note: str = ""  # a plain field: in records(), not in the table


class Rows(Report):
    title = "demo"


def test_table_aligns_numbers_right_and_text_left():
    text = format_table(columns_of(Row), [Row("a", 1234.5), Row("long name", 2.0)])
    lines = text.splitlines()
    assert lines[0].startswith("name") and set(lines[1]) <= {"-", " "}
    assert lines[2].endswith("1,234.5") and lines[3].endswith("2.0")
    assert lines[3].startswith("long name")


def test_missing_values_print_as_na():
    assert "n/a" in str(Rows([Row("x", None)]))


def test_units():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_seconds(0.5) == "500 ms"
    assert format_seconds(2.5e-6) == "2.5 us"


def test_report_exports_records_and_html():
    report = Rows([Row("x", 1.0)], notes=["a note"])
    assert report.records() == [{"name": "x", "value": 1.0, "note": ""}]
    assert "<table>" in report._repr_html_() and "a note" in str(report)
    assert "note" not in str(report).splitlines()[1]  # plain fields are not columns


def test_columns_come_from_the_row_fields_so_a_renamed_field_renames_its_column():
    renamed = dataclasses.make_dataclass("Renamed", [("label", str, column("name")), ("amount", float, column("value", ",.1f"))])
    assert [c.key for c in columns_of(renamed)] == ["label", "amount"]
    # the same table, whatever the fields are called: nothing elsewhere names them
    assert str(Rows([renamed("x", 1234.5)])) == str(Rows([Row("x", 1234.5)]))


def test_spread_and_optional_columns_follow_the_data():
    @dataclass
    class PerWorker:
        stage: str = column("stage")
        per_n: dict = column("N={}", ".2f", spread=True)
        measured: float | None = column("measured", ".1f", optional=True, default=None)

    report = Rows([PerWorker("a", {1: 1.0, 8: 0.25}), PerWorker("b", {1: 2.0, 8: 0.5})])
    assert [c.header for c in report.columns] == ["stage", "N=1", "N=8"]
    assert str(report).splitlines()[4].split() == ["b", "2.00", "0.50"]
    shown = Rows([PerWorker("a", {1: 1.0}, measured=3.0), PerWorker("b", {1: 2.0})])
    assert [c.header for c in shown.columns] == ["stage", "N=1", "measured"] and "n/a" in str(shown)


def test_find_matches_values_and_predicates_and_names_the_rows_it_has():
    report = Rows([Row("fp32 step", 1.0), Row("fp16 step", 2.0), Row("bf16 step", 2.0)])
    assert report.find(name="fp16 step").value == 2.0
    assert report.find(name=startswith("bf")).name == "bf16 step"
    assert report.find(value=lambda v: v < 1.5).name == "fp32 step"
    with pytest.raises(LookupError, match=r"Rows: no row with name='int8'.*'fp32 step'.*'fp16 step'"):
        report.find(name="int8")
    with pytest.raises(LookupError, match=r"Rows: 2 rows have value=2\.0"):
        report.find(value=2.0)
    with pytest.raises(LookupError, match=r"Rows: its rows have no field setup; fields: name, note, value"):
        report.find(setup="fp32 step")


def test_the_legacy_columns_tuple_is_gone():
    with pytest.raises(TypeError, match="column\\(header, fmt\\)"):
        class Legacy(Report):
            columns = (Column("name", "name"),)

    class Sets(Report):
        def __init__(self, rows):
            super().__init__(rows)
            self.columns = (Column("name", "name"),)

    with pytest.raises(TypeError, match="column\\(header, fmt\\)"):
        Sets([Row("x", 1.0)])


def test_rows_without_column_fields_or_as_dicts_are_refused_with_what_to_do():
    @dataclass
    class Bare:
        name: str

    with pytest.raises(TypeError, match="Bare has no column\\(\\) fields; declare"):
        Rows([Bare("x")])
    with pytest.raises(TypeError, match="one dataclass.*dict"):
        Rows([{"name": "x"}])


def test_a_report_without_rows_says_so():
    assert str(Rows([], notes=["nothing ran"])).splitlines() == ["demo", "(no rows)", "nothing ran"]
