"""Every chart in the kit, in one style: same sizes, fonts, grid and colours for the same things.

Reports call these functions from their ``plot()`` methods; notebooks rarely
need matplotlib directly.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator, Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import Formatter, FuncFormatter, LogLocator, MaxNLocator, NullFormatter

STYLE = {
    "figure.figsize": (7.0, 4.2),
    "figure.dpi": 100,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "lines.linewidth": 2.0,
    "lines.markersize": 5,
}

# Fixed colours for the things the kit compares most, so a chart reads the same everywhere.
NAMED_COLORS = {
    "cpu": "#1f77b4",
    "cuda": "#2ca02c",
    "gpu": "#2ca02c",
    "pageable": "#d62728",
    "pinned": "#2ca02c",
    "host copy": "#1f77b4",
    "input": "#9467bd",
    "inputs": "#9467bd",
    "weights": "#ff7f0e",
    "parameters": "#ff7f0e",
    "outputs": "#1f77b4",
    "activations": "#1f77b4",
    "gradients": "#d62728",
    "weight gradients": "#d62728",
    "output gradients": "#e377c2",
    "optimizer state": "#8c564b",
    "temporaries": "#7f7f7f",
    "wrong": "#d62728",
    "right": "#2ca02c",
    "waiting": "#d62728",
    "computing": "#2ca02c",
    "cuda context": "#bcbd22",
    "convolution workspace": "#17becf",
    "allocator fragmentation": "#c7c7c7",
}
CYCLE = ["#1f77b4", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def apply_style() -> None:
    """Install the kit's matplotlib defaults (called on import)."""
    plt.rcParams.update(STYLE)


@contextlib.contextmanager
def fixed_style() -> Iterator[None]:
    """Within the block: matplotlib's defaults plus the kit's style, whatever the session changed (restored after).

    For images that must not depend on the state of the kernel that draws them (the live widgets' charts).
    """
    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        plt.rcParams.update(STYLE)
        yield


def color_for(label: str, index: int = 0) -> str:
    """The colour of a named thing ('cpu', 'pinned', 'weights', ...), else the index-th cycle colour."""
    key = label.lower()
    for name, color in NAMED_COLORS.items():
        if key == name or key.startswith(name + " "):
            return color
    return CYCLE[index % len(CYCLE)]


def new_axes(ax=None, *, title: str = "", xlabel: str = "", ylabel: str = "", logx: bool = False, logy: bool = False,
             xunit: str | None = None, yunit: str | None = None):
    """Return ``ax`` (or a fresh one) with the title, labels, log scales and tick units set.

    ``xunit`` / ``yunit``: "bytes" (ticks like 64 KiB, 16 MiB) or "seconds" (100 us, 2.5 ms); else plain numbers.
    A log axis gets at most about 8 labelled ticks, so long labels never collide.
    """
    if ax is None:
        _, ax = plt.subplots()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    for axis, log, unit, base in ((ax.xaxis, logx, xunit, 2), (ax.yaxis, logy, yunit, 10)):
        if log:
            (ax.set_xscale if axis is ax.xaxis else ax.set_yscale)("log", base=base)
            axis.set_major_locator(LogLocator(base=base, numticks=8) if base == 2 else _DecimalLogLocator())
            axis.set_minor_formatter(NullFormatter())
        if log or unit:
            axis.set_major_formatter(FuncFormatter(lambda value, _pos, unit=unit: tick_label(value, unit)))
    return ax


class _DecimalLogLocator(LogLocator):
    """Base-10 log ticks dense enough to read: 1..9 x 10^k within a decade, 1-2-5 over a few, fewer beyond."""

    def __init__(self):
        super().__init__(base=10, numticks=8)

    def tick_values(self, vmin, vmax):
        if vmin > 0 and vmax > 0:
            decades = abs(math.log10(vmax / vmin))
            subs = np.arange(1.0, 10.0) if decades <= 1 else (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0, 3.0) if decades <= 4 else (1.0,)
            self.set_params(subs=subs)
        return super().tick_values(vmin, vmax)


