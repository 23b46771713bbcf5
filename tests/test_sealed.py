"""The sealed instructor material: what a clone without the key holds, what refuses, and the kit handed to students."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.course import grading, sealed, student_kit

ROOT = Path(__file__).resolve().parents[1]


def test_every_sealed_pattern_covers_files_and_the_sources_are_among_them():
    patterns = sealed.sealed_patterns(ROOT)
    assert "assignments/source/**" in patterns
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for pattern in patterns:
        assert any(sealed.is_sealed_path(path, [pattern]) for path in tracked), f"{pattern} seals no tracked file"
    assert not sealed.is_sealed_path("helpers/mlops/monitoring.py", patterns) and not sealed.is_sealed_path(".gitattributes", patterns)


def _ciphertext_copy(tmp_path: Path) -> Path:
    """A course whose sources are ciphertext, as a clone without the key has them."""
    course = tmp_path / "course"
    (course / "source" / "hw2_profiling").mkdir(parents=True)
    shutil.copy(ROOT / "assignments" / "nbgrader_config.py", course)
    (course / "source" / "hw2_profiling" / "part1.ipynb").write_bytes(sealed.HEADER + b"\x93\x1f encrypted bytes")
    return course


@pytest.mark.parametrize("command", ["release", "autograde", "feedback"])
def test_the_grading_commands_refuse_on_a_locked_course_in_one_line(tmp_path, capsys, command):
    course = _ciphertext_copy(tmp_path)
    assert sealed.locked(course / "source")
    assert grading.main(["--course", str(course), command]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and sealed.MESSAGE in error and f"make {command}" in error


def test_a_clone_without_the_key_holds_ciphertext_and_its_sealed_tests_skip_saying_so(tmp_path):
    """The committed tree, cloned without the key: sealed files are git-crypt ciphertext, and pytest collects a sealed
    test module as one skipped test with the reason."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    sources = [p for p in (clone / "assignments" / "source").rglob("*") if p.is_file()]
    assert sources and all(sealed.is_ciphertext(p) for p in sources)
    assert sealed.locked(clone / "assignments" / "source")
    assert not sealed.is_ciphertext(clone / "helpers" / "course" / "sealed.py")
    excludes = sealed.lint_excludes(clone)  # make test's ruff leaves the ciphertext out there, and lints it where unlocked
    assert excludes[0] == "--extend-exclude" and "assignments/source/**" in excludes[1]
    assert bool(sealed.lint_excludes(ROOT)) == sealed.locked(ROOT / "assignments" / "source")  # this checkout: as it is
    env = {k: v for k, v in os.environ.items() if k != "EDL_INSTRUCTOR_KEY"}  # this clone was not unlocked, whoever runs us
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/test_hw1_cheats.py", "tests/test_no_answers_in_kit.py",
                           "-p", "no:cacheprovider", "-q", "-rs"], cwd=clone, capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "skipped" in done.stdout and sealed.MESSAGE in done.stdout and "tests skipped: instructor material is sealed" in done.stdout


@pytest.mark.slow  # releases the four assignments with nbgrader
@pytest.mark.grading
@pytest.mark.instructor
def test_the_student_kit_holds_the_lectures_and_released_assignments_and_no_answer(tmp_path):
    kit = tmp_path / "kit"
    assert student_kit.build(kit) == []
    assert (kit / "lectures").is_dir() and (kit / "helpers" / "course" / "kit_use.py").exists()
    assert not (kit / "tests").exists() and not (kit / "assignments" / "source").exists()
    released = sorted(p.name for p in (kit / "assignments" / "release").iterdir())
    assert released == sorted(grading.WEIGHTS)
    regions = sealed.answer_regions(ROOT / "assignments" / "source")
    planted = kit / "lectures" / "planted.py"  # the check finds an answer copied into the kit
    planted.write_text("\n".join(next(r for r in regions if r.kind == "solution" and len(r.lines) > 8).lines))
    assert any("planted.py" in problem for problem in student_kit.check(kit, regions))
