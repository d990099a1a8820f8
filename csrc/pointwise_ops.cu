// CUDA launchers of the pointwise deltaconv ops (schemas: csrc/ops.cpp; semantics:
// deltaconv/backends/reference.py; kernels: csrc/kernels/*.cuh).
//
// Every launcher checks its arguments (errors name the argument and the value), allocates fresh
// outputs (delta_out channels_last, mask_out contiguous bool), and launches on the current stream
// under a device guard. Nothing here synchronises with the host, so every op can be captured in a
// CUDA graph; `key` may be None.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common.cuh"
#include "kernels/count.cuh"
#include "kernels/interpolate.cuh"
#include "kernels/layer_norm.cuh"
#include "kernels/pointwise.cuh"

namespace deltaconv {
namespace {

using at::Tensor;

// ---------------------------------------------------------------- argument checks
void check_cuda(const char* op, const char* name, const Tensor& t, const Tensor& ref) {
  TORCH_CHECK(t.is_cuda(), "deltaconv::", op, ": argument '", name, "' must be a CUDA tensor, got device ",
              t.device());
  TORCH_CHECK(t.device() == ref.device(), "deltaconv::", op, ": argument '", name, "' is on ", t.device(),
              " but the delta is on ", ref.device());
}

void check_dtype(const char* op, const char* name, const Tensor& t, at::ScalarType expected) {
  TORCH_CHECK(t.scalar_type() == expected, "deltaconv::", op, ": argument '", name, "' must have dtype ", expected,
              ", got ", t.scalar_type());
}

void check_sizes(const char* op, const char* name, const Tensor& t, at::IntArrayRef expected) {
  TORCH_CHECK(t.sizes() == expected, "deltaconv::", op, ": argument '", name, "' must have shape ", expected,
              ", got ", t.sizes());
}

// A 4-D activation-dtype value tensor, channels_last contiguous. The first one checked is the
// reference for the device.
void check_value(const char* op, const char* name, const Tensor& t, const Tensor& ref) {
  check_cuda(op, name, t, ref);
  TORCH_CHECK(is_activation_dtype(t.scalar_type()), "deltaconv::", op, ": argument '", name,
              "' must be float32, float16 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 4, "deltaconv::", op, ": argument '", name, "' must be 4-D [N, C, H, W], got shape ",
              t.sizes());
  TORCH_CHECK(t.is_contiguous(at::MemoryFormat::ChannelsLast), "deltaconv::", op, ": argument '", name,
              "' must be channels_last contiguous (call .contiguous(memory_format=torch.channels_last)), got strides ",
              t.strides());
}

// The [N, 1, H, W] bool mask of a 4-D value of shape `value_sizes`.
void check_mask(const char* op, const char* name, const Tensor& m, const Tensor& ref, at::IntArrayRef value_sizes) {
  check_cuda(op, name, m, ref);
  check_dtype(op, name, m, at::kBool);
  check_sizes(op, name, m, {value_sizes[0], 1, value_sizes[2], value_sizes[3]});
  TORCH_CHECK(m.is_contiguous(), "deltaconv::", op, ": argument '", name, "' must be contiguous, got strides ",
              m.strides());
}

// State updated in place, of dtype `dtype` (float32 for accumulators, the delta dtype for `sent`)
// and shape `sizes`, channels_last contiguous.
void check_state(const char* op, const char* name, const Tensor& s, const Tensor& ref, at::IntArrayRef sizes,
                 at::ScalarType dtype = at::kFloat) {
  check_cuda(op, name, s, ref);
  check_dtype(op, name, s, dtype);
  check_sizes(op, name, s, sizes);
  TORCH_CHECK(s.is_contiguous(at::MemoryFormat::ChannelsLast), "deltaconv::", op, ": argument '", name,
              "' (state, updated in place) must be channels_last contiguous, got strides ", s.strides());
}

const bool* check_key(const char* op, const std::optional<Tensor>& key, const Tensor& ref, int64_t batch) {
  if (!key.has_value()) return nullptr;
  const Tensor& k = *key;
  check_cuda(op, "key", k, ref);
  check_dtype(op, "key", k, at::kBool);
  check_sizes(op, "key", k, {batch});
  TORCH_CHECK(k.is_contiguous(), "deltaconv::", op, ": argument 'key' must be contiguous, got strides ", k.strides());
  return k.const_data_ptr<bool>();
}

// float32 [C] per-channel vector (scale / shift) or nullptr.
const float* check_channel_vector(const char* op, const char* name, const std::optional<Tensor>& v, const Tensor& ref,
                                  int64_t channels) {
  if (!v.has_value()) return nullptr;
  check_cuda(op, name, *v, ref);
  check_dtype(op, name, *v, at::kFloat);
  check_sizes(op, name, *v, {channels});
  TORCH_CHECK(v->is_contiguous(), "deltaconv::", op, ": argument '", name, "' must be contiguous, got strides ",
              v->strides());
  return v->const_data_ptr<float>();
}

int check_channels(const char* op, const Tensor& t) {
  TORCH_CHECK(t.size(1) <= (int64_t{1} << 30), "deltaconv::", op, ": too many channels (", t.size(1), ")");
  return static_cast<int>(t.size(1));
}

// The optional row list of the activations, the add and the product (pw::append_sent_rows): `rows` int32
// [>= 1 + 2 * pixels] and `rows_count` int32 [>= 1], both contiguous and 1-D on the device of `ref`, given together.
struct RowList {
  int* rows = nullptr;
  int* count = nullptr;
};

RowList check_rows(const char* op, const std::optional<Tensor>& rows, const std::optional<Tensor>& rows_count,
                   const Tensor& ref, int64_t pixels) {
  TORCH_CHECK(rows.has_value() == rows_count.has_value(), "deltaconv::", op,
              ": arguments 'rows' and 'rows_count' must be given together, got ",
              rows.has_value() ? "'rows' only" : "'rows_count' only");
  if (!rows.has_value()) return {};
  for (const auto& [name, t, need] : {std::make_tuple("rows", &*rows, 1 + 2 * pixels),
                                      std::make_tuple("rows_count", &*rows_count, int64_t{1})}) {
    check_cuda(op, name, *t, ref);
    check_dtype(op, name, *t, at::kInt);
    TORCH_CHECK(t->dim() == 1 && t->is_contiguous() && t->numel() >= need, "deltaconv::", op, ": argument '", name,
                "' must be a contiguous 1-D tensor of at least ", need, " elements, got shape ", t->sizes(),
                " and strides ", t->strides());
  }
  TORCH_CHECK(pixels <= std::numeric_limits<int>::max(), "deltaconv::", op, ": too many pixels for a row list (",
              pixels, ")");
  return {rows->data_ptr<int>(), rows_count->data_ptr<int>()};
}

// ---------------------------------------------------------------- launch geometry
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

bool all_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

// The grid of a kernel with one group of 2^log2_lanes threads per pixel (group_blocks, common.cuh).
dim3 grid_for(int64_t pixels, int log2_lanes) {
  return dim3(static_cast<unsigned>(group_blocks(pixels, log2_lanes, pw::kThreads)));
}

cudaStream_t stream() { return at::cuda::getCurrentCUDAStream(); }

Tensor empty_value(const Tensor& like, at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, like.options().dtype(dtype).memory_format(at::MemoryFormat::ChannelsLast));
}

Tensor empty_mask(const Tensor& like, int64_t n, int64_t h, int64_t w) {
  return at::empty({n, 1, h, w}, like.options().dtype(at::kBool).memory_format(at::MemoryFormat::Contiguous));
}

// Launch KERNEL<scalar_t, VEC> with VEC = kVec<scalar_t> when `vec_ok`, else 1; the pixel group
// size follows from C and VEC. `params` must have a log2_lanes member. `persistent`: the kernel
// walks its pixels with pw::for_each_active_pixel, so its grid is capped at the resident blocks.
#define DC_LAUNCH_VEC(KERNEL, params, vec_ok, pixels, channels, persistent)                      \
  do {                                                                                           \
    if (pixels > 0) {                                                                            \
      const int vec_ = (vec_ok) ? kVec<scalar_t> : 1;                                            \
      params.log2_lanes = log2_lanes_for(channels, vec_);                                        \
      const auto kernel_ = (vec_ok) ? KERNEL<scalar_t, kVec<scalar_t>> : KERNEL<scalar_t, 1>;    \
      dim3 grid_ = grid_for(pixels, params.log2_lanes);                                          \
      if (persistent) grid_.x = persistent_grid(kernel_, pw::kThreads, grid_.x);                 \
      launch_kernel(kernel_, grid_, pw::kThreads, 0, stream(), params);                          \
    }                                                                                            \
  } while (0)

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}
template <typename T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.const_data_ptr());
}

