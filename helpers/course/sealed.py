"""The instructor material: sealed with git-crypt in the repository, and what may be done without it.

The files ``.gitattributes`` marks ``filter=git-crypt`` (the assignments' sources, the tests that build honest and
cheating submissions) are stored encrypted under the kit's instructor key. A clone without the key holds them as
ciphertext: ``locked()`` says so, the grading commands refuse with ``MESSAGE``, and the tests that need them skip
with it. ``answer_regions`` and ``leaks`` find solution or hidden-test code in files that are not sealed.
How the key is obtained and used: README, "For instructors".
"""
from __future__ import annotations

import json
import subprocess
from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from helpers.core.paths import kit_root

MESSAGE = "instructor material is sealed: make unlock KEY=<the instructor key file>"
HEADER = b"\x00GITCRYPT\x00"  # how every file git-crypt encrypted begins
MARKERS = {"solution": ("### BEGIN SOLUTION", "### END SOLUTION"), "hidden tests": ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")}
DISTINCTIVE_LENGTH = 16  # a line shorter than this (``return x``, ``else:``) says nothing about whose answer it is
COMMON_IN = 4  # a line found in this many plain files is the kit's idiom, not an answer's
SMALLEST_REGION = 4  # regions with fewer distinctive lines than this are too small to tell a copy from a coincidence


def root() -> Path:
    return kit_root() or Path.cwd()


def is_ciphertext(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(len(HEADER)) == HEADER
    except OSError:
        return False


def sealed_patterns(checkout: Path | None = None) -> list[str]:
    """The path patterns ``.gitattributes`` seals with git-crypt."""
    attributes = (checkout or root()) / ".gitattributes"
    if not attributes.exists():
        return []
    return [line.split()[0] for line in attributes.read_text().splitlines()
            if line.strip() and not line.startswith("#") and "filter=git-crypt" in line.split()[1:]]


def is_sealed_path(relative: str, patterns: list[str]) -> bool:
    return any(fnmatch(relative, pattern) or (pattern.endswith("/**") and relative.startswith(pattern[:-2])) for pattern in patterns)


def locked(source: Path | None = None) -> bool:
    """True when a course's sources (default: the kit's assignments/source) are ciphertext: cloned without the key."""
    source = source or root() / "assignments" / "source"
    return source.exists() and any(is_ciphertext(p) for p in source.rglob("*") if p.is_file())


# ---------------------------------------------------------------- answers outside the sealed files


@dataclass(frozen=True)
class Region:
    where: str  # file, and cell for a notebook
    kind: str  # "solution" or "hidden tests"
    lines: tuple[str, ...]  # normalised (whitespace collapsed), in order


def _normalised(line: str) -> str:
    return " ".join(line.split())


def _code_of(path: Path) -> list[tuple[str, str]]:
    """(where, text) of a notebook's code cells, or of a whole text file."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text()).get("cells", [])
        return [(f"{path.name} cell {i}", "".join(c["source"]) if isinstance(c["source"], list) else c["source"])
                for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    return [(path.name, path.read_text())]


def answer_regions(sources: Path) -> list[Region]:
    """Every solution and hidden-test region of the notebooks and .py files under ``sources`` (unlocked)."""
    found = []
    for path in sorted(p for p in sources.rglob("*") if p.suffix in (".ipynb", ".py")):
        for where, text in _code_of(path):
            for kind, (begin, end) in MARKERS.items():
                current = None
                for line in text.splitlines():
                    if begin in line:
                        current = []
                    elif end in line and current is not None:
                        found.append(Region(f"{path.relative_to(sources)}: {where}", kind, tuple(current)))
                        current = None
                    elif current is not None:
                        current.append(_normalised(line))
    return found


@dataclass(frozen=True)
class Leak:
    file: str
    region: Region
    share: float  # of the region's distinctive lines that the file holds


def leaks(regions: list[Region], files: dict[str, str], threshold: float = 0.5) -> list[Leak]:
    """Files (name -> text) that hold ``threshold`` or more of a region's distinctive lines: lines long enough to be an
    answer's, not comments, and not an idiom many of the files share."""
    lines_of = {name: {_normalised(line) for line in text.splitlines()} for name, text in files.items()}
    common = Counter(line for lines in lines_of.values() for line in lines)
    found = []
    for region in regions:
        distinctive = {line for line in region.lines if len(line) >= DISTINCTIVE_LENGTH and not line.startswith("#") and common[line] < COMMON_IN}
        if len(distinctive) < SMALLEST_REGION:
            continue
        for name, lines in lines_of.items():
            share = len(distinctive & lines) / len(distinctive)
            if share >= threshold:
                found.append(Leak(name, region, share))
    return found


def plain_tracked_files(checkout: Path | None = None) -> dict[str, str]:
    """Every tracked text file that is not sealed: relative path -> its text (notebooks: their code cells)."""
    checkout = checkout or root()
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=checkout, capture_output=True, text=True, check=True).stdout.split("\0")
    patterns = sealed_patterns(checkout)
    files = {}
    for relative in filter(None, listed):
        path = checkout / relative
        if is_sealed_path(relative, patterns) or not path.is_file():
            continue
        try:
            files[relative] = "\n".join(text for _, text in _code_of(path)) if path.suffix == ".ipynb" else path.read_text()
        except (UnicodeDecodeError, ValueError):
            continue  # binary files hold no code to copy
    return files


def lint_excludes(checkout: Path | None = None) -> list[str]:
    """ruff's arguments that leave the sealed files out where they are ciphertext (a clone without the key)."""
    checkout = checkout or root()
    return ["--extend-exclude", ",".join(sealed_patterns(checkout))] if locked(checkout / "assignments" / "source") else []


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--lint-excludes"]:
        raise SystemExit("usage: python -m helpers.course.sealed --lint-excludes (what ruff must skip on a locked checkout)")
    print(" ".join(lint_excludes()))
