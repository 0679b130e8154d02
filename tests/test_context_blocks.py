"""Block-restricted local steps (``ParamBlock``, ``LocalContext.block_sgd``): the gradient with respect to a
block's parameter tensors only and an update of the block's slice only, with an affine term ``a * p + c``.

References: the masked full-vector step (``LocalContext.sgd(mask=...)``) on random blocks of a small MLP, under
the sequential and the vectorized executor; and FedAPM through the masked path as it was before the block step
(``MaskedFedAPM`` below states it as masked ``Descend`` statements on the whole vector), a few rounds on a small MLP
problem.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsolve.families.personalized.fedapm import FedAPM
from fedsolve.families.personalized.baselines import FedAlt
from fedsolve.core.context import LocalContext, ParamBlock
from fedsolve.core.executor import SequentialExecutor, VectorizedExecutor, Work, build_plans
from fedsolve.core.rng import RngStreams
from fedsolve.core.statements import Descend
from fedsolve.data.federated import FederatedData
from fedsolve.models import MLP
from fedsolve.problems import FederatedProblem
from fedsolve.engine import Simulation, SimulationConfig
from tests.test_personalized import blobs as personalized_blobs


def blobs(m=4, d=10, k=3, seed=0, sizes=None):
    """test_personalized's blobs in float32 (the model's dtype here)."""
    return personalized_blobs(m=m, d=d, k=k, seed=seed, sizes=sizes, double=False)


def mlp_problem(personal="out.*", sizes=(16, 24, 20, 32), hidden=(8, 6)):
    """A float32 MLP 10-8-6-3 over four clients of different sizes (variable local work: inactive steps)."""
    return FederatedProblem(blobs(m=len(sizes), sizes=list(sizes)), lambda: MLP(10, 3, hidden=hidden),
                            blocks={"personal": [personal]} if personal else {})


# ------------------------------------------------------------------ ParamBlock
def test_param_block_views_and_complement():
    prob = mlp_problem()
    lay = prob.layout
    blk = ParamBlock(lay, lay.mask("personal"))
    assert blk.names == ["out.weight", "out.bias"] and blk.size == 6 * 3 + 3
    assert blk.rest.names == ["hidden.0.weight", "hidden.0.bias", "hidden.2.weight", "hidden.2.bias"]
    assert blk.rest.size == lay.dim - blk.size and torch.equal(blk.rest.mask, ~blk.mask)
    full = torch.randn(3, lay.dim)
    vec = blk.gather(full)
    torch.testing.assert_close(vec, full[..., lay.mask("personal")], rtol=0, atol=0)
    d = blk.unflatten(vec)
    torch.testing.assert_close(d["out.weight"], lay.unflatten(full)["out.weight"], rtol=0, atol=0)
    torch.testing.assert_close(blk.flatten(d), vec, rtol=0, atol=0)
    # the whole model is a block whose complement is empty
    whole = ParamBlock(lay, torch.ones(lay.dim, dtype=torch.bool))
    assert whole.rest.size == 0 and whole.rest.unflatten(torch.zeros(0)) == {}


def test_param_block_must_hold_whole_tensors():
    lay = mlp_problem().layout
    bad = torch.zeros(lay.dim, dtype=torch.bool)
    bad[:5] = True   # part of hidden.0.weight only
    with pytest.raises(ValueError, match="hidden.0.weight"):
        ParamBlock(lay, bad)
    with pytest.raises(ValueError, match="mask"):
        ParamBlock(lay, torch.ones(lay.dim - 1, dtype=torch.bool))


# ------------------------------------------------------------------ block_sgd against the masked step
class _Step:
    """A duck-typed algorithm for the executors: one client's masked step (``mode='masked'``) or block step."""

    def __init__(self, problem, block, lr, scale, a, c, extra_cubic, mode):
        self.problem, self.block, self.lr, self.scale, self.a, self.c = problem, block, lr, scale, a, c
        self.extra_cubic, self.mode = extra_cubic, mode   # a non-affine extra term on top (cubic), or None
        self.c_full = torch.zeros(block.mask.numel())
        self.c_full[block.mask] = c

    def local_update(self, state, msg, ctx: LocalContext):
        blk, full, q = self.block, state["full"], self.extra_cubic
        if self.mode == "masked":
            extra = lambda p: self.a * p + self.c_full + (q * p.pow(3) if q else 0.0)  # noqa: E731
            out = ctx.sgd(full, self.lr, "train", extra=extra, mask=blk.mask.to(full.dtype), scale=self.scale)
        else:
            new = ctx.block_sgd(blk, blk.gather(full), blk.rest.gather(full), self.lr, "train", scale=self.scale,
                                affine=(self.a, self.c), extra=(lambda p: q * p.pow(3)) if q else None)
            out = blk.scatter(new, blk.rest.gather(full))
        return {"full": out, "loss": ctx.train_loss}, {}


