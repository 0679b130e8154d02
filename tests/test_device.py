"""``simulation.device``: configuration, CPU runs unchanged, and (where a GPU exists) CPU and CUDA runs that agree.

The CUDA tests run every listed algorithm a few rounds on the CPU and on the GPU, under the sequential and the
vectorized executor, and compare the logged metrics, the server and client states and the scored models to float
tolerance. They are skipped on a machine without CUDA (``torch.cuda.is_available()``).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from pydantic import ValidationError

from conftest import make_problem
from fedsolve.families import ALGORITHMS, get_algorithm
from fedsolve.engine.algorithm import place_algorithm
from fedsolve.core.executor import Plan, Work, build_plans
from fedsolve.core.rng import RngStreams
from fedsolve.core.states import ClientStates
from fedsolve.problems import FederatedProblem
from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.engine.loop import cuda_tf32, resolve_device

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")

#: the algorithms checked on the GPU besides the newer families' (FAMILY_CASES)
CORE = ["fedavg", "scaffold", "fedadmm", "fedapm", "fpfc", "fedcp"]  # fedcp: its network, its noise keys on the device


def mlp_problem(personal: bool = False, seed: int = 0) -> FederatedProblem:
    """The tiny MLP problem of conftest; ``personal``: its output layer is the 'personal' block (FedAPM)."""
    p = make_problem("mlp", seed=seed)
    if personal:
        p = FederatedProblem(p.data, p.model_fn, blocks={"personal": ["out.*"]}, name="tiny-personal")
    return p


def _problem_for(name: str, seed: int = 0) -> FederatedProblem:
    from fedsolve.engine.algorithm import fitted_problem

    return fitted_problem(get_algorithm(name), mlp_problem(personal=name in ("fedapm",), seed=seed))


def _run(problem, name, device="auto", executor="sequential", rounds=3, params=None, out_dir=None, resume=False,
         seed=0, **sim):
    algo = get_algorithm(name)({**({"lr": 0.1, "batch_size": 4} if name != "fpfc" else {"local_steps": 3}),
                                **(params or {})}, problem)
    cfg = SimulationConfig(**{"rounds": rounds, "eval_every": 1, "executor": executor, "device": device,
                              "sampling": {"fraction": 0.5}, **sim})
    s = Simulation(problem, algo, cfg, seed=seed, out_dir=out_dir)
    return s, s.run(resume=resume)


# ------------------------------------------------------------------ everywhere
def test_device_field_validation():
    for ok in ("auto", "cpu", "cuda", "cuda:0", "cuda:3"):
        assert SimulationConfig(device=ok).device == ok
    for bad in ("gpu", "CUDA", "cuda:", "cuda:x", "mps", ""):
        with pytest.raises(ValidationError, match="device"):
            SimulationConfig(device=bad)
    assert SimulationConfig().device == "auto"
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if CUDA else "cpu")


@pytest.mark.skipif(CUDA, reason="checks the error a machine without CUDA gives")
def test_cuda_asked_for_without_cuda_is_a_clear_error():
    problem = make_problem("mlp")
    algo = get_algorithm("fedavg")({}, problem)
    for dev in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match=r"simulation\.device: 'cuda(:1)?' asked for, but CUDA is not available"):
            Simulation(problem, algo, SimulationConfig(rounds=1, device=dev), seed=0)
    assert problem.device.type == "cpu"   # nothing was moved


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_device_cpu_is_bit_identical_to_the_default_on_a_cpu(name, executor):
    if CUDA:   # the default is the GPU there: compare an explicit cpu run with another one
        default = "cpu"
    else:
        default = "auto"
    s1, r1 = _run(_problem_for(name), name, device=default, executor=executor)
    s2, r2 = _run(_problem_for(name), name, device="cpu", executor=executor)
    assert json.dumps(r1.history) == json.dumps(r2.history)
    for k in r1.server:
        assert torch.equal(r1.server[k], r2.server[k])
    for k in r1.clients:
        assert torch.equal(r1.clients[k], r2.clients[k])
    assert s2.device == torch.device("cpu") and s2.problem.device.type == "cpu"


def test_placing_pieces_on_the_cpu_changes_nothing():
    """``Plan.to``, ``ClientStates.to``, ``FederatedProblem.to`` and ``Algorithm.to`` keep every number (and a
    lazy plan stays lazy)."""
    problem = mlp_problem(personal=True)
    plans = build_plans({"train": Work(epochs=1, batch_size=4)}, problem.data.train_offsets, torch.tensor([0, 2, 3]),
                        RngStreams(0), 0)
    lazy = plans["train"].to("cpu")
    assert lazy._idx is None   # noqa: SLF001  (laziness is the point of the check)
    assert torch.equal(lazy.idx, plans["train"].idx) and torch.equal(lazy.w, plans["train"].w)
    eager = Plan(plans["train"].idx, plans["train"].w, plans["train"].active).to("cpu")
    assert torch.equal(eager.active, plans["train"].active)
    cs = ClientStates(3, {"a": torch.arange(6.0).reshape(3, 2)})
    assert torch.equal(cs.to("cpu")["a"], cs["a"])
    before = problem.layout.mask("personal").clone()
    algo = get_algorithm("fedapm")({}, problem)
    problem.to("cpu")
    place_algorithm(algo, "cpu")
    assert torch.equal(problem.layout.mask("personal"), before)
    assert algo.client_weights.device.type == "cpu"


# ------------------------------------------------------------------ on a GPU
def _close(a, b, what):
    torch.testing.assert_close(a.detach().cpu().to(torch.float64), b.detach().cpu().to(torch.float64),
                               rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")


def _same_run(r_cpu, r_gpu, s_cpu, s_gpu):
    assert [h["round"] for h in r_cpu.history] == [h["round"] for h in r_gpu.history]
    for h1, h2 in zip(r_cpu.history, r_gpu.history):
        for k, v in h1.items():
            if isinstance(v, float) and math.isfinite(v) and k not in ("test_auc",):
                tol = 0.05 if "accuracy" in k or "f1" in k else 1e-3 * max(1.0, abs(v))
                assert abs(v - h2[k]) <= tol, (k, h1["round"], v, h2[k])
    for k in r_cpu.server:
        if isinstance(r_cpu.server[k], torch.Tensor) and r_cpu.server[k].is_floating_point():
            assert r_gpu.server[k].device.type == "cuda", k
            _close(r_cpu.server[k], r_gpu.server[k], f"server {k}")
    for k in r_cpu.clients:
        assert r_gpu.clients[k].device.type == "cuda", k
        _close(r_cpu.clients[k], r_gpu.clients[k], f"client state {k}")
    _close(s_cpu.eval_params(), s_gpu.eval_params(), "scored models")


@needs_cuda
@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
@pytest.mark.parametrize("name", CORE)
def test_cuda_run_matches_cpu(name, executor):
    s1, r1 = _run(_problem_for(name), name, device="cpu", executor=executor)
    s2, r2 = _run(_problem_for(name), name, device="cuda", executor=executor)
    assert s2.device.type == "cuda" and s2.problem.device.type == "cuda"
    _same_run(r1, r2, s1, s2)


def _hyper_representation(seed: int = 0) -> FederatedProblem:
    from conftest import make_data
    from fedsolve.models import build_model_fn
    from fedsolve.families import get_problem_kind

    data = make_data(m=5, d=5, classes=3, n_range=(10, 25), seed=seed)
    base = FederatedProblem(data, build_model_fn("mlp", data.input_shape, 3, hidden=(6,)))
    return get_problem_kind("hyper_representation")(base, {"lam": 0.1}, seed)


def _saddle(seed: int = 0) -> FederatedProblem:
    from test_minimax import quadratic_problem

    return quadratic_problem(seed)[0]


def _constrained_qp(seed: int = 0) -> FederatedProblem:
    from fedsolve.families import get_problem_kind

    return get_problem_kind("constrained_qp")(make_problem("logreg", m=4, seed=seed), {"d": 8}, seed)


def _fairness_rows(seed: int = 0) -> FederatedProblem:
    """A constrained problem on the clients' rows (the unconstrained baselines refuse per-party functions)."""
    from test_constrained import _fair_problem

    return _fair_problem(n=3, seed=seed)


