"""nbgrader settings of the course. This folder is the course root: run nbgrader (or make release/autograde/...) from here.

How an assignment is written and graded: assignments/README.md.
"""
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import GetGrades

from helpers.course.feedback_filters import HideHiddenTestTracebacks, RemoveHiddenTests

c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file

c.CourseDirectory.course_id = "edl-systems"

# ---- executing submissions (the kit's sandboxed grader, helpers/course/autograde.py, reads this value)
# A cell that runs longer than this is interrupted and its test fails; the other cells still run.
# Every test cell of the kit's assignments finishes well within it on a 2-core laptop CPU.
# The other limits (memory, processes, output, disk, wall time per submission) are in
# helpers/course/sandbox.py (Limits) and assignments/README.md.
c.Execute.timeout = 180

# ---- robustness against edited submissions
# The grader rebuilds every notebook from the released one: test and read-only cells come from the
# gradebook (deleted ones are added back), only solution cells and added cells come from the student.
# Students not in the roster are graded all the same (and reported as such by `make grades`).
c.Autograde.create_student = True

# ---- feedback: hidden tests never reach students, not even through a traceback
c.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTestTracebacks, RemoveHiddenTests, CSSHTMLHeaderPreprocessor]

# ---- importing an LMS download (`make import A=<id> ZIP=<file>`): helpers/course/lms_import.py reads this
# pattern (nbgrader's zip_collect reads it too); the student id it finds must be the entry's own first part.
# Files are named <student_id>_<notebook>.ipynb or sit in a folder <student_id>/<notebook>.ipynb;
# notebooks are always partN_<name>.ipynb, which is where the student id ends.
c.ZipCollectApp.collector_plugin = "nbgrader.plugins.FileNameCollectorPlugin"
c.FileNameCollectorPlugin.named_regexp = r".*[/\\](?P<student_id>[^/\\]+?)[_/\\](?P<file_id>part\d+_[^/\\]*\.ipynb)$"