def _run(executor, pattern, a, c_scale, scale, extra_cubic, batch_size, mode):
    prob = mlp_problem()
    lay = prob.layout
    mask = torch.zeros(lay.dim, dtype=torch.bool)
    for e in lay.entries:
        if e.name in pattern:
            mask[e.start:e.start + e.numel] = True
    blk = ParamBlock(lay, mask)
    g = torch.Generator().manual_seed(3)
    c = c_scale * torch.randn(blk.size, generator=g)
    algo = _Step(prob, blk, 0.2, scale, a, c, extra_cubic, mode)
    ids = torch.arange(4)
    plans = build_plans({"train": Work(epochs=2, batch_size=batch_size)}, prob.data.train_offsets, ids,
                        RngStreams(1), 0)
    start = 0.3 * torch.randn(4, lay.dim, generator=g)
    out, _, _ = executor.run(algo, {"full": start}, {}, ids, plans, prob.data)
    return out, blk, start


BLOCKS = [["out.weight", "out.bias"], ["hidden.0.weight", "hidden.0.bias", "hidden.2.weight", "hidden.2.bias"],
          ["hidden.0.bias", "hidden.2.weight", "out.bias"], ["hidden.0.weight"]]


@pytest.mark.parametrize("executor", [SequentialExecutor(), VectorizedExecutor()], ids=["sequential", "vectorized"])
@pytest.mark.parametrize("pattern", BLOCKS, ids=["head", "body", "mixed", "first"])
@pytest.mark.parametrize("a,c_scale,scale,extra_cubic,batch_size",
                         [(0.0, 0.0, 1.0, None, 8), (0.03, 0.5, 0.25, None, 8), (0.1, 0.2, 1.0, 0.05, None)],
                         ids=["plain", "affine", "affine+extra"])
def test_block_sgd_equals_masked_sgd(executor, pattern, a, c_scale, scale, extra_cubic, batch_size):
    args = (executor, pattern, a, c_scale, scale, extra_cubic, batch_size)
    ref, blk, start = _run(*args, "masked")
    new, _, _ = _run(*args, "block")
    assert (ref["full"] - start).abs().max() > 1e-3   # the step moved the block
    torch.testing.assert_close(new["full"], ref["full"], rtol=1e-5, atol=1e-6)
    # the rest of the model is never touched (bit for bit)
    torch.testing.assert_close(blk.rest.gather(new["full"]), blk.rest.gather(start), rtol=0, atol=0)
    torch.testing.assert_close(new["loss"], ref["loss"], rtol=1e-5, atol=1e-6)


def test_block_sgd_sequential_equals_vectorized():
    outs = [_run(ex, BLOCKS[2], 0.05, 0.3, 0.5, None, 8, "block")[0]["full"]
            for ex in (SequentialExecutor(), VectorizedExecutor())]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)


def test_block_sgd_until_stops_on_the_block_gradient():
    """``until(p, g)`` sees the block vector and its full step direction (gradient plus the affine term)."""
    prob = mlp_problem(sizes=(16,))
    lay = prob.layout
    blk = ParamBlock(lay, lay.mask("personal"))
    plans = build_plans({"train": Work(steps=50, batch_size=None)}, prob.data.train_offsets, torch.arange(1),
                        RngStreams(0), 0)
    full = 0.3 * torch.randn(lay.dim, generator=torch.Generator().manual_seed(0))
    seen = []

    def until(p, g):
        assert p.shape == g.shape == (blk.size,)
        seen.append(float((g * g).sum()))
        return (g * g).sum() <= 1e-2

    ctx = LocalContext(prob, {k: v.row(0) for k, v in plans.items()}, torch.tensor(16.0), torch.tensor(1.0),
                       torch.tensor(0), prob.data.train_x, prob.data.train_y)
    ctx.eager = True
    ctx.block_sgd(blk, blk.gather(full), blk.rest.gather(full), 0.5, "train", affine=(0.1, None), until=until)
    stop = next(i for i, s in enumerate(seen) if s <= 1e-2)
    assert 0 < stop < 49 and all(s > 1e-2 for s in seen[:stop])


