"""The front door for own data and models: import-path targets, torch Datasets, files, standard formats.

Every loader is checked against the arrays its fixture wrote (small files in the real formats, written into
``tmp_path`` by ``front_door_fixtures``), and every source runs end to end through ``fedsolve run``.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
import yaml

import front_door_fixtures as fx
from fedsolve.cli import main
from fedsolve.data import (FederatedData, PooledData, federate, load_cifar10, load_cifar100, load_csv,
                           load_femnist, load_image_folder, load_mnist, load_npz_file, load_shakespeare)
from fedsolve.data.torch_data import materialize, transform_samples

ALGO = {"name": "fedavg", "params": {"lr": 0.05, "batch_size": 4}}
SIM = {"rounds": 2, "eval_every": 1, "executor": "sequential"}


@pytest.fixture
def work(tmp_path, monkeypatch):
    """``tmp_path`` as the current folder, with ``sys.path`` and the user modules a test imports restored after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("fd_"):
            del sys.modules[name]


def run_cli(cfg: dict, out: str, *extra: str, config_name: str | None = None) -> int:
    path = f"{config_name or out}.yaml"
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return main(["run", path, "--out", out, "--quiet", *extra])


def run_ok(data: dict, model: dict | None = None, out: str = "run", **top) -> dict:
    """``fedsolve run`` of a config with ``data`` and ``model``; returns its summary, with the client count."""
    cfg = {"name": out, "data": data, "model": model or {"name": "logreg"}, "simulation": SIM, "algorithm": ALGO,
           **top}
    assert run_cli(cfg, out) == 0
    summary = json.loads(open(f"{out}/summary.json").read())
    rows = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
    assert rows[-1]["round"] == SIM["rounds"] and np.isfinite(rows[-1]["test_loss"])
    summary["clients"] = len(json.loads(open(f"{out}/per_client.json").read()))
    return summary


# ------------------------------------------------------------------ import paths
USER_MODULE = '''
import torch
from torch import nn
from torch.utils.data import Dataset


class Blobs(Dataset):
    """Three Gaussian blobs in 5 dimensions."""

    def __init__(self, n=90, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.y = torch.arange(n) % 3
        self.x = torch.randn(n, 5, generator=g) + 2.0 * self.y[:, None]
        self.classes = ["a", "b", "c"]

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def make(n=90, seed=0):
    return Blobs(n, seed)


def per_client(sizes=(20, 30, 25)):
    return [Blobs(n, seed=k) for k, n in enumerate(sizes)]


def net(input_shape, num_classes, hidden=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], hidden), nn.Tanh(), nn.Linear(hidden, num_classes))


def jitter(x, scale=0.1):
    return x + scale * torch.randn_like(x)


def broken(**kw):
    raise RuntimeError("no such weights file")


def not_a_module(input_shape):
    return 42


def not_data():
    return 7
'''


def test_targets_run_and_the_saved_config_reruns_byte_identical(work):
    (work / "fd_user.py").write_text(USER_MODULE)
    cfg = {"name": "own", "seeds": [3], "data": {"target": "fd_user:make", "params": {"n": 120}, "num_clients": 4,
                                               "partition": "dirichlet", "partition_params": {"alpha": 1.0},
                                               "sample_transform": {"target": "fd_user:jitter",
                                                                    "params": {"scale": 0.05}}},
           "model": {"target": "fd_user:net", "params": {"hidden": 6}}, "simulation": SIM, "algorithm": ALGO}
    assert run_cli(cfg, "A") == 0
    saved = yaml.safe_load(open("A/config.yaml"))
    assert saved["data"]["target"] == "fd_user:make" and saved["data"]["dataset"] is None
    assert saved["model"] == {**saved["model"], "target": "fd_user:net", "name": None, "params": {"hidden": 6}}
    assert run_cli(saved, "B", config_name="again") == 0 and main(["run", "A/config.yaml", "--out", "C",
                                                                       "--quiet"]) == 0
    a = open("A/metrics.jsonl", "rb").read()
    assert a == open("B/metrics.jsonl", "rb").read() == open("C/metrics.jsonl", "rb").read()
    summary = json.loads(open("A/summary.json").read())
    assert summary["dataset"] == "fd_user:make"
    assert "fd_user:make" in open("A/report.md").read()
    from fedsolve.experiments.config import load_config
    from fedsolve.experiments.runner import build_problem

    problem = build_problem(load_config("A/config.yaml"), 3)   # the user's model: 5-6-3 with biases
    assert problem.layout.dim == 5 * 6 + 6 + 6 * 3 + 3 and problem.data.num_classes == 3