def tick_label(value: float, unit: str | None = None) -> str:
    """A short tick label: 2 MiB for bytes, 100 us for seconds, 1,024 or 16.8M for plain numbers."""
    if unit == "bytes":
        return _binary_label(value)
    if unit == "seconds":
        return _seconds_label(value)
    return _plain_number(value)


def _plain_number(value: float, _position=None) -> str:
    """Plain numbers (1,024 rather than 2^10 or 1e3); millions and more as 16.8M, 2.1G."""
    if abs(value) >= 1e6:
        for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
            if abs(value) >= scale:
                return f"{value / scale:.3g}{suffix}"
    return f"{value:,.0f}" if abs(value) >= 1 else f"{value:g}"


def _binary_label(value: float) -> str:
    if not value:
        return "0"
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB"), (0, "B")):
        if abs(value) >= 1024 ** power or power == 0:
            return f"{value / 1024 ** power:.3g} {unit}"
    raise AssertionError("unreachable")


def _seconds_label(value: float) -> str:
    if not value:
        return "0"
    for scale, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")):
        if abs(value) >= scale or unit == "ns":
            return f"{value / scale:.3g} {unit}"
    raise AssertionError("unreachable")


def line_chart(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], ax=None, *, styles: Mapping[str, str] | None = None, **labels):
    """One line with markers per named series of (x, y); ``styles`` maps a name to a line style."""
    ax = new_axes(ax, **labels)
    for i, (name, (x, y)) in enumerate(series.items()):
        ax.plot(x, y, marker="o", label=name, color=color_for(name, i), linestyle=(styles or {}).get(name, "-"))
    if len(series) > 1:
        ax.legend()
    return ax


def grouped_bars(categories: Sequence[str], groups: Mapping[str, Sequence[float]], ax=None, **labels):
    """Side-by-side bars: one group of bars per category, one bar per named group."""
    ax = new_axes(ax, **labels)
    width = 0.8 / max(len(groups), 1)
    for i, (name, values) in enumerate(groups.items()):
        xs = [c + (i - (len(groups) - 1) / 2) * width for c in range(len(categories))]
        ax.bar(xs, values, width=width, label=name, color=color_for(name, i))
    ax.set_xticks(range(len(categories)), categories, rotation=30 if len(categories) > 6 else 0, ha="right" if len(categories) > 6 else "center")
    ax.legend()
    return ax


def stacked_bars(categories: Sequence[str], parts: Mapping[str, Sequence[float]], ax=None, **labels):
    """One bar per category, stacked from the named parts (e.g. inputs, weights, outputs)."""
    ax = new_axes(ax, **labels)
    bottom = [0.0] * len(categories)
    for i, (name, values) in enumerate(parts.items()):
        ax.bar(range(len(categories)), values, bottom=bottom, label=name, color=color_for(name, i))
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(categories)), categories, rotation=45 if len(categories) > 6 else 0, ha="right" if len(categories) > 6 else "center")
    ax.legend()
    return ax


