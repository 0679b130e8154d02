"""Client-specific bilevel problems in plain torch: client i brings its own upper loss f_i and lower loss g_i.

    def upper(i, x, y, data) -> scalar tensor        f_i(x, y)
    def lower(i, x, y, data) -> scalar tensor        g_i(x, y), strongly convex in y (SimFBO Assumption 1)

``i`` is the client's index (a 0-dim long tensor); ``x`` (``[d_x]``) and ``y`` (``[d_y]``) are the two variables;
``data`` is a dict of client i's tensors: its slices of the per-client tensors ``client_data`` (``client_data={"A":
A}`` with ``A`` of shape ``[n, ...]`` gives ``data["A"] = A[i]``) and, for a problem with samples, the minibatch
``inputs``, ``targets`` and ``weights`` (they sum to 1) of the split the function is computed on (the upper rows for
f_i, the lower rows for g_i). The functions must be plain tensor code (no Python ``if`` on tensor values); one that
indexes with ``int(i)`` runs too, client by client.

:func:`client_problem` builds the ``FederatedProblem`` that every bilevel solver runs: its model holds the two
variables (``x0``, ``y0`` are the start), and it checks every client's functions at the start (a finite scalar,
g_i strongly convex in y) with one-line errors naming the client and the function.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import Tensor, nn

from fedsolve.core.probes import mark_client_map
from fedsolve.data.federated import FederatedData
from fedsolve.families.bilevel.checks import check_finite_data, check_splits, check_strongly_convex, full_split
from fedsolve.families.bilevel.problem import Batch, BilevelOracles, BilevelSpec
from fedsolve.problems import FederatedProblem

ClientFunction = Callable[[Tensor, Tensor, Tensor, dict[str, Tensor]], Tensor]


class Variables(nn.Module):
    """The model of a problem stated by functions: the variables ``x`` and ``y`` (flat), started at ``x0`` and
    ``y0``. Its forward pass is not a prediction (zeros): such a problem is followed by ``upper_loss`` and
    ``lower_grad_norm`` in the solvers' reports, not by scores on a test split."""

    def __init__(self, x0: Tensor, y0: Tensor):
        super().__init__()
        self.x = nn.Parameter(x0.detach().clone())
        self.y = nn.Parameter(y0.detach().clone())

    def forward(self, inp: Tensor) -> Tensor:
        return torch.zeros(inp.shape[0], dtype=self.x.dtype, device=self.x.device)


@dataclass(frozen=True)
class ClientFunctions:
    """The clients' own f_i and g_i (``BilevelSpec.functions``), their per-client tensors, whether the problem
    has samples (then the functions also receive the minibatch), and known points of x (``references``: the solvers
    report ``x_dist_<name>`` = ||x - point||)."""

    upper: ClientFunction
    lower: ClientFunction
    client_data: dict[str, Tensor] = field(default_factory=dict)
    samples: bool = False
    references: dict[str, Tensor] = field(default_factory=dict)

    def oracles(self, problem: FederatedProblem, spec: BilevelSpec) -> FunctionOracles:
        return FunctionOracles(problem, spec)

    def data(self, client: Tensor, batch=None) -> dict[str, Tensor]:
        """Client ``client``'s slices of ``client_data`` (``index_select``: pure tensor code) and the minibatch."""
        i = client.reshape(1).to(torch.long)
        out = {k: torch.index_select(v, 0, i.to(v.device)).squeeze(0) for k, v in self.client_data.items()}
        if self.samples and batch is not None:
            out.update(inputs=batch[0], targets=batch[1], weights=batch[2])
        return out


class FunctionOracles(BilevelOracles):
    """:class:`BilevelOracles` whose f and g are client i's own functions (bound by :meth:`on`)."""

    client: Tensor | None = None

    def on(self, client: Tensor) -> FunctionOracles:
        out = copy.copy(self)
        out.client = client
        return out

    def _call(self, fn: ClientFunction, px, py, b) -> Tensor:
        if self.client is None:
            raise ValueError("bilevel problem: its f_i and g_i are per client; use oracles.on(i)")
        return fn(self.client, px["x"], py["y"], self.spec.functions.data(self.client, b))

    def _f(self, px, py, b):
        return self._call(self.spec.functions.upper, px, py, b)

    def _g(self, px, py, b):
        return self._call(self.spec.functions.lower, px, py, b)

    def outputs(self, x: Tensor, y: Tensor, inp: Tensor) -> Tensor:
        return torch.zeros(inp.shape[0], dtype=x.dtype, device=x.device)


