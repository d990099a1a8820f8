"""Per-layer timing (deltaconv.profile)."""
import pytest
import torch
import torchvision

import deltaconv
from deltaconv.profile import dense_activation_bytes, format_profile, profile_layers


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


def test_dense_activation_bytes_counts_every_layer_output_once():
    torch.manual_seed(0)
    # ten 8-channel convs: each output is freed by the next layer, so a plain dense forward hands
    # the same blocks out again; an in-place ReLU shares its input's storage
    layers = []
    for _ in range(10):
        layers += [torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(inplace=True)]
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), *layers, torch.nn.Flatten()).eval()
    x = torch.randn(1, 3, 16, 24)
    mem = dense_activation_bytes(model, x)
    # 11 conv outputs (ReLU in place, Flatten a view), float32
    assert mem == {"sum": 11 * 8 * 16 * 24 * 4, "peak": None}
    assert dense_activation_bytes(model.half(), x.half())["sum"] == 11 * 8 * 16 * 24 * 2


def test_dense_activation_bytes_errors():
    with pytest.raises(TypeError, match="model must be an nn.Module, got str"):
        dense_activation_bytes("resnet", torch.randn(1, 3, 8, 8))
    with pytest.raises(TypeError, match="example must be a Tensor, got list"):
        dense_activation_bytes(torch.nn.ReLU(), [1, 2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_dense_activation_bytes_peak_on_cuda():
    model = torch.nn.Sequential(*[torch.nn.Conv2d(8, 8, 3, padding=1) for _ in range(6)]).cuda().eval()
    x = torch.randn(1, 8, 64, 64, device="cuda")
    mem = dense_activation_bytes(model, x)
    one = 8 * 64 * 64 * 4
    assert mem["sum"] == 6 * one
    # a dense forward holds about two outputs at a time, far less than all six
    assert one <= mem["peak"] < 6 * one