// ---------------------------------------------------------------- sparsify
std::tuple<Tensor, Tensor> sparsify(const Tensor& x, Tensor& sent, double threshold, const std::optional<Tensor>& key,
                                    const std::optional<Tensor>& measure, bool tf32) {
  const char* op = "sparsify";
  TORCH_CHECK(!tf32 || x.scalar_type() == at::kFloat,
              "deltaconv::sparsify: argument 'tf32' needs a float32 frame, got ", x.scalar_type());
  check_value(op, "x", x, x);
  check_state(op, "sent", sent, x, x.sizes(), x.scalar_type());
  const int64_t N = x.size(0), H = x.size(2), W = x.size(3);
  const int C = check_channels(op, x);
  const bool* key_ptr = check_key(op, key, x, N);
  const float* measure_ptr = nullptr;
  if (measure.has_value()) {
    check_cuda(op, "measure", *measure, x);
    check_dtype(op, "measure", *measure, at::kFloat);
    check_sizes(op, "measure", *measure, {N, 1, H, W});
    TORCH_CHECK(measure->is_contiguous(), "deltaconv::sparsify: argument 'measure' must be contiguous, got strides ",
                measure->strides());
    measure_ptr = measure->const_data_ptr<float>();
  }
  c10::cuda::CUDAGuard guard(x.device());
  Tensor out = empty_value(x, x.sizes(), x.scalar_type());
  Tensor mask_out = empty_mask(x, N, H, W);
  const int64_t pixels = N * H * W;
  DC_DISPATCH_ACTIVATION_TYPES(x.scalar_type(), "deltaconv::sparsify", [&] {
    pw::SparsifyParams<scalar_t> p{cptr<scalar_t>(x), ptr<scalar_t>(sent), measure_ptr, key_ptr,
                                   ptr<scalar_t>(out), ptr<bool>(mask_out), static_cast<float>(threshold),
                                   pixels, H * W, C, 0, tf32};
    const bool vec_ok = C % kVec<scalar_t> == 0 && all_aligned({p.x, p.sent, p.out});
    DC_LAUNCH_VEC(pw::sparsify_kernel, p, vec_ok, pixels, C, false);
  });
  return {out, mask_out};
}

// ---------------------------------------------------------------- densify
template <typename Tin, typename Tout>
void launch_densify(pw::DensifyParams<Tin, Tout> p, bool vec_ok) {
  constexpr int V = kVec<Tin>;
  if (vec_ok) {
    p.log2_lanes = log2_lanes_for(p.channels, V);
    launch_kernel(pw::densify_kernel<Tin, Tout, V>, grid_for(p.pixels, p.log2_lanes), pw::kThreads, 0, stream(), p);
  } else {
    p.log2_lanes = log2_lanes_for(p.channels, 1);
    launch_kernel(pw::densify_kernel<Tin, Tout, 1>, grid_for(p.pixels, p.log2_lanes), pw::kThreads, 0, stream(), p);
  }
}

Tensor densify(const Tensor& delta, const Tensor& mask, Tensor& acc, at::ScalarType out_dtype) {
  const char* op = "densify";
  check_value(op, "delta", delta, delta);
  check_mask(op, "mask", mask, delta, delta.sizes());
  check_state(op, "acc", acc, delta, delta.sizes());
  TORCH_CHECK(is_activation_dtype(out_dtype), "deltaconv::densify: argument 'out_dtype' must be float32, float16 or "
              "bfloat16, got ", out_dtype);
  const int64_t N = delta.size(0), H = delta.size(2), W = delta.size(3);
  const int C = check_channels(op, delta);
  c10::cuda::CUDAGuard guard(delta.device());
  Tensor out = empty_value(delta, delta.sizes(), out_dtype);
  const int64_t pixels = N * H * W;
  if (pixels == 0) return out;
  DC_DISPATCH_ACTIVATION_TYPES(delta.scalar_type(), "deltaconv::densify", [&] {
    using Tin = scalar_t;
    DC_DISPATCH_ACTIVATION_TYPES(out_dtype, "deltaconv::densify", [&] {
      pw::DensifyParams<Tin, scalar_t> p{cptr<Tin>(delta), cptr<bool>(mask), ptr<float>(acc), ptr<scalar_t>(out),
                                         pixels, C, 0};
      const bool vec_ok = C % kVec<Tin> == 0 && all_aligned({p.delta, p.acc, p.out});
      launch_densify<Tin, scalar_t>(p, vec_ok);
    });
  });
  return out;
}

// ---------------------------------------------------------------- activation
int activation_kind(const char* op, const std::string& kind) {
  static const char* const kNames[pw::kNumActKinds] = {"identity",    "relu", "relu6",   "leaky_relu",
                                                       "hardswish",   "hardsigmoid", "silu", "sigmoid",
                                                       "gelu",        "tanh", "elu",  "prelu"};
  for (int i = 0; i < pw::kNumActKinds; ++i)
    if (kind == kNames[i]) return i;
  std::string known;
  for (int i = 0; i < pw::kNumActKinds; ++i) known += std::string(i ? ", " : "") + kNames[i];
  TORCH_CHECK(false, "deltaconv::", op, ": argument 'kind' must be one of ", known, ", got '", kind,
              "' (other functions run through the reference backend)");
  return 0;
}

// activation_kernel_of<KIND, RESIDUAL>::kernel<T, VEC>: the kernel with its activation fixed
// (DC_LAUNCH_VEC takes a kernel template of <T, VEC>).
template <int KIND, bool RESIDUAL, bool VALUES = false>
struct activation_kernel_of {
  template <typename T, int VEC>
  static constexpr auto kernel = pw::activation_kernel<T, VEC, KIND, RESIDUAL, VALUES>;
};

