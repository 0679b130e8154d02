"""FedAPM (Algorithm 1, ``src/fedsolve/families/personalized/fedapm.py``) on an MNIST-shaped MLP, reduced: fedsolve against a
plain and a fastest client-by-client loop (``families.py``).

Workload: MLP 784-200-200-10 with OUTPUT personalization (the last layer is each client's v_i, the hidden layers
the shared u), 20 clients x 100 MNIST-shaped synthetic images, 30% participation (6 clients a round), 3 epochs
of batch 50 in each of the v- and u-phases (6 + 6 SGD steps a client), lr 0.5, rho = sigma = 0.01,
alpha_i = 1/m, L2 0.01 in f_i (the settings of ``experiments/fedapm/table3_mnist.yaml``). One round:

    v-step (9):  v <- v - lr [alpha (grad_v CE + wd v) + sigma (v - v_i^t)]        shared block at u_i^t
    u-step (11): u <- u - lr [alpha (grad_u CE + wd u) + pi_i + rho (u - u^t)]     from u^t, head at v_i^{t+1}
    (12) pi_i += rho (u_i^{t+1} - u^t);  (13) z_i = u_i + pi_i / rho;  server u = (1/m) sum_i z_i (all m, stale)

plain: a PFLlib-style client object (its own model copy, a ``torch.optim.SGD`` over the phase's parameters, the
other block frozen with ``requires_grad``, the extra terms added to the loss, ``backward()``). fastest: one
preallocated flat parameter vector, the u-phase by the hand-written chain of ``handwritten.py`` (no autograd),
the v-phase as multinomial logistic regression on the client's hidden features, computed once per round (the
shared block is fixed during the v-phase, so they do not change), and one fused update per step.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from family_common import Family, Result, clock, on, fedsolve_contenders, flat, load_flat, perturbed, schedule
from handwritten import HandwrittenChain
from round_time import make_data

from fedsolve.families import get_algorithm
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem
from fedsolve.engine import Simulation, SimulationConfig

HIDDEN = (200, 200)
CFG = dict(lr=0.5, rho=0.01, sigma=0.01, alpha="uniform", weight_decay=0.01, local_epochs=3, batch_size=50,
           personalization="output", eval_shared="local", log_stationarity=False, log_other_eval=False)
FRACTION = 0.3


def build(smoke: bool, perturb: set[str], executors: tuple[str, ...] = ("auto", "vectorized"), seed: int = 0,
          device: str = "cpu") -> Family:
    m, n, rounds = (6, 60, 3) if smoke else (20, 100, 4)
    data = make_data({"clients": m, "n": n, "in_shape": (1, 28, 28), "classes": 10}, seed).to(device)
    problem = FederatedProblem(data, build_model_fn("mlp", (1, 28, 28), 10, hidden=HIDDEN))

    def make() -> Simulation:
        algo = get_algorithm("fedapm")(CFG, problem)
        return Simulation(problem, algo, SimulationConfig(rounds=rounds, executor="sequential", metrics=[],
                                                          device=device, sampling={"fraction": FRACTION}), seed=seed)

    sim0 = make()
    algo = sim0.algo
    d_v = algo.d_v
    if d_v != 10 * (HIDDEN[-1] + 1) or not bool(algo.pmask[-d_v:].all()):
        raise RuntimeError("fedapm benchmark: expected the output layer (last in the layout) as the personal block")
    w0 = sim0.server["u"].clone()
    full0 = algo.join(sim0.clients["v"][0], w0)
    sched = schedule(sim0, rounds)
    x = data.train_x.reshape(data.train_x.shape[0], -1).contiguous()
    y = data.train_y
    shapes = [tuple(p.shape) for p in problem.model.parameters()]
    lr = perturbed(CFG["lr"], perturb)

    def state(sim):
        return {"u": sim.server["u"], "v": sim.clients["v"], "pi": sim.clients["pi"]}

    fam = Family("fedapm", f"MLP 784-{'-'.join(map(str, HIDDEN))}-10 (output layer personal), {m} clients x {n} "
                 f"synthetic MNIST-shaped images, {int(FRACTION * 100)}% participation, 3+3 epochs of batch 50, "
                 f"{rounds} rounds", {}, tol=2e-5)
    fam.contenders.update(fedsolve_contenders(make, rounds, state, executors=executors))
    fam.contenders["plain"] = on(device, lambda: plain(problem, full0, x, y, sched, m, lr["plain"]))
    fam.contenders["fastest"] = on(device, lambda: fastest(shapes, full0, d_v, x, y, data.train_offsets, sched, m,
                                                          lr["fastest"]))
    return fam


# ------------------------------------------------------------------ (a) plain PFLlib-style loop
class PlainClient:
    """A FedAPM client as a typical FL library writes one: a model copy (its head is v_i), u_i and pi_i."""

    def __init__(self, model: nn.Module, n_head: int):
        self.model = copy.deepcopy(model)
        params = list(self.model.parameters())
        self.body, self.head = params[:-n_head], params[-n_head:]
        self.u = [p.detach().clone() for p in self.body]
        self.pi = [torch.zeros_like(p) for p in self.body]

    def _set(self, params, values) -> None:
        with torch.no_grad():
            for p, v in zip(params, values):
                p.copy_(v)

    def _loss(self, xb, yb, alpha) -> Tensor:
        ce = F.cross_entropy(self.model(xb), yb)
        return alpha * (ce + 0.5 * CFG["weight_decay"] * sum(p.pow(2).sum() for p in self.model.parameters()))

    def train(self, u_t: list[Tensor], x, y, v_batches, u_batches, lr: float, alpha: float) -> list[Tensor]:
        c = CFG
        # (9) v-step at u_i^t, proximal to v_i^t
        self._set(self.body, self.u)
        for p in self.body:
            p.requires_grad_(False)
        anchor = [p.detach().clone() for p in self.head]
        opt = torch.optim.SGD(self.head, lr=lr)
        for ix in v_batches:
            loss = self._loss(x[ix], y[ix], alpha)
            loss = loss + 0.5 * c["sigma"] * sum((p - a).pow(2).sum() for p, a in zip(self.head, anchor))
            opt.zero_grad()
            loss.backward()
            opt.step()
        for p in self.body:
            p.requires_grad_(True)
        # (11) u-step from u^t with the dual and the penalty
        self._set(self.body, u_t)
        for p in self.head:
            p.requires_grad_(False)
        opt = torch.optim.SGD(self.body, lr=lr)
        for ix in u_batches:
            loss = self._loss(x[ix], y[ix], alpha)
            loss = loss + sum((pi * p).sum() + 0.5 * c["rho"] * (p - ut).pow(2).sum()
                              for p, pi, ut in zip(self.body, self.pi, u_t))
            opt.zero_grad()
            loss.backward()
            opt.step()
        for p in self.head:
            p.requires_grad_(True)
        # (12), (13): the dual, then the change of z_i = u_i + pi_i / rho
        z_old = [u + pi / c["rho"] for u, pi in zip(self.u, self.pi)]
        self.pi = [pi + c["rho"] * (p.detach() - ut) for pi, p, ut in zip(self.pi, self.body, u_t)]
        self.u = [p.detach().clone() for p in self.body]
        return [u + pi / c["rho"] - z for u, pi, z in zip(self.u, self.pi, z_old)]


def plain(problem, full0: Tensor, x, y, sched, m: int, lr: float) -> Result:
    """Client objects, one after another; the server averages z_i over all m clients (running sum)."""
    model = problem.model_fn()
    load_flat(model.parameters(), full0)
    clients = [PlainClient(model, 2) for _ in range(m)]
    u_glob = [p.detach().clone() for p in clients[0].body]
    zsum = [m * u.double() for u in u_glob]
    times = []
    for rnd in sched:
        t0 = clock()
        for k, i in enumerate(rnd.ids):
            dz = clients[i].train(u_glob, x, y, rnd.batches["v"][k], rnd.batches["u"][k], lr, 1.0 / m)
            zsum = [s + d.double() for s, d in zip(zsum, dz)]
        u_glob = [(s / m).float() for s in zsum]
        times.append(clock() - t0)
    return Result(times, {"u": flat(u_glob), "v": torch.stack([flat(c.head) for c in clients]),
                          "pi": torch.stack([flat(c.pi) for c in clients])}, f"{torch.get_num_threads()} thread(s)")


# ------------------------------------------------------------------ (b) fastest sequential loop
def fastest(shapes, full0: Tensor, d_v: int, x, y, offsets, sched, m: int, lr: float) -> Result:
    """Flat rows v_i, u_i, pi_i; the v-phase on the client's hidden features, the u-phase on the hand-written
    chain, each step one fused update."""
    c = CFG
    alpha, wd, rho, sigma = 1.0 / m, c["weight_decay"], c["rho"], c["sigma"]
    d = full0.numel()
    d_u = d - d_v
    net = HandwrittenChain(shapes, c["batch_size"])
    V = full0[d_u:].repeat(m, 1)                       # v_i (the head), flat
    U = full0[:d_u].repeat(m, 1)                       # u_i
    PI = torch.zeros(m, d_u)
    u_glob = full0[:d_u].clone()
    zsum = m * u_glob.double()
    n_out = shapes[-1][0]
    hid = shapes[-2][1]
    shrink_v = 1 - lr * (alpha * wd + sigma)
    shrink_u = 1 - lr * (alpha * wd + rho)
    times = []
    for rnd in sched:
        t0 = clock()
        acc = torch.zeros(d_u, dtype=torch.float64)
        for k, i in enumerate(rnd.ids):
            # (9): logistic regression of the head on the hidden features at u_i^t (fixed in this phase)
            net.P[:d_u].copy_(U[i])
            a = int(offsets[i])
            h = x[a:int(offsets[i + 1])]
            for kk in range(net.n_lin - 1):
                h = torch.addmm(net.W[2 * kk + 1], h, net.W[2 * kk].t()).relu_()
            v = V[i].clone()
            W3, b3 = v[:n_out * hid].view(n_out, hid), v[n_out * hid:]
            anchor = V[i]
            gv = torch.empty_like(v)
            gW, gb = gv[:n_out * hid].view(n_out, hid), gv[n_out * hid:]
            for ix in rnd.batches["v"][k]:
                hb, yb = h[ix - a], y[ix]
                e = torch.softmax(torch.addmm(b3, hb, W3.t()), 1)
                e[torch.arange(len(ix)), yb] -= 1.0
                e.mul_(alpha / len(ix))
                torch.mm(e.t(), hb, out=gW)
                torch.sum(e, 0, out=gb)
                # v <- v (1 - lr (alpha wd + sigma)) - lr (alpha grad CE - sigma v_i^t)
                v.mul_(shrink_v).add_(gv, alpha=-lr).add_(anchor, alpha=lr * sigma)
            V[i] = v
            # (11): the hand-written chain from u^t, head at v_i^{t+1}; its own update is off (lr 0)
            net.P[:d_u].copy_(u_glob)
            net.P[d_u:].copy_(v)
            cst = PI[i] - rho * u_glob                    # pi_i + rho (u - u^t) = rho u + cst
            Pu, Gu = net.P[:d_u], net.G[:d_u]
            for ix in rnd.batches["u"][k]:
                net.step(x, y, ix, 0.0)
                Pu.mul_(shrink_u).add_(Gu, alpha=-lr * alpha).add_(cst, alpha=-lr)
            z_old = U[i] + PI[i] / rho
            PI[i] += rho * (Pu - u_glob)
            U[i] = Pu
            acc += (Pu + PI[i] / rho - z_old).double()
        zsum += acc
        u_glob = (zsum / m).float()
        times.append(clock() - t0)
    return Result(times, {"u": u_glob, "v": V, "pi": PI}, f"{torch.get_num_threads()} thread(s)")
