"""A CPU stand-in for CUDA that catches device mismatches (a development aid for machines without a GPU).

Loaded as a pytest plugin (``-p fake_cuda``, with ``tests/`` on ``PYTHONPATH``) or by :func:`install`, it makes
``torch.cuda.is_available()`` true and runs every torch call through a ``TorchFunctionMode``: a tensor created
"on cuda" (``device="cuda"``, ``.to("cuda")``, a ``torch.device("cuda")`` context) is a CPU tensor *tagged* as
on the GPU, results of operations on tagged tensors are tagged, and an operation that mixes a tagged tensor with an
untagged one that is not a 0-dim scalar raises :class:`Mismatch`, as CUDA would ("Expected all tensors to be on
the same device"). Indexing a tagged tensor with CPU indices is allowed (CUDA allows it), ``.numpy()`` of a tagged
tensor and a CPU generator for a tagged tensor are refused. Tags follow tensors through ``torch.func`` transforms
(vmap, grad) by the unwrapped tensor.

What it checks is device plumbing, not CUDA numerics: the numbers are the CPU's. It leans on torch internals
(``torch.utils._device``, functorch's wrapper API); ``available()`` says whether this torch has them.
"""
import torch
import torch.utils._device as _dev
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

TAG = WeakIdKeyDictionary()   # the tensors on the stand-in GPU
FAKE = torch.device("cuda", 0)
CONSTRUCTORS = _dev._device_constructors()
F = torch._C._functorch


class Mismatch(RuntimeError):
    """Tensors on the (stand-in) GPU and on the CPU met in one operation."""


def _bases(t):
    out = [t]
    while F.is_functorch_wrapped_tensor(t):
        t = F.get_unwrapped(t)
        out.append(t)
    return out


def tagged(t):
    return any(b in TAG for b in _bases(t))


def tag(t):
    for b in _bases(t):
        TAG[b] = True


def _is_cuda(d):
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d.startswith("cuda")
    if isinstance(d, int):
        return True
    return False


def _is_cpu(d):
    return (isinstance(d, torch.device) and d.type == "cpu") or (isinstance(d, str) and d.startswith("cpu"))


GET = {torch.Tensor.device.__get__, torch.Tensor.is_cuda.__get__}
INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}
stats = {"ops": 0, "tagged_ops": 0}
#: calls that read metadata or convert to Python (allowed with mixed devices)
METADATA = {"_has_compatible_shallow_copy_type", "__repr__", "__format__", "__str__", "numpy", "tolist", "item",
            "__bool__", "__float__", "__int__", "__index__", "__len__", "size", "dim", "numel", "element_size",
            "stride", "is_contiguous", "storage_offset"}


class FakeCuda(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in GET:
            t = args[0]
            if func == torch.Tensor.device.__get__:
                return FAKE if tagged(t) else func(*args)
            return tagged(t)
        name = getattr(func, "__name__", str(func))
        to_cuda = to_cpu = False
        # ---- device arguments
        if "device" in kwargs:
            if _is_cuda(kwargs["device"]):
                kwargs["device"], to_cuda = "cpu", True
            elif _is_cpu(kwargs["device"]):
                to_cpu = True
        elif func in CONSTRUCTORS and _dev.CURRENT_DEVICE is not None and _dev.CURRENT_DEVICE.type == "cuda":
            kwargs["device"], to_cuda = "cpu", True
        gen = kwargs.get("generator")
        if to_cuda and gen is not None and gen.device.type == "cpu":
            raise Mismatch(f"{name}: a CPU generator for a cuda tensor")
        if func in (torch.Tensor.to,):
            new = []
            for a in args[1:]:
                if _is_cuda(a) and not isinstance(a, int):
                    to_cuda = True
                    a = "cpu"
                elif _is_cpu(a):
                    to_cpu = True
                elif isinstance(a, torch.Tensor):
                    if tagged(a):
                        to_cuda = True
                    else:
                        to_cpu = True
                new.append(a)
            args = (args[0], *new)
            out = func(*args, **kwargs)
            if to_cuda or (tagged(args[0]) and not to_cpu):
                if out is args[0] and not tagged(out):
                    out = out.clone()
                tag(out)
            elif to_cpu and tagged(out):
                out = out.clone()
            return out
        if func is torch.Tensor.cuda:
            out = args[0].clone() if not tagged(args[0]) else args[0]
            tag(out)
            return out
        if func is torch.Tensor.cpu:
            return args[0].clone() if tagged(args[0]) else args[0]
        if func == torch.Tensor.data.__set__:   # param.data = tensor
            out = func(*args, **kwargs)
            if tagged(args[1]):
                tag(args[0])
            else:
                for b in _bases(args[0]):
                    TAG.pop(b, None)
            return out
        # ---- mismatch check
        flat, _ = tree_flatten((args, kwargs))
        ts = [a for a in flat if isinstance(a, torch.Tensor)]
        stats["ops"] += 1
        if func in INDEXING:
            self_t = args[0]
            idx_flat, _ = tree_flatten(args[1])
            idx = [a for a in idx_flat if isinstance(a, torch.Tensor)]
            if tagged(self_t):
                bad = [a for a in ts[1 + len(idx):] if not tagged(a) and a.dim() > 0]   # values
            else:
                bad = [a for a in ts if tagged(a)]
            if bad:
                raise Mismatch(f"{name}: self on {'cuda' if tagged(self_t) else 'cpu'}, other on the other device; "
                               f"shapes {[tuple(a.shape) for a in ts]}")
            out = func(*args, **kwargs)
            if tagged(self_t):
                for o in tree_flatten(out)[0]:
                    if isinstance(o, torch.Tensor):
                        tag(o)
            return out
        on = [a for a in ts if tagged(a)]
        off = [a for a in ts if not tagged(a) and a.dim() > 0]
        if on and off and name not in METADATA:
            raise Mismatch(f"{name}: tensors on cuda {[tuple(a.shape) for a in on]} and on cpu "
                           f"{[tuple(a.shape) for a in off]}")
        if on and name in ("numpy",):
            raise Mismatch("numpy() of a cuda tensor")
        out = func(*args, **kwargs)
        if on or to_cuda:
            stats["tagged_ops"] += 1
            for o in tree_flatten(out)[0]:
                if isinstance(o, torch.Tensor):
                    tag(o)
        return out


def available() -> bool:
    """This torch has the internals the stand-in uses."""
    return hasattr(_dev, "CURRENT_DEVICE") and hasattr(F, "get_unwrapped")


def install() -> FakeCuda:
    """Make this process see one (stand-in) GPU, for good."""
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.get_device_name = lambda *a, **k: "fake-cuda"
    torch.cuda.empty_cache = lambda: None
    torch.cuda.reset_peak_memory_stats = lambda *a, **k: None
    torch.cuda.max_memory_allocated = lambda *a, **k: 0
    mode = FakeCuda()
    mode.__enter__()
    return mode


def pytest_configure(config) -> None:   # ``-p fake_cuda``
    install()
