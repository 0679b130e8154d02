"""Byzantine model-update attacks (fedsolve.families.clustered.byzantine; FPFC Sec. 6.4.1): the wrapper ``attack``,
composed with any solver that declares its attack surface."""

import pytest
import torch
import yaml

from fedsolve.cli import main
from fedsolve.data.synthetic import fpfc_synthetic
from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.engine.wrappers import wrap
from fedsolve.families import ALGORITHMS, get_algorithm
from fedsolve.families.clustered.byzantine import OWN, HAS_OWN, Attack, attack_rows, benign_mask, malicious_set
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem


def attacked(name, prob, params, **attack):
    """``name`` with ``params`` on ``prob``, wrapped by ``{kind: attack, **attack}`` as a config's ``wrap`` list."""
    return wrap(get_algorithm(name)(params, prob), [{"kind": "attack", **attack}])


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


def test_no_registered_copies_and_every_solver_declares_its_surface_as_data():
    """Attacks are a wrapper, not registered ``byz_*`` copies; what they corrupt is each solver's declaration."""
    assert not [n for n in ALGORITHMS if n.startswith("byz_")]
    surf = {n: get_algorithm(n).attack_surface for n in ("fpfc", "fpfc_l1", "async_fpfc", "fedavg", "fedprox",
                                                           "ifca", "cfl", "pacfl", "local")}
    assert (surf["fpfc"].model, surf["fpfc"].view, surf["fpfc"].view_columns) == ("w", "zeta", "fidx")
    assert surf["fpfc_l1"] == surf["async_fpfc"] == surf["fpfc"]
    assert (surf["fedavg"].model, surf["fedavg"].view) == (surf["fedprox"].model, surf["fedprox"].view) == ("w", "w")
    assert (surf["ifca"].model, surf["ifca"].view) == ("w", "models")
    assert (surf["cfl"].model, surf["cfl"].view) == ("dw", None)
    assert surf["local"].model is None and surf["pacfl"].view == "w"


def test_attacked_fpfc_corrupts_only_malicious_uploads():
    data = fpfc_synthetic("S1", seed=0, features="uniform", size_scale=0.05, max_size=60)
    prob = FederatedProblem(data, build_model_fn("logreg", (60,), 10))
    cfg = SimulationConfig(rounds=2, eval_every=2, executor="auto", sampling={"fraction": 1.0}, metrics=[])
    base = dict(lam=0.6, init_std=1.0, local_epochs=2, batch_size=None)
    clean = attacked("fpfc", prob, base)
    s0 = Simulation(prob, clean, cfg, seed=0)
    s0.run()
    bad = attacked("fpfc", prob, base, attack="gaussian", malicious_fraction=0.2, attack_seed=1)
    s1 = Simulation(prob, bad, cfg, seed=0)
    s1.run()
    mal = ~benign_mask(bad)
    assert int(mal.sum()) == 20
    # the malicious devices' uploads are N(0, 100^2) noise; the server stores them
    assert float(s1.server["W"][mal].abs().mean()) > 30
    # clients keep training on their own true state
    assert float(s1.clients["w"][mal].abs().mean()) < 30
    # LOCAL uploads nothing: an attack cannot change it
    loc = attacked("local", prob, dict(lr=0.1, local_epochs=1), attack="gaussian", malicious_fraction=0.5)
    Simulation(prob, loc, cfg, seed=0).run()


@pytest.mark.parametrize("name", ["fpfc", "fedavg", "ifca"])
def test_no_malicious_device_no_attack(name):
    """At malicious_fraction 0 every attack leaves the run exactly as without one: the robustness suite
    runs fraction 0 once per method and seed for all three attacks."""
    prob = _small_s1()
    runs = [_attacked_run(prob, name, 3, malicious_fraction=0.0, attack=att, attacker_view=view)[1]
            for att, view in (("none", "server"), ("sign_flip", "own"), ("gaussian", "own"), ("same_value", "own"))]
    keys = [k for k in runs[0].server if not k.startswith("attack.")]
    for sim in runs[1:]:
        for k in keys:
            assert torch.equal(sim.server[k], runs[0].server[k]), k
        for k, v in runs[0].clients.items():
            assert torch.equal(sim.clients[k], v), k


