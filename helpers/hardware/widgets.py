"""ipywidgets controls for live demos: move a control and the report and its chart redraw.

Each control object keeps the report it last drew in ``.report``, so what the class sees
can also be read (and tested) as numbers.
"""
from __future__ import annotations

import io
from functools import lru_cache

import ipywidgets as widgets
from IPython.display import Image, display
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import nn

from helpers.core import plots
from helpers.hardware.alexnet import FIGURE_SIZE, PRECISIONS, AlexNetCase, profile_layer_alexnet


@lru_cache(maxsize=128)
def _default_case(batch_size: int, precision: str) -> AlexNetCase:
    """The 2012 network's report (cached, so moving the slider back is instant)."""
    return profile_layer_alexnet(None, batch_size, precision)


class AlexNetExplorer:
    """A batch-size slider and a precision choice that redraw AlexNet's memory against one GTX 580 live."""

    def __init__(self, batch_size: int = 128, precision: str = "fp32", max_batch: int = 512, model: nn.Module | None = None):
        self.model = model
        self.batch = widgets.IntSlider(value=batch_size, min=1, max=max_batch, description="batch size", continuous_update=False)
        self.precision = widgets.ToggleButtons(options=PRECISIONS, value=precision, description="precision")
        self.output = widgets.Output()
        self.report: AlexNetCase | None = None
        self.redraws = 0
        for control in (self.batch, self.precision):
            control.observe(self.redraw, names="value")
        self.widget = widgets.VBox([widgets.HBox([self.batch, self.precision]), self.output])
        self.redraw()

    def compute(self, batch_size: int, precision: str) -> AlexNetCase:
        if self.model is None:
            return _default_case(batch_size, precision)
        return profile_layer_alexnet(self.model, batch_size, precision)

    def redraw(self, _change=None) -> None:
        """Recompute the report for the controls' values and draw it (table and chart) in the output area."""
        self.report = self.compute(self.batch.value, self.precision.value)
        self.png = render_png(self.report)
        with self.output:
            self.output.clear_output(wait=True)
            display(self.report)
            display(Image(data=self.png))
        self.redraws += 1

    def _ipython_display_(self) -> None:
        display(self.widget)


def render_png(report: AlexNetCase) -> bytes:
    """The case study's chart as PNG bytes, drawn on a figure of its own with fixed size and resolution.

    Nothing depends on pyplot's current figure, the inline backend's settings or rcParams the session
    changed at the moment of a slider event, so every redraw of the same state gives the same image.
    """
    buffer = io.BytesIO()
    with plots.fixed_style():
        figure = Figure(figsize=FIGURE_SIZE, dpi=100)
        FigureCanvasAgg(figure)
        left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
        report.draw(left, right)
        figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def alexnet_explorer(batch_size: int = 128, precision: str = "fp32", model: nn.Module | None = None) -> AlexNetExplorer:
    """The AlexNet case study with live controls: show it in a notebook cell and move the slider."""
    return AlexNetExplorer(batch_size, precision, model=model)