// The activation, with the residual add before it when `delta_b` is given (add_activation: its
// operands delta_a = delta, delta_b, their masks, alpha); returns (out, mask_out, the add's mask or
// an undefined tensor). `pooled` (with rms): the pooled measure, in two passes: activation_kernel
// writes the pending changes of the region, rounded to the delta dtype, into `out` (with tf32: a
// scratch map, `out` must then hold TF32 values) and sends nothing, then pooled_send_kernel
// decides from each pixel's 3x3 window and sends. `acc` nullptr (activation_values): `delta` holds
// the whole new input on the active pixels, no accumulator; with delta_b too (add_activation_values):
// both operands whole at every pixel, their sum the input (not with `pooled`). `write_out` false: `out`
// is returned unwritten, the kernel stores only `sent` (every reader of the layer takes its whole values,
// `sent`; not with `pooled`). `slopes` (float32 [C]): the per-channel negative slopes of kind "prelu",
// given with that kind only.
std::tuple<Tensor, Tensor, Tensor> run_activation(const char* op, const Tensor& delta, const Tensor& mask,
                                                  const Tensor* delta_b, const Tensor* mask_b, double alpha,
                                                  Tensor* acc, Tensor& sent, c10::string_view kind, double param,
                                                  double threshold, const std::optional<Tensor>& key, bool rms,
                                                  const std::optional<Tensor>& rows,
                                                  const std::optional<Tensor>& rows_count, bool tf32, bool pooled,
                                                  bool write_out, const std::optional<Tensor>& slopes) {
  const bool residual = delta_b != nullptr;
  DC_CHECK_TF32_FLAG(op, "tf32", tf32, delta);
  TORCH_CHECK(!pooled || rms, "deltaconv::", op, ": argument 'pooled' (the pooled measure, rms-based) needs rms=True, "
              "got rms=False");
  TORCH_CHECK(write_out || !pooled, "deltaconv::", op, ": argument 'write_out' must be True with the pooled measure "
              "(its first pass writes the pending changes into the output), got write_out=False");
  const int kind_id = activation_kind(op, std::string(kind));
  const bool values = acc == nullptr;
  // the operands' names in the schemas (whole operands: a, b; activation_values: x)
  const char* name_a = residual ? (values ? "a" : "delta_a") : (values ? "x" : "delta");
  const char* name_b = values ? "b" : "delta_b";
  check_value(op, name_a, delta, delta);
  check_mask(op, residual ? "mask_a" : "mask", mask, delta, delta.sizes());
  if (residual) {
    check_value(op, name_b, *delta_b, delta);
    check_sizes(op, name_b, *delta_b, delta.sizes());
    check_dtype(op, name_b, *delta_b, delta.scalar_type());
    check_mask(op, "mask_b", *mask_b, delta, delta.sizes());
  }
  TORCH_CHECK(!(values && residual && pooled), "deltaconv::", op, ": argument 'pooled' is not supported with whole "
              "operands (the reference backend runs it), got pooled=True");
  if (!values) check_state(op, "acc", *acc, delta, delta.sizes());
  check_state(op, "sent", sent, delta, delta.sizes(), delta.scalar_type());
  const int64_t N = delta.size(0), H = delta.size(2), W = delta.size(3);
  const int C = check_channels(op, delta);
  const bool* key_ptr = check_key(op, key, delta, N);
  const int64_t pixels = N * H * W;
  const RowList row_list = check_rows(op, rows, rows_count, delta, pixels);
  TORCH_CHECK(slopes.has_value() == (kind_id == pw::kPrelu), "deltaconv::", op, ": argument 'slopes' (the per-channel "
              "negative slopes) must be given with kind 'prelu' and only with it, got kind '", std::string(kind),
              "' and ", slopes.has_value() ? "slopes" : "slopes=None");
  const float* slope_ptr = check_channel_vector(op, "slopes", slopes, delta, C);
  c10::cuda::CUDAGuard guard(delta.device());
  Tensor out = empty_value(delta, delta.sizes(), delta.scalar_type());
  Tensor mask_out = empty_mask(delta, N, H, W);
  Tensor mask_sum = residual ? empty_mask(delta, N, H, W) : Tensor();
  DC_DISPATCH_ACTIVATION_TYPES(delta.scalar_type(), "deltaconv::activation", [&] {
    pw::ActivationParams<scalar_t> p{cptr<scalar_t>(delta), cptr<bool>(mask), values ? nullptr : ptr<float>(*acc),
                                     ptr<scalar_t>(sent),
                                     key_ptr, ptr<scalar_t>(out), ptr<bool>(mask_out), kind_id,
                                     static_cast<float>(param), static_cast<float>(threshold),
                                     rms_limit(rms, threshold, C), pixels, H * W, C, 0,
                                     residual ? cptr<scalar_t>(*delta_b) : nullptr,
                                     residual ? cptr<bool>(*mask_b) : nullptr,
                                     residual ? ptr<bool>(mask_sum) : nullptr, static_cast<float>(alpha),
                                     row_list.rows, row_list.count, tf32, nullptr, slope_ptr};
    if (!write_out) p.out = nullptr;
    Tensor scratch;
    if (pooled) {  // the first pass only writes the pending changes; the send pass lists the rows
      if (tf32) scratch = at::empty_like(out, at::MemoryFormat::ChannelsLast);
      p.pending = ptr<scalar_t>(tf32 ? scratch : out);
      p.rows = nullptr;
      p.rows_count = nullptr;
    }
    const bool vec_ok = C % kVec<scalar_t> == 0 && all_aligned({p.delta, p.acc, p.sent, p.out}) &&
                        (!residual || all_aligned({p.delta_b})) && (!pooled || all_aligned({p.pending}));
    // the common kinds with the activation fixed at compile time (with a residual: ReLU only). SiLU and
    // hardswish, and GELU in value mode, too unless DELTACONV_ACT_FIXED=0 (then they switch per element,
    // as before 2026-12-03): switching cost SiLU 1.2-1.5x, hardswish up to 1.8x the kernel's time, and
    // whole EfficientNet frames 15-18 % (benchmarks/results/activation_fixed_ab.txt). Likewise since
    // 2026-12-07 per-channel PReLU in value mode (with a residual too) and LeakyReLU in value mode
    // (benchmarks/results/prelu_ab.txt). PReLU runs on kernels of its own in every mode, whatever the switch:
    // the switching kernel reads no slopes (channel_param)
    const bool fixed = env_switch("DELTACONV_ACT_FIXED");
    const bool silu = fixed && kind_id == pw::kSilu, hardswish = fixed && kind_id == pw::kHardswish;
    const bool gelu_values = fixed && kind_id == pw::kGelu;
    const bool prelu = kind_id == pw::kPrelu, leaky_values = fixed && kind_id == pw::kLeakyRelu;
    using Relu = activation_kernel_of<pw::kRelu, false>;
    using Relu6 = activation_kernel_of<pw::kRelu6, false>;
    using Gelu = activation_kernel_of<pw::kGelu, false>;
    using Silu = activation_kernel_of<pw::kSilu, false>;
    using Hardswish = activation_kernel_of<pw::kHardswish, false>;
    using Prelu = activation_kernel_of<pw::kPrelu, false>;
    using AnyKind = activation_kernel_of<pw::kAnyKind, false>;
    using ReluSum = activation_kernel_of<pw::kRelu, true>;
    using PreluSum = activation_kernel_of<pw::kPrelu, true>;
    using AnyKindSum = activation_kernel_of<pw::kAnyKind, true>;
    using ReluValues = activation_kernel_of<pw::kRelu, false, true>;
    using Relu6Values = activation_kernel_of<pw::kRelu6, false, true>;
    using SiluValues = activation_kernel_of<pw::kSilu, false, true>;
    using HardswishValues = activation_kernel_of<pw::kHardswish, false, true>;
    using GeluValues = activation_kernel_of<pw::kGelu, false, true>;
    using PreluValues = activation_kernel_of<pw::kPrelu, false, true>;
    using LeakyReluValues = activation_kernel_of<pw::kLeakyRelu, false, true>;
    using AnyKindValues = activation_kernel_of<pw::kAnyKind, false, true>;
    using ReluSumValues = activation_kernel_of<pw::kRelu, true, true>;
    using PreluSumValues = activation_kernel_of<pw::kPrelu, true, true>;
    using AnyKindSumValues = activation_kernel_of<pw::kAnyKind, true, true>;
    if (values && residual && kind_id == pw::kRelu) {
      DC_LAUNCH_VEC(ReluSumValues::kernel, p, vec_ok, pixels, C, true);
    } else if (values && residual && prelu) {  // ENet's bottlenecks
      DC_LAUNCH_VEC(PreluSumValues::kernel, p, vec_ok, pixels, C, true);
    } else if (values && residual) {
      DC_LAUNCH_VEC(AnyKindSumValues::kernel, p, vec_ok, pixels, C, true);
    } else if (values && kind_id == pw::kRelu) {
      DC_LAUNCH_VEC(ReluValues::kernel, p, vec_ok, pixels, C, true);
    } else if (values && kind_id == pw::kRelu6) {
      DC_LAUNCH_VEC(Relu6Values::kernel, p, vec_ok, pixels, C, true);
    } else if (values && silu) {  // EfficientNet's, RegNet-Y's squeeze-excite
      DC_LAUNCH_VEC(SiluValues::kernel, p, vec_ok, pixels, C, true);
    } else if (values && hardswish) {  // MobileNetV3's
      DC_LAUNCH_VEC(HardswishValues::kernel, p, vec_ok, pixels, C, true);
    } else if (values && gelu_values) {  // ConvNeXt's, after its first 1x1 convolution
      DC_LAUNCH_VEC(GeluValues::kernel, p, vec_ok, pixels, C, true);
    } else if (values && prelu) {  // face recognition's IR-ResNets, ENet
      DC_LAUNCH_VEC(PreluValues::kernel, p, vec_ok, pixels, C, true);
    } else if (values && leaky_values) {  // the YOLO family's
      DC_LAUNCH_VEC(LeakyReluValues::kernel, p, vec_ok, pixels, C, true);
    } else if (values) {
      DC_LAUNCH_VEC(AnyKindValues::kernel, p, vec_ok, pixels, C, true);
    } else if (residual && kind_id == pw::kRelu) {
      DC_LAUNCH_VEC(ReluSum::kernel, p, vec_ok, pixels, C, true);
    } else if (residual && prelu) {
      DC_LAUNCH_VEC(PreluSum::kernel, p, vec_ok, pixels, C, true);
    } else if (residual) {
      DC_LAUNCH_VEC(AnyKindSum::kernel, p, vec_ok, pixels, C, true);
    } else if (kind_id == pw::kRelu) {
      DC_LAUNCH_VEC(Relu::kernel, p, vec_ok, pixels, C, true);
    } else if (kind_id == pw::kRelu6) {
      DC_LAUNCH_VEC(Relu6::kernel, p, vec_ok, pixels, C, true);
    } else if (kind_id == pw::kGelu) {  // ConvNeXt's, on its widest tensors
      DC_LAUNCH_VEC(Gelu::kernel, p, vec_ok, pixels, C, true);
    } else if (silu) {
      DC_LAUNCH_VEC(Silu::kernel, p, vec_ok, pixels, C, true);
    } else if (hardswish) {
      DC_LAUNCH_VEC(Hardswish::kernel, p, vec_ok, pixels, C, true);
    } else if (prelu) {
      DC_LAUNCH_VEC(Prelu::kernel, p, vec_ok, pixels, C, true);
    } else {
      DC_LAUNCH_VEC(AnyKind::kernel, p, vec_ok, pixels, C, true);
    }
    if (pooled) {
      pw::PooledSendParams<scalar_t> q{residual ? cptr<bool>(mask_sum) : cptr<bool>(mask), p.pending, p.acc, p.sent,
                                       key_ptr, p.out, p.mask_out, kind_id, p.param,
                                       rms_limit(true, threshold, C),
                                       rms_limit(true, static_cast<double>(pw::kPoolPeak) * threshold, C), pixels,
                                       H * W, static_cast<int>(H), static_cast<int>(W), C, 0, row_list.rows,
                                       row_list.count, tf32, values ? cptr<scalar_t>(delta) : nullptr, slope_ptr};
      DC_LAUNCH_VEC(pw::pooled_send_kernel, q, vec_ok, pixels, C, true);
    }
  });
  return {out, mask_out, mask_sum};
}

