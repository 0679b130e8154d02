"""FedAvg on the exchange folder's MLP workload with Apple's pfl-research simulator (``pfl[pytorch]``).

Runs in the peers' own environment (``scripts/setup_peers.sh``), driven by ``mlp_fedavg.py``:
    benchmarks/peers/.venv/bin/python benchmarks/peers/pfl_mlp.py EXCHANGE OUT.json [--threads 1]

pfl's own pieces do the work: ``FederatedAveraging`` with a ``SimulatedBackend`` over a ``FederatedDataset``
(``minimize_reuse`` sampler, a cohort of every client), ``PyTorchModel`` with a ``torch.optim.SGD`` local
optimizer and a central SGD of learning rate 1 on the averaged model difference (= averaging the models).
pfl iterates a user's dataset in order, so the dataset handed out for a client in round r holds its samples in
that round's order (the exchange's ``perms``): the minibatches are then the same as fedsolve's. Round times are
the gaps between ``after_central_iteration`` calls (the first from ``on_train_begin``), round 0 being the warm-up.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Exchange, write_result  # noqa: E402

from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.callback.base import TrainingProcessCallback  # noqa: E402
from pfl.data.dataset import Dataset  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.data.sampling import get_user_sampler  # noqa: E402
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams  # noqa: E402
from pfl.metrics import Metrics, Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402


class LossMLP(nn.Module):
    """The MLP with the ``loss`` and ``metrics`` methods pfl asks of a model; ``loss`` keeps each step's value."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.step_losses: list[torch.Tensor] = []

    def forward(self, x):
        return self.net(x)

    def loss(self, x, y, eval=False):  # noqa: A002 - pfl's signature
        out = nn.functional.cross_entropy(self.net(x), y)
        self.step_losses.append(out.detach())
        return out

    @torch.no_grad()
    def metrics(self, x, y, eval=False):  # noqa: A002
        return {"loss": Weighted(float(nn.functional.cross_entropy(self.net(x), y)) * len(y), len(y))}


class Clock(TrainingProcessCallback):
    """Round times and round losses (mean of the round's minibatch losses: every client has as many steps)."""

    def __init__(self, module: LossMLP):
        self.module, self.times, self.losses, self.steps = module, [], [], []

    def on_train_begin(self, *, model):
        self.t = time.perf_counter()
        return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        now = time.perf_counter()
        self.times.append(now - self.t)
        ls = self.module.step_losses
        self.losses.append(float(torch.stack(ls).double().mean()) if ls else float("nan"))
        self.steps.append(len(ls))
        ls.clear()
        self.t = time.perf_counter()   # the bookkeeping above is not part of the next round
        return False, Metrics()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("exchange")
    ap.add_argument("out")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ex = Exchange(args.exchange)
    rounds = ex.perms.shape[0]
    calls = {"n": 0}

    def make_dataset(user_id):
        r = calls["n"] // ex.m      # every round asks for each of the m clients once
        calls["n"] += 1
        x, y = ex.client(user_id)
        o = torch.from_numpy(ex.order(r, user_id).astype(np.int64))
        return Dataset(raw_data=[x[o], y[o]], user_id=str(user_id))

    data = FederatedDataset(make_dataset, get_user_sampler("minimize_reuse", list(range(ex.m))))
    module = LossMLP(ex.model())
    model = PyTorchModel(module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    backend = SimulatedBackend(training_data=data, val_data=None)
    clock = Clock(module)
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=10**9,
                                           train_cohort_size=ex.m, val_cohort_size=0),
        backend=backend, model=model,
        model_train_params=NNTrainHyperParams(local_num_epochs=1, local_learning_rate=ex.lr,
                                              local_batch_size=ex.batch),
        model_eval_params=NNEvalHyperParams(local_batch_size=None), callbacks=[clock],
        send_metrics_to_platform=False)
    w = torch.cat([p.detach().reshape(-1) for p in module.net.parameters()])
    import pfl
    write_result(args.out, "pfl", clock.times, clock.losses, clock.steps, w, version=pfl.__version__,
                 config=f"SimulatedBackend, {args.threads} torch thread(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
