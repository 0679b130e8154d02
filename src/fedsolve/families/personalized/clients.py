"""Partially personalized problems stated per client, in plain torch (issue 46).

:func:`client_partial_problem` states ``min_{u, v_1..v_m} sum_i alpha_i f(i, u, v_i, d_i)``: one function ``f`` of the
client index ``i``, the shared block ``u``, client i's personal block ``v_i`` and its own data ``d_i``. FedAPM and
the partial-personalization baselines solve it as they solve a model's loss on data: the problem's model
(:class:`SharedPersonal`) holds ``u`` (parameter ``shared``) and ``v`` (parameter ``personal``, the ``personal``
block), and client i holds one data row, its index, whose output is ``f(i, u, v, d_i)``. So a client's local
steps take the whole of ``f_i``, and the scored test loss of a client is its own ``f_i`` at its model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from fedsolve.core.rowwise import rowwise_mismatch
from fedsolve.data.federated import FederatedData
from fedsolve.problems import FederatedProblem

__all__ = ["ClientPartialProblem", "SharedPersonal", "client_partial_problem"]

#: a client-specific loss ``f(i, u, v, d) -> scalar``
PartialFunction = Callable[[Tensor, Tensor, Tensor, Any], Tensor]


class SharedPersonal(nn.Module):
    """The shared block ``u`` (parameter ``shared``) and a personal block ``v`` (parameter ``personal``) of a
    problem stated per client; ``forward(rows)`` is ``[n, 1]``: ``f(i, u, v, d_i)`` for the client ``i`` each row
    names."""

    def __init__(self, u0: Tensor, v0: Tensor, value: Callable[[Tensor, Tensor, Tensor], Tensor]):
        super().__init__()
        self.shared = nn.Parameter(u0.detach().clone())
        self.personal = nn.Parameter(v0.detach().clone())
        self.value = value

    def forward(self, rows: Tensor) -> Tensor:
        return torch.stack([self.value(r, self.shared, self.personal) for r in rows.unbind(0)]).reshape(-1, 1)


def client_value(out: Tensor, y: Tensor) -> Tensor:
    """The per-sample loss of a problem stated per client: the model's output, ``f_i`` itself."""
    return out.reshape(-1)