std::tuple<Tensor, Tensor> activation(const Tensor& delta, const Tensor& mask, Tensor& acc, Tensor& sent,
                                      c10::string_view kind, double param, double threshold,
                                      const std::optional<Tensor>& key, bool rms, const std::optional<Tensor>& rows,
                                      const std::optional<Tensor>& rows_count, bool tf32, bool pooled,
                                      bool write_out, const std::optional<Tensor>& slopes) {
  auto [out, mask_out, unused] = run_activation("activation", delta, mask, nullptr, nullptr, 1.0, &acc, sent, kind,
                                                param, threshold, key, rms, rows, rows_count, tf32, pooled, write_out,
                                                slopes);
  return {out, mask_out};
}

// The activation of a recomputed input: `x` holds the layer's whole new input on the active pixels
// (no accumulator); as activation otherwise.
std::tuple<Tensor, Tensor> activation_values(const Tensor& x, const Tensor& mask, Tensor& sent, c10::string_view kind,
                                             double param, double threshold, const std::optional<Tensor>& key,
                                             bool rms, const std::optional<Tensor>& rows,
                                             const std::optional<Tensor>& rows_count, bool tf32, bool pooled,
                                             bool write_out, const std::optional<Tensor>& slopes) {
  auto [out, mask_out, unused] = run_activation("activation_values", x, mask, nullptr, nullptr, 1.0, nullptr, sent,
                                                kind, param, threshold, key, rms, rows, rows_count, tf32, pooled,
                                                write_out, slopes);
  return {out, mask_out};
}

// activation(add(a, b, alpha)) in one kernel; returns (out, mask_out, the add's mask mask_a | mask_b)
std::tuple<Tensor, Tensor, Tensor> add_activation(const Tensor& delta_a, const Tensor& mask_a, const Tensor& delta_b,
                                                  const Tensor& mask_b, double alpha, Tensor& acc, Tensor& sent,
                                                  c10::string_view kind, double param, double threshold,
                                                  const std::optional<Tensor>& key, bool rms,
                                                  const std::optional<Tensor>& rows,
                                                  const std::optional<Tensor>& rows_count, bool tf32, bool pooled,
                                                  bool write_out, const std::optional<Tensor>& slopes) {
  return run_activation("add_activation", delta_a, mask_a, &delta_b, &mask_b, alpha, &acc, sent, kind, param,
                        threshold, key, rms, rows, rows_count, tf32, pooled, write_out, slopes);
}

// activation_values(add(a, b, alpha)) in one kernel: `a` and `b` hold the add's operands whole at
// every pixel (a convolution's kept output, DCConv2d.keeps_output; a layer's sent values); returns
// (out, mask_out, mask_a | mask_b) as add_activation does
std::tuple<Tensor, Tensor, Tensor> add_activation_values(const Tensor& a, const Tensor& mask_a, const Tensor& b,
                                                         const Tensor& mask_b, double alpha, Tensor& sent,
                                                         c10::string_view kind, double param, double threshold,
                                                         const std::optional<Tensor>& key, bool rms,
                                                         const std::optional<Tensor>& rows,
                                                         const std::optional<Tensor>& rows_count, bool tf32,
                                                         bool write_out, const std::optional<Tensor>& slopes) {
  return run_activation("add_activation_values", a, mask_a, &b, &mask_b, alpha, nullptr, sent, kind, param,
                        threshold, key, rms, rows, rows_count, tf32, false, write_out, slopes);
}

