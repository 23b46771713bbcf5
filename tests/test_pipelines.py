"""helpers.training.data_pipelines: image storage formats, and padding strategies measured on the loaders they are given."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.training import data_pipelines as pipelines
from helpers.training.sequences import pad_to, synthetic_sequences


def test_synthetic_images_are_deterministic_uint8_rgb():
    a, b = pipelines.synthetic_images(3, 32, seed=1), pipelines.synthetic_images(3, 32, seed=1)
    assert a.shape == (3, 32, 32, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a[0], a[1])


def test_storage_formats_write_every_format_and_read_back_the_same_pixels(tmp_path):
    images = pipelines.synthetic_images(6, 32)
    report = pipelines.storage_formats(images, tmp_path, min_run_time=0.01)
    assert [r.format for r in report.rows] == ["PNG files", "JPEG files", "npy per image", "packed array (mmap)"]
    assert [r.files for r in report.rows] == [6, 6, 6, 1]
    assert len(list((tmp_path / "png").glob("*.png"))) == 6
    png, jpeg, npy, packed = report.rows
    assert jpeg.disk_bytes < png.disk_bytes  # lossy compression is smaller
    assert packed.disk_bytes >= images.nbytes and packed.decode_seconds == 0
    assert all(r.total_seconds > 0 and r.images_per_second > 0 for r in report.rows)
    paths = sorted((tmp_path / "png").glob("*.png"))
    decoded = pipelines._decode_images(pipelines._read_all(paths))
    assert all(np.array_equal(d, i) for d, i in zip(decoded, images))  # PNG is lossless
    assert np.array_equal(np.load(tmp_path / "packed.npy"), images)
    assert len(report.plot().patches) == 8


def _collate(samples):
    """The test's own padding collate (Lecture 5a writes the lesson's version in its cells)."""
    sequences, labels = zip(*samples)
    return pad_to(sequences, max(len(t) for t in sequences)), torch.stack(labels)


def _loaders(data, batch_size):
    """Whole data set padded, random batches padded each, and batches cut from the data sorted by length."""
    by_length = sorted(range(len(data)), key=lambda i: len(data.tokens[i]))
    sorted_batches = [by_length[i:i + batch_size] for i in range(0, len(data), batch_size)]
    whole = TensorDataset(*_collate([data[i] for i in range(len(data))]))
    return {"pad the whole data set": DataLoader(whole, batch_size=batch_size),
            "pad each batch": DataLoader(data, batch_size=batch_size, shuffle=True, collate_fn=_collate),
            "sort by length, pad each batch": DataLoader(data, batch_sampler=sorted_batches, collate_fn=_collate)}


def test_sequence_classifier_ignores_padding():
    torch.manual_seed(0)
    model = pipelines.SequenceClassifier(vocab=50, dim=16, heads=2).eval()
    short = torch.tensor([[3, 4, 5]])
    padded = torch.tensor([[3, 4, 5, 0, 0, 0, 0]])
    with torch.no_grad():
        assert torch.allclose(model(short), model(padded), atol=1e-5)


def test_padding_strategies_measure_the_loaders_they_are_given():
    data = synthetic_sequences(32, median_length=10, max_length=40)
    lengths = data.lengths.tolist()
    report = pipelines.padding_strategies(_loaders(data, 8), data.vocab, model_factory=lambda: pipelines.SequenceClassifier(dim=16, heads=2))
    whole, per_batch, bucketed = report.rows
    assert [r.strategy for r in report.rows] == list(_loaders(data, 8))
    assert whole.tokens == len(lengths) * max(lengths)
    assert whole.tokens > per_batch.tokens > bucketed.tokens >= sum(lengths)
    assert report.real_tokens == sum(lengths)
    assert all(r.batches == 4 and r.epoch_seconds > 0 for r in report.rows)
    assert whole.speedup == 1.0 and bucketed.padding_share < whole.padding_share
    assert len(report.plot().patches) == 3
    share = f"{bucketed.tokens / whole.tokens:.0%} of the positions"
    for speedup, words in ((3.0, "3.00x as fast"), (1.0, "at the same speed (1.00x)"), (0.5, "2.0x slower (0.50x)")):
        bucketed.speedup = speedup  # the sentence follows the measured speed-up, whatever the machine measured
        assert share in report.bucketing_sentence() and words in report.bucketing_sentence()
    with pytest.raises(ValueError, match="at least one loader"):
        pipelines.padding_strategies({}, data.vocab)


def test_the_padding_model_is_wide_enough_on_a_gpu_for_padding_to_cost_time():
    """A 64-wide classifier's step on a GPU is bound by kernel launches, so padding would cost no time: a GPU gets 512 wide."""
    assert pipelines.classifier_for(torch.device("cpu"), 50).embed.embedding_dim == 64
    gpu_model = pipelines.classifier_for(torch.device("cuda"), 50)  # built on the CPU: only its size is asked
    assert gpu_model.embed.embedding_dim == 512 and gpu_model.encoder.self_attn.num_heads == 8