def _placeholder_data(n: int, dtype: torch.dtype, weights: Tensor | None) -> FederatedData:
    """Two training rows per client (one lower, one upper) and one test row, all zeros: what the engine plans
    minibatches over when the clients' functions read no samples."""
    z = lambda rows: [(torch.zeros(rows, 1), torch.zeros(rows)) for _ in range(n)]
    data = FederatedData.from_client_arrays(z(2), z(1), task="regression", name="client functions", dtype=dtype)
    data.train_groups, data.group_names = torch.tensor([0, 1] * n), ("lower", "upper")
    if weights is not None:
        data.weights = weights
    data.__post_init__()
    return data


def _checked_value(fn_name: str, fn: ClientFunction, i: int, x: Tensor, y: Tensor, d: dict, dtype) -> None:
    """``fn(i, x, y, d)`` is a finite real scalar (a 0-dim tensor of the variables' type)."""
    try:
        val = fn(torch.tensor(i), x, y, d)
    except Exception as e:  # noqa: BLE001  (the user's function: its own error, on one line)
        raise ValueError(
            f"{fn_name}: {fn_name}({i}, x, y, data) raised {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}"
        ) from None
    if not isinstance(val, Tensor) or val.dim() != 0 or not val.is_floating_point():
        got = f"shape {tuple(val.shape)}, {val.dtype}" if isinstance(val, Tensor) else type(val).__name__
        raise ValueError(
            f"{fn_name}: {fn_name}({i}, x, y, data) returned {got}; allowed: a 0-dim floating tensor (a scalar loss)"
        )
    if val.dtype != dtype:
        raise ValueError(
            f"{fn_name}: {fn_name}({i}, x, y, data) is {val.dtype}, the variables are {dtype}; allowed: "
            f"the variables' type"
        )
    if not bool(torch.isfinite(val)):
        raise ValueError(f"{fn_name}: {fn_name}({i}, x, y, data) = {float(val)} at the start; allowed: a finite value")


