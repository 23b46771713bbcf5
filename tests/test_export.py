"""helpers.serving's format reports: parity within tolerance, file sizes and accuracy, the latency table.

The formats are made here as lecture 7 makes them in its cells (torch.export, torch.onnx.export with a dynamic
batch axis, ONNX Runtime's dynamic int8 quantiser, one-thread sessions).
"""
from __future__ import annotations

import contextlib
import io
import logging
import warnings

import onnx
import onnxruntime as ort
import pytest
import torch
from onnxruntime.quantization import QuantType, quantize_dynamic

from helpers.serving import file_sizes_and_accuracy, mnist_holdout, mnist_model, parity, runtime_latency


def to_onnx(model, path):
    batch = torch.export.Dim("batch", min=1, max=4096)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (torch.rand(2, 784),), str(path), dynamo=True, external_data=False,
                          input_names=["pixels"], output_names=["logits"], dynamic_shapes=({0: batch},))
    return path


def session(path, threads=1):
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = threads, 1, 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("formats")
    model, _ = mnist_model()
    fp32 = to_onnx(model, folder / "m.onnx")
    logging.getLogger().setLevel(logging.ERROR)
    quantize_dynamic(str(fp32), str(folder / "m8.onnx"), weight_type=QuantType.QInt8)
    return model, fp32, folder / "m8.onnx", folder


def test_the_onnx_export_is_one_file_with_a_dynamic_batch_axis(exported):
    _, fp32, _, folder = exported
    assert sorted(p.name for p in folder.iterdir()) == ["m.onnx", "m8.onnx"]  # no external weight files
    graph = onnx.load(fp32).graph
    assert graph.input[0].name == "pixels" and graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert graph.input[0].type.tensor_type.shape.dim[1].dim_value == 784


def test_every_format_matches_eager_within_tolerance_at_several_batch_sizes(exported):
    model, fp32, int8, _ = exported
    pixels, _ = mnist_holdout(64)
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.export.export(model, (torch.rand(2, 784),), dynamic_shapes=({0: batch},))
    check = parity(model, {"torch.export": program.module(), "ONNX fp32": session(fp32), "ONNX int8": session(int8)},
                   pixels, batch_sizes=(1, 7, 64))
    assert check.ok and len(check.rows) == 9
    assert check.find(format="ONNX fp32", batch=64).max_abs_difference < 1e-4
    assert check.find(format="ONNX int8", batch=64).max_abs_difference > 1e-4  # int8 really is rounded


def test_parity_flags_a_model_that_differs(exported):
    model, fp32, _, _ = exported
    pixels, _ = mnist_holdout(8)
    other = type(model)()  # untrained weights
    assert not parity(other, {"ONNX fp32": session(fp32)}, pixels, batch_sizes=(8,)).ok


def test_the_files_table_reads_sizes_and_scores_each_file(exported):
    _, fp32, int8, _ = exported
    pixels, labels = mnist_holdout(500)
    table = file_sizes_and_accuracy({"fp32": fp32, "int8": int8}, {"fp32": session(fp32), "int8": session(int8)}, pixels, labels)
    small, big = table.find(format="int8"), table.find(format="fp32")
    assert small.size == int8.stat().st_size and small.size < big.size / 3
    assert small.accuracy >= mnist_model()[1].holdout_accuracy - 0.03


def test_the_latency_table_has_every_runtime_batch_and_thread_count(exported):
    model, fp32, _, _ = exported
    pixels, _ = mnist_holdout(32)
    report = runtime_latency(model, {"ort": lambda t: session(fp32, t)}, pixels, batch_sizes=(1, 32), threads=(1,),
                             min_run_time=0.01)
    assert {(r.runtime, r.batch) for r in report.rows} == {("eager PyTorch", 1), ("eager PyTorch", 32), ("ort", 1), ("ort", 32)}
    assert report.speedup("eager PyTorch", 32, 1) == 1.0
    for r in report.rows:
        assert r.per_input == pytest.approx(r.latency / r.batch)
        assert r.blocks >= 1  # how many timed blocks back the median and IQR (the lecture judges a gap only with 4 or more)
