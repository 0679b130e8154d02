"""Client state that follows the clients actually touched (default rows, stored rows, memory-mapped spill files).

Every layout must read back the same numbers as a plain dense ``[m, ...]`` tensor that receives the same writes;
the tests drive both with the same random gathers and scatters and compare them exactly.
"""

from __future__ import annotations

import gc
import json

import pytest
import torch

from conftest import make_problem
from fedsolve.families import get_algorithm
from fedsolve.core.states import ClientStates, repeat_rows
from fedsolve.engine import Simulation, SimulationConfig


def _drive(cs: ClientStates, ref: dict[str, torch.Tensor], rounds: int = 12, k: int = 7, seed: int = 0) -> None:
    """Random rounds of gather (checked against ``ref``) and scatter (applied to both)."""
    g = torch.Generator().manual_seed(seed)
    m = cs.num_clients
    for _ in range(rounds):
        ids = torch.randperm(m, generator=g)[:k].sort().values
        got = cs.gather(ids)
        for key, t in ref.items():
            assert torch.equal(got[key], t[ids]), key
        new = {key: torch.randn(t[ids].shape, generator=g, dtype=torch.float64).to(t.dtype) for key, t in ref.items()}
        cs.scatter(ids, new)
        for key, t in ref.items():
            t[ids] = new[key]
    for key, t in ref.items():
        assert torch.equal(cs[key], t), key
        assert torch.equal(cs.state_dict()[key], t)
    for i in (0, m // 2, m - 1):
        row = cs.row(i)
        for key, t in ref.items():
            assert torch.equal(row[key], t[i])


def test_equal_rows_are_stored_once_and_grow_with_the_touched_clients():
    m, d = 500, 40
    x0 = torch.randn(d)
    cs = ClientStates(m, {"c": torch.zeros(m, d), "w": repeat_rows(x0, m), "xi": torch.full((m,), 0.5)})
    dense = m * (2 * d + 1) * 4
    assert cs.memory_bytes() < 0.1 * dense   # one default row and a slot per client, no [m, d] rows
    assert cs.touched("c").numel() == 0
    ref = {"c": torch.zeros(m, d), "w": repeat_rows(x0, m), "xi": torch.full((m,), 0.5)}
    _drive(cs, ref, rounds=4, k=5)
    touched = cs.touched("c")
    assert 5 <= touched.numel() <= 20
    stored = cs.memory_bytes() - 3 * m * 8   # minus the slots
    assert stored <= 32 * (2 * d + 1) * 4 + 3 * d * 4   # capacity at most 32 rows (amortized doubling) + defaults


def test_defaults_without_an_m_by_d_tensor():
    m, d = 10_000, 64
    cs = ClientStates(m, defaults={"lam": torch.zeros(d, dtype=torch.float64), "step": torch.tensor(3)})
    assert cs.memory_bytes() < m * 8 * 2 + 4 * d * 8   # slots and defaults only
    ids = torch.tensor([3, 9_999])
    cs.scatter(ids, {"lam": torch.ones(2, d, dtype=torch.float64), "step": torch.tensor([4, 5])})
    got = cs.gather(torch.tensor([0, 3, 9_999]))
    assert torch.equal(got["lam"].sum(1), torch.tensor([0.0, d, d], dtype=torch.float64))
    assert got["step"].tolist() == [3, 4, 5]
    assert cs.touched("lam").tolist() == [3, 9_999]


def test_unequal_rows_stay_a_dense_live_tensor():
    t = torch.arange(12.0).reshape(4, 3)
    cs = ClientStates(4, {"w": t})
    assert cs["w"] is t   # as before: the live tensor, written in place by scatter
    cs.scatter(torch.tensor([1]), {"w": torch.zeros(1, 3)})
    assert torch.equal(t[1], torch.zeros(3))
    with pytest.raises(ValueError, match="leading dim 4"):
        cs["v"] = torch.zeros(5, 3)
    with pytest.raises(KeyError, match="unknown client state 'nope'"):
        cs.scatter(torch.tensor([0]), {"nope": torch.zeros(1, 3)})


def test_over_the_budget_rows_spill_to_a_memory_mapped_file(tmp_path):
    m, d = 400, 50
    cs = ClientStates(m, {"a": torch.zeros(m, d), "b": torch.ones(m, d, dtype=torch.float64)},
                      budget_bytes=20_000, spill_dir=tmp_path)
    ref = {"a": torch.zeros(m, d), "b": torch.ones(m, d, dtype=torch.float64)}
    _drive(cs, ref, rounds=15, k=11)
    assert cs.disk_bytes() > 0
    files = list(tmp_path.iterdir())
    assert files and all(f.suffix == ".rows" for f in files)
    assert cs.memory_bytes() <= 20_000 + 2 * m * 8 + 2 * d * 8   # the budget, slots and default rows
    # copies keep the numbers and their own storage
    c2 = cs.clone()
    _drive(c2, {k: v.clone() for k, v in ref.items()}, rounds=3, seed=1)
    for k, v in ref.items():
        assert torch.equal(cs[k], v)
    back = ClientStates.from_state_dict(cs.state_dict())
    for k, v in ref.items():
        assert torch.equal(back[k], v)
    del cs, c2
    gc.collect()
    assert not [f for f in tmp_path.iterdir() if f.suffix == ".rows"]   # spill files go with their states


def _mapped_rss_kb(path) -> int | None:
    """Resident kB of this process's mappings of ``path`` (/proc/self/smaps; None where there is none)."""
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return None
    total, inside = 0, False
    for line in lines:
        if line[:1].isalnum() and "-" in line.split()[0]:   # a mapping's header line
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_spill_files_grow_in_place_and_their_pages_leave_the_process(tmp_path):
    """A spilled column grows inside its one file (no copy to a new file), and after every gather / scatter its
    pages are dropped from the process: the rows in the file are not this process's resident memory."""
    m, d = 64, 4096   # 16 kB rows (float32)
    cs = ClientStates(m, {"a": torch.zeros(m, d)}, budget_bytes=1, spill_dir=tmp_path)
    ref = {"a": torch.zeros(m, d)}
    _drive(cs, ref, rounds=1, k=3)
    files = [f for f in tmp_path.iterdir() if f.suffix == ".rows"]
    assert len(files) == 1 and cs.disk_bytes() > 0
    cap0 = cs.disk_bytes()
    _drive(cs, ref, rounds=10, k=9, seed=2)   # more clients: the column grows
    assert cs.disk_bytes() > cap0
    assert [f for f in tmp_path.iterdir() if f.suffix == ".rows"] == files   # the same file, grown
    assert files[0].stat().st_size == cs.disk_bytes()
    rss = _mapped_rss_kb(files[0])
    if rss is None:
        pytest.skip("no /proc/self/smaps on this system")
    assert rss == 0, rss
    cs.gather(torch.arange(m))
    assert _mapped_rss_kb(files[0]) == 0


def test_set_budget_moves_stored_rows_now(tmp_path):
    m, d = 100, 30
    cs = ClientStates(m, {"a": torch.zeros(m, d)})
    ref = {"a": torch.zeros(m, d)}
    _drive(cs, ref, rounds=5, k=10)
    assert cs.disk_bytes() == 0
    cs.set_budget(1_000, tmp_path)
    assert cs.disk_bytes() > 0
    _drive(cs, ref, rounds=5, k=10, seed=3)


def _sim(name, m=60, per_round=4, rounds=3, **sim):
    problem = make_problem("mlp", m=m, n_range=(8, 12))
    params = {"lr": 0.1, "batch_size": 4}
    if name == "fedapm":
        from fedsolve.problems import FederatedProblem

        problem = FederatedProblem(problem.data, problem.model_fn, blocks={"personal": ["out.*"]})
        params["log_stationarity"] = False
    algo = get_algorithm(name)(params, problem)
    cfg = SimulationConfig(rounds=rounds, eval_every=rounds, executor="vectorized",
                           sampling={"clients_per_round": per_round}, metrics=[], device="cpu", **sim)
    s = Simulation(problem, algo, cfg, seed=0)
    return s, s.run()


@pytest.mark.parametrize("name", ["scaffold", "fedadmm", "fedapm"])
def test_run_stores_only_the_participants_rows_and_a_budget_changes_no_number(name, tmp_path):
    s1, r1 = _sim(name)
    from fedsolve.engine.sampling import sample_clients

    participants = set()
    for t in range(3):
        d = s1.problem.data
        participants |= set(sample_clients(s1.cfg.sampling, d.num_clients, d.weights,
                                           s1.rngs.numpy("sampling", t)).tolist())
    for key in r1.clients.keys():
        assert set(r1.clients.touched(key).tolist()) <= participants, key
    dim = s1.problem.layout.dim
    assert r1.clients.memory_bytes() < 0.5 * s1.problem.num_clients * dim * 4 * len(list(r1.clients.keys()))
    s2, r2 = _sim(name, state_memory_mb=0.001)
    assert r2.clients.disk_bytes() > 0
    assert json.dumps(r1.history) == json.dumps(r2.history)
    for k in r1.server:
        assert torch.equal(r1.server[k], r2.server[k])
    for k in r1.clients.keys():
        assert torch.equal(r1.clients[k], r2.clients[k])


def test_state_memory_config_validation():
    with pytest.raises(Exception, match="state_memory_mb"):
        SimulationConfig(state_memory_mb=0)
    assert SimulationConfig(state_memory_mb=1.5).state_memory_mb == 1.5


def test_checkpoints_store_the_touched_rows_and_resume_exactly(tmp_path):
    """A checkpoint holds the stored rows only; resuming from it (and from a dense checkpoint of an older
    fedsolve) gives the uninterrupted run's numbers."""
    m = 300
    problem = make_problem("mlp", m=m, n_range=(8, 12))

    def sim(rounds, out=None, **kw):
        algo = get_algorithm("scaffold")({"lr": 0.1, "batch_size": 4}, problem)
        cfg = SimulationConfig(rounds=rounds, eval_every=2, executor="vectorized", metrics=[], device="cpu",
                               sampling={"clients_per_round": 5}, **kw)
        return Simulation(problem, algo, cfg, seed=0, out_dir=out)

    full = sim(4).run()
    sim(2, tmp_path / "a").run()
    ck = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    col = ck["clients"]["columns"]["c_i"]
    assert col["rows"].shape[0] <= 10 and col["slot"].shape == (m,)   # 2 rounds x 5 clients, not 300 rows
    resumed = sim(4, tmp_path / "a", state_memory_mb=0.001).run(resume=True)
    assert json.dumps(full.history) == json.dumps(resumed.history)
    assert torch.equal(full.clients["c_i"], resumed.clients["c_i"])
    # an older checkpoint (dense [m, d] client state) still resumes
    ck["clients"] = {"c_i": ClientStates.load(ck["clients"], m)["c_i"]}
    (tmp_path / "b").mkdir()
    torch.save(ck, tmp_path / "b" / "checkpoint.pt")
    old = sim(4, tmp_path / "b").run(resume=True)
    assert torch.equal(full.server["x"], old.server["x"])
    # a checkpoint of other client-state shapes is refused by name
    ck["clients"] = {"c_i": torch.zeros(m, 3)}
    torch.save(ck, tmp_path / "b" / "checkpoint.pt")
    from fedsolve.engine.loop import ResumeError

    with pytest.raises(ResumeError, match="client state 'c_i'"):
        sim(4, tmp_path / "b").run(resume=True)


@pytest.mark.parametrize("name", ["scaffold", "fedapm"])
@pytest.mark.parametrize("saved_mb,resumed_mb", [(None, None), (0.001, 0.001), (0.001, None)])
def test_checkpoint_writes_the_stored_rows_and_resume_restores_them_sparse(name, saved_mb, resumed_mb, tmp_path):
    """A checkpoint written with lazy rows, in memory or spilled to a memory-mapped file, holds exactly the stored
    rows (its tensors' storage is those rows, not the column's capacity); a resumed run restores them as stored
    rows (not [m, ...]), in spill files when over its budget, and gives the uninterrupted run's numbers."""
    m = 200
    problem = make_problem("mlp", m=m, n_range=(8, 12))
    if name == "fedapm":
        from fedsolve.problems import FederatedProblem

        problem = FederatedProblem(problem.data, problem.model_fn, blocks={"personal": ["out.*"]})
    params = {"lr": 0.1, "batch_size": 4, **({"log_stationarity": False} if name == "fedapm" else {})}

    def sim(rounds, out=None, mb=None):
        algo = get_algorithm(name)(dict(params), problem)
        cfg = SimulationConfig(rounds=rounds, eval_every=2, executor="vectorized", metrics=[], device="cpu",
                               sampling={"clients_per_round": 5}, state_memory_mb=mb)
        return Simulation(problem, algo, cfg, seed=0, out_dir=out)

    full = sim(4, mb=saved_mb).run()
    first = sim(2, tmp_path / "a", mb=saved_mb)
    first.run()
    assert (first.clients.disk_bytes() > 0) == (saved_mb is not None)
    ck = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    stored = 0
    for key, col in ck["clients"]["columns"].items():
        rows = col["rows"]
        assert rows.shape[0] == int((col["slot"] >= 0).sum()) <= 10, key   # 2 rounds x 5 clients, not 200 rows
        assert rows.untyped_storage().nbytes() == rows.numel() * rows.element_size(), key
        stored += rows.shape[0]
    assert stored > 0
    resumed_sim = sim(4, tmp_path / "a", mb=resumed_mb)
    resumed = resumed_sim.run(resume=True)
    assert json.dumps(full.history) == json.dumps(resumed.history)
    for k in full.server:
        assert torch.equal(full.server[k], resumed.server[k]), k
    for k in full.clients.keys():
        assert torch.equal(full.clients[k], resumed.clients[k]), k
        assert torch.equal(full.clients.touched(k), resumed.clients.touched(k)), k   # sparse, not m rows
        assert resumed.clients.touched(k).numel() <= 20
    assert (resumed.clients.disk_bytes() > 0) == (resumed_mb is not None)
