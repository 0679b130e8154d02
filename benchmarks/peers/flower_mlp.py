"""FedAvg on the exchange folder's MLP workload with Flower's simulation engine (``flwr[simulation]``, Ray backend).

Runs in the peers' own environment (``scripts/setup_peers.sh``), driven by ``mlp_fedavg.py``:
    benchmarks/peers/.venv/bin/python benchmarks/peers/flower_mlp.py EXCHANGE OUT.json --client-cpus 1

Flower's message API (``ServerApp`` + the ``FedAvg`` strategy's ``start``, a ``ClientApp`` with a ``train``
function) under ``flwr.simulation.run_simulation`` with one virtual SuperNode per client. Ray gets the machine's
cores (``--ray-cpus``, default all); each ClientApp asks for ``--client-cpus`` of them and trains with as many
torch threads, so 1 runs two clients at once on a 2-core machine and 2 runs one at a time with two threads.
The client trains a ``torch.optim.SGD`` on its samples in the exchange's order for the round (the minibatches
of fedsolve); ``fraction_evaluate=0`` (no client evaluation). Round times are the gaps between the strategy's
``evaluate_fn`` calls (made before round 1 and after every round), round 1 being the warm-up.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Exchange, write_result  # noqa: E402

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

_ENV_EXCHANGE, _ENV_THREADS = "FEDSOLVE_PEERS_EXCHANGE", "FEDSOLVE_PEERS_THREADS"
_cache: dict = {}


def _exchange() -> Exchange:
    """The exchange folder, read once per process (each Ray actor has its own copy)."""
    if "ex" not in _cache:
        torch.set_num_threads(int(os.environ.get(_ENV_THREADS, "1")))
        _cache["ex"] = Exchange(os.environ[_ENV_EXCHANGE])
        _cache["net"] = _cache["ex"].model()
    return _cache["ex"]


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    ex = _exchange()
    net: nn.Module = _cache["net"]
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    cid = int(context.node_config["partition-id"])
    r = int(msg.content["config"]["server-round"]) - 1
    x, y = ex.client(cid)
    order = torch.from_numpy(ex.order(r, cid).astype(np.int64))
    opt = torch.optim.SGD(net.parameters(), lr=ex.lr)
    loss_sum, steps = torch.zeros(()), 0
    for b0 in range(0, len(order), ex.batch):
        ix = order[b0:b0 + ex.batch]
        loss = nn.functional.cross_entropy(net(x[ix]), y[ix])
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_sum += loss.detach()
        steps += 1
    metrics = MetricRecord({"train_loss": float(loss_sum) / steps, "steps": steps, "num-examples": len(y)})
    return Message(content=RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)


def make_server_app(ex: Exchange, rounds: int, out: str, config: str) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        stamps, final = [], {}

        def evaluate_fn(rnd: int, arrays: ArrayRecord):
            stamps.append(time.perf_counter())
            if rnd == rounds:
                final["arrays"] = arrays
            return None

        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=ex.m,
                          min_available_nodes=ex.m)
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(ex.model().state_dict()),
                                num_rounds=rounds, evaluate_fn=evaluate_fn)
        tm = result.train_metrics_clientapp
        losses = [float(tm[r]["train_loss"]) for r in range(1, rounds + 1)]
        steps = [int(round(float(tm[r]["steps"]) * ex.m)) for r in range(1, rounds + 1)]
        sd = final["arrays"].to_torch_state_dict()
        w = torch.cat([v.reshape(-1) for v in sd.values()])
        import flwr
        import ray
        write_result(out, "flower", list(np.diff(stamps)), losses, steps, w, version=flwr.__version__,
                     ray=ray.__version__, config=config)

    return app


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("exchange")
    ap.add_argument("out")
    ap.add_argument("--client-cpus", type=int, default=1, help="CPUs (and torch threads) of each ClientApp")
    ap.add_argument("--ray-cpus", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    os.environ[_ENV_EXCHANGE] = str(Path(args.exchange).resolve())
    os.environ[_ENV_THREADS] = str(args.client_cpus)
    ex = Exchange(args.exchange)
    rounds = ex.perms.shape[0]
    config = (f"Ray {args.ray_cpus} CPUs, {args.client_cpus} CPU(s) and torch thread(s) per ClientApp, "
              f"{max(1, args.ray_cpus // args.client_cpus)} at once")
    run_simulation(server_app=make_server_app(ex, rounds, args.out, config), client_app=client_app,
                   num_supernodes=ex.m,
                   backend_config={"client_resources": {"num_cpus": args.client_cpus, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": args.ray_cpus, "include_dashboard": False}})
    if not Path(args.out).is_file():
        print("flower_mlp: the ServerApp wrote no result (see the log above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
