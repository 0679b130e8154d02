"""Minibatch plans (core/plans.py) and the per-client RNG streams they are drawn from (core/rng.py).

Every committed result depends on these streams, so a faster ``build_plans`` must give bitwise the plans of
the original per-client loop. ``reference_build_plans`` below IS that specification (a frozen copy of the
algorithm, with its own seeding from ``numpy.random.SeedSequence``); the pinned values guard against both
changing together.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from fedsolve.core.plans import Work, build_plans
from fedsolve.core.rng import RngStreams


# ---------------------------------------------------------------- the specification (frozen, do not optimize)

def _ref_key(x: object) -> int:
    if isinstance(x, (int, np.integer)):
        return int(x) & 0xFFFFFFFF
    return int.from_bytes(hashlib.blake2b(str(x).encode(), digest_size=4).digest(), "little")


def _ref_generator(seed: int, stream: str, *keys: object) -> np.random.Generator:
    """Client stream ``(seed, stream, *keys)``: PCG64 seeded by a SeedSequence of the 32-bit keys."""
    seq = np.random.SeedSequence([seed, _ref_key(stream), *(_ref_key(k) for k in keys)])
    return np.random.Generator(np.random.PCG64(seq))


def _ref_stack(per_client: list) -> tuple[torch.Tensor, torch.Tensor]:
    S = max(len(b) for _, _, b in per_client)
    B = max(bs for _, bs, _ in per_client)
    K = len(per_client)
    idx = np.zeros((K, S, B), dtype=np.int64)
    w = np.zeros((K, S, B), dtype=np.float32)
    for k, (a, bs, batches) in enumerate(per_client):
        for s, b in enumerate(batches):
            idx[k, s, :len(b)] = a + b
            idx[k, s, len(b):] = a
            w[k, s, :len(b)] = 1.0 / len(b)
    return torch.from_numpy(idx), torch.from_numpy(w)


def _ref_group_rows(groups, phase, name, a, n, cid):
    if groups is None:
        raise ValueError(f"work phase {phase!r} draws from row group {name!r}, but the data has no train_groups")
    gids, names = groups
    if name not in names:
        raise ValueError(f"work phase {phase!r}: unknown row group {name!r}; allowed: {list(names)}")
    rows = torch.nonzero(gids[a:a + n] == names.index(name)).flatten().numpy()
    if rows.size == 0:
        raise ValueError(f"client {cid} has no training samples in row group {name!r} (phase {phase!r})")
    return rows


def reference_build_plans(work, offsets, ids, seed, round_, scale=None, groups=None):
    """``{phase: (idx, w, active, fixed)}``: the per-client loop every committed result was drawn with."""
    ids = ids.cpu()
    sizes = (offsets[1:] - offsets[:-1])[ids].tolist()
    starts = offsets[:-1][ids].tolist()
    cids = ids.tolist()
    out = {}
    for phase, wk in work.items():
        per_client, fixed = [], True
        for k, (cid, n_all, a) in enumerate(zip(cids, sizes, starts)):
            if n_all <= 0:
                raise ValueError(f"client {cid} has no training samples")
            rows = None if wk.group is None else _ref_group_rows(groups, phase, wk.group, a, n_all, cid)
            n = n_all if rows is None else int(rows.size)
            bs = n if wk.batch_size is None else min(wk.batch_size, n)
            per_epoch = math.ceil(n / bs)
            steps = wk.steps if wk.steps is not None else max(1, math.ceil(wk.epochs * per_epoch))
            if scale is not None:
                steps = max(1, int(round(steps * float(scale[k]))))
            if bs == n:
                batches = [np.arange(n) if rows is None else rows] * steps
            else:
                g = _ref_generator(seed, "batches", round_, cid, phase)
                batches = []
                while len(batches) < steps:
                    order = g.permutation(n)
                    batches.extend(order[b0:b0 + bs] for b0 in range(0, n, bs))
                batches = batches[:steps]
                if rows is not None:
                    batches = [rows[b] for b in batches]
            fixed = fixed and bs == n
            per_client.append((a, bs, batches))
        S = max(len(b) for _, _, b in per_client)
        act = torch.zeros((len(per_client), S), dtype=torch.bool)
        for k, (_, _, batches) in enumerate(per_client):
            act[k, :len(batches)] = True
        idx, w = _ref_stack(per_client)
        out[phase] = (idx, w, act, fixed)
    return out


# ---------------------------------------------------------------- helpers

def assert_same_plans(work, offsets, ids, seed, round_, scale=None, groups=None):
    ref = reference_build_plans(work, offsets, ids, seed, round_, scale, groups)
    got = build_plans(work, offsets, ids, RngStreams(seed), round_, scale, groups)
    assert list(got) == list(ref)
    for phase, (idx, w, act, fixed) in ref.items():
        p = got[phase]
        assert p.fixed == fixed, phase
        for name, a, b in (("active", p.active, act), ("idx", p.idx, idx), ("w", p.w, w)):
            assert a.dtype == b.dtype and a.shape == b.shape, (phase, name, a.shape, b.shape)
            assert torch.equal(a, b), (phase, name)
    return got


def random_case(rng: np.random.Generator):
    """Clients of different sizes (some with a single row), a random subset in random order, phases mixing full
    batch, minibatches (epochs, steps, short last batches, batch >= n), row groups, and variable work."""
    m = int(rng.integers(1, 12))
    sizes = rng.integers(1, 40, m)
    sizes[rng.random(m) < 0.15] = 1
    offsets = torch.as_tensor(np.concatenate([[0], np.cumsum(sizes)]), dtype=torch.long)
    K = int(rng.integers(1, m + 1))
    ids = torch.as_tensor(rng.permutation(m)[:K], dtype=torch.long)
    names = ("lower", "upper", "val")
    gids = rng.integers(0, 3, int(sizes.sum()))
    for i in range(m):  # every client has at least one row of every group (else the reference raises)
        a = int(offsets[i])
        if sizes[i] >= 3:
            gids[a:a + 3] = rng.permutation(3)
    with_groups = bool(np.all(sizes >= 3)) and rng.random() < 0.6
    work = {}
    for p in range(int(rng.integers(1, 4))):
        kind = rng.integers(0, 4)
        bs = None if kind == 0 else int(rng.integers(1, 45))
        if kind == 3 or rng.random() < 0.3:
            wk = Work(steps=int(rng.integers(1, 30)), batch_size=bs)
        else:
            wk = Work(epochs=float(rng.choice([0.05, 0.4, 1.0, 1.7, 2.0, 3.3])), batch_size=bs)
        if with_groups and rng.random() < 0.5:
            wk = Work(epochs=wk.epochs, steps=wk.steps, batch_size=wk.batch_size, group=str(rng.choice(names)))
        work[f"phase{p}"] = wk
    scale = None
    if rng.random() < 0.4:
        scale = torch.as_tensor(rng.uniform(0.05, 1.0, K))
        scale[torch.as_tensor(rng.random(K) < 0.2)] = 0.5  # ties of round(steps * 0.5): half to even
    groups = (torch.as_tensor(gids), names) if with_groups else None
    seed = int(rng.choice([0, 1, 7, 2**31 + 3, 2**33 + 11, 2**70 + 5]))
    round_ = int(rng.choice([0, 1, 5, 123456, 2**32 + 9]))
    return work, offsets, ids, seed, round_, scale, groups


# ---------------------------------------------------------------- tests

def test_pinned_streams():
    """Numbers drawn by the original loop at the time of the change: both the reference and build_plans must
    keep them (a numpy update that changed PCG64 or SeedSequence would fail here)."""
    off = torch.arange(6) * 600
    p = build_plans({"train": Work(epochs=1, batch_size=50)}, off, torch.tensor([4, 1]), RngStreams(0), 3)["train"]
    assert p.idx.shape == (2, 12, 50)
    assert p.idx[0, 0, :8].tolist() == [2673, 2737, 2848, 2895, 2628, 2857, 2972, 2573]
    assert p.idx[1, 11, -5:].tolist() == [719, 952, 1185, 1107, 753]
    off = torch.tensor([0, 7, 20, 31])
    for plans in (build_plans({"a": Work(epochs=2.5, batch_size=4)}, off, torch.tensor([2, 0, 1]),
                              RngStreams(2**40 + 5), 11)["a"],):
        digest = hashlib.sha256(plans.idx.numpy().tobytes() + plans.w.numpy().tobytes()
                                + plans.active.numpy().tobytes()).hexdigest()[:16]
        assert plans.idx.shape == (3, 10, 4) and digest == "cf0d466c67cb2398"
    ref = reference_build_plans({"a": Work(epochs=2.5, batch_size=4)}, off, torch.tensor([2, 0, 1]), 2**40 + 5, 11)
    idx, w, act, _ = ref["a"]
    assert hashlib.sha256(idx.numpy().tobytes() + w.numpy().tobytes()
                          + act.numpy().tobytes()).hexdigest()[:16] == "cf0d466c67cb2398"


@pytest.mark.parametrize("case_seed", range(40))
def test_random_cases_match_the_reference_bitwise(case_seed):
    rng = np.random.default_rng(1000 + case_seed)
    for _ in range(5):
        assert_same_plans(*random_case(rng))


def test_mnist_shape_and_duplicates_and_large_client_ids():
    # the benchmark's shape: 600 rows each, batch 50, one epoch (12 full batches, no short one)
    off = torch.arange(31) * 600
    assert_same_plans({"train": Work(epochs=1, batch_size=50)}, off, torch.tensor([29, 3, 0, 17]), 0, 2)
    # a short last batch of each epoch (37 = 3 * 10 + 7), three epochs, and a repeated client id
    off = torch.tensor([0, 37, 74, 80])
    assert_same_plans({"t": Work(epochs=3, batch_size=10), "s": Work(steps=9, batch_size=10)}, off,
                      torch.tensor([1, 0, 1, 2]), 5, 9)
    # client ids past 2^32 are keyed mod 2^32 (offsets only need to cover them sparsely: use a big tensor view)
    off = torch.arange(5) * 9
    assert_same_plans({"t": Work(epochs=1.5, batch_size=4)}, off, torch.tensor([3, 2]), 3, 2**32 + 1)


@pytest.mark.parametrize("work", [Work(steps=4, batch_size=50), Work(steps=3, batch_size=50),
                                  Work(epochs=2, batch_size=50), Work(steps=5, batch_size=25)])
def test_regular_full_batches_of_clients_of_different_sizes(work):
    """Every step a full batch (n a multiple of the batch): the stack is a reshape of the passes (or a gather
    when passes are longer than the steps) -- the same plans as the general path."""
    off = torch.tensor([0, 100, 300, 400, 600])
    assert_same_plans({"t": work}, off, torch.tensor([3, 1, 0, 2]), 2, 6)


def test_full_batch_phase_is_fixed_and_identical_every_step():
    off = torch.tensor([0, 5, 12, 13])
    got = assert_same_plans({"fb": Work(steps=4), "big": Work(epochs=2, batch_size=50)}, off,
                            torch.tensor([2, 0, 1]), 0, 0, scale=torch.tensor([1.0, 0.5, 0.3], dtype=torch.float64))
    fb = got["fb"]
    assert fb.fixed and got["big"].fixed
    assert fb.active.sum(1).tolist() == [4, 2, 1]
    assert fb.idx[1, 0].tolist() == [0, 1, 2, 3, 4, 0, 0] and fb.w[1, 0, 0].item() == pytest.approx(0.2)
    assert fb.idx[1, 2].tolist() == [0] * 7 and fb.w[1, 2].sum().item() == 0  # past the client's steps: zeros


def test_mixed_full_and_minibatch_clients_in_one_phase():
    """A client smaller than the batch runs full batch (no RNG) while the others draw: the phase is not fixed."""
    off = torch.tensor([0, 3, 40, 90])
    got = assert_same_plans({"t": Work(epochs=1, batch_size=8)}, off, torch.tensor([0, 1, 2]), 4, 1)
    assert not got["t"].fixed


def test_groups_match_the_reference_and_errors_are_unchanged():
    rng = np.random.default_rng(0)
    sizes = np.array([8, 11, 6, 15])
    off = torch.as_tensor(np.concatenate([[0], np.cumsum(sizes)]))
    gids = torch.as_tensor(rng.integers(0, 2, int(sizes.sum())))
    gids[off[:-1]] = 0
    gids[off[:-1] + 1] = 1
    groups = (gids, ("lower", "upper"))
    work = {"up": Work(epochs=2, batch_size=2, group="upper"), "low": Work(steps=3, group="lower"),
            "all": Work(epochs=1, batch_size=3)}
    assert_same_plans(work, off, torch.tensor([3, 1, 0, 2]), 0, 4, groups=groups)
    with pytest.raises(ValueError, match="unknown row group 'mid'.*allowed: \\['lower', 'upper'\\]"):
        build_plans({"p": Work(group="mid")}, off, torch.arange(2), RngStreams(0), 0, groups=groups)
    with pytest.raises(ValueError, match="work phase 'p' draws from row group 'upper', but the data has no"):
        build_plans({"p": Work(group="upper")}, off, torch.arange(2), RngStreams(0), 0)
    empty = (torch.zeros_like(gids), ("lower", "upper"))
    with pytest.raises(ValueError, match="client 2 has no training samples in row group 'upper' \\(phase 'p'\\)"):
        build_plans({"p": Work(group="upper", batch_size=2)}, off, torch.tensor([2, 0]), RngStreams(0), 0,
                    groups=empty)
    with pytest.raises(ValueError, match="client 1 has no training samples"):
        build_plans({"p": Work(batch_size=2)}, torch.tensor([0, 4, 4, 9]), torch.tensor([0, 1, 2]),
                    RngStreams(0), 0)


@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1, 2**32, 2**64 + 3, 2**100 + 7])
def test_rng_client_generators_are_the_keyed_streams(seed):
    """``RngStreams.numpy_each`` seeds one generator per key exactly as ``RngStreams.numpy`` (SeedSequence + PCG64)
    would, for the varying key at any position."""
    r = RngStreams(seed)
    cids = np.array([0, 1, 5, 2**31, 2**32 - 1, 2**32 + 4, 123456789], dtype=np.int64)
    for keys in (("batches", 3, cids, "train"), ("b", cids), ("x", cids, 7, 8, 9, "y")):
        got = []
        for i, g in r.numpy_each(*keys):
            got.append((i, g.bit_generator.state, g.integers(0, 2**62, 3).tolist()))
        assert [i for i, _, _ in got] == list(range(len(cids)))
        for (i, state, draws), cid in zip(got, cids.tolist()):
            one = tuple(cid if isinstance(k, np.ndarray) else k for k in keys)
            expected = _ref_generator(seed, *one)
            assert state == expected.bit_generator.state
            assert draws == expected.integers(0, 2**62, 3).tolist()
            assert r.numpy(*one).bit_generator.state == _ref_generator(seed, *one).bit_generator.state
