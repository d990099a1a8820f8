"""``convert()``: one pass over a torch.fx trace of a dense model that swaps every op for its
delta layer (``rules.py`` says which), folds BatchNorm into convs, and inserts the input sparsifier
and the output densifiers."""
from __future__ import annotations

import copy
import operator
from collections import Counter
from functools import partial
from typing import Callable, Optional, Union

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.passes.shape_prop import ShapeProp
from torch.nn.modules.utils import _pair

from . import backends, onnx_models
from .exported import fold_constant_affines, fold_hardswish, fold_input_affines
from .backends.reference import check_truncation
from .modules import (DCActivation, DCAdd, DCConv2d, DCDensify, DCFallback, DCModule, DCMul, DCPad2d, DCResample,
                      DCSparsify)
from .modules.linear import (DCAdaptiveAvgPool2d, DCBatchNorm2d, DCConvTranspose2d, DCLinear, DCLinearFunction,
                             DCScale, DCUpsample, reshapes_samples)
from .modules.nonlinear import DCLayerNorm, DCMaxPool2d
from .layout import (CHANNELS_FIRST, LAYOUT_PERMUTE, fold_channel_shuffles, fold_shuffled_concatenations,
                     folded_note, keep_channels_first)
from .report import ConversionReport, NodeReport
from .rules import (CHANNELS_FIRST_RULES, FUNCTION_RULES, MODULE_RULES, PASSTHROUGH_CALLS, PASSTHROUGH_MODULES,
                    RANKED_MODULE_RULES, Built, Site, input_rank)

#: DC classes that carry the dense module's parameters under the same names (replace it in place)
_ADOPTING = (DCConv2d, DCConvTranspose2d, DCLinear, DCBatchNorm2d, DCLayerNorm)

#: Convolutions of fewer input channels stay in delta mode under ``recompute``. Since 2026-12-07 that is none:
#: the stems (3 input channels) recompute too. In delta mode a stem's activation summed the stem's changes,
#: each rounded to float16, in its float32 accumulator, and those roundings add up from frame to frame: on
#: MediaPipe's hand landmark model the landmarks were 7x further from float64 than the dense float16 model's
#: after 30 vtest frames at threshold 0 (3.9e-3 against 5.3e-4), 9.3e-4 with the stem recomputing (and the
#: file's input affine giving whole values, ``gives_whole``; ``benchmarks/results/stem_value_mode.txt``).
#: Speed: busy frames within 1-2 % either way, frames with nothing changed up to 5 % slower (their
#: tensor-core kernel reads the frame padded to 8 channels, which value mode pads at every active pixel;
#: H200, 2026-12-02, ``benchmarks/results/value_mode.txt`` section 17). 8 restores the delta-mode stems.
MIN_RECOMPUTE_CHANNELS = 1

#: Value mode through linear layers' outputs as well ("whole sums"): a 1x1 convolution whose readers all
#: take whole values keeps its whole output, and an add not fused with an activation whose operands are
#: both whole and whose readers all take whole values keeps its whole sum (``DCAdd.keeps_sum``), so that
#: the convolutions after them recompute (MobileNet's projections, the adds between its blocks and its
#: expansions): mobilenet_v2 on vtest.avi 5-7 % faster per frame, its state 43 % smaller (H200,
#: 2026-12-01, ``benchmarks/results/value_mode.txt`` section 11). ``False`` (as before that day): a
#: convolution keeps its output only for the activation fused with a residual add after it.
WHOLE_SUMS = True

#: Value mode through products as well ("whole products"): a product whose operands both give whole values
#: (MobileNetV3's and EfficientNet's squeeze-excite scaling: the scale and the feature map, activations'
#: outputs) computes its new output from them and keeps no accumulators (``DCMul.takes_whole``):
#: mobilenet_v3_large, deeplabv3_mobilenet_v3_large and efficientnet_b0 2-8 % faster per frame on vtest.avi
#: (1-7 % on one-by-one), their state 16-31 % smaller (H200, 2026-12-02, ``benchmarks/results/value_mode.txt``
#: section 12). ``False`` (as before that day): the products keep accumulators and run in delta mode.
WHOLE_PRODUCTS = True

#: Value mode through max pooling ("whole max pooling"): a max pooling whose input gives whole values (an
#: activation's sent values: ResNet's stem ReLU) pools them and keeps no accumulator
#: (``DCMaxPool2d.takes_whole``); its input activation is then read only as whole values too (see
#: ``SKIP_UNREAD_CHANGES``): resnet50 3.0-3.3 % faster per frame on vtest.avi, its state 127 MiB smaller at
#: 1080x1920 (H200, 2026-12-02, ``benchmarks/results/value_mode.txt`` section 15). ``False``: the max
#: poolings keep float32 accumulators of their inputs.
WHOLE_MAX_POOLING = True

#: Value mode through a classifier's head ("whole heads"): a global average pooling of a layer that keeps its
#: whole values (an activation), read only by reshapes, linear layers, activations and the outputs, pools
#: those whole values and the linear layers after it compute their whole outputs from them, which the outputs
#: return as they are (``DCAdaptiveAvgPool2d.takes_whole``, ``DCDensify.takes_whole``): no rounded changes of
#: the mean and the logits summed in float32 accumulators. float16 resnet18 and resnet50 at threshold 0 came
#: 1.21x and 1.13x the dense model's error against float64, nearly all of it from their heads (1.02x and 0.99x
#: with whole heads; this CPU, 2026-12-07, ``benchmarks/results/stem_value_mode.txt``). The cost on an H100:
#: busy frames within noise, frames with nothing changed 10-17 us slower (the pooling reads the whole map).
#: ``False``: delta mode.
WHOLE_HEADS = True

#: An activation whose readers all take its whole values (convolutions in value mode, adds keeping whole
#: sums, products taking whole operands, adds fused with their activation that sum whole operands: 34 of
#: mobilenet_v2's 35, 47 of resnet50's 49) does not write its changes, only its ``sent``
#: (``DCActivation.changes_unread``; on the CUDA kernels, on frames without TF32 sends): vtest's busy
#: frames 1.2-1.7 % (mobilenet_v2) to 5.9-7.5 % (fcn_resnet50) faster (H200, 2026-12-02,
#: ``benchmarks/results/value_mode.txt`` sections 13 and 14).
SKIP_UNREAD_CHANGES = True


class ConversionError(RuntimeError):
    """Raised by ``convert()`` when torch.fx cannot trace the model, and by ``convert(...,
    strict=True)`` when some op has no delta rule."""


