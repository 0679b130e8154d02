"""FPFC, Algorithm 2 of Yu, Liu, Wang, Sun (arXiv:2211.04218v3): inexact ADMM on w_i - w_j = theta_ij.

    min_w  sum_i f_i(w_i) + (1/(2m)) sum_{i<j} g~(||w_i - w_j||, lam)          (eq. 1/4)

Round k with active devices A_k:
  server -> i in A_k:   zeta_i = (1/m) sum_j (w_j + theta_ij - v_ij/rho)                  (broadcast)
  device i:             T_i steps of  w <- w - alpha [grad f_i(w) + rho (w - zeta_i)]      (eq. 5, local_update)
  i -> server:          w_i
  server, pairs with an end in A_k:  delta_ij = w_i - w_j + v_ij/rho,  theta_ij = prox(delta_ij),
                        v_ij += rho (w_i - w_j - theta_ij)                                (eq. 6, aggregate)
Read-out: ||theta_ij|| <= nu -> graph -> connected components; a device is scored with its cluster's
n_i-weighted average model (``eval_with='cluster'``: the message ``broadcast`` gives with ``round_=None``) or its
own w_i; ``report`` gives the clusters found (number, ARI against the true ones where known).

The pair variables live in a store of ``pairs.py`` (dense or sparse), the penalties in ``penalties.py``;
the package docstring has the storage layout, memory and cost.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from fedsolve.core import native
from fedsolve.core.plans import Work
from fedsolve.core.statements import Descend
from fedsolve.core.states import ClientStates, repeat_rows
from fedsolve.engine.algorithm import Algorithm, register, weighted_mean
from fedsolve.engine.wrappers import AttackSurface
from fedsolve.families.clustered.clusters import adjusted_rand, cluster_average, clusters_from_norms
from fedsolve.families.clustered.fpfc.config import FPFCConfig
from fedsolve.families.clustered.fpfc.pairs import PAIR_STORES, DensePairs
from fedsolve.families.clustered.fpfc.penalties import prox_scale


@register
class FPFC(Algorithm):
    name = "fpfc"
    description = "FPFC: clustered FL by smoothed-SCAD pairwise fusion, inexact ADMM (Yu et al. 2023)"
    Config = FPFCConfig
    cfg: FPFCConfig
    finite_check_keys: ClassVar[tuple[str, ...] | None] = ("W", "R")
    #: the upload ``w`` is the device's model; a device that ignores the server takes its own fused block as the
    #: proximal centre ``zeta``
    attack_surface = AttackSurface(model="w", view="zeta", view_columns="fidx")

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        c, lay = self.cfg, self.layout
        d = lay.dim
        if lay.has_block(c.fused_block):
            fmask = lay.mask(c.fused_block)
        else:
            fmask = torch.ones(d, dtype=torch.bool)
        self.fidx = torch.nonzero(fmask).flatten()
        self.sidx = torch.nonzero(~fmask).flatten()
        #: eq. 5's proximal coefficient per coordinate: rho on the fused block, 0 on the shared (averaged) one
        self.fused_pull = torch.zeros(d, dtype=torch.float64).masked_fill_(fmask, c.rho)
        self.all_fused = self.sidx.numel() == 0
        self.df = self.fidx.numel()
        m = self.num_clients
        layout = c.pair_layout
        if layout == "auto":
            layout = "dense" if m * m * self.df <= 5e7 else "sparse"
        self.store = PAIR_STORES[layout]
        self.pair_layout = layout
        self.sizes = self.problem.data.train_sizes.to(torch.float64)
        self._cache: tuple[dict, float, np.ndarray] | None = None  # (server record, nu, labels)
        self.sdtype = torch.float64 if c.dtype == "float64" else torch.float32

    @property
    def kernel(self) -> str:
        """The run's ``simulation.linear_kernel`` (set by the engine); ``native`` on a dense float32 store needs
        the compiled pair kernel."""
        return getattr(self, "_kernel", "auto")

    @kernel.setter
    def kernel(self, kernel: str) -> None:
        if (
            kernel == "native"
            and self.pair_layout == "dense"
            and self.sdtype == torch.float32
            and DensePairs.compiled(self.sdtype) is None
        ):
            why = "it is turned off (FEDSOLVE_NATIVE=0)" if not native.enabled() else "no C compiler could build it"
            raise ValueError(
                f"linear_kernel: 'native' is not available for FPFC's pair update ({why}); use 'auto' or 'torch'"
            )
        self._kernel = kernel

    @property
    def pair_kernel(self) -> str:
        """``native`` when the server's pair update runs the compiled kernel, else ``torch``."""
        return "native" if self.pair_layout == "dense" and DensePairs.compiled(self.sdtype, self.kernel) else "torch"

    def prox_fn(self, r: Tensor) -> Tensor:
        c = self.cfg
        return prox_scale(r, c.lam, c.rho, c.a, c.xi, c.penalty)

    # ------------------------------------------------------------------ work / schedules
    def local_steps_at(self, k: int) -> int | None:
        c = self.cfg
        if c.local_schedule == "growing":
            return max(1, math.ceil((k + c.growth_offset) / c.growth_rounds))
        return c.local_steps

    def work(self, round_: int | None = 0) -> dict[str, Work]:
        c = self.cfg
        if round_ is None:  # scored as they are: no adaptation before evaluation
            return {}
        return {"train": Work(epochs=c.local_epochs, steps=self.local_steps_at(round_), batch_size=c.batch_size)}

    def lr_at(self, k: int) -> float:
        c = self.cfg
        return c.lr * c.lr_decay ** (k // c.lr_decay_every)

    # ------------------------------------------------------------------ five functions
    def init(self, x0, rngs):
        m = self.num_clients
        if self.cfg.init_std is not None:
            g = rngs.torch("fpfc_init")
            x0 = torch.randn(x0.shape, generator=g, dtype=x0.dtype) * self.cfg.init_std
        W = repeat_rows(x0, m)
        server = {"W": W.clone(), "R": torch.zeros(m, self.df, dtype=self.sdtype)}
        server.update(self.store.init(m, self.df, self.sdtype))
        return server, ClientStates(m, {"w": W})

    def fused(self, W: Tensor, dtype=None) -> Tensor:
        """The fused block of the rows of ``W`` (``W`` itself when the whole model is fused)."""
        Wf = W if self.all_fused else W[:, self.fidx]
        return Wf if dtype is None else Wf.to(dtype)

    def zeta(self, server, ids: Tensor) -> Tensor:
        """zeta_i = (1/m) sum_j (w_j + theta_ij - v_ij/rho) for the devices ``ids`` (fused block)."""
        Wf = self.fused(server["W"], server["R"].dtype)
        m = Wf.shape[0]
        return (Wf.mean(0).unsqueeze(0) + server["R"][ids] / m).to(server["W"].dtype)

    def broadcast(self, server, ids, round_):
        if round_ is None:
            return self.scored(server, ids)
        msg = {"zeta": self.zeta(server, ids)}
        if not self.all_fused:
            msg["shared"] = server["W"][ids][:, self.sidx]
        return msg

    def local_update(self, state, msg, ctx):
        """Eq. 5: GD on f_i + (rho/2)||w_fused - zeta_i||^2 from w_i (the shared block from the server's)."""
        rho, zeta, c = self.cfg.rho, msg["zeta"], self.cfg
        step: dict[str, Any] = dict(
            lr=self.lr_at(ctx.round), weight_decay=c.weight_decay, then=lambda w, steps: ({"w": w}, {"w": w})
        )
        if self.all_fused:
            return Descend(start=state["w"], prox=rho, anchor=zeta, **step)
        w0 = state["w"].index_copy(-1, self.sidx, msg["shared"])
        # the pull rho (w_fused - zeta_i): coefficient rho on the fused block, 0 on the shared one
        anchor = torch.zeros_like(w0).index_copy(-1, self.fidx, zeta)
        return Descend(start=w0, prox=self.fused_pull.to(w0), anchor=anchor, **step)

    def server_update(self, server, ids: Tensor, W_new: Tensor) -> dict[str, Tensor]:
        """Write the uploads ``W_new`` of ``ids`` and update every pair touching them (eq. 6): a new record
        over the same (updated in place) tensors."""
        server = dict(server)
        W = server["W"]
        W.index_copy_(0, ids, W_new.to(W.dtype))
        act = torch.arange(self.num_clients) if self.cfg.update_pairs == "all" else ids
        self.store.update(server, self.fused(W, server["R"].dtype), act, self.prox_fn, kernel=self.kernel)
        return server

    def aggregate(self, server, ids, uploads, round_):
        W_new = uploads["w"]
        if not self.all_fused:
            W_new = W_new.clone()
            sh = W_new[:, self.sidx]
            if self.cfg.shared_weighting == "samples":
                avg = weighted_mean(sh, self.client_weights[ids])
            else:
                avg = sh.mean(0)
            W_new[:, self.sidx] = avg.unsqueeze(0)
        return self.server_update(server, ids, W_new)

    # ------------------------------------------------------------------ clusters / evaluation
    def theta_norms(self, server) -> Tensor:
        return self.store.norms(server, self.num_clients)

    def theta_v(self, server) -> tuple[Tensor, Tensor]:
        """Dense ``[m, m, d_f]`` theta and v (materialized; for tests and checks)."""
        return self.store.theta_v(server, self.num_clients, self.cfg.rho)

    def cluster_labels(self, server, nu: float | None = None) -> np.ndarray:
        """Connected components of ||theta_ij|| <= nu (default ``cfg.nu``); cached per server record (every
        :meth:`aggregate` returns a new record, so a new round or a replaced state is never read stale)."""
        nu = self.cfg.nu if nu is None else nu
        if self._cache is not None and self._cache[0] is server and self._cache[1] == nu:
            return self._cache[2]
        lab = clusters_from_norms(self.theta_norms(server), nu)
        self._cache = (server, nu, lab)
        return lab

    def cluster_models(self, server, labels: np.ndarray | None = None) -> Tensor:
        """[m, d]: every device's model with its fused block replaced by its cluster's average."""
        labels = self.cluster_labels(server) if labels is None else labels
        W = server["W"].clone()
        W[:, self.fidx] = cluster_average(W[:, self.fidx], labels, self.sizes)
        return W

    def scored(self, server, ids: Tensor) -> dict[str, Tensor]:
        """The message devices ``ids`` are scored with: their cluster's model (``eval_with='cluster'``) or w_i."""
        if self.cfg.eval_with == "local":
            return {"w": server["W"][ids]}
        return {"w": self.cluster_models(server)[ids]}

    def eval_model(self, state, msg):
        return msg["w"]

    def report(self, server, clients, final: bool = False) -> dict[str, Any]:
        """The clusters found: their number and ARI against the true clusters (where known); ``final``: also
        every device's label, the cluster sizes and the pair store's layout."""
        lab = self.cluster_labels(server)
        out: dict[str, Any] = {"num_clusters": float(lab.max() + 1)}
        if final:
            out = {
                "clusters": lab.tolist(),
                "num_clusters": int(lab.max() + 1),
                "cluster_sizes": np.bincount(lab).tolist(),
                "pair_layout": self.pair_layout,
            }
        truth = self.problem.data.clusters
        if truth is not None:
            out["ari"] = adjusted_rand(lab, truth.numpy())
        return out


def paper_cost(algo: FPFC, ledger) -> float:
    """The paper's Cost (spec 2.7): m d (initial broadcast) + scalars sent in the rounds."""
    return algo.num_clients * algo.layout.dim + ledger.uplink_floats + ledger.downlink_floats


class FPFCL1Config(FPFCConfig):
    penalty: Literal["scad", "l1", "l2sq"] = Field("l1", description="group lasso fusion (FPFC-l1)")
    lam: float = Field(0.2, ge=0, description="README: lamdaL1 = 0.2")
    nu: float = Field(0.1, gt=0, description="cluster threshold (README thresholdL1 = 4 for synthetic)")


@register
class FPFCL1(FPFC):
    name = "fpfc_l1"
    description = "FPFC-l1: FPFC with the group-lasso fusion penalty (group soft-thresholding prox)"
    Config = FPFCL1Config
    cfg: FPFCL1Config
