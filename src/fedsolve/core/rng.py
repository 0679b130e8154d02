"""RNG streams: one seed fixes partition, sampling, initialization and minibatches.

Every random draw is derived from ``(seed, stream name, *keys)`` (e.g. ``("batches", round,
client)``) through ``numpy.random.SeedSequence``. Nothing depends on generator state carried
across rounds, so a resumed run and an uninterrupted one draw the same numbers, and the
sequential and vectorized executors see identical minibatches.

:meth:`RngStreams.numpy_each` gives the same generators as :meth:`RngStreams.numpy` for many values of one key
(e.g. every selected client of a round) at a fraction of the cost: the SeedSequence hash (numpy's
``SeedSequence.mix_entropy`` and ``generate_state``, both 32-bit multiply-xorshift hashes) runs vectorized over
the keys, PCG64's seeding (``pcg64_set_seed``: ``inc = 2 seq + 1``, ``state = (inc + init) M + inc``
mod 2^128) runs on Python integers, and one generator is re-seeded per key by setting its state.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF
# numpy's SeedSequence constants (numpy/random/bit_generator.pyx) and PCG64's 128-bit multiplier (pcg64.h)
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R, _XSHIFT = 0xCA01F9DD, 0x4973F715, 16
_POOL_SIZE = 4
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341
_MASK128 = (1 << 128) - 1


def _int_words(n: int) -> list[int]:
    """A non-negative int as SeedSequence's entropy words (little-endian 32-bit words; 0 is one word)."""
    words = [n & _MASK32]
    while n > _MASK32:
        n >>= 32
        words.append(n & _MASK32)
    return words


def _seed_seq_state(entropy: list[int | np.ndarray]) -> np.ndarray:
    """``SeedSequence(words).generate_state(4, np.uint64)`` for every column: ``entropy`` lists 32-bit words,
    each an int or a ``[K]`` uint32 array (one value per key). Returns ``[4, K]`` uint64."""
    K = next(len(w) for w in entropy if isinstance(w, np.ndarray))
    words = [np.full(K, w, np.uint32) if not isinstance(w, np.ndarray) else w.astype(np.uint32) for w in entropy]
    h = _INIT_A

    def hashmix(v: np.ndarray) -> np.ndarray:
        nonlocal h
        v = v ^ np.uint32(h)
        h = (h * _MULT_A) & _MASK32
        v = v * np.uint32(h)
        return v ^ (v >> np.uint32(_XSHIFT))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        r: np.ndarray = np.uint32(_MIX_MULT_L) * x - np.uint32(_MIX_MULT_R) * y
        return r ^ (r >> np.uint32(_XSHIFT))

    zero = np.zeros(K, np.uint32)
    pool = [hashmix(words[i] if i < len(words) else zero) for i in range(_POOL_SIZE)]
    for src in range(_POOL_SIZE):
        for dst in range(_POOL_SIZE):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL_SIZE, len(words)):
        for dst in range(_POOL_SIZE):
            pool[dst] = mix(pool[dst], hashmix(words[src]))
    h = _INIT_B
    out = []
    for i in range(8):  # 4 uint64 = 8 uint32 words, cycling over the pool
        v = pool[i % _POOL_SIZE] ^ np.uint32(h)
        h = (h * _MULT_B) & _MASK32
        v = v * np.uint32(h)
        out.append((v ^ (v >> np.uint32(_XSHIFT))).astype(np.uint64))
    return np.stack([out[2 * j] | (out[2 * j + 1] << np.uint64(32)) for j in range(4)])


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

    @staticmethod
    def key(x: object) -> int:
        """The 32-bit entropy word of one key (an int's low 32 bits, a string's hash): ``numpy_each`` takes an
        array of these where a key varies and is not an int (e.g. a phase name)."""
        return _key(x)

    def numpy_each(self, stream: str, *keys: object) -> Iterator[tuple[int, np.random.Generator]]:
        """``(i, generator)`` for each position ``i`` of the integer-array keys (one or more 1-D arrays of one
        length; an int array's values are taken as :meth:`key` takes ints): the generator is ``numpy(stream, *keys
        with each array's value i)`` (the same PCG64 state). ONE generator object is re-seeded per ``i``: draw
        from it before taking the next."""
        arrays = [k for k in keys if isinstance(k, np.ndarray)]
        if not arrays or any(
            not np.issubdtype(a.dtype, np.integer) or a.ndim != 1 or a.shape != arrays[0].shape for a in arrays
        ):
            raise ValueError("numpy_each: give one or more keys as 1-D integer numpy arrays of one length")
        if arrays[0].size == 0:
            return
        entropy: list[int | np.ndarray] = [*_int_words(self.seed), _key(stream)]
        entropy += [
            (k.astype(np.uint64) & np.uint64(_MASK32)).astype(np.uint32) if isinstance(k, np.ndarray) else _key(k)
            for k in keys
        ]
        s0, s1, q0, q1 = _seed_seq_state(entropy).tolist()
        bit_gen = np.random.PCG64(0)
        gen = np.random.Generator(bit_gen)
        for i in range(len(s0)):
            inc = (((q0[i] << 64) | q1[i]) << 1 | 1) & _MASK128
            state = ((inc + ((s0[i] << 64) | s1[i])) * _PCG_MULT + inc) & _MASK128
            bit_gen.state = {
                "bit_generator": "PCG64",
                "state": {"state": state, "inc": inc},
                "has_uint32": 0,
                "uinteger": 0,
            }
            yield i, gen

    def torch(self, stream: str, *keys: object, device: str | torch.device = "cpu") -> torch.Generator:
        g = torch.Generator(device=device)
        g.manual_seed(int(self._seq(stream, *keys).generate_state(1, np.uint64)[0] & 0x7FFF_FFFF_FFFF_FFFF))
        return g

    def seed_for(self, stream: str, *keys: object) -> int:
        return int(self._seq(stream, *keys).generate_state(1, np.uint32)[0])


