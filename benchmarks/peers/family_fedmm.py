"""FedMM (Algorithm 3, ``src/fedsolve/families/minimax/fedmm.py``) on the DANN 2-client workload: fedsolve against
a plain and a fastest client-by-client loop (``families.py``).

Workload: the reduced size of ``experiments/minimax/mnistm_dann_2clients.yaml`` on synthetic data of its shape:
2 clients at p = 1 (client 0 holds 5,000 labelled source images, client 1 5,000 unlabelled target images),
3 x 8 x 8 inputs, DANN with MLP features (192 -> 64), classifier 64-100-100-10, discriminator 64-100-2, nu = 1;
M = 20 local descent-ascent steps of batch 64, eta_1 = eta_2 = 0.01, mu_1 = mu_2 = 1, eta_3 = 0.9995002. One
round, client i (minimizer form, sign s = +1 on omega, -1 on psi):

    theta <- theta - eta [s grad f_i(theta) + mu (theta - theta_0^t) + dual_i]   (eqs. 11-12, simultaneous)
    dual_i += mu (theta_i - theta_0^t)                                              (eqs. 13-14)
    upload theta_i + eta_3^t dual_i / mu;  server: mean of the uploads              (eqs. 15-16)

plain: a PFLlib-style client (its own model, ``torch.optim.SGD`` with the two players' step sizes as parameter
groups, ``backward()`` of f_i, the discriminator's gradient negated, the penalty and dual added to ``.grad``).
fastest: the network's forward and backward passes written out on one flat parameter vector (no autograd,
:class:`HandwrittenDANN`), and per step two fused updates (omega, psi) with the round's constants folded in
(``p (1 - eta mu) - eta s g + eta (mu p_0 - dual)``).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from family_common import Family, Result, clock, on, fedsolve_contenders, flat, load_flat, perturbed, schedule

from fedsolve.families import get_algorithm
from fedsolve.data.federated import FederatedData
from fedsolve.families.minimax.problem import adversarial_problem
from fedsolve.engine import Simulation, SimulationConfig

SHAPE, FEAT, HIDDEN, DOM = (3, 8, 8), 64, (100, 100), 100
CFG = dict(lr=0.01, lr_psi=0.01, batch_size=64, local_steps=20, mu1=1.0, mu2=1.0, eta3=0.9995002)
NU = 1.0


def domain_data(n: int, seed: int) -> FederatedData:
    """Client 0: ``n`` labelled source rows (classes of a random linear map); client 1: ``n`` unlabelled target
    rows (``y = -1``), shifted inputs; row groups ``source``/``target``."""
    g = torch.Generator().manual_seed(seed)
    xs = torch.rand(n, *SHAPE, generator=g)
    ys = (xs.reshape(n, -1) @ torch.randn(xs[0].numel(), 10, generator=g)).argmax(1)
    xt = (torch.rand(n, *SHAPE, generator=g) + 0.3 * torch.rand(1, *SHAPE, generator=g)).clamp(0, 1)
    x = torch.cat([xs, xt])
    y = torch.cat([ys, torch.full((n,), -1)])
    off = torch.tensor([0, n, 2 * n])
    toff = torch.tensor([0, 0, 50])
    return FederatedData(x, y, off, xt[:50], ys[:50], toff, num_classes=10, name="dann-synthetic",
                         train_groups=torch.cat([torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=torch.long)]),
                         group_names=("source", "target"))


class DANN(nn.Module):
    """The DANN network written here in plain torch (the same parameter names and order as fedsolve's)."""

    def __init__(self):
        super().__init__()
        d_in = SHAPE[0] * SHAPE[1] * SHAPE[2]
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(d_in, FEAT), nn.ReLU())
        self.classifier = nn.Sequential(nn.Linear(FEAT, HIDDEN[0]), nn.ReLU(), nn.Linear(HIDDEN[0], HIDDEN[1]),
                                        nn.ReLU(), nn.Linear(HIDDEN[1], 10))
        self.domain = nn.Sequential(nn.Linear(FEAT, DOM), nn.ReLU(), nn.Linear(DOM, 2))

    def forward(self, x):
        z = self.features(x)
        return self.classifier(z), self.domain(z)


def dann_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """f_i on one minibatch: mean of CE on source rows - nu * domain cross-entropy (source 0, target 1)."""
    logits, d = model(x)
    src = y >= 0
    ce = F.cross_entropy(logits, y.clamp_min(0), reduction="none") * src
    logq = torch.log_softmax(d, -1)
    dom = torch.where(src, -logq[:, 0], -logq[:, 1])
    return (ce - NU * dom).mean()