// ---------------------------------------------------------------- affine_channel
std::tuple<Tensor, Tensor> affine_channel(const Tensor& delta, const Tensor& mask, const std::optional<Tensor>& scale,
                                          const std::optional<Tensor>& shift, const std::optional<Tensor>& key) {
  const char* op = "affine_channel";
  check_value(op, "delta", delta, delta);
  check_mask(op, "mask", mask, delta, delta.sizes());
  const int64_t N = delta.size(0), H = delta.size(2), W = delta.size(3);
  const int C = check_channels(op, delta);
  const float* scale_ptr = check_channel_vector(op, "scale", scale, delta, C);
  const float* shift_ptr = check_channel_vector(op, "shift", shift, delta, C);
  const bool* key_ptr = check_key(op, key, delta, N);
  c10::cuda::CUDAGuard guard(delta.device());
  Tensor out = empty_value(delta, delta.sizes(), delta.scalar_type());
  Tensor mask_out = empty_mask(delta, N, H, W);
  const int64_t pixels = N * H * W;
  DC_DISPATCH_ACTIVATION_TYPES(delta.scalar_type(), "deltaconv::affine_channel", [&] {
    pw::AffineParams<scalar_t> p{cptr<scalar_t>(delta), cptr<bool>(mask), scale_ptr, shift_ptr, key_ptr,
                                 ptr<scalar_t>(out), ptr<bool>(mask_out), pixels, H * W, C, 0};
    const bool vec_ok = C % kVec<scalar_t> == 0 && all_aligned({p.delta, p.out});
    DC_LAUNCH_VEC(pw::affine_channel_kernel, p, vec_ok, pixels, C, true);
  });
  return {out, mask_out};
}

// Two deltas (add_values: whole values) of one shape and dtype with their masks, the first two arguments
// named a_name and b_name (add, add_values, interleave_channels).
void check_delta_pair(const char* op, const Tensor& delta_a, const Tensor& mask_a, const Tensor& delta_b,
                      const Tensor& mask_b, const char* a_name = "delta_a", const char* b_name = "delta_b") {
  check_value(op, a_name, delta_a, delta_a);
  check_mask(op, "mask_a", mask_a, delta_a, delta_a.sizes());
  check_value(op, b_name, delta_b, delta_a);
  check_sizes(op, b_name, delta_b, delta_a.sizes());
  check_dtype(op, b_name, delta_b, delta_a.scalar_type());
  check_mask(op, "mask_b", mask_b, delta_a, delta_a.sizes());
}

// ---------------------------------------------------------------- add
// add and add_values: the add kernel over two operands of one shape into `out` (WHOLE: add_values_kernel).
template <bool WHOLE>
void launch_add(const Tensor& a, const Tensor& mask_a, const Tensor& b, const Tensor& mask_b, double alpha,
                Tensor& out, Tensor& mask_out, const RowList& row_list) {
  const int64_t pixels = a.size(0) * a.size(2) * a.size(3);
  const int C = static_cast<int>(a.size(1));
  DC_DISPATCH_ACTIVATION_TYPES(a.scalar_type(), "deltaconv::add", [&] {  // add_values: checked before
    pw::AddParams<scalar_t> p{cptr<scalar_t>(a), cptr<bool>(mask_a), cptr<scalar_t>(b), cptr<bool>(mask_b),
                              ptr<scalar_t>(out), ptr<bool>(mask_out), static_cast<float>(alpha), pixels, C, 0,
                              row_list.rows, row_list.count};
    const bool vec_ok = C % kVec<scalar_t> == 0 && all_aligned({p.a, p.b, p.out});
    if constexpr (WHOLE) {
      DC_LAUNCH_VEC(pw::add_values_kernel, p, vec_ok, pixels, C, true);
    } else {
      DC_LAUNCH_VEC(pw::add_kernel, p, vec_ok, pixels, C, true);
    }
  });
}

std::tuple<Tensor, Tensor> add(const Tensor& delta_a, const Tensor& mask_a, const Tensor& delta_b,
                               const Tensor& mask_b, double alpha, const std::optional<Tensor>& rows,
                               const std::optional<Tensor>& rows_count) {
  const char* op = "add";
  check_delta_pair(op, delta_a, mask_a, delta_b, mask_b);
  const int64_t N = delta_a.size(0), H = delta_a.size(2), W = delta_a.size(3);
  check_channels(op, delta_a);
  const RowList row_list = check_rows(op, rows, rows_count, delta_a, N * H * W);
  c10::cuda::CUDAGuard guard(delta_a.device());
  Tensor out = empty_value(delta_a, delta_a.sizes(), delta_a.scalar_type());
  Tensor mask_out = empty_mask(delta_a, N, H, W);
  launch_add<false>(delta_a, mask_a, delta_b, mask_b, alpha, out, mask_out, row_list);
  return {out, mask_out};
}

// An add in value mode (DCAdd.keeps_sum): `a` and `b` hold the operands whole at every pixel; `out`,
// the add's kept whole sum, takes T(a + T(alpha * b)) on mask_a | mask_b and keeps its other pixels.
// Returns the union, the add's output mask.
Tensor add_values(const Tensor& a, const Tensor& mask_a, const Tensor& b, const Tensor& mask_b, double alpha,
                  Tensor& out, const std::optional<Tensor>& rows, const std::optional<Tensor>& rows_count) {
  const char* op = "add_values";
  check_delta_pair(op, a, mask_a, b, mask_b, "a", "b");
  check_state(op, "out", out, a, a.sizes(), a.scalar_type());
  const int64_t N = a.size(0), H = a.size(2), W = a.size(3);
  check_channels(op, a);
  const RowList row_list = check_rows(op, rows, rows_count, a, N * H * W);
  c10::cuda::CUDAGuard guard(a.device());
  Tensor mask_out = empty_mask(a, N, H, W);
  launch_add<true>(a, mask_a, b, mask_b, alpha, out, mask_out, row_list);
  return mask_out;
}

// ---------------------------------------------------------------- mul
// The operands of mul (named delta_a / delta_b) or mul_values (a / b) and their masks: one dtype, equal
// shapes or one [N, C, 1, 1] broadcast over the other's pixels (squeeze-excite).
struct MulShape {
  bool a_bcast, b_bcast;
  at::IntArrayRef out;     // [N, C, H, W] of the output
};

MulShape check_mul_operands(const char* op, const Tensor& a, const Tensor& mask_a, const Tensor& b,
                            const Tensor& mask_b, const char* a_name, const char* b_name) {
  check_value(op, a_name, a, a);
  check_value(op, b_name, b, a);
  check_dtype(op, b_name, b, a.scalar_type());
  const auto sa = a.sizes(), sb = b.sizes();
  const bool a_small = sa[2] == 1 && sa[3] == 1, b_small = sb[2] == 1 && sb[3] == 1;
  const bool same = sa == sb;
  const bool a_bcast = !same && a_small, b_bcast = !same && b_small && !a_small;
  TORCH_CHECK(sa[0] == sb[0] && sa[1] == sb[1] && (same || a_small || b_small), "deltaconv::", op, ": arguments '",
              a_name, "' ", sa, " and '", b_name, "' ", sb,
              " must have equal shapes, or one must be [N, C, 1, 1] (squeeze-excite)");
  check_mask(op, "mask_a", mask_a, a, sa);
  check_mask(op, "mask_b", mask_b, a, sb);
  return {a_bcast, b_bcast, a_bcast ? sb : sa};
}

