import numpy as np
import pytest
import torch
from torch import nn

from fedsolve.core import ClientStates, CommLedger, ParamLayout, RngStreams, row_bytes
from fedsolve.models import LeNet


def test_layout_roundtrip_blocks_and_no_aliasing():
    net = LeNet((1, 8, 8), 10)
    lay = ParamLayout(net, {"personal": ["fc1.*", "fc2.*"], "body": ["conv*"]})
    v = lay.flatten(net)
    assert v.numel() == sum(p.numel() for p in net.parameters()) == lay.dim
    parts = lay.unflatten(v)
    for name, p in net.named_parameters():
        assert torch.equal(parts[name], p.detach())
    assert int(lay.mask("personal").sum()) + int(lay.mask("body").sum()) == lay.dim
    assert torch.equal(lay.complement("personal"), lay.mask("body"))
    # flatten copies, load_into copies: in-place training never writes into the source vector
    v0 = v.clone()
    lay.load_into(net, v)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    assert torch.equal(v, v0)
    # batched unflatten
    stacked = torch.stack([v, v + 1])
    assert lay.unflatten(stacked)["fc2.bias"].shape == (2, 10)


def test_layout_bad_pattern_names_parameters():
    with pytest.raises(ValueError, match="match no parameter"):
        ParamLayout(nn.Linear(2, 2), {"personal": ["head.*"]})
    with pytest.raises(KeyError, match="defined blocks"):
        ParamLayout(nn.Linear(2, 2)).mask("personal")


def test_client_states_gather_scatter():
    cs = ClientStates(5, {"w": torch.arange(10.0).reshape(5, 2)})
    ids = torch.tensor([1, 3])
    rows = cs.gather(ids)
    rows["w"] += 100
    assert cs["w"][1, 0] == 2.0  # gather copies
    before = cs["w"].clone()
    cs.scatter(ids, rows)
    assert torch.equal(cs["w"][[0, 2, 4]], before[[0, 2, 4]])
    assert torch.equal(cs["w"][[1, 3]], before[[1, 3]] + 100)
    with pytest.raises(ValueError, match="leading dim"):
        cs["bad"] = torch.zeros(4, 2)
    with pytest.raises(KeyError, match="unknown client state"):
        cs.scatter(ids, {"nope": torch.zeros(2, 2)})


def test_rng_streams_are_keyed_and_reproducible():
    a, b = RngStreams(7), RngStreams(7)
    assert np.array_equal(a.numpy("sampling", 3).random(4), b.numpy("sampling", 3).random(4))
    assert not np.array_equal(a.numpy("sampling", 3).random(4), a.numpy("sampling", 4).random(4))
    assert not np.array_equal(a.numpy("batches", 1, 2).random(4), a.numpy("batches", 2, 1).random(4))
    g1, g2 = a.torch("init"), b.torch("init")
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))
    with pytest.raises(ValueError, match="seed"):
        RngStreams(-1)


def test_comm_ledger_counts_actual_records():
    led = CommLedger()
    down = {"w": torch.zeros(3, 10)}
    up = {"w": torch.zeros(3, 10), "dual": torch.zeros(3, 10, dtype=torch.float64)}
    e = led.add_round(0, down, up)
    assert e["down_bytes"] == 3 * 10 * 4 and e["up_bytes"] == 3 * 10 * 4 + 3 * 10 * 8
    assert row_bytes(up) == 10 * 4 + 10 * 8
    led.add_round(1, down, up)
    assert led.uplink_bytes == 2 * e["up_bytes"]
    assert CommLedger.from_state_dict(led.state_dict()).uplink_bytes == led.uplink_bytes