def build(smoke: bool, perturb: set[str], executors: tuple[str, ...] = ("auto", "vectorized"), seed: int = 0,
          device: str = "cpu") -> Family:
    n, rounds = (500, 3) if smoke else (5000, 5)
    data = domain_data(n, seed).to(device)
    problem = adversarial_problem(data, "dann", NU, features="mlp", feature_dim=FEAT, hidden=HIDDEN,
                                  domain_hidden=DOM)
    cfg = dict(CFG, local_steps=5 if smoke else CFG["local_steps"])

    def make() -> Simulation:
        algo = get_algorithm("fedmm")(cfg, problem)
        return Simulation(problem, algo, SimulationConfig(rounds=rounds, executor="sequential", metrics=[],
                                                          device=device), seed=seed)

    sim0 = make()
    w0 = sim0.server["w"].clone()
    sched = schedule(sim0, rounds)
    n_omega = sum(1 for name, _ in problem.model.named_parameters() if not name.startswith("domain."))
    lr = perturbed(cfg["lr"], perturb)

    def state(sim):
        return {"w": sim.server["w"], "dual": sim.clients["dual"]}

    fam = Family("fedmm", f"DANN, 2 clients at p = 1 ({n} source + {n} target synthetic 3x8x8 images), MLP features "
                 f"{FEAT}, classifier {'-'.join(map(str, HIDDEN))}, M = {cfg['local_steps']} steps of batch 64, "
                 f"{rounds} rounds", {}, tol=1e-4)
    fam.contenders.update(fedsolve_contenders(make, rounds, state, executors=executors))
    fam.contenders["plain"] = on(device, lambda: plain(w0, data, sched, n_omega, cfg, lr["plain"]))
    fam.contenders["fastest"] = on(device, lambda: fastest(w0, data, sched, n_omega, cfg, lr["fastest"]))
    return fam


def _model(w0: Tensor) -> nn.Module:
    model = DANN()
    load_flat(model.parameters(), w0)
    return model


# ------------------------------------------------------------------ (a) plain PFLlib-style loop
class PlainClient:
    def __init__(self, model: nn.Module, n_omega: int, cfg: dict, lr: float):
        self.model = copy.deepcopy(model)
        params = list(self.model.parameters())
        self.omega, self.psi = params[:n_omega], params[n_omega:]
        self.dual = [torch.zeros_like(p) for p in params]
        self.cfg, self.lr = cfg, lr

    def train(self, glob: nn.Module, x, y, batches, t: int) -> list[Tensor]:
        c = self.cfg
        self.model.load_state_dict(glob.state_dict())
        w0 = [p.detach().clone() for p in self.model.parameters()]
        mu = [c["mu1"]] * len(self.omega) + [c["mu2"]] * len(self.psi)
        opt = torch.optim.SGD([{"params": self.omega, "lr": self.lr}, {"params": self.psi, "lr": c["lr_psi"]}])
        for ix in batches:
            loss = dann_loss(self.model, x[ix], y[ix])
            opt.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in self.psi:                      # the max player ascends f_i
                    p.grad.neg_()
                for p, p0, lam, m in zip(self.model.parameters(), w0, self.dual, mu):
                    p.grad += m * (p - p0) + lam
            opt.step()
        ps = [p.detach() for p in self.model.parameters()]
        self.dual = [lam + m * (p - p0) for lam, m, p, p0 in zip(self.dual, mu, ps, w0)]
        return [p + (c["eta3"] ** t) * lam / m for p, lam, m in zip(ps, self.dual, mu)]


def plain(w0, data, sched, n_omega: int, cfg: dict, lr: float) -> Result:
    glob = _model(w0)
    clients = [PlainClient(glob, n_omega, cfg, lr) for _ in range(data.num_clients)]
    x, y = data.train_x, data.train_y
    times = []
    for t, rnd in enumerate(sched):
        t0 = clock()
        ups = [clients[i].train(glob, x, y, rnd.batches["train"][k], t) for k, i in enumerate(rnd.ids)]
        with torch.no_grad():
            for j, p in enumerate(glob.parameters()):
                p.copy_(sum(u[j] for u in ups) / len(ups))
        times.append(clock() - t0)
    return Result(times, {"w": flat(glob.parameters()),
                          "dual": torch.stack([flat(c.dual) for c in clients])}, f"{torch.get_num_threads()} thread(s)")


