"""FedCP (Zhang, Hua, Wang, Shen, Xue, Guan, "FedCP: Separating Feature Information for Personalized Federated
Learning via Conditional Policy", KDD 2023), one of FedAPM's Table 4 baselines (its second best there): a shared
Conditional Policy splits every feature of every sample between a client's personal head and the global head.

The network (``models/policy.py``): body phi, global head g, personal head p_i, CS network; client i's context c_i.
Client i, given phi^t, g^t and CS^t (its p_i, c_i and last uploaded head G_i kept across rounds):

    context   c_i = sum over classes of |G_i.weight - g^t.weight|   (before its first upload: uniform random)
    each local step, on one minibatch (x, y), with Gumbel noise e on the policy:
        (phi, p_i, CS) <- (phi, p_i, CS) - lr * grad [ CE(p_i(z pm) + g^t(z gm), y) + lambda MMD(phi(x), phi^t(x)) ]
                          (z = phi(x), (pm, gm) the policy's split of z; g^t frozen)
    upload    phi, CS and the head G_i = head_mix * p_i + (1 - head_mix) * g^t   (weight and bias)
server:   (phi, g, CS)^{t+1} = FedAvg's weighted means of the uploaded (phi, G_i, CS).

Client i is scored with (phi, p_i, g, CS, c_i), the policy without noise. The MMD is the authors' RBF one (bandwidths
10, 15, 20, 50) between the features of the body being trained and those of the body received this round; lambda 5
and head_mix 0.5 are the authors' (their run script and current ``generate_upload_head``; an earlier version of
their code weighted the head's weight rows by the mean gates instead). The Gumbel noise is drawn from the run's
salt, the round, the client and the step (``core/rng.py: counter_uniform``), so every client and run gets the same.
Departures from the authors' code (stated, not hidden): every selected client receives the current g and CS (their
server hands them only to the round's clients, so a client selected again later starts from those of its last round;
the same at full participation, their runs' setting), and it forms its context from them when it next trains or is
scored (theirs right after its round); scoring draws no noise (their test pass draws it).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor
from torch.func import functional_call

from fedsolve.core.context import ParamBlock, TensorLoss
from fedsolve.core.rng import counter_uniform
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import expand, register
from fedsolve.families.classic.fedavg import FedAvg, OwnPartsConfig
from fedsolve.families.personalized.blocks import mask_from_patterns
from fedsolve.models.policy import ConditionalPolicyNet

#: the kernel bandwidths of the authors' RBF MMD (``exp(-d / (2 a))`` summed over a)
MMD_BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


def rbf_mmd(a: Tensor, b: Tensor, w: Tensor) -> Tensor:
    """The authors' RBF MMD between feature rows ``a`` and ``b`` ``[B, h]`` (kernel ``sum_s exp(-||u - v||^2 /
    (2 s))`` over :data:`MMD_BANDWIDTHS`), every pair weighted by the product of the rows' weights ``w`` ``[B]``
    (summing to 1): their ``mean(K_aa + K_bb - 2 K_ab)`` over the ``B x B`` pairs when every weight is ``1 / B``; a
    padding row (weight 0) takes no part."""

    def kernel(u: Tensor, v: Tensor) -> Tensor:
        d = (u * u).sum(1)[:, None] + (v * v).sum(1)[None, :] - 2.0 * u @ v.T
        return torch.stack([torch.exp(-0.5 * d / s) for s in MMD_BANDWIDTHS]).sum(0)

    ww = w[:, None] * w[None, :]
    return (ww * (kernel(a, a) + kernel(b, b) - 2.0 * kernel(a, b))).sum()


def gumbel(u: Tensor) -> Tensor:
    """Standard Gumbel noise from uniform numbers ``u`` in (0, 1)."""
    return -torch.log(-torch.log(u))


class FedCPConfig(OwnPartsConfig):
    lamda: float = Field(
        5.0, ge=0, description="weight of the MMD between the trained and the received body's features"
    )
    head_mix: float = Field(
        0.5,
        ge=0,
        le=1,
        description="the uploaded global head is head_mix * p_i + (1 - head_mix) * g (the authors' 0.5)",
    )


@register
class FedCP(FedAvg):
    name = "fedcp"
    description = (
        "FedCP: a shared conditional policy splits each feature between a personal and a global head (Zhang 2023)"
    )
    Config = FedCPConfig
    cfg: FedCPConfig
    model_wrapper = ConditionalPolicyNet

    def setup(self) -> None:
        """The network's parts as blocks of the flat vector; the check that the model's output layer is applied
        last (else the network would not be the model with its head split)."""
        data, net = self.problem.data, self.problem.model
        if getattr(data, "task", "classification") != "classification" or not data.num_classes:
            raise ValueError("fedcp: needs a classification problem (labels 0..C-1; its loss is a softmax's)")
        if not isinstance(net, ConditionalPolicyNet):
            raise ValueError(
                "fedcp: the problem's model must be the conditional policy network around the model "
                "(fedsolve.engine.algorithm.fitted_problem(FedCP, problem) builds it; experiment configs do it)"
            )
        block = {k: ParamBlock(self.layout, mask_from_patterns(self.layout, [k])) for k in ("p.*", "g.*", "context")}
        self.personal, self.glob, self.context = block["p.*"], block["g.*"], block["context"]
        self.g_weight = ParamBlock(self.layout, mask_from_patterns(self.layout, ["g.weight"]))
        frozen = mask_from_patterns(self.layout, ["g.*", "context"])
        self.trainable = (~frozen).to(torch.float32)
        self.kept = mask_from_patterns(self.layout, ["p.*", "context"])  # the server's copy of these never moves
        self.num_classes, self.width = net.g.weight.shape
        x, base = data.train_x[:8], net.base_model[0]
        like = {(t.device, t.dtype) for t in (x, net.g.weight, *base.parameters())}
        if len(like) == 1:  # once, where the problem is built (the model, not the run's copy on a device)
            with torch.no_grad():
                same = torch.allclose(base(x), net.p(net.body(x)), rtol=1e-4, atol=1e-5)
            if not same:
                raise ValueError(
                    "fedcp: the model's output is not its output layer applied to the layer's input (a step after "
                    "the head?); allowed: a model whose forward ends with its final linear layer"
                )

    def init(self, x0, rngs):
        server, _ = super().init(x0, rngs)
        server["salt"] = torch.tensor(rngs.seed_for("fedcp-noise"), dtype=torch.int64)
        start = torch.rand(self.num_clients, self.width, generator=rngs.torch("fedcp-context"), dtype=x0.dtype)
        clients = ClientStates(
            self.num_clients,
            tensors={"context": start},
            defaults={"p": self.personal.gather(x0), "sent": self.g_weight.gather(x0), "seen": torch.zeros(())},
        )
        return server, clients

    def broadcast(self, server, ids, round_):
        return {**super().broadcast(server, ids, round_), "salt": expand(server["salt"], ids)}

    def client_model(self, state, w):
        """Client i's network: the received ``w`` with its personal head and its context (module docstring)."""
        diff = (state["sent"] - self.g_weight.gather(w)).abs().reshape(self.num_classes, self.width).sum(0)
        context = torch.where(state["seen"] > 0, diff, state["context"])
        v = self.personal.scatter(state["p"], self.personal.rest.gather(w))
        return self.context.scatter(context, self.context.rest.gather(v))

    def received_body(self, w) -> dict[str, Tensor]:
        """The body's tensors of the received model ``w``, named as in the body module (once per local update)."""
        return {k.removeprefix("body."): t for k, t in self.layout.unflatten(w).items() if k.startswith("body.")}

    def objective(self, received, noise) -> TensorLoss:
        """CE of the network with the policy's noise ``noise``, plus lambda x the MMD of its features from those
        of the received body ``received``."""
        net, lossf, lam = self.problem.model, self.problem.loss_fn, self.cfg.lamda

        def fedcp_loss(params, x, y, wts):
            out, z = functional_call(net, params, (x,), {"noise": noise, "features": True})
            ce = (lossf(out, y) * wts).sum()
            if lam == 0:
                return ce
            return ce + lam * rbf_mmd(z, functional_call(net.body, received, (x,)), wts)

        return TensorLoss(self.layout, fedcp_loss)

    def local_update(self, state, msg, ctx):
        c, w = self.cfg, msg["w"]
        v, received = self.client_model(state, w), self.received_body(w)
        step_mask = self.trainable.to(w)
        for s in range(ctx.max_steps("train")):
            live = ctx.is_active("train", s)
            rows = ctx.batch("train", s)[0].shape[0]
            u = counter_uniform([msg["salt"], ctx.round, ctx.client, s], (rows, 2, self.width), w.dtype)
            loss, g = ctx.loss_grad(v, "train", s, loss=self.objective(received, gumbel(u)))
            ctx.record_loss(loss, live)
            v = torch.where(live, v - c.lr * step_mask * (g + c.weight_decay * v), v)
        p = self.personal.gather(v)
        head = c.head_mix * p + (1.0 - c.head_mix) * self.glob.gather(w)
        upload = torch.where(self.kept.to(w.device), w, self.glob.scatter(head, self.glob.rest.gather(v)))
        state = {"p": p, "sent": self.g_weight.gather(upload), "seen": torch.ones_like(state["seen"])}
        return state, {"w": upload}

    def aggregate(self, server, ids, uploads, round_):
        return {**super().aggregate(server, ids, uploads, round_), "salt": server["salt"]}

    def eval_model(self, state, msg):
        return self.client_model(state, msg["w"])
