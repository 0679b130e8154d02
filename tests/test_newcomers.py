"""Newcomer rules (``protocols.newcomers.newcomer_models``; FPFC Sec. 6.4.2 / Table 3): each method's own procedure
for clients that join after training, checked against known answers."""

from __future__ import annotations

import pytest
import torch

from fedsolve.families import get_algorithm
from fedsolve.families.clustered.baselines import pacfl_bases, pacfl_clusters, pacfl_proximity
from fedsolve.core.rng import RngStreams
from fedsolve.core.states import repeat_rows
from fedsolve.data.synthetic import clustered_regression, fpfc_synthetic
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem
from fedsolve.families.clustered.protocols.newcomers import newcomer_models, train_on
from fedsolve.engine import Simulation, SimulationConfig

GD = dict(lr=0.1, batch_size=None, local_epochs=3)


def regression(seed=0):
    data = clustered_regression(seed=seed, cluster_sizes=(4, 4), dim=3, samples_per_client=60, noise_std=0.1,
                                center_scale=3.0)
    return FederatedProblem(data, build_model_fn("logreg", (3,), 1), loss="squared_error")


def split(prob, new):
    d = prob.data
    old = [i for i in range(d.num_clients) if i not in new]
    mk = lambda ids: FederatedProblem(d.subset(ids), prob.model_fn, loss=prob.loss_name)  # noqa: E731
    return mk(old), mk(new), old


def train(prob, name, cfg, rounds, seed=0):
    algo = get_algorithm(name)(cfg, prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=rounds, eval_every=rounds, metrics=[],
                                                  sampling={"fraction": 1.0}), seed=seed)
    sim.run()
    return algo, sim


def test_local_newcomers_equal_a_local_run_on_the_newcomers():
    prob = regression()
    p_old, p_new, _ = split(prob, [3, 7])
    algo = get_algorithm("local")(GD, p_old)
    got = newcomer_models(algo, {}, p_new, rounds=7, seed=4)
    _, sim = train(p_new, "local", GD, rounds=7, seed=4)
    torch.testing.assert_close(got, sim.clients["w"], rtol=1e-5, atol=1e-6)


def test_fedavg_newcomers_get_the_global_model_and_ditto_has_no_rule():
    prob = regression()
    p_old, p_new, _ = split(prob, [3, 7])
    algo, sim = train(p_old, "fedavg", GD, rounds=3)
    got = newcomer_models(algo, sim.server, p_new)
    assert torch.equal(got, sim.server["w"].expand(2, -1))
    ditto = get_algorithm("ditto")(dict(lr=0.1), p_old)
    with pytest.raises(NotImplementedError, match="ditto defines no newcomer rule"):
        newcomer_models(ditto, {"w": sim.server["w"]}, p_new)


def _cluster_fit(prob, members):
    """Least-squares model (weights, bias) pooled over ``members``: the cluster's own optimum."""
    xs, ys = zip(*(prob.data.client_train(i) for i in members))
    X = torch.cat(xs).double()
    A = torch.cat([X, torch.ones(X.shape[0], 1, dtype=X.dtype)], 1)
    sol = torch.linalg.lstsq(A, torch.cat(ys).double().reshape(-1, 1)).solution.flatten()
    return sol.float()


def test_ifca_newcomer_takes_the_lowest_loss_cluster_model():
    prob = regression()
    p_old, p_new, old = split(prob, [3, 7])
    lab = prob.data.clusters
    m0 = _cluster_fit(prob, [i for i in old if lab[i] == 0])
    m1 = _cluster_fit(prob, [i for i in old if lab[i] == 1])
    algo = get_algorithm("ifca")(dict(GD, num_clusters=2), p_old)
    got = newcomer_models(algo, {"models": torch.stack([m0, m1])}, p_new)
    assert torch.equal(got, torch.stack([m0, m1]))          # device 3 is in cluster 0, device 7 in cluster 1
    got = newcomer_models(algo, {"models": torch.stack([m1, m0])}, p_new)
    assert torch.equal(got, torch.stack([m0, m1]))          # the choice follows the loss, not the index


def test_perfedavg_newcomer_is_the_global_model_after_one_adaptation_step():
    prob = regression()
    p_old, p_new, _ = split(prob, [3, 7])
    algo = get_algorithm("perfedavg")(dict(GD, variant="code", alpha=0.05), p_old)
    w = torch.randn(p_old.layout.dim, generator=torch.Generator().manual_seed(0))
    got = newcomer_models(algo, {"w": w}, p_new)
    for k in range(2):
        x, y = p_new.data.client_train(k)
        v = w.clone().requires_grad_(True)
        f = (0.5 * (x @ v[:3] + v[3] - y.reshape(-1)) ** 2).mean()   # the problem's squared_error: 0.5 * SE
        torch.testing.assert_close(got[k], w - 0.05 * torch.autograd.grad(f, v)[0], rtol=1e-5, atol=1e-6)


def test_lg_code_newcomer_is_the_global_model_after_one_round_of_local_training():
    prob = regression()
    p_old, p_new, _ = split(prob, [3, 7])
    algo = get_algorithm("lg_code")(GD, p_old)
    w = torch.randn(p_old.layout.dim, generator=torch.Generator().manual_seed(1))
    got = newcomer_models(algo, {"w": w}, p_new)
    for k in range(2):
        x, y = p_new.data.client_train(k)
        v = w.clone()
        for _ in range(3):                                              # local_epochs=3 full-batch GD steps
            v.requires_grad_(True)
            f = (0.5 * (x @ v[:3] + v[3] - y.reshape(-1)) ** 2).mean()
            v = (v - 0.1 * torch.autograd.grad(f, v)[0]).detach()
        torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6)


