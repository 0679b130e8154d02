"""``simulation.tf32`` on a real GPU: how far a float32 LeNet run on CUDA lands from the same run on the CPU, with
TensorFloat-32 off (the default) and on.

Workload: FedAvg on LeNet (2 conv + 2 fc), MNIST-shaped random data (1x28x28, 10 classes), 20 clients x 60 rows,
10 sampled per round, batch 16, 2 local epochs, 3 rounds, float32, under the ``sequential`` and the ``batched``
executor. For each executor it prints

    tf32 <executor> off|on max_rel_diff_vs_cpu <largest |w_cuda - w_cpu| / max |w_cpu| over the server's tensors>

With TF32 off the GPU's numbers should be the CPU's to float32 rounding (about 1e-6); with it on, cuDNN's
convolutions and cuBLAS's products round their inputs to a 10-bit mantissa (about 1e-3 apart on an H100).
Usage: python benchmarks/tf32_check.py [--rounds 3]   (needs CUDA)
"""

from __future__ import annotations

import argparse

import torch

from fedsolve.families import get_algorithm
from fedsolve.data.federated import FederatedData
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem
from fedsolve.engine import Simulation, SimulationConfig


def lenet_problem(clients: int = 20, rows: int = 60) -> FederatedProblem:
    g = torch.Generator().manual_seed(0)
    n = clients * rows
    x, y = torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    off = torch.arange(0, n + 1, rows)
    data = FederatedData(x, y, off, x[:2 * clients], y[:2 * clients], torch.arange(0, 2 * clients + 1, 2),
                         num_classes=10, name="mnist-shaped")
    return FederatedProblem(data, build_model_fn("lenet", (1, 28, 28), 10))


def server_weights(device: str, executor: str, tf32: bool, rounds: int) -> dict[str, torch.Tensor]:
    problem = lenet_problem()
    algo = get_algorithm("fedavg")({"lr": 0.05, "batch_size": 16, "local_epochs": 2}, problem)
    cfg = SimulationConfig(rounds=rounds, eval_every=rounds, executor=executor, device=device, tf32=tf32,
                           sampling={"fraction": 0.5})
    result = Simulation(problem, algo, cfg, seed=0).run()
    return {k: v.detach().cpu().double() for k, v in result.server.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tf32_check: needs a CUDA device")
    print(torch.__version__, torch.cuda.get_device_name())
    for executor in ("sequential", "batched"):
        cpu = server_weights("cpu", executor, False, args.rounds)
        for tf32 in (False, True):
            gpu = server_weights("cuda", executor, tf32, args.rounds)
            diff = max(float((gpu[k] - cpu[k]).abs().max() / cpu[k].abs().max().clamp_min(1e-30)) for k in cpu)
            print(f"tf32 {executor} {'on' if tf32 else 'off'} max_rel_diff_vs_cpu {diff:.3e}")


if __name__ == "__main__":
    main()
