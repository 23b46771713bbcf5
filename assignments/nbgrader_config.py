"""nbgrader settings of the course. This folder is the course root: run nbgrader (or make release/autograde/...) from here.

How an assignment is written and graded: assignments/README.md.
"""
from nbgrader.preprocessors import ClearHiddenTests, GetGrades
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor

from helpers.course.grading import HideHiddenTestTracebacks

c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file

c.CourseDirectory.course_id = "edl-systems"

# ---- executing submissions
# A cell that runs longer than this is interrupted and its test fails; the other cells still run.
# Every test cell of the kit's assignments finishes well within it on a 2-core laptop CPU.
c.Execute.timeout = 180
c.Execute.interrupt_on_timeout = True
# Kernel start (imports torch) on a busy machine can be slow.
c.Execute.startup_timeout = 120
# Graded runs are deterministic: no silent re-runs that could hide a flaky test.
c.Execute.execute_retries = 0
# Huge outputs (a print in a loop) are truncated instead of bloating the gradebook and feedback.
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100

# ---- robustness against edited submissions
# Test and locked cells are restored from the gradebook (nbgrader does this by default); deleted
# test cells are added back, so deleting a failing test does not avoid it.
c.OverwriteCells.add_missing_cells = True
# Students not in the roster are graded all the same (and reported as such by `make grades`).
c.Autograde.create_student = True

# ---- feedback: hidden tests never reach students, not even through a traceback
c.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTestTracebacks, ClearHiddenTests, CSSHTMLHeaderPreprocessor]

# ---- importing an LMS download (`make import A=<id> ZIP=<file>`): nbgrader's zip_collect
# Files are named <student_id>_<notebook>.ipynb or sit in a folder <student_id>/<notebook>.ipynb;
# notebooks are always partN_<name>.ipynb, which is where the student id ends.
c.ZipCollectApp.collector_plugin = "nbgrader.plugins.FileNameCollectorPlugin"
c.FileNameCollectorPlugin.named_regexp = r".*[/\\](?P<student_id>[^/\\]+?)[_/\\](?P<file_id>part\d+_[^/\\]*\.ipynb)$"