@pytest.mark.parametrize("section, target, field, words", [
    ("model", "no_colon_here", "model.target", "not an import path"),
    ("model", "fd_missing_mod:net", "model.target", "no module named 'fd_missing_mod'"),
    ("model", "fd_user:nothing", "model.target", "has no attribute 'nothing'"),
    ("model", "fd_user:broken", "model.target", "raised RuntimeError: no such weights file"),
    ("model", "fd_user:not_a_module", "model.target", "returned a int, not a torch.nn.Module"),
    ("data", "fd_user:broken", "data.target", "raised RuntimeError: no such weights file"),
    ("data", "fd_user:not_data", "data.target", "returned a int"),
    ("data", "fd_user:", "data.target", "not an import path"),
])
def test_bad_targets_give_one_line_and_exit_2(work, capsys, section, target, field, words):
    (work / "fd_user.py").write_text(USER_MODULE)
    cfg = {"data": {"target": "fd_user:make", "num_clients": 3}, "model": {"target": "fd_user:net"},
           "simulation": SIM, "algorithm": ALGO}
    cfg[section] = {"target": target}
    if section == "data":
        cfg["data"]["num_clients"] = 3
    capsys.readouterr()
    assert run_cli(cfg, "bad") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{field}: " in err and words in err, err
    assert "Traceback" not in err


def test_target_parameters_and_name_with_target_are_refused(work, capsys):
    (work / "fd_user.py").write_text(USER_MODULE)
    base = {"data": {"target": "fd_user:make", "num_clients": 3}, "simulation": SIM, "algorithm": ALGO}
    for model, field, words in (({"target": "fd_user:net", "params": {"depth": 3}}, "model.params",
                                 "takes no parameter(s) ['depth']"),
                                ({"target": "fd_user:net", "name": "mlp"}, "model", "not both")):
        capsys.readouterr()
        assert run_cli({**base, "model": model}, "bad") == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and field in err and words in err, err
    capsys.readouterr()
    assert run_cli({**base, "data": {"dataset": "digits", "target": "fd_user:make"}}, "bad") == 2
    assert "not both" in capsys.readouterr().err


# ------------------------------------------------------------------ torch Datasets
class Pairs(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def test_a_dataset_is_read_once_into_arrays():
    x = torch.arange(24, dtype=torch.float32).reshape(6, 2, 2)
    xs, ys = materialize(Pairs(x, [2, 0, 1, 2, 0, 1]))
    assert np.array_equal(xs, x.numpy()) and ys.dtype == np.int64 and ys.tolist() == [2, 0, 1, 2, 0, 1]
    xs, ys = materialize(Pairs(x, [0.5, 1.5, 2.5, 3.5, 4.5, 5.5]))
    assert ys.dtype == np.float32 and ys[2] == 2.5
    with pytest.raises(ValueError, match="item 1 has input shape"):
        materialize(Pairs([torch.zeros(2), torch.zeros(3)], [0, 1]))
    class Triples(Pairs):
        def __getitem__(self, i):
            return 1, 2, 3

    with pytest.raises(ValueError, match="item 0 is a tuple of length 3; allowed: a pair"):
        materialize(Triples([0], [0]))
    with pytest.raises(ValueError, match="not a map-style Dataset"):
        materialize([(1, 0)])


def test_one_dataset_plus_a_partitioner_equals_the_arrays_partitioned():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(80, 3, generator=g), torch.arange(80) % 4
    ds = Pairs(x, [int(v) for v in y])
    a = federate(ds, 5, "dirichlet", {"alpha": 0.5}, seed=7)
    b = federate(PooledData(x.numpy(), y.numpy(), "classification", 4), 5, "dirichlet", {"alpha": 0.5}, seed=7)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.train_offsets, b.train_offsets)
    assert torch.equal(a.test_y, b.test_y) and a.num_classes == 4
    rows = {tuple(r.tolist()) for r in torch.cat([a.train_x, a.test_x])}
    assert rows == {tuple(r.tolist()) for r in x}     # every sample, once


