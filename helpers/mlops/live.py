"""What a served model exports for monitoring: input drift over a sliding window, and champion/challenger routing.

``InputDriftWindow`` keeps summary features of the latest inputs and, each time /metrics is read, compares
them with the training data's: the largest two-sample KS statistic over the features
(``input_drift_ks_statistic``) beside the critical value it must exceed for drift at the window's size
(``input_drift_ks_threshold``, Bonferroni over the features). An alert rule compares the two.

``AliasRouter`` is a model (an ``nn.Module``) that serves the registered model an MLflow alias names
(``champion``) and sends a share of the calls to the ``challenger`` alias. It re-reads the aliases in the
background, so moving an alias promotes or rolls back with no restart. ``python -m helpers.mlops.live``
serves it with the service of lecture 6.
"""
from __future__ import annotations

import math
import os
import random
import threading
import time
from collections import deque

import numpy as np
import torch
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from scipy import stats
from torch import nn

from helpers.mlops.monitoring import pixel_features

DRIFT_WINDOW = 500  # latest inputs compared with the training data
DRIFT_MIN_INPUTS = 100  # below this, the window is too small to say anything: no statistic is exported
DRIFT_ALPHA = 0.01  # false-alarm probability per evaluation, over all features (Bonferroni)


class InputDriftWindow:
    """Summary features of the latest ``window`` inputs; a Prometheus collector of their drift from ``reference``."""

    def __init__(self, registry: CollectorRegistry | None, reference: torch.Tensor | None = None,
                 window: int = DRIFT_WINDOW, alpha: float = DRIFT_ALPHA):
        self.window, self.alpha = window, alpha
        self._reference = None if reference is None else pixel_features(reference)
        self._recent: deque = deque(maxlen=window)
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def reference(self) -> np.ndarray:
        if self._reference is None:  # the training digits, loaded on first use (the service starts faster)
            from helpers.core import load_digits
            from helpers.serving import flat_pixels

            self._reference = pixel_features(flat_pixels(load_digits(train=True).sample(2000, seed=0).images))
        return self._reference

    def observe(self, pixels: torch.Tensor) -> None:
        """Add a request's inputs (N, 784) to the window (cheap: five numbers per image)."""
        rows = pixel_features(pixels.detach().reshape(len(pixels), -1).float())
        with self._lock:
            self._recent.extend(rows)

    def statistic(self) -> tuple[float, float, int]:
        """(largest KS statistic over the features, its critical value at this window size, inputs in the window)."""
        with self._lock:
            current = np.array(self._recent)
        if len(current) < DRIFT_MIN_INPUTS:
            return math.nan, math.nan, len(current)
        reference = self.reference()
        largest = max(stats.ks_2samp(reference[:, i], current[:, i]).statistic for i in range(current.shape[1]))
        n, m = len(reference), len(current)
        per_feature = self.alpha / current.shape[1]
        critical = math.sqrt(-math.log(per_feature / 2) / 2) * math.sqrt((n + m) / (n * m))  # asymptotic KS bound
        return float(largest), critical, len(current)

    def collect(self):
        largest, critical, size = self.statistic()
        for name, value, text in (
            ("input_drift_ks_statistic", largest, "Largest two-sample KS statistic of the input features, latest window against training data."),
            ("input_drift_ks_threshold", critical, f"KS statistic above which the window drifted (alpha {self.alpha:g} over all features)."),
            ("input_drift_window_inputs", size, "Inputs in the drift window."),
        ):
            if not math.isnan(value):
                yield GaugeMetricFamily(name, text, value=value)

    def describe(self):
        return []  # computed when read: nothing to describe at registration


def watch_inputs(registry: CollectorRegistry) -> InputDriftWindow:
    """The drift window a service feeds with each request's pixels, exported through ``registry``."""
    return InputDriftWindow(registry)


class Slowed(nn.Module):
    """``model`` with ``delay`` seconds added to every call: a regression to deploy in a demonstration."""

    def __init__(self, model: nn.Module, delay: float):
        super().__init__()
        self.model, self.delay = model, delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)
        return self.model(x)