def pie_chart(shares: Mapping[str, float], ax=None, *, title: str = ""):
    """A pie of named shares, labelled with percentages; zero shares are left out."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 5))
    items = [(k, v) for k, v in shares.items() if v > 0]
    _, labels, _ = ax.pie(
        [v for _, v in items],
        labels=[k for k, _ in items],
        colors=[color_for(k, i) for i, (k, _) in enumerate(items)],
        autopct="%1.1f%%",
        startangle=90,
        counterclock=False,
    )
    ax.axis("equal")
    # wedge labels sit outside the pie and may reach above the axes: the title goes above the highest one
    ax.set_title(title, pad=6 + _points_above_axes(ax, labels))
    return ax


def _points_above_axes(ax, texts) -> float:
    """How far (points) the highest of ``texts`` reaches above the top of ``ax``; 0 when none does."""
    figure = ax.figure
    renderer = figure.canvas.get_renderer()
    top = max((t.get_window_extent(renderer).y1 for t in texts), default=0.0)
    return max(0.0, (top - ax.get_window_extent(renderer).y1) * 72 / figure.dpi)


def horizontal_line(ax, y: float, label: str, color: str = "black") -> None:
    """A dashed reference line (a limit, a peak) with its label at the right end."""
    ax.axhline(y, linestyle="--", color=color, linewidth=1.2)
    # Lifted 3 points off the line and set on a white box, so neither the line nor bars behind it cross the text.
    ax.annotate(label, xy=(1.0, y), xycoords=("axes fraction", "data"), xytext=(-2, 3), textcoords="offset points", ha="right", va="bottom",
                fontsize=9, color=color, bbox={"boxstyle": "square,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})


def vertical_line(ax, x: float, label: str, color: str = "black") -> None:
    """A dashed vertical reference line (a cache size, a limit) with its label written along it near the top."""
    ax.axvline(x, linestyle="--", color=color, linewidth=1.0, alpha=0.7)
    ax.annotate(label, xy=(x, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -4), textcoords="offset points", rotation=90, ha="left", va="top", fontsize=8, color=color)


def text_color_on(background) -> str:
    """Black or white, whichever reads better on ``background`` (an RGB(A) colour): by its relative luminance."""
    red, green, blue = matplotlib.colors.to_rgb(background)
    return "black" if 0.2126 * red + 0.7152 * green + 0.0722 * blue > 0.45 else "white"


def grid_heatmap(grid, ax=None, *, title: str = "", idle: int | None = None, xlabel: str = "", ylabel: str = ""):
    """A 2-D grid of small integers as coloured cells, each labelled with its value; cells equal to ``idle`` are grey."""
    values = np.asarray(grid)
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 5))
    masked = np.ma.masked_equal(values, idle) if idle is not None else np.ma.asarray(values)
    image = ax.imshow(masked, cmap=plt.get_cmap("viridis").with_extremes(bad="#e0e0e0"), aspect="equal")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(False)
    if values.size <= 400:
        for (r, c), v in np.ndenumerate(values):
            if idle is None or v != idle:
                ax.text(c, r, str(v), ha="center", va="center", fontsize=8, color=text_color_on(image.cmap(image.norm(v))))
    ax.set_xticks(range(values.shape[1]))
    ax.set_yticks(range(values.shape[0]))
    return ax


def gantt(lanes: Mapping[str, Sequence[tuple[float, float, str, str]]], ax=None, *, title: str = "", xlabel: str = ""):
    """One horizontal lane per name (a pipeline stage, a worker), top to bottom; each (start, end, text, kind) a labelled box
    coloured by its kind (e.g. forward, backward), with one legend entry per kind."""
    ax = new_axes(ax, title=title, xlabel=xlabel)
    kinds: dict[str, str] = {}
    names = list(lanes)
    for row, name in enumerate(names):
        for start, end, text, kind in lanes[name]:
            color = kinds.setdefault(kind, color_for(kind, len(kinds)))
            ax.barh(row, end - start, left=start, height=0.8, color=color, edgecolor="white", linewidth=0.8)
            ax.text((start + end) / 2, row, text, ha="center", va="center", fontsize=7, color="white", clip_on=True)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in kinds.values()], labels=list(kinds), loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


apply_style()


# ---------------------------------------------------------------- memory charts (helpers.core.memory, helpers.hardware.alexnet)


class _BinaryLocator(MaxNLocator):
    """Ticks at round numbers of the binary unit (KiB, MiB, GiB) that suits the axis's range."""

    def tick_values(self, vmin, vmax):
        unit = 1024 ** max(0, min(4, int(math.log(max(abs(vmin), abs(vmax), 1), 1024))))
        return super().tick_values(vmin / unit, vmax / unit) * unit


def bytes_axis(ax, axis: str = "y") -> None:
    """Ticks at round binary sizes, all in one unit (0.4, 0.8, 1.2 GiB rather than 409.6 MiB, 819.2 MiB, 1.2 GiB)."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(_BinaryLocator(nbins=6, steps=[1, 2, 2.5, 4, 5, 10]))
    target.set_major_formatter(_OneUnitBytes())


class _OneUnitBytes(Formatter):
    """Byte ticks labelled in the single binary unit that suits the axis's largest value."""

    def __call__(self, value, pos=None):
        if not value:
            return "0"
        low, high = self.axis.get_view_interval()
        power = max(0, min(4, int(math.log(max(abs(low), abs(high), 1), 1024))))
        return f"{value / 1024 ** power:.3g} {('B', 'KiB', 'MiB', 'GiB', 'TiB')[power]}"


