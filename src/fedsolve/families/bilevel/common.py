"""What every bilevel solver shares around its protocol: the server holds the upper variable ``x`` and the lower
variable ``y`` (and, where the solver keeps one, the linear-system variable ``v``); a client is scored with the
model that joins ``x`` and ``y``. At each evaluation the solvers also report ``v_norm`` and, for classification,
``train_accuracy``: the global model (x, y) on the full training set, the left axis of SimFBO's Fig. 2; for a
problem stated by the clients' own functions, ``upper_loss`` (sum_i p_i f_i(x, y)) and ``lower_grad_norm``
(||sum_i p_i grad_y g_i(x, y)||), on the clients' whole splits, and ``x_dist_<name>`` (||x - point||) for each known
point of x the problem names (``client_problem(references=...)``)."""

from __future__ import annotations

import torch

from fedsolve.engine.algorithm import Algorithm, expand
from fedsolve.families.bilevel.checks import full_split
from fedsolve.families.bilevel.oracles import make_oracles
from fedsolve.families.bilevel.problem import BilevelOracles

#: rows per forward pass of the training-accuracy read-out (bounds its memory)
TRAIN_EVAL_CHUNK = 4096


def sent(server, ids, keys) -> dict[str, torch.Tensor]:
    """The server tensors ``keys``, one row per selected client."""
    return {k: expand(server[k], ids) for k in keys}


class BilevelAlgorithm(Algorithm):
    """Base of SimFBO, ShroFBO, FBO-AggITD and the FedNest family (``self.oracles`` is set by :meth:`use_oracles`)."""

    #: the run's client sampling (``engine.sampling.SamplingConfig``), told by the engine before the first round;
    #: None: uniform without replacement
    sampling = None

    def use_oracles(self, kind: str = "auto") -> BilevelOracles:
        """Set ``self.oracles`` (``oracles.make_oracles``), what the divergence guard watches (the upper loss of a
        model: cross entropy, squared error, positive and falling; the iterate x of the clients' own functions, whose
        values may have any sign) and whether the oracles draw independent minibatches."""
        self.oracles = make_oracles(self.problem, kind)
        fns = self.oracles.spec.functions
        self.watch = "x" if fns is not None else "train_loss"
        #: independent minibatches per oracle (``independent_batches``), where there are samples to draw them from
        self.independent = bool(getattr(self.cfg, "independent_batches", False)) and (fns is None or fns.samples)
        return self.oracles

    def p(self) -> torch.Tensor:
        """Objective weights p_i of Phi = sum_i p_i f_i (float64, sum to 1): equal unless a solver says otherwise."""
        return torch.full((self.num_clients,), 1.0 / self.num_clients, dtype=torch.float64)

    def eval_model(self, state, msg):
        return self.oracles.join(msg["x"], msg["y"])

    def report(self, server, clients, final=False):
        if final:
            return {}
        out = {"v_norm": float(server["v"].norm())} if "v" in server else {}
        if self.oracles.spec.functions is not None:
            out.update(self.objective(server["x"], server["y"]))
        elif self.problem.data.task == "classification":
            out["train_accuracy"] = self.train_accuracy(server["x"], server["y"])
        return out

    def objective(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """``upper_loss`` = sum_i p_i f_i(x, y) and ``lower_grad_norm`` = ||sum_i p_i grad_y g_i(x, y)||, every client
        on its whole splits; ``x_dist_<name>`` = ||x - point|| for the problem's known points of x."""
        spec, data, p = self.oracles.spec, self.problem.data, self.p()
        f = torch.zeros((), dtype=torch.float64)
        gy = torch.zeros(y.shape, dtype=torch.float64)
        with torch.enable_grad():
            for i in range(self.num_clients):
                O = self.oracles.on(torch.tensor(i))
                f = f + p[i] * O.f(x, y, full_split(data, i, spec.upper_group)).detach().double()
                gy = gy + p[i] * O.grad_y_g(x, y, full_split(data, i, spec.lower_group))[0].detach().double()
        dist = {f"x_dist_{k}": float((x.detach() - r.to(x)).norm()) for k, r in spec.functions.references.items()}
        return {"upper_loss": float(f), "lower_grad_norm": float(gy.norm()), **dist}

    def train_accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Accuracy of the global model (x, y) on every client's training rows, both splits pooled (spec 3.8:
        "the global model on the full training set"), in eval mode."""
        d, model = self.problem.data, self.problem.model
        training = model.training
        model.eval()
        correct = 0
        with torch.no_grad():
            for a in range(0, d.train_x.shape[0], TRAIN_EVAL_CHUNK):
                out = self.oracles.outputs(x, y, d.train_x[a : a + TRAIN_EVAL_CHUNK])
                correct += int((out.argmax(-1) == d.train_y[a : a + TRAIN_EVAL_CHUNK]).sum())
        model.train(training)
        return correct / max(d.train_x.shape[0], 1)
