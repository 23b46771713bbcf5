"""helpers.training.data_pipelines: image storage formats, padding, the length-bucketing sampler."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from helpers.training import data_pipelines as pipelines
from helpers.training.sequences import PAD, synthetic_sequences


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


def test_pad_batch_pads_to_the_longest_or_to_a_given_length():
    batch = [(torch.tensor([5, 6, 7]), torch.tensor(1)), (torch.tensor([8]), torch.tensor(0))]
    tokens, labels = pipelines.pad_batch(batch)
    assert tokens.tolist() == [[5, 6, 7], [8, 0, 0]] and labels.tolist() == [1, 0]
    assert pipelines.pad_batch(batch, length=5)[0].shape == (2, 5)
    assert (tokens == PAD).float().mean().item() == pytest.approx(2 / 6)
    with pytest.raises(ValueError, match="length 3"):
        pipelines.pad_batch(batch, length=2)


@pytest.mark.parametrize("size, batch, pool", [(100, 8, 3), (64, 8, 2), (7, 3, 50), (1, 4, 1)])
def test_bucket_sampler_yields_every_index_exactly_once_per_epoch(size, batch, pool):
    lengths = [random.Random(i).randint(1, 50) for i in range(size)]
    sampler = pipelines.BucketBatchSampler(lengths, batch, pool_batches=pool)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(size))
        assert len(batches) == len(sampler) and all(1 <= len(b) <= batch for b in batches)


def test_bucket_sampler_drop_last_keeps_only_full_batches():
    sampler = pipelines.BucketBatchSampler(list(range(1, 23)), 4, pool_batches=2, drop_last=True)
    batches = list(sampler)
    assert all(len(b) == 4 for b in batches) and len(batches) == len(sampler)
    assert len({i for b in batches for i in b}) == len(batches) * 4


def test_bucket_sampler_shuffles_differently_each_epoch_and_rejects_bad_sizes():
    sampler = pipelines.BucketBatchSampler(list(range(100)), 10)
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first
    with pytest.raises(ValueError, match="batch_size"):
        pipelines.BucketBatchSampler([1, 2], 0)


def test_bucketing_cuts_padding_compared_with_random_batches():
    loaders = pipelines.padding_loaders(synthetic_sequences(1024), batch_size=32)

    def share(loader):
        padded = real = 0
        for tokens, _ in loader:
            padded += tokens.numel()
            real += int((tokens != PAD).sum())
        return 1 - real / padded

    whole, per_batch, bucketed = (share(loader) for loader in loaders.values())
    assert whole > per_batch > bucketed
    assert bucketed < 0.2 < whole


def test_sequence_classifier_ignores_padding():
    torch.manual_seed(0)
    model = pipelines.SequenceClassifier(vocab=50, dim=16, heads=2).eval()
    short = torch.tensor([[3, 4, 5]])
    padded = torch.tensor([[3, 4, 5, 0, 0, 0, 0]])
    with torch.no_grad():
        assert torch.allclose(model(short), model(padded), atol=1e-5)


def test_padding_strategies_compute_fewer_positions_with_bucketing():
    data = synthetic_sequences(32, median_length=10, max_length=40)
    lengths = data.lengths.tolist()
    report = pipelines.padding_strategies(data, batch_size=8, model_factory=lambda: pipelines.SequenceClassifier(dim=16, heads=2))
    whole, per_batch, bucketed = report.rows
    assert whole.tokens == len(lengths) * max(lengths)
    assert whole.tokens > per_batch.tokens > bucketed.tokens >= sum(lengths)
    assert report.real_tokens == sum(lengths)
    assert all(r.batches == 4 and r.epoch_seconds > 0 for r in report.rows)
    assert whole.speedup == 1.0 and bucketed.padding_share < whole.padding_share
    assert len(report.plot().patches) == 3
    share = f"{bucketed.tokens / whole.tokens:.0%} of the positions"
    for speedup, words in ((3.0, "3.0x faster"), (1.0, "at the same speed (1.00x)"), (0.5, "2.0x slower")):
        bucketed.speedup = speedup  # the sentence follows the measured speed-up, whatever the machine measured
        assert share in report.bucketing_sentence() and words in report.bucketing_sentence()
