"""Shared helpers of the CPU/GPU test suite: devices, video frames, synthetic frame sequences,
non-trivial BatchNorm statistics, a small U-Net, and dense-vs-delta comparison."""
from __future__ import annotations

import contextlib
import functools
from typing import Iterable, Sequence

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import deltaconv
from deltaconv.modules import DCDensify

# ----------------------------------------------------------------------------- devices, backends
HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def is_tf32(t: torch.Tensor) -> bool:
    """Whether every element of float32 ``t`` is a TF32 value (its 13 low mantissa bits zero)."""
    return not bool((t.view(torch.int32) & 0x1FFF).any())


def cuda_backend_reason() -> str:
    """``""`` when backend="cuda" can run here, else why not."""
    if not HAS_CUDA:
        return "no CUDA GPU"
    from deltaconv import backends
    module, reason = backends.cuda_backend()
    return "" if module is not None else reason


def device_backends() -> list:
    """``(device, backend)`` pytest params: CPU reference always; CUDA reference and CUDA kernels
    marked ``gpu`` and skipped cleanly where unavailable."""
    params = [pytest.param("cpu", "reference", id="cpu-reference")]
    params.append(pytest.param("cuda", "reference", id="cuda-reference",
                               marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")]))
    why = cuda_backend_reason() if HAS_CUDA else "no CUDA GPU"
    params.append(pytest.param("cuda", "cuda", id="cuda-cuda",
                               marks=[pytest.mark.gpu, pytest.mark.skipif(bool(why), reason=why or "ok")]))
    return params


# ----------------------------------------------------------------------------- frames
@functools.lru_cache(maxsize=16)
def _video_frames(name: str, n: int, size: tuple, start: int) -> tuple:
    from deltaconv.video import find_sample_video, read_frames
    path = find_sample_video(name)
    return tuple(read_frames(path, max_frames=n, size=size, start=start))


def video_frames(n: int = 3, size=(64, 96), name: str = "vtest.avi", start: int = 0) -> list[torch.Tensor]:
    """``n`` consecutive frames ``[1, 3, h, w]`` (ImageNet-normalised) of a sample video."""
    frames = _video_frames(name, n, tuple(size), start)
    if len(frames) < n:
        pytest.skip(f"{name} yields only {len(frames)} frames")
    return [f.clone() for f in frames]


def changing_frames(shape: Sequence[int], fractions: Iterable[float], seed: int = 0,
                    scale: float = 1.0) -> list[torch.Tensor]:
    """A first random frame, then one frame per entry of ``fractions`` in which a random subset of
    pixels (that fraction of the pixels of each stream, every channel of a chosen pixel) gets new
    random values; the other pixels stay bit-identical."""
    g = torch.Generator().manual_seed(seed)
    n, c, h, w = shape
    frame = torch.randn(shape, generator=g) * scale
    frames = [frame.clone()]
    for frac in fractions:
        frame = frame.clone()
        for i in range(n):
            k = int(round(frac * h * w))
            idx = torch.randperm(h * w, generator=g)[:k]
            flat = frame[i].reshape(c, h * w)
            flat[:, idx] = torch.randn(c, k, generator=g) * scale
            frame[i] = flat.reshape(c, h, w)
        frames.append(frame)
    return frames


#: changed fraction per frame after the key frame: sparse, nothing, dense, everything, sparse again
FRACTIONS = (0.05, 0.0, 0.4, 1.0, 0.01)


# ----------------------------------------------------------------------------- models
def randomize_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm non-trivial running statistics and affine parameters (in place).

    Running variances are chosen so that activations keep roughly unit scale through deep random
    networks; means, weights and biases are far from the default 0/1, so a BN that is dropped,
    applied twice or folded wrongly changes the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                c = m.num_features
                if m.running_mean is not None:
                    m.running_mean.copy_(torch.randn(c, generator=g) * 0.2)
                    m.running_var.copy_(torch.rand(c, generator=g) * 1.0 + 0.5)
                if m.weight is not None:
                    m.weight.copy_(torch.rand(c, generator=g) * 0.8 + 0.6)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(c, generator=g) * 0.2)
    return randomize_layer_norms(model, seed)


def randomize_layer_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every LayerNorm affine parameters away from 1/0 and every ConvNeXt-style ``layer_scale``
    (initialised to 1e-6, which makes each block nearly the identity) a size of 0.2-0.5, in place,
    so that an error inside a block shows in the output."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm) and m.weight is not None:
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * 0.8 + 0.6)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)
            scale = getattr(m, "layer_scale", None)
            if isinstance(scale, nn.Parameter):
                scale.copy_(torch.rand(scale.shape, generator=g) * 0.3 + 0.2)
    return model


def torchvision_model(name: str) -> nn.Module:
    """A torchvision classification or segmentation model without weights (nothing is downloaded),
    seeded, with its BatchNorm statistics randomised (randomize_bn), in eval mode."""
    import torchvision
    fn = getattr(torchvision.models, name, None) or getattr(torchvision.models.segmentation, name)
    kwargs = {"weights": None}
    if name.startswith(("deeplab", "lraspp", "fcn")):
        kwargs["weights_backbone"] = None
    torch.manual_seed(0)
    return randomize_bn(fn(**kwargs).eval())


def main_output(y):
    """A classifier's logits, or a torchvision segmentation model's "out" map."""
    return y["out"] if isinstance(y, dict) else y