class ClientPartialProblem(FederatedProblem):
    """A partially personalized problem stated by a function per client (:func:`client_partial_problem`)."""

    def blocks_of(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """``(u, v)`` of a flat parameter vector (a row of ``Simulation.eval_params()``), in the start points'
        shapes."""
        p = self.layout.unflatten(w)
        return p["shared"], p["personal"]


def client_partial_problem(
    f: PartialFunction,
    u0: Tensor,
    v0: Tensor,
    data: Sequence[Any] | None = None,
    num_clients: int | None = None,
    name: str = "partial",
) -> ClientPartialProblem:
    """``min sum_i alpha_i f(i, u, v_i, data[i])`` over a shared ``u`` and one personal ``v_i`` per client.

    ``f(i, u, v, d) -> scalar``: ``i`` is the client's index (a 0-dim integer tensor), ``u`` and ``v`` are shaped as
    the start points ``u0`` and ``v0`` (every client's ``v_i`` starts at ``v0``), ``d`` is client i's entry of
    ``data`` (a tensor, a tuple or a dict of tensors, the same shapes on every client: its own matrices, targets,
    ...; None when no ``data`` is given, then ``num_clients`` says how many clients there are). Write ``f`` in tensor
    operations, so that it runs for one client or for all at once: a client's tensors come in through ``d`` (not by
    indexing a tensor with ``i``), and no Python ``if``, ``int()`` or list indexing on ``i`` or on tensor values
    (refused when the problem is built).

    Checked on every client: the data are finite, of one float type with the start points and of client 0's
    shapes; ``f`` gives a finite real scalar with finite gradients in ``u`` and ``v`` at the start point."""
    if not callable(f):
        raise ValueError(f"f: expected a function f(i, u, v, d), got {type(f).__name__}")
    for key, t in (("u0", u0), ("v0", v0)):
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.numel() == 0:
            raise ValueError(f"{key}: expected a non-empty float tensor (the start point), got {t!r:.60}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{key}: holds NaN/inf values; allowed: a finite start point")
    if u0.dtype != v0.dtype:
        raise ValueError(f"v0: {_name(v0.dtype)} but u0 is {_name(u0.dtype)}; allowed: one float type")
    table, m = _stack(data, num_clients, u0.dtype)

    def value(row: Tensor, u: Tensor, v: Tensor) -> Tensor:
        i = row[0].round().long()
        return f(i, u, v, _entry(table, i))

    rows = torch.arange(m, dtype=u0.dtype).reshape(m, 1)
    _check_values(value, u0, v0, rows)

    def with_gradient(r: Tensor) -> Tensor:  # the value and its gradient, as the local steps take them
        gu, gv = torch.func.grad(lambda uu, vv: value(r, uu, vv).reshape(()), argnums=(0, 1))(u0, v0)
        return torch.cat([value(r, u0, v0).reshape(1), gu.reshape(-1), gv.reshape(-1)])

    why = rowwise_mismatch(with_gradient, rows)
    if why is not None:
        raise ValueError(
            f"f: {why}; allowed: tensor operations on u, v and d (a client's own tensors go in its "
            f"data entry d, not indexed by i; no Python if or int() on i or on tensor values)"
        )
    zeros = torch.zeros(m, 1, dtype=u0.dtype)
    off = torch.arange(m + 1)
    fdata = FederatedData(rows, zeros, off, rows.clone(), zeros.clone(), off.clone(), task="regression", name=name)
    return ClientPartialProblem(
        data=fdata,
        model_fn=lambda: SharedPersonal(u0, v0, value),
        loss=client_value,
        blocks={"personal": ["personal"]},
        name=name,
    )


def _stack(data, num_clients, dtype) -> tuple[Any, int]:
    """The clients' data as one table ``[m, ...]`` per tensor (structured as one entry), and m; every entry
    checked."""
    if data is None:
        if not isinstance(num_clients, int) or isinstance(num_clients, bool) or num_clients < 1:
            raise ValueError(f"num_clients: expected a positive integer when no data is given, got {num_clients!r}")
        return None, num_clients
    if isinstance(data, (Tensor, Mapping)) or not isinstance(data, Sequence) or len(data) == 0:
        raise ValueError("data: expected a list with one entry per client (a tensor, a tuple or a dict of tensors)")
    if num_clients is not None and num_clients != len(data):
        raise ValueError(f"num_clients: {num_clients} but data lists {len(data)} clients")
    first = data[0]
    keys = (
        list(first) if isinstance(first, Mapping) else range(len(first)) if isinstance(first, (tuple, list)) else [None]
    )
    columns: dict[Any, list[Tensor]] = {k: [] for k in keys}
    for i, d in enumerate(data):
        same = (
            (isinstance(d, Mapping) and list(d) == list(keys))
            if isinstance(first, Mapping)
            else (isinstance(d, (tuple, list)) and len(d) == len(keys))
            if isinstance(first, (tuple, list))
            else True
        )
        if not same:
            raise ValueError(
                f"data[{i}]: not structured as client 0's entry; allowed: the same keys (or the same "
                f"number of tensors) on every client"
            )
        for k in keys:
            t = d if k is None else d[k]
            where = f"data[{i}]" + ("" if k is None else f"[{k!r}]")
            if not isinstance(t, Tensor):
                raise ValueError(f"{where}: expected a torch tensor, got {type(t).__name__}")
            ref = t if i == 0 else columns[k][0]
            if t.shape != ref.shape or t.dtype != ref.dtype:
                raise ValueError(
                    f"{where}: shape {tuple(t.shape)} {_name(t.dtype)} but client 0's is "
                    f"{tuple(ref.shape)} {_name(ref.dtype)}; allowed: the same shapes and types on "
                    f"every client"
                )
            if t.is_floating_point() and t.dtype != dtype:
                raise ValueError(
                    f"{where}: {_name(t.dtype)} but the start points are {_name(dtype)}; allowed: one float type"
                )
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(f"{where}: holds NaN/inf values; allowed: finite values only")
            columns[k].append(t.detach())
    table = {k: torch.stack(v) for k, v in columns.items()}
    if isinstance(first, Mapping):
        return table, len(data)
    if isinstance(first, (tuple, list)):
        return tuple(table[k] for k in keys), len(data)
    return table[None], len(data)


def _entry(table, i: Tensor):
    """Client ``i``'s entry of the table data (None without data)."""
    if table is None:
        return None
    pick = lambda v: v.index_select(0, i.reshape(1)).squeeze(0)
    if isinstance(table, dict):
        return {k: pick(v) for k, v in table.items()}
    if isinstance(table, tuple):
        return tuple(pick(v) for v in table)
    return pick(table)


def _check_values(value, u0: Tensor, v0: Tensor, rows: Tensor) -> None:
    """``f`` at the start point on every client: a finite real scalar with finite gradients."""
    for r in rows.unbind(0):
        i = int(r[0])
        u, v = u0.detach().clone().requires_grad_(True), v0.detach().clone().requires_grad_(True)
        try:
            out = value(r, u, v)
        except Exception as e:  # noqa: BLE001  (the user's function: any failure is reported in one line)
            raise ValueError(
                f"f: fails on client {i} at the start point ({type(e).__name__}: "
                f"{str(e).strip().splitlines()[0][:160] if str(e).strip() else ''})"
            ) from None
        if not isinstance(out, Tensor) or out.numel() != 1 or not out.is_floating_point():
            raise ValueError(
                f"f: client {i} gives {type(out).__name__} "
                f"{tuple(out.shape) if isinstance(out, Tensor) else ''}; allowed: a real float scalar"
            )
        if not bool(torch.isfinite(out).all()):
            raise ValueError(
                f"f: client {i} gives {float(out.detach())} at the start point; allowed: finite values "
                f"(check the client's data and f)"
            )
        gu, gv = torch.autograd.grad(out.reshape(()), (u, v), allow_unused=True)
        for key, g in (("u", gu), ("v", gv)):
            if g is not None and not bool(torch.isfinite(g).all()):
                raise ValueError(
                    f"f: client {i}'s gradient in {key} is not finite at the start point; allowed: f "
                    f"differentiable there"
                )


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