def s1_small(seed=0):
    return FederatedProblem(fpfc_synthetic("S1", seed=seed, size_scale=0.03), build_model_fn("logreg", (60,), 10))


def test_pacfl_newcomer_twin_joins_its_twins_cluster_and_fine_tunes_one_round():
    prob = s1_small()
    p_old, _, old = split(prob, [])
    twins = [2, 30, 77]                                    # newcomers with exactly these old devices' data
    p_new = FederatedProblem(prob.data.subset(twins), prob.model_fn)
    cfg = dict(GD, n_basis=5, threshold=4.0)
    algo, sim = train(p_old, "pacfl", cfg, rounds=3)
    # precondition: adding the twins does not change the old devices' clusters
    c = algo.cfg
    bases = pacfl_bases(p_old.data, c.n_basis, True) + pacfl_bases(p_new.data, c.n_basis, True)
    lab = pacfl_clusters(pacfl_proximity(bases), c.threshold, c.linkage)
    assert (lab[twins] == lab[len(old):]).all()
    got = newcomer_models(algo, sim.server, p_new, seed=0)
    want = train_on(algo, p_new, sim.server["W"][twins].clone(), seed=0)
    torch.testing.assert_close(got, want)
    assert not torch.equal(got, sim.server["W"][twins])    # one round of local training happened
    # a cut below every angle: nobody has co-members, newcomers start from the common initial model
    lonely = get_algorithm("pacfl")(dict(cfg, threshold=1e-9), p_old)
    far = FederatedProblem(fpfc_synthetic("S1", seed=9, size_scale=0.03).subset([0, 50]), prob.model_fn)
    x0 = far.init_params(RngStreams(5).torch("init"))
    got = newcomer_models(lonely, sim.server, far, seed=5)
    torch.testing.assert_close(got, train_on(lonely, far, repeat_rows(x0, 2), seed=5))


def test_cfl_newcomers_walk_the_parameter_tree():
    prob = regression()
    p_old, _, old = split(prob, [])
    A, B = [0, 1, 2], [4, 5, 6]                            # devices of cluster 0 and cluster 1
    twins = FederatedProblem(prob.data.subset([3, 7]), prob.model_fn, loss="squared_error")
    algo = get_algorithm("cfl")(GD, p_old)
    gen = torch.Generator().manual_seed(1)
    w_s0, w_s1 = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    sub = lambda ids: FederatedProblem(prob.data.subset(ids), prob.model_fn, loss="squared_error")  # noqa: E731
    upd = lambda ids, w: train_on(algo, sub(ids), repeat_rows(w, len(ids))) - w  # noqa: E731
    # split 0: root 0 -> {0: A, 1: B}; split 1: cluster 1 -> {1: B's side, 2: A's side}
    unit = lambda ids, w: torch.nn.functional.normalize(upd(ids, w), dim=1).mean(0)  # noqa: E731
    tree_dir = torch.stack([torch.stack([unit(A, w_s0), unit(B, w_s0)]), torch.stack([unit(B, w_s1), unit(A, w_s1)])])
    cluster = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    W = torch.stack([torch.full((4,), float(c)) for c in cluster.tolist()])
    server = {"W": W, "cluster": cluster, "tree_w": torch.stack([w_s0, w_s1]),
              "tree_ids": torch.tensor([[0, 1], [1, 2]]), "tree_dir": tree_dir}
    got = newcomer_models(algo, server, twins)
    assert torch.equal(got, torch.stack([W[0], W[4]]))     # device 3 stays in 0; device 7 goes to 1, stays there
    server["tree_dir"] = torch.stack([tree_dir[0].flip(0), tree_dir[1]])
    got = newcomer_models(algo, server, twins)   # split 0's sides swapped: device 3 -> 1 -> (split 1, A's side) 2
    assert torch.equal(got, torch.stack([W[6], W[0]]))


def test_cfl_records_its_splits_and_newcomers_land_in_their_true_cluster():
    prob = regression()
    p_old, p_new, old = split(prob, [3, 7])
    algo, sim = train(p_old, "cfl", dict(GD, warmup_rounds=2, eps1=10.0, eps2=0.0), rounds=6)
    s = sim.server
    assert s["tree_ids"].shape[0] >= 1 and s["tree_w"].shape == (s["tree_ids"].shape[0], 4)
    assert s["tree_dir"].shape == (s["tree_ids"].shape[0], 2, 4)
    assert (s["tree_dir"].norm(dim=-1) <= 1 + 1e-6).all()
    got = newcomer_models(algo, s, p_new)
    lab = prob.data.clusters
    twin = {0: [i for i, j in enumerate(old) if lab[j] == 0], 1: [i for i, j in enumerate(old) if lab[j] == 1]}
    for k, dev in enumerate([3, 7]):
        # the newcomer ends on the model of a cluster made only of devices from its own true cluster
        rows = [i for i in range(len(old)) if torch.equal(s["W"][i], got[k])]
        assert rows and set(rows) <= set(twin[int(lab[dev])])