def test_a_list_of_datasets_is_one_client_each():
    sizes = (12, 20, 8)
    parts = [Pairs(torch.full((n, 2), float(k)), [j % 2 for j in range(n)]) for k, n in enumerate(sizes)]
    d = federate(parts, None, test_fraction=0.25, seed=0)
    assert d.num_clients == 3 and (d.train_sizes + d.test_sizes).tolist() == list(sizes)
    assert d.test_sizes.tolist() == [3, 5, 2]
    for k in range(3):   # client k holds exactly its own Dataset's samples
        assert torch.all(d.client_train(k)[0] == k) and torch.all(d.client_test(k)[0] == k)
    given = federate({"train": parts, "test": parts}, None, test_fraction=None)
    assert given.train_sizes.tolist() == list(sizes) == given.test_sizes.tolist()
    pooled = federate({"train": parts, "test": parts}, None, test_fraction=0.25)   # as a registry test set
    assert pooled.train_sizes.tolist() == [18, 30, 12] and pooled.test_sizes.tolist() == [6, 10, 4]
    with pytest.raises(ValueError, match="num_clients for dataset"):
        federate(parts, 4)
    with pytest.raises(ValueError, match="test_fraction null"):
        federate(parts, None, test_fraction=None)


def test_per_client_datasets_and_transform_from_yaml(work):
    (work / "fd_user.py").write_text(USER_MODULE)
    s = run_ok({"target": "fd_user:per_client", "num_clients": None, "test_fraction": 0.2,
                "sample_transform": "fd_user:jitter"}, {"target": "fd_user:net"})
    assert s["clients"] == 3 and s["dataset"] == "fd_user:per_client"
    cfg = {"data": {"target": "fd_user:per_client", "num_clients": None, "partition": "dirichlet"},
           "simulation": SIM, "algorithm": ALGO}
    assert run_cli(cfg, "split") == 2   # a partition of data the target already split: refused, not ignored


def test_a_transform_is_applied_once_with_the_seed():
    x = np.zeros((5, 3), np.float32)
    data = PooledData(x, np.arange(5) % 2, "classification", 2, x_test=np.ones((2, 3), np.float32),
                      y_test=np.array([0, 1]))
    noisy = lambda t: t + torch.rand_like(t)  # noqa: E731
    state = torch.random.get_rng_state()
    a, b, c = (transform_samples(data, noisy, seed) for seed in (1, 1, 2))
    assert torch.equal(torch.random.get_rng_state(), state)   # the process's own generator is untouched
    assert np.array_equal(a.x, b.x) and not np.array_equal(a.x, c.x)
    assert a.x.min() > 0 and a.x_test.min() > 1 and np.array_equal(data.x, x)   # train and test, a copy
    seen = []

    def shrinking(t):   # the first sample keeps its shape, the next ones lose a feature
        seen.append(1)
        return t if len(seen) == 1 else t[:2]

    with pytest.raises(ValueError, match="sample 1 came out with shape \\(2,\\), sample 0 with \\(3,\\)"):
        transform_samples(data, shrinking)
    with pytest.raises(ValueError, match="the transform raised ZeroDivisionError on sample 0"):
        transform_samples(data, lambda t: 1 / 0)