def client_problem(
    upper: ClientFunction,
    lower: ClientFunction,
    x0: Tensor,
    y0: Tensor,
    client_data: Mapping[str, Tensor] | None = None,
    data: FederatedData | None = None,
    num_clients: int | None = None,
    weights: Tensor | None = None,
    name: str = "bilevel",
    references: Mapping[str, Tensor] | None = None,
) -> FederatedProblem:
    """A bilevel problem whose client i has its own ``upper`` f_i and ``lower`` g_i (module docstring).

    Args:
        upper, lower: ``fn(i, x, y, data) -> scalar``.
        x0, y0: the start of x and y (1-D floating tensors of one type).
        client_data: per-client tensors ``{name: [n, ...]}``; client i's functions see ``data[name] = t[i]``.
        data: samples with the row groups ``lower`` and ``upper`` (``fedsolve.families.bilevel.kind.split_rows``
            makes them); the functions then also see their minibatch. None: the functions read no samples.
        num_clients: the number of clients when neither ``client_data`` nor ``data`` says it.
        weights: the clients' weights (``[n]``; the solvers' ``weights: data``), default equal.
        references: known points of x by name (e.g. ``{"true": x_star}``, the stationary point when it is known in
            closed form); every evaluation then reports ``x_dist_<name>`` = ||x - point||.
    """
    for nm, v in (("x0", x0), ("y0", y0)):
        if not isinstance(v, Tensor) or v.dim() != 1 or not v.is_floating_point() or v.numel() == 0:
            raise ValueError(
                f"{nm}: allowed: a non-empty 1-D floating tensor, got "
                f"{tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__}"
            )
    if x0.dtype != y0.dtype:
        raise ValueError(f"y0: {y0.dtype}, x0 is {x0.dtype}; allowed: one floating type for both")
    client_data = dict(client_data or {})
    sizes = {
        f"client_data[{k!r}]": (int(v.shape[0]) if isinstance(v, Tensor) and v.dim() > 0 else None)
        for k, v in client_data.items()
    }
    if data is not None:
        sizes["data"] = data.num_clients
    if num_clients is not None:
        sizes["num_clients"] = int(num_clients)
    for where, n_ in sizes.items():
        if n_ is None:
            raise ValueError(f"{where}: allowed: a tensor with one row per client (shape [n, ...])")
    counts = {v for v in sizes.values() if v is not None}  # every size is given (checked above)
    if len(counts) != 1 or min(counts) < 1:
        raise ValueError(
            f"client_data/data/num_clients: the number of clients differs or is missing "
            f"({', '.join(f'{k} {v}' for k, v in sizes.items()) or 'none given'}); allowed: one "
            f"n >= 1 for all"
        )
    n = counts.pop()
    if weights is not None and (not isinstance(weights, Tensor) or weights.shape != (n,) or bool((weights <= 0).any())):
        raise ValueError(f"weights: allowed: {n} positive client weights (a [{n}] tensor)")
    references = dict(references or {})
    for nm, v in references.items():
        if not isinstance(v, Tensor) or v.shape != x0.shape or v.dtype != x0.dtype or not bool(torch.isfinite(v).all()):
            raise ValueError(
                f"references[{nm!r}]: allowed: a finite tensor of x0's shape {tuple(x0.shape)} and type {x0.dtype}"
            )
    samples = data is not None
    if data is None:
        data = _placeholder_data(n, x0.dtype, weights)
    else:
        if not {"lower", "upper"} <= set(data.group_names):
            raise ValueError(
                f"data: row groups {list(data.group_names)}; allowed: 'lower' and 'upper' (split_rows makes them)"
            )
        check_finite_data(data)
        check_splits(data, ("lower", "upper"))
        if weights is not None:
            data = dataclasses.replace(data, weights=weights)
    fns = ClientFunctions(upper, lower, client_data, samples=samples, references=references)
    problem = FederatedProblem(
        data, functools.partial(Variables, x0, y0), loss="squared_error", blocks={"x": ["x"], "y": ["y"]}, name=name
    )
    problem.extras["bilevel"] = BilevelSpec(name=name, functions=fns)
    _check_clients(problem, fns, x0, y0)
    return problem


def _check_clients(problem: FederatedProblem, fns: ClientFunctions, x0: Tensor, y0: Tensor) -> None:
    """Every client's functions at the start: finite scalars, g_i strongly convex in y; and whether they run for
    several clients at once (:func:`~fedsolve.core.probes.mark_client_map`: when not, the clients run one by one)."""
    spec = problem.extras["bilevel"]
    data = problem.data
    for i in range(problem.num_clients):
        for nm, fn, group in (("upper", fns.upper, spec.upper_group), ("lower", fns.lower, spec.lower_group)):
            _checked_value(nm, fn, i, x0, y0, fns.data(torch.tensor(i), full_split(data, i, group)), x0.dtype)
    oracles = FunctionOracles(problem, spec)
    check_strongly_convex(oracles, x0, y0, where="lower")
    groups = (spec.lower_group, spec.upper_group)
    rows = {g: [full_split(data, i, g) for i in range(problem.num_clients)] for g in groups}
    one = {g: [tuple(t[:1] for t in b) for b in rows[g]] for g in rows}  # one row per client: equal shapes

    def grads(i: Tensor):
        O = oracles.on(i)
        pick = lambda g: cast(
            Batch, tuple(torch.index_select(torch.stack([b[k] for b in one[g]]), 0, i.reshape(1))[0] for k in range(3))
        )  # (inputs, targets, weights)
        return O.grad_y_g(x0, y0, pick(spec.lower_group))[0], O.grad_f(x0, y0, pick(spec.upper_group))[:2]

    mark_client_map(problem, grads)
