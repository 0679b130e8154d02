"""FedNest's and LFedNest's configuration (the FedNest repository's defaults), apart from their rounds
(``fednest.py``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedsolve.families.bilevel.local_steps import validate_tau


class FedNestConfig(BaseModel):
    """Defaults: the FedNest repository's (fig2.sh; spec 3.4)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lr: float = Field(0.01, gt=0, description="inner (y) step size")
    hlr: float = Field(0.01, gt=0, description="outer (x) step size and Neumann step")
    local_ep: float = Field(5.0, gt=0, description="local epochs of y-SGD over the lower split per FedInn")
    inner_ep: int = Field(1, ge=1, description="FedInn repetitions per outer iteration")
    neumann: int = Field(5, ge=0, description="Neumann-series terms of the inverse-Hessian-vector product")
    outer_tau: int = Field(1, ge=1, description="local x-steps per FedOut")
    batch_size: int | None = Field(64, ge=1, description="minibatch of the local SGD loops (null: full split)")
    tau_max: int | None = Field(
        None,
        ge=1,
        description="system heterogeneity (Fig. 4): FedInn's local y-SGD takes "
        "each client's persistent tau_i ~ U{1..tau_max} steps instead of local_ep epochs "
        "(the same draw as SimFBO's for a seed)",
    )
    tau_clients: list[int] | None = Field(None, description="explicit persistent tau_i of FedInn, one per client")
    hold_sample: bool = Field(
        True,
        description="keep one client sample through FedInn (anchor + inner) and "
        "one through FedOut (p0 ... outer), as FedNest's code does; false: a fresh sample "
        "every communication round (every run before this option); LFedNest's phases "
        "draw afresh either way",
    )
    tau_outer: bool = Field(
        False,
        description="with tau_max / tau_clients: the local x-steps (FedOut) also take "
        "each client's tau_i steps instead of outer_tau",
    )

    @model_validator(mode="after")
    def _tau(self):
        validate_tau(self.tau_max, self.tau_clients)
        if self.tau_outer and not self.heterogeneous:
            raise ValueError("tau_outer: needs per-client tau_i (set tau_max or tau_clients)")
        return self

    @property
    def heterogeneous(self) -> bool:
        return self.tau_max is not None or self.tau_clients is not None
