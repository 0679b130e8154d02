"""Domain data with a labelled target validation set: what tuning scores on in unsupervised domain adaptation.

The training rows of domain data (``fedsolve.data.domains``) are labelled source rows and UNLABELLED target rows
(``y = -1``), so the held-out training rows that :meth:`FederatedData.split_validation` scores elsewhere cannot
measure target accuracy. :class:`DomainData` carries a separate labelled set of target images (``validation_x``,
``validation_y``), disjoint from the training and the test images, and its :meth:`DomainData.split_validation`
scores on it: the tuning runs of a config's ``tune:`` section train on the training rows less the held-out share
of every client (as for any data) and are scored on the target validation images, split over the clients as the
test set is (the mean over clients is the target validation accuracy). Choosing a hyper-parameter on labelled
target images is the "oracle" selection of domain-adaptation benchmarks: it uses labels an unsupervised user
would not have, never the test images.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from .federated import FederatedData

__all__ = ["DomainData"]


@dataclass
class DomainData(FederatedData):
    """:class:`FederatedData` of a domain pair plus ``validation_x`` / ``validation_y``: labelled target images
    kept for tuning (never trained on, never scored as the test set); ``None`` when the pair has none."""

    validation_x: Tensor | None = None
    validation_y: Tensor | None = None

    @classmethod
    def of(cls, data: FederatedData, validation: tuple | None) -> DomainData:
        """``data`` with the labelled target validation pair ``validation`` (``(x, y)`` arrays, or None)."""
        vx, vy = (
            (None, None)
            if validation is None
            else (
                torch.as_tensor(np.asarray(validation[0]), dtype=data.train_x.dtype),
                torch.as_tensor(np.asarray(validation[1]), dtype=torch.long),
            )
        )
        return cls(**{f.name: getattr(data, f.name) for f in fields(FederatedData)}, validation_x=vx, validation_y=vy)

    def split_validation(self, fraction: float = 0.2, seed: int = 0) -> FederatedData:
        """The validation problem of tuning: every client trains on its training rows less a held-out
        ``fraction`` (at random, ``seed``; :meth:`FederatedData.split_validation`) and is scored on its share of
        the labelled target validation images (split over the clients at random, ``seed``)."""
        if self.validation_x is None or self.validation_y is None or len(self.validation_y) == 0:
            raise ValueError(
                f"tune: the domain data {self.name!r} has no labelled target validation images "
                f"(its target training rows are unlabelled); allowed: a domain dataset built with a "
                f"validation set (mnist_mnistm: data.params.val_limit)"
            )
        rest = super().split_validation(fraction, seed)
        rng = np.random.default_rng(20_000 + seed)
        parts = np.array_split(rng.permutation(len(self.validation_y)), self.num_clients)
        order = torch.as_tensor(np.concatenate(parts), dtype=torch.long)
        return replace(
            rest,
            test_x=self.validation_x[order].to(rest.train_x.dtype),
            test_y=self.validation_y[order],
            test_offsets=torch.as_tensor(np.cumsum([0] + [len(p) for p in parts]), dtype=torch.long),
            meta={**rest.meta, "test": "target validation images (labelled, disjoint from training and test)"},
        )

    def with_dtype(self, dtype: torch.dtype) -> DomainData:
        out = super().with_dtype(dtype)
        vx = None if self.validation_x is None else self.validation_x.to(dtype)
        return DomainData.of(out, None if vx is None else (vx, self.validation_y))