# ------------------------------------------------------------------ own files
def test_image_folder_reads_the_pixels(work):
    wrote = fx.write_image_folder(work / "imgs")
    fx.write_image_folder(work / "imgs_test", per_class=(1, 1, 2), seed=1)
    p = load_image_folder("imgs", test_root="imgs_test")
    assert p.meta["class_names"] == ["cat", "dog", "emu"] and p.num_classes == 3
    assert p.y.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2] and p.y_test.tolist() == [0, 1, 2, 2]
    assert p.x.shape == (9, 3, 6, 5)
    assert np.array_equal(p.x[3], wrote["dog"][0].transpose(2, 0, 1) / np.float32(255))
    grey = load_image_folder("imgs", mode="L", size=[4, 4])
    assert grey.x.shape == (9, 1, 4, 4)
    (work / "imgs" / "dog" / "odd.png").parent.mkdir(exist_ok=True)
    from PIL import Image
    Image.fromarray(np.zeros((3, 3, 3), np.uint8)).save(work / "imgs" / "dog" / "odd.png")
    with pytest.raises(ValueError, match="different sizes.*size: \\[height, width\\]"):
        load_image_folder("imgs")
    assert load_image_folder("imgs", size=[6, 5]).x.shape == (10, 3, 6, 5)


def test_image_folder_runs_from_the_cli(work):
    fx.write_image_folder(work / "imgs", per_class=(6, 6, 6))
    s = run_ok({"dataset": "image_folder", "params": {"root": "imgs"}, "num_clients": 3},
               {"name": "lenet", "params": {"fc_hidden": 8}})
    assert s["clients"] == 3 and s["dataset"] == "image_folder"


def test_csv_reads_features_labels_and_clients(work):
    rows = fx.csv_rows(30)
    fx.write_csv(work / "t.csv", rows)
    p = load_csv("t.csv", label="label", client="site")
    assert p.x.shape == (30, 2) and p.meta["features"] == ["age", "income"]
    assert np.allclose(p.x[:, 1], [r["income"] for r in rows]) and p.x[4, 0] == rows[4]["age"]
    assert p.meta["class_names"] == ["bad", "good"] and p.y.tolist() == [int(r["label"] == "good") for r in rows]
    assert p.groups.tolist() == [["east", "north", "south"].index(r["site"]) for r in rows]
    reg = load_csv("t.csv", label="income", features=["age"], task="regression")
    assert reg.task == "regression" and reg.y.dtype == np.float32 and reg.x.shape == (30, 1)
    rows[5]["age"] = "n/a"
    fx.write_csv(work / "bad.csv", rows)
    with pytest.raises(ValueError, match="line 7, column 'age': 'n/a' is not a number"):
        load_csv("bad.csv", label="label", client="site")
    with pytest.raises(ValueError, match="no column 'target'"):
        load_csv("t.csv", label="target")


def test_csv_runs_from_the_cli_with_natural_clients(work):
    fx.write_csv(work / "t.csv", fx.csv_rows(60))
    s = run_ok({"dataset": "csv", "params": {"path": "t.csv", "label": "label", "client": "site"},
                "num_clients": None, "partition": "natural"})
    assert s["clients"] == 3


def test_npz_reads_arrays_and_client_ids(work):
    rng = np.random.default_rng(0)
    x, y, c = rng.integers(0, 256, (24, 1, 4, 4)).astype(np.uint8), np.arange(24) % 3, np.repeat([7, 3, 9], 8)
    np.savez(work / "a.npz", images=x, y=y, client=c, x_test=x[::4], y_test=y[::4], client_test=c[::4])
    p = load_npz_file("a.npz", keys={"x": "images"})
    assert np.array_equal(p.x, x / np.float32(255)) and p.y.tolist() == y.tolist() and p.num_classes == 3
    assert p.groups.tolist() == [1] * 8 + [0] * 8 + [2] * 8 and p.x_test.shape == (6, 1, 4, 4)
    assert p.groups_test.tolist() == [1, 1, 0, 0, 2, 2]
    with pytest.raises(ValueError, match="no array 'x'"):
        load_npz_file("a.npz")
    np.savez(work / "b.npz", x=x, y=y, client=c, x_test=x[:6], y_test=y[:6])
    with pytest.raises(ValueError, match="no 'client_test'"):
        load_npz_file("b.npz")
    s = run_ok({"dataset": "npz", "params": {"path": "a.npz", "keys": {"x": "images"}}, "num_clients": None,
                "partition": "natural"})
    assert s["clients"] == 3


