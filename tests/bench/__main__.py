"""Run the benchmarks: print each table and its targets, write build/bench/<name>.json.

    python -m tests.bench [--only matmul] [--quick] [--out build/bench]

Exits non-zero when a target that could be measured here is missed.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import pkgutil
import sys
import time
import traceback
from pathlib import Path

import helpers  # noqa: F401  (quietens torch's import-time warnings)
from helpers.core.device import describe
from helpers.core.load import in_fresh_thread

from . import BenchResult, TargetTable


def discover() -> list[str]:
    """Names of the bench_<name>.py modules beside this file."""
    return sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="run only this benchmark (repeatable)")
    parser.add_argument("--quick", action="store_true", help="smaller problems (for smoke tests)")
    parser.add_argument("--out", default="build/bench", help="folder for the JSON results")
    args = parser.parse_args(argv)

    names = discover()
    unknown = set(args.only or []) - set(names)
    if unknown:
        parser.error(f"unknown benchmark(s) {sorted(unknown)}; choose from {names}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hardware = describe()
    print(hardware, end="\n\n")
    missed = []
    for name in args.only or names:
        start = time.perf_counter()
        try:
            module = importlib.import_module(f"tests.bench.bench_{name}")
            # each in a thread of its own: an OpenMP team the previous one left on the main thread would slow every
            # thread this one starts (in_fresh_thread says why)
            result: BenchResult = in_fresh_thread(lambda: module.run(quick=args.quick))
        except Exception:  # noqa: BLE001 - one benchmark that breaks is reported; the others still run
            error = traceback.format_exc()
            print(f"[{name}: crashed]\n{error}", file=sys.stderr)
            missed.append(f"{name}: crashed ({error.strip().splitlines()[-1]})")
            (out / f"{name}.json").write_text(json.dumps({"name": name, "quick": args.quick, "error": error, "targets": []}, indent=2))
            continue
        seconds = time.perf_counter() - start
        for report in result.reports:
            print(report, end="\n\n")
        if result.targets:
            print(TargetTable(result.targets, name), end="\n\n")
        missed += [f"{name}: {t.what}" for t in result.targets if t.status == "fail"]
        payload = {
            "name": name,
            "quick": args.quick,
            "seconds": seconds,
            "hardware": hardware.records(),
            "reports": [{"title": r.title, "rows": r.records(), "notes": r.notes} for r in result.reports],
            "targets": [dataclasses.asdict(t) for t in result.targets],
        }
        (out / f"{name}.json").write_text(json.dumps(payload, indent=2, default=str))
        print(f"[{name}: {seconds:.1f} s, wrote {out / (name + '.json')}]\n")
    if missed:
        print("missed targets:\n  " + "\n  ".join(missed), file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
