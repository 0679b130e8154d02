"""Byzantine model-update attacks (fedsolve.algorithms.byzantine; FPFC Sec. 6.4.1)."""

import torch

from fedsolve.algorithms import get_algorithm
from fedsolve.algorithms.byzantine import attack_rows, benign_mask, malicious_set
from fedsolve.data.synthetic import fpfc_synthetic
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem
from fedsolve.simulation import Simulation, SimulationConfig


def test_attack_rows_definitions():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 7)
    same = attack_rows(w, "same_value", 100.0, g)
    assert torch.allclose(same, same[:, :1].expand(3, 7))                 # c * 1_d
    flip = attack_rows(w, "sign_flip", 10.0, g)
    ratio = flip / w
    assert (ratio < 0).all() and torch.allclose(ratio, ratio[:, :1].expand(3, 7), rtol=1e-4)  # -|c| w
    gau = attack_rows(torch.zeros(2000, 5), "gaussian", 100.0, g)
    assert 90 < float(gau.std()) < 110
    assert torch.equal(attack_rows(w, "none", 1.0, g), w)


def test_malicious_set_size_and_determinism():
    a, b = malicious_set(50, 0.4, 3), malicious_set(50, 0.4, 3)
    assert int(a.sum()) == 20 and torch.equal(a, b)
    assert int(malicious_set(50, 0.0, 3).sum()) == 0


def test_attacked_fpfc_corrupts_only_malicious_uploads():
    data = fpfc_synthetic("S1", seed=0, features="uniform", size_scale=0.05, max_size=60)
    prob = FederatedProblem(data, build_model_fn("logreg", (60,), 10))
    cfg = SimulationConfig(rounds=2, eval_every=2, executor="auto", sampling={"fraction": 1.0}, metrics=[])
    base = dict(lam=0.6, init_std=1.0, local_epochs=2, batch_size=None)
    clean = get_algorithm("byz_fpfc")(dict(base), prob)
    s0 = Simulation(prob, clean, cfg, seed=0)
    s0.run()
    bad = get_algorithm("byz_fpfc")(dict(base, attack="gaussian", malicious_fraction=0.2, attack_seed=1), prob)
    s1 = Simulation(prob, bad, cfg, seed=0)
    s1.run()
    mal = ~benign_mask(bad)
    assert int(mal.sum()) == 20
    # the malicious devices' uploads are N(0, 100^2) noise; the server stores them
    assert float(s1.server["W"][mal].abs().mean()) > 30
    # clients keep training on their own true state
    assert float(s1.clients["w"][mal].abs().mean()) < 30
    # LOCAL uploads nothing: an attack cannot change it
    loc = get_algorithm("byz_local")(dict(lr=0.1, local_epochs=1, attack="gaussian", malicious_fraction=0.5), prob)
    Simulation(prob, loc, cfg, seed=0).run()
