"""Per-layer timing (deltaconv.profile)."""
import pytest
import torch
import torchvision

import deltaconv
from deltaconv.profile import format_profile, profile_layers


def test_profile_layers_covers_every_layer_in_order():
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    dm = deltaconv.convert(model, threshold=0.01)
    frames = [torch.randn(1, 3, 48, 64)]
    for _ in range(3):
        f = frames[-1].clone()
        f[:, :, 10:20, 10:30] += 0.5
        frames.append(f)
    rows = profile_layers(dm, frames)
    assert [r["name"] for r in rows] == [layer.layer_name for layer in dm.delta_layers()]
    assert all(r["ms"] >= 0 for r in rows)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    text = format_profile(rows, top=5)
    assert len(text.splitlines()) == 6 and "conv2d" in text
    # hooks are removed afterwards: the model runs and stays exact
    assert ((dm(frames[0]) - model(frames[0])).norm() / model(frames[0]).norm()) < 1e-5


def test_profile_layers_errors():
    dm = deltaconv.convert(torchvision.models.resnet18().eval())
    with pytest.raises(TypeError, match="dm must be a DeltaModel, got Sequential"):
        profile_layers(torch.nn.Sequential(), [torch.randn(1, 3, 32, 32)] * 2)
    with pytest.raises(ValueError, match="at least 2 frames"):
        profile_layers(dm, [torch.randn(1, 3, 32, 32)])
