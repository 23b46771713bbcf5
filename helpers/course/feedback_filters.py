"""nbgrader feedback preprocessors: hidden tests never reach a student, and feedback stays small.

A feedback page is built only from what the grader wrote: the student's own code, the visible part of
each test cell, and the grader's verdict of each test (``[grader] ...``, never text the submission made).
What the submission's code printed stays in the graded notebook for the TA, off the page, so nothing a
submission reads while it runs (a stack, the heap, a file) can reach the page. Sources are cut at 64 KiB
per cell and 1 MiB per page.

nbgrader_config.py runs them (``c.GenerateFeedback.preprocessors``) in this order: GetGrades,
HideHiddenTestTracebacks, RemoveHiddenTests, CSSHTMLHeaderPreprocessor.
"""
from __future__ import annotations

import re

from nbgrader.preprocessors import NbGraderPreprocessor

from helpers.course import assignments

OUTPUT_CHARS = 64 * 1024
PAGE_SOURCE_CHARS = 2**20
GRADER_MARK = "[grader] "  # helpers.course.autograde.GRADER_MARK
REDACTED = "[output removed from the feedback: it quoted the hidden tests]"


class HideHiddenTestTracebacks(NbGraderPreprocessor):
    """nbgrader feedback preprocessor: in test cells with hidden tests, shorten error tracebacks to one line.

    A traceback quotes the lines around the failing assert, which may be hidden tests;
    the student sees which test failed (visible line N, or a hidden one) and its message.
    Runs before RemoveHiddenTests, which removes the hidden region itself.
    """

    def preprocess_cell(self, cell, resources, index):
        if assignments.is_graded_test(cell) and assignments.HIDDEN_BEGIN in cell.source:
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error" and not "".join(output.get("traceback", [])).startswith(GRADER_MARK):
                    output["traceback"] = [_one_line_traceback(cell.source, output)]
        return cell, resources


def _one_line_traceback(source: str, error) -> str:
    lines = source.splitlines()
    hidden_start = next((i + 1 for i, line in enumerate(lines) if assignments.HIDDEN_BEGIN in line), len(lines) + 1)
    numbers = re.findall(r"line (\d+)", re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error.get("traceback", []))))
    failing = int(numbers[0]) if numbers else None  # the first frame is the test cell itself
    if failing is not None and failing < hidden_start:
        which = f"the visible test on line {failing} failed"
    else:
        which = "a hidden test failed (its code is not shown)"
    message = f"{error.get('ename', 'Error')}: {error.get('evalue', '')}".rstrip(": ")
    return f"{which}: {message}"


class RemoveHiddenTests(NbGraderPreprocessor):
    """Remove the hidden region of every autograded test cell, and any output that quotes a hidden-test line.

    Unlike nbgrader's ClearHiddenTests, a student's own cell that happens to contain the marker text is left
    alone (it holds no hidden test), so such a student still gets feedback. Outputs are cut to 64 KiB each.
    """

    def preprocess(self, nb, resources):
        hidden = set()
        for cell in nb.cells:
            if assignments.is_graded_test(cell):
                hidden.update(_hidden_lines(cell.source))
        budget = PAGE_SOURCE_CHARS
        for cell in nb.cells:
            if assignments.is_graded_test(cell) and assignments.HIDDEN_BEGIN in cell.source:
                cell.source = _without_hidden_region(cell.source)
            if "outputs" in cell:
                cell.outputs = [o for o in cell.outputs if _from_grader(o)]
            for output in cell.get("outputs", []):
                _redact(output, hidden)
            cut = min(OUTPUT_CHARS, max(budget, 0))
            if len(cell.source) > cut:
                cell.source = cell.source[:cut] + f"\n[... {len(cell.source) - cut:,} more characters not shown]"
            budget -= len(cell.source)
        return nb, resources


def _from_grader(output) -> bool:
    """An output the grader wrote (a test's verdict), not one the submission's code produced."""
    if output.get("output_type") == "error":
        return "".join(output.get("traceback", [])).startswith(GRADER_MARK)
    if output.get("output_type") == "stream":
        return output.get("name") == "stdout" and str(output.get("text", "")).startswith(GRADER_MARK)
    return False


def _hidden_lines(source: str) -> set[str]:
    """The hidden-test lines long enough to recognise when an output quotes them."""
    return {line.strip() for line in assignments.split_hidden(source)[1] if len(line.strip()) >= 12}


def _without_hidden_region(source: str) -> str:
    return "\n".join(assignments.split_hidden(source)[0])


def _redact(output, hidden: set[str]) -> None:
    texts = []
    if "text" in output:
        texts.append(("text", output["text"]))
    for key in ("evalue",):
        if key in output:
            texts.append((key, output[key]))
    data = output.get("data", {})
    for mime in list(data):
        if isinstance(data[mime], str):
            if any(line in data[mime] for line in hidden):
                data[mime] = REDACTED
            elif len(data[mime]) > OUTPUT_CHARS:
                data[mime] = data[mime][:OUTPUT_CHARS] + "\n[... cut at 64 KiB]"
        else:
            data.pop(mime)  # images and other binary data are not part of the feedback
    if "traceback" in output:
        output["traceback"] = [REDACTED] if any(line in "\n".join(output["traceback"]) for line in hidden) else output["traceback"][-60:]
    for key, text in texts:
        if any(line in text for line in hidden):
            output[key] = REDACTED
        elif len(text) > OUTPUT_CHARS:
            output[key] = text[:OUTPUT_CHARS] + "\n[... cut at 64 KiB]"
