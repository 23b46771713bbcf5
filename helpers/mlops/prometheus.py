"""A real Prometheus (Debian's package) on 127.0.0.1: started over the kit's rules, asked through its HTTP API.

The rules and scrape targets live in monitoring/ at the kit's root (``make monitor`` serves them as they are).
``start_prometheus`` runs the same rules for a demonstration with every duration divided by ``speed-up``
(a 2-minute ``for`` becomes 10 s at 12x), scraping the given targets every second.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from helpers.core.paths import build_dir, kit_root
from helpers.core.report import Report, column

MONITORING = (kit_root() or Path.cwd()) / "monitoring"
RULES = MONITORING / "rules.yml"
MISSING = ("Prometheus is not installed: `sudo apt install prometheus` (Debian/Ubuntu; it brings promtool too), "
           "or run `make monitor` as root, which installs it")
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def tool(name: str = "prometheus") -> str:
    """The absolute path of ``prometheus`` or ``promtool`` on PATH; a clear error when the package is missing."""
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(MISSING)
    return found


def prometheus_missing() -> str | None:
    """None where Prometheus and promtool can run here, else what to do about it (for a section that skips without them)."""
    try:
        tool("prometheus"), tool("promtool")
    except FileNotFoundError as err:
        return str(err)
    return None


def _seconds(text: str) -> float:
    return sum(float(n) * UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text))


def _duration(seconds: float) -> str:
    return f"{max(round(seconds), 1)}s"


def sped_up_rules(text: str, speed_up: float, shortest_window: float = 5.0) -> str:
    """``text`` (a rules file) with every range window ``[..]`` and every ``for:`` divided by ``speed_up``.

    Windows stay at least ``shortest_window`` seconds: a rate needs a few scrapes inside its window.
    """
    text = re.sub(r"\[(\d+(?:ms|s|m|h|d))\]",
                  lambda m: f"[{_duration(max(_seconds(m.group(1)) / speed_up, shortest_window))}]", text)
    return re.sub(r"(\bfor:\s*)(\S+)", lambda m: m.group(1) + _duration(_seconds(m.group(2)) / speed_up), text)


def check_rules(path: Path = RULES) -> str:
    """``promtool check rules``: its report, or an error that shows it."""
    done = subprocess.run([tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    if done.returncode:
        raise ValueError(f"promtool rejected {path}:\n{done.stdout}{done.stderr}")
    return done.stdout.strip()


class Prometheus:
    """A Prometheus server (a ``ServedProcess``) and the parts of its HTTP API a lecture reads."""

    def __init__(self, targets: dict[str, list[str]], speed_up: float = 12.0, scrape_interval: str = "1s",
                 rules: Path = RULES, port: int | None = None):
        from helpers.core.procs import ServedProcess, free_port

        self.folder = Path(tempfile.mkdtemp(prefix="edl-prometheus-", dir=build_dir("prometheus")))
        (self.folder / "rules.yml").write_text(sped_up_rules(Path(rules).read_text(), speed_up))
        check_rules(self.folder / "rules.yml")
        config = {"global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
                  "rule_files": ["rules.yml"],
                  "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [t.split("//")[-1] for t in urls],
                                                                           "labels": {"service": job}}]}
                                     for job, urls in targets.items()]}
        (self.folder / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        port = port or free_port()
        self.server = ServedProcess(
            [tool(), f"--config.file={self.folder / 'prometheus.yml'}", f"--storage.tsdb.path={self.folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            port, health_path="/-/ready", log_path=self.folder / "prometheus.log", startup_timeout=60)
        self.url = self.server.url

    def query(self, expr: str) -> list[dict]:
        """An instant query: [{'metric': {...}, 'value': float}, ...]."""
        answer = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10).json()
        if answer.get("status") != "success":
            raise ValueError(f"Prometheus refused {expr!r}: {answer.get('error')}")
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in answer["data"]["result"]]

    def value(self, expr: str, default: float = float("nan")) -> float:
        found = self.query(expr)
        return found[0]["value"] if found else default

    def alerts(self) -> dict[str, str]:
        """{alert name: 'pending' or 'firing'} from /api/v1/alerts (one entry per name, firing wins)."""
        answer = httpx.get(self.url + "/api/v1/alerts", timeout=10).json()
        states: dict[str, str] = {}
        for alert in answer["data"]["alerts"]:
            name = alert["labels"]["alertname"]
            states[name] = "firing" if "firing" in (alert["state"], states.get(name)) else alert["state"]
        return states

    def stop(self) -> None:
        self.server.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class AlertTiming:
    alert: str = column("alert")
    pending: float = column("pending after (s)", ".1f")
    firing: float = column("firing after (s)", ".1f")


class AlertTimeline(Report):
    title = "Alerts through Prometheus's API, from the moment the fault was injected"


def watch_alerts(prometheus: Prometheus, names: list[str], since: float, timeout: float = 60.0,
                 every: float = 0.5) -> AlertTimeline:
    """Poll /api/v1/alerts until every alert of ``names`` fires (or ``timeout``); when each went pending, then firing."""
    pending: dict[str, float] = {}
    firing: dict[str, float] = {}
    while time.monotonic() - since < timeout and len(firing) < len(names):
        for name, state in prometheus.alerts().items():
            if name in names:
                pending.setdefault(name, time.monotonic() - since)
                if state == "firing":
                    firing.setdefault(name, time.monotonic() - since)
        time.sleep(every)
    rows = [AlertTiming(n, pending.get(n, float("nan")), firing.get(n, float("nan"))) for n in names]
    missing = [n for n in names if n not in firing]
    notes = [f"not firing within {timeout:.0f} s: {missing}" if missing else "every alert went pending, then firing."]
    return AlertTimeline(rows, notes)


def main() -> None:
    """``make monitor``: Prometheus over monitoring/ (targets/*.yml, rules.yml) on 127.0.0.1 until Ctrl-C."""
    import argparse
    import os

    parser = argparse.ArgumentParser(prog="python -m helpers.mlops.prometheus", description=main.__doc__)
    parser.add_argument("--port", type=int, default=9090)
    args = parser.parse_args()
    try:
        binary = tool()
        print(check_rules(), flush=True)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None
    targets = sorted(p.name for p in (MONITORING / "targets").glob("*.yml"))
    print(f"Prometheus on http://127.0.0.1:{args.port} (alerts: /alerts), scraping {targets} from {MONITORING}/targets; "
          "start `make serve` in another terminal. Ctrl-C stops it.", flush=True)
    os.execv(binary, [binary, f"--config.file={MONITORING / 'prometheus.yml'}", f"--storage.tsdb.path={build_dir('prometheus', 'data')}",
                      f"--web.listen-address=127.0.0.1:{args.port}"])


if __name__ == "__main__":
    main()
