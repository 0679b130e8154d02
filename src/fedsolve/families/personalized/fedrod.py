"""FedRoD (Chen and Chao, "On Bridging Generic and Personalized Federated Learning for Image Classification", ICLR
2022), one of FedAPM's Table 4 baselines: one shared model (body + generic head g) trained with a loss robust to the
client's label skew, and on each client a personal head p added to the generic head's logits.

Client i (n_{i,c} its training images of class c; the model's final linear layer is the head; z = body(x)):

    prior    log n_{i,c}^gamma per class (Balanced Softmax; a class the client lacks: log 1e-8, see below)
    each local step, on one minibatch (x, y):
        generic   (body, g) <- (body, g) - lr * grad CE(g(z) + prior, y)             (the Balanced Softmax loss)
        personal  p <- p - personal_lr * grad_p CE(g(z).detach() + p(z.detach()), y)  (g and z before the step above)
server:   (body, g)^{t+1} = FedAvg's weighted mean of the uploaded (body, g)_i;  p never leaves the client.

The head is linear, so g(z) + p(z) is the head with weights g + p: client i is scored with the model (body, g + p)
(``eval_model: personal``) or with the shared model (``global``), and the personal step is the gradient of the
cross-entropy with respect to the head's tensors at (body, g + p). p starts as a copy of the initial head (the
common open-source implementations; the paper's linear variant); ``gamma = 0`` makes the generic step FedAvg's.
Both steps carry the L2 term ``weight_decay`` of every method's local objective here. A class with no images on
the client gets log 1e-8 instead of the -inf of log 0: the same loss on the client's own rows (such a class's
probability is 1e-8 times that of a one-image class), and no 0 x inf on a row of weight 0 (padding). Clients
record the personal model's cross-entropy as their training loss.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor
from torch.func import functional_call

from fedsolve.core.context import ParamBlock, TensorLoss
from fedsolve.core.plans import Work
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import register
from fedsolve.families.classic.fedavg import FedAvg, OwnPartsConfig
from fedsolve.families.personalized.blocks import mask_from_patterns
from fedsolve.models import output_layer

#: a class the client has no image of: its prior count (log 1e-8 = -18.4 instead of -inf)
ABSENT = 1e-8


class FedRoDConfig(OwnPartsConfig):
    gamma: float = Field(1.0, ge=0, description="Balanced Softmax exponent: the prior is log n_c^gamma (0: plain CE)")
    personal_lr: float | None = Field(None, gt=0, description="step of the personal head (null: lr)")
    eval_model: Literal["personal", "global"] = Field(
        "personal", description="score each client with (body, g + p) ('personal') or the shared model ('global')"
    )


@register
class FedRoD(FedAvg):
    name = "fedrod"
    description = "FedRoD: Balanced-Softmax generic model + personal head added to its logits (Chen & Chao 2022)"
    Config = FedRoDConfig
    cfg: FedRoDConfig

    def setup(self) -> None:
        """The head: the model's group ``last`` (else ``head``), which must be its final linear layer."""
        data = self.problem.data
        if getattr(data, "task", "classification") != "classification" or not data.num_classes:
            raise ValueError("fedrod: needs a classification problem (labels 0..C-1; its loss is a softmax's)")
        path = output_layer(self.problem.model, "fedrod")
        self.head = ParamBlock(self.layout, mask_from_patterns(self.layout, [f"{path}.*"]))
        shapes = [e[1] for e in self.head.entries]
        self.num_classes = shapes[0][0]

    def init(self, x0, rngs):
        server, _ = super().init(x0, rngs)
        return server, ClientStates(self.num_clients, defaults={"p": self.head.gather(x0)})

    def work(self, round_: int | None = 0):
        c = self.cfg
        if round_ is None:
            return {}
        return {
            "train": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size),
            "labels": Work(steps=1, batch_size=None),  # one look at all of the client's rows: its label counts
        }

    def log_prior(self, ctx) -> Tensor:
        """``log n_{i,c}^gamma`` ``[C]`` from the client's training labels."""
        _, y, w = ctx.batch("labels", 0)
        classes = torch.arange(self.num_classes, device=y.device)
        counts = ((y[:, None] == classes) & (w[:, None] > 0)).sum(0).to(w.dtype)
        return self.cfg.gamma * counts.clamp_min(ABSENT).log()

    def balanced_softmax(self, prior: Tensor) -> TensorLoss:
        model = self.problem.model

        def balanced_softmax(params, x, y, w):
            logits = functional_call(model, params, (x,))
            return (F.cross_entropy(logits + prior.to(logits), y, reduction="none") * w).sum()

        return TensorLoss(self.layout, balanced_softmax)

    def local_update(self, state, msg, ctx):
        c = self.cfg
        lr_p = c.personal_lr or c.lr
        w, p = msg["w"], state["p"]
        generic = self.balanced_softmax(self.log_prior(ctx))
        for s in range(ctx.max_steps("train")):
            live = ctx.is_active("train", s)
            _, g = ctx.loss_grad(w, "train", s, loss=generic)
            loss, gp = ctx.block_loss_grad(self.head, self.head.gather(w) + p, self.head.rest.gather(w), "train", s)
            ctx.record_loss(loss, live)
            w = torch.where(live, w - c.lr * (g + c.weight_decay * w), w)
            p = torch.where(live, p - lr_p * (gp + c.weight_decay * p), p)
        return {"p": p}, {"w": w}

    def eval_model(self, state, msg):
        w = msg["w"]
        if self.cfg.eval_model == "global":
            return w
        return self.head.scatter(self.head.gather(w) + state["p"], self.head.rest.gather(w))