_GDA = {"lr": 0.1, "lr_psi": 0.1, "batch_size": None}
#: the newer families' algorithms, each on a problem of its family: (problem builder, algorithm parameters)
FAMILY_CASES = {
    "simfbo": (_hyper_representation, {"batch_size": 4}), "shrofbo": (_hyper_representation, {"batch_size": 4}),
    "fednest": (_hyper_representation, {}), "lfednest": (_hyper_representation, {}),
    "aggitd": (_hyper_representation, {"batch_size": 4}),
    "fedmm": (_saddle, {**_GDA, "local_steps": 5}), "fedsgda": (_saddle, _GDA),
    "fedavggda": (_saddle, {**_GDA, "local_steps": 5}), "fedproxgda": (_saddle, {**_GDA, "local_steps": 5}),
    "proxal": (_constrained_qp, {}), "cproxal": (_constrained_qp, {}), "fedavg_uncons": (_fairness_rows, {}),
    "fedprox_uncons": (_fairness_rows, {}),
}


def _run_case(name: str, device: str, executor: str):
    build, params = FAMILY_CASES[name]
    problem = build(0)
    algo = get_algorithm(name)(params, problem)
    sim = Simulation(problem, algo, SimulationConfig(rounds=2, eval_every=1, executor=executor, device=device), seed=0)
    return sim, sim.run()


