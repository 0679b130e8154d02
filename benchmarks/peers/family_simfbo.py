"""SimFBO (Algorithm 1, ``src/fedsolve/families/bilevel/simfbo.py``) on the MNIST hyper-representation problem:
fedsolve against a plain and a fastest client-by-client loop (``families.py``).

Workload: SimFBO Sec. 5's MLP 784-200-10 (x = the hidden layer, 157,000 parameters; y = the output layer, 2,010;
lower level g_i = CE + (0.1/2)||y||^2 on the client's lower split, upper level f_i = CE on its upper split),
100 clients x 600 MNIST-shaped synthetic rows (300 lower / 300 upper, ``bilevel_hvp.make_problem``), 10 clients
sampled a round, tau = 1, batch 64, five independent minibatches a step, the paper's steps (A.2). One round,
client i at the server's (x, y, v):

    d_y = grad_y g(zeta)     d_v = grad2_yy g(psi_l) v - grad_y f(psi_u)     d_x = grad_x f(xi_u) - grad2_xy g(xi_l) v
    server: (x, y, v) -= gamma (1/P) sum_i (d_x, d_y, d_v)_i                  (eq. 5 with p~_i = n/P * 1/n, a = 1)

plain: a PFLlib-style client (a model copy, ``torch.autograd.grad`` with ``create_graph=True`` for the
Hessian-vector and mixed products, as the FedNest/SimFBO code does). fastest: the closed forms of the MLP head
written out per client (one forward pass per minibatch, the x-gradients of f and of <grad_y g, v> in ONE
matrix product over both minibatches), no autograd.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bilevel_hvp import make_problem
from family_common import Family, Result, clock, on, fedsolve_contenders, flat, load_flat, perturbed, schedule

from fedsolve.families import get_algorithm
from fedsolve.engine import Simulation, SimulationConfig

LAM, BATCH, PER_ROUND = 0.1, 64, 10
STEPS = dict(eta_y=0.2, eta_v=0.1, eta_x=0.05, gamma_y=0.2, gamma_v=0.1, gamma_x=0.05)
PHASES = ("lower_y", "lower_v", "upper_v", "upper_x", "lower_x")


def build(smoke: bool, perturb: set[str], executors: tuple[str, ...] = ("auto", "vectorized"), seed: int = 0,
          device: str = "cpu") -> Family:
    m, n, per, rounds = (10, 100, 4, 3) if smoke else (100, 600, PER_ROUND, 6)
    problem = make_problem(clients=m, n=n, seed=seed)
    cfg = {"batch_size": BATCH, "tau": 1, **STEPS}

    def make() -> Simulation:
        algo = get_algorithm("simfbo")(cfg, problem)
        return Simulation(problem, algo, SimulationConfig(rounds=rounds, executor="sequential", metrics=[],
                                                          device=device, sampling={"clients_per_round": per}),
                          seed=seed)

    sim0 = make()
    start = {k: sim0.server[k].clone() for k in ("x", "y", "v")}
    sched = schedule(sim0, rounds)
    data = problem.data
    xs = data.train_x.reshape(data.train_x.shape[0], -1).contiguous()
    gx = perturbed(STEPS["gamma_x"], perturb)

    def state(sim):
        return {k: sim.server[k] for k in ("x", "y", "v")}

    fam = Family("simfbo", f"hyper-representation, MLP 784-200-10 (x: hidden layer, y: head), {m} clients x {n} "
                 f"synthetic MNIST-shaped rows (lower/upper halves), {per} clients a round, tau = 1, batch {BATCH}, "
                 f"{rounds} rounds", {}, tol=1e-6)
    fam.contenders.update(fedsolve_contenders(make, rounds, state, executors=executors))
    fam.contenders["plain"] = on(device, lambda: plain(problem.model_fn(), start, xs, data.train_y, sched,
                                                       gx["plain"]))
    fam.contenders["fastest"] = on(device, lambda: fastest(start, xs, data.train_y, sched, gx["fastest"]))
    return fam


def _server_step(srv: dict[str, Tensor], sums: dict[str, Tensor], k: int, gamma_x: float) -> dict[str, Tensor]:
    g = {"x": gamma_x, "y": STEPS["gamma_y"], "v": STEPS["gamma_v"]}
    return {z: srv[z] - g[z] * (sums[z] / k) for z in srv}


# ------------------------------------------------------------------ (a) plain PFLlib-style loop
class PlainClient:
    """One client's three directions by autograd on its own model copy (double backward for the products)."""

    def __init__(self, model: nn.Module):
        self.model = copy.deepcopy(model)
        params = list(self.model.parameters())
        self.body, self.head = params[:2], params[2:]

    def load(self, x: Tensor, y: Tensor) -> None:
        load_flat(self.body, x)
        load_flat(self.head, y)

    def g(self, xb, yb) -> Tensor:
        return F.cross_entropy(self.model(xb), yb) + 0.5 * LAM * sum(p.pow(2).sum() for p in self.head)

    def f(self, xb, yb) -> Tensor:
        return F.cross_entropy(self.model(xb), yb)

    def directions(self, v: list[Tensor], data, b: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        X, Y = data
        dy = torch.autograd.grad(self.g(X[b["lower_y"]], Y[b["lower_y"]]), self.head)
        gy = torch.autograd.grad(self.g(X[b["lower_v"]], Y[b["lower_v"]]), self.head, create_graph=True)
        hv = torch.autograd.grad(sum((a * c).sum() for a, c in zip(gy, v)), self.head)
        fy = torch.autograd.grad(self.f(X[b["upper_v"]], Y[b["upper_v"]]), self.head)
        fx = torch.autograd.grad(self.f(X[b["upper_x"]], Y[b["upper_x"]]), self.body)
        gy = torch.autograd.grad(self.g(X[b["lower_x"]], Y[b["lower_x"]]), self.head, create_graph=True)
        jx = torch.autograd.grad(sum((a * c).sum() for a, c in zip(gy, v)), self.body)
        return (flat(fx) - flat(jx)), flat(dy), flat(hv) - flat(fy)


def plain(model: nn.Module, start: dict[str, Tensor], X, Y, sched, gamma_x: float) -> Result:
    srv = {k: t.clone() for k, t in start.items()}
    client = PlainClient(model)   # a client object per round's participant, as a library would (re)use one
    shapes = [p.shape for p in client.head]
    times = []
    for rnd in sched:
        t0 = clock()
        sums = {z: torch.zeros_like(srv[z]) for z in srv}
        v = [t.view(s) for t, s in zip(srv["v"].split([s.numel() for s in shapes]), shapes)]
        for k, _ in enumerate(rnd.ids):
            client.load(srv["x"], srv["y"])
            dx, dy, dv = client.directions(v, (X, Y), {ph: rnd.batches[ph][k][0] for ph in rnd.batches})
            sums["x"] += dx
            sums["y"] += dy
            sums["v"] += dv
        srv = _server_step(srv, sums, len(rnd.ids), gamma_x)
        times.append(clock() - t0)
    return Result(times, srv, f"{torch.get_num_threads()} thread(s)")


# ------------------------------------------------------------------ (b) fastest sequential loop
def fastest(start: dict[str, Tensor], X, Y, sched, gamma_x: float) -> Result:
    srv = {k: t.clone() for k, t in start.items()}
    d_in = X.shape[1]
    hid = srv["x"].numel() // (d_in + 1)
    n_out = srv["y"].numel() // (hid + 1)
    times = []

    def fwd(W1, b1, W2, b2, rows, residual: bool = True):
        xb = X[rows]
        h = torch.addmm(b1, xb, W1.t()).relu_()
        p = torch.softmax(torch.addmm(b2, h, W2.t()), 1)
        if not residual:
            return xb, h, p, None
        r = p.clone()
        r[torch.arange(len(rows)), Y[rows]] -= 1.0
        return xb, h, p, r.div_(len(rows))          # r = w (p - e), w = 1/B

    def hvp_terms(h, p, VW, vb, B):
        u = torch.addmm(vb, h, VW.t())
        dp = p * u
        dp -= p * dp.sum(1, keepdim=True)            # p * u - p (p . u)
        return dp.div_(B)                             # w dp

    for rnd in sched:
        t0 = clock()
        x, y, v = srv["x"], srv["y"], srv["v"]
        W1, b1 = x[:hid * d_in].view(hid, d_in), x[hid * d_in:]
        W2, b2 = y[:n_out * hid].view(n_out, hid), y[n_out * hid:]
        VW, vb = v[:n_out * hid].view(n_out, hid), v[n_out * hid:]
        sx, sy, sv = torch.zeros_like(x), torch.zeros_like(y), torch.zeros_like(v)
        sxW, sxb = sx[:hid * d_in].view(hid, d_in), sx[hid * d_in:]
        syW, syb = sy[:n_out * hid].view(n_out, hid), sy[n_out * hid:]
        svW, svb = sv[:n_out * hid].view(n_out, hid), sv[n_out * hid:]
        for k, _ in enumerate(rnd.ids):
            b = {ph: rnd.batches[ph][k][0] for ph in rnd.batches}
            # d_y = r^T h + lam y on zeta
            _, h, _, r = fwd(W1, b1, W2, b2, b["lower_y"])
            syW.addmm_(r.t(), h).add_(W2, alpha=LAM)
            syb.add_(r.sum(0)).add_(b2, alpha=LAM)
            # d_v = (w dp)^T h + lam v on psi_l, minus r^T h on psi_u
            _, h, p, _ = fwd(W1, b1, W2, b2, b["lower_v"], residual=False)
            wdp = hvp_terms(h, p, VW, vb, len(b["lower_v"]))
            svW.addmm_(wdp.t(), h).add_(VW, alpha=LAM)
            svb.add_(wdp.sum(0)).add_(vb, alpha=LAM)
            _, h, _, r = fwd(W1, b1, W2, b2, b["upper_v"])
            svW.addmm_(r.t(), h, alpha=-1.0)
            svb.sub_(r.sum(0))
            # d_x: backprop of r W2 (xi_u) minus that of r VW + (w dp) W2 (xi_l), one product over both batches
            xu, hu, _, ru = fwd(W1, b1, W2, b2, b["upper_x"])
            xl, hl, pl, rl = fwd(W1, b1, W2, b2, b["lower_x"])
            wdp = hvp_terms(hl, pl, VW, vb, len(b["lower_x"]))
            du = (ru @ W2).mul_(hu > 0)
            dl = torch.addmm(wdp @ W2, rl, VW).mul_(hl > 0).neg_()
            dpre = torch.cat([du, dl])
            sxW.addmm_(dpre.t(), torch.cat([xu, xl]))
            sxb.add_(dpre.sum(0))
        srv = _server_step(srv, {"x": sx, "y": sy, "v": sv}, len(rnd.ids), gamma_x)
        times.append(clock() - t0)
    return Result(times, srv, f"{torch.get_num_threads()} thread(s)")
