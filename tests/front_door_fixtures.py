"""Small files in the real formats of the front-door loaders, written by the tests into a temporary folder.

Each writer returns the arrays it wrote, so a test can compare what a loader reads with what is on disk.
"""

from __future__ import annotations

import csv
import gzip
import json
import pickle
import struct
from pathlib import Path

import numpy as np

LEAF_ALPHABET = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def write_idx(path: Path, arr: np.ndarray, gz: bool = False) -> None:
    """An IDX file as LeCun's MNIST distribution has them: magic 2051 (images) or 2049 (labels), big endian."""
    arr = np.asarray(arr, dtype=np.uint8)
    head = struct.pack(">II", 2051 if arr.ndim == 3 else 2049, arr.shape[0])
    if arr.ndim == 3:
        head += struct.pack(">II", *arr.shape[1:])
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(head + arr.tobytes())


def write_torchvision_mnist(root: Path, folder: str = "MNIST", n: int = 60, n_test: int = 20, gz: bool = True,
                            seed: int = 0) -> dict[str, np.ndarray]:
    """``root/<folder>/raw/`` as torchvision's download leaves it (training files gzipped when ``gz``, test
    files raw: torchvision keeps both forms, either must do)."""
    rng = np.random.default_rng(seed)
    raw = root / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    out = {"x_train": rng.integers(0, 256, (n, 28, 28)), "y_train": np.arange(n) % 10,
           "x_test": rng.integers(0, 256, (n_test, 28, 28)), "y_test": (np.arange(n_test) * 3) % 10}
    write_idx(raw / ("train-images-idx3-ubyte" + (".gz" if gz else "")), out["x_train"], gz)
    write_idx(raw / ("train-labels-idx1-ubyte" + (".gz" if gz else "")), out["y_train"], gz)
    write_idx(raw / "t10k-images-idx3-ubyte", out["x_test"])
    write_idx(raw / "t10k-labels-idx1-ubyte", out["y_test"])
    return {k: v.astype(np.uint8) for k, v in out.items()}