@needs_cuda
@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
@pytest.mark.parametrize("name", sorted(FAMILY_CASES))
def test_cuda_run_matches_cpu_for_the_new_families(name, executor):
    if name not in ALGORITHMS:
        pytest.skip(f"{name} is not registered in this checkout")
    s1, r1 = _run_case(name, "cpu", executor)
    s2, r2 = _run_case(name, "cuda", executor)
    _same_run(r1, r2, s1, s2)


def test_every_family_algorithm_has_a_device_case():
    """The GPU comparison above covers every registered algorithm of the newer families."""
    from fedsolve.families import bilevel  # noqa: F401
    from fedsolve.families import constrained  # noqa: F401
    from fedsolve.families import minimax  # noqa: F401

    family = sorted(n for n, cls in ALGORITHMS.items()   # (other tests register plug-ins from other modules)
                    if cls.__module__.split(".")[:3] in (["fedsolve", "families", f] for f in
                                                         ("bilevel", "constrained", "minimax")))
    missing = sorted(set(family) - set(FAMILY_CASES))
    assert family and not missing, f"add a (problem, params) case to FAMILY_CASES for {missing}"


@needs_cuda
@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
@pytest.mark.parametrize("name", ["proxal", "cproxal"])
def test_cuda_newton_subproblems_match_cpu(name, executor):
    """The Newton-solved subproblems (constraints that are not quadratic; FAMILY_CASES' QP takes exact solves) on
    the GPU, on a small fairness problem whose subproblem Hessians go indefinite, so the modified step's
    Cholesky test and eigenvalue shift run there too: the CPU's run. (rho = 1: with rho = 0.1 the ADMM on these
    nonconvex parts does not settle in 30 rounds and rounding alone moves its residual by 3-10%, the sequential
    and vectorized executors' CPU runs too; results/constrained/README.md, Table 2 n = 20 seed 9.)"""
    from test_constrained import _fair_problem

    params = {"beta": 50.0, "s_bar": 0.01, **({"rho": 1.0} if name == "proxal" else {})}
    runs = []
    for device in ("cpu", "cuda"):
        problem = _fair_problem(n=3)
        sim = Simulation(problem, get_algorithm(name)(params, problem),
                         SimulationConfig(rounds=30, eval_every=10, executor=executor, device=device,
                                          sampling={"fraction": 1.0}), seed=0)
        runs.append((sim, sim.run()))
    (s1, r1), (s2, r2) = runs
    _same_run(r1, r2, s1, s2)


@needs_cuda
def test_cuda_linear_executor_and_fpfc_pairs_match_cpu():
    """The one-layer ``linear`` executor and FPFC's pair update run their tensor path on the GPU (the compiled
    kernels are CPU-only) and agree with the CPU run."""
    for name, params in (("fedavg", {"batch_size": None}), ("fpfc", {"local_steps": 2})):
        s1, r1 = _run(make_problem("logreg"), name, device="cpu", executor="linear", params=params)
        s2, r2 = _run(make_problem("logreg"), name, device="cuda", executor="linear", params=params)
        assert s2.linear_kernel == "torch"
        _same_run(r1, r2, s1, s2)


@needs_cuda
def test_cuda_errors_and_reuse(tmp_path):
    problem = make_problem("mlp")
    algo = get_algorithm("fedavg")({}, problem)
    n = torch.cuda.device_count()
    with pytest.raises(ValueError, match="simulation.device"):
        Simulation(problem, algo, SimulationConfig(rounds=1, device=f"cuda:{n}"), seed=0)
    with pytest.raises(ValueError, match="linear_kernel"):
        Simulation(problem, algo, SimulationConfig(rounds=1, device="cuda", linear_kernel="native"), seed=0)
    # a problem already on the GPU (a second run on the same problem object) gives the same run again
    problem = mlp_problem()
    _, r1 = _run(problem, "scaffold", device="cuda", executor="vectorized")
    _, r2 = _run(problem, "scaffold", device="cuda", executor="vectorized")
    for k in r1.server:
        _close(r1.server[k], r2.server[k], k)


