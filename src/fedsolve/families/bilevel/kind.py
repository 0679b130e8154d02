"""Bilevel problem kinds (``problem: {kind: hyper_representation, params: {...}}``).

``hyper_representation`` (SimFBO Sec. 5 / FedNest): x = every layer but the head, y = the head;
each client's training rows are split at random into a lower-level ``lower`` split (g_i: cross
entropy + (lam/2)||y||^2) and a disjoint upper-level ``upper`` split (f_i: cross entropy).
The problem is checked when it is built (``families/bilevel/checks.py``): finite samples on every
client, and every g_i strongly convex in y at the start (lam > 0 and y the model's linear head).
"""

from __future__ import annotations

import dataclasses
import fnmatch

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedsolve.core.layout import patterns_for
from fedsolve.data.federated import FederatedData
from fedsolve.families.bilevel.checks import check_finite_data, check_strongly_convex, outputs_affine_in_y
from fedsolve.families.bilevel.oracles import make_oracles
from fedsolve.families.bilevel.problem import BilevelSpec, ridge_on
from fedsolve.problems import FederatedProblem, parse_params, register_problem_kind


class HyperRepresentationParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    head: list[str] | None = Field(
        None,
        description="module names of y (the head); default: the model's last layer (the module of its last parameter)",
    )
    upper_fraction: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="share of each client's training rows in the "
        "upper-level (validation) split; FedNest: 0.5 i.i.d., 0.2 non-i.i.d.",
    )
    lam: float = Field(
        0.1,
        description="lower-level ridge (lam/2)||y||^2 (spec 3.1: beta = 0.1, squared); > 0, "
        "which makes g_i strongly convex in the head y",
    )

    @field_validator("lam")
    @classmethod
    def _strongly_convex(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(
                f"lam = {v} leaves the lower level g_i (cross entropy of a linear head) not strongly "
                f"convex in y (SimFBO Assumption 1; the logits' shift is a flat direction); allowed: "
                f"lam > 0, e.g. 0.1"
            )
        return v


def split_rows(problem: FederatedProblem, upper_fraction: float, seed: int) -> FederatedData:
    """A copy of ``problem.data`` whose training rows carry the row groups ``lower``/``upper`` (each client's
    rows split at random, ``seed``; at least one row in each split)."""
    data = problem.data
    rng = np.random.default_rng(7_919 + seed)
    groups = []
    for i in range(data.num_clients):
        n = int(data.train_sizes[i])
        if n < 2:
            raise ValueError(f"hyper_representation: client {i} has {n} training row(s); each split needs one")
        nu = min(max(round(upper_fraction * n), 1), n - 1)
        g = np.zeros(n, dtype=np.int64)
        g[rng.permutation(n)[:nu]] = 1
        groups.append(g)
    return dataclasses.replace(
        data,
        train_groups=torch.as_tensor(np.concatenate(groups)),
        group_names=("lower", "upper"),
        meta={**data.meta, "bilevel_split": upper_fraction},
    )


@register_problem_kind("hyper_representation")
def hyper_representation(problem: FederatedProblem, params, seed: int) -> FederatedProblem:
    p = parse_params(HyperRepresentationParams, params)
    check_finite_data(problem.data)
    names = problem.layout.names
    head = p.head if p.head is not None else [names[-1].rsplit(".", 1)[0]]
    y_pats = patterns_for(head)
    x_names = [n for n in names if not any(fnmatch.fnmatchcase(n, q) for q in y_pats)]
    if not x_names:
        raise ValueError(
            f"hyper_representation: head {head} covers every parameter, x would be empty; parameters are {names}"
        )
    blocks = {**dict(problem.blocks), "y": y_pats, "x": x_names}
    out = FederatedProblem(
        data=split_rows(problem, p.upper_fraction, seed),
        model_fn=problem.model_fn,
        loss=problem.loss,
        blocks=blocks,
        name=problem.name,
        extras=dict(problem.extras),
    )
    lay = out.layout
    out.extras["bilevel"] = BilevelSpec(
        x_block="x",
        y_block="y",
        upper_group="upper",
        lower_group="lower",
        lower_reg=ridge_on(lay.block_params("y"), p.lam),
        name=f"hyper-representation (y = {', '.join(head)}, lam = {p.lam})",
    )
    oracles = make_oracles(out)
    x, y = oracles.split(out.init_params(torch.Generator().manual_seed(seed)))
    if out.loss_name not in ("cross_entropy", "squared_error") or not outputs_affine_in_y(oracles, x, y):
        check_strongly_convex(oracles, x, y, where="head")  # no structure to rely on: the Hessian itself
    return out
