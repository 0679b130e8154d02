"""Prox-AL FL (He, Peng & Sun, TMLR 2024): Algorithm 1 (proximal AL outer loop) around Algorithm 2 (inexact
ADMM inner loop), one engine round per communication round. With P_{i,k} of Eqs. 13-14, sigma = 1/((n+1) beta):

Algorithm 1, outer iteration k = 0, 1, 2, ...
    tau_k = s_bar / (k+1)^2
    w^{k+1} = Algorithm 2 (tau_k, w^k)               dist_inf(0, d l_k(w^{k+1})) <= tau_k        (Eq. 10)
    mu_0^{k+1} = [mu_0^k + beta c_0(w^{k+1})]_+      (server)
    mu_i^{k+1} = [mu_i^k + beta c_i(w^{k+1})]_+      (client i; uploads only ||mu_i^{k+1} - mu_i^k||_inf)
    stop if ||w^{k+1} - w^k||_inf + beta tau_k <= beta eps1 and max_i ||mu_i^{k+1} - mu_i^k||_inf <= beta eps2  (Eq. 11)

Algorithm 2 from w~^0 = w^k: u_i^0 = w^k, lambda_i^0 = -grad P_i(w^k), u~_i^0 = u_i^0 + lambda_i^0 / rho; t = 0, 1, ...
    eps_{t+1} = q^t
    server:  w^{t+1} ~ argmin P_0(w) + h(w) + sum_i rho/2 ||u~_i^t - w||^2                  (Eq. 18)
    client:  u_i^{t+1} ~ argmin P_i(u) + <lambda_i^t, u - w^{t+1}> + rho/2 ||u - w^{t+1}||^2  (Eq. 19)
             lambda_i^{t+1}, u~_i^{t+1}, eps~_i = ||grad P_i(w^{t+1}) - rho (w^{t+1} - u~_i^t)||_inf  (Eqs. 20-22)
    stop if eps_{t+1} + sum_i eps~_i <= tau                                                    (Eq. 23)

The rounds are the phases of :data:`PHASES`: an ``outer`` round broadcasts w^k, the clients take their multiplier
step and restart their ADMM (``start``: the first, without the step); an ``inner`` round broadcasts (w^{t+1},
eps_{t+1}) and collects (u~_i, eps~_i); ``done`` once Eq. 11 passes or ``max_outer`` is reached. The clients'
computations are ``client.py`` (mu_i, lambda_i, u_i stay in their rows), the server's ``server_side.py`` (built
from the server's own party, no client data). Paper-vs-authors'-code differences are options (``config.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from fedsolve.core.plans import Work
from fedsolve.core.statements import Solved
from fedsolve.engine.algorithm import Algorithm, expand, register
from fedsolve.engine.phases import Phase, PhaseTable
from fedsolve.families.constrained import kkt
from fedsolve.families.constrained.client import ClientSide
from fedsolve.families.constrained.config import ProxALConfig, initial_point
from fedsolve.families.constrained.problem import get_spec
from fedsolve.families.constrained.server_side import ServerSide
from fedsolve.families.constrained.stops import run_status, watch_feasibility

# fmt: off
PHASES = PhaseTable(
    Phase("start", sends=("w_outer",), uploads=("ut", "dmu"), then=("inner",),
          doc="Alg. 2 line 1 at w^0 (a quadratic client builds its model)"),
    Phase("outer", sends=("w_outer",), uploads=("ut", "dmu"), then=("inner", "done"),
          doc="Alg. 1 lines 6-9 at w^{k+1}: multiplier steps, Eq. 11; then Alg. 2 line 1"),
    Phase("inner", sends=("w", "eps"), uploads=("ut", "et", "res"), then=("inner", "outer"),
          doc="Alg. 2 lines 3-10: Eqs. 18-23; Eq. 23 passed: Alg. 1 lines 3-5"),
    Phase("done", doc="Eq. 11 passed or max_outer reached"),
    start="start", done="done")
# fmt: on

F64 = torch.float64


def scalar(v, dtype=F64) -> torch.Tensor:
    return torch.scalar_tensor(v, dtype=dtype)  # half torch.tensor's cost (a few per round)


@register
class ProxAL(Algorithm):
    name = "proxal"
    description = "Prox-AL FL: proximal AL outer loop + inexact ADMM inner loop for constrained FL (He et al. 2024)"
    Config = ProxALConfig
    cfg: ProxALConfig
    reports_train_loss = False  # a round solves Eq. 19 or updates multipliers: the certificate is the record
    watch = "w"  # the iterate w must stay below divergence_factor x max(1, |w^0|_inf)
    #: the round's finiteness check reads the iterates and the uploads; the server's scalar records (tau, gap, dw,
    #: dmu, residuals) are computed from exactly these, so a NaN or inf there shows in them first
    finite_check_keys = ("w", "w0", "z", "mu0")
    phases = PHASES
    #: the run's client sampling (``engine.sampling.SamplingConfig``), told before the first round; None: not told
    sampling = None

    def setup(self) -> None:
        spec = self.spec = get_spec(self.problem, self.name)
        solver = self.cfg.solver
        if solver == "auto":
            solver = "quadratic" if spec.quadratic else "newton"
        if solver == "quadratic" and not spec.quadratic:
            raise ValueError(f"{self.name}: solver 'quadratic' needs a quadratic problem (ConstrainedSpec.quadratic)")
        self.solver_kind = solver
        n = self.num_clients
        self.client = ClientSide(spec, self.cfg, n, solver)
        self.sigma = self.client.sigma  # 1 / ((n + 1) beta): every party's share of the prox term
        self.server_side = ServerSide(spec.server, n, self.cfg, spec.quadratic, solver)  # no client data

    def work(self, round_: int | None = 0) -> dict[str, Work]:
        return {} if round_ is None else {"train": Work(epochs=None, steps=1, batch_size=None)}  # Z_i in full

    def init(self, x0, rngs):
        s, n = self.sampling, self.num_clients
        if s is not None and (s.count(n) != n or s.dropout > 0):
            raise ValueError(
                f"simulation.sampling: Algorithms 1-2 use every client in every round, got "
                f"{s.count(n)} of {n} clients a round (dropout {s.dropout}); allowed: fraction 1.0 (or "
                f"clients_per_round {n}) and dropout 0"
            )
        c, z = self.cfg, scalar(0.0)
        w0 = initial_point(c.w0, x0, rngs.torch("proxal_w0"))
        count = lambda: torch.zeros((), dtype=torch.long)
        server = {
            **PHASES.init(),
            "w": w0.clone(),
            "w0": w0.clone(),
            "z": w0.clone(),
            "mu0": torch.full((self.spec.m_server,), c.mu0, dtype=F64),
            "k": count(),
            "t": count(),
            "tau": scalar(c.s_bar),
            "srv_res": z,
            "gap": z,
            "dw": z,
            "dmu": z,
            "dmu0": z,
            "admm_rounds": count(),
            "inner_caps": count(),
            "converged": count(),
            "client_res": z,
            "solve_misses": count(),
            "dmu_ref": scalar(1e300),
            "stall": count(),
        }
        return server, self.client.init_rows(x0.numel())

    def _eps(self, t: int) -> float:
        return max(self.cfg.q**t, self.cfg.eps_floor)

    # ----------------------------------------------------------------- a round
    def broadcast(self, server, ids, round_):
        if round_ is None:  # the clients are scored with w^k
            return {"w": expand(server["w"], ids)}
        if ids.numel() != self.num_clients:
            raise ValueError(
                f"simulation.sampling: Algorithms 1-2 use every client in every round; got "
                f"{ids.numel()} of {self.num_clients}; allowed: fraction 1.0"
            )
        phase = PHASES.current(server)
        if phase == "inner":
            return PHASES.message(
                "inner", ids, w=expand(server["z"], ids), eps=expand(scalar(self._eps(int(server["t"]))), ids)
            )
        if phase == "done":
            return PHASES.message("done", ids)
        return PHASES.message(phase, ids, w_outer=expand(server["w"], ids))

    def local_update(self, state, msg, ctx):
        phase = PHASES.of(msg)
        if phase == "inner":  # Alg. 2 lines 7-8: Eqs. 19-22
            return self.client.step(state, msg["w"], msg["eps"], ctx)
        if phase == "done":
            return Solved({}, {})
        return self.client.restart(state, msg["w_outer"], phase == "start", ctx)  # Alg. 1 line 7, Alg. 2 line 1

    def aggregate(self, server, ids, uploads, round_):
        c, s, phase = self.cfg, dict(server), PHASES.current(server)
        if phase == "done":
            return s
        if phase == "inner":  # Alg. 2 line 10: Eq. 23
            t, tau = int(server["t"]), float(server["tau"])
            server_term = {"paper": self._eps(t), "measured": float(server["srv_res"]), "code": 0.0}[c.inner_stop]
            gap = server_term + float(uploads["et"].sum())
            res = uploads["res"].double()
            s.update(
                gap=scalar(gap),
                client_res=res.max().clamp_min(0),
                admm_rounds=server["admm_rounds"] + 1,
                solve_misses=server["solve_misses"] + int((res > c.client_tol_factor * self._eps(t)).sum()),
            )
            if gap > tau and t + 1 < c.max_inner:  # the next ADMM round: Eq. 18
                s["t"] = server["t"] + 1
                return self._solve_server(s, uploads, server["z"], t + 1)
            s["inner_caps"] = server["inner_caps"] + int(gap > tau)
            w_new = server["z"]  # Alg. 1 lines 3-5: w^{k+1}, mu_0^{k+1}
            mu0 = self.server_side.update_mu(server["mu0"], w_new)
            s.update(
                dmu0=(mu0 - server["mu0"]).abs().max() if mu0.numel() else scalar(0.0),
                mu0=mu0,
                w=w_new,
                dw=(w_new - server["w"]).abs().max(),
                k=server["k"] + 1,
            )
            return PHASES.enter(s, "outer", round_)
        if phase == "outer":  # Alg. 1 line 9: Eq. 11 for w^{k+1}, mu^{k+1}
            dw, dmu = float(server["dw"]), max(float(server["dmu0"]), float(uploads["dmu"].max()))
            s["dmu"] = scalar(dmu)
            if dw + c.beta * float(server["tau"]) <= c.beta * c.eps1 and dmu <= c.beta * c.eps2:
                s["converged"] = torch.ones((), dtype=torch.long)
                return PHASES.enter(s, "done", round_)
            if int(server["k"]) >= c.max_outer:
                return PHASES.enter(s, "done", round_)
            watch_feasibility(self.name, c, self.spec, s, server, dmu, uploads["dmu"])
        k = int(server["k"])  # Alg. 1 line 2, then Alg. 2 from w^k
        s.update(tau=scalar(c.s_bar / (k + 1) ** 2), t=torch.zeros((), dtype=torch.long))
        start = server["w0"] if c.admm_start == "w0" else server["w"]
        return PHASES.enter(self._solve_server(s, uploads, start, 0), "inner", round_)

    def _solve_server(self, s, uploads, start, t: int):
        """Eq. 18 with the clients' u~_i to tolerance eps_{t+1}: the next w^{t+1} (``z``) and its residual."""
        z, res = self.server_side.solve(uploads["ut"].double(), s["mu0"], s["w"], start, self._eps(t))
        s.update(z=z, srv_res=scalar(res))
        return s

    def eval_model(self, state, msg):
        return msg["w"].to(next(self.problem.model.parameters()).dtype)

    # ----------------------------------------------------------------- records
    def report(self, server, clients, final: bool = False) -> dict[str, Any]:
        cert = kkt.certificate(self.spec, self.problem.data, server["w"], server["mu0"], clients["mu"])
        k, started = int(server["k"]), PHASES.current(server) != "start"
        out = {
            **cert,
            "outer_iterations": k,
            "admm_rounds": int(server["admm_rounds"]),
            "outer_rounds": k + 1 if started else 0,
            "inner_cap_hits": int(server["inner_caps"]),
            "converged": int(server["converged"]),
            "certified": int(kkt.certified(cert, self.cfg.eps1, self.cfg.eps2)),
            "tau": float(server["tau"]),
            "inner_gap": float(server["gap"]),
            "client_subproblem_residual": float(server["client_res"]),
            "client_solves_above_tolerance": int(server["solve_misses"]),
        }
        if not final:
            return out
        out["status"] = run_status(self.cfg, server, cert, PHASES.finished(server))
        out.update(kkt.final_record(self.spec, self.problem.data, server["w"], server["mu0"], clients["mu"]))
        return {"constrained": out}
