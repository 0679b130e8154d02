"""Federated data: containers, partitioners, synthetic generators, real-data fetchers and the builder."""

from .datasets import (
    DATASETS,
    HAPT_ACTIVITIES,
    HAPT_LABELS,
    PooledData,
    build_federated,
    federate,
    housing_bodyfat,
    load_breast_cancer,
    load_dataset,
    load_digits,
    load_fmnist,
    load_hapt,
    load_housing,
    load_mnist,
    stratified_split,
)
from .domains import DOMAIN_DATASETS
from .federated import FederatedData
from .fetch import FetchError, cache_dir, fetch, is_cached, load_npz
from .files import ImageFolder, load_csv, load_image_folder, load_npz_file
from .hf import flwr_partition, load_hf, pooled_from_hf
from .leaf import load_femnist, load_shakespeare
from .partition import (
    CLUSTER_TRANSFORMS,
    PARTITIONERS,
    cluster_blocks,
    dirichlet,
    get_partitioner,
    iid,
    label_swap,
    lognormal,
    natural,
    partition,
    rotate_images,
    rotation,
    shards,
)
from .standard import load_cifar10, load_cifar100
from .synthetic import FPFC_SCENARIOS, clustered_regression, fedprox_synthetic, fpfc_synthetic, toy1d
from .torch_data import federated_from_client_datasets, materialize, pooled_from_dataset, transform_samples

DATASETS.update(DOMAIN_DATASETS)  # the domain-adaptation pairs (FedMM) join the registry by name
DATASETS.update(
    {  # the front door: own files, torchvision's folders, LEAF's files, Hugging Face datasets
        "image_folder": (load_image_folder, "own images in class subfolders root/<class>/*.png|jpg|... (root=)"),
        "csv": (load_csv, "own table: numeric feature columns, a label column, optional client column (path=, label=)"),
        "npz": (load_npz_file, "own arrays x, y (optional client, x_test, y_test) in an .npz file (path=)"),
        "cifar10": (load_cifar10, "CIFAR-10 50k/10k [3,32,32] from torchvision's folder root/cifar-10-batches-py/"),
        "cifar100": (load_cifar100, "CIFAR-100 50k/10k [3,32,32], 100 fine or 20 coarse classes, torchvision's folder"),
        "femnist": (load_femnist, "LEAF FEMNIST JSON [1,28,28], 62 classes, writers = natural clients (root=)"),
        "shakespeare": (load_shakespeare, "LEAF Shakespeare JSON, 80-char sequences -> next char, roles = clients"),
        "hf": (load_hf, "a Hugging Face dataset: saved folder (path=) or hub name (name=); extra fedsolve[hf]"),
    }
)
PARTITIONERS["flwr"] = (
    flwr_partition,
    "any flwr-datasets partitioner (partitioner=DirichletPartitioner, ...) "
    "with its parameters beside it (alpha=, min_partition_size=, ...); extra "
    "fedsolve[hf]",
)

__all__ = [
    "FederatedData",
    "PooledData",
    "DATASETS",
    "build_federated",
    "load_dataset",
    "stratified_split",
    "load_digits",
    "load_breast_cancer",
    "load_mnist",
    "load_fmnist",
    "load_hapt",
    "load_housing",
    "housing_bodyfat",
    "HAPT_LABELS",
    "HAPT_ACTIVITIES",
    "PARTITIONERS",
    "CLUSTER_TRANSFORMS",
    "get_partitioner",
    "partition",
    "iid",
    "dirichlet",
    "shards",
    "lognormal",
    "natural",
    "cluster_blocks",
    "label_swap",
    "rotation",
    "rotate_images",
    "FPFC_SCENARIOS",
    "fpfc_synthetic",
    "toy1d",
    "clustered_regression",
    "fedprox_synthetic",
    "FetchError",
    "cache_dir",
    "fetch",
    "is_cached",
    "load_npz",
    "federate",
    "materialize",
    "pooled_from_dataset",
    "federated_from_client_datasets",
    "transform_samples",
    "ImageFolder",
    "load_image_folder",
    "load_csv",
    "load_npz_file",
    "load_cifar10",
    "load_cifar100",
    "load_femnist",
    "load_shakespeare",
    "load_hf",
    "pooled_from_hf",
    "flwr_partition",
]
