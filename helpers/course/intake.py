"""What the grader accepts from students: regular files only, bounded before they are read, and safe text.

A submission folder is looked at with ``lstat`` only: a symbolic link, a FIFO, a device, a socket, or a
student or assignment folder that is itself a link is refused with a reason, never followed, opened or
copied. Sizes and entry counts are added up from that listing before a byte is read, and every read opens
the file with ``O_NOFOLLOW | O_NONBLOCK`` and checks it is still the regular file that was listed (a file
swapped for a FIFO or a link after the listing is refused too, and never blocks the grader).

``safe_text`` is the one place where text that came from a student (ids, file names, error messages) is
made safe for a CSV cell or a console line: no control characters, no bidirectional overrides, no line
breaks, and no leading ``= + - @`` (which spreadsheets read as a formula).
"""
from __future__ import annotations

import os
import stat
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

MAX_ENTRIES = 200  # files and folders in one submission
MAX_DEPTH = 4


class Refused(Exception):
    """A submission or a file in it that the grader will not read; the message says why."""


@dataclass
class Listing:
    """A submission folder as listed without following anything: its regular files and its total size."""

    folder: Path
    files: dict[str, int] = field(default_factory=dict)  # path relative to the folder -> size in bytes
    problems: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(self.files.values())

    def top_level(self) -> list[str]:
        return sorted(name for name in self.files if "/" not in name)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def list_submission(folder: Path, course_root: Path | None = None, limit_bytes: int | None = None) -> Listing:
    """Every entry of ``folder`` (recursively, links never followed); refusals are collected in ``problems``.

    The folder itself and its parent (the student's folder) must be real folders, not links; with
    ``course_root``, the folder must also sit where it is named (``submitted/<student>/<assignment>``).
    """
    listing = Listing(folder)
    for level, path in (("the student's folder", folder.parent), ("the assignment folder", folder)):
        try:
            mode = os.lstat(path).st_mode
        except OSError as err:
            listing.problems.append(f"{level} {path.name!r} cannot be read ({err.strerror})")
            return listing
        if not stat.S_ISDIR(mode):
            listing.problems.append(f"{level} {safe_text(path.name)!r} is {_kind(mode)}, not a folder: links are never followed")
            return listing
    if course_root is not None and os.path.realpath(folder) != os.path.join(os.path.realpath(course_root), "submitted", folder.parent.name, folder.name):
        listing.problems.append("the submission folder is not inside submitted/<student>/<assignment>/")
        return listing
    entries = 0
    pending = [(folder, 0)]
    while pending:
        current, depth = pending.pop()
        with os.scandir(current) as it:
            for entry in it:
                entries += 1
                relative = os.path.relpath(entry.path, folder)
                if entries > MAX_ENTRIES:
                    listing.problems.append(f"more than {MAX_ENTRIES} files and folders: hand in the notebooks and the files they need only")
                    return listing
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    if depth + 1 >= MAX_DEPTH:
                        listing.problems.append(f"{safe_text(relative)!r}: folders nested deeper than {MAX_DEPTH} levels")
                        return listing
                    pending.append((Path(entry.path), depth + 1))
                elif stat.S_ISREG(mode):
                    listing.files[relative] = entry.stat(follow_symlinks=False).st_size
                    if limit_bytes is not None and listing.size > limit_bytes:
                        listing.problems.append(f"the submission holds more than {limit_bytes / 2**20:g} MiB, the limit for one submission: "
                                                "ask for a smaller one")
                        return listing
                else:
                    listing.problems.append(f"{safe_text(relative)!r} is {_kind(mode)}: a submission holds regular files only "
                                            "(links are never followed)")
    return listing


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; a link, FIFO or device raises Refused, never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        raise Refused(f"{safe_text(path.name)!r} cannot be opened as a regular file ({err.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{safe_text(path.name)!r} is {_kind(info.st_mode)}: a submission holds regular files only")
        if info.st_size > limit:
            raise Refused(f"{safe_text(path.name)!r} holds {info.st_size / 2**20:.1f} MiB, over the {limit / 2**20:g} MiB limit")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise Refused(f"{safe_text(path.name)!r} grew past the {limit / 2**20:g} MiB limit while it was read")
        return data
    finally:
        os.close(fd)


# ---------------------------------------------------------------- text that came from a student


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_INVISIBLE = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}  # controls, format characters (bidi overrides, zero widths), separators


def safe_text(text: object, limit: int = 4000) -> str:
    """``text`` fit for one CSV cell or one console line: control and bidi characters shown as \\uXXXX, no formula start."""
    out = []
    for char in str(text)[:limit]:
        if char in "\n\r\t":
            out.append(" ")
        elif unicodedata.category(char) in _INVISIBLE:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    cleaned = "".join(out)
    return "'" + cleaned if cleaned.startswith(_FORMULA_START) else cleaned


# ---------------------------------------------------------------- student ids

ID_ALPHABET = "ASCII letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64 characters"
_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
# Letters of other scripts that look like Latin ones (Cyrillic, Greek): a skeleton maps each to its look-alike.
_CONFUSABLES = str.maketrans({
    "а": "a", "в": "b", "с": "c", "е": "e", "һ": "h", "і": "i", "ј": "j", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p",
    "ѕ": "s", "т": "t", "у": "y", "х": "x", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ɡ": "g", "ı": "i", "ℓ": "l",
    "А": "A", "В": "B", "С": "C", "Е": "E", "Н": "H", "І": "I", "Ј": "J", "К": "K", "М": "M", "О": "O", "Р": "P", "Ѕ": "S",
    "Т": "T", "Х": "X", "У": "Y", "α": "a", "ο": "o", "ρ": "p", "ν": "v", "τ": "t", "ι": "i", "κ": "k", "Α": "A", "Β": "B",
    "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O", "Ρ": "P", "Τ": "T", "Χ": "X", "Υ": "Y",
})


def skeleton(text: str) -> str:
    """What an id looks like: NFKC, look-alike letters of other scripts mapped to Latin, case folded, 0/1 read as o/l."""
    return unicodedata.normalize("NFKC", text).translate(_CONFUSABLES).casefold().replace("0", "o").replace("1", "l")


def check_student_id(raw: str, roster: list[str] | set[str] = ()) -> str:
    """The NFKC-normalised id, or Refused with the reason: outside the alphabet, or a look-alike of another roster id."""
    student_id = unicodedata.normalize("NFKC", raw)
    if student_id not in roster:
        twins = [r for r in roster if skeleton(r) == skeleton(raw)]
        if twins:
            raise Refused(f"student id {safe_text(raw)!r} looks like the roster's {safe_text(twins[0])!r} but is not it: check it by hand")
    if not student_id or len(student_id) > 64 or set(student_id) - _ID_CHARS or not student_id[0].isalnum():
        raise Refused(f"student id {safe_text(raw)!r} is not a valid id ({ID_ALPHABET})")
    return student_id
