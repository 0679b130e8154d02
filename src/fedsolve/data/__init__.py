"""Federated data: containers, partitioners, synthetic generators, real-data fetchers and the builder."""

from .datasets import (DATASETS, HAPT_ACTIVITIES, HAPT_LABELS, PooledData, build_federated, housing_bodyfat,
                       load_breast_cancer, load_dataset, load_digits, load_fmnist, load_hapt, load_housing,
                       load_mnist, stratified_split)
from .domains import DOMAIN_DATASETS
from .federated import FederatedData
from .fetch import FetchError, cache_dir, fetch, is_cached, load_npz
from .partition import (CLUSTER_TRANSFORMS, PARTITIONERS, cluster_blocks, dirichlet, get_partitioner, iid,
                        label_swap, lognormal, natural, partition, rotate_images, rotation, shards)
from .synthetic import FPFC_SCENARIOS, clustered_regression, fedprox_synthetic, fpfc_synthetic, toy1d

DATASETS.update(DOMAIN_DATASETS)   # the domain-adaptation pairs (FedMM) join the registry by name

__all__ = [
    "FederatedData", "PooledData", "DATASETS", "build_federated", "load_dataset", "stratified_split",
    "load_digits", "load_breast_cancer", "load_mnist", "load_fmnist", "load_hapt", "load_housing",
    "housing_bodyfat", "HAPT_LABELS", "HAPT_ACTIVITIES",
    "PARTITIONERS", "CLUSTER_TRANSFORMS", "get_partitioner", "partition", "iid", "dirichlet", "shards",
    "lognormal", "natural", "cluster_blocks", "label_swap", "rotation", "rotate_images",
    "FPFC_SCENARIOS", "fpfc_synthetic", "toy1d", "clustered_regression", "fedprox_synthetic",
    "FetchError", "cache_dir", "fetch", "is_cached", "load_npz",
]
