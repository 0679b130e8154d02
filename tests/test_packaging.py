"""Packaging: the default thread count (physical cores), the example configs shipped in the package, and (slow)
a wheel built with `python -m build` that installs into a clean virtual environment and runs an example."""

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import fedsolve
from fedsolve.cli import main
from fedsolve.core.cpus import cgroup_cpu_quota, cpu_description, physical_cores
from fedsolve.experiments import runner
from fedsolve.experiments.examples import example_files, example_path

ROOT = Path(__file__).resolve().parents[1]


def _fake_sys(tmp_path, siblings, cpu_max=None):
    """A fake ``sys/`` tree: CPU c's core is shared with the CPUs ``siblings[c]``; an optional cgroup quota."""
    for c, sib in enumerate(siblings):
        d = tmp_path / f"sys/devices/system/cpu/cpu{c}/topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(sib + "\n")
    if cpu_max is not None:
        (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
        (tmp_path / "sys/fs/cgroup/cpu.max").write_text(cpu_max + "\n")
    return tmp_path


def test_the_cpu_a_result_was_computed_on_names_its_model_and_widest_simd(tmp_path):
    (tmp_path / "proc").mkdir()
    info = tmp_path / "proc" / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu sse4_2 avx avx2 "
                    "avx512f avx512bw\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) Processor\n")
    assert cpu_description(tmp_path) == {"model": "Intel(R) Xeon(R) Processor", "simd": "avx512f"}
    info.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu sse4_2 avx avx2\n")
    assert cpu_description(tmp_path)["simd"] == "avx2"      # the same name, another rounding of a float32 product
    info.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm\n")                   # an ARM machine
    assert cpu_description(tmp_path) == {"model": None, "simd": "asimd"}
    assert cpu_description(tmp_path / "nowhere") == {"model": None, "simd": None}


def test_physical_cores_counts_cores_not_hyperthreads_within_affinity_and_quota(tmp_path):
    # 8 logical CPUs, two hyper-threads per core (cpu c and c+4 share a core): 4 physical cores
    root = _fake_sys(tmp_path, [f"{c % 4},{c % 4 + 4}" for c in range(8)])
    assert physical_cores(root, cpus=set(range(8))) == 4
    assert physical_cores(root, cpus={0, 4}) == 1              # both threads of one core
    assert physical_cores(root, cpus={0, 1, 5}) == 2
    (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/cpu.max").write_text("250000 100000\n")   # a container with 2.5 CPUs
    assert cgroup_cpu_quota(root) == 3 and physical_cores(root, cpus=set(range(8))) == 3
    (tmp_path / "sys/fs/cgroup/cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(root) is None and physical_cores(root, cpus=set(range(8))) == 4
    # no topology files (another kind of machine): each CPU counts as a core
    assert physical_cores(tmp_path / "elsewhere", cpus={0, 1, 2}) == 3


def test_threads_default_to_the_physical_cores(monkeypatch):
    """A config without ``threads`` gets the machine's physical cores (a 32-core workstation gets 32, not 2);
    ``threads:`` wins; ``compare --jobs`` shares the cores among its workers."""
    import fedsolve.core.cpus as cpus

    monkeypatch.setattr(cpus, "physical_cores", lambda *a, **k: 32)
    set_to = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    runner.set_threads(None)
    runner.set_threads(3)
    assert set_to == [32, 3] and runner.default_threads() == 32


def test_the_cli_sets_passive_waits(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert main(["examples"]) == 0
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def test_shipped_examples_are_the_checkouts_files_and_the_cli_names_them(capsys):
    """The package ships copies of experiments/demo.yaml and examples/*.yaml (with the plugin a config needs):
    each must equal its original (after editing an original, copy it to src/fedsolve/experiments/examples/)."""
    originals = [ROOT / "experiments" / "demo.yaml", *sorted((ROOT / "examples").glob("*.yaml")),
                 ROOT / "examples" / "my_fedavgm.py"]
    shipped = {p.name: p for p in example_files().values()}
    for f in originals:
        assert f.name in shipped, f"{f} is not shipped: copy it to src/fedsolve/experiments/examples/"
        assert shipped[f.name].read_bytes() == f.read_bytes(), \
            f"{f} changed: copy it to {shipped[f.name]}"
    assert main(["examples", "demo"]) == 0
    assert capsys.readouterr().out.strip() == str(example_path("demo"))
    assert main(["examples"]) == 0
    assert "demo" in capsys.readouterr().out
    assert main(["examples", "nope"]) == 2
    assert "allowed: demo" in capsys.readouterr().err


def test_metadata_states_the_version_once_and_the_licence_as_spdx():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in meta and meta["dynamic"] == ["version"]
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("\n                                 Apache License")
    assert (Path(fedsolve.__file__).parent / "py.typed").exists()


def _can_build(tmp) -> str | None:
    """Why the wheel test cannot run here, or None (``tmp``: a scratch folder)."""
    try:
        import build  # noqa: F401
    except ImportError:
        return "the `build` package is not installed"
    probe = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp / "probe"),
                            "setuptools>=77"], capture_output=True, text=True, timeout=120)
    return None if probe.returncode == 0 else "no package index reachable (offline): cannot build or install"


@pytest.mark.slow
def test_wheel_builds_without_deprecations_installs_clean_and_runs_an_example(tmp_path):
    """`python -m build`, then a clean virtual environment (no system site-packages): torch==2.13.0, then the
    wheel; `fedsolve run` on the shipped demo config must finish. Takes a few minutes (the installs)."""
    why = _can_build(tmp_path)
    if why:
        pytest.skip(why)
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "runs", "results", "__pycache__",
                                                             "*.egg-info", "build", "dist"))
    b = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(src)],
                       capture_output=True, text=True, timeout=600)
    log = b.stdout + b.stderr
    assert b.returncode == 0, log[-3000:]
    assert "deprecat" not in log.lower(), [ln for ln in log.splitlines() if "eprecat" in ln]
    wheel, = (tmp_path / "dist").glob("fedsolve-*.whl")
    assert wheel.name.startswith(f"fedsolve-{fedsolve.__version__}-")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    for what in (["torch==2.13.0"], [str(wheel)]):
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", *what], capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    fs = str(venv / "bin" / "fedsolve")
    demo = subprocess.run([fs, "examples", "demo"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert demo.returncode == 0 and str(venv) in demo.stdout, demo.stderr
    r = subprocess.run([fs, "run", demo.stdout.strip(), "--algorithm", "FedAvg", "--set", "simulation.rounds=2",
                        "--out", str(tmp_path / "out"), "--quiet", "--track", "csv"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "out" / "summary.json").exists() and (tmp_path / "out" / "metrics.csv").exists()
    typed = subprocess.run([str(py), "-c", "import fedsolve, pathlib; "
                            "print((pathlib.Path(fedsolve.__file__).parent / 'py.typed').exists())"],
                           capture_output=True, text=True, cwd=tmp_path, env=env)
    assert typed.stdout.strip() == "True"