def _conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """A small U-Net: max-pool down, transposed-conv and bilinear up, skip concatenation."""

    def __init__(self, cin: int = 3, classes: int = 2, w: int = 8) -> None:
        super().__init__()
        self.enc1 = _conv_block(cin, w)
        self.pool = nn.MaxPool2d(2)
        self.enc2 = _conv_block(w, 2 * w)
        self.enc3 = _conv_block(2 * w, 4 * w)
        self.up2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2)
        self.dec2 = _conv_block(4 * w, 2 * w)
        self.dec1 = _conv_block(3 * w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        e3 = self.enc3(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(e3), e2], dim=1))
        up1 = F.interpolate(d2, size=e1.shape[-2:], mode="bilinear", align_corners=False)
        d1 = self.dec1(torch.cat([up1, e1], dim=1))
        return self.head(d1)


def make_unet(seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    return randomize_bn(UNet(**kw), seed).eval()


# ----------------------------------------------------------------------------- comparison
def flatten_outputs(out) -> dict:
    """Tensors of a model output (tensor, tuple/list, dict) keyed by their position/key."""
    if torch.is_tensor(out):
        return {"": out}
    if isinstance(out, dict):
        items = out.items()
    elif isinstance(out, (list, tuple)):
        items = enumerate(out)
    else:
        raise TypeError(f"unexpected output type {type(out).__name__}")
    flat = {}
    for k, v in items:
        for kk, vv in flatten_outputs(v).items():
            flat[f"{k}/{kk}" if kk else str(k)] = vv
    return flat


def rel_err(ref: torch.Tensor, got: torch.Tensor) -> float:
    """``||got - ref|| / ||ref||`` in float64 (absolute error when ``ref`` is zero)."""
    ref, got = ref.detach().double().cpu(), got.detach().double().cpu()
    assert ref.shape == got.shape, (ref.shape, got.shape)
    den = ref.norm().item()
    num = (got - ref).norm().item()
    return num / den if den > 0 else num


def max_rel_err(ref_out, got_out) -> float:
    """Largest relative error over every tensor of two outputs with the same structure."""
    a, b = flatten_outputs(ref_out), flatten_outputs(got_out)
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    return max(rel_err(a[k], b[k]) for k in a)


def compare_over_frames(model: nn.Module, frames: Sequence[torch.Tensor], *, device: str = "cpu",
                        backend: str = "reference", threshold: float = 0.0, dm=None, **convert_kw):
    """Convert ``model`` (unless ``dm`` is given), run dense and delta on every frame; returns
    ``(dm, errors, sparsifier densities)`` with one entry per frame."""
    model = model.to(device).eval()
    frames = [f.to(device) for f in frames]
    if dm is None:
        dm = deltaconv.convert(model, threshold=threshold, backend=backend, example_input=frames[0], **convert_kw)
    errors, densities = [], []
    with torch.no_grad():
        for f in frames:
            ref = model(f.clone())  # clone: in-place dense ops must not edit the frame
            got = dm(f)
            errors.append(max_rel_err(ref, got))
            densities.append(dm.stats()[0]["density"])
    return dm, errors, densities


def output_masks(dm) -> dict:
    """Register hooks that capture the input mask of every output densifier; returns the dict that
    the hooks fill (``{densifier name: mask}``, overwritten each frame)."""
    masks = {}
    for name, module in dm.named_modules():
        if isinstance(module, DCDensify):
            def hook(mod, args, _name=name):
                masks[_name] = args[0].mask.detach().clone()
            module.register_forward_pre_hook(hook)
    return masks


def layer_named(dm, cls):
    """The DC layers of class ``cls`` in execution order."""
    return [layer for layer in dm.delta_layers() if isinstance(layer, cls)]


def make_positive_monotone(model: nn.Module, slope: float = 0.1) -> nn.Module:
    """A copy of ``model`` whose response to a change is never cancelled: conv/linear weights
    positive, biases zero, BatchNorm a positive scale without shift, every ReLU replaced by a
    strictly monotone LeakyReLU. Fed a zero background plus one changed pixel, exactly the output
    pixels whose (analytic) receptive field holds that pixel change."""
    import copy

    model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * 0.5 + 0.25)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.zero_()
                m.bias.zero_()
    for name, m in list(model.named_modules()):
        for child_name, child in list(m.named_children()):
            if isinstance(child, (nn.ReLU, nn.ReLU6)):
                setattr(m, child_name, nn.LeakyReLU(slope))
    return model.eval()


def cuda_kernel_names(fn) -> list[str]:
    """Names of the CUDA kernels that ``fn()`` launches (torch.profiler), ``[]`` if it records none
    (CUPTI unavailable, e.g. under compute-sanitizer)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def writing_changes(dm, fused_only: bool = False):
    """``dm`` with its activations writing their changes (``DCActivation.changes_unread`` cleared, before
    the first frame): every one, or with ``fused_only`` those fused with a residual add (unread changes as
    they were before 2026-12-02 03:20 UTC). Needed wherever a reader's value mode is undone after
    ``convert``: the reader then reads the changes. Returns ``dm``."""
    from deltaconv.modules import DCActivation
    fused = {e.layer for e in dm.report.nodes if e.layer and "fused with" in e.note}
    for name, layer in dm.named_modules():
        if isinstance(layer, DCActivation) and (not fused_only or name in fused):
            layer.changes_unread = False
    return dm


def without_kept_outputs(dm):
    """``dm`` with its adds in delta mode (every ``DCConv2d.keeps_output`` and ``DCAdd.keeps_sum``
    cleared, before the first frame): value mode as it was before the bottleneck adds took it; the
    activations write their changes (:func:`writing_changes`), which the convolutions and adds read now.
    Returns ``dm``."""
    for layer in dm.modules():
        for flag in ("keeps_output", "keeps_sum"):
            if getattr(layer, flag, False):
                setattr(layer, flag, False)
    return writing_changes(dm)


@contextlib.contextmanager
def cudnn_tf32_off():
    """cuDNN's TF32 convolutions off inside the block (a float32 reference at full precision), restored after."""
    allow_tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = allow_tf32
