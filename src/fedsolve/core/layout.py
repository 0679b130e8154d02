"""ParamLayout: a torch module's parameters as one flat vector with named blocks.

A client's model is a row of a matrix: every solver stores per-client parameters as rows of
``[num_clients, d]`` tensors. ``ParamLayout`` converts between that flat vector and the
``{name: tensor}`` dict that ``torch.func.functional_call`` needs, and names *blocks* of the
vector (shared / personal, fused layer, upper / lower, primal / adversary) chosen by
parameter-name patterns.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class _Entry:
    name: str
    shape: tuple[int, ...]
    start: int
    numel: int


class ParamLayout:
    """Maps ``module.named_parameters()`` to slices of one flat vector.

    Args:
        module: the model (its parameters define the layout, in ``named_parameters`` order).
        blocks: optional ``{block_name: [patterns]}``; a parameter belongs to a block when its
            name matches one of the patterns (``fnmatch`` style, e.g. ``"fc2.*"``). Blocks may
            overlap; ``complement(name)`` gives the rest.
    """

    def __init__(self, module: nn.Module, blocks: Mapping[str, Sequence[str]] | None = None):
        self.entries: list[_Entry] = []
        start = 0
        for name, p in module.named_parameters():
            n = p.numel()
            self.entries.append(_Entry(name, tuple(p.shape), start, n))
            start += n
        self.dim = start
        self.names = [e.name for e in self.entries]
        self._blocks: dict[str, Tensor] = {}
        for bname, patterns in (blocks or {}).items():
            self.add_block(bname, patterns)

    # ------------------------------------------------------------ conversion
    def flatten(self, module_or_params: nn.Module | Mapping[str, Tensor]) -> Tensor:
        """Module (or a name->tensor dict) -> flat vector (a copy, never aliased)."""
        params = (
            dict(module_or_params.named_parameters()) if isinstance(module_or_params, nn.Module) else module_or_params
        )
        missing = [e.name for e in self.entries if e.name not in params]
        if missing:
            raise KeyError(f"parameters missing from the input: {missing}")
        return torch.cat([params[e.name].detach().reshape(-1) for e in self.entries]).clone()

    def unflatten(self, vec: Tensor) -> dict[str, Tensor]:
        """Flat vector ``[..., d]`` -> ``{name: tensor[..., *shape]}`` (views, differentiable)."""
        lead = vec.shape[:-1]
        return {e.name: vec[..., e.start : e.start + e.numel].reshape(*lead, *e.shape) for e in self.entries}

    def load_into(self, module: nn.Module, vec: Tensor) -> None:
        """Copy ``vec`` into ``module`` (not alias: with ``vector_to_parameters``' views an in-place optimizer step
        would write into ``vec``, e.g. the shared global model)."""
        with torch.no_grad():
            params = dict(module.named_parameters())
            for name, t in self.unflatten(vec).items():
                params[name].copy_(t)

    # ------------------------------------------------------------ blocks
    def add_block(self, name: str, patterns: Sequence[str] | str) -> Tensor:
        pats = [patterns] if isinstance(patterns, str) else list(patterns)
        mask = torch.zeros(self.dim, dtype=torch.bool)
        matched = False
        for e in self.entries:
            if any(fnmatch.fnmatchcase(e.name, p) for p in pats):
                mask[e.start : e.start + e.numel] = True
                matched = True
        if pats and not matched:
            raise ValueError(f"block {name!r}: patterns {pats} match no parameter; parameters are {self.names}")
        self._blocks[name] = mask
        return mask

    def mask(self, name: str) -> Tensor:
        """Boolean ``[d]`` mask of block ``name``."""
        try:
            return self._blocks[name]
        except KeyError:
            raise KeyError(f"unknown block {name!r}; defined blocks: {sorted(self._blocks)}") from None

    def has_block(self, name: str) -> bool:
        return name in self._blocks

    def complement(self, name: str) -> Tensor:
        return ~self.mask(name)

    def block_names(self) -> list[str]:
        return sorted(self._blocks)

    def block_params(self, name: str) -> list[str]:
        """Parameter names that fall (entirely) inside a block."""
        m = self.mask(name)
        return [e.name for e in self.entries if bool(m[e.start : e.start + e.numel].all())]

    def block_size(self, name: str) -> int:
        return int(self.mask(name).sum())

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        blocks = ", ".join(f"{b}={self.block_size(b)}" for b in self.block_names())
        return f"ParamLayout(dim={self.dim}, params={len(self.entries)}{', ' + blocks if blocks else ''})"


def patterns_for(modules: Iterable[str]) -> list[str]:
    """``["fc2"] -> ["fc2.*"]``: patterns selecting every parameter of the named submodules."""
    return [m if any(c in m for c in "*?[") else f"{m}.*" for m in modules]
