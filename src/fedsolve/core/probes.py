"""What a model or a user's per-client function allows, found by trying it (used by the families' problem builders).

* :func:`linear_chain`: the layers of a model that is a chain of ``nn.Linear`` layers with elementwise activations
  (closed-form derivative oracles apply to it), or a ``ValueError`` saying why it is not one;
* :func:`maps_over_clients`: whether a function of a client's index runs for several clients at once under
  ``torch.func.vmap`` and gives there what it gives client by client (a user's plain torch function may index with
  the client's index as a Python number, which only the client-by-client run allows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fedsolve.core.batched_mlp import mlp_layers


def linear_chain(problem) -> list:
    """The layers of ``problem.model`` (``[_Layer(w=(start, out, in), b, act)]``, flat offsets in the layout) when it
    is a chain of ``nn.Linear`` layers with elementwise activations (ReLU, Tanh, Sigmoid) ending in a linear output;
    a ``ValueError`` naming what is not otherwise."""
    try:
        return mlp_layers(problem)
    except ValueError as e:  # the message names the fast kernels it was written for: keep only the reason
        msg = str(e)
        why = msg.split("; ", 1)[1].rsplit("; use", 1)[0] if "; " in msg else f"loss {problem.loss_name!r}"
        raise ValueError(f"the model is not a chain of nn.Linear layers with elementwise activations ({why})") from None


def maps_over_clients(fn: Callable[[torch.Tensor], Any], num_clients: int) -> bool:
    """``fn(i)`` for the first (up to) three client indices ``i`` (0-dim long tensors) runs under ``torch.func.vmap``
    and equals the client-by-client values (every tensor of the returned structure, to 1e-10 relative)."""
    ids = torch.arange(min(num_clients, 3))
    try:
        together = torch.func.vmap(fn, randomness="error")(ids)
    except Exception:  # noqa: BLE001  (any failure: the function runs client by client only)
        return False
    leaves = torch.utils._pytree.tree_leaves
    for k in range(ids.numel()):
        one = leaves(fn(ids[k]))
        both = leaves(together)
        if len(one) != len(both) or not all(torch.allclose(a, b[k], rtol=1e-10, atol=1e-12) for a, b in zip(one, both)):
            return False
    return True


def mark_client_map(problem, fn: Callable[[torch.Tensor], Any]) -> bool:
    """Whether the clients of ``problem`` may run together, judged by :func:`maps_over_clients` of ``fn`` (a function
    of a client index that exercises the problem's own per-client code); when they may not, ``problem.vmappable`` is
    turned off, so the engine's ``auto`` choice runs them one by one. Returns the verdict."""
    ok = maps_over_clients(fn, problem.num_clients)
    problem.vmappable = problem.vmappable and ok
    return ok
