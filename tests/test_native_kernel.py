"""The compiled softmax-GD kernel (core/kernels/softmax_gd.c) against autograd and the torch path."""

from __future__ import annotations

import importlib
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F

from fedsolve.core import native
from fedsolve.core.linear import LinearGDExecutor, with_bias_feature

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")


def _data(sizes, classes, feats=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(sum(sizes), feats, generator=g) * 2 - 0.5
    y = torch.randint(0, classes, (sum(sizes),), generator=g)
    off = torch.tensor([0] + sizes).cumsum(0)
    return with_bias_feature(X), y, off


def _reference(X, y, off, ids, A, steps, Z=None, lr=0.0, rho=0.0, wd=0.0):
    """Plain autograd GD, one client at a time, in float64: the definition the kernel must match."""
    outA, outL = [], []
    for p, i in enumerate(ids.tolist()):
        a = A[p].double().clone()
        xs, ys = X[off[i]:off[i + 1]].double(), y[off[i]:off[i + 1]]
        losses = []
        for _ in range(int(steps[p])):
            a.requires_grad_(True)
            loss = F.cross_entropy(xs @ a.T, ys)
            (g,) = torch.autograd.grad(loss, a)
            a = a.detach()
            g = g + wd * a + (rho * (a - Z[p].double()) if Z is not None else 0.0)
            losses.append(loss.item())
            a = a - lr * g
        outA.append(a)
        outL.append(sum(losses) / len(losses) if losses else 0.0)
    return torch.stack(outA), torch.tensor(outL, dtype=torch.float64)


@needs_cc
@pytest.mark.parametrize("classes", [2, 3, 10, 17])
def test_gradient_and_loss_match_autograd(classes):
    sizes = [1, 15, 16, 17, 40, 203]                    # block edges: padding rows must count for nothing
    X, y, off = _data(sizes, classes)
    lib = native.softmax_gd_kernel(classes)
    assert lib is not None
    sd = native.SoftmaxData(lib, X, y, off, classes)
    ids = torch.tensor([5, 0, 3, 1, 4, 2])
    A = torch.randn(len(ids), classes, X.shape[1], generator=torch.Generator().manual_seed(1))
    loss, G = sd.run(ids, A, grad=True)
    for p, i in enumerate(ids.tolist()):
        a = A[p].double().requires_grad_(True)
        ref = F.cross_entropy(X[off[i]:off[i + 1]].double() @ a.T, y[off[i]:off[i + 1]])
        (g,) = torch.autograd.grad(ref, a)
        assert abs(float(loss[p]) - ref.item()) < 2e-6 * max(1.0, ref.item())
        torch.testing.assert_close(G[p].double(), g, atol=2e-6, rtol=1e-5)


@needs_cc
def test_gd_steps_anchor_decay_and_variable_work():
    sizes = [9, 33, 120, 64, 5]
    X, y, off = _data(sizes, 4, feats=5, seed=2)
    sd = native.SoftmaxData(native.softmax_gd_kernel(4), X, y, off, 4)
    g = torch.Generator().manual_seed(3)
    ids = torch.tensor([4, 2, 0, 3])
    A = torch.randn(4, 4, 6, generator=g) * 0.3
    Z = torch.randn(4, 4, 6, generator=g) * 0.3
    steps = torch.tensor([3, 0, 7, 1])                  # a client with no step keeps its start, loss 0
    A_n, L_n = sd.run(ids, A, steps, Z, lr=0.2, rho=0.7, wd=0.05)
    A_r, L_r = _reference(X, y, off, ids, A, steps, Z, lr=0.2, rho=0.7, wd=0.05)
    torch.testing.assert_close(A_n.double(), A_r, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(L_n, L_r, atol=2e-6, rtol=1e-5)
    assert torch.equal(A_n[1], A[1]) and float(L_n[1]) == 0.0


@needs_cc
def test_extreme_logits_stay_finite_and_exact():
    """Margins of hundreds: the loss is log-sum-exp exact (no clamped probabilities), no NaN."""
    X, y, off = _data([50], 3, feats=4, seed=4)
    sd = native.SoftmaxData(native.softmax_gd_kernel(3), X, y, off, 3)
    A = torch.randn(1, 3, 5, generator=torch.Generator().manual_seed(5)) * 300
    loss, G = sd.run(torch.tensor([0]), A, grad=True)
    ref = F.cross_entropy(X.double() @ A[0].double().T, y)
    assert torch.isfinite(G).all()
    assert abs(float(loss[0]) - float(ref)) < 1e-5 * float(ref)


@needs_cc
def test_thread_count_does_not_change_results():
    X, y, off = _data([300, 20, 150, 77, 400, 8], 5, seed=6)
    sd = native.SoftmaxData(native.softmax_gd_kernel(5), X, y, off, 5)
    ids = torch.arange(6)
    A = torch.randn(6, 5, 8, generator=torch.Generator().manual_seed(7))
    old = torch.get_num_threads()
    try:
        out = []
        for th in (1, 2, 3):
            torch.set_num_threads(th)
            out.append(sd.run(ids, A, torch.full((6,), 4), lr=0.1))
    finally:
        torch.set_num_threads(old)
    for A_t, L_t in out[1:]:
        assert torch.equal(A_t, out[0][0]) and torch.equal(L_t, out[0][1])


@needs_cc
def test_native_and_torch_kernels_agree_on_s1():
    from fedsolve.families.clustered.fpfc import FPFC
    from fedsolve.data.synthetic import fpfc_synthetic
    from fedsolve.models import build_model_fn
    from fedsolve.problems import FederatedProblem
    from fedsolve.engine import Simulation, SimulationConfig

    prob = FederatedProblem(fpfc_synthetic("S1", seed=0, size_scale=0.05), build_model_fn("logreg", (60,), 10))
    res = {}
    for kernel in ("native", "torch"):
        algo = FPFC(dict(lam=0.6, local_epochs=5, init_std=0.1), prob)
        sim = Simulation(prob, algo, SimulationConfig(rounds=15, eval_every=15, linear_kernel=kernel, metrics=[],
                                                      sampling={"fraction": 0.3}), seed=1)
        assert sim.executor.kernel == kernel
        res[kernel] = (sim.run(), sim)
    torch.testing.assert_close(res["native"][1].server["W"], res["torch"][1].server["W"], atol=1e-4, rtol=1e-4)
    a, b = res["native"][0].history[-1], res["torch"][0].history[-1]
    assert abs(a["train_loss"] - b["train_loss"]) < 1e-5
    assert abs(a["test_accuracy"] - b["test_accuracy"]) < 0.01


def test_switch_off_and_clear_errors(monkeypatch, tmp_path):
    from fedsolve.data.synthetic import fpfc_synthetic
    from fedsolve.models import build_model_fn
    from fedsolve.problems import FederatedProblem

    prob = FederatedProblem(fpfc_synthetic("S1", seed=0, size_scale=0.02), build_model_fn("logreg", (60,), 10))
    monkeypatch.setenv("FEDSOLVE_NATIVE", "0")
    assert LinearGDExecutor(prob).kernel == "torch"
    with pytest.raises(ValueError, match="linear_kernel.*FEDSOLVE_NATIVE=0"):
        LinearGDExecutor(prob, kernel="native")
    with pytest.raises(ValueError, match="linear_kernel: expected 'auto', 'native' or 'torch'"):
        LinearGDExecutor(prob, kernel="fast")


def test_missing_compiler_falls_back_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-compiler-fedsolve")
    monkeypatch.setenv("FEDSOLVE_CACHE_DIR", str(tmp_path))
    mod = importlib.reload(native)
    try:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            assert mod.softmax_gd_kernel(3) is None
            assert mod.softmax_gd_kernel(4) is None
        assert len([w for w in rec if "compiled kernel unavailable" in str(w.message)]) == 1
    finally:
        monkeypatch.undo()
        importlib.reload(native)


@needs_cc
def test_build_is_cached_and_atomic(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDSOLVE_CACHE_DIR", str(tmp_path))
    p1 = native._build("softmax_gd", {"NC": 6})
    mtime = p1.stat().st_mtime_ns
    p2 = native._build("softmax_gd", {"NC": 6})
    assert p1 == p2 and p2.stat().st_mtime_ns == mtime          # reused, not rebuilt
    assert [f.name for f in p1.parent.iterdir()] == [p1.name]     # no temporary left behind


@needs_cc
@pytest.mark.parametrize("k", [1, 7, 20])
def test_pair_update_kernel_matches_the_tensor_version(k):
    """FPFC's server pair update (pair_update.c) against DensePairs.update_torch over several rounds:
    same pairs and scales, R equal to its definition sum_j (2 s_ij - 1) delta_ij, antisymmetry kept."""
    from fedsolve.families.clustered.fpfc import DensePairs, prox_scale

    m, d = 20, 13
    g = torch.Generator().manual_seed(k)
    lib = native.load("pair_update")
    assert lib is not None
    a = DensePairs.init(m, d, torch.float32)
    a["R"] = torch.zeros(m, d)
    b = {key: v.clone() for key, v in a.items()}
    W = torch.randn(m, d, generator=g) * torch.tensor([0.1, 0.5, 2.0]).repeat_interleave(torch.tensor([8, 8, 4]))[:, None]
    prox = lambda r: prox_scale(r, 0.8, 1.0)  # noqa: E731
    off = ~torch.eye(m, dtype=torch.bool)
    seen = []
    for _ in range(12):
        ids = torch.randperm(m, generator=g)[:k]
        W[ids] += 0.05 * torch.randn(k, d, generator=g)
        DensePairs.update_torch(a, W, ids, prox)
        DensePairs.update_native(lib, b, W, ids, prox)
        torch.testing.assert_close(b["delta"], a["delta"], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(b["scale"], a["scale"], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(b["R"], a["R"], atol=1e-4, rtol=1e-5)
        seen.append(b["scale"][off][b["delta"].norm(dim=-1)[off] > 0])
    for st in (a, b):                                                     # exactly antisymmetric, both
        assert torch.equal(st["delta"], -st["delta"].transpose(0, 1))
        assert torch.equal(st["scale"][off], st["scale"].T[off])
    R_def = (((2 * b["scale"] - 1) * off).unsqueeze(-1) * b["delta"]).sum(1)
    torch.testing.assert_close(b["R"], R_def, atol=1e-4, rtol=1e-5)
    s = torch.cat(seen)
    assert (s == 1).any() and ((s > 1e-3) & (s < 1)).any() and (s < 1e-3).any()  # far, shrunk and fused pairs


@needs_cc
def test_linear_kernel_chooses_the_pair_update_too(monkeypatch):
    """simulation.linear_kernel reaches FPFC's pair store whatever the executor: 'torch' never calls the
    compiled pair update, 'auto' does on a dense float32 store, 'native' without the kernels is refused."""
    from fedsolve.families.clustered.fpfc import FPFC, DensePairs
    from fedsolve.data.synthetic import fpfc_synthetic
    from fedsolve.models import build_model_fn
    from fedsolve.problems import FederatedProblem
    from fedsolve.engine import Simulation, SimulationConfig

    prob = FederatedProblem(fpfc_synthetic("S1", seed=0, size_scale=0.02), build_model_fn("logreg", (60,), 10))
    calls = []
    real = DensePairs.update_native
    monkeypatch.setattr(DensePairs, "update_native", staticmethod(lambda *a: (calls.append(1), real(*a))[1]))

    def sim(kernel, executor="sequential", **cfg):
        algo = FPFC(dict(lam=0.6, local_epochs=2, **cfg), prob)
        return algo, Simulation(prob, algo, SimulationConfig(rounds=2, eval_every=2, executor=executor, metrics=[],
                                                             linear_kernel=kernel), seed=0)

    W = {}
    for kernel in ("torch", "auto"):
        calls.clear()
        algo, s = sim(kernel)
        s.run()
        W[kernel] = s.server["W"]
        assert algo.pair_kernel == ("torch" if kernel == "torch" else "native")
        assert len(calls) == (0 if kernel == "torch" else 2)       # one server update per round
    torch.testing.assert_close(W["auto"], W["torch"], atol=1e-5, rtol=1e-5)
    assert sim("auto", dtype="float64")[0].pair_kernel == "torch"   # float64 stores: the tensor update
    assert sim("native", pair_layout="sparse")[0].pair_kernel == "torch"
    monkeypatch.setenv("FEDSOLVE_NATIVE", "0")
    assert sim("auto")[0].pair_kernel == "torch"
    with pytest.raises(ValueError, match="linear_kernel: 'native' is not available for FPFC's pair update"):
        sim("native", executor="sequential")


def _pool_input(shape, seed=0):
    """Integers (many ties), with NaN and -inf sprinkled in: torch's tie and NaN rules must hold."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randint(-2, 3, shape, generator=g).float()
    z.view(-1)[::17] = float("nan")
    z.view(-1)[5::13] = -float("inf")
    return z.requires_grad_()


@needs_cc
@pytest.mark.parametrize("shape", [(5, 6, 28, 28), (4, 16, 10, 10), (2, 3, 2, 2), (1, 2, 6, 2050), (3, 2, 7, 9)])
def test_max_pool2x2_is_torchs_max_pool_to_the_bit(shape):
    """Values, gradients and double-backward products of the compiled pooling equal torch.max_pool2d's exactly
    (odd sizes take torch's own op)."""
    assert native.load("maxpool2") is not None
    z = _pool_input(shape)
    g = torch.randn(*shape[:2], shape[2] // 2, shape[3] // 2, generator=torch.Generator().manual_seed(1))
    ref, out = F.max_pool2d(z, 2), native.max_pool2x2(z)
    assert torch.equal(ref.isnan(), out.isnan()) and torch.equal(ref.nan_to_num(7.0), out.nan_to_num(7.0))
    (g_ref,), (g_out,) = torch.autograd.grad(ref, z, g), torch.autograd.grad(out, z, g)
    assert torch.equal(g_ref, g_out)
    # double backward: d/dg of <grad_z(<pool(z), g>), v> is pool's own routing of v
    v = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    gg = g.clone().requires_grad_()
    (a,) = torch.autograd.grad((torch.autograd.grad(F.max_pool2d(z, 2), z, gg, create_graph=True)[0] * v).sum(), gg)
    (b,) = torch.autograd.grad((torch.autograd.grad(native.max_pool2x2(z), z, gg, create_graph=True)[0] * v).sum(), gg)
    assert torch.equal(a, b)


def test_max_pool2x2_falls_back_to_torch(monkeypatch):
    """Under torch.func transforms (the vectorized executor), for non-contiguous input and with
    FEDSOLVE_NATIVE=0, torch's op runs: same numbers, and vmap works."""
    from torch.func import vmap

    z = _pool_input((3, 2, 6, 8)).detach()
    ref = F.max_pool2d(z, 2).nan_to_num(7.0)
    assert torch.equal(vmap(native.max_pool2x2)(z.unsqueeze(1)).squeeze(1).nan_to_num(7.0), ref)
    assert torch.equal(native.max_pool2x2(z.transpose(2, 3)).nan_to_num(7.0),
                       F.max_pool2d(z.transpose(2, 3), 2).nan_to_num(7.0))
    monkeypatch.setenv("FEDSOLVE_NATIVE", "0")
    assert native.max_pool2x2(z).grad_fn is None and torch.equal(native.max_pool2x2(z).nan_to_num(7.0), ref)


@needs_cc
def test_lenet_trains_the_same_with_and_without_the_pooling_kernel(monkeypatch):
    """A LeNet run (sequential executor, minibatches) gives the same numbers bit for bit with the compiled
    pooling as with torch's."""
    from fedsolve.families import get_algorithm
    from fedsolve.data.federated import FederatedData
    from fedsolve.models import build_model_fn
    from fedsolve.problems import FederatedProblem
    from fedsolve.engine import Simulation, SimulationConfig

    g = torch.Generator().manual_seed(0)
    x = torch.rand(120, 1, 12, 12, generator=g)
    y = torch.randint(0, 4, (120,), generator=g)
    off = torch.tensor([0, 30, 50, 90, 120])
    data = FederatedData(x, y, off, x, y, off, num_classes=4, name="img")

    def run():
        problem = FederatedProblem(data, build_model_fn("lenet", (1, 12, 12), 4))
        algo = get_algorithm("fedavg")({"lr": 0.1, "batch_size": 8}, problem)
        sim = Simulation(problem, algo, SimulationConfig(rounds=2, eval_every=1, executor="sequential"), seed=0)
        return sim.run().server["w"]

    with_kernel = run()
    monkeypatch.setenv("FEDSOLVE_NATIVE", "0")
    assert torch.equal(run(), with_kernel)


def test_grey_images_are_stored_row_major_so_lenet_pools_with_the_kernel():
    """[N, 1, H, W] images whose channel stride is 1 (as numpy concatenation can give) would make torch take them
    for channels-last and run LeNet's convolutions in that layout, past the pooling kernel; FederatedData stores
    its samples row-major."""
    from fedsolve.data.federated import FederatedData
    from fedsolve.models import LeNet

    x = torch.as_strided(torch.rand(6 * 784), (6, 1, 28, 28), (784, 1, 28, 1))
    assert x.is_contiguous(memory_format=torch.channels_last)
    y = torch.zeros(6, dtype=torch.long)
    off = torch.tensor([0, 3, 6])
    data = FederatedData(x, y, off, x, y, off, num_classes=10, name="img")
    assert data.train_x.stride() == data.test_x.stride() == (784, 784, 28, 1) and torch.equal(data.train_x, x)
    net = LeNet((1, 28, 28), 10, fc_hidden=0)
    assert net.conv1(data.train_x[torch.tensor([0, 2])]).is_contiguous()
    assert not net.conv1(x[torch.tensor([0, 2])]).is_contiguous()     # what the kernel would not see