def test_local_is_the_same_under_every_attack():
    """LOCAL uploads nothing, so the attack never acts on it; only the benign set moves with the fraction."""
    prob = _small_s1()
    runs = [_attacked_run(prob, "local", 3, attack=att) for att in ("none", "sign_flip", "gaussian")]
    for algo, sim, _ in runs[1:]:
        assert torch.equal(benign_mask(algo), benign_mask(runs[0][0]))
        for k, v in runs[0][1].clients.items():
            assert torch.equal(sim.clients[k], v), k


def _small_s1():
    data = fpfc_synthetic("S1", seed=0, features="uniform", size_scale=0.05, max_size=60)
    return FederatedProblem(data, build_model_fn("logreg", (60,), 10))


def _attacked_run(prob, name, rounds, out_dir=None, resume=False, **kw):
    cfg = SimulationConfig(rounds=rounds, eval_every=rounds, executor="auto", sampling={"fraction": 0.5},
                           metrics=[])
    base = dict(local_epochs=5, batch_size=None)
    if name == "fpfc":
        base.update(lam=0.6, init_std=0.1)
    if name == "ifca":
        base.update(num_clusters=kw.pop("num_clusters", 4))
    algo = attacked(name, prob, base, **dict(dict(malicious_fraction=0.4, attack_seed=2), **kw))
    sim = Simulation(prob, algo, cfg, seed=0, out_dir=out_dir)
    return algo, sim, sim.run(resume=resume)


def test_sign_flip_blows_up_the_attackers_own_model_only_when_it_follows_the_server():
    """attacker_view 'server': zeta_k ~ w~_k = -|c| w_k, so the attacker's own model grows by ~|c| per
    participation; 'own': it trains from its own model and stays on the benign devices' scale."""
    prob = _small_s1()
    scale = {}
    for view in ("server", "own"):
        algo, sim, _ = _attacked_run(prob, "fpfc", 8, attack="sign_flip", attacker_view=view)
        mal = ~benign_mask(algo)
        w = sim.clients["w"]
        scale[view] = float(w[mal].abs().mean() / w[~mal].abs().mean())
    assert scale["server"] > 20
    assert scale["own"] < 3


def test_own_view_attacker_trains_independently_of_the_attack_and_the_others():
    """With attacker_view 'own', FPFC's malicious device minimizes f_k + rho/2 ||w - w_k^prev||^2 from its
    own model: its trajectory cannot depend on what it uploads nor on the other devices."""
    prob = _small_s1()
    runs = {att: _attacked_run(prob, "fpfc", 6, attack=att, attacker_view="own")
            for att in ("sign_flip", "gaussian", "same_value")}
    mal = ~benign_mask(runs["gaussian"][0])
    ref = runs["gaussian"][1].clients["w"][mal]
    for att in ("sign_flip", "same_value"):
        assert torch.allclose(runs[att][1].clients["w"][mal], ref, atol=1e-5)
    # ... while the benign devices do see the uploads (not identical across attacks)
    assert not torch.allclose(runs["sign_flip"][1].clients["w"][~mal], runs["gaussian"][1].clients["w"][~mal])
    # the server keeps each attacker's last true upload: it is the attacker's current model
    srv, cl = runs["gaussian"][1].server, runs["gaussian"][1].clients["w"]
    has = srv[HAS_OWN]
    assert bool(has.any()) and not bool(has[~mal].any())
    assert torch.allclose(srv[OWN][has], cl[has])


