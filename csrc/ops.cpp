// deltaconv operator schemas: the one TORCH_LIBRARY block of the extension.
//
// Layout conventions shared by every op (see deltaconv/backends/reference.py, the oracle):
//   delta  [N, C, H, W]  activation dtype (float32 / float16 / bfloat16), channels_last
//   mask   [N, 1, H, W]  bool, true where the pixel carries a change
//   acc / sent           state with the shape of the value it tracks, updated in place: acc float32,
//                        sent in the delta dtype
//   key    [N] bool or None: streams whose state was just reset (send every pixel, add biases)
//   rms    the truncating ops' measure: false = max_c |change| > threshold, true =
//          sqrt(mean_c change^2) > threshold
//   pooled (activation, add_activation; with rms): the pooled measure of reference.exceeds, the
//          rms of each channel's change averaged over the pixel's 3x3 window (or its own rms > 4x
//          the threshold)
// Ops return fresh (delta_out, mask_out); values at inactive output pixels are unspecified.
// Implementations: TORCH_LIBRARY_IMPL(deltaconv, CUDA, m) blocks in the .cu files.
#include <Python.h>
#include <torch/library.h>

extern "C" {
// An empty module so that `import deltaconv._C` also works; ops are registered by loading the
// library (torch.ops.load_library), which runs the static registrations below.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(deltaconv, m) {
  // ---- boundaries
  // tf32 (float32 only): the changes sent rounded to TF32, as the activations' tf32
  m.def("sparsify(Tensor x, Tensor(a!) sent, float threshold, Tensor? key, Tensor? measure, bool tf32=False) -> "
        "(Tensor, Tensor)");
  m.def("densify(Tensor delta, Tensor mask, Tensor(a!) acc, ScalarType out_dtype) -> Tensor");
  // ---- pointwise
  // rows / rows_count (optional, together): the sent (add: active) pixels listed for a 1x1 conv after it
  // (conv1x1_rows)
  // tf32 (float32 only; here, mul, layer_norm and max_pool2d): the changes sent rounded to TF32, for
  // convolutions that read them in TF32 (conv2d / conv1x1_rows with input_tf32)
  // write_out=False (the activations, fused with an add or not): the changes `out` are returned unwritten,
  // only `sent` stored, for a layer whose readers all take its whole values (`sent`); not with pooled
  // slopes (float32 [C], with kind "prelu" only): the per-channel negative slopes of nn.PReLU(C)
  m.def("activation(Tensor delta, Tensor mask, Tensor(a!) acc, Tensor(b!) sent, str kind, float param, "
        "float threshold, Tensor? key, bool rms=False, Tensor(c!)? rows=None, Tensor(d!)? rows_count=None, "
        "bool tf32=False, bool pooled=False, bool write_out=True, Tensor? slopes=None) -> (Tensor, Tensor)");
  // the activation of a recomputed input (a convolution in value mode before it): x holds the whole new
  // input on the active pixels, so no accumulator
  m.def("activation_values(Tensor x, Tensor mask, Tensor(a!) sent, str kind, float param, float threshold, "
        "Tensor? key, bool rms=False, Tensor(b!)? rows=None, Tensor(c!)? rows_count=None, bool tf32=False, "
        "bool pooled=False, bool write_out=True, Tensor? slopes=None) -> (Tensor, Tensor)");
  // activation(add(delta_a, delta_b, alpha)) in one pass; returns (out, mask_out, mask_a | mask_b)
  m.def("add_activation(Tensor delta_a, Tensor mask_a, Tensor delta_b, Tensor mask_b, float alpha, Tensor(a!) acc, "
        "Tensor(b!) sent, str kind, float param, float threshold, Tensor? key, bool rms=False, "
        "Tensor(c!)? rows=None, Tensor(d!)? rows_count=None, bool tf32=False, bool pooled=False, "
        "bool write_out=True, Tensor? slopes=None) -> (Tensor, Tensor, Tensor)");
  // activation_values(add(a, b, alpha)) in one pass: a and b hold the add's operands whole at every pixel (a
  // convolution's kept output, a layer's sent values); returns (out, mask_out, mask_a | mask_b)
  m.def("add_activation_values(Tensor a, Tensor mask_a, Tensor b, Tensor mask_b, float alpha, Tensor(a!) sent, "
        "str kind, float param, float threshold, Tensor? key, bool rms=False, Tensor(b!)? rows=None, "
        "Tensor(c!)? rows_count=None, bool tf32=False, bool write_out=True, Tensor? slopes=None) -> "
        "(Tensor, Tensor, Tensor)");
  m.def("affine_channel(Tensor delta, Tensor mask, Tensor? scale, Tensor? shift, Tensor? key) -> (Tensor, Tensor)");
  m.def("add(Tensor delta_a, Tensor mask_a, Tensor delta_b, Tensor mask_b, float alpha, Tensor(a!)? rows=None, "
        "Tensor(b!)? rows_count=None) -> (Tensor, Tensor)");
  // an add in value mode: a and b hold the operands whole at every pixel; out (the add's kept whole sum) takes
  // a + alpha * b on mask_a | mask_b, as the dense add rounds it, and keeps its other pixels; returns that union
  m.def("add_values(Tensor a, Tensor mask_a, Tensor b, Tensor mask_b, float alpha, Tensor(a!) out, "
        "Tensor(b!)? rows=None, Tensor(c!)? rows_count=None) -> Tensor");
  m.def("mul(Tensor delta_a, Tensor mask_a, Tensor(a!) acc_a, Tensor delta_b, Tensor mask_b, Tensor(b!) acc_b, "
        "Tensor(c!) sent, float threshold, Tensor? key, bool rms=False, Tensor(d!)? rows=None, "
        "Tensor(e!)? rows_count=None, bool tf32=False) -> (Tensor, Tensor)");
  // a product in value mode: a and b hold the operands whole at every pixel (one may be [N, C, 1, 1]); the
  // product on mask_a | mask_b, truncated against sent as mul does, no accumulators
  m.def("mul_values(Tensor a, Tensor mask_a, Tensor b, Tensor mask_b, Tensor(a!) sent, float threshold, Tensor? key, "
        "bool rms=False, Tensor(b!)? rows=None, Tensor(c!)? rows_count=None, bool tf32=False) -> (Tensor, Tensor)");
  // per-pixel layer norm over the channels (ConvNeXt): weight / bias float32 [C] or None
  m.def("layer_norm(Tensor delta, Tensor mask, Tensor(a!) acc, Tensor(b!) sent, Tensor? weight, Tensor? bias, "
        "float eps, float threshold, Tensor? key, bool rms=False, Tensor(c!)? rows=None, "
        "Tensor(d!)? rows_count=None, bool tf32=False) -> (Tensor, Tensor)");
  m.def("concatenate(Tensor[] deltas, Tensor[] masks) -> (Tensor, Tensor)");
  // torch.channel_shuffle(torch.cat([a, b], 1), 2) cut into `parts` (1 or 2) channels_last chunks along the
  // channels (ShuffleNet V2's block tail and the next block's split); one mask, mask_a | mask_b
  m.def("interleave_channels(Tensor delta_a, Tensor mask_a, Tensor delta_b, Tensor mask_b, int parts) -> "
        "(Tensor[], Tensor)");
  m.def("interpolate(Tensor delta, Tensor mask, int[2] out_size, float? scale_h, float? scale_w, str mode, "
        "bool align_corners) -> (Tensor, Tensor)");
  // F.interpolate of a dense map (channels_last in, contiguous NCHW out): the output densifier's resampling
  m.def("resample(Tensor x, int[2] out_size, float? scale_h, float? scale_w, str mode, bool align_corners) -> Tensor");
  // ---- convolution and pooling
  // counters: int32 [>= 14] zeroed by the caller, where the work lists count, the blocks take ranks and the
  // K split is recorded (conv_common.cuh: kConvCounters; None: zeroed per call)
  // input_tf32 (float32 only): the deltas are TF32 values already (an op's tf32 sent them), so
  // the tensor-core kernels skip rounding them; with other deltas they would read them truncated
  // load_mask [N,1,H,W] bool / bias_key [N] bool (a recomputing convolution: `delta` holds the
  // input's whole values, all read, and the bias goes to every output): the input pixels the kernels
  // read (None: mask) and the streams whose outputs get the bias (None: key); the output pixels (the
  // work list and mask_out) still follow mask and key
  m.def("conv2d(Tensor delta, Tensor mask, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, "
        "int[2] dilation, int groups, Tensor? key, Tensor(a!)? counters=None, bool input_tf32=False, "
        "Tensor? load_mask=None, Tensor? bias_key=None) -> (Tensor, Tensor)");
  // a 1x1 conv, stride 1, no padding, groups 1, of a delta frame (no key) over the rows the layer before it listed
  // (rows: int32 [1 + 2 * N*H*W]; counters: as in conv2d, the row count at [0], zeroed before the activation;
  // bias_key: as in conv2d, None: no bias)
  m.def("conv1x1_rows(Tensor delta, Tensor mask, Tensor weight, Tensor? bias, Tensor rows, Tensor(a!) counters, "
        "bool input_tf32=False, Tensor? bias_key=None) -> Tensor");
  // conv1x1_rows writing its output rows into `out` ([N, Cout, H, W] channels_last, Cout a multiple of 8 on the
  // tensor cores), which keeps the rest: a convolution keeping its whole output (DCConv2d.keeps_output)
  m.def("conv1x1_rows_into(Tensor delta, Tensor mask, Tensor weight, Tensor? bias, Tensor rows, Tensor(a!) counters, "
        "Tensor(b!) out, bool input_tf32=False, Tensor? bias_key=None) -> ()");
  // conv2d of a 1x1 kernel (groups 1, any stride and padding) writing its output pixels into `out` ([N, Cout, Ho,
  // Wo] channels_last, Cout a multiple of 8 on the tensor cores), which keeps the rest; returns the output mask: a
  // convolution keeping its whole output off a row list (DCConv2d.keeps_output)
  m.def("conv1x1_into(Tensor delta, Tensor mask, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, "
        "Tensor? key, Tensor(a!)? counters, Tensor(b!) out, bool input_tf32=False, Tensor? load_mask=None, "
        "Tensor? bias_key=None) -> Tensor");
  // fp16 / bf16, groups 1, dilation 1 and a kernel of whole strides: one stride-1 conv2d of all the phases of the
  // stride on the tensor cores, then a depth-to-space (counters: that conv2d's)
  m.def("conv_transpose2d(Tensor delta, Tensor mask, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, "
        "int[2] output_padding, int groups, int[2] dilation, Tensor? key, Tensor(a!)? counters=None) -> "
        "(Tensor, Tensor)");
  m.def("max_pool2d(Tensor delta, Tensor mask, Tensor(a!) acc, Tensor(b!) sent, int[2] kernel_size, int[2] stride, "
        "int[2] padding, int[2] dilation, bool ceil_mode, float threshold, Tensor? key, bool rms=False, "
        "bool tf32=False) -> (Tensor, Tensor)");
  // max pooling in value mode: x holds the input's whole values at every pixel (the activation's sent before
  // it), so no accumulator; as max_pool2d otherwise
  m.def("max_pool2d_values(Tensor x, Tensor mask, Tensor(a!) sent, int[2] kernel_size, int[2] stride, "
        "int[2] padding, int[2] dilation, bool ceil_mode, float threshold, Tensor? key, bool rms=False, "
        "bool tf32=False) -> (Tensor, Tensor)");
  m.def("avg_pool2d(Tensor delta, Tensor mask, int[2] kernel_size, int[2] stride, int[2] padding, bool ceil_mode, "
        "bool count_include_pad, int? divisor_override) -> (Tensor, Tensor)");
  m.def("adaptive_avg_pool2d(Tensor delta, Tensor mask, int[2] output_size) -> (Tensor, Tensor)");
  m.def("linear(Tensor delta, Tensor mask, Tensor weight, Tensor? bias, Tensor? key) -> (Tensor, Tensor)");
  // ---- statistics
  // per mask i: stats[i] (float64 [4]) = [active pixels of masks[i], sum since zeroed, scratch, scratch]
  m.def("count_active(Tensor[] masks, Tensor(a!)[] stats) -> ()");
}
