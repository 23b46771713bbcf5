"""helpers.serving export and runtimes: one ONNX file with a dynamic batch axis, parity within tolerance, int8, latency table."""
from __future__ import annotations

import onnx
import pytest

from helpers.serving import export_onnx, export_program, mnist_holdout, mnist_model, onnx_session, parity, quantize_onnx, runtime_latency, torchscript


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("formats")
    model, _ = mnist_model()
    fp32 = export_onnx(model, folder / "m.onnx")
    return model, fp32, quantize_onnx(fp32, folder / "m8.onnx"), folder


def test_the_onnx_export_is_one_file_with_a_dynamic_batch_axis(exported):
    _, fp32, _, folder = exported
    assert sorted(p.name for p in folder.iterdir()) == ["m.onnx", "m8.onnx"]  # no external weight files
    graph = onnx.load(fp32).graph
    assert graph.input[0].name == "pixels" and graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert graph.input[0].type.tensor_type.shape.dim[1].dim_value == 784


def test_every_format_matches_eager_within_tolerance_at_several_batch_sizes(exported):
    model, fp32, int8, _ = exported
    pixels, _ = mnist_holdout(64)
    check = parity(model, {"torch.export": export_program(model).module(), "TorchScript": torchscript(model),
                           "ONNX fp32": onnx_session(fp32), "ONNX int8": onnx_session(int8)}, pixels, batch_sizes=(1, 7, 64))
    assert check.ok and len(check.rows) == 12
    assert check.find(format="ONNX fp32", batch=64).max_abs_difference < 1e-4
    assert check.find(format="ONNX int8", batch=64).max_abs_difference > 1e-4  # int8 really is rounded


def test_parity_flags_a_model_that_differs(exported):
    model, fp32, _, _ = exported
    pixels, _ = mnist_holdout(8)
    other, _ = mnist_model()
    other = type(other)()  # untrained weights
    assert not parity(other, {"ONNX fp32": onnx_session(fp32)}, pixels, batch_sizes=(8,)).ok


def test_int8_is_smaller_and_keeps_its_accuracy(exported):
    model, fp32, int8, _ = exported
    pixels, labels = mnist_holdout(500)
    assert int8.stat().st_size < fp32.stat().st_size / 3
    accuracy = (onnx_session(int8).run(None, {"pixels": pixels.numpy()})[0].argmax(1) == labels.numpy()).mean()
    assert accuracy >= mnist_model()[1].holdout_accuracy - 0.02


def test_the_latency_table_has_every_runtime_batch_and_thread_count(exported):
    model, fp32, int8, _ = exported
    pixels, _ = mnist_holdout(32)
    report = runtime_latency(model, {"ort": lambda t: onnx_session(fp32, t)}, pixels, batch_sizes=(1, 32), threads=(1,),
                             min_run_time=0.01)
    assert {(r.runtime, r.batch) for r in report.rows} == {("eager PyTorch", 1), ("eager PyTorch", 32), ("ort", 1), ("ort", 32)}
    assert report.speedup("eager PyTorch", 32, 1) == 1.0
    for r in report.rows:
        assert r.per_input == pytest.approx(r.latency / r.batch)