class AliasRouter(nn.Module):
    """Serves ``models:/<name>@champion``, and ``@challenger`` for a ``share`` of calls; re-reads the aliases every ``refresh`` s."""

    def __init__(self, tracking_uri: str, name: str, registry: CollectorRegistry, share: float = 0.2, refresh: float = 2.0):
        super().__init__()
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        import mlflow.pytorch

        self._mlflow, self.uri, self.name, self.share = mlflow, tracking_uri, name, share
        self.client = mlflow.MlflowClient(tracking_uri)
        self.served: dict[str, tuple[str, nn.Module]] = {}  # alias -> (version, model)
        self.calls = Counter("model_predictions", "Inputs predicted, by alias and registered version.", ["variant", "version"], registry=registry)
        self.seconds = Histogram("model_call_seconds", "Time of one model call, by alias.", ["variant"], registry=registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))
        self.reload()
        if "champion" not in self.served:
            raise ValueError(f"no version of {name!r} carries the alias 'champion' in {tracking_uri}: register one first")
        self._stop = threading.Event()
        threading.Thread(target=self._watch, args=(refresh,), daemon=True, name="alias-watch").start()

    def reload(self) -> None:
        """Load the versions the aliases name now, where they changed; an alias removed stops being served."""
        from mlflow.exceptions import MlflowException

        served = dict(self.served)
        for alias in ("champion", "challenger"):
            try:
                version = self.client.get_model_version_by_alias(self.name, alias).version
            except MlflowException:
                served.pop(alias, None)
                continue
            if served.get(alias, ("",))[0] != version:
                model = self._mlflow.pytorch.load_model(f"models:/{self.name}/{version}").eval()
                served[alias] = (version, model)
        self.served = served  # one assignment: a call sees the old set or the new one, never half of each

    def _watch(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                self.reload()
            except Exception as err:  # noqa: BLE001 - a registry hiccup must not stop serving the loaded models
                print(f"alias refresh failed, serving what is loaded: {err}", flush=True)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        served = self.served
        variant = "challenger" if "challenger" in served and random.random() < self.share else "champion"
        version, model = served[variant]
        start = time.perf_counter()
        logits = model(pixels)
        self.seconds.labels(variant).observe(time.perf_counter() - start)
        self.calls.labels(variant, version).inc(len(pixels))
        return logits


def main() -> None:
    """Serve the registered model by alias with the service of lecture 6 (its /predict, /metrics, /health)."""
    import argparse

    import uvicorn

    from helpers.serving import create_app

    parser = argparse.ArgumentParser(prog="python -m helpers.mlops.live", description=main.__doc__)
    parser.add_argument("--tracking-uri", required=True, help="the MLflow store holding the registered model")
    parser.add_argument("--name", default="mnist-digits", help="registered model name (default mnist-digits)")
    parser.add_argument("--share", type=float, default=0.2, help="share of calls for the challenger alias (default 0.2)")
    parser.add_argument("--refresh", type=float, default=2.0, help="seconds between reads of the aliases (default 2)")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    registry = CollectorRegistry()
    router = AliasRouter(args.tracking_uri, args.name, registry, share=args.share, refresh=args.refresh)
    uvicorn.run(create_app(router, registry=registry), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()


def start_alias_service(tracking_uri: str, name: str = "mnist-digits", share: float = 0.2, refresh: float = 1.0):
    """``python -m helpers.mlops.live`` as a child process on a free port (a ServedProcess: ``.url``, ``.stop()``)."""
    import sys

    from helpers.core.paths import build_dir
    from helpers.core.procs import ServedProcess, free_port

    port = free_port()
    command = [sys.executable, "-m", "helpers.mlops.live", "--tracking-uri", tracking_uri, "--name", name,
               "--share", str(share), "--refresh", str(refresh), "--port", str(port)]
    return ServedProcess(command, port, log_path=build_dir("serving") / f"alias-service-{port}.log",
                         env={"MLFLOW_DISABLE_TELEMETRY": "true"}, startup_timeout=120)
