"""deltaconv: sparse delta inference for video CNNs.

``deltaconv.convert(model)`` turns a dense PyTorch CNN into a :class:`DeltaModel` that, after a
key frame, processes only the pixels that changed since the previous frame, with the dense
model's outputs.
"""
from .convert import ConversionError, convert
from .delta import Delta
from .model import DeltaModel
from .modules import *  # noqa: F401,F403 - the DC* layer classes
from .modules import __all__ as _modules_all
from .report import ConversionReport, NodeReport
from .calibrate import calibrate  # noqa: E402 - after the model classes it uses
from .detection import convert_backbone  # noqa: E402
from .onnx_models import load_onnx  # noqa: E402
from .tflite_models import load_tflite  # noqa: E402

__version__ = "0.1.0"
__all__ = ["convert", "convert_backbone", "calibrate", "load_onnx", "load_tflite", "DeltaModel", "Delta",
           "ConversionReport", "NodeReport", "ConversionError", *_modules_all]
