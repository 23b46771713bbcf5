"""Widgets as static outputs, for HTML copies of executed notebooks that must read the same with no network.

An executed notebook keeps each widget's last state in its metadata; a browser needs the widget renderer
(from a CDN) to draw it, and offline it draws nothing. ``freeze_widgets`` replaces every widget view by
what it showed: an Output widget's outputs (tables, the chart as an embedded PNG), the text of HTML and
Label widgets, a progress bar as text ("steps 10/10, 100%"), and a control's setting ("batch size: 128").
"""
from __future__ import annotations

import html

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
CONTROLS = ("IntSlider", "FloatSlider", "IntRangeSlider", "FloatRangeSlider", "ToggleButtons", "Dropdown", "RadioButtons",
            "Checkbox", "ToggleButton", "Text", "IntText", "FloatText", "BoundedIntText", "BoundedFloatText", "SelectionSlider")


def freeze_widgets(nb) -> int:
    """Replace widget views by static outputs and drop the widget state, in place; returns the views replaced."""
    state = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    replaced = 0
    for cell in nb.get("cells", []):
        outputs = []
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                outputs.append(output)
                continue
            replaced += 1
            frozen = _static(view.get("model_id", ""), state)
            outputs += frozen or [_text_output(output.get("data", {}).get("text/plain", "(a widget)"))]
        if "outputs" in cell:
            cell["outputs"] = outputs
    nb.get("metadata", {}).pop("widgets", None)
    return replaced


def _static(model_id: str, state: dict, depth: int = 0) -> list[dict]:
    model = state.get(model_id)
    if model is None or depth > 20:
        return []
    name, values = model.get("model_name", ""), model.get("state", {})
    kind = name.removesuffix("Model")
    if kind == "Output":
        return [dict(o) for o in values.get("outputs", [])]
    if kind in ("HBox", "VBox", "Box", "GridBox", "Accordion", "Tab"):
        parts = [_static(_ref(child), state, depth + 1) for child in values.get("children", [])]
        if kind == "HBox" and all(len(p) == 1 and _is_html(p[0]) for p in parts if p):  # a row: one line of text
            return [_html_output(" ".join(_html_of(p[0]) for p in parts if p))]
        return [o for p in parts for o in p]
    if kind in ("HTML", "HTMLMath", "Label"):
        text = values.get("value", "")
        return [_html_output(text if kind != "Label" else html.escape(text))] if text else []
    if kind in ("IntProgress", "FloatProgress"):
        value, top = values.get("value", 0), values.get("max", 100) or 100
        label = html.escape(values.get("description", ""))
        return [_html_output(f"{label} {value:g}/{top:g} ({100 * value / top:.0f}%)".strip())]
    if kind in CONTROLS:
        label = values.get("description", "") or kind
        shown = values.get("value")
        if "_options_labels" in values and isinstance(values.get("index"), int):
            shown = values["_options_labels"][values["index"]]
        return [_html_output(f"<b>{html.escape(str(label))}</b>: {html.escape(str(shown))}")]
    return []


def _ref(child) -> str:
    return child.removeprefix("IPY_MODEL_") if isinstance(child, str) else ""


def _html_output(fragment: str) -> dict:
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": fragment, "text/plain": html.unescape(fragment)}}


def _text_output(text: str) -> dict:
    return {"output_type": "display_data", "metadata": {}, "data": {"text/plain": text}}


def _is_html(output: dict) -> bool:
    return set(output.get("data", {})) == {"text/html", "text/plain"}


def _html_of(output: dict) -> str:
    return output["data"]["text/html"]
