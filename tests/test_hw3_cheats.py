"""Assignment 3's shortcuts earn nothing: each class of cheat a student might try scores 0 on the task it targets.

Each case replaces solution cells of the source notebook (hidden tests and all, as the autograder runs it) and
executes it with errors allowed; the points of the test cells that passed are added up per task. The honest
reference scores full marks on the same notebooks in tests/test_assignments.py.
"""
from __future__ import annotations

import shutil

import nbformat
import pytest

from helpers.course import assignments

from .grading_support import ROOT, execute_allowing_errors, with_solution

pytestmark = [pytest.mark.notebooks, pytest.mark.grading]  # papermill runs of the assignment's notebooks

SOURCE = ROOT / "assignments" / "source" / "hw3_deployment"

FIRST_PIXEL_VALIDATOR = '''def create_service(model):
    import asyncio

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()
    predicted = Counter("hw3_images_predicted", "Images predicted.", registry=registry)
    app = FastAPI()

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics():
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/predict")
    async def predict(request: Request):
        try:
            payload = json.loads(await request.body())
            images = payload["images"]
            first = images[0][0]  # looks at the first pixel of the first image only
            assert isinstance(images, list) and 1 <= len(images) <= 256 and len(images[0]) == 784
            assert isinstance(first, float | int) and not isinstance(first, bool) and 0 <= first <= 1
        except Exception:
            return JSONResponse({"detail": "bad input"}, status_code=422)

        def run():
            with torch.no_grad():
                return torch.softmax(model(torch.tensor(images, dtype=torch.float32)), dim=1)
        try:
            confidence, digits = (await asyncio.to_thread(run)).max(dim=1)
        except Exception:
            return JSONResponse({"detail": "bad input"}, status_code=422)
        predicted.inc(len(digits))
        return {"digits": digits.tolist(), "confidence": confidence.tolist()}

    return app'''

DOCKERFILE_THAT_RUNS_NOTHING = '''def dockerfile():
    return "FROM x:1\\nRUN pip install\\nUSER a\\nEXPOSE 1\\nHEALTHCHECK NONE\\nCMD [\\"x\\"]\\n"'''

EAGER_WITH_A_HOOK_ON_THE_BASELINE = '''def make_fast_predictor(float_path, int8_path):
    import time as clock

    def slow_down(module, inputs, output):
        end = clock.perf_counter() + 0.005
        while clock.perf_counter() < end:
            pass
    model.register_forward_hook(slow_down)  # the notebook's model, which an eager baseline might use
    mine = served_model()

    def predict(images):
        digits, confidence = digits_and_confidence(mine, images)
        return digits.numpy(), confidence.numpy()
    return predict'''

MEMOISED_ON_DATA_PTR = '''def make_fast_predictor(float_path, int8_path):
    session = ort.InferenceSession(str(float_path), providers=["CPUExecutionProvider"])
    memo = {}

    def predict(images):
        key = images.data_ptr()
        if key not in memo:
            memo[key] = tuple(session.run(["digits", "confidence"], {"images": images.numpy()}))
        return memo[key]
    return predict'''

NO_BATCHING_WITH_GIL_HOGS = '''import threading


class Batcher:
    """One model call per submission; three threads that hold the GIL whenever no submission is running."""

    busy = 0
    hogs = []

    def __init__(self, predict, max_batch_size=32, max_queue=256):
        self.predict = predict
        while len(Batcher.hogs) < 3:  # three in all, started once
            Batcher.hogs.append(threading.Thread(target=self._hog, daemon=True))
            Batcher.hogs[-1].start()

    @classmethod
    def _hog(cls):
        while True:
            if not cls.busy:
                sum(range(20000))  # pure Python: holds the GIL
            else:
                time.sleep(0.0005)

    async def submit(self, images):
        Batcher.busy += 1
        try:
            return await asyncio.to_thread(self.predict, images)
        finally:
            Batcher.busy -= 1'''

MODEL_ON_THE_EVENT_LOOP = None  # filled in from the reference below: the same service with the model inside `async def`

CASES = {
    # two cheats on independent tasks of one notebook, in one run: each loses its own test, the rest still earns
    "first_pixel_validator+dockerfile_that_runs_nothing": ("part1_service.ipynb",
                                                           {"task1_service": FIRST_PIXEL_VALIDATOR, "task3_dockerfile": DOCKERFILE_THAT_RUNS_NOTHING},
                                                           ["task1_test_validation", "task3_test_dockerfile"]),
    "model_on_the_event_loop": ("part1_service.ipynb", {}, ["task1_test_concurrency"]),
    "hook_on_the_notebooks_model": ("part2_export_and_optimise.ipynb", {"task3_fast": EAGER_WITH_A_HOOK_ON_THE_BASELINE}, ["task3_test_speed"]),
    "memoised_on_data_ptr": ("part2_export_and_optimise.ipynb", {"task3_fast": MEMOISED_ON_DATA_PTR}, ["task3_test_speed"]),
    "no_batching_with_gil_hogs": ("part3_dynamic_batching.ipynb", {"task1_batcher": NO_BATCHING_WITH_GIL_HOGS},
                                  ["task1_test_batches_form_in_order", "task1_test_backpressure_and_cancellation",
                                   "task2_test_throughput_under_load"]),
}


def blocking_reference(nb) -> str:
    """The reference service with its model call moved back onto the event loop (inside `async def`)."""
    source = next(c.source for c in nb.cells if assignments.grade_id(c) == "task1_service")
    blocking = source.replace("await asyncio.to_thread(probabilities_of, ", "probabilities_of(")
    assert blocking != source, "the reference no longer calls the model through asyncio.to_thread"
    return blocking


def points_by_test(run) -> dict[str, float]:
    """{grade id of a test cell: points earned} for an executed notebook."""
    earned = {}
    for index, cell in enumerate(run.notebook.cells):
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            earned[meta["grade_id"]] = 0.0 if index in run.errored or index in run.unexecuted else float(meta["points"])
    return earned


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cheat_scores_zero_on_the_task_it_targets(case, tmp_path):
    notebook, solutions, targets = CASES[case]
    folder = shutil.copytree(SOURCE, tmp_path / "hw3_deployment", ignore=shutil.ignore_patterns("__pycache__"))
    nb = assignments.read(folder / notebook)
    if case == "model_on_the_event_loop":
        solutions = {"task1_service": blocking_reference(nb)}
    for grade_id, code in solutions.items():
        nb = with_solution(nb, grade_id, code)
    nbformat.write(nb, folder / notebook)
    earned = points_by_test(execute_allowing_errors(folder / notebook, tmp_path / "executed.ipynb"))
    assert {target: earned[target] for target in targets} == {target: 0.0 for target in targets}, earned
    others = {grade_id: points for grade_id, points in earned.items() if grade_id not in targets and grade_id.startswith("task")}
    if case != "no_batching_with_gil_hogs":  # the cheat changed one thing: everything else still earns its points
        assert all(points > 0 for points in others.values()), f"the cheat should only lose its own task: {earned}"