def _dump_py2_style(path: Path, obj: dict) -> None:
    """A pickle with bytes keys, protocol 2: what the CIFAR python files hold (written by Python 2's cPickle)."""
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def write_cifar10(root: Path, per_batch: int = 8, n_test: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """``root/cifar-10-batches-py/``: ``data_batch_1`` .. ``_5``, ``test_batch``, ``batches.meta`` (rows of 3072
    uint8: 1024 red, then green, then blue, each 32x32 row-major)."""
    rng = np.random.default_rng(seed)
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for k in range(1, 6):
        x = rng.integers(0, 256, (per_batch, 3072)).astype(np.uint8)
        y = [int(v) for v in rng.integers(0, 10, per_batch)]
        _dump_py2_style(d / f"data_batch_{k}", {b"batch_label": f"training batch {k} of 5".encode(), b"labels": y,
                                                 b"data": x, b"filenames": [b"f.png"] * per_batch})
        xs.append(x)
        ys += y
    xt = rng.integers(0, 256, (n_test, 3072)).astype(np.uint8)
    yt = [int(v) for v in rng.integers(0, 10, n_test)]
    _dump_py2_style(d / "test_batch", {b"batch_label": b"testing batch 1 of 1", b"labels": yt, b"data": xt,
                                       b"filenames": [b"t.png"] * n_test})
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    _dump_py2_style(d / "batches.meta", {b"label_names": names, b"num_cases_per_batch": per_batch, b"num_vis": 3072})
    return {"x_train": np.concatenate(xs), "y_train": np.array(ys), "x_test": xt, "y_test": np.array(yt)}


def write_cifar100(root: Path, n: int = 40, n_test: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """``root/cifar-100-python/``: ``train``, ``test`` (``fine_labels``, ``coarse_labels``) and ``meta``."""
    rng = np.random.default_rng(seed)
    d = root / "cifar-100-python"
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, m in (("train", n), ("test", n_test)):
        x = rng.integers(0, 256, (m, 3072)).astype(np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, m)]
        coarse = [f // 5 for f in fine]
        _dump_py2_style(d / split, {b"filenames": [b"a.png"] * m, b"batch_label": split.encode(), b"fine_labels": fine,
                                    b"coarse_labels": coarse, b"data": x})
        out[f"x_{split}"], out[f"fine_{split}"], out[f"coarse_{split}"] = x, np.array(fine), np.array(coarse)
    _dump_py2_style(d / "meta", {b"fine_label_names": [f"c{k}".encode() for k in range(100)],
                                 b"coarse_label_names": [f"s{k}".encode() for k in range(20)]})
    return out


def _leaf_file(path: Path, users: dict[str, tuple[list, list]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"users": list(users), "num_samples": [len(y) for _, y in users.values()],
                                "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}))


def write_leaf_femnist(root: Path, sizes=(6, 9, 5), test_sizes=(2, 3, 2), seed: int = 0) -> dict:
    """LEAF's FEMNIST layout ``root/train/*.json`` and ``root/test/*.json`` (users split over two files, as
    LEAF's ``niid`` shards are): ``x`` 784 floats in [0, 1], ``y`` in 0..61."""
    rng = np.random.default_rng(seed)
    names = [f"f{k:04d}_{k * 7 % 100:02d}" for k in range(len(sizes))]
    data = {}
    for split, ns in (("train", sizes), ("test", test_sizes)):
        users = {u: (np.round(rng.random((m, 784)), 3).tolist(), [int(v) for v in rng.integers(0, 62, m)])
                 for u, m in zip(names, ns)}
        half = len(names) // 2 + 1
        _leaf_file(root / split / f"all_data_0_niid_0_keep_0_{split}_9.json", dict(list(users.items())[:half]))
        _leaf_file(root / split / f"all_data_1_niid_0_keep_0_{split}_9.json", dict(list(users.items())[half:]))
        data[split] = users
    return data


def write_leaf_shakespeare(root: Path, seed: int = 0) -> dict:
    """LEAF's Shakespeare layout: 80-character strings ``x`` and the next character ``y``, per speaking role."""
    rng = np.random.default_rng(seed)
    text = ("To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer The slings and "
            "arrows of outrageous fortune, Or to take arms against a sea of troubles And by opposing end them.\n")
    roles = {"THE_TRAGEDY_OF_HAMLET_HAMLET": (7, 2), "THE_TEMPEST_MIRANDA": (5, 2), "KING_LEAR_FOOL": (6, 3)}
    data = {"train": {}, "test": {}}
    for role, (n, nt) in roles.items():
        for split, m in (("train", n), ("test", nt)):
            starts = rng.integers(0, len(text) - 81, m)
            data[split][role] = ([text[s:s + 80] for s in starts], [text[s + 80] for s in starts])
    for split in ("train", "test"):
        _leaf_file(root / split / f"all_data_niid_0_keep_0_{split}_8.json", data[split])
    return data


def write_image_folder(root: Path, classes=("cat", "dog", "emu"), per_class=(3, 4, 2), size=(6, 5),
                       seed: int = 0, fmt: str = "png") -> dict[str, list]:
    """``root/<class>/<k>.png``: RGB images of random pixels; returns ``{class: [uint8 HxWx3 arrays]}``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = {}
    for c, n in zip(classes, per_class):
        (root / c).mkdir(parents=True, exist_ok=True)
        out[c] = []
        for k in range(n):
            a = rng.integers(0, 256, (*size, 3)).astype(np.uint8)
            Image.fromarray(a, "RGB").save(root / c / f"img{k:02d}.{fmt}")
            out[c].append(a)
    return out


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def csv_rows(n: int = 40, seed: int = 0, clients=("north", "south", "east")) -> list[dict]:
    """Rows with two numeric features, a string label (``good``/``bad``) and a client column."""
    rng = np.random.default_rng(seed)
    return [{"age": int(rng.integers(18, 80)), "income": round(float(rng.normal(3, 1)), 4),
             "label": "good" if k % 3 else "bad", "site": clients[k % len(clients)]} for k in range(n)]


def write_hf_saved(path: Path, n: int = 40, n_test: int = 12, seed: int = 0):
    """A Hugging Face DatasetDict (``train``/``test``; an ``image`` column of 8x8 RGB images and a
    ``ClassLabel`` ``label``) written with ``save_to_disk``; returns the dict."""
    import datasets
    from PIL import Image

    rng = np.random.default_rng(seed)
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])})
    splits = {}
    for split, m in (("train", n), ("test", n_test)):
        imgs = [Image.fromarray(rng.integers(0, 256, (8, 8, 3)).astype(np.uint8), "RGB") for _ in range(m)]
        splits[split] = datasets.Dataset.from_dict({"image": imgs, "label": [k % 3 for k in range(m)]},
                                                   features=feats)
    dd = datasets.DatasetDict(splits)
    datasets.disable_progress_bars()
    dd.save_to_disk(str(path))
    return dd