def test_own_view_messages_for_fedavg_and_ifca_and_errors():
    prob = _small_s1()
    for name in ("fedavg", "ifca"):
        algo, sim, res = _attacked_run(prob, name, 4, attack="sign_flip", attacker_view="own")
        assert all(torch.isfinite(v).all() for v in sim.server.values() if v.is_floating_point())
        ids = torch.arange(prob.num_clients)
        msg = algo.broadcast(sim.server, ids, 4)
        has = sim.server[HAS_OWN]
        assert bool(has.any())
        key = "w" if name == "fedavg" else "models"
        got = msg[key][has] if key == "w" else msg[key][has][:, 0]
        assert torch.equal(got, sim.server[OWN][has])
        if key == "models":      # every cluster model sent to an attacker is its own
            assert torch.equal(msg[key][has][:, 1], got)
        scored = algo.broadcast(sim.server, ids, None)   # the scoring message is the solver's own, unchanged
        plain = algo.inner.broadcast({k: v for k, v in sim.server.items() if k not in (OWN, HAS_OWN)}, ids, None)
        assert scored.keys() == plain.keys() and all(torch.equal(v, plain[k]) for k, v in scored.items())
    cfl = attacked("cfl", prob, {}, attack="sign_flip")   # CFL declares no own view (it uploads updates)
    assert cfl.attack_keys == ("dw",)                      # its declared model key, not guessed
    with pytest.raises(ValueError, match="wrap.attack.attacker_view: 'own' is not defined for cfl"):
        attacked("cfl", prob, {}, attack="sign_flip", attacker_view="own")
    with pytest.raises(ValueError, match="wrap.attack.attacker_view: 'own' needs the uploaded model"):
        attacked("fedavg", prob, {}, attack="sign_flip", attack_keys=["w", "x"], attacker_view="own")
    with pytest.raises(ValueError, match=r"wrap\.attack\.malicious_fraction: .*1\.5"):
        attacked("fedavg", prob, {}, attack="gaussian", malicious_fraction=1.5)
    with pytest.raises(ValueError, match=r"wrap\.attack\.attack: "):
        attacked("fedavg", prob, {}, attack="sign-flip")


def test_own_view_state_survives_resume(tmp_path):
    prob = _small_s1()
    kw = dict(attack="sign_flip", attacker_view="own")
    _, full, _ = _attacked_run(prob, "fpfc", 6, **kw)
    _attacked_run(prob, "fpfc", 3, out_dir=tmp_path, **kw)
    _, resumed, _ = _attacked_run(prob, "fpfc", 6, out_dir=tmp_path, resume=True, **kw)
    for k in full.server:
        assert torch.equal(full.server[k], resumed.server[k]), k


def test_attack_block_corrupts_only_that_block():
    """attack_block: only the named block of a malicious upload is corrupted (the paper attacks the
    personalization layer); one FedAvg round from the same start gives the clean run's other coordinates."""
    data = fpfc_synthetic("S1", seed=0, features="uniform", size_scale=0.05, max_size=60)
    prob = FederatedProblem(data, build_model_fn("logreg", (60,), 10), blocks={"fused": ["*bias"]})
    cfg = SimulationConfig(rounds=1, eval_every=1, executor="auto", sampling={"fraction": 1.0}, metrics=[])
    base = dict(lr=0.1, local_epochs=2, batch_size=None)
    runs = {}
    for key, extra in {"clean": {}, "block": dict(attack="gaussian", malicious_fraction=0.4, attack_block="fused"),
                       "all": dict(attack="gaussian", malicious_fraction=0.4)}.items():
        sim = Simulation(prob, attacked("fedavg", prob, base, **extra), cfg, seed=0)
        sim.run()
        runs[key] = sim.server["w"]
    bias = prob.layout.mask("fused")
    assert int(bias.sum()) == 10
    assert torch.allclose(runs["block"][~bias], runs["clean"][~bias], atol=1e-6)
    assert float((runs["block"][bias] - runs["clean"][bias]).abs().max()) > 1.0
    assert float((runs["all"][~bias] - runs["clean"][~bias]).abs().max()) > 1.0
    with pytest.raises(ValueError, match="wrap.attack.attack_block: the model has no block 'head'"):
        attacked("fedavg", prob, base, attack="gaussian", attack_block="head")


