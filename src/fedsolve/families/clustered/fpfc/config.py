"""FPFC's configuration (Algorithm 2's parameters and the authors' code's options), apart from its rounds
(``algorithm.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedsolve.engine.algorithm import AlgorithmConfig


class FPFCConfig(AlgorithmConfig):
    lr: float = Field(0.1, gt=0, description="local step size alpha")
    local_epochs: float | None = Field(10.0, gt=0, description="local epochs (full-batch GD: = steps T)")
    batch_size: int | None = Field(None, ge=1, description="null = full-batch gradient descent (paper)")
    lam: float = Field(0.6, ge=0, description="fusion penalty lambda")
    rho: float = Field(1.0, gt=0, description="ADMM penalty rho")
    a: float = Field(3.7, gt=1, description="SCAD concavity parameter a")
    xi: float = Field(1e-4, gt=0, description="SCAD smoothing xi (0 < xi < lambda)")
    penalty: Literal["scad", "l1", "l2sq"] = Field(
        "scad", description="smoothed SCAD (FPFC), group lasso (FPFC-l1) or squared l2 (Fig. 1's ridge fusion)"
    )
    nu: float = Field(0.1, gt=0, description="cluster threshold: i~j iff ||theta_ij|| <= nu (paper: [xi, 0.5])")
    pair_layout: Literal["dense", "sparse", "auto"] = Field(
        "auto", description="server pair store; auto = dense when m^2 d_f <= 5e7 floats"
    )
    update_pairs: Literal["touched", "all"] = Field(
        "touched", description="'touched': pairs with an active end (Algorithm 2); 'all': every pair (proofs)"
    )
    eval_with: Literal["cluster", "local"] = Field(
        "cluster", description="score devices with their cluster's n_i-weighted average (reference code) or with w_i"
    )
    fused_block: str = Field(
        "fused",
        description="problem block fused by FPFC; the rest is averaged over the "
        "participants (FedAvg). Absent block = the whole model",
    )
    shared_weighting: Literal["uniform", "samples"] = Field(
        "uniform", description="average of the shared block (reference code: uniform over participants)"
    )
    local_schedule: Literal["constant", "growing"] = Field(
        "constant", description="'growing': T_k = max(1, ceil(k / growth_rounds)) local steps (Sec. 6.4.4)"
    )
    growth_rounds: float = Field(
        20.0, gt=0, description="T_k = ceil(k / growth_rounds) (20 synthetic, 2 MNIST, 1 -> k+1 for H&BF)"
    )
    growth_offset: int = Field(0, ge=0, description="added to k before the ceil (H&BF: T_k = k + 1 -> 1)")
    lr_decay: float = Field(1.0, gt=0, le=1, description="lr multiplied by lr_decay every lr_decay_every rounds")
    lr_decay_every: int = Field(5, ge=1, description="rounds between lr decays")
    init_std: float | None = Field(
        None, gt=0, description="w^0 entries ~ N(0, init_std^2) (synthetic code: 1); null = the model's own init"
    )
    dtype: Literal["float32", "float64"] = Field("float32", description="server pair-store dtype")

    @model_validator(mode="after")
    def _check(self):
        if self.penalty == "scad" and self.lam > 0:
            if self.rho <= 1 / (self.a - 1):
                raise ValueError(
                    f"rho: {self.rho} is at most 1/(a-1) = {1 / (self.a - 1):.4g}, where the SCAD prox is "
                    f"not defined; allowed: rho > 1/(a-1) (or a larger a)"
                )
            if self.a < 1 + 1 / self.rho:
                raise ValueError(
                    f"a: {self.a} is below 1 + 1/rho = {1 + 1 / self.rho:.4g} (the prox's branch order); "
                    f"allowed: a >= 1 + 1/rho"
                )
            if self.xi >= self.lam:
                raise ValueError(
                    f"xi: {self.xi} is not below lam {self.lam}; allowed: 0 < xi < lam (the smoothing "
                    f"must be finer than the penalty)"
                )
        return self
