"""Tick labels the kit's charts show: short, with units, and never on top of each other."""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from helpers.core import plots  # noqa: E402
from helpers.core.report import Report, column  # noqa: E402


@pytest.mark.parametrize("value, unit, label", [
    (2_097_152, "bytes", "2 MiB"), (16_777_216, "bytes", "16 MiB"), (1536, "bytes", "1.5 KiB"), (4, "bytes", "4 B"),
    (1e-4, "seconds", "100 us"), (0.0025, "seconds", "2.5 ms"), (3.0, "seconds", "3 s"),
    (16_777_216, None, "16.8M"), (1024, None, "1,024"), (0.25, None, "0.25"),
])
def test_tick_labels_are_short_and_carry_their_unit(value, unit, label):
    assert plots.tick_label(value, unit) == label


def _visible_labels(ax, axis):
    ax.figure.canvas.draw()
    low, high = sorted(getattr(ax, f"get_{axis}lim")())
    ticks = getattr(ax, f"get_{axis}axis")().get_major_ticks()
    return [t.label1 for t in ticks if t.label1.get_visible() and t.label1.get_text() and low <= t.get_loc() <= high]


def test_a_log_bytes_axis_from_4_bytes_to_64_mib_has_no_colliding_labels():
    sizes = [4 * 2**k for k in range(25)]
    ax = plots.line_chart({"one-way time": (sizes, [1e-5 + s * 1e-9 for s in sizes])}, xlabel="message size", ylabel="time",
                          logx=True, logy=True, xunit="bytes", yunit="seconds")
    renderer = ax.figure.canvas.get_renderer()
    for axis in ("x", "y"):
        labels = _visible_labels(ax, axis)
        assert 3 <= len(labels) <= 9, [t.get_text() for t in labels]
        boxes = [t.get_window_extent(renderer) for t in labels]
        for a, b in zip(boxes, boxes[1:]):
            assert not a.overlaps(b), f"{axis} tick labels collide: {[t.get_text() for t in labels]}"
    assert all(t.get_text().endswith(("B", "KiB", "MiB", "GiB")) for t in _visible_labels(ax, "x"))
    assert all(t.get_text().endswith(("s", "ms", "us", "ns")) for t in _visible_labels(ax, "y"))
    plt.close(ax.figure)


def test_a_memory_axis_uses_one_unit_for_every_tick():
    fig, ax = plt.subplots()
    ax.bar([0, 1], [0.3 * 2**30, 1.2 * 2**30])
    plots.bytes_axis(ax)
    texts = [t.get_text() for t in _visible_labels(ax, "y") if t.get_text() != "0"]
    assert texts and {t.split()[1] for t in texts} == {"GiB"}, texts
    plt.close(fig)


def test_html_tables_set_text_left_and_numbers_right():
    @dataclass
    class Named:
        name: str = column("name")
        value: float = column("value", ".1f")

    page = Report([Named("alpha", 1.0), Named("beta", 22.5)])._repr_html_()
    assert "<td style='text-align:left'>alpha</td>" in page and "<td style='text-align:right'>22.5</td>" in page


def test_a_log_axis_spanning_less_than_a_decade_still_has_several_labels():
    ax = plots.line_chart({"time": ([1, 2, 4, 8], [60e-6, 70e-6, 80e-6, 400e-6])}, logx=True, logy=True, yunit="seconds")
    texts = [t.get_text() for t in _visible_labels(ax, "y")]
    assert len(texts) >= 3 and all(t.endswith("us") for t in texts), texts
    plt.close(ax.figure)


def test_a_reference_line_label_sits_above_its_line():
    fig, ax = plt.subplots()
    ax.bar([0, 1], [5.0, 2.0])
    plots.horizontal_line(ax, 3.0, "GTX 580 (3 GB)", color="red")
    fig.canvas.draw()
    label = next(t for t in ax.texts if t.get_text() == "GTX 580 (3 GB)")
    line_y = ax.transData.transform((0, 3.0))[1]
    assert label.get_window_extent(fig.canvas.get_renderer()).y0 > line_y, "the label's text crosses its own line"
    plt.close(fig)


def test_a_pie_title_clears_its_highest_wedge_label():
    ax = plots.pie_chart({"Conv2d": 40, "Linear": 50, "other: ReLU, MaxPool2d": 3}, title="LeNet: memory by part")
    renderer = ax.figure.canvas.get_renderer()
    title = ax.title.get_window_extent(renderer)
    assert all(title.y0 >= t.get_window_extent(renderer).y1 - 0.5 for t in ax.texts), "the title overlaps a wedge label"


def test_heatmap_digits_are_dark_on_light_cells_and_light_on_dark_ones():
    ax = plots.grid_heatmap([[0, 9]])
    colors = {t.get_text(): t.get_color() for t in ax.texts}
    assert colors == {"0": "white", "9": "black"}  # viridis runs from dark purple to yellow


def test_a_scatter_from_zero_shows_a_small_difference_as_small():
    ax = plots.labelled_scatter({"plain": (430.0, 40.0), "batched": (456.0, 42.0)}, from_zero=True)
    (x0, x1), (y0, _) = ax.get_xlim(), ax.get_ylim()
    assert x0 == 0 and y0 == 0 and (456 - 430) / (x1 - x0) < 0.1  # 6% of the throughput is under a tenth of the axis
