"""RNG streams: one seed fixes partition, sampling, initialization and minibatches.

Every random draw is derived from ``(seed, stream name, *keys)`` (e.g. ``("batches", round,
client)``) through ``numpy.random.SeedSequence``. Nothing depends on generator state carried
across rounds, so a resumed run and an uninterrupted one draw the same numbers, and the
sequential and vectorized executors see identical minibatches.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def _key(x: object) -> int:
    if isinstance(x, (int, np.integer)):
        return int(x) & 0xFFFFFFFF
    return int.from_bytes(hashlib.blake2b(str(x).encode(), digest_size=4).digest(), "little")


class RngStreams:
    """Named, keyed random streams derived from one seed."""

    def __init__(self, seed: int):
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed = int(seed)

    def _seq(self, stream: str, *keys: object) -> np.random.SeedSequence:
        return np.random.SeedSequence([self.seed, _key(stream), *(_key(k) for k in keys)])

    def numpy(self, stream: str, *keys: object) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(self._seq(stream, *keys)))

    def torch(self, stream: str, *keys: object, device: str | torch.device = "cpu") -> torch.Generator:
        g = torch.Generator(device=device)
        g.manual_seed(int(self._seq(stream, *keys).generate_state(1, np.uint64)[0] & 0x7FFF_FFFF_FFFF_FFFF))
        return g

    def seed_for(self, stream: str, *keys: object) -> int:
        return int(self._seq(stream, *keys).generate_state(1, np.uint32)[0])