// mul and mul_values (VALUES: mul_values_kernel on whole operands; acc_a / acc_b nullptr): the product over
// operands checked by check_mul_operands, truncated against `sent` (checked by the caller); returns
// (out, mask_out).
template <bool VALUES>
std::tuple<Tensor, Tensor> launch_mul(const char* op, const Tensor& a, const Tensor& mask_a, Tensor* acc_a,
                                      const Tensor& b, const Tensor& mask_b, Tensor* acc_b, const MulShape& shape,
                                      Tensor& sent, double threshold, const std::optional<Tensor>& key, bool rms,
                                      const std::optional<Tensor>& rows, const std::optional<Tensor>& rows_count,
                                      bool tf32) {
  const int64_t N = shape.out[0], H = shape.out[2], W = shape.out[3];
  const int C = check_channels(op, a);
  const bool* key_ptr = check_key(op, key, a, N);
  const int64_t pixels = N * H * W;
  const RowList row_list = check_rows(op, rows, rows_count, a, pixels);
  c10::cuda::CUDAGuard guard(a.device());
  Tensor out = empty_value(a, shape.out, a.scalar_type());
  Tensor mask_out = empty_mask(a, N, H, W);
  DC_DISPATCH_ACTIVATION_TYPES(a.scalar_type(), "deltaconv::mul", [&] {
    // mul: the broadcast operand's acc first, every output pixel reads it
    const Tensor* small_d = shape.a_bcast ? &a : (shape.b_bcast ? &b : nullptr);
    if (!VALUES && small_d != nullptr && N * C > 0) {
      const Tensor& small_m = shape.a_bcast ? mask_a : mask_b;
      Tensor& small_acc = shape.a_bcast ? *acc_a : *acc_b;
      const int64_t total = N * C;
      launch_kernel(pw::accumulate_rows_kernel<scalar_t>,
                    static_cast<unsigned>((total + pw::kThreads - 1) / pw::kThreads), pw::kThreads, 0, stream(),
                    cptr<scalar_t>(*small_d), cptr<bool>(small_m), ptr<float>(small_acc), N, C);
    }
    pw::MulParams<scalar_t> p{cptr<scalar_t>(a), cptr<bool>(mask_a), VALUES ? nullptr : ptr<float>(*acc_a),
                              cptr<scalar_t>(b), cptr<bool>(mask_b), VALUES ? nullptr : ptr<float>(*acc_b),
                              ptr<scalar_t>(sent), key_ptr, ptr<scalar_t>(out), ptr<bool>(mask_out),
                              static_cast<float>(threshold), rms_limit(rms, threshold, C), pixels, H * W, C, 0,
                              shape.a_bcast, shape.b_bcast, row_list.rows, row_list.count, tf32};
    const bool vec_ok = C % kVec<scalar_t> == 0 && all_aligned({p.a, p.acc_a, p.b, p.acc_b, p.sent, p.out});
    if constexpr (VALUES) {
      DC_LAUNCH_VEC(pw::mul_values_kernel, p, vec_ok, pixels, C, true);
    } else {
      DC_LAUNCH_VEC(pw::mul_kernel, p, vec_ok, pixels, C, true);
    }
  });
  return {out, mask_out};
}

std::tuple<Tensor, Tensor> mul(const Tensor& delta_a, const Tensor& mask_a, Tensor& acc_a, const Tensor& delta_b,
                               const Tensor& mask_b, Tensor& acc_b, Tensor& sent, double threshold,
                               const std::optional<Tensor>& key, bool rms,
                               const std::optional<Tensor>& rows, const std::optional<Tensor>& rows_count,
                               bool tf32) {
  const char* op = "mul";
  const MulShape shape = check_mul_operands(op, delta_a, mask_a, delta_b, mask_b, "delta_a", "delta_b");
  DC_CHECK_TF32_FLAG(op, "tf32", tf32, delta_a);
  check_state(op, "acc_a", acc_a, delta_a, delta_a.sizes());
  check_state(op, "acc_b", acc_b, delta_a, delta_b.sizes());
  check_state(op, "sent", sent, delta_a, shape.out, delta_a.scalar_type());
  return launch_mul<false>(op, delta_a, mask_a, &acc_a, delta_b, mask_b, &acc_b, shape, sent, threshold, key, rms,
                           rows, rows_count, tf32);
}

// A product in value mode (DCMul.takes_whole): `a` and `b` hold the operands whole at every pixel (one may be
// [N, C, 1, 1]), so the new product on mask_a | mask_b is a * b, truncated against `sent` as mul does; no
// accumulators.
std::tuple<Tensor, Tensor> mul_values(const Tensor& a, const Tensor& mask_a, const Tensor& b, const Tensor& mask_b,
                                      Tensor& sent, double threshold, const std::optional<Tensor>& key, bool rms,
                                      const std::optional<Tensor>& rows, const std::optional<Tensor>& rows_count,
                                      bool tf32) {
  const char* op = "mul_values";
  const MulShape shape = check_mul_operands(op, a, mask_a, b, mask_b, "a", "b");
  DC_CHECK_TF32_FLAG(op, "tf32", tf32, a);
  check_state(op, "sent", sent, a, shape.out, a.scalar_type());
  return launch_mul<true>(op, a, mask_a, nullptr, b, mask_b, nullptr, shape, sent, threshold, key, rms, rows,
                          rows_count, tf32);
}

// ---------------------------------------------------------------- layer_norm
std::tuple<Tensor, Tensor> layer_norm(const Tensor& delta, const Tensor& mask, Tensor& acc, Tensor& sent,
                                      const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                                      double eps, double threshold, const std::optional<Tensor>& key, bool rms,
                                      const std::optional<Tensor>& rows, const std::optional<Tensor>& rows_count,
                                      bool tf32) {
  const char* op = "layer_norm";
  check_value(op, "delta", delta, delta);
  DC_CHECK_TF32_FLAG(op, "tf32", tf32, delta);
  check_mask(op, "mask", mask, delta, delta.sizes());
  check_state(op, "acc", acc, delta, delta.sizes());
  check_state(op, "sent", sent, delta, delta.sizes(), delta.scalar_type());
  const int64_t N = delta.size(0), H = delta.size(2), W = delta.size(3);
  const int C = check_channels(op, delta);
  TORCH_CHECK(C >= 1, "deltaconv::layer_norm: argument 'delta' must have at least one channel, got shape ",
              delta.sizes());
  TORCH_CHECK(eps >= 0.0, "deltaconv::layer_norm: argument 'eps' must be >= 0, got ", eps);
  const float* w = check_channel_vector(op, "weight", weight, delta, C);
  const float* b = check_channel_vector(op, "bias", bias, delta, C);
  const bool* key_ptr = check_key(op, key, delta, N);
  c10::cuda::CUDAGuard guard(delta.device());
  Tensor out = empty_value(delta, delta.sizes(), delta.scalar_type());
  Tensor mask_out = empty_mask(delta, N, H, W);
  const int64_t pixels = N * H * W;
  const RowList row_list = check_rows(op, rows, rows_count, delta, pixels);
  DC_DISPATCH_ACTIVATION_TYPES(delta.scalar_type(), "deltaconv::layer_norm", [&] {
    pw::LayerNormParams<scalar_t> p{cptr<scalar_t>(delta), cptr<bool>(mask), ptr<float>(acc), ptr<scalar_t>(sent),
                                    w, b, key_ptr, ptr<scalar_t>(out), ptr<bool>(mask_out),
                                    static_cast<float>(eps), static_cast<float>(threshold),
                                    rms_limit(rms, threshold, C), pixels, H * W, C, 0,
                                    row_list.rows, row_list.count, tf32};
    const bool vec_ok = C % kVec<scalar_t> == 0 && all_aligned({p.delta, p.acc, p.sent, p.out});
    DC_LAUNCH_VEC(pw::layer_norm_kernel, p, vec_ok, pixels, C, true);
  });
  return {out, mask_out};
}