# ------------------------------------------------------------------ FedAPM: block path vs the masked path
class MaskedFedAPM(FedAPM):
    """FedAPM's client round through the masked full-vector step, as the code was before the block step (the
    reference: a ``Descend`` over ``join(v, u)`` with the phase's mask, extra terms as callables on ``[d]``)."""

    def _masked(self, ctx, v, u, phase, mask, extra, lr, until):
        full = ctx.descend(Descend(start=self.join(v, u), lr=lr, phase=phase, extra=extra, mask=mask,
                                   scale=self.alpha(ctx), weight_decay=self.cfg.weight_decay, until=until, then=None))
        return self.split(full)

    def shared_full(self, u):
        """A shared-block vector embedded in ``[d]`` with zeros on the personal block (the old base-class helper)."""
        return self.join(torch.zeros(*u.shape[:-1], self.d_v, dtype=u.dtype, device=u.device), u)

    def local_update(self, state, msg, ctx):
        c = self.cfg
        u_t, v, u_i, pi, rho = msg["u"], state["v"], state["u"], state["pi"], c.rho
        xi_ctl = c.solver == "xi_controlled"
        anchor = self.join(v, torch.zeros_like(u_i))
        v_new = self._masked(ctx, v, u_i if c.v_shared == "local" else u_t, "v", self.pmask,
                             (lambda p: c.sigma * (p - anchor)) if c.sigma > 0 else None, c.personal_lr or c.lr,
                             (lambda p, g: (g * g).sum() <= c.v_tol) if xi_ctl else None)[0]
        xi = c.xi_decay * state["xi"]
        pi_full, ut_full = self.shared_full(pi), self.shared_full(u_t)
        u_new = self._masked(ctx, v_new, u_t if c.warm_start == "server" else u_i, "u", self.smask,
                             (lambda p: pi_full + rho * (p - ut_full)) if (c.dual or rho > 0) else None, c.lr,
                             (lambda p, g: (g * g).sum() <= xi) if xi_ctl else None)[1]
        pi_new = pi + rho * (u_new - u_t) if c.dual else pi
        rows = {"v": v_new, "u": u_new, "pi": pi_new, "xi": xi, "drift": (u_new - u_t).norm()}
        return rows, self.upload(state, rows)


def _fedapm_rounds(cls, prob, cfg, executor, rounds=3):
    algo = cls(cfg, prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=rounds, eval_every=1000, executor=executor,
                                                  sampling={"clients_per_round": 3}), seed=0)
    for t in range(rounds):
        sim.run_round(t)
    return sim.server, sim.clients.state_dict()


FEDAPM_CASES = {
    "output": ("out.*", dict(lr=0.3, batch_size=8, local_epochs=2)),
    "input": ("hidden.0.*", dict(lr=0.3, batch_size=8, local_epochs=1, alpha="samples", v_shared="server")),
    "xi": ("out.*", dict(lr=0.3, solver="xi_controlled", max_steps=8, xi0=1e-3, v_tol=1e-4)),
    "penalty": ("out.*", dict(lr=0.3, batch_size=8, dual=False, rho=0.05, sigma=0.0, personal_lr=0.1,
                              warm_start="local")),
}


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
@pytest.mark.parametrize("case", sorted(FEDAPM_CASES))
def test_fedapm_block_path_matches_masked_path(case, executor):
    pattern, cfg = FEDAPM_CASES[case]
    prob = mlp_problem(personal=pattern)
    cfg = dict(cfg, rho=cfg.get("rho", 0.1), sigma=cfg.get("sigma", 0.05), weight_decay=0.01)
    ref_s, ref_c = _fedapm_rounds(MaskedFedAPM, prob, cfg, executor)
    new_s, new_c = _fedapm_rounds(FedAPM, prob, cfg, executor)
    assert (ref_c["v"] - ref_c["v"][0]).abs().max() > 1e-3   # personal blocks trained and differ
    for k in ref_s:
        torch.testing.assert_close(new_s[k], ref_s[k], rtol=1e-6, atol=1e-6, check_dtype=False)
    for k in ref_c:
        torch.testing.assert_close(new_c[k], ref_c[k], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", sorted(FEDAPM_CASES))
def test_fedapm_block_path_sequential_equals_vectorized(case):
    pattern, cfg = FEDAPM_CASES[case]
    prob = mlp_problem(personal=pattern)
    seq = _fedapm_rounds(FedAPM, prob, cfg, "sequential")
    vec = _fedapm_rounds(FedAPM, prob, cfg, "vectorized")
    for a, b in zip(seq, vec):
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, check_dtype=False)


def test_fedalt_block_path_matches_masked_path():
    """FedAlt (the shared v_step / u_step without extra terms) against the masked step written out."""
    prob = mlp_problem()
    algo = FedAlt(dict(lr=0.2, batch_size=8, weight_decay=0.01), prob)
    ids = torch.arange(4)
    sim = Simulation(prob, algo, SimulationConfig(rounds=1, eval_every=1000, executor="sequential"), seed=0)
    rows = sim.clients.gather(ids)
    rows["v"] = rows["v"] + 0.1 * torch.randn(rows["v"].shape, generator=torch.Generator().manual_seed(0))
    u_t = rows["u"][0]
    plans = build_plans(algo.work(), prob.data.train_offsets, ids, RngStreams(0), 0)
    new, _, _ = SequentialExecutor().run(algo, rows, algo.broadcast({"u": u_t}, ids, 0), ids, plans, prob.data)
    for k in range(4):
        ctx = LocalContext(prob, {p: pl.row(k) for p, pl in plans.items()}, torch.tensor(1.0), torch.tensor(1.0),
                           ids[k], prob.data.train_x, prob.data.train_y)
        ctx.eager = True
        for phase, mask in (("v", algo.pmask), ("u", algo.smask)):
            full = ctx.descend(Descend(start=full if phase == "u" else algo.join(rows["v"][k], u_t), lr=0.2,
                                       phase=phase, mask=mask, weight_decay=0.01, then=None))
        torch.testing.assert_close(algo.join(new["v"][k], new["u"][k]), full, rtol=1e-6, atol=1e-6)

