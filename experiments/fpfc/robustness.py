"""Byzantine robustness of FPFC vs baselines (FPFC Sec. 6.4.1, Fig. E.2 synthetic; spec 4.5).

Three model-update attacks (same-value sigma 100, sign-flip sigma 10, Gaussian sigma 100) by a fixed
share of malicious devices in {0, 0.2, 0.4, 0.6, 0.8}; metric: mean test accuracy of the *benign*
devices, mean +- std over seeds. Attacks come from ``fedsolve.algorithms.byzantine`` (byz_<name>).
The paper gives this only as figures (Fig. 7 FMNIST, E.2 synthetic, E.3 MNIST): no numbers to copy;
its claim is that FPFC is the most stable (SCAD is flat beyond a*lambda, so far-away uploads do not
pull benign devices). Default here: synthetic S1, reduced (size_scale 0.25, 300 rounds) for CPU.
The paper leaves open what a malicious device trains from; ``--attacker-view own`` (default) lets it train
from its own last true model, ``server`` from the server's message (in FPFC that message is built from its
own corrupted upload, and under sign-flip its model blows up; see fedsolve.algorithms.byzantine). CFL
uploads updates, not models, so it always runs with ``server``.

``--suite`` runs Fig. 7 (FMNIST) / Fig. E.3 (MNIST): data, CNN, simulation settings and parameters come
from a label-swap suite (``--set`` overrides it as in ``fedsolve compare``), and the attacks corrupt only
the block ``--attack-block`` of each upload (default ``fused``, the last layer: the "personalization
layers" of the paper's text; ``all`` corrupts the whole upload, shared conv layers included).

Each run's result goes to ``OUT/partial.json`` as it ends, and ``--resume`` keeps what is there: a long
suite can be picked up after a stop, run on several cores at once (``--jobs N``: N worker processes of one
torch thread each, the results of one process with ``--threads 1``), or split over machines (``--algorithms`` /
``--attacks``, one ``--out`` each, the files joined with ``join_partial.py``). At fraction 0 no device is malicious and the attack never acts, so one run per
method and seed serves every attack; so does one LOCAL run per fraction (LOCAL uploads nothing).

usage: python experiments/fpfc/robustness.py [--rounds 300] [--seeds 0 1 2] [--out runs/fpfc_robustness]
       python experiments/fpfc/robustness.py --suite experiments/fpfc/label_swap_fmnist.yaml \
           [--set simulation.rounds=50] [--attack-block fused] [--resume] [--jobs 2]
       python experiments/fpfc/robustness.py --smoke
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (Partial, cached_suite, cached_suite_data, driver_args, driver_parser, fmt_pct,  # noqa: E402
                    load_suite, params_for, per_client_accuracy, run, run_cells, run_suite, suite_params,
                    suite_participation, suite_problem, synthetic_problem, write_report)

from fedsolve.algorithms.byzantine import benign_mask  # noqa: E402
from fedsolve.simulation.loop import DivergenceError  # noqa: E402

LABELS = {"fpfc": "FPFC", "fpfc_l1": "FPFC-l1", "fedavg": "FedAvg", "ifca": "IFCA", "local": "LOCAL", "cfl": "CFL"}


def _cell(r: dict) -> str:
    """mean +- std of the benign accuracy; runs that diverged are counted and named."""
    parts = [fmt_pct(r["acc"])] if r["acc"] else []
    if r.get("diverged"):
        parts.append(f"diverged {len(r['diverged'])}/{len(r['acc']) + len(r['diverged'])} ({r['diverged'][0]})")
    return "; ".join(parts)


def plot(rows: list[dict], attacks: list[str], labels: list[str], title: str, path: Path) -> None:
    """The paper's figure layout (Fig. 7 / E.2 / E.3): one panel per attack, benign accuracy against the
    malicious fraction, one line per method label (mean, bars +- std over seeds); a cell whose runs all
    diverged is left out of its line and marked with an x at the bottom."""
    from fedsolve.experiments.report import plt, save_figure

    known = list(LABELS.values())
    fig, axes = plt.subplots(1, len(attacks), figsize=(4.0 * len(attacks), 3.4), sharey=True, squeeze=False)
    for ax, attack in zip(axes[0], attacks):
        for lab in labels:
            mine = [r for r in rows if r["attack"] == attack and r["algorithm"] == lab]
            ok = [r for r in mine if r["acc"]]
            color = f"C{known.index(lab)}" if lab in known else "C9"   # the same in every figure
            ax.errorbar([r["fraction"] for r in ok], [100 * np.mean(r["acc"]) for r in ok],
                        yerr=[100 * np.std(r["acc"]) for r in ok], marker="o", ms=4, capsize=2,
                        label=lab, color=color)
            lost = [r["fraction"] for r in mine if not r["acc"]]
            if lost:
                ax.plot(lost, [0.0] * len(lost), "x", ms=8, color=color)
        ax.set_title(attack.replace("_", "-"))
        ax.set_xlabel("fraction of malicious devices")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("benign devices' mean test accuracy (%)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def one_run(attack: str, frac: float, name: str, seed: int, opts: dict) -> dict:
    """One (attack, fraction, method, seed) cell: ``{"acc": benign devices' mean test accuracy}``, or
    ``{"diverged": message}``. ``opts``: the driver's settings (those recorded in ``partial.json``)."""
    att = dict(attack=attack, malicious_fraction=frac, attack_seed=seed, attacker_view=opts["attacker_view"])
    if name == "cfl":
        att.update(attack_keys=("dw",), attacker_view="server")
    if opts["suite"] is None:
        prob = synthetic_problem(opts["scenario"], seed=seed, size_scale=opts["size_scale"], max_size=opts["max_size"])
        prm = {**params_for(f"byz_{name}"), **att}
    else:
        cfg = cached_suite(opts["suite"], tuple(opts["sets"]))
        prob = suite_problem(cfg, cached_suite_data(opts["suite"], tuple(opts["sets"]), seed))
        block = None if opts["attack_block"] == "all" else opts["attack_block"]
        prm = suite_params(cfg, f"byz_{name}", dict(att, attack_block=block))
    try:
        _, algo, res = (run(prob, f"byz_{name}", prm, opts["rounds"], seed, eval_every=max(1, opts["rounds"]))
                        if opts["suite"] is None else run_suite(cfg, prob, f"byz_{name}", prm, seed))
    except DivergenceError as e:  # a finding, not a crash: reported as such
        return {"diverged": str(e).split(":")[0]}
    return {"acc": float(np.nanmean(per_client_accuracy(res)[benign_mask(algo).numpy()]))}


def main(argv=None):
    p = driver_parser(__doc__, "runs/fpfc_robustness", rounds=300, size_scale=0.25, max_size=2000, resume=True,
                      jobs=True)
    p.add_argument("--attacks", nargs="+", default=["same_value", "sign_flip", "gaussian"])
    p.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.6, 0.8])
    p.add_argument("--algorithms", nargs="+", default=["fpfc", "fedavg", "ifca", "local"])
    p.add_argument("--attacker-view", choices=["own", "server"], default="own",
                   help="what a malicious device trains from (fedsolve.algorithms.byzantine)")
    p.add_argument("--suite", default=None, help="a label-swap suite YAML: Fig. 7 (FMNIST) / Fig. E.3 (MNIST)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of --suite (repeatable)")
    p.add_argument("--attack-block", default="fused",
                   help="with --suite: the block of each upload the attacks corrupt ('all': the whole upload)")
    a = driver_args(p, argv, dict(rounds=2, seeds=[0], size_scale=0.05, max_size=100, fractions=[0.0, 0.4],
                                  attacks=["same_value", "sign_flip", "gaussian"]))
    t0 = time.perf_counter()
    rows = []
    cfg = load_suite(a.suite, a.sets) if a.suite else None
    block = None if cfg is None or a.attack_block == "all" else a.attack_block
    part = Partial(a.out, {k: getattr(a, k) for k in ("scenario", "rounds", "size_scale", "max_size", "attacker_view",
                                                      "suite", "sets", "attack_block")}, a.resume)
    done = part["results"]   # "attack/fraction/label/seed" -> {"acc": benign mean} or {"diverged": message}

    def key(attack: str, frac: float, name: str, seed: int) -> str:
        # the attack never acts at fraction 0 (no malicious device) nor on LOCAL (no upload): one run serves every attack
        return f"{'none' if frac == 0 or name == 'local' else attack}/{frac}/{LABELS.get(name, name)}/{seed}"

    opts = {k: getattr(a, k) for k in ("scenario", "rounds", "size_scale", "max_size", "attacker_view", "suite",
                                       "sets", "attack_block")}
    todo = {}
    for attack in a.attacks:
        for frac in a.fractions:
            for name in a.algorithms:
                for seed in a.seeds:
                    k = key(attack, frac, name, seed)
                    if k not in done and k not in todo:
                        todo[k] = dict(attack=attack, frac=frac, name=name, seed=seed, opts=opts)

    def store(k: str, result: dict) -> None:
        done[k] = result
        part.save()
        print(f"{k}: {result}", flush=True)

    run_cells(one_run, todo, a.jobs, store)
    for attack in a.attacks:
        for frac in a.fractions:
            for name in a.algorithms:
                accs, diverged = [], []
                for seed in a.seeds:
                    k = key(attack, frac, name, seed)
                    if "diverged" in done[k]:
                        diverged.append(done[k]["diverged"])
                    else:
                        accs.append(done[k]["acc"])
                rows.append({"attack": attack, "fraction": frac, "algorithm": LABELS.get(name, name), "acc": accs,
                             "diverged": diverged})
                print(rows[-1], flush=True)
    if cfg is None:
        head = ["# Byzantine robustness (FPFC Sec. 6.4.1; synthetic, Fig. E.2)", "",
                f"Synthetic {a.scenario}, size_scale={a.size_scale}, max n_i={a.max_size}, {a.rounds} rounds, "
                f"30% participation, paper hyper-parameters (FPFC lam 0.6, IFCA L=4), seeds {a.seeds}. "]
    else:
        fig = {"mnist": "Fig. E.3", "fmnist": "Fig. 7"}.get(cfg.data.dataset, "")
        head = [f"# Byzantine robustness (FPFC Sec. 6.4.1; {cfg.data.dataset} label swap, {fig})", "",
                f"Suite {cfg.name}: {cfg.simulation.rounds} rounds, {suite_participation(cfg)}, "
                f"the suite's parameters{f' with --set {a.sets}' if a.sets else ''}, data {dict(cfg.data.params)}, "
                f"seeds {a.seeds}. Attacks corrupt "
                f"{'the whole upload' if block is None else f'the block {block!r} of each upload'}. "]
    lines = head[:-1] + [head[-1] + "Metric: mean test accuracy of the benign devices (mean +- std over seeds). "
                         f"Malicious devices train from: {a.attacker_view} (attacker_view).", "",
             "Paper: figures only (no numbers). Claim: FPFC is the most stable method under all three attacks.",
             ""]
    for attack in a.attacks:
        lines += [f"## {attack}", "", "| algorithm | " + " | ".join(f"{f:.1f}" for f in a.fractions) + " |",
                  "|---|" + "---|" * len(a.fractions)]
        for name in a.algorithms:
            lab = LABELS.get(name, name)
            cells = [_cell(r) for f in a.fractions for r in rows
                     if r["attack"] == attack and r["fraction"] == f and r["algorithm"] == lab]
            lines.append(f"| {lab} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["![benign accuracy against the malicious fraction](robustness.png)", "",
              f"Total wall time {time.perf_counter() - t0:.0f} s{part.kept_note()}."]
    plot(rows, a.attacks, [LABELS.get(n, n) for n in a.algorithms], head[0].lstrip("# "),
         Path(a.out) / "robustness.png")
    write_report(a.out, lines, rows)
    return rows


if __name__ == "__main__":
    main()