class _ScopedTracer(fx.Tracer):
    """A tracer that records, for every node, the path of the module whose forward created it
    (``node.meta["dc_scope"]``), so functional ops get names like ``layer1.0.add``."""

    def __init__(self, leaf_modules: tuple = ()) -> None:
        # onnx_div and onnx_prelu (ONNX's Div and PRelu, recorded by traced_forward) stay one call each when a
        # traced model is retraced
        super().__init__(autowrap_functions=(onnx_models.onnx_div, onnx_models.onnx_prelu))
        self.leaf_modules = tuple(leaf_modules)

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, self.leaf_modules) or super().is_leaf_module(m, qualname)

    def create_node(self, *args, **kwargs):
        node = super().create_node(*args, **kwargs)
        node.meta["dc_scope"] = self.scope.module_path
        return node

    def call_module(self, m: nn.Module, forward, args, kwargs):
        # onnx2torch's ops that branch on their inputs in Python trace as the torch calls they make
        return super().call_module(m, onnx_models.traced_forward(self, m, forward), args, kwargs)


def _target_name(node: fx.Node, root: nn.Module) -> str:
    if node.op == "call_module":
        return f"{type(root.get_submodule(node.target)).__name__}:{node.target}"
    if node.op == "call_method":
        return f".{node.target}()"
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return str(node.target)


