"""Datasets, partitions among clients, and class-imbalance measures (see docs/data.md)."""

from secure_fl.data.datasets import (
    CIFAR10_ENV,
    DATASETS,
    FASHION_MNIST_ENV,
    Dataset,
    load_dataset,
    stratified_split,
)
from secure_fl.data.errors import (
    DataError,
    DatasetNotFoundError,
    InfeasiblePartitionError,
    PartitionParameterError,
    UnknownDatasetError,
)
from secure_fl.data.imbalance import (
    class_distribution,
    cosine_similarity_to_global,
    emd,
    emd_avg,
    global_counts,
    global_imbalance,
    l1_to_uniform,
    local_imbalance,
)
from secure_fl.data.partition import (
    PARTITIONERS,
    DubheProfile,
    Partition,
    climb_partition,
    dirichlet_partition,
    dubhe_partition,
    half_normal_class_sizes,
    keep_minority,
    ratio_loss_partition,
)

__all__ = [
    "CIFAR10_ENV",
    "DATASETS",
    "FASHION_MNIST_ENV",
    "PARTITIONERS",
    "DataError",
    "Dataset",
    "DatasetNotFoundError",
    "DubheProfile",
    "InfeasiblePartitionError",
    "Partition",
    "PartitionParameterError",
    "UnknownDatasetError",
    "class_distribution",
    "climb_partition",
    "cosine_similarity_to_global",
    "dirichlet_partition",
    "dubhe_partition",
    "emd",
    "emd_avg",
    "global_counts",
    "global_imbalance",
    "half_normal_class_sizes",
    "keep_minority",
    "l1_to_uniform",
    "load_dataset",
    "local_imbalance",
    "ratio_loss_partition",
    "stratified_split",
]
