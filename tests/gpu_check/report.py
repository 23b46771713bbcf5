"""The GPU check's verdict (``failures``) and its table (``markdown``), both read off the report's JSON."""
from __future__ import annotations

LECTURE_OK = {"ok", "left behind"}


def _lecture_problem(row: dict) -> str | None:
    if row["status"] not in LECTURE_OK:
        first = (row.get("error") or "").strip().splitlines()[:1]
        return f"lecture {row['notebook']}: {row['status']}" + (f" ({first[0][:200]})" if first else "")
    if row.get("figures_check") not in (None, "ok"):
        return f"lecture {row['notebook']}: {row['figures_check'][:300]}"
    if row.get("processes"):
        return f"lecture {row['notebook']}: {row['processes'][:300]}"
    return None


def failures(report: dict) -> list[str]:
    """Every failure in the report, one line each; an empty list is a passed check."""
    found = []
    install = report.get("install") or {}
    if install and not install.get("ok"):
        found.append(f"installing the wheels failed: {install.get('error')}")
    found += filter(None, map(_lecture_problem, report["lectures"]))
    found += [f"lesson {r['lecture']}: {r['lesson']}: measured {r['measured']}, required {r['required']}"
              for r in report["lessons"] if r["status"] == "fail"]
    found += [f"test {r['test']}: {r['outcome']}" for r in report["tests"] if r["outcome"] in ("failed", "error")]
    found += [f"bench {r['bench']}: {r['target']}: {r['status']} (measured {r['measured']}, required {r['required']})"
              for r in report["bench"] if r["status"] in ("fail", "crashed")]
    found += [f"memory {r['model']}: {r['status']} ({r.get('error')})" for r in report["memory"] if r["status"] not in ("pass", "probe")]
    return found


def _figure(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_figure(v).replace("|", "/").replace("\n", " ") for v in row) + " |" for row in rows]
    return lines + [""]


def _test_counts(tests: list[dict]) -> str:
    counts: dict[str, int] = {}
    for r in tests:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "none ran"


def markdown(report: dict) -> str:
    """The report as one Markdown document: environment, then a table per part, then the failures."""
    env = report.get("environment") or {}
    install = report.get("install") or {}
    lines = ["# GPU check", "",
             f"{env.get('device', '?')}, driver {env.get('driver') or '-'}, torch {env.get('torch', '?')} (CUDA {env.get('cuda') or '-'}), "
             f"Python {env.get('python', '?')}, {env.get('cpu_cores', '?')} cores; {install.get('wheels', 0)} wheels "
             f"({install.get('mib', 0)} MiB) installed; {report.get('seconds', 0):.0f} s in all, started {report.get('started')}.", "",
             f"SmolLM2's wheel: {install.get('model') or '-'}.", ""]
    if report.get("parts"):
        lines += _table(["part", "seconds"], [[name, seconds] for name, seconds in report["parts"].items()])
    lines += ["## Lectures", ""] + _table(
        ["lecture", "profile", "status", "seconds", "figures", "note"],
        [[r["notebook"], r["profile"], r["status"], r["seconds"], r.get("figures_check") or "-",
          (_lecture_problem(r) or r.get("error") or "")[:160]] for r in report["lectures"]])
    lines += ["## GPU lessons", ""] + _table(["lesson", "lecture", "measured", "required", "status", "what the lecture says"],
                                             [[r["lesson"], r["lecture"], r["measured"], r["required"], r["status"], r.get("statement") or ""]
                                              for r in report["lessons"]])
    lines += ["## Tests", "", _test_counts(report["tests"]), ""] + _table(
        ["test", "outcome", "seconds", "message"],
        [[r["test"], r["outcome"], r["seconds"], (r.get("message") or "").strip()[:200]] for r in report["tests"] if r["outcome"] != "passed"])
    lines += ["## Benchmarks", ""] + _table(["bench", "target", "measured", "required", "status"],
                                            [[r["bench"], r["target"], r["measured"], r["required"], r["status"]] for r in report["bench"]])
    lines += [f"Not benched: {name} ({why})." for name, why in (report.get("not_benched") or {}).items()] + [""]
    lines += ["## Memory estimate against the allocator", ""] + _table(
        ["model", "batch", "optimizer", "AMP", "estimate MiB", "measured MiB", "error", "status"],
        [[r["model"], r.get("batch"), r.get("optimizer"), r.get("amp"), _mib(r.get("estimate_bytes")), _mib(r.get("measured_bytes")),
          f"{r['error']:+.1%}" if isinstance(r.get("error"), float) else (r.get("error") or "-")[:120], r["status"]] for r in report["memory"]])
    problems = report.get("failures") or []
    lines += ["## Verdict", "", "passed: no failure" if not problems else f"{len(problems)} failure(s):", ""]
    lines += [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"


def _mib(value) -> float | None:
    return round(value / 2**20, 1) if value else None