def test_wrapper_composes_in_python_as_in_a_config_and_passes_the_solver_through():
    """``Attack(inner, ...)`` is the run a config's ``wrap: [{kind: attack, ...}]`` gives; the inner solver's name,
    config, methods and full-batch fast path pass through, and set_hparams reaches it."""
    from fedsolve.families.clustered.fpfc import FPFC

    prob = _small_s1()
    cfg = SimulationConfig(rounds=3, eval_every=3, executor="auto", sampling={"fraction": 0.5}, metrics=[])
    base = dict(lam=0.6, init_std=0.1, local_epochs=5, batch_size=None)
    attack = dict(attack="gaussian", malicious_fraction=0.4, attack_seed=2, attacker_view="own")
    composed = Attack(FPFC(base, prob), **attack)
    configured = attacked("fpfc", prob, base, **attack)
    sims = [Simulation(prob, a, cfg, seed=0) for a in (composed, configured)]
    for s in sims:
        s.run()
    assert type(sims[0].executor).__name__ == type(sims[1].executor).__name__ == "LinearGDExecutor"
    for k, v in sims[1].server.items():
        assert torch.equal(sims[0].server[k], v), k
    assert composed.name == "fpfc" and composed.cfg.lam == 0.6
    assert torch.equal(benign_mask(composed), benign_mask(configured))
    assert composed.cluster_labels(sims[0].server).shape == (prob.num_clients,)     # the inner algorithm's method
    sims[0].set_hparams(lam=0.3)
    assert composed.inner.cfg.lam == 0.3 and int((~benign_mask(composed)).sum()) == 40
    assert "malicious" in sims[0].history[-1] and "malicious" not in sims[0].algo.report(sims[0].server,
                                                                                         sims[0].clients, True)


def test_wrapper_runs_the_same_under_sequential_and_vectorized_executors():
    from fedsolve.families.classic.fedavg import FedAvg

    prob = _small_s1()
    out = {}
    for ex in ("sequential", "vectorized"):
        algo = Attack(FedAvg(dict(lr=0.1, local_epochs=1, batch_size=8), prob), attack="sign_flip",
                      malicious_fraction=0.3, attack_seed=1, attacker_view="own")
        sim = Simulation(prob, algo, SimulationConfig(rounds=3, eval_every=3, executor=ex, sampling={"fraction": 0.5},
                                                      metrics=[]), seed=0)
        sim.run()
        out[ex] = sim.server
    assert bool(out["sequential"][HAS_OWN].any())
    for k, v in out["sequential"].items():
        assert torch.allclose(out["vectorized"][k].double(), v.double(), atol=1e-5), k


def _cli_config(tmp_path, wrap_spec) -> str:
    cfg = {"name": "attacked", "data": {"dataset": "synthetic_fpfc", "num_clients": None,
                                        "params": {"scenario": "S1", "size_scale": 0.05, "max_size": 60}},
           "model": {"name": "logreg"},
           "simulation": {"rounds": 2, "eval_every": 1, "metrics": [], "sampling": {"fraction": 0.5}},
           "algorithm": {"name": "fedavg", "params": {"lr": 0.1, "batch_size": None, "local_epochs": 2},
                         "wrap": [wrap_spec]}}
    p = tmp_path / "attacked.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return str(p)


def test_a_config_names_the_attack_under_wrap_and_bad_settings_are_one_line(tmp_path, capsys):
    spec = {"kind": "attack", "attack": "sign_flip", "malicious_fraction": 0.4, "attacker_view": "own"}
    out = tmp_path / "run"
    assert main(["run", _cli_config(tmp_path, spec), "--out", str(out), "--quiet"]) == 0
    assert "malicious" in (out / "metrics.jsonl").read_text()
    assert yaml.safe_load((out / "config.yaml").read_text())["algorithm"]["wrap"] == [spec]
    for bad, words in (({"malicious_fraction": 2.0}, "wrap.attack.malicious_fraction"),
                       ({"attacker_view": "mine"}, "wrap.attack.attacker_view"),
                       ({"attack_block": "head"}, "wrap.attack.attack_block")):
        capsys.readouterr()
        assert main(["run", _cli_config(tmp_path, dict(spec, **bad)), "--out", str(tmp_path / "bad"),
                     "--quiet", "--overwrite"]) == 2, bad
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
