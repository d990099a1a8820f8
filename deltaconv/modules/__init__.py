"""The converted layers (``DC*`` modules). Linear ones in :mod:`.linear`, stateful non-linear ones
in :mod:`.nonlinear`, spatial padding in :mod:`.padding`, the input sparsifier and output densifier
in :mod:`.boundary`; the frame context in :mod:`.base`, with the CUDA convolutions' counters of
:mod:`.work_counters`."""
from .base import DCModule, FrameContext
from .boundary import DCDensify, DCResample, DCSparsify
from .linear import (DCAdaptiveAvgPool2d, DCAdd, DCAvgPool2d, DCBatchNorm2d, DCConcatenate, DCConv2d,
                     DCConvTranspose2d, DCFunctionalConv2d, DCFunctionalLinear, DCLinear, DCLinearFunction,
                     DCPixelLinear, DCScale, DCShuffledConcatenate, DCSpatialMean, DCUpsample)
from .nonlinear import DCActivation, DCFallback, DCLayerNorm, DCMaxPool2d, DCMul
from .padding import DCPad2d
from .work_counters import WorkCounters

__all__ = ["DCModule", "FrameContext", "DCSparsify", "DCDensify", "DCResample", "DCConv2d", "DCConvTranspose2d",
           "DCLinear", "DCBatchNorm2d", "DCAvgPool2d", "DCAdaptiveAvgPool2d", "DCSpatialMean", "DCUpsample", "DCAdd", "DCScale",
           "DCLinearFunction", "DCPixelLinear", "DCFunctionalConv2d", "DCFunctionalLinear", "DCConcatenate",
           "DCShuffledConcatenate", "DCPad2d", "DCActivation", "DCMul", "DCMaxPool2d", "DCLayerNorm", "DCFallback", "WorkCounters"]
