"""``make student-kit``: the folder a course hands to students: lectures, helpers, the released assignments, nothing sealed.

    python -m helpers.course.student_kit --out build/student-kit

It needs the instructor material unlocked (the student versions are released from the sources), copies every tracked
file that is not sealed and not the course's own machinery (tests, the grading course's sources), adds nbgrader's
released notebooks, and then checks the folder: no ciphertext, no solution or hidden-test marker, and no file holding
half of any solution or hidden-test region of the sources.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.course import sealed
from helpers.course.grading import Course, GradingError, release

LEFT_OUT = ("tests/", ".ci/", "assignments/source/")  # the instructors' and CI's: what a student needs is the released copy
MARKERS = [marker for pair in sealed.MARKERS.values() for marker in pair]


def build(out: Path, checkout: Path | None = None) -> list[str]:
    """Write the student kit into ``out`` (emptied first); returns the problems the final check found (none: ready)."""
    checkout = checkout or sealed.root()
    course = Course(checkout / "assignments")
    if sealed.locked(course.source):
        raise GradingError(f"make student-kit releases the assignments from their sources: {sealed.MESSAGE}")
    release(course)
    shutil.rmtree(out, ignore_errors=True)
    patterns = sealed.sealed_patterns(checkout)
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=checkout, capture_output=True, text=True, check=True).stdout.split("\0")
    for relative in filter(None, listed):
        if relative.startswith(LEFT_OUT) or sealed.is_sealed_path(relative, patterns) or relative == ".gitattributes":
            continue
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(checkout / relative, out / relative)
    shutil.copytree(course.release, out / "assignments" / "release", ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return check(out, sealed.answer_regions(course.source))


def check(kit: Path, regions: list[sealed.Region]) -> list[str]:
    """Problems of a student kit: ciphertext, solution or hidden-test markers, answers copied from the sources."""
    problems, texts = [], {}
    for path in sorted(p for p in kit.rglob("*") if p.is_file()):
        relative = str(path.relative_to(kit))
        if sealed.is_ciphertext(path):
            problems.append(f"{relative}: sealed (ciphertext)")
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if path.suffix == ".ipynb" or relative.startswith("assignments/release/"):  # elsewhere a marker is documentation
            problems += [f"{relative}: holds the marker {marker!r}" for marker in MARKERS if marker in text]
        texts[relative] = text
    problems += [f"{leak.file}: {leak.share:.0%} of the {leak.region.kind} of {leak.region.where}" for leak in sealed.leaks(regions, texts)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.course.student_kit", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/student-kit"), help="the folder to write (emptied first)")
    args = parser.parse_args(argv)
    try:
        problems = build(args.out)
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if problems:
        print("the student kit is NOT ready: it holds instructor material:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"student kit in {args.out}: lectures, helpers and the released assignments; no solution, no hidden test, nothing sealed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
