"""The row lists' storage of the four zoo models at 1080x1920: for every layer that holds a list
(``lists_rows``; a 1x1 convolution that passes its input's list on holds none), 4 x (1 + 2 N H W)
bytes for its output's [N, H, W], the shapes taken from one reference-backend frame on the CPU
(torchvision models without weights). Behind the README's "8.7-13.2 MiB per model" (*How it
works*, Row lists; 2026-11-23). Run from the repository root (a few minutes on 2 cores):
    PYTHONPATH=. python benchmarks/experiments/row_list_storage.py
"""
import torch
import torchvision

import deltaconv
from deltaconv.modules import DCConv2d

MODELS = {"resnet50": torchvision.models.resnet50, "mobilenet_v2": torchvision.models.mobilenet_v2,
          "fcn_resnet50": torchvision.models.segmentation.fcn_resnet50,
          "deeplabv3_mobilenet_v3_large": torchvision.models.segmentation.deeplabv3_mobilenet_v3_large}

for name, build in MODELS.items():
    kwargs = {"weights": None}
    if "_resnet50" in name or name.startswith("deeplab"):
        kwargs.update(weights_backbone=None, aux_loss=False)
    dm = deltaconv.convert(build(**kwargs).eval(), example_input=torch.randn(1, 3, 64, 96))
    shapes = {}
    for layer, module in dm.named_modules():
        if getattr(module, "lists_rows", False) and not isinstance(module, DCConv2d):
            module.register_forward_hook(lambda m, i, o, layer=layer: shapes.__setitem__(layer, o.value.shape))
    with torch.no_grad():
        dm(torch.randn(1, 3, 1080, 1920))
    total = sum(4 * (1 + 2 * s[0] * s[2] * s[3]) for s in shapes.values())
    print(f"{name}: {len(shapes)} listing layers, {total / 2**20:.1f} MiB", flush=True)
