"""The benchmark models: the CIFAR ResNet (GroupNorm, or BatchNorm) and the character LSTM for Shakespeare."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from fedsolve.models import MODELS, build_model_fn
from fedsolve.models.resnet import CifarResNet
from fedsolve.models.text import CharLSTM, StackedLSTM


def resnet_parameters(depth: int, width: int, channels: int, classes: int, norm_affine: bool = True) -> int:
    """ResNet-(6n+2) parameter count by hand: 3x3 convolutions without bias, 2 affine parameters per channel of
    every norm, 1x1 projection (with its norm) where the width changes, a linear layer on the pooled features."""
    n, nrm = (depth - 2) // 6, (2 if norm_affine else 0)
    total = 9 * channels * width + nrm * width          # stem
    cin = width
    for cout in (width, 2 * width, 4 * width):
        for b in range(n):
            total += 9 * cin * cout + 9 * cout * cout + 2 * nrm * cout
            if cin != cout:
                total += cin * cout + nrm * cout
            cin = cout
    return total + cin * classes + classes


def test_resnet20_has_the_published_size_and_shapes():
    m = build_model_fn("cifar_resnet", (3, 32, 32), 10)()
    count = sum(p.numel() for p in m.parameters())
    assert count == resnet_parameters(20, 16, 3, 10) == 272_474     # "0.27 M" in He et al. (2016), Table 6
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert not list(m.buffers()) and isinstance(m.stem[1], nn.GroupNorm) and m.stem[1].num_groups == 2
    small = CifarResNet((1, 8, 8), 4, depth=8, width=4)
    assert sum(p.numel() for p in small.parameters()) == resnet_parameters(8, 4, 1, 4)
    assert small(torch.randn(3, 1, 8, 8)).shape == (3, 4)


def test_resnet_batchnorm_option_builds_with_running_statistics():
    m = CifarResNet(depth=14, norm="batch")
    names = {n for n, _ in m.named_buffers()}
    assert "stem.1.running_mean" in names and "stages.0.norm1.num_batches_tracked" in names
    m.train()
    m(torch.randn(4, 3, 32, 32) + 3.0)
    assert float(m.stem[1].running_mean.abs().sum()) > 0
    plain = CifarResNet(depth=8, norm="none")
    assert not list(plain.buffers()) and plain.stem[0].bias is not None


@pytest.mark.parametrize("kw, words", [({"depth": 21}, "6n + 2"), ({"norm": "layer"}, "'group', 'batch', 'none'"),
                                       ({"width": 0}, "positive")])
def test_resnet_refuses_bad_sizes(kw, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        CifarResNet(**kw)


def test_stacked_lstm_equals_torch_lstm():
    torch.manual_seed(0)
    ours, ref = StackedLSTM(5, 7, 2), nn.LSTM(5, 7, 2, batch_first=True)
    assert {n: p.shape for n, p in ours.named_parameters()} == {n: p.shape for n, p in ref.named_parameters()}
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(3, 11, 5)
    torch.testing.assert_close(ours(x), ref(x)[0], rtol=1e-5, atol=1e-6)


def test_char_lstm_is_leafs_size_and_embeds_float_indices():
    m = build_model_fn("char_lstm", (80,), 80)()
    lstm = lambda i, h: 4 * h * (i + h) + 8 * h  # noqa: E731   weights and two biases of one layer
    assert sum(p.numel() for p in m.parameters()) == 80 * 8 + lstm(8, 256) + lstm(256, 256) + 256 * 80 + 80
    x = torch.randint(0, 80, (4, 80))
    out = m(x.float())
    assert out.shape == (4, 80) and torch.equal(out, m(x))
    with pytest.raises(ValueError, match=r"sequences of character indices \[T\]"):
        CharLSTM((1, 28, 28), 10)


def test_char_lstm_and_group_norm_resnet_run_under_vmap():
    """Both have no buffers and no fused kernels without a batching rule: many clients at once."""
    from torch.func import functional_call, stack_module_state, vmap

    torch.manual_seed(0)
    for make, x in ((lambda: CharLSTM((12,), 6, hidden=8, layers=2), torch.randint(0, 6, (2, 3, 12)).float()),
                    (lambda: CifarResNet((3, 8, 8), 5, depth=8, width=4), torch.randn(2, 3, 3, 8, 8))):
        copies = [make(), make()]   # two clients with their own weights
        params, buffers = stack_module_state(copies)
        model = copies[0]
        out = vmap(lambda p, b, xi: functional_call(model, (p, b), (xi,)))(params, buffers, x)
        for k, c in enumerate(copies):
            torch.testing.assert_close(out[k], c(x[k]), rtol=1e-5, atol=1e-6)


def test_registry_lists_the_new_models():
    assert {"logreg", "mlp", "lenet", "cifar_resnet", "char_lstm"} <= set(MODELS)
    with pytest.raises(ValueError, match=r"needs image inputs \[C,H,W\]"):
        build_model_fn("cifar_resnet", (60,), 10)