# ------------------------------------------------------------------ torchvision's folders
@pytest.mark.parametrize("gz", [True, False])
def test_torchvision_mnist_folder_is_reused_without_a_download(work, monkeypatch, gz):
    monkeypatch.setenv("FEDSOLVE_DATA_DIR", str(work / "cache"))
    wrote = fx.write_torchvision_mnist(work / "tv", gz=gz)
    p = load_mnist(root="tv")
    assert np.array_equal(p.x[:, 0], wrote["x_train"] / np.float32(255)) and p.y.tolist() == wrote["y_train"].tolist()
    assert np.array_equal(p.y_test, wrote["y_test"]) and p.x_test.shape == (20, 1, 28, 28)
    s = run_ok({"dataset": "mnist", "params": {"root": "tv"}, "num_clients": 4, "test_fraction": None})
    assert s["clients"] == 4
    assert not (work / "cache").exists()   # nothing fetched
    from fedsolve.data import load_fmnist

    with pytest.raises(ValueError, match="no torchvision FashionMNIST folder at tv"):
        load_fmnist(root="tv")


def test_cifar10_batches_are_read_in_channel_order(work):
    wrote = fx.write_cifar10(work / "tv")
    p = load_cifar10("tv")
    assert p.x.shape == (40, 3, 32, 32) and p.x_test.shape == (10, 3, 32, 32)
    row = wrote["x_train"][9]          # 1024 red values, then green, then blue, each 32 rows of 32
    assert p.x[9, 1, 2, 5] == np.float32(row[1024 + 2 * 32 + 5]) / np.float32(255)
    assert p.y.tolist() == wrote["y_train"].tolist() and p.y_test.tolist() == wrote["y_test"].tolist()
    assert p.meta["class_names"][9] == "truck"
    (work / "tv" / "cifar-10-batches-py" / "data_batch_3").write_bytes(
        b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00echoq\x01\x85q\x02Rq\x03.")
    with pytest.raises(ValueError, match="refused global os.system"):
        load_cifar10("tv")


def test_cifar10_dirichlet_with_the_resnet_runs_from_the_cli(work):
    fx.write_cifar10(work / "tv")
    s = run_ok({"dataset": "cifar10", "params": {"root": "tv"}, "num_clients": 3, "partition": "dirichlet",
                "partition_params": {"alpha": 0.5, "min_size": 4}, "test_fraction": 0.25},
               {"name": "cifar_resnet", "params": {"depth": 8, "width": 4}})
    assert s["clients"] == 3 and s["dataset"] == "cifar10"


def test_cifar100_fine_and_coarse_labels_and_cli(work, capsys):
    wrote = fx.write_cifar100(work / "tv")
    fine, coarse = load_cifar100("tv"), load_cifar100("tv", labels="coarse")
    assert fine.num_classes == 100 and coarse.num_classes == 20
    assert fine.y.tolist() == wrote["fine_train"].tolist() and coarse.y_test.tolist() == wrote["coarse_test"].tolist()
    assert np.array_equal(fine.x.reshape(40, -1), wrote["x_train"] / np.float32(255))
    s = run_ok({"dataset": "cifar100", "params": {"root": "tv"}, "num_clients": 2, "partition": "dirichlet",
                "partition_params": {"alpha": 1.0, "min_size": 5}}, {"name": "cifar_resnet",
                                                                    "params": {"depth": 8, "width": 4}})
    assert s["clients"] == 2
    capsys.readouterr()
    assert run_cli({"data": {"dataset": "cifar100", "params": {"root": "nowhere"}}, "simulation": SIM,
                    "algorithm": ALGO}, "bad") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: data.params.root: no cifar-100-python/ folder") and "\n" not in err


# ------------------------------------------------------------------ LEAF
def test_femnist_natural_writer_split(work):
    wrote = fx.write_leaf_femnist(work / "femnist")
    p = load_femnist("femnist")
    users = list(wrote["train"])
    assert p.groups.tolist() == [k for k, u in enumerate(users) for _ in wrote["train"][u][1]]
    assert np.allclose(p.x[0].ravel(), wrote["train"][users[0]][0][0]) and p.num_classes == 62
    assert p.y_test.tolist() == [v for u in users for v in wrote["test"][u][1]]
    s = run_ok({"dataset": "femnist", "params": {"root": "femnist"}, "num_clients": None, "partition": "natural",
                "test_fraction": None}, {"name": "lenet", "params": {"fc_hidden": 8}})
    assert s["clients"] == 3
    assert load_femnist("femnist", users=2).groups.max() == 1


def test_shakespeare_next_character_and_char_lstm(work):
    wrote = fx.write_leaf_shakespeare(work / "shakespeare")
    p = load_shakespeare("shakespeare")
    role = list(wrote["train"])[1]
    first = int(np.flatnonzero(p.groups == 1)[0])
    assert "".join(fx.LEAF_ALPHABET[int(i)] for i in p.x[first]) == wrote["train"][role][0][0]
    assert fx.LEAF_ALPHABET[p.y[first]] == wrote["train"][role][1][0] and p.num_classes == 80
    s = run_ok({"dataset": "shakespeare", "params": {"root": "shakespeare"}, "num_clients": None,
                "partition": "natural", "test_fraction": None},
               {"name": "char_lstm", "params": {"hidden": 16, "layers": 1}})
    assert s["clients"] == 3


def test_leaf_errors_name_the_problem(work):
    fx.write_leaf_shakespeare(work / "sh")
    with pytest.raises(ValueError, match="user '[A-Z_]+': character '.' is not in the alphabet"):
        load_shakespeare("sh", vocab="abcdefghijklmnopqrstuvwxyz ")
    with pytest.raises(ValueError, match="no LEAF .json file"):
        load_femnist("missing")


# ------------------------------------------------------------------ Hugging Face and flwr-datasets
def test_hf_saved_folder_and_flwr_partitioner(work):
    pytest.importorskip("datasets", reason="the optional extra fedsolve[hf] (datasets) is not installed")
    pytest.importorskip("flwr_datasets", reason="the optional extra fedsolve[hf] (flwr-datasets) is not installed")
    from fedsolve.data import build_federated, load_hf
    from fedsolve.data.hf import flwr_partition

    dd = fx.write_hf_saved(work / "saved")
    p = load_hf(path="saved")
    assert p.x.shape == (40, 3, 8, 8) and p.x_test.shape == (12, 3, 8, 8) and p.num_classes == 3
    assert np.array_equal(p.x[5], np.asarray(dd["train"][5]["image"]).transpose(2, 0, 1) / np.float32(255))
    assert p.meta["class_names"] == ["a", "b", "c"]
    labels = np.arange(300) % 5
    parts = flwr_partition(labels, 6, np.random.default_rng(0), alpha=0.3, min_partition_size=5)
    assert sorted(np.concatenate(parts).tolist()) == list(range(300))    # every sample once
    again = flwr_partition(labels, 6, np.random.default_rng(0), alpha=0.3, min_partition_size=5)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    with pytest.raises(ValueError, match="allowed: .*DirichletPartitioner"):
        flwr_partition(labels, 6, np.random.default_rng(0), partitioner="Dirichlet")
    d = build_federated("hf", 3, "flwr", {"partitioner": "IidPartitioner"}, dataset_params={"path": "saved"})
    assert d.num_clients == 3 and int(d.train_sizes.sum() + d.test_sizes.sum()) == 52
    s = run_ok({"dataset": "hf", "params": {"path": "saved"}, "num_clients": 3, "test_fraction": None,
                "partition": "flwr", "partition_params": {"partitioner": "DirichletPartitioner", "alpha": 1.0,
                                                          "min_partition_size": 2}},
               {"name": "cifar_resnet", "params": {"depth": 8, "width": 4}})
    assert s["clients"] == 3


def test_a_target_may_return_a_hf_dataset(work):
    pytest.importorskip("datasets", reason="the optional extra fedsolve[hf] (datasets) is not installed")
    (work / "fd_hfdata.py").write_text(
        "import datasets\n\ndef make(n=30):\n"
        "    return datasets.Dataset.from_dict({'x': [[float(i), float(i % 3)] for i in range(n)],\n"
        "                                       'label': [i % 3 for i in range(n)]})\n")
    s = run_ok({"target": "fd_hfdata:make", "num_clients": 2})
    assert s["clients"] == 2