class _Converter:
    """Rewrites ``graph`` (traced from ``root``) in place; registers DC layers inside ``root``."""

    def __init__(self, root: nn.Module, graph: fx.Graph, dense_tail: bool = False, fold_bn: bool = True) -> None:
        self.root, self.graph = root, graph
        self.dense_tail = dense_tail  # resample the dense output where a model ends in upsampling
        self.fold_bn = fold_bn  # fold a BatchNorm into the conv before it (else it keeps a layer of its own)
        self.report = ConversionReport()
        self.delta_nodes: set[fx.Node] = set()
        self.first_site: dict[str, DCModule] = {}
        self.dense_sources: dict[str, nn.Module] = {}  # path of a replaced module -> the dense module

    # -------------------------------------------------------------- placement
    def _register(self, scope: str, base: str, module: nn.Module) -> str:
        parent = self.root.get_submodule(scope) if scope else self.root
        base = base.replace(".", "_").strip("_") or "op"
        name, i = base, 1
        while hasattr(parent, name):
            name, i = f"{base}_{i}", i + 1
        parent.add_module(name, module)
        return f"{scope}.{name}" if scope else name

    def _replace(self, path: str, module: nn.Module) -> str:
        parent_path, _, leaf = path.rpartition(".")
        setattr(self.root.get_submodule(parent_path) if parent_path else self.root, leaf, module)
        return path

    def _swap(self, node: fx.Node, path: str, args, kwargs) -> fx.Node:
        with self.graph.inserting_before(node):
            new = self.graph.call_module(path, tuple(args), dict(kwargs))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        self.graph.erase_node(node)
        self.delta_nodes.discard(node)
        self.delta_nodes.add(new)
        return new

    def _note(self, node: fx.Node, status: str, layer: str = "", module: Optional[nn.Module] = None,
              note: str = "", target: Optional[str] = None) -> None:
        self.report.nodes.append(NodeReport(node.name, target or _target_name(node, self.root), status, layer,
                                            type(module).__name__ if module is not None else "", note))

    # -------------------------------------------------------------- classification
    def _classify(self) -> None:
        for node in self.graph.nodes:
            has_tensor = "tensor_meta" in node.meta
            if node.op == "placeholder":
                if has_tensor:
                    self.delta_nodes.add(node)
            elif node.op in ("call_module", "call_function", "call_method"):
                if has_tensor and any(i in self.delta_nodes for i in node.all_input_nodes):
                    self.delta_nodes.add(node)

    # -------------------------------------------------------------- in-place ops
    def _resolve_inplace(self) -> None:
        """Readers of a tensor that an in-place op mutated (``ReLU(inplace=True)``, ``relu_``,
        ``+=``) see the mutated value in the dense model: make them read the op's result. (Views
        of the mutated tensor taken before the op are not tracked.)"""
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        for node in list(self.graph.nodes):
            if not self._is_inplace(node):
                continue
            target = node.args[0] if node.args else None
            if not isinstance(target, fx.Node) or "tensor_meta" not in target.meta:
                continue
            for user in list(target.users):
                if user is not node and order[user] > order[node]:
                    user.replace_input_with(target, node)

    def _is_inplace(self, node: fx.Node) -> bool:
        if node.op == "call_module":
            return bool(getattr(self.root.get_submodule(node.target), "inplace", False))
        if node.op == "call_method":
            return node.target.endswith("_") and not node.target.startswith("_")
        if node.op == "call_function":
            if node.kwargs.get("inplace") is True:
                return True
            if node.target in (operator.iadd, operator.isub, operator.imul, operator.itruediv):
                return True
            name = getattr(node.target, "__name__", "")
            return name.endswith("_") and not name.startswith("_")
        return False

    # -------------------------------------------------------------- the pass
    def run(self) -> ConversionReport:
        self.call_sites = Counter(n.target for n in self.graph.nodes if n.op == "call_module")
        self._resolve_inplace()
        self._classify()
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder" and n in self.delta_nodes]
        for node in list(self.graph.nodes):
            if getattr(node, "_erased", False):  # a BatchNorm folded into its conv
                continue
            if node.op == "placeholder":
                if node in self.delta_nodes:
                    self._input(node, "input" if len(placeholders) == 1 else f"input_{node.name}")
                continue
            if node.op == "output":
                self._output(node)
                continue
            if node.op == "get_attr":
                self._note(node, "static")
                continue
            if node not in self.delta_nodes:
                reads = any(i in self.delta_nodes for i in node.all_input_nodes)
                self._note(node, "shape" if reads else "static")
                continue
            if node.op == "call_module":
                self._module_site(node)
            else:
                self._function_site(node)
        self.graph.lint()
        return self.report

    def _input(self, node: fx.Node, name: str) -> None:
        sparsify = DCSparsify()
        path = self._register("", name, sparsify)
        with self.graph.inserting_after(node):
            new = self.graph.call_module(path, (node,))
        node.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
        new.meta = dict(node.meta)
        self.delta_nodes.add(new)
        self._note(node, "input", path, sparsify, target="frames")

    def _output(self, node: fx.Node) -> None:
        done: dict[fx.Node, fx.Node] = {}
        moved: list[fx.Node] = []

        def densify(n: fx.Node) -> fx.Node:
            if n not in self.delta_nodes:
                return n
            if n in done:
                return done[n]
            up = self._dense_tail_upsample(n)
            if up is not None:  # resample the dense output instead of the deltas
                src = densify(n.args[0])
                resample = DCResample.from_upsample(up)
                scope, _, leaf = n.target.rpartition(".")
                path = self._register(scope, f"{leaf}_dense", resample)
                with self.graph.inserting_before(node):
                    out = self.graph.call_module(path, (src,), dict(n.kwargs))
                out.meta = dict(n.meta)
                for r in self.report.nodes:
                    if r.layer == n.target:
                        r.status, r.layer, r.dc_class = "dense", path, "DCResample"
                        r.note = "resamples the dense output, after the densifier"
                moved.append(n)
            else:
                module = DCDensify()
                path = self._register("", f"output_{n.name}" if n.op != "call_module" else "output", module)
                with self.graph.inserting_before(node):
                    out = self.graph.call_module(path, (n,))
                source = n.target if n.op == "call_module" else n.name  # the layer it densifies, by its path
                self.report.nodes.append(NodeReport(out.name, source, "output", path, "DCDensify"))
            done[n] = out
            return out
        node.args = fx.node.map_arg(node.args, densify)
        for n in reversed(moved):  # outermost first: each then has no reader left
            self.graph.erase_node(n)
            self.delta_nodes.discard(n)

    def _dense_tail_upsample(self, n: fx.Node) -> Optional[DCUpsample]:
        """The DCUpsample that node ``n`` calls when the model's output is its only reader and its
        input is a delta tensor (``dense_tail``): then the densifier goes before it and the
        resampling runs dense on the accumulated output, which reads the smaller map and writes the
        output once, as the densifier would (the segmentation models' final ``F.interpolate``)."""
        if not self.dense_tail or n.op != "call_module" or len(n.users) != 1 or not n.args:
            return None
        up = self.root.get_submodule(n.target)
        if not isinstance(up, DCUpsample) or self.call_sites.get(n.target, 0) > 1:
            return None
        src = n.args[0]
        if not isinstance(src, fx.Node) or src not in self.delta_nodes or "tensor_meta" not in src.meta:
            return None
        return up

    def _module_site(self, node: fx.Node) -> None:
        path = node.target
        dense = self.root.get_submodule(path)
        if isinstance(dense, PASSTHROUGH_MODULES):
            node.replace_all_uses_with(node.args[0])
            self.graph.erase_node(node)
            self._note(node, "removed", note="identity in eval", target=f"{type(dense).__name__}:{path}")
            return
        if path in self.first_site and not self.first_site[path].truncates:
            module = self.first_site[path]  # a stateless layer serves every call site
            self._swap(node, path, node.args, node.kwargs)
            source = self.dense_sources.get(path, dense)  # name the dense module, not its DC replacement
            self._note(node, "converted", path, module, note="shared call site",
                       target=f"{type(source).__name__}:{path}")
            return
        if isinstance(dense, DCModule):  # the first site already replaced it; build a twin from the rule
            dense = self.dense_sources[path]
        target = f"{type(dense).__name__}:{path}"
        bn_node = self._foldable_bn(node, dense)
        rule = MODULE_RULES.get(type(dense))
        if type(dense) in RANKED_MODULE_RULES:
            rule = partial(RANKED_MODULE_RULES[type(dense)], rank=input_rank(node.args[0]) if node.args else None)
        if node.meta.get(CHANNELS_FIRST):  # on a channels-last view, run channels-first (deltaconv.layout)
            rule = CHANNELS_FIRST_RULES.get(type(dense), rule)
        if bn_node is not None:
            folding = DCConvTranspose2d if isinstance(dense, nn.ConvTranspose2d) else DCConv2d
            module = folding.from_dense(dense, bn=self.root.get_submodule(bn_node.target))
        else:
            module = rule(dense) if rule is not None and not node.kwargs else None
        if module is None:
            fallback = DCFallback(dense, type(dense).__name__)
            scope, _, leaf = path.rpartition(".")
            new_path = self._register(scope, f"{leaf}_fallback", fallback)
            self._swap(node, new_path, node.args, node.kwargs)
            self._note(node, "fallback", new_path, fallback, note="no delta rule", target=target)
            return
        param_free = next(dense.parameters(), None) is None and next(dense.buffers(), None) is None
        if path not in self.first_site and (isinstance(module, _ADOPTING) or param_free):
            new_path = self._replace(path, module)
        else:
            scope, _, leaf = path.rpartition(".")
            new_path = self._register(scope, leaf, module)
        self.first_site.setdefault(path, module)
        self.dense_sources[new_path] = dense
        new = self._swap(node, new_path, node.args, {})
        self._note(node, "converted", new_path, module,
                   note="BatchNorm folded" if bn_node is not None else "", target=target)
        if bn_node is not None:
            bn_node.replace_all_uses_with(new)
            self.graph.erase_node(bn_node)
            self.delta_nodes.discard(bn_node)
            self._note(bn_node, "folded", new_path, note=f"into {path}",
                       target=f"BatchNorm2d:{bn_node.target}")

    def _foldable_bn(self, node: fx.Node, dense: nn.Module) -> Optional[fx.Node]:
        """The BatchNorm node to fold into this conv: its only user, and both modules called at one
        site only (a shared conv or BN keeps them apart, so every site stays right)."""
        transposed = type(dense) is nn.ConvTranspose2d and dense.groups == 1  # one group: its weight's dim 1
        if not self.fold_bn or not (type(dense) is nn.Conv2d or transposed):
            return None
        if len(node.users) != 1 or self.call_sites[node.target] != 1:
            return None
        user = next(iter(node.users))
        if user.op != "call_module" or user.args != (node,) or user.kwargs or self.call_sites[user.target] != 1:
            return None
        bn = self.root.get_submodule(user.target)
        if type(bn) is not nn.BatchNorm2d or bn.running_mean is None or bn.num_features != dense.out_channels:
            return None
        return user

    def _function_site(self, node: fx.Node) -> None:
        if node.op == "call_method":
            key, name = f"method:{node.target}", node.target
            fn = getattr(torch.Tensor, node.target, None)
        else:
            key, fn = node.target, node.target
            name = getattr(fn, "__name__", str(fn))
        scope = node.meta.get("dc_scope", "")
        if node.op == "call_function" and fn is operator.getitem and not _tensor_input(node):
            self._note(node, "converted", note="item of a delta container")  # e.g. a chunk of split()
            return
        if node.meta.get(LAYOUT_PERMUTE):
            node.replace_all_uses_with(node.args[0])
            self.graph.erase_node(node)
            self.delta_nodes.discard(node)
            self._note(node, "removed", note="channels-last view kept channels-first (deltaconv.layout)")
            return
        if self._passthrough(key, node):
            node.replace_all_uses_with(node.args[0])
            self.graph.erase_node(node)
            self.delta_nodes.discard(node)
            self._note(node, "removed", note="identity in eval")
            return
        builder = FUNCTION_RULES.get(key)
        built: Optional[Built] = None
        if builder is not None:
            built = builder(Site(node, fn, name, self.delta_nodes))
        if built is None:
            caller = fn if node.op == "call_function" else _MethodCaller(node.target)
            module = DCFallback(caller, name)
            path = self._register(scope, f"{name}_fallback", module)
            self._swap(node, path, node.args, node.kwargs)
            self._note(node, "fallback", path, module, note="no delta rule for this call")
            return
        path = self._register(scope, name, built.module)
        self._swap(node, path, built.args, built.kwargs)
        self._note(node, "converted", path, built.module, note=folded_note(node))

    # -------------------------------------------------------------- fusion
    def _module_sites(self) -> Counter:
        """How many call sites each converted layer has in the graph."""
        return Counter(n.target for n in self.graph.nodes if n.op == "call_module")

    def _note_pair(self, a: str, note_a: str, b: str, note_b: str) -> None:
        """Append ``note_a`` to layer ``a``'s report entry and ``note_b`` to ``b``'s."""
        self._append_note(a, note_a)
        self._append_note(b, note_b)

    def _append_note(self, layer: str, note: str) -> None:
        """Append ``note`` to layer ``layer``'s report entry (its first: a folded BatchNorm's entry
        follows its convolution's)."""
        entry = next((n for n in self.report.nodes if n.layer == layer), None)
        if entry is not None:
            entry.note = (entry.note + "; " if entry.note else "") + note

    def _activation_of(self, user: fx.Node, node: fx.Node) -> bool:
        """Whether ``user`` calls a ``DCActivation`` on ``node`` as its one delta argument (a PReLU's slopes
        per call, not deltas, may follow it; no keyword arguments)."""
        return (user.op == "call_module" and not user.kwargs and user.args[:1] == (node,)
                and not any(isinstance(a, fx.Node) and a in self.delta_nodes for a in user.args[1:])
                and isinstance(self.root.get_submodule(user.target), DCActivation))

    def _lone_activation_reader(self, node: fx.Node, sites: Counter) -> Optional[fx.Node]:
        """The activation (a ``DCActivation`` called at one site) that is ``node``'s only reader and
        takes it as its only delta argument (:meth:`_activation_of`), or ``None``."""
        if len(node.users) != 1:
            return None
        user = next(iter(node.users))
        return user if self._activation_of(user, node) and sites[user.target] == 1 else None

    def fuse_add_activation(self) -> None:
        """Mark each add of two deltas whose only reader is the activation after it (a residual
        block's ``relu(out + identity)``) as fused with it (``DCAdd.fuse_with_next``): the
        activation then runs the add in its own pass. Both layers keep their names, thresholds and
        statistics; the report notes the pair. Only adds called at one site, of equal shapes and
        dtypes (no broadcasting)."""
        sites = self._module_sites()
        for node in self.graph.nodes:
            if node.op != "call_module" or sites[node.target] != 1 or len(node.args) != 2 or node.kwargs:
                continue
            add = self.root.get_submodule(node.target)
            if not isinstance(add, DCAdd) or not self._equal_delta_operands(node) or len(node.users) != 1:
                continue
            user = self._lone_activation_reader(node, sites)
            if user is None:
                continue
            add.fuse_with_next = True
            self._note_pair(node.target, f"fused with {user.target}", user.target, f"fused with {node.target}")

    def link_row_lists(self) -> None:
        """Mark each layer that can list its output's active pixels (an activation, a product, a layer
        norm, an add not fused with the activation after it, or a 1x1 convolution that itself runs on a
        list) and whose output 1x1 convolutions of stride 1, no padding and one group read (all of
        them share the list): ``lists_rows`` on the layer, ``DCConv2d.takes_rows`` on the
        convolutions. On the CUDA backend those convolutions then need no mask pass of their own.
        Only layers called at one site; the report notes the pairs."""
        sites = self._module_sites()
        for node in self.graph.nodes:  # in order: a convolution's takes_rows is set before it is a producer
            if node.op != "call_module" or sites[node.target] != 1:
                continue
            layer = self.root.get_submodule(node.target)
            if not (isinstance(layer, (DCActivation, DCMul, DCLayerNorm))
                    or (isinstance(layer, DCAdd) and not layer.fuse_with_next)
                    or (isinstance(layer, DCConv2d) and layer.takes_rows)):
                continue
            for user in node.users:  # every such reader takes the same list
                if user.op != "call_module" or sites[user.target] != 1 or user.args[:1] != (node,):
                    continue
                conv = self.root.get_submodule(user.target)
                if not (isinstance(conv, DCConv2d) and conv.row_list_ok()):
                    continue
                layer.lists_rows = conv.takes_rows = True
                self._note_pair(node.target, f"lists rows for {user.target}", user.target, f"rows from {node.target}")

    def mark_recomputing(self) -> None:
        """Value mode: mark the convolutions that compute their whole new output on the active pixels
        from their input's whole values, and the adds that keep whole sums, wherever every reader of
        such an output takes whole values; the activations after them then keep no float32
        accumulator. Whole values are what a layer keeping them gives (``Delta.whole``: an activation,
        a max pooling, the input sparsifier) or a layer marked here. A convolution (a ``DCConv2d`` of at
        least ``MIN_RECOMPUTE_CHANNELS`` input channels) on such an input is marked

        - *recomputing* (``DCConv2d.recomputes``) when its only reader is an activation not fused
          with an add;
        - *keeping its output* (``DCConv2d.keeps_output``, 1x1 convolutions only) when its only reader
          is a residual add fused with its activation whose other operand is whole too (the
          activation then sums the two whole operands: a ResNet bottleneck's conv3, its downsampling
          identity), or, with ``WHOLE_SUMS``, when all its readers take whole values.

        With ``WHOLE_SUMS`` an add not fused with an activation whose operands are both whole and
        whose readers all take whole values keeps its sum (``DCAdd.keeps_sum``). Readers that take
        whole values: activations, such convolutions and adds, and a fused add whose operands are
        both whole. The marks are the largest set that satisfies these rules (a fixed point: a
        projection keeps its output for the next block's expansion only if that recomputes). Only
        layers called at one site; the report notes the pairs."""
        sites = self._module_sites()
        convs, adds = {}, {}  # the candidates still marked: node -> layer
        for node in self.graph.nodes:
            if node.op != "call_module" or sites[node.target] != 1:
                continue
            layer = self.root.get_submodule(node.target)
            if (type(layer) is DCConv2d and layer.in_channels >= MIN_RECOMPUTE_CHANNELS and len(node.args) == 1
                    and not node.kwargs and isinstance(node.args[0], fx.Node)):
                convs[node] = layer
            elif (WHOLE_SUMS and isinstance(layer, DCAdd) and not layer.fuse_with_next and len(node.args) == 2
                  and not node.kwargs and self._equal_delta_operands(node)):
                adds[node] = layer

        def whole(node) -> bool:
            return self._keeps_whole(node) or node in convs or node in adds

        def takes_whole(user, node) -> bool:  # whether reader `user` of `node` takes whole values
            if user in convs or user in adds:
                return True
            if self._fused_add(user):
                return all(whole(a) for a in user.args)
            return self._activation_of(user, node)

        lone = {node: self._lone_activation_reader(node, sites) for node in convs}  # the recomputing ones' readers

        def keeps(node, layer) -> bool:  # a convolution keeping its output: its readers take whole values
            if not layer.is_pointwise() or not node.users:
                return False
            if not WHOLE_SUMS and not (len(node.users) == 1 and self._fused_add(next(iter(node.users)))):
                return False
            return all(takes_whole(u, node) for u in node.users)

        changed = True
        while changed:  # drop the candidates whose rules fail until none does
            changed = False
            for node, layer in list(convs.items()):
                if not whole(node.args[0]) or (lone[node] is None and not keeps(node, layer)):
                    del convs[node]
                    changed = True
            for node in list(adds):
                if not all(whole(a) for a in node.args) or not node.users or not all(
                        takes_whole(u, node) for u in node.users):
                    del adds[node]
                    changed = True
        for node, layer in convs.items():
            user = lone[node]
            if user is not None:
                layer.recomputes = True
                self._note_pair(node.target, f"recomputes for {user.target}", user.target,
                                f"recomputed by {node.target}")
                continue
            layer.keeps_output = True
            for user in node.users:
                if user in adds or user in convs:
                    self._note_pair(node.target, f"output kept for {user.target}", user.target,
                                    f"reads the kept output of {node.target}")
                else:  # an add fused with its activation
                    act = next(iter(user.users))
                    self._note_pair(node.target, f"recomputes for {act.target} (output kept, summed by {user.target})",
                                    act.target, f"recomputed by {node.target} through {user.target}")
        for node, layer in adds.items():
            layer.keeps_sum = True
            for user in node.users:
                self._note_pair(node.target, f"sum kept for {user.target}", user.target,
                                f"reads the kept sum of {node.target}")
        if WHOLE_PRODUCTS:
            self._mark_whole_products(sites, whole)
        if WHOLE_MAX_POOLING:
            self._mark_whole_max_pooling(sites)
        if WHOLE_HEADS:
            self._mark_whole_heads(sites)
        self._mark_whole_givers()
        if SKIP_UNREAD_CHANGES:
            self._mark_unread_changes(sites)

    def _mark_unread_changes(self, sites: dict) -> None:
        """``SKIP_UNREAD_CHANGES``: mark the activations (called at one site, fused with an add or not)
        whose readers are all layers taking whole values (``DCActivation.changes_unread``): convolutions
        in value mode, adds keeping whole sums, products and max poolings taking whole values, and adds fused with
        their activation that sum whole operands (an operand is a convolution keeping its output or a
        kept sum: ``ops.add_activation_values``, a ResNet bottleneck's identity), and paddings whose
        readers all are such layers (they pad the whole values only)."""
        def reads_whole(user: fx.Node) -> bool:
            if user.op != "call_module" or sites[user.target] != 1:
                return False
            if isinstance(self.root.get_submodule(user.target), DCPad2d):
                return bool(user.users) and all(reads_whole(u) for u in user.users)
            return self._takes_whole_values(user)
        for node in self.graph.nodes:
            if node.op != "call_module" or sites[node.target] != 1 or not node.users:
                continue
            layer = self.root.get_submodule(node.target)
            if isinstance(layer, DCActivation) and all(reads_whole(u) for u in node.users):
                layer.changes_unread = True

    def _mark_whole_products(self, sites: dict, whole: Callable[[fx.Node], bool]) -> None:
        """``WHOLE_PRODUCTS``: mark the products (``DCMul``, called at one site) whose two operands are
        changing tensors that give whole values (``whole``: ``mark_recomputing``'s test) as taking
        them (``DCMul.takes_whole``); the report notes it."""
        for node in self.graph.nodes:
            if node.op != "call_module" or sites[node.target] != 1 or len(node.args) != 2 or node.kwargs:
                continue
            layer = self.root.get_submodule(node.target)
            if isinstance(layer, DCMul) and all(a in self.delta_nodes and whole(a) for a in node.args):
                layer.takes_whole = True
                self._append_note(node.target, "takes its operands' whole values (no accumulators)")

    def _mark_whole_max_pooling(self, sites: dict) -> None:
        """``WHOLE_MAX_POOLING``: mark the max poolings (called at one site) whose input is a changing
        tensor that a layer keeping whole values gives (``_keeps_whole``) as pooling them
        (``DCMaxPool2d.takes_whole``); the report notes it."""
        for node in self.graph.nodes:
            if node.op != "call_module" or sites[node.target] != 1 or len(node.args) != 1 or node.kwargs:
                continue
            layer = self.root.get_submodule(node.target)
            arg = node.args[0]
            if isinstance(layer, DCMaxPool2d) and arg in self.delta_nodes and self._keeps_whole(arg):
                layer.takes_whole = True
                self._append_note(node.target, "pools its input's whole values (no accumulator)")

    def _mark_whole_heads(self, sites: dict) -> None:
        """``WHOLE_HEADS``: mark the global average poolings (called at one site) of a layer keeping whole values
        (``_keeps_whole``) whose readers, and theirs, are only per-sample reshapes, linear layers, activations and
        outputs (:meth:`_head_after`) as pooling whole values (``DCAdaptiveAvgPool2d.takes_whole``), and those
        outputs as returning them (``DCDensify.takes_whole``); the report notes both."""
        for node in self.graph.nodes:
            if node.op != "call_module" or sites[node.target] != 1 or len(node.args) != 1 or node.kwargs:
                continue
            layer = self.root.get_submodule(node.target)
            arg = node.args[0]
            if not (isinstance(layer, DCAdaptiveAvgPool2d) and tuple(_pair(layer.output_size)) == (1, 1)
                    and arg in self.delta_nodes and self._keeps_whole(arg)):
                continue
            outputs = self._head_after(node, sites)
            if not outputs:
                continue
            layer.takes_whole = True
            self._append_note(node.target, "pools its input's whole values (a whole head)")
            for out in outputs:
                self.root.get_submodule(out.target).takes_whole = True
                self._append_note(out.target, "returns the whole head's values")

    def _head_after(self, node: fx.Node, sites: dict) -> Optional[list]:
        """The output nodes (``DCDensify``) that ``node``'s readers reach through per-sample reshapes (to ``[N, K,
        1, ...]`` as traced: one row per sample), linear layers and activations only, each called at one site;
        ``None`` where any other reader is on the way."""
        outputs, todo, seen = [], list(node.users), set()
        while todo:
            user = todo.pop()
            if user in seen:
                continue
            seen.add(user)
            if user.op != "call_module" or sites.get(user.target) != 1:
                return None
            layer = self.root.get_submodule(user.target)
            if isinstance(layer, DCDensify):
                outputs.append(user)
                continue
            meta = user.meta.get("tensor_meta")
            per_sample = meta is not None and len(meta.shape) >= 2 and all(n == 1 for n in meta.shape[2:])
            if not (isinstance(layer, (DCLinear, DCActivation))
                    or (isinstance(layer, DCLinearFunction) and reshapes_samples(layer.fn) and per_sample)):
                return None
            todo.extend(user.users)
        return outputs or None

    def _equal_delta_operands(self, node: fx.Node) -> bool:
        """Whether ``node``'s arguments are changing tensors (deltas) of one shape and dtype."""
        metas = [a.meta.get("tensor_meta") if isinstance(a, fx.Node) and a in self.delta_nodes else None
                 for a in node.args]
        return (None not in metas and tuple(metas[0].shape) == tuple(metas[1].shape)
                and metas[0].dtype == metas[1].dtype)

    def _fused_add(self, node: fx.Node) -> bool:
        """Whether ``node`` is an add fused with the activation after it (``DCAdd.fuse_with_next``)."""
        if node.op != "call_module":
            return False
        layer = self.root.get_submodule(node.target)
        return isinstance(layer, DCAdd) and layer.fuse_with_next

    def _keeps_whole(self, node) -> bool:
        """Whether ``node`` is a layer whose output delta gives its whole values (``Delta.whole``: an
        activation, a max pooling, the input sparsifier; with ``WHOLE_SUMS`` a product too, the
        squeeze-excite scaling before a projection; a padding of such a layer, which pads them too)."""
        kinds = (DCActivation, DCMaxPool2d, DCSparsify) + ((DCMul,) if WHOLE_SUMS else ())
        if not (isinstance(node, fx.Node) and node.op == "call_module"):
            return False
        layer = self.root.get_submodule(node.target)
        if isinstance(layer, DCPad2d):
            return len(node.args) == 1 and self._keeps_whole(node.args[0])
        operand = self._static_operation_input(node)
        if operand is not None:
            return self._keeps_whole(operand)
        return isinstance(layer, kinds)

    def _takes_whole_values(self, node: fx.Node) -> bool:
        """Whether layer ``node`` (marked by value mode) reads its operands' whole values: a convolution that
        recomputes or keeps its output, an add keeping its sum, a product or max pooling taking whole values, an
        add fused with its activation with an operand kept whole (a convolution keeping its output or a kept sum:
        ``ops.add_activation_values``, a ResNet bottleneck's identity)."""
        def keeps(arg) -> bool:  # a layer whose output is kept whole (Delta.recomputed)
            if not isinstance(arg, fx.Node) or arg.op != "call_module":
                return False
            layer = self.root.get_submodule(arg.target)
            return (type(layer) is DCConv2d and layer.keeps_output) or (isinstance(layer, DCAdd) and layer.keeps_sum)

        layer = self.root.get_submodule(node.target)
        return ((type(layer) is DCConv2d and (layer.recomputes or layer.keeps_output))
                or (isinstance(layer, DCAdd) and layer.keeps_sum)
                or (isinstance(layer, (DCMul, DCMaxPool2d, DCAdaptiveAvgPool2d, DCDensify)) and layer.takes_whole)
                or (self._fused_add(node) and any(keeps(a) for a in node.args)))

    def _static_operation_input(self, node: fx.Node) -> Optional[fx.Node]:
        """The changing operand of ``node`` when it is a product with or sum with a static operand (``DCScale``, a
        ``DCAdd`` of one changing tensor), which can give its whole output (``gives_whole``); else ``None``. Each
        such call has a layer of its own (a function call converted), so the mark is per call."""
        layer = self.root.get_submodule(node.target)
        if not isinstance(layer, (DCScale, DCAdd)) or node.kwargs:
            return None
        changing = [a for a in node.args if isinstance(a, fx.Node) and a in self.delta_nodes]
        return changing[0] if len(changing) == 1 and len(node.args) == 2 else None

    def _mark_whole_givers(self) -> None:
        """Set ``gives_whole`` on the static products and sums (:meth:`_static_operation_input`) whose whole
        output a layer taking whole values reads (through paddings and other such layers): a model file's
        input affine before its stem, which then recomputes instead of summing rounded changes; and
        ``whole_from_frame`` on an input sparsifier read so."""
        def give(node) -> None:
            if not (isinstance(node, fx.Node) and node.op == "call_module"):
                return
            layer = self.root.get_submodule(node.target)
            if isinstance(layer, DCSparsify):
                if not layer.whole_from_frame:
                    self._append_note(node.target, "gives the frame's values whole")
                layer.whole_from_frame = True
                return
            if isinstance(layer, DCPad2d) and len(node.args) == 1:
                give(node.args[0])
            operand = self._static_operation_input(node)
            if operand is not None and self._keeps_whole(operand):
                if not layer.gives_whole:
                    self._append_note(node.target, "gives its whole output")
                layer.gives_whole = True
                give(operand)

        for node in self.graph.nodes:
            if node.op == "call_module" and self._takes_whole_values(node):
                for arg in node.args:
                    give(arg)

    def _passthrough(self, key, node: fx.Node) -> bool:
        if key not in PASSTHROUGH_CALLS:
            return False
        position = PASSTHROUGH_CALLS[key]
        if position is None:
            return not node.kwargs and len(node.args) == 1
        training = node.kwargs.get("training", node.args[position] if len(node.args) > position else True)
        return training is False