// ---------------------------------------------------------------- concatenate
std::tuple<Tensor, Tensor> concatenate(at::TensorList deltas, at::TensorList masks) {
  const char* op = "concatenate";
  const int64_t count = static_cast<int64_t>(deltas.size());
  TORCH_CHECK(count >= 1, "deltaconv::concatenate: argument 'deltas' must hold at least one tensor, got 0");
  TORCH_CHECK(count <= pw::kMaxConcat, "deltaconv::concatenate: argument 'deltas' holds ", count,
              " tensors; at most ", pw::kMaxConcat, " are supported (concatenate in steps)");
  TORCH_CHECK(static_cast<int64_t>(masks.size()) == count, "deltaconv::concatenate: argument 'masks' must hold one "
              "mask per delta (", count, "), got ", masks.size());
  const Tensor& ref = deltas[0];
  check_value(op, "deltas[0]", ref, ref);
  const int64_t N = ref.size(0), H = ref.size(2), W = ref.size(3);
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) {
    const std::string dname = "deltas[" + std::to_string(i) + "]";
    const std::string mname = "masks[" + std::to_string(i) + "]";
    check_value(op, dname.c_str(), deltas[i], ref);
    check_dtype(op, dname.c_str(), deltas[i], ref.scalar_type());
    TORCH_CHECK(deltas[i].size(0) == N && deltas[i].size(2) == H && deltas[i].size(3) == W, "deltaconv::concatenate: "
                "argument '", dname, "' must have shape [", N, ", C, ", H, ", ", W, "] like deltas[0], got ",
                deltas[i].sizes());
    check_mask(op, mname.c_str(), masks[i], ref, deltas[i].sizes());
    total += deltas[i].size(1);
  }
  TORCH_CHECK(total <= (int64_t{1} << 30), "deltaconv::concatenate: too many channels (", total, ")");
  c10::cuda::CUDAGuard guard(ref.device());
  Tensor out = empty_value(ref, {N, total, H, W}, ref.scalar_type());
  Tensor mask_out = empty_mask(ref, N, H, W);
  const int64_t pixels = N * H * W;
  DC_DISPATCH_ACTIVATION_TYPES(ref.scalar_type(), "deltaconv::concatenate", [&] {
    pw::ConcatParams<scalar_t> p{};
    p.count = static_cast<int>(count);
    p.total_channels = static_cast<int>(total);
    p.pixels = pixels;
    p.out = ptr<scalar_t>(out);
    p.mask_out = ptr<bool>(mask_out);
    bool vec_ok = aligned16(p.out);
    int64_t offset = 0, max_c = 1;
    for (int64_t i = 0; i < count; ++i) {
      p.in[i] = cptr<scalar_t>(deltas[i]);
      p.mask[i] = cptr<bool>(masks[i]);
      p.channels[i] = static_cast<int>(deltas[i].size(1));
      p.offset[i] = static_cast<int>(offset);
      offset += deltas[i].size(1);
      max_c = std::max<int64_t>(max_c, deltas[i].size(1));
      vec_ok = vec_ok && p.channels[i] % kVec<scalar_t> == 0 && aligned16(p.in[i]);
    }
    DC_LAUNCH_VEC(pw::concatenate_kernel, p, vec_ok, pixels, max_c, true);
  });
  return {out, mask_out};
}

// ---------------------------------------------------------------- interleave_channels
std::tuple<std::vector<Tensor>, Tensor> interleave_channels(const Tensor& delta_a, const Tensor& mask_a,
                                                            const Tensor& delta_b, const Tensor& mask_b,
                                                            int64_t parts) {
  const char* op = "interleave_channels";
  check_delta_pair(op, delta_a, mask_a, delta_b, mask_b);
  TORCH_CHECK(parts >= 1 && parts <= pw::kMaxInterleaveParts, "deltaconv::interleave_channels: argument 'parts' "
              "must be 1 or 2, got ", parts);
  const int64_t N = delta_a.size(0), H = delta_a.size(2), W = delta_a.size(3);
  const int C = check_channels(op, delta_a);
  const int64_t part_channels = 2 * static_cast<int64_t>(C) / parts;  // parts 1 or 2: whole
  c10::cuda::CUDAGuard guard(delta_a.device());
  std::vector<Tensor> out;
  for (int64_t q = 0; q < parts; ++q)
    out.push_back(empty_value(delta_a, {N, part_channels, H, W}, delta_a.scalar_type()));
  Tensor mask_out = empty_mask(delta_a, N, H, W);
  const int64_t pixels = N * H * W;
  DC_DISPATCH_ACTIVATION_TYPES(delta_a.scalar_type(), "deltaconv::interleave_channels", [&] {
    pw::InterleaveParams<scalar_t> p{};
    p.in[0] = cptr<scalar_t>(delta_a);
    p.in[1] = cptr<scalar_t>(delta_b);
    p.mask[0] = cptr<bool>(mask_a);
    p.mask[1] = cptr<bool>(mask_b);
    for (int64_t q = 0; q < parts; ++q) p.out[q] = ptr<scalar_t>(out[q]);
    p.mask_out = ptr<bool>(mask_out);
    p.pixels = pixels;
    p.channels = C;
    p.part_channels = static_cast<int>(part_channels);
    const bool vec_ok = C % kVec<scalar_t> == 0 && all_aligned({p.in[0], p.in[1], p.out[0], p.out[parts - 1]});
    DC_LAUNCH_VEC(pw::interleave_channels_kernel, p, vec_ok, pixels, 2 * C, true);
  });
  return {out, mask_out};
}

// ---------------------------------------------------------------- interpolate
// PyTorch's compute_scales_value / area_pixel_compute_scale (float accumulate type).
float nearest_scale(std::optional<double> scale, int64_t in, int64_t out) {
  return (scale.has_value() && *scale > 0.) ? static_cast<float>(1.0 / *scale)
                                            : static_cast<float>(in) / static_cast<float>(out);
}

// (align_corners=False uses the input/output ratio even for an output of size 1, as PyTorch >= 2.1)
float linear_scale(std::optional<double> scale, int64_t in, int64_t out, bool align_corners) {
  if (align_corners) return out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.f;
  return nearest_scale(scale, in, out);
}

// The geometry of a resampling (interpolate, resample): mode, sizes and PyTorch's scales.
struct Resampling {
  int mode;
  int64_t n, h, w, oh, ow;
  float scale_h, scale_w;
};

Resampling resampling(const char* op, const char* name, const Tensor& x, at::IntArrayRef out_size,
                      std::optional<double> scale_h, std::optional<double> scale_w, c10::string_view mode,
                      bool align_corners) {
  Resampling r;
  if (mode == "nearest") {
    r.mode = pw::kNearest;
  } else if (mode == "nearest-exact") {
    r.mode = pw::kNearestExact;
  } else if (mode == "bilinear") {
    r.mode = pw::kBilinear;
  } else {
    TORCH_CHECK(false, "deltaconv::", op, ": argument 'mode' must be 'nearest', 'nearest-exact' or 'bilinear', got '",
                std::string(mode), "' (other modes run through the reference backend)");
  }
  TORCH_CHECK(out_size.size() == 2 && out_size[0] > 0 && out_size[1] > 0, "deltaconv::", op, ": argument "
              "'out_size' must be two positive sizes, got ", out_size);
  r.n = x.size(0), r.h = x.size(2), r.w = x.size(3), r.oh = out_size[0], r.ow = out_size[1];
  TORCH_CHECK(r.h > 0 && r.w > 0, "deltaconv::", op, ": argument '", name,
              "' must have non-empty spatial dims, got shape ", x.sizes());
  TORCH_CHECK(r.h <= kIntMax && r.w <= kIntMax && r.oh <= kIntMax && r.ow <= kIntMax, "deltaconv::", op,
              ": spatial sizes must fit in int32");
  const bool linear = r.mode == pw::kBilinear;
  r.scale_h = linear ? linear_scale(scale_h, r.h, r.oh, align_corners) : nearest_scale(scale_h, r.h, r.oh);
  r.scale_w = linear ? linear_scale(scale_w, r.w, r.ow, align_corners) : nearest_scale(scale_w, r.w, r.ow);
  return r;
}