def stacked_area(x: Sequence[float], parts: Mapping[str, Sequence[float]], ax=None, *, spans: Sequence[tuple[float, float, str]] = (), **labels):
    """Named parts stacked over ``x`` (e.g. memory by category over a training step); ``spans`` shade labelled x ranges."""
    ax = new_axes(ax, **labels)
    names = [n for n, v in parts.items() if any(v)]
    ax.stackplot(x, *[parts[n] for n in names], labels=names, colors=[color_for(n, i) for i, n in enumerate(names)], alpha=0.85)
    for i, (start, end, label) in enumerate(spans):
        if i % 2:
            ax.axvspan(start, end, color="black", alpha=0.05, linewidth=0)
        ax.annotate(label, xy=((start + end) / 2, 0.99), xycoords=("data", "axes fraction"), ha="center", va="top", fontsize=9, style="italic")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.12)  # room for the span labels
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def measured_and_model(measured: Mapping[str, tuple[Sequence[float], Sequence[float]]],
                       model: Mapping[str, tuple[Sequence[float], Sequence[float]]], ax=None, **labels):
    """Measured series as solid lines with markers; each model series (same name) dashed in the same colour."""
    ax = new_axes(ax, **labels)
    for i, (name, (x, y)) in enumerate(measured.items()):
        color = color_for(name, i)
        ax.plot(x, y, marker="o", label=f"{name} (measured)", color=color)
        if name in model:
            mx, my = model[name]
            ax.plot(mx, my, linestyle="--", label=f"{name} (model)", color=color)
    ax.legend()
    return ax


def log2_ranges(ranges: Mapping[str, tuple[float, float, float]], ax=None, **labels):
    """One horizontal bar per named number format: thin from its smallest subnormal, thick from its smallest normal to its largest."""
    ax = new_axes(ax, **labels)
    names = list(ranges)
    for i, name in enumerate(names):
        subnormal, normal, largest = (math.log2(v) for v in ranges[name])
        color = color_for(name, i)
        ax.plot([subnormal, normal], [i, i], color=color, linewidth=2, alpha=0.6)
        ax.plot([normal, largest], [i, i], color=color, linewidth=8, solid_capstyle="butt")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    return ax


def log2_histogram(values: Sequence[float], marks: Mapping[str, float] | None = None, ax=None, bins: int = 60, **labels):
    """A histogram of values already on a log2 scale, with dashed vertical lines at the named ``marks``."""
    ax = new_axes(ax, **labels)
    ax.hist(values, bins=bins, color=CYCLE[0], alpha=0.8)
    for i, (name, x) in enumerate((marks or {}).items()):
        ax.axvline(x, linestyle="--", linewidth=1.2, color=CYCLE[(i + 3) % len(CYCLE)], label=name)
    if marks:
        ax.legend()
    return ax


def horizontal_bars(names: Sequence[str], values: Sequence[float], ax=None, **labels):
    """One horizontal bar per name, the first on top, each in its own cycle colour."""
    ax = new_axes(ax, **labels)
    ax.barh(list(names)[::-1], list(values)[::-1], color=CYCLE[: len(values)][::-1])
    return ax


def labelled_scatter(points: Mapping[str, tuple[float, float]], ax=None, notes: Mapping[str, str] | None = None, *,
                     from_zero: bool = False, **labels):
    """One labelled point per name (x, y); ``notes`` adds a second line under a point's label.

    ``from_zero``: both axes start at 0, so that points 6% apart look 6% apart (matplotlib's automatic
    limits zoom onto the points and make any difference fill the chart).
    """
    ax = new_axes(ax, **labels)
    for i, (name, (x, y)) in enumerate(points.items()):
        ax.scatter([x], [y], s=80, color=color_for(name, i), zorder=3)
        text = name + (f"\n{notes[name]}" if notes and name in notes else "")
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(8, 6), fontsize=9)
    if from_zero and points:
        ax.set_xlim(0, 1.3 * max(x for x, _ in points.values()) or 1)
        ax.set_ylim(0, 1.2 * max(y for _, y in points.values()) or 1)
    return ax
