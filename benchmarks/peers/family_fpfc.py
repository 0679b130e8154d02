"""FPFC (Algorithm 2, ``src/fedsolve/families/clustered/fpfc/algorithm.py``) on the label-swap CNN workload: fedsolve against
a plain and a fastest client-by-client loop (``families.py``).

Workload: ``benchmarks/round_time.py``'s ``lenet`` (FPFC's label-swap ConvNet: conv-pool-conv-pool-fc, one fc
layer ``fc2``, d = 6,582, the fused block fc2 = 4,010 parameters; the convolutions are averaged over the
participants), 20 clients of unequal sizes (151 to 369 MNIST-shaped synthetic images), half of them a round,
2 epochs of batch 100 (short last batches), lr 0.01 (x 0.9 every 5 rounds), SCAD with lambda 0.4, xi 1e-4,
a = 3.7, rho = 1 (``experiments/fpfc/label_swap_mnist.yaml`` with round_time's 2 epochs). One round:

    server -> i in A:  zeta_i = (1/m) sum_j (w_j + theta_ij - v_ij / rho) (fused block), w_i's convolutions
    device i:          SGD on CE + (rho/2) ||w_f - zeta_i||^2 from w_i                         (eq. 5)
    server:            convolutions of the participants <- their mean; for every pair with an end in A:
                       delta = w_i - w_j + v_ij / rho, theta_ij = s(||delta||) delta, v_ij += rho (w_i - w_j - theta_ij)

The scalar SCAD prox s(r) is fedsolve's ``prox_scale`` (the penalty's definition; ``fpfc_s1.py``'s reference
imports it the same way); the rest of both references is plain torch. plain: a PFLlib-style client (its model
copy, ``torch.optim.SGD``, the proximal term added to the loss, ``backward()``), the server a Python loop over the
pairs (as ``fpfc_s1.py``'s reference, the authors' scripts' organisation). fastest: one reused module,
channels-last (NHWC) tensors (torch's CPU max-pooling runs about twice as fast on them; measured),
``torch.autograd.grad`` into the parameter tensors, fused in-place updates, the pair update as tensor operations
over all touched pairs at once on a dense ``[m, m, d_f]`` store.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from family_common import Family, Result, clock, on, fedsolve_contenders, flat, load_flat, perturbed, schedule
from round_time import WORKLOADS, make_data

from fedsolve.families import get_algorithm
from fedsolve.families.clustered.fpfc.penalties import prox_scale
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem
from fedsolve.engine import Simulation, SimulationConfig

CFG = dict(lr=0.01, local_epochs=2, batch_size=100, lam=0.4, xi=1e-4, nu=0.5, rho=1.0, a=3.7, lr_decay=0.9,
           lr_decay_every=5)
FRACTION = 0.5


class LeNet(nn.Module):
    """FPFC's ConvNet in plain torch (the parameter names and order of fedsolve's ``lenet`` with fc_hidden 0)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc2 = nn.Linear(400, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(x.flatten(1))


def prox(r: Tensor) -> Tensor:
    return prox_scale(r, CFG["lam"], CFG["rho"], CFG["a"], CFG["xi"], "scad")


def lr_at(t: int, lr: float) -> float:
    return lr * CFG["lr_decay"] ** (t // CFG["lr_decay_every"])


def build(smoke: bool, perturb: set[str], executors: tuple[str, ...] = ("auto", "vectorized"), seed: int = 0,
          device: str = "cpu") -> Family:
    w = dict(WORKLOADS["lenet"])
    if smoke:
        w.update(clients=6, sizes=w["sizes"][:6])
    rounds = 3 if smoke else 4
    data = make_data(w, seed).to(device)
    problem = FederatedProblem(data, build_model_fn("lenet", data.input_shape, 10, fc_hidden=0),
                               blocks={"fused": ["fc2.*"]})

    def make() -> Simulation:
        algo = get_algorithm("fpfc")(CFG, problem)
        return Simulation(problem, algo, SimulationConfig(rounds=rounds, executor="sequential", metrics=[],
                                                          device=device, sampling={"fraction": FRACTION}), seed=seed)

    sim0 = make()
    d = problem.layout.dim
    if not bool(sim0.algo.fidx.eq(torch.arange(d - 4010, d)).all()):
        raise RuntimeError("fpfc benchmark: expected fc2 (the last 4,010 parameters) as the fused block")
    W0 = sim0.server["W"].clone()
    sched = schedule(sim0, rounds)
    lr = perturbed(CFG["lr"], perturb)

    def state(sim):
        return {"W": sim.server["W"], "R": sim.server["R"]}

    fam = Family("fpfc", f"LeNet (conv-pool-conv-pool-fc2, fc2 fused), {w['clients']} clients of 151-369 synthetic "
                 f"MNIST-shaped images, {int(FRACTION * 100)}% a round, 2 epochs of batch 100, SCAD lambda 0.4, "
                 f"{rounds} rounds", {}, tol=1e-5)
    fam.contenders.update(fedsolve_contenders(make, rounds, state, executors=executors))
    fam.contenders["plain"] = on(device, lambda: plain(W0, data, sched, lr["plain"]))
    fam.contenders["fastest"] = on(device, lambda: fastest(W0, data, sched, lr["fastest"]))
    return fam


# ------------------------------------------------------------------ (a) plain PFLlib-style loop
class PlainClient:
    def __init__(self, model: nn.Module):
        self.model = copy.deepcopy(model)
        self.fused = [self.model.fc2.weight, self.model.fc2.bias]

    def train(self, start: Tensor, zeta: Tensor, x, y, batches, lr: float) -> Tensor:
        load_flat(self.model.parameters(), start)
        zs = [zeta[:4000].view(10, 400), zeta[4000:]]
        opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        for ix in batches:
            loss = F.cross_entropy(self.model(x[ix]), y[ix])
            loss = loss + 0.5 * CFG["rho"] * sum((p - z).pow(2).sum() for p, z in zip(self.fused, zs))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return flat(self.model.parameters())


def plain(W0: Tensor, data, sched, lr: float) -> Result:
    m, rho = W0.shape[0], CFG["rho"]
    W = W0.clone()
    df = 4010
    theta, V = torch.zeros(m, m, df), torch.zeros(m, m, df)
    model = LeNet()
    clients = [PlainClient(model) for _ in range(m)]
    x, y = data.train_x, data.train_y
    times = []
    for t, rnd in enumerate(sched):
        t0 = clock()
        ups = []
        for k, i in enumerate(rnd.ids):
            zeta = (W[:, -df:] + theta[i] - V[i] / rho).mean(0)
            ups.append(clients[i].train(W[i], zeta, x, y, rnd.batches["train"][k], lr_at(t, lr)))
        shared = sum(u[:-df] for u in ups) / len(ups)
        for i, u in zip(rnd.ids, ups):
            W[i, :-df] = shared
            W[i, -df:] = u[-df:]
        done = set()
        for i in rnd.ids:                        # one pair at a time
            for j in range(m):
                if j == i or (j, i) in done:
                    continue
                done.add((i, j))
                delta = W[i, -df:] - W[j, -df:] + V[i, j] / rho
                s = prox(delta.norm().view(1))
                theta[i, j] = s * delta
                V[i, j] = V[i, j] + rho * (W[i, -df:] - W[j, -df:] - theta[i, j])
                theta[j, i], V[j, i] = -theta[i, j], -V[i, j]
        times.append(clock() - t0)
    R = (theta - V / rho).sum(1)
    return Result(times, {"W": W, "R": R}, f"{torch.get_num_threads()} thread(s)")


# ------------------------------------------------------------------ (b) fastest sequential loop
def fastest(W0: Tensor, data, sched, lr0: float) -> Result:
    m, rho = W0.shape[0], CFG["rho"]
    W = W0.clone()
    df = 4010
    D, S = torch.zeros(m, m, df), torch.zeros(m, m)      # theta_ij = S D, v_ij / rho = (1 - S) D
    model = LeNet().to(memory_format=torch.channels_last)   # torch's CPU pooling is ~2x faster in NHWC
    params = list(model.parameters())
    shared, fused = params[:4], params[4:]
    x, y = data.train_x.contiguous(memory_format=torch.channels_last), data.train_y
    times = []
    for t, rnd in enumerate(sched):
        t0 = clock()
        lr = lr_at(t, lr0)
        ids = torch.tensor(rnd.ids)
        R = ((2 * S - 1).unsqueeze(-1) * D).sum(1)          # sum_j (theta_ij - v_ij / rho)
        zeta = W[:, -df:].mean(0) + R[ids] / m
        up = torch.empty(len(rnd.ids), W.shape[1])
        for k, i in enumerate(rnd.ids):
            with torch.no_grad():
                a = 0
                for p in params:
                    p.copy_(W[i, a:a + p.numel()].view_as(p))
                    a += p.numel()
                c = lr * rho * zeta[k]                   # fused: p (1 - lr rho) - lr g + lr rho zeta_i
                cf = [c[:4000].view(10, 400), c[4000:]]
            for ix in rnd.batches["train"][k]:
                g = torch.autograd.grad(F.cross_entropy(model(x[ix]), y[ix]), params)
                with torch.no_grad():
                    torch._foreach_add_(shared, g[:4], alpha=-lr)
                    torch._foreach_mul_(fused, 1 - lr * rho)
                    torch._foreach_add_(fused, g[4:], alpha=-lr)
                    torch._foreach_add_(fused, cf)
            with torch.no_grad():
                torch.cat([p.reshape(-1) for p in params], out=up[k])
        up[:, :-df] = up[:, :-df].mean(0)
        W[ids] = up
        # every pair (p < q) with an end in A, at once
        act = torch.zeros(m, dtype=torch.bool)
        act[ids] = True
        I, J = torch.triu_indices(m, m, 1)
        keep = act[I] | act[J]
        I, J = I[keep], J[keep]
        Wf = W[:, -df:]
        Dn = torch.addcmul(Wf[I] - Wf[J], (1 - S[I, J]).unsqueeze(-1), D[I, J])
        Sn = prox(Dn.norm(dim=-1))
        D[I, J], D[J, I] = Dn, -Dn
        S[I, J], S[J, I] = Sn, Sn
        times.append(clock() - t0)
    R = ((2 * S - 1).unsqueeze(-1) * D).sum(1)
    return Result(times, {"W": W, "R": R}, f"{torch.get_num_threads()} thread(s)")
