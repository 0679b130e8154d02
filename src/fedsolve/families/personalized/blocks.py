"""Partial-model personalization presets: which parameters are personal.

The three types of Pillutla et al. (2022), used by FedAPM (Zhu et al., KDD'25, Sec. 3.4):

* ``input``: the lower (input-side) layers are personal, the upper layers shared
  (LG-FedAvg; FedAPM's CrisisMMD / Crema-D models);
* ``output``: the head is personal, the representation shared (FedPer, FedRep; FedAPM's CIFAR CNN);
* ``split_input``: one input branch is personal, the other branches and the upper layers shared
  (FedAPM's KU-HAR model: the accelerometer encoder).

Blocks are built from a model's named parameter groups (``GROUPS = {group: [patterns]}``), never
from positional layer counts (the authors' ``layer_num`` caused the CIFAR inversion, spec sec. 8).
A model may say which groups each type makes personal with ``PERSONALIZATION = {type: [groups]}``;
otherwise ``input`` = group ``body`` and ``output`` = group ``head``.

    problem = FederatedProblem(data, model_fn, blocks=personalization_blocks(model_fn(), "output"))
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

PersonalizationType = Literal["input", "output", "split_input"]
TYPES: tuple[str, ...] = ("input", "output", "split_input")
_FALLBACK = {"input": ["body"], "output": ["head"]}


def _norm(kind: str) -> str:
    return kind.replace("-", "_") if isinstance(kind, str) else kind


def personal_groups(model: nn.Module, kind: str) -> list[str]:
    """The model's group names that personalization ``kind`` makes personal (``split-input`` or
    ``split_input`` both accepted)."""
    kind = _norm(kind)
    if kind not in TYPES:
        raise ValueError(f"personalization: unknown {kind!r}; allowed: {list(TYPES)}")
    table = getattr(model, "PERSONALIZATION", None) or _FALLBACK
    if kind not in table:
        raise ValueError(
            f"personalization: model {type(model).__name__} defines no {kind!r} personalization; "
            f"it defines {sorted(table)} (set PERSONALIZATION on the model)"
        )
    return list(table[kind])


def personal_patterns(model: nn.Module, kind: str) -> list[str]:
    """Parameter-name patterns of the personal block for ``kind``."""
    kind = _norm(kind)
    groups = getattr(model, "GROUPS", {})
    pats: list[str] = []
    for g in personal_groups(model, kind):
        if g not in groups:
            raise ValueError(
                f"personalization {kind!r}: model {type(model).__name__} has no group {g!r}; "
                f"groups are {sorted(groups)}"
            )
        pats += list(groups[g])
    if not pats:
        raise ValueError(
            f"personalization {kind!r}: groups {personal_groups(model, kind)} of "
            f"{type(model).__name__} are empty (no personal parameters)"
        )
    return pats


def personalization_blocks(model: nn.Module, kind: str) -> dict[str, list[str]]:
    """``{"personal": [...], "shared": [...]}`` for ``FederatedProblem(blocks=...)``."""
    pats = personal_patterns(model, kind)
    names = [n for n, _ in model.named_parameters()]
    personal = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in pats)]
    shared = [n for n in names if n not in personal]
    if not shared:
        raise ValueError(f"personalization {kind!r}: every parameter of {type(model).__name__} is personal")
    return {"personal": pats, "shared": shared}


def mask_from_patterns(layout, patterns: Sequence[str]) -> Tensor:
    """Boolean ``[d]`` mask of the parameters matching ``patterns`` (does not modify ``layout``)."""
    mask = torch.zeros(layout.dim, dtype=torch.bool)
    for e in layout.entries:
        if any(fnmatch.fnmatchcase(e.name, p) for p in patterns):
            mask[e.start : e.start + e.numel] = True
    return mask


def personal_mask(problem, kind: str = "problem") -> Tensor:
    """The personal mask an algorithm uses: the problem's ``personal`` block (``kind="problem"``;
    all-False when the problem defines none) or a preset built from the model's groups."""
    layout = problem.layout
    if kind == "problem":
        return (
            layout.mask("personal").clone()
            if layout.has_block("personal")
            else torch.zeros(layout.dim, dtype=torch.bool)
        )
    return mask_from_patterns(layout, personal_patterns(problem.model, _norm(kind)))
