"""Course tooling, not imported by students: the notebook runner, grading, the assignment conventions.

Run as ``python -m helpers.course.notebooks`` and ``python -m helpers.course.grading`` (the Makefile does).
"""
