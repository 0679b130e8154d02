"""FedALA (Zhang, Hua, Wang, Shen, Xue, Guan, "FedALA: Adaptive Local Aggregation for Personalized Federated
Learning", AAAI 2023), one of FedAPM's Table 4 baselines: FedAvg whose clients start their local training from an
element-wise mix of their last local model and the new global model, the mix learned on their own data.

Client i, given the global model w^t (its last local model theta_i, its weights W_i in [0, 1], kept across rounds):

    top      the model's last p parameter tensors (the official code's ``layer_idx``); the others take w^t
    base     = w^t with theta_i's values on the top tensors;  diff = (w^t - theta_i) on the top tensors, 0 elsewhere
    ALA      on minibatches of a random fraction s of its data:
                 W_i <- clip(W_i - eta * grad L(base + diff * W_i) * diff, 0, 1)
             (the chain rule of L(theta_i + (w^t - theta_i) * W_i) in W_i); the first time (the start phase) until the
             SD of the last ``num_pre_loss`` losses is below ``threshold`` (at most ``start_passes`` passes over the
             fraction s), afterwards one pass
    start    = base + diff * W_i;  nothing is learned while theta_i = w^t on the top tensors (the first round)
    local    theta_i <- LocalSGD_i(start)        (FedAvg's local steps)
server:      w^{t+1} = FedAvg's weighted mean of the uploaded theta_i.

Each client is scored with its latest local model theta_i, as every personalized method of FedAPM's tables here.
Departures from the official code (stated, not hidden): the start phase checks the SD after every step rather than
after every pass and stops at ``start_passes`` passes (the official loop has no cap); every ALA pass draws its own
minibatches from the client's data (the official code draws one random subset a round and passes over it).
Cost: the ALA phase is planned at its longest (``start_passes`` passes) for every client of a round, the steps a
client does not take masked, so every round pays for that many passes; a smaller ``start_passes`` is cheaper.
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedsolve.core.plans import Work
from fedsolve.core.statements import Descend
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import register
from fedsolve.families.classic.fedavg import FedAvg, OwnPartsConfig


class FedALAConfig(OwnPartsConfig):
    eta: float = Field(1.0, gt=0, description="step size of the aggregation weights W (the official eta)")
    rand_fraction: float = Field(
        0.8, gt=0, le=1, description="s: one ALA pass uses this fraction of the client's data (the official 80%)"
    )
    top_params: int = Field(
        2, ge=1, description="p: the last p parameter tensors are mixed element-wise; the rest take the global model"
    )
    threshold: float = Field(0.1, gt=0, description="the start phase stops when its recent losses' SD is below this")
    num_pre_loss: int = Field(10, ge=2, description="how many recent losses the start phase's SD is taken over")
    start_passes: int = Field(10, ge=1, description="at most this many ALA passes in the start phase")


@register
class FedALA(FedAvg):
    name = "fedala"
    description = "FedALA: local training starts from an element-wise learned mix of local and global (Zhang 2023)"
    Config = FedALAConfig
    cfg: FedALAConfig

    def setup(self) -> None:
        """The mask of the top tensors (the last ``top_params`` of the model's parameter tensors)."""
        entries = self.layout.entries
        if self.cfg.top_params > len(entries):
            raise ValueError(
                f"top_params: {self.cfg.top_params}; allowed: 1 to {len(entries)}, the model's parameter tensors"
            )
        self.top = torch.zeros(self.layout.dim)
        for e in entries[-self.cfg.top_params :]:
            self.top[e.start : e.start + e.numel] = 1.0

    def init(self, x0, rngs):
        server, _ = super().init(x0, rngs)
        clients = ClientStates(
            self.num_clients, defaults={"theta": x0, "W": torch.ones_like(x0), "started": torch.zeros(())}
        )
        return server, clients

    def work(self, round_: int | None = 0):
        c = self.cfg
        if round_ is None:
            return {}
        return {
            "train": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size),
            "ala": Work(epochs=c.rand_fraction * c.start_passes, batch_size=c.batch_size),
        }

    def local_update(self, state, msg, ctx):
        c, w_t = self.cfg, msg["w"]
        top = self.top.to(w_t)
        diff = (w_t - state["theta"]) * top
        base = w_t - diff  # theta_i on the top tensors, w^t elsewhere
        W = state["W"]
        started = state["started"] > 0
        learn = diff.ne(0).any()  # theta_i = w^t on the top tensors: nothing to learn (the first round)
        one_pass = torch.ceil(ctx.num_steps("ala") / c.start_passes)
        recent = torch.zeros(c.num_pre_loss, dtype=w_t.dtype)
        seen = torch.zeros(())
        settled = torch.zeros((), dtype=torch.bool)
        for s in range(ctx.max_steps("ala")):
            live = ctx.is_active("ala", s) & learn & ~settled & (~started | (s < one_pass))
            loss, g = ctx.loss_grad(base + diff * W, "ala", s)
            W = torch.where(live, (W - c.eta * g * diff).clamp(0.0, 1.0), W)
            # the start phase ends once its last num_pre_loss losses vary by less than the threshold
            recent = torch.where(live, torch.cat([recent[1:], loss.detach().reshape(1).to(recent)]), recent)
            seen = seen + live.to(seen)
            settled = settled | (~started & (seen >= c.num_pre_loss) & (recent.std() < c.threshold))
        start = base + diff * W
        theta = ctx.descend(Descend(start=start, lr=c.lr, weight_decay=c.weight_decay, then=None))
        return {"theta": theta, "W": W, "started": (started | learn).to(state["started"])}, {"w": theta}

    def eval_model(self, state, msg):
        return state["theta"]
