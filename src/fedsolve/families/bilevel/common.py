"""What every bilevel solver shares around its protocol: the server holds the upper variable ``x`` and the lower
variable ``y`` (and, where the solver keeps one, the linear-system variable ``v``); a client is evaluated on the
model that joins ``x`` and ``y``. At each evaluation the solvers also report ``v_norm`` and, for classification,
``train_accuracy``: the global model (x, y) on the full training set, the left axis of SimFBO's Fig. 2."""

from __future__ import annotations

import torch

from fedsolve.engine.algorithm import Algorithm

#: rows per forward pass of the training-accuracy read-out (bounds its memory)
TRAIN_EVAL_CHUNK = 4096


class BilevelAlgorithm(Algorithm):
    """Base of SimFBO, ShroFBO, FBO-AggITD and the FedNest family (``self.oracles`` is set in ``setup``)."""

    def eval_broadcast(self, server, ids):
        return {k: self.expand(server[k], ids) for k in ("x", "y")}

    def eval_model(self, state, msg):
        return self.oracles.join(msg["x"], msg["y"])

    def diagnostics(self, server, clients):
        out = {"v_norm": float(server["v"].norm())} if "v" in server else {}
        if self.problem.data.task == "classification":
            out["train_accuracy"] = self.train_accuracy(server["x"], server["y"])
        return out

    def train_accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Accuracy of the global model (x, y) on every client's training rows, both splits pooled (spec 3.8:
        "the global model on the full training set"), in eval mode."""
        d, model = self.problem.data, self.problem.model
        training = model.training
        model.eval()
        correct = 0
        with torch.no_grad():
            for a in range(0, d.train_x.shape[0], TRAIN_EVAL_CHUNK):
                out = self.oracles.outputs(x, y, d.train_x[a:a + TRAIN_EVAL_CHUNK])
                correct += int((out.argmax(-1) == d.train_y[a:a + TRAIN_EVAL_CHUNK]).sum())
        model.train(training)
        return correct / max(d.train_x.shape[0], 1)
