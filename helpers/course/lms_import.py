"""Collect an LMS download (a zip) into ``submitted/<student>/<assignment>/``: bounded, per student, atomic.

The zip holds ``<student_id>_<notebook>.ipynb`` files (flat form) or ``<student_id>/<notebook>.ipynb``
(folder form); the pattern is ``FileNameCollectorPlugin.named_regexp`` of ``nbgrader_config.py``, and the
student id it finds must be the entry's own first part, so a file lands only in its owner's folder.

* **Bounded before it is read**: the archive's size, its number of entries, each entry's size and the
  expansion ratio are checked from the zip's directory before anything is extracted, and counted again while
  streaming (a directory that lies stops the import). Memory stays at one 1 MiB chunk; disk at the limits.
* **Nothing but regular files**: link, device and FIFO entries, absolute paths and ``..`` are refused.
* **Ids**: intake.check_student_id (a stated alphabet, NFKC-normalised, look-alikes of roster ids refused).
* **Per student and atomic**: a student with two entries for one notebook, or both forms, is reported and
  not imported, and the others are; each student's files are written to a staging folder inside
  ``submitted/`` with mode 0644 and moved into place at the end (the previous week's submission of that
  assignment is replaced whole). An archive refused as a whole leaves nothing behind.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from helpers.course.intake import Refused, check_student_id, safe_text

MAX_ARCHIVE_BYTES = 2 * 2**30
MAX_ENTRIES = 20_000
MAX_ENTRY_BYTES = 50 * 2**20  # one notebook: the autograder's limit for a whole submission
MAX_TOTAL_BYTES = 4 * 2**30
MAX_RATIO = 100  # uncompressed / compressed, for entries over 1 MiB
CHUNK = 2**20
NOTEBOOK = re.compile(r"^part\d+_[A-Za-z0-9_.-]*\.ipynb$")
DEFAULT_PATTERN = r".*[/\\](?P<student_id>[^/\\]+?)[_/\\](?P<file_id>part\d+_[^/\\]*\.ipynb)$"


@dataclass
class ImportReport:
    imported: dict[str, list[str]] = field(default_factory=dict)  # student -> notebook names
    refused: dict[str, str] = field(default_factory=dict)  # student (as written in the zip, made safe) -> reason
    skipped: list[str] = field(default_factory=list)  # entries that are not submissions, with the reason

    def lines(self) -> list[str]:
        out = [f"imported {s}: {', '.join(names)}" for s, names in sorted(self.imported.items())]
        out += [f"REFUSED {s}: {reason} (nothing of this student imported)" for s, reason in sorted(self.refused.items())]
        out += [f"skipped {line}" for line in self.skipped]
        return [safe_text(line) for line in out]


def _pattern(course_root: Path) -> re.Pattern:
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(course_root)).load_config()
    return re.compile(config.FileNameCollectorPlugin.get("named_regexp", DEFAULT_PATTERN) or DEFAULT_PATTERN)


def _owner(name: str, pattern: re.Pattern) -> tuple[str, str, str]:
    """(raw student id, notebook name, form) of one entry, or Refused with the reason."""
    path = PurePosixPath(name)
    if name.startswith("/") or "\\" in name or any(part in ("", ".", "..") for part in name.split("/")):
        raise Refused("an absolute path, a '..' or a backslash in its name")
    match = pattern.match("/" + name)
    if not match:
        raise Refused("its name is not <student>_<notebook>.ipynb or <student>/<notebook>.ipynb")
    student, notebook = match.group("student_id"), match.group("file_id")
    if len(path.parts) == 1 and path.name == f"{student}_{notebook}":
        form = "flat"
    elif len(path.parts) == 2 and path.parts[0] == student and path.name == notebook:
        form = "folder"
    else:
        raise Refused(f"the id it names ({student!r}) is not the entry's own first part: a file lands only in its owner's folder")
    if not NOTEBOOK.match(notebook):
        raise Refused(f"{notebook!r} is not a notebook name partN_<name>.ipynb")
    return student, notebook, form


def _check_directory(archive: zipfile.ZipFile, size: int) -> None:
    entries = archive.infolist()
    if len(entries) > MAX_ENTRIES:
        raise Refused(f"the archive has {len(entries)} entries, more than {MAX_ENTRIES}")
    total = sum(e.file_size for e in entries)
    if total > MAX_TOTAL_BYTES:
        raise Refused(f"the archive would expand to {total / 2**30:.1f} GiB, more than {MAX_TOTAL_BYTES / 2**30:g} GiB")
    for entry in entries:
        if entry.file_size > CHUNK and entry.file_size > MAX_RATIO * max(entry.compress_size, 1):
            raise Refused(f"entry {safe_text(entry.filename)!r} expands {entry.file_size / max(entry.compress_size, 1):.0f}x "
                          f"(more than {MAX_RATIO}x: a zip bomb?)")


def import_archive(course_root: Path, archive: Path, assignment_id: str, roster: list[str]) -> ImportReport:
    """Import ``archive`` into ``<course_root>/submitted/``; Refused (and nothing written) when the whole archive is refused."""
    info = os.lstat(archive)
    if not stat.S_ISREG(info.st_mode):
        raise Refused(f"{archive} is not a regular file")
    if info.st_size > MAX_ARCHIVE_BYTES:
        raise Refused(f"{archive} holds {info.st_size / 2**30:.1f} GiB, more than {MAX_ARCHIVE_BYTES / 2**30:g} GiB: split the download")
    pattern = _pattern(course_root)
    report = ImportReport()
    submitted = course_root / "submitted"
    submitted.mkdir(parents=True, exist_ok=True)
    if submitted.is_symlink():
        raise Refused(f"{submitted} is a link: the course's submitted/ must be a real folder")
    try:
        zipped = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as err:
        raise Refused(f"{archive.name} is not a readable zip ({err})") from None
    with zipped:
        _check_directory(zipped, info.st_size)
        plan: dict[str, dict[str, zipfile.ZipInfo]] = {}
        forms: dict[str, set[str]] = {}
        for entry in zipped.infolist():
            if entry.is_dir():
                continue
            mode = entry.external_attr >> 16
            try:
                if stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # no type bits (zips made on Windows, writestr): a file
                    raise Refused("it is a link, device or FIFO, not a regular file")
                raw, notebook, form = _owner(entry.filename, pattern)
            except Refused as err:
                report.skipped.append(f"{entry.filename}: {err}")
                continue
            try:
                student = check_student_id(raw, roster)
            except Refused as err:
                report.refused[safe_text(raw)] = str(err)
                continue
            if entry.file_size > MAX_ENTRY_BYTES:
                report.refused[student] = f"{notebook} holds {entry.file_size / 2**20:.0f} MiB, more than {MAX_ENTRY_BYTES / 2**20:g} MiB"
            forms.setdefault(student, set()).add(form)
            if notebook in plan.setdefault(student, {}):
                report.refused[student] = f"two entries for {notebook} ({plan[student][notebook].filename!r} and {entry.filename!r})"
            plan[student][notebook] = entry
        for student, used in forms.items():
            if len(used) > 1:
                report.refused[student] = "both forms, <student>_<notebook>.ipynb and <student>/<notebook>.ipynb: hand in one"
        staging = Path(tempfile.mkdtemp(prefix=".incoming-", dir=submitted))
        try:
            for student, files in sorted(plan.items()):
                if student in report.refused:
                    continue
                folder = staging / student / assignment_id
                folder.mkdir(parents=True)
                for notebook, entry in sorted(files.items()):
                    _extract(zipped, entry, folder / notebook)
            for student in sorted(plan):
                if student in report.refused:
                    continue
                try:
                    _move_into_place(staging / student / assignment_id, submitted / student, assignment_id)
                except (Refused, OSError) as err:
                    report.refused[student] = str(err)
                    continue
                report.imported[student] = sorted(plan[student])
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return report


def _extract(zipped: zipfile.ZipFile, entry: zipfile.ZipInfo, target: Path) -> None:
    """Stream one entry to ``target`` (mode 0644), stopping at the size its directory declared."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    written = 0
    try:
        with zipped.open(entry) as source:
            while chunk := source.read(CHUNK):
                written += len(chunk)
                if written > min(entry.file_size, MAX_ENTRY_BYTES):
                    raise Refused(f"entry {safe_text(entry.filename)!r} is larger than the archive's directory says: the archive is refused")
                os.write(fd, chunk)
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)


def _move_into_place(new: Path, student_folder: Path, assignment_id: str) -> None:
    """Replace ``<student_folder>/<assignment_id>`` with ``new`` (renames within submitted/; the old copy removed after)."""
    if student_folder.is_symlink() or (student_folder.exists() and not student_folder.is_dir()):
        raise Refused(f"{student_folder} is not a folder")
    student_folder.mkdir(mode=0o755, exist_ok=True)
    target = student_folder / assignment_id
    old = None
    if target.exists() or target.is_symlink():
        old = new.parent / (assignment_id + ".previous")
        os.rename(target, old)
    os.rename(new, target)
    if old is not None:
        if old.is_symlink() or not old.is_dir():
            old.unlink()
        else:
            shutil.rmtree(old)
