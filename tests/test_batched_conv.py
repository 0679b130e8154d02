"""The ``batched`` executor on small CNNs (core/batched_conv.py: channel-stacked grouped convolutions) against the
sequential executor: the same numbers, float64 to 1e-10 and float32 to float rounding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedsolve.families import get_algorithm
from fedsolve.core import batched_mlp as bm
from fedsolve.core.batched_conv import StackedCNN, cnn_ops
from fedsolve.core.batched_mlp import BatchedMLPExecutor, _PlainSGD
from fedsolve.core.selection import batched_applies
from fedsolve.core.statements import initial_statement
from fedsolve.core.executor import SequentialExecutor, Work, build_plans
from fedsolve.core.rng import RngStreams
from fedsolve.core.selection import make_executor
from fedsolve.data.federated import FederatedData
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem
from tests.test_batched_mlp import run_rounds

SIZES = [37, 50, 23, 61, 12, 29]   # unequal clients; with batch 10 most epochs end in a short batch


def data(shape=(1, 8, 8), classes=4, sizes=SIZES, dtype=torch.float32, seed=0, regression=False):
    g = torch.Generator().manual_seed(seed)
    N = sum(sizes)
    x = torch.randn(N, *shape, generator=g, dtype=dtype)
    y = torch.randn(N, 3, generator=g, dtype=dtype) if regression else torch.randint(0, classes, (N,), generator=g)
    off = torch.cumsum(torch.tensor([0] + list(sizes)), 0)
    m = len(sizes)
    return FederatedData(x, y, off, x[:2 * m], y[:2 * m], torch.arange(0, 2 * m + 1, 2),
                         num_classes=None if regression else classes, name="tiny")


class SmallCNN(nn.Module):   # two channels in, nn.MaxPool2d, no pooling after the second conv, a stride, tanh,
    def __init__(self):      # nn.Flatten
        super().__init__()
        self.c1 = nn.Conv2d(2, 3, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.c2 = nn.Conv2d(3, 4, 3, stride=2, bias=False)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(4 * 2 * 2, 5)
        self.out = nn.Linear(5, 3)

    def forward(self, x):
        x = self.pool(torch.relu(self.c1(x)))
        x = torch.tanh(self.c2(x))
        return self.out(torch.sigmoid(self.fc(self.flat(x))))


MODELS = {   # name -> (input shape, model factory builder, loss)
    "lenet": ((1, 8, 8), lambda s, c: build_model_fn("lenet", s, c, fc_hidden=0), "cross_entropy"),
    "lenet_fc": ((1, 12, 12), lambda s, c: build_model_fn("lenet", s, c, fc_hidden=6, fc_hidden2=5), "cross_entropy"),
    "lenet_rgb": ((3, 16, 16), lambda s, c: build_model_fn("lenet", s, c, fc_hidden=0), "cross_entropy"),
    "small_sq": ((2, 12, 12), lambda s, c: SmallCNN, "squared_error"),
}


def problem(model, dtype=torch.float32):
    shape, fn, loss = MODELS[model]
    d = data(shape, dtype=dtype, regression=loss == "squared_error")
    return FederatedProblem(d, fn(shape, 3 if loss == "squared_error" else 4), loss=loss)


@pytest.mark.parametrize("chunk", [None, 2, 4])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_float64_same_as_sequential(model, chunk):
    """One round of minibatch SGD, every client from its own start, unequal sizes and unequal step counts
    (the chunks group clients by work, short batches are padded): final weights and losses to 1e-10."""
    prob = problem(model, torch.float64)
    assert isinstance(BatchedMLPExecutor(prob).kernel, StackedCNN)
    d = prob.data
    ids = torch.tensor([4, 0, 3, 1, 5, 2])
    scale = torch.tensor([1.0, 0.5, 1.0, 2.0, 1.0, 0.7])   # unequal local work
    plans = build_plans({"train": Work(epochs=2, batch_size=10)}, d.train_offsets, ids, RngStreams(3), 0,
                        scale=scale)
    g = torch.Generator().manual_seed(1)
    x0 = prob.layout.flatten(prob.model).detach().double()
    start = x0 + 0.05 * torch.randn(len(ids), x0.numel(), generator=g, dtype=torch.float64)
    lr = 0.2
    ref, _, ref_loss = SequentialExecutor().run(_PlainSGD(prob, lr), {"w": start}, {}, ids, plans, d)
    out, loss = BatchedMLPExecutor(prob, chunk=chunk).sgd(start, lr, plans["train"], d)
    assert out.dtype == torch.float64
    assert (ref["w"] - start).abs().max() > 1e-2   # training moved the weights
    torch.testing.assert_close(out, ref["w"], rtol=0, atol=1e-10)
    torch.testing.assert_close(loss.double(), ref_loss.double(), rtol=1e-6, atol=1e-7)


CASES = {
    "fedavg": dict(lr=0.1, batch_size=10, local_epochs=2),
    "fedprox": dict(lr=0.1, batch_size=10, local_epochs=1.5, mu=0.3, weight_decay=0.01),
    "local": dict(lr=0.1, batch_size=10, local_steps=4, weight_decay=0.02),
}


def _run(prob, case, executor, rounds=3):
    return run_rounds(prob, get_algorithm(case)(CASES[case], prob), executor, rounds, fraction=0.7)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("model", ["lenet", "small_sq"])
def test_rounds_match_sequential(model, case):
    """Whole rounds through the engine (sampling, variable work, aggregation), float32."""
    prob = problem(model)
    sim_b, loss_b, st_b = _run(prob, case, "batched")
    _, loss_s, st_s = _run(prob, case, "sequential")
    assert sim_b.executor.name == "batched" and isinstance(sim_b.executor.kernel, StackedCNN)
    assert loss_b == pytest.approx(loss_s, rel=1e-5, abs=1e-6)
    assert st_b.keys() == st_s.keys() and st_b
    for k in st_s:
        torch.testing.assert_close(st_b[k], st_s[k], rtol=1e-5, atol=1e-6)


def test_lenet_ops_traced():
    prob = problem("lenet")
    assert [o.kind for o in cnn_ops(prob)] == ["conv", "act", "pool", "conv", "act", "pool", "flatten", "linear"]
    algo = get_algorithm("fedavg")(CASES["fedavg"], prob)
    assert batched_applies(algo, prob, statement=initial_statement(algo))


class AvgPoolCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(1, 2, 3)
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(2 * 3 * 3, 4)

    def forward(self, x):
        return self.fc(self.pool(torch.relu(self.c(x))).flatten(1))


class FlatDimsCNN(AvgPoolCNN):   # flattens all but the first two dims: not a per-sample flatten
    def forward(self, x):
        return self.fc(torch.max_pool2d(self.c(x), 2).flatten(2))


def test_refused_for_other_cnns_with_a_clear_message():
    prob = FederatedProblem(data(), AvgPoolCNN)
    algo = get_algorithm("fedavg")(CASES["fedavg"], prob)
    assert not batched_applies(algo, prob, statement=initial_statement(algo))
    with pytest.raises(ValueError, match=r"'batched' needs .* or a small CNN .*'lenet'\); AvgPoolCNN: "
                                         r"unsupported operation call_module 'pool'"):
        make_executor("batched", prob, algorithm=algo)
    with pytest.raises(ValueError, match=r"FlatDimsCNN: unsupported operation call_method 'flatten'"):
        make_executor("batched", FederatedProblem(data(), FlatDimsCNN), algorithm=algo)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("model", ["lenet", "lenet_fc", "small_sq", "mlp"])
def test_cuda_same_as_sequential(model, dtype):
    """On a GPU (one chunk of every client, NCHW grouped convolutions; the MLP's fused steps): the sequential
    executor's numbers."""
    prob = (FederatedProblem(data(dtype=dtype), build_model_fn("mlp", (1, 8, 8), 4, hidden=(7, 6)))
            if model == "mlp" else problem(model, dtype)).to("cuda")
    d = prob.data
    ids = torch.tensor([4, 0, 3, 1, 5, 2])
    plans = build_plans({"train": Work(epochs=2, batch_size=10)}, d.train_offsets, ids, RngStreams(3), 0,
                        scale=torch.tensor([1.0, 0.5, 1.0, 2.0, 1.0, 0.7]))
    x0 = prob.layout.flatten(prob.model).detach().to(dtype)
    start = x0 + 0.05 * torch.randn(len(ids), x0.numel(), generator=torch.Generator().manual_seed(1),
                                    dtype=dtype).to("cuda")
    seq = SequentialExecutor()
    with torch.backends.cudnn.flags(deterministic=True):
        ref, _, _ = seq.run(_PlainSGD(prob, 0.2), {"w": start}, {}, ids, plans, d)
        out, _ = BatchedMLPExecutor(prob).sgd(start, 0.2, plans["train"], d)
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert out.device.type == "cuda"
    torch.testing.assert_close(out, ref["w"], rtol=0 if dtype == torch.float64 else 1e-4, atol=tol)


def test_auto_takes_the_calibrations_choice_for_lenet(tmp_path, monkeypatch):
    """``auto`` on LeNet: batched among the calibrated candidates, its chunk size from the same cache entry."""
    monkeypatch.setenv("FEDSOLVE_CACHE_DIR", str(tmp_path))
    prob = problem("lenet")
    algo = get_algorithm("fedavg")(CASES["fedavg"], prob)
    monkeypatch.setenv("FEDSOLVE_CALIBRATE", "0")
    assert make_executor("auto", prob, algorithm=algo).name == "batched"   # the fixed rule: batched applies
    monkeypatch.delenv("FEDSOLVE_CALIBRATE")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    times = {"sequential": 2.0, "vectorized": 3.0, "batched@2": 1.5, "batched@4": 1.0, "batched@6": 1.2}
    asked = []
    monkeypatch.setattr(bm, "measure", lambda p, cands, *a, **k: asked.extend(cands) or {c: times[c] for c in cands})
    ex = make_executor("auto", prob, algorithm=algo)
    assert set(asked) == set(times)   # 6 clients: chunks of 2, 4 and all 6
    assert ex.name == "batched" and bm.calibrated_chunk(prob, 10, None) == 4
    times.update({"sequential": 0.5})   # another machine where one client at a time wins
    monkeypatch.setenv("FEDSOLVE_CACHE_DIR", str(tmp_path / "other"))
    assert make_executor("auto", prob, algorithm=algo).name == "sequential"


def _fpfc_problem(dtype=torch.float32):
    shape, fn, loss = MODELS["lenet"]
    return FederatedProblem(data(shape, dtype=dtype), fn(shape, 4), loss=loss, blocks={"fused": ["fc2.*"]})


FPFC = dict(lr=0.1, batch_size=10, local_epochs=2, lam=0.3, rho=0.7, weight_decay=0.01)


class _ClosurePullFPFC(get_algorithm("fpfc")):
    """FPFC with eq. 5's pull on the fused block stated as before (an ``extra`` closure): the numbers the per-
    coordinate ``prox`` must reproduce under the generic executors."""

    def local_update(self, state, msg, ctx):
        from fedsolve.core.statements import Descend
        rho, zeta, c = self.cfg.rho, msg["zeta"], self.cfg
        w0 = state["w"].index_copy(-1, self.sidx, msg["shared"])
        fidx = self.fidx
        pull = lambda p: torch.zeros_like(p).index_copy(0, fidx, rho * (p.index_select(0, fidx) - zeta))  # noqa
        return Descend(start=w0, extra=pull, lr=self.lr_at(ctx.round), weight_decay=c.weight_decay,
                       then=lambda w, steps: ({"w": w}, {"w": w}))


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_fpfc_fused_block_pull_keeps_its_numbers(executor):
    """FPFC states eq. 5's pull on a fused block as a per-coordinate ``prox`` (rho there, 0 on the averaged block)
    with the anchor zeta_i: the numbers of the closure it replaced, client by client and vmapped (the engine folds
    the pull and the weight decay into one affine term: the same sums in another order, equal to float rounding)."""
    prob = _fpfc_problem()
    _, loss_new, new = run_rounds(prob, get_algorithm("fpfc")(FPFC, prob), executor, 3, fraction=0.7)
    _, loss_old, old = run_rounds(prob, _ClosurePullFPFC(FPFC, prob), executor, 3, fraction=0.7)
    assert loss_new == pytest.approx(loss_old, rel=1e-5, abs=1e-6) and new.keys() == old.keys()
    for k in old:
        torch.testing.assert_close(new[k], old[k], rtol=1e-5, atol=1e-6)
    assert abs(loss_new[0] - loss_new[-1]) > 1e-3   # the rounds trained: the check compares something


def test_fpfc_fused_block_runs_batched():
    """The batched kernels take the per-coordinate pull: FPFC on LeNet with a fused fc2 block is ``batched`` under
    ``auto``'s rule and gives the sequential executor's numbers (float64 to 1e-10, float32 to rounding)."""
    prob = _fpfc_problem()
    algo = get_algorithm("fpfc")(FPFC, prob)
    assert batched_applies(algo, prob, statement=initial_statement(algo))
    sim_b, loss_b, st_b = run_rounds(prob, algo, "batched", 3, fraction=0.7)
    _, loss_s, st_s = run_rounds(prob, get_algorithm("fpfc")(FPFC, prob), "sequential", 3, fraction=0.7)
    assert sim_b.executor.name == "batched"
    assert loss_b == pytest.approx(loss_s, rel=1e-5, abs=1e-6)
    for k in st_s:
        torch.testing.assert_close(st_b[k], st_s[k], rtol=1e-5, atol=1e-6)
    p64 = _fpfc_problem(torch.float64)
    ids = torch.arange(6)
    plans = build_plans({"train": Work(epochs=2, batch_size=10)}, p64.data.train_offsets, ids, RngStreams(3), 0)
    x0 = p64.layout.flatten(p64.model).detach().double()
    g = torch.Generator().manual_seed(1)
    start = x0 + 0.05 * torch.randn(6, x0.numel(), generator=g, dtype=torch.float64)
    anchor = start + torch.randn(6, x0.numel(), generator=g, dtype=torch.float64)
    pull = torch.zeros(x0.numel(), dtype=torch.float64).masked_fill_(p64.layout.mask("fused"), 0.7)
    out, _ = BatchedMLPExecutor(p64, chunk=4).sgd(start, 0.2, plans["train"], p64.data, anchor, pull.unsqueeze(0))
    ref = start.clone()
    for k in range(6):   # the same steps client by client, the pull added to autograd's gradient
        ctx_plan = plans["train"].row(k)
        p = start[k].clone()
        for s in range(int(ctx_plan.active.sum())):
            n = max(ctx_plan.length(s), 1)
            ix, w = ctx_plan.idx[s][:n], ctx_plan.w[s][:n]
            q = p.clone().requires_grad_()
            loss = (torch.nn.functional.cross_entropy(torch.func.functional_call(
                p64.model, p64.layout.unflatten(q), (p64.data.train_x[ix],)), p64.data.train_y[ix],
                reduction="none") * w).sum()
            gq, = torch.autograd.grad(loss, q)
            p = p - 0.2 * (gq + pull * (p - anchor[k]))
        ref[k] = p
    assert (ref - start).abs().max() > 1e-2
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("personalization", ["output", "input"])
def test_block_phases_match_sequential(personalization):
    """FedAPM's personal phase (run by the update itself on one block) and shared phase on the CNN kernel (which
    forms the whole gradient; the block step moves the block's coordinates only): as the sequential executor."""
    prob = problem("lenet_fc")
    cfg = dict(lr=0.2, rho=0.05, sigma=0.02, personalization=personalization, batch_size=10, local_steps=3,
               log_stationarity=False)
    sim_b, loss_b, st_b = run_rounds(prob, get_algorithm("fedapm")(cfg, prob), "batched", fraction=0.7)
    _, loss_s, st_s = run_rounds(prob, get_algorithm("fedapm")(cfg, prob), "sequential", fraction=0.7)
    assert isinstance(sim_b.executor.kernel, StackedCNN)
    assert loss_b == pytest.approx(loss_s, rel=1e-5, abs=1e-6)
    for k in st_s:
        torch.testing.assert_close(st_b[k], st_s[k], rtol=1e-5, atol=1e-6)