# ------------------------------------------------------------------ counter-based draws inside local updates
_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """``x * m mod 2^32`` for int64 ``x`` in [0, 2^32): the constant split in 16-bit halves, so no product leaves
    int64's range."""
    lo, hi = m & 0xFFFF, m >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply, the ``lowbias32`` constants) of int64 values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_uniform(keys: Sequence[torch.Tensor | int], shape: Sequence[int], dtype=torch.float32) -> torch.Tensor:
    """Uniform numbers in (0, 1) of ``shape``, a pure function of the integer ``keys`` (e.g. the run's salt, the
    round, the client, the local step) and the position: no generator state, so a ``local_update`` may draw them
    (e.g. FedCP's Gumbel noise) and every client, executor and resumed run gets the same numbers. The keys may be
    0-dimensional tensors (a client's id inside a local update) or ints; 32 bits of resolution."""
    device = next((k.device for k in keys if isinstance(k, torch.Tensor)), None)
    k = torch.zeros((), dtype=torch.int64, device=device)
    for key in keys:
        k = _mix32(k ^ (torch.as_tensor(key, device=device).to(torch.int64) & _M32) ^ 0x9E3779B9)
    pos = torch.arange(math.prod(shape), dtype=torch.int64, device=device)
    return open_unit(_mix32(_mix32(pos ^ 0x85EBCA6B) ^ k), dtype).reshape(tuple(shape))


def open_unit(h: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """32-bit integers ``h`` as numbers strictly inside (0, 1) in ``dtype``: ``(h + 1/2) / 2^32``, the top values
    kept below 1 where ``dtype`` would round them to 1 (float32 above 1 - 2^-25), so that ``log(1 - u)`` and
    ``log(-log u)`` stay finite."""
    u = (h.to(torch.float64) + 0.5) / 2.0**32
    return u.clamp(max=1.0 - torch.finfo(dtype).eps / 2).to(dtype)
