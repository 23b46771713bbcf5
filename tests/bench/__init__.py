"""Benchmarks behind ``make bench``.

Each ``bench_<name>.py`` module defines ``run(quick: bool) -> BenchResult``: a
report (printed as a table, saved as JSON) and the targets it checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from helpers.core.report import Report, column


@dataclass
class Target:
    """One checked figure: what it is, what was measured, what is required, and the verdict."""

    what: str = column("target")
    measured: float | None = column("measured", ".4g")
    required: str = column("required")
    status: str = column("status")  # "pass", "fail", or "n/a" (cannot be measured on this machine)

    @classmethod
    def at_least(cls, what: str, measured: float | None, minimum: float, unit: str = "") -> "Target":
        if measured is None:
            return cls(what, None, f">= {minimum:g}{unit}", "n/a")
        return cls(what, measured, f">= {minimum:g}{unit}", "pass" if measured >= minimum else "fail")

    @classmethod
    def at_most(cls, what: str, measured: float | None, maximum: float, unit: str = "") -> "Target":
        if measured is None:
            return cls(what, None, f"<= {maximum:g}{unit}", "n/a")
        return cls(what, measured, f"<= {maximum:g}{unit}", "pass" if measured <= maximum else "fail")

    @classmethod
    def not_here(cls, what: str, required: str, why: str) -> "Target":
        return cls(f"{what} ({why})", None, required, "n/a")


def full_runs_only(targets: list[Target], quick: bool) -> list[Target]:
    """Timing targets are checked on full runs only: a quick run (the test suite's) times small problems, often on a
    busy machine, so there they read n/a (a target already n/a keeps its own reason)."""
    return [Target.not_here(t.what, t.required, "quick run") if quick and t.status != "n/a" else t for t in targets]


class TargetTable(Report):
    """A benchmark's targets as a table."""

    def __init__(self, targets: list[Target], name: str):
        self.title = f"{name}: targets"
        super().__init__(targets)


@dataclass
class BenchResult:
    name: str
    reports: list[Report]
    targets: list[Target] = field(default_factory=list)