def test_tf32_switches_are_set_inside_the_block_and_restored():
    """``cuda_tf32``: both TensorFloat-32 switches take the given value inside and their old values after (also
    after an error); settable without a GPU."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    for allow in (False, True):
        with cuda_tf32(allow):
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (allow, allow)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == old
    with pytest.raises(KeyError), cuda_tf32(not old[1]):
        raise KeyError("x")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == old


@pytest.mark.parametrize("tf32", [False, True])
def test_a_cuda_run_sets_tf32_from_the_config_and_a_cpu_run_leaves_it(tf32, monkeypatch):
    """``simulation.tf32`` (default off: a GPU run gives the CPU's float32 numbers, where PyTorch's own default
    lets cuDNN convolutions round to TF32) is in force while the engine runs a round; a CPU run changes nothing."""
    seen = []
    for device in (["cuda", "cpu"] if CUDA else ["cpu"]):
        s, _ = _run(mlp_problem(), "fedavg", device=device, rounds=1, tf32=tf32)
        monkeypatch.setattr(s, "run_round", lambda t: seen.append(
            (device, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)))
        before = torch.backends.cudnn.allow_tf32
        with s.on_device():
            s.run_round(0)
        assert torch.backends.cudnn.allow_tf32 == before
    if CUDA:
        assert seen[0] == ("cuda", tf32, tf32)
    assert seen[-1][0] == "cpu" and seen[-1][1:] == (torch.backends.cuda.matmul.allow_tf32, before)
    assert SimulationConfig().tf32 is False


@needs_cuda
@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_a_float32_cnn_run_on_cuda_gives_the_cpus_numbers_with_tf32_off(executor):
    """``simulation.tf32`` off (the default): cuDNN's convolutions and cuBLAS's products stay in float32, so a
    LeNet run on the GPU lands on the CPU's weights to float32 rounding, where TF32's 10-bit mantissa put an H100's
    batched and sequential LeNet rounds 6e-4 apart (``benchmarks/tf32_check.py`` prints both)."""
    from test_batched_conv import problem as cnn_problem

    s1, r1 = _run(cnn_problem("lenet"), "fedavg", device="cpu", executor=executor)
    s2, r2 = _run(cnn_problem("lenet"), "fedavg", device="cuda", executor=executor, tf32=False)
    _same_run(r1, r2, s1, s2)
    w1, w2 = r1.server["w"].double(), r2.server["w"].detach().cpu().double()
    assert float((w1 - w2).abs().max() / w1.abs().max()) < 1e-5


@needs_cuda
def test_cuda_checkpoint_resumes_on_the_cpu(tmp_path):
    _, full = _run(mlp_problem(), "scaffold", device="cpu", executor="vectorized", rounds=4)
    _run(mlp_problem(), "scaffold", device="cuda", executor="vectorized", rounds=2, out_dir=tmp_path)
    s, resumed = _run(mlp_problem(), "scaffold", device="cpu", executor="vectorized", rounds=4, out_dir=tmp_path,
                      resume=True)
    assert s.start_round == 2
    for k in full.server:
        _close(full.server[k], resumed.server[k], f"server {k}")


@pytest.mark.slow
@pytest.mark.skipif(CUDA, reason="a machine with a GPU runs the CUDA tests themselves")
def test_the_cuda_tests_pass_on_a_cpu_stand_in_for_the_gpu():
    """This file's CUDA tests, in a process where ``tests/fake_cuda.py`` stands in for a GPU (tensors "on cuda"
    are tagged CPU tensors, and an operation mixing them with CPU tensors fails as on CUDA): the device plumbing
    checked on a machine without a GPU (not CUDA's numerics)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import fake_cuda

    if not fake_cuda.available():
        pytest.skip("this torch lacks the internals tests/fake_cuda.py uses")
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(here), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fake_cuda",
                        str(Path(__file__).resolve()), "-k", "cuda and not stand_in and not without_cuda"],
                       capture_output=True, text=True, env=env, timeout=1200, cwd=here.parent)
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    summary = r.stdout.strip().splitlines()[-1]
    assert int(summary.split(" passed")[0].split()[-1]) >= 20 and " skipped" not in summary, tail