class _MethodCaller:
    """Calls tensor method ``name`` on its first argument (fallback for ``call_method`` nodes)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.__name__ = name

    def __call__(self, obj, *args, **kwargs):
        return getattr(obj, self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f".{self.name}()"


def _tensor_input(node: fx.Node) -> bool:
    first = node.args[0]
    t = first.meta.get("type") if isinstance(first, fx.Node) else None
    return t is not None and issubclass(t, torch.Tensor)


def _example_failed_message(model: nn.Module, examples, error: Exception) -> str:
    """What to do when ``model`` fails on the example input while its shapes are propagated."""
    cause = error.__cause__ or error  # ShapeProp wraps the model's own exception
    reason = str(cause).strip().splitlines()[0] if str(cause).strip() else "no message"
    shapes = ", ".join(f"{tuple(e.shape)} {str(e.dtype).replace('torch.', '')}" if torch.is_tensor(e) else repr(e)
                       for e in examples)
    return (f"convert: {type(model).__name__} failed on example_input ({shapes}) while its shapes were propagated "
            f"({type(cause).__name__}: {reason}); pass example_input= a frame of the size and dtype the model will "
            "see (the model must accept it)")


def _untraceable_message(model: nn.Module, error: Exception) -> str:
    """What to do when torch.fx cannot trace ``model``: convert the part that sees each frame once."""
    name = type(model).__name__
    reason = str(error).strip().splitlines()[0] if str(error).strip() else "no message"
    if isinstance(getattr(model, "backbone", None), nn.Module):
        part = (f"deltaconv.convert_backbone(model, example_input) converts the backbone of {name} and keeps "
                "its heads dense (detectors and pose models; README, Detection and pose)")
    else:
        part = "convert the part of the model that runs once per frame on the image"
    return (f"convert: torch.fx cannot trace {name} ({type(error).__name__}: {reason}); {part}, or name the "
            "blocks torch.fx cannot trace in leaf_modules= (they then run dense)")


def _example_for(model: nn.Module) -> torch.Tensor:
    p = next(model.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    dtype = p.dtype if p is not None and p.is_floating_point() else torch.float32
    return torch.randn(1, 3, 224, 224, device=device, dtype=dtype)


def convert(model: nn.Module, threshold: float = 0.0, backend: str = "auto", *,
            thresholds: Union[None, dict, str] = None, strict: bool = False,
            example_input: Optional[torch.Tensor] = None, change_detector=None, truncation: Union[str, dict] = "max",
            refresh_every: Union[int, str, None] = "auto", check_finite: bool = True, cuda_graph: bool = False,
            leaf_modules: tuple = (), fuse: bool = True, fold_bn: Optional[bool] = None, recompute: bool = True):
    """Convert a dense CNN into a :class:`~deltaconv.DeltaModel` that processes only changed pixels.

    Args:
        model: any torch.fx-traceable model taking frames ``[N, 3, H, W]``; it is left untouched.
        threshold: default truncation threshold of the input sparsifier and every non-linear layer.
        backend: ``"auto"`` (CUDA kernels for CUDA tensors when built, else reference),
            ``"reference"`` or ``"cuda"``.
        thresholds: per-layer thresholds (``{layer name: value}`` or a JSON file path) applied
            over ``threshold``.
        strict: raise :class:`ConversionError` instead of inserting fallbacks.
        example_input: a frame batch used once to trace shapes (default: ``randn(1, 3, 224, 224)``
            on the model's device and dtype).
        change_detector: optional input change measure (see :mod:`deltaconv.sparsify`).
        truncation: the change measure of the non-linear layers' thresholds: ``"max"``
            (``max_c |change|`` per pixel), ``"rms"`` (``sqrt(mean_c change^2)``, which sends
            fewer pixels at the same output error) or ``"pooled"`` (the rms of each channel's change
            averaged over the pixel's 3x3 window, or its own rms over 4x the threshold; fewer still
            on noisy video, best left per pixel in the first, stride-2 layers); ``"hybrid"``:
            ``"pooled"`` in the layers at stride 4 and coarser against the frame, ``"rms"`` in the
            others (as the example traces them: ``layer.frame_stride``); or a dict of
            layer names or patterns to measures, e.g. ``{"features.0.*": "rms", "*": "pooled"}``,
            as :attr:`DeltaModel.truncation` takes it (the most specific match wins; layers none
            matches: ``"max"``). See the README's fidelity section.
        refresh_every: force a key frame every this many frames; ``"auto"`` (the default): every
            1,000 frames for float16 and bfloat16 frames, whose rounding drifts slowly over long
            videos, and for float32 frames on a GPU with TF32 convolutions (PyTorch's default,
            ``torch.backends.cudnn.allow_tf32``); never for exact float32
            (``deltaconv.model.AUTO_REFRESH``); ``None``: never. In a model
            replayed as a CUDA graph they replay a recorded key frame (see :meth:`DeltaModel.capture`).
        check_finite: reject frames holding NaN/Inf before any state changes (one device sync
            per frame; turn off for CUDA-graph capture).
        cuda_graph: record the first delta frame as a CUDA graph and replay it for later frames
            (see :meth:`DeltaModel.capture`).
        leaf_modules: module types not to trace into (kept whole; without a rule they become
            fallbacks), e.g. blocks that are not fx-traceable.
        fuse: run each residual add whose only reader is the activation after it inside that
            activation's pass (same results, one pass over memory fewer; the report notes the pairs,
            ``report.fused``), and where the model's output is an upsampling of a delta (the
            segmentation models' final ``F.interpolate``), densify before it and resample the dense
            output (report status ``dense``); and where 1x1 convolutions of stride 1 read an
            activation, a product, an add or a 1x1 convolution that itself runs on a list, that
            layer lists the pixels it sends for them, so that on the CUDA backend those
            convolutions make no work list of their own (same results, a kernel fewer each).
            ``False`` keeps every layer's own pass.
        fold_bn: fold each BatchNorm into the convolution (or transposed convolution of one group)
            before it (one layer fewer). In float16 / bfloat16 the folded weights are rounded so that
            each filter's sum stays close to the exact one (``deltaconv.modules.folding``), which keeps
            the error at threshold 0 near the dense model's (MobileNetV2 on one-by-one: 6.1-6.6e-3
            against the float32 model, the dense float16 model 4.9e-3; rounding each to nearest gave
            1.2-1.3e-2). For the most accurate float16 model convert the float32 model and cast the converted one,
            ``convert(model).half()``: the fold is then made from the float32 weights and rounded
            once (4.1-4.8e-3). ``False`` keeps each BatchNorm a layer of its own (a per-channel
            scale of the delta in float32, one more pass each, 0.6x the speed in float16;
            ``benchmarks/experiments/fp16_floor.py``; README, *Fidelity and calibration*).
            ``None`` (the default): as the ``thresholds`` file or Calibration records it (what the
            thresholds were calibrated with), else ``True``.
        recompute: value mode where the graph allows (the default): a convolution (the stems too, since 2026-12-07:
            ``MIN_RECOMPUTE_CHANNELS``) that reads an activation, a max pooling or the input sparsifier (through
            paddings and static products or sums, which then give their whole outputs: ``gives_whole``; the sparsifier
            then gives the frame's own values on the pixels it sends, ``whole_from_frame``), and whose only reader is an
            activation, computes its whole new output on the active pixels from its input's whole values (what that
            layer has sent), bias included, and the activation after it keeps no float32 accumulator. The same
            convolution work and results (to rounding), about half of that activation's memory traffic, 21-25 % less
            state in ResNet-50 and MobileNetV2 and their busy frames 2.6-9 % faster in float16 (README, *How it works*,
            Value mode). A residual add fused with its activation works so too where both operands are whole: a ResNet
            bottleneck's conv3 keeps its whole output and the ReLU after the add sums it with the whole identity, the
            block input or a downsampling 1x1 convolution's kept output (``DCConv2d.keeps_output``; all 16 of resnet50's
            blocks, busy frames another 4-9 % faster). Not in float32 with TF32 convolutions, whose TF32 sends suit
            delta mode better (``DCConv2d.recomputes``). MobileNet's projections and the adds between its blocks keep
            whole values too, so that its expansions recompute (whole sums: mobilenet_v2 5-7 % faster on busy frames,
            its state 43 % smaller; ``deltaconv.convert.WHOLE_SUMS = False`` turns them off), and so do the
            squeeze-excite products of MobileNetV3 and EfficientNet, whose operands are both whole (whole products:
            2-8 % faster on busy frames, no accumulators; ``deltaconv.convert.WHOLE_PRODUCTS = False`` turns them off),
            and a max pooling after an activation (``deltaconv.convert.WHOLE_MAX_POOLING``). An activation read only as
            whole values, fused with a residual add or not, then writes no changes
            (``deltaconv.convert.SKIP_UNREAD_CHANGES``). The report notes the pairs ("recomputes for") and the products.
            ``False``: delta mode everywhere.
    """
    from .model import DeltaModel, read_thresholds

    if not isinstance(model, nn.Module):
        raise TypeError(f"convert: model must be a torch.nn.Module, got {type(model).__name__}")
    backends.check_name(backend)
    if not isinstance(threshold, (int, float)) or threshold < 0:
        raise ValueError(f"convert: threshold must be a number >= 0, got {threshold!r}")
    check_truncation(truncation, "convert: truncation")
    if not isinstance(fuse, bool):
        raise TypeError(f"convert: fuse must be a bool, got {fuse!r}")
    if not isinstance(recompute, bool):
        raise TypeError(f"convert: recompute must be a bool, got {recompute!r}")
    if fold_bn is None:  # what the thresholds were calibrated with, else folded
        recorded = None if thresholds is None else read_thresholds(thresholds)[3]
        fold_bn = True if recorded is None else bool(recorded)
    if not isinstance(fold_bn, bool):
        raise TypeError(f"convert: fold_bn must be a bool or None, got {fold_bn!r}")
    dense = copy.deepcopy(model).eval()
    if not isinstance(leaf_modules, (tuple, list)) or not all(isinstance(t, type) for t in leaf_modules):
        raise TypeError(f"convert: leaf_modules must be a tuple of module classes, got {leaf_modules!r}")
    tracer = _ScopedTracer(tuple(leaf_modules))
    try:
        graph = tracer.trace(dense)
    except Exception as error:  # fx raises TraceError, TypeError, ... from inside the model's forward
        raise ConversionError(_untraceable_message(model, error)) from error
    traced = fx.GraphModule(dense, graph)
    example = _example_for(dense) if example_input is None else example_input
    examples = example if isinstance(example, (tuple, list)) else (example,)
    with torch.no_grad():
        # clones: in-place ops of the model (ReLU(inplace=True) first) must not edit the caller's tensors
        try:
            ShapeProp(traced).propagate(*(e.clone() if torch.is_tensor(e) else e for e in examples))
        except Exception as error:  # the model rejects the example (a fixed input size, a wrong dtype, ...)
            raise ConversionError(_example_failed_message(model, examples, error)) from error
    graph = fx.Graph()  # an unowned copy (with the shape metadata) to rewrite
    graph.output(graph.graph_copy(traced.graph, {}))
    keep_channels_first(graph, dense)
    fold_hardswish(graph, dense)  # exported models' written-out ops (deltaconv.exported)
    if fold_bn:
        fold_constant_affines(graph, dense)
        fold_input_affines(graph, dense)
    fold_channel_shuffles(graph)
    fold_shuffled_concatenations(graph, dense)
    converter = _Converter(dense, graph, dense_tail=fuse, fold_bn=fold_bn)
    report = converter.run()
    if fuse:
        converter.fuse_add_activation()
        converter.link_row_lists()
    if recompute:
        converter.mark_recomputing()
    if strict and report.fallbacks:
        raise ConversionError("convert(strict=True): no delta rule for " +
                              ", ".join(f"{n.node} ({n.target})" for n in report.fallbacks))
    dm = DeltaModel(dense, graph, report, backend, refresh_every=refresh_every, check_finite=check_finite,
                    cuda_graph=cuda_graph)
    dm.fold_bn = fold_bn
    dm.set_threshold_all(float(threshold))
    dm.truncation = truncation
    if change_detector is not None:
        for layer in dm.delta_layers():
            if isinstance(layer, DCSparsify):
                layer.change_detector = change_detector
    if thresholds is not None:
        dm.load_thresholds(thresholds)
    return dm