std::tuple<Tensor, Tensor> interpolate(const Tensor& delta, const Tensor& mask, at::IntArrayRef out_size,
                                       std::optional<double> scale_h, std::optional<double> scale_w,
                                       c10::string_view mode, bool align_corners) {
  const char* op = "interpolate";
  check_value(op, "delta", delta, delta);
  check_mask(op, "mask", mask, delta, delta.sizes());
  const Resampling r = resampling(op, "delta", delta, out_size, scale_h, scale_w, mode, align_corners);
  const int C = check_channels(op, delta);
  c10::cuda::CUDAGuard guard(delta.device());
  Tensor out = empty_value(delta, {r.n, delta.size(1), r.oh, r.ow}, delta.scalar_type());
  Tensor mask_out = empty_mask(delta, r.n, r.oh, r.ow);
  const int64_t pixels = r.n * r.oh * r.ow;
  DC_DISPATCH_ACTIVATION_TYPES(delta.scalar_type(), "deltaconv::interpolate", [&] {
    pw::InterpolateParams<scalar_t> p{cptr<scalar_t>(delta), cptr<bool>(mask), ptr<scalar_t>(out),
                                      ptr<bool>(mask_out), r.scale_h, r.scale_w, pixels,
                                      static_cast<int>(r.h), static_cast<int>(r.w), static_cast<int>(r.oh),
                                      static_cast<int>(r.ow), C, 0, r.mode, align_corners};
    const bool vec_ok = C % kVec<scalar_t> == 0 && all_aligned({p.delta, p.out});
    DC_LAUNCH_VEC(pw::interpolate_kernel, p, vec_ok, pixels, C, false);
  });
  return {out, mask_out};
}

// F.interpolate of a whole map x (channels_last) into a contiguous (NCHW) output.
Tensor resample(const Tensor& x, at::IntArrayRef out_size, std::optional<double> scale_h,
                std::optional<double> scale_w, c10::string_view mode, bool align_corners) {
  const char* op = "resample";
  check_value(op, "x", x, x);
  const Resampling r = resampling(op, "x", x, out_size, scale_h, scale_w, mode, align_corners);
  const int C = check_channels(op, x);
  c10::cuda::CUDAGuard guard(x.device());
  Tensor out = at::empty({r.n, x.size(1), r.oh, r.ow}, x.options());
  const int64_t runs = (r.ow + pw::kResampleRun - 1) / pw::kResampleRun;
  const int64_t threads = r.n * C * r.oh * runs;
  if (threads == 0) return out;
  DC_DISPATCH_ACTIVATION_TYPES(x.scalar_type(), "deltaconv::resample", [&] {
    pw::ResampleParams<scalar_t> p{cptr<scalar_t>(x), ptr<scalar_t>(out), r.scale_h, r.scale_w, threads,
                                   static_cast<int>(r.h), static_cast<int>(r.w), static_cast<int>(r.oh),
                                   static_cast<int>(r.ow), C, r.mode, align_corners};
    // one block per output row, its (blended) input row in shared memory, where it fits in the
    // default 48 KiB: bilinear as float, nearest as T
    const bool linear = r.mode == pw::kBilinear;
    const int64_t smem = r.w * C * static_cast<int64_t>(linear ? sizeof(float) : sizeof(scalar_t));
    if (smem <= 48 * 1024 && r.n * r.oh <= kIntMax) {
      const auto kernel = linear ? pw::resample_rows_kernel<scalar_t, true> : pw::resample_rows_kernel<scalar_t, false>;
      launch_kernel(kernel, dim3(static_cast<unsigned>(r.n * r.oh)), pw::kThreads, static_cast<size_t>(smem), stream(),
                    p);
    } else {
      const dim3 grid(static_cast<unsigned>((threads + pw::kThreads - 1) / pw::kThreads));
      launch_kernel(pw::resample_kernel<scalar_t>, grid, pw::kThreads, 0, stream(), p);
    }
  });
  return out;
}

}  // namespace

// ---------------------------------------------------------------- count_active
void count_active(at::TensorList masks, at::TensorList stats) {
  TORCH_CHECK(masks.size() == stats.size(), "deltaconv::count_active: arguments 'masks' and 'stats' must have the "
              "same length, got ", masks.size(), " and ", stats.size());
  if (masks.empty()) return;
  const Tensor& ref = masks[0];
  TORCH_CHECK(ref.is_cuda(), "deltaconv::count_active: argument 'masks' must hold CUDA tensors, got device ",
              ref.device());
  c10::cuda::CUDAGuard guard(ref.device());
  std::vector<Tensor> contiguous;  // keeps copies of non-contiguous masks alive until the launch
  contiguous.reserve(masks.size());
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  for (size_t start = 0; start < masks.size(); start += stats::kMaxCount) {
    stats::CountBatch b{};
    for (size_t i = start; i < std::min(masks.size(), start + stats::kMaxCount); ++i) {
      const std::string m_name = "masks[" + std::to_string(i) + "]", s_name = "stats[" + std::to_string(i) + "]";
      check_cuda("count_active", m_name.c_str(), masks[i], ref);
      check_dtype("count_active", m_name.c_str(), masks[i], at::kBool);
      check_cuda("count_active", s_name.c_str(), stats[i], ref);
      check_dtype("count_active", s_name.c_str(), stats[i], at::kDouble);
      check_sizes("count_active", s_name.c_str(), stats[i], {4});
      TORCH_CHECK(stats[i].is_contiguous(), "deltaconv::count_active: argument '", s_name,
                  "' must be contiguous, got strides ", stats[i].strides());
      contiguous.push_back(masks[i].contiguous());
      const int64_t n = contiguous.back().numel();
      const int k = b.count++;
      b.mask[k] = reinterpret_cast<const uint8_t*>(contiguous.back().const_data_ptr<bool>());
      b.stats[k] = stats[i].data_ptr<double>();
      b.n[k] = n;
      const int blocks = (int)std::max<int64_t>(
          1, std::min<int64_t>((n + stats::kCountPerBlock - 1) / stats::kCountPerBlock, 2 * sms));
      b.first[k + 1] = b.first[k] + blocks;
    }
    launch_kernel(stats::count_active_kernel, dim3((unsigned)b.first[b.count]), stats::kCountThreads, 0, stream(), b);
  }
}

TORCH_LIBRARY_IMPL(deltaconv, CUDA, m) {
  m.impl("sparsify", &sparsify);
  m.impl("densify", &densify);
  m.impl("activation", &activation);
  m.impl("activation_values", &activation_values);
  m.impl("add_activation", &add_activation);
  m.impl("add_activation_values", &add_activation_values);
  m.impl("affine_channel", &affine_channel);
  m.impl("add", &add);
  m.impl("add_values", &add_values);
  m.impl("mul", &mul);
  m.impl("mul_values", &mul_values);
  m.impl("layer_norm", &layer_norm);
  m.impl("concatenate", &concatenate);
  m.impl("interleave_channels", &interleave_channels);
  m.impl("interpolate", &interpolate);
  m.impl("resample", &resample);
  m.impl("count_active", &count_active);
}

}  // namespace deltaconv