# ------------------------------------------------------------------ (b) fastest sequential loop
class HandwrittenDANN:
    """The DANN saddle loss's gradient on one flat parameter vector, forward and backward written out (no
    autograd): ``P`` holds (features, classifier, domain) in fedsolve's order, ``G`` gets d f_i / d P."""

    def __init__(self, shapes: list[tuple[int, ...]]):
        sizes = [int(torch.Size(s).numel()) for s in shapes]
        self.P, self.G = torch.empty(sum(sizes)), torch.empty(sum(sizes))
        self.W = [v.view(s) for v, s in zip(self.P.split(sizes), shapes)]
        self.dW = [v.view(s) for v, s in zip(self.G.split(sizes), shapes)]

    def grad(self, x: Tensor, y: Tensor) -> None:
        Wf, bf, W1, b1, W2, b2, W3, b3, D1, e1, D2, e2 = self.W
        gWf, gbf, gW1, gb1, gW2, gb2, gW3, gb3, gD1, ge1, gD2, ge2 = self.dW
        B = len(y)
        src = y >= 0
        z = torch.addmm(bf, x, Wf.t()).relu_()
        h1 = torch.addmm(b1, z, W1.t()).relu_()
        h2 = torch.addmm(b2, h1, W2.t()).relu_()
        g1 = torch.addmm(e1, z, D1.t()).relu_()
        # classifier: (softmax - onehot) on source rows; domain: nu (onehot(t) - softmax) with t = 0 source, 1 target
        dl = torch.softmax(torch.addmm(b3, h2, W3.t()), 1)
        dl[torch.arange(B), y.clamp_min(0)] -= 1.0
        dl.mul_((src.to(dl.dtype) / B).unsqueeze(1))
        dd = torch.softmax(torch.addmm(e2, g1, D2.t()), 1).neg_()
        dd[torch.arange(B), (~src).long()] += 1.0
        dd.mul_(NU / B)
        torch.mm(dl.t(), h2, out=gW3)
        torch.sum(dl, 0, out=gb3)
        dh = torch.mm(dl, W3).mul_(h2 > 0)
        torch.mm(dh.t(), h1, out=gW2)
        torch.sum(dh, 0, out=gb2)
        dh = torch.mm(dh, W2).mul_(h1 > 0)
        torch.mm(dh.t(), z, out=gW1)
        torch.sum(dh, 0, out=gb1)
        torch.mm(dd.t(), g1, out=gD2)
        torch.sum(dd, 0, out=ge2)
        dg = torch.mm(dd, D2).mul_(g1 > 0)
        torch.mm(dg.t(), z, out=gD1)
        torch.sum(dg, 0, out=ge1)
        dz = torch.addmm(torch.mm(dh, W1), dg, D1).mul_(z > 0)
        torch.mm(dz.t(), x, out=gWf)
        torch.sum(dz, 0, out=gbf)


def fastest(w0, data, sched, n_omega: int, cfg: dict, lr: float) -> Result:
    """Client by client on :class:`HandwrittenDANN`: per step one gradient and two fused updates (omega, psi)."""
    c = cfg
    shapes = [tuple(p.shape) for p in DANN().parameters()]
    net = HandwrittenDANN(shapes)
    d_om = sum(int(torch.Size(s).numel()) for s in shapes[:n_omega])
    lr_om, lr_ps = lr, c["lr_psi"]
    mu_vec = torch.cat([torch.full((d_om,), c["mu1"]), torch.full((w0.numel() - d_om,), c["mu2"])])
    lr_vec = torch.cat([torch.full((d_om,), lr_om), torch.full((w0.numel() - d_om,), lr_ps)])
    glob = w0.clone()
    dual = torch.zeros(data.num_clients, glob.numel())
    x, y = data.train_x.reshape(data.train_x.shape[0], -1), data.train_y
    P, G = net.P, net.G
    Po, Pp, Go, Gp = P[:d_om], P[d_om:], G[:d_om], G[d_om:]
    times = []
    for t, rnd in enumerate(sched):
        t0 = clock()
        acc = torch.zeros_like(glob)
        for k, i in enumerate(rnd.ids):
            P.copy_(glob)
            const = lr_vec * (mu_vec * glob - dual[i])         # eta (mu theta_0 - dual_i), fixed in the loop
            co, cp = const[:d_om], const[d_om:]
            for ix in rnd.batches["train"][k]:
                net.grad(x[ix], y[ix])
                Po.mul_(1 - lr_om * c["mu1"]).add_(Go, alpha=-lr_om).add_(co)     # omega descends f_i
                Pp.mul_(1 - lr_ps * c["mu2"]).add_(Gp, alpha=lr_ps).add_(cp)      # psi ascends it
            dual[i] += mu_vec * (P - glob)
            acc += P + (c["eta3"] ** t) * dual[i] / mu_vec
        glob = acc / len(rnd.ids)
        times.append(clock() - t0)
    return Result(times, {"w": glob, "dual": dual}, f"{torch.get_num_threads()} thread(s)")
