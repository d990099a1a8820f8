// CUDA launchers of the convolution, pooling and linear ops of the delta runtime
// (schemas in csrc/ops.cpp, semantics in deltaconv/backends/reference.py).
//
// Layout: delta in/out channels_last (a delta in another format is converted), masks [N,1,H,W]
// bool (memory N x H x W); max_pool2d's acc (float32) / sent (delta dtype) may have any strides (updated in
// place).
// Outputs: delta_out channels_last, mask_out contiguous; delta_out values at inactive output
// pixels are left unwritten. No host-device synchronisation anywhere (CUDA-graph capturable).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include <cudaTypedefs.h>
#include <torch/library.h>

#include "common.cuh"
#include "conv/conv_kernels.cuh"
#include "conv/conv1x1_ring.cuh"
#include "conv/conv3x3_ring.cuh"
#include "conv/conv3x3_stationary.cuh"
#include "conv/conv_small_cin_tc.cuh"
#include "conv/conv_tc.cuh"
#include "conv/conv_transpose_phases.cuh"
#include "conv/pool_kernels.cuh"

namespace deltaconv {
namespace {

using at::IntArrayRef;
using at::Tensor;
using conv::ConvGeom;
using conv::PoolGeom;
using conv::Strides4;

// Argument `name` (tensor t) a CUDA tensor of dtype `dtype` on the device of `delta`.
#define DC_CHECK_BESIDE_DELTA(OP, name, t, delta, dtype)                                              \
  do {                                                                                                \
    DC_CHECK_CUDA(OP, name, t);                                                                      \
    DC_CHECK_SAME_DEVICE(OP, name, t, delta);                                                        \
    DC_CHECK_DTYPE(OP, name, t, dtype);                                                              \
  } while (0)

// delta [N,C,H,W] activation dtype on CUDA, mask [N,1,H,W] bool on the same device.
#define DC_CHECK_DELTA_MASK(OP, delta, mask) DC_CHECK_INPUT_MASK(OP, "delta", delta, mask)
// the same for an input argument named NAME (a whole-values input: "x")
#define DC_CHECK_INPUT_MASK(OP, NAME, delta, mask)                                                    \
  do {                                                                                                \
    DC_CHECK_CUDA(OP, NAME, delta);                                                                  \
    DC_CHECK_ACTIVATION_DTYPE(OP, NAME, delta);                                                      \
    DC_CHECK_DIM(OP, NAME, delta, 4);                                                                \
    DC_CHECK_BESIDE_DELTA(OP, "mask", mask, delta, at::kBool);                                       \
    DC_CHECK_DIM(OP, "mask", mask, 4);                                                               \
    TORCH_CHECK(mask.size(0) == delta.size(0) && mask.size(1) == 1 && mask.size(2) == delta.size(2) && \
                    mask.size(3) == delta.size(3),                                                    \
                "deltaconv::" OP ": argument 'mask' must have shape [N, 1, H, W] = [", delta.size(0), ", 1, ", \
                delta.size(2), ", ", delta.size(3), "], got ", mask.sizes());                         \
    TORCH_CHECK(delta.size(0) * delta.size(2) * delta.size(3) <= kIntMax,                             \
                "deltaconv::" OP ": argument '" NAME "' is too large, got shape ", delta.sizes());    \
  } while (0)

// input_tf32 (the deltas arrive rounded to TF32: ConvGeom::input_tf32) only with float32 deltas
#define DC_CHECK_KEY(OP, key, delta) DC_CHECK_STREAM_FLAGS(OP, "key", key, delta)
// a per-stream flag vector (key, bias_key): None or bool [N] beside the delta
#define DC_CHECK_STREAM_FLAGS(OP, name, flags, delta)                                                 \
  do {                                                                                                \
    if (flags.has_value()) {                                                                          \
      DC_CHECK_BESIDE_DELTA(OP, name, (*flags), delta, at::kBool);                                   \
      TORCH_CHECK(flags->dim() == 1 && flags->size(0) == delta.size(0),                               \
                  "deltaconv::" OP ": argument '" name "' must have shape [N] = [", delta.size(0),        \
                  "], got ", flags->sizes());                                                         \
    }                                                                                                 \
  } while (0)

#define DC_CHECK_FLOAT_PARAM(OP, name, t, delta)                                                      \
  do {                                                                                                \
    DC_CHECK_CUDA(OP, name, t);                                                                      \
    DC_CHECK_SAME_DEVICE(OP, name, t, delta);                                                        \
    TORCH_CHECK(at::isFloatingType((t).scalar_type()),                                                \
                "deltaconv::" OP ": argument '" name "' must be a floating tensor, got ", (t).scalar_type()); \
  } while (0)

// An optional 1-D bias of `n` floats beside the delta.
#define DC_CHECK_BIAS(OP, bias, n, delta)                                                                     \
  do {                                                                                                      \
    if ((bias).has_value()) {                                                                               \
      DC_CHECK_FLOAT_PARAM(OP, "bias", (*(bias)), delta);                                                   \
      TORCH_CHECK((bias)->dim() == 1 && (bias)->size(0) == (n), "deltaconv::" OP                            \
                  ": argument 'bias' must have shape [", (n), "], got ", (bias)->sizes());                  \
    }                                                                                                       \
  } while (0)

// An int[2] argument: 2 values (1 value is broadcast), each checked against `min`.
std::pair<int, int> pair_arg(IntArrayRef a, const char* op, const char* name, int64_t min) {
  TORCH_CHECK(a.size() == 2 || a.size() == 1, "deltaconv::", op, ": argument '", name,
              "' must have 2 elements, got ", a);
  const int64_t v0 = a[0], v1 = a.size() == 2 ? a[1] : a[0];
  TORCH_CHECK(v0 >= min && v1 >= min && v0 <= kIntMax && v1 <= kIntMax, "deltaconv::", op, ": argument '", name,
              "' must be >= ", min, ", got ", a);
  return {static_cast<int>(v0), static_cast<int>(v1)};
}

const bool* key_ptr(const c10::optional<Tensor>& key) {
  return key.has_value() ? key->data_ptr<bool>() : nullptr;
}

// `key` made contiguous (a strided [N] view is accepted).
c10::optional<Tensor> contiguous_key(const c10::optional<Tensor>& key) {
  if (!key.has_value() || key->is_contiguous()) return key;
  return key->contiguous();
}

Tensor empty_delta(const Tensor& like, int64_t N, int64_t C, int64_t H, int64_t W) {
  return at::empty({N, C, H, W}, like.options().memory_format(at::MemoryFormat::ChannelsLast));
}

Tensor empty_mask(const Tensor& like, int64_t N, int64_t H, int64_t W) {
  return at::empty({N, 1, H, W}, like.options().dtype(at::kBool));
}

int num_sms() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

// Upper bound on the blocks of a grid-stride launch over a device-side work list.
int list_grid(int64_t items) { return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(items, 16 * num_sms()))); }

int elem_grid(int64_t total, int threads) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((total + threads - 1) / threads, 32 * num_sms())));
}

// Dynamic shared memory above the default 48 KiB needs an opt-in per kernel; false: too large.
template <typename Kernel>
bool allow_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return true;
  const size_t optin = at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin;
  if (bytes > optin) return false;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(optin)));
  return true;
}

// The geometry of a (transposed) convolution, sizes already checked to fit int.
ConvGeom conv_geom(int64_t N, int64_t Cin, int64_t H, int64_t W, int64_t Cout, int64_t Ho, int64_t Wo, int64_t KH,
                   int64_t KW, int sh, int sw, int ph, int pw, int dh, int dw, int64_t groups,
                   bool input_tf32 = false) {
  ConvGeom g{};
  g.input_tf32 = input_tf32;
  g.N = (int)N; g.Cin = (int)Cin; g.H = (int)H; g.W = (int)W;
  g.Cout = (int)Cout; g.Ho = (int)Ho; g.Wo = (int)Wo;
  g.KH = (int)KH; g.KW = (int)KW; g.sh = sh; g.sw = sw; g.ph = ph; g.pw = pw; g.dh = dh; g.dw = dw;
  g.groups = (int)groups; g.cin_g = (int)(Cin / groups); g.cout_g = (int)(Cout / groups);
  g.tiles_h = (int)ceil_div((int)Ho, conv::TILE_H);
  g.tiles_w = (int)ceil_div((int)Wo, conv::TILE_W);
  return g;
}

// A work list: list[1 + i] = id i, list[1 + cap + i] = its side data (when side), and the call's
// conv::kConvCounters counters (count[0]: the item count, then TileSplit::counts and the ints of
// block_work), all zero before the mask kernel appends. `counters` (when given): those ints, zeroed
// by the caller (a converted model zeroes the counters of all its convolutions with one kernel per
// frame); else they are the first ints of the list's own buffer, zeroed here by a one-block kernel,
// not a memset: in a CUDA graph a memset node between kernel nodes cost 2.1 us against 1.1 us for a
// small kernel (H200, 2026-11-21; benchmarks/results/launch_ab.txt).
struct WorkList {
  Tensor buf;  // owns the list (and the local counters)
  int* list;   // list[1 + i]: id i
  int* count;  // the call's counters: count[0] items, see conv::kConvCounters
};

WorkList work_list(const Tensor& like, int64_t items, cudaStream_t stream, const c10::optional<Tensor>& counters,
                   bool side = true) {
  const int64_t ids = 1 + (side ? 2 : 1) * items;
  if (counters.has_value()) {
    Tensor buf = at::empty({ids}, like.options().dtype(at::kInt));
    return {buf, buf.data_ptr<int>(), counters->data_ptr<int>()};
  }
  Tensor buf = at::empty({conv::kConvCounters + ids}, like.options().dtype(at::kInt));
  int* base = buf.data_ptr<int>();
  launch_kernel(conv::clear_counters_kernel, 1, 32, 0, stream, base, conv::kConvCounters);
  return {buf, base + conv::kConvCounters, base};
}

// The optional `counters` argument of conv2d / conv_transpose2d: int32, contiguous, 1-D, on the
// device of `delta`, with at least conv::kConvCounters elements (what any path of one call uses).
#define DC_CHECK_COUNTERS(OP, counters, delta)                                                              \
  do {                                                                                                      \
    if (counters.has_value()) {                                                                             \
      DC_CHECK_BESIDE_DELTA(OP, "counters", (*counters), delta, at::kInt);                                  \
      TORCH_CHECK(counters->dim() == 1 && counters->is_contiguous() &&                                      \
                      counters->numel() >= conv::kConvCounters,                                             \
                  "deltaconv::" OP ": argument 'counters' must be a contiguous 1-D tensor of at least ",     \
                  conv::kConvCounters, " elements, got shape ", counters->sizes(), " and strides ",          \
                  counters->strides());                                                                     \
    }                                                                                                       \
  } while (0)

// Tile mask + direct (fallback / transposed) compute.
template <bool TRANSPOSED>
void launch_tile_mask(const Tensor& m, const c10::optional<Tensor>& key, const Tensor& mask_out, const WorkList& wl,
                      const ConvGeom& g, int64_t tiles, cudaStream_t stream,
                      const conv::TileSplit& split = conv::TileSplit()) {
  const int64_t blocks = (int64_t)ceil_div(g.tiles_w, conv::MASK_STRIP) * g.tiles_h * g.N;
  TORCH_CHECK(blocks <= kIntMax, "deltaconv::conv: output too large");
  auto kernel = (!TRANSPOSED && g.KH == 3 && g.KW == 3) ? conv::conv_tile_mask_kernel<TRANSPOSED, 3>
                                                         : conv::conv_tile_mask_kernel<TRANSPOSED, 0>;
  launch_kernel(kernel, static_cast<unsigned>(blocks), conv::MASK_THREADS, 0, stream, m.data_ptr<bool>(), key_ptr(key),
                mask_out.data_ptr<bool>(), wl.list, wl.count, g, (int)tiles, split);
}

template <bool TRANSPOSED>
void launch_direct(const Tensor& x, const Tensor& m, const Tensor& w, const c10::optional<Tensor>& b,
                   const c10::optional<Tensor>& key, const Tensor& y, const WorkList& wl, const ConvGeom& g,
                   int64_t tiles, cudaStream_t stream) {
  DC_DISPATCH_ACTIVATION_TYPES(x.scalar_type(), "deltaconv::conv (direct)", [&] {
    launch_kernel(conv::conv_direct_kernel<scalar_t, TRANSPOSED>, list_grid(tiles), conv::CONV_THREADS, 0, stream,
                  reinterpret_cast<const scalar_t*>(x.const_data_ptr()), m.data_ptr<bool>(),
                  reinterpret_cast<const scalar_t*>(w.const_data_ptr()),
                  b.has_value() ? reinterpret_cast<const scalar_t*>(b->const_data_ptr()) : nullptr, key_ptr(key),
                  reinterpret_cast<scalar_t*>(y.data_ptr()), wl.list, wl.count, g);
  });
}

// ------------------------------------------------------------------------ tensor-core launchers
// DELTACONV_TC=0 disables the tensor-core paths and the vectorised depthwise kernel (read on every
// call, for A/B measurements against the scalar CUDA-core kernels).
// DELTACONV_TC_FINE_MAX=<tiles> overrides the device-side switch between the coarse and the fine
// 3x3 launch (-1: always coarse, a huge value: always fine).
bool tc_enabled() { return env_switch("DELTACONV_TC"); }

// Whether the tensor-core convolutions take the delta x: fp16 / bf16, and not switched off.
bool tc_dtype_ok(const Tensor& x) {
  return tc_enabled() && (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16);
}

// Whether an fp32 delta x runs on the tensor cores in TF32: where PyTorch lets cuDNN's float32
// convolutions use TF32 (torch.backends.cudnn.allow_tf32, on by default: the dense model's own
// precision), on the same kernels as fp16 (conv_tc.cuh, TcElem: K chunks of 32 channels); else on the
// exact CUDA-core kernels. The deltas are rounded to nearest TF32 in shared memory, the weights read
// as they come (truncated by the tensor cores; deltaconv's convolutions round them to nearest with
// their fold). Read on every call, as cuDNN reads it. DELTACONV_TC_TF32=0 keeps fp32 off the tensor
// cores (A/B runs).
bool tf32_ok(const Tensor& x) {
  return x.scalar_type() == at::kFloat && tc_enabled() && at::globalContext().allowTF32CuDNN() &&
         env_switch("DELTACONV_TC_TF32");
}

// Calls f with a value of the element type of the tensor-core kernels for x (tc_dtype_ok or tf32_ok):
// __half, __nv_bfloat16, or float (TF32).
template <typename F>
void with_tc_type(const Tensor& x, F&& f) {
  if (x.scalar_type() == at::kHalf) f(__half());
  else if (x.scalar_type() == at::kBFloat16) f(__nv_bfloat16());
  else f(float());
}

// ... and their GEMM a conv (groups 1) of Cin -> Cout channels over `taps` taps: fp16 / bf16, or
// fp32 in TF32; channels in multiples of 8, 16-byte aligned rows, the weight's elements countable in
// int.
bool tc_gemm_ok(const Tensor& x, int64_t Cin, int64_t Cout, int64_t taps) {
  return (tc_dtype_ok(x) || tf32_ok(x)) && Cin % 8 == 0 && Cout % 8 == 0 && Cout * taps * Cin < kIntMax &&
         reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16 == 0;
}

// Output channels not a multiple of 8 (a 21-class segmentation classifier, a detection head): the
// tensor-core paths need Cout % 8 == 0, so such a conv runs on them with its weights and bias padded
// by zero filters to the next multiple of 8, and the first Cout channels of that output copied into
// a tensor of their own (one small copy kernel), where it would otherwise take the CUDA-core kernels.
// Only where the padded conv meets the tensor cores' other conditions (tc_gemm_ok, at most
// kMaxTaps taps). DELTACONV_TC_PAD=0 turns it off (read on every call: A/B runs, tests of both).
int64_t padded_cout(const Tensor& x, int64_t Cin, int64_t Cout, int64_t groups, int64_t taps) {
  const int64_t cout8 = (Cout + 7) / 8 * 8;
  if (cout8 == Cout || groups != 1 || !env_switch("DELTACONV_TC_PAD") || taps > conv::tc::kMaxTaps ||
      !tc_gemm_ok(x, Cin, cout8, taps))
    return 0;
  return cout8;
}

// `weight` [Cout, ...] and `bias` [Cout] padded with zeros to `cout8` output channels.
std::pair<Tensor, c10::optional<Tensor>> pad_filters(const Tensor& weight, const c10::optional<Tensor>& bias,
                                                    int64_t cout8) {
  const int64_t extra = cout8 - weight.size(0);
  Tensor w = at::constant_pad_nd(weight, {0, 0, 0, 0, 0, 0, 0, extra});
  c10::optional<Tensor> b;
  if (bias.has_value()) b = at::constant_pad_nd(*bias, {0, extra});
  return {w, b};
}

// Whether the build has the sm_90a code (DC_SM90A) and the current device is compute capability 9.0.
bool sm90a_device() {
#if defined(DC_SM90A) && DC_SM90A
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  return prop->major == 9 && prop->minor == 0;
#else
  return false;
#endif
}

// Hopper's wgmma runs the gathered-rows GEMM (1x1 convs, gathered taps) and the stride-1 3x3 tile
// kernel when the build has the sm_90a target (DC_SM90A: setup.py's default TORCH_CUDA_ARCH_LIST
// "9.0a") and the device is compute capability 9.0; otherwise they use mma.sync.
// DELTACONV_WGMMA=0 forces mma.sync (read on every call: A/B runs, tests of both paths).
bool wgmma_enabled() { return env_switch("DELTACONV_WGMMA") && sm90a_device(); }

// Opt-in to the device's maximum dynamic shared memory (less the kernel's static shared memory)
// once per kernel, and the resident blocks per multiprocessor (>= 1) at `threads` threads and
// `smem` bytes, cached per (kernel, device, threads, smem).
template <typename Kernel>
int prepare_kernel(Kernel kernel, int threads, int smem) {
  return cached_per_kernel(reinterpret_cast<const void*>(kernel), std::make_pair(threads, smem), [&] {
    cudaFuncAttributes attr;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel)));
    const int optin = (int)at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin - (int)attr.sharedSizeBytes;
    TORCH_CHECK(smem <= optin, "deltaconv: tensor-core kernel needs ", smem, " bytes of dynamic shared memory, the "
                "device has ", optin, " beside its ", attr.sharedSizeBytes, " static bytes");
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    int occ = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, smem));
    return std::max(occ, 1);
  });
}

// The value of the tuning variable `name` (unset or empty: `def`); a value that is not a whole
// number is an error that names the variable and the value.
double env_number(const char* name, double def) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return def;
  char* end = nullptr;
  const double r = std::strtod(v, &end);
  TORCH_CHECK(end != v && *end == 0 && std::isfinite(r), "deltaconv: environment variable ", name,
              " must be a number, got '", v, "'");
  return r;
}

int64_t env_int(const char* name, int64_t def) {
  const double r = env_number(name, (double)def);
  TORCH_CHECK(r == std::floor(r), "deltaconv: environment variable ", name, " must be an integer, got '",
              std::getenv(name), "'");
  return (int64_t)std::max<double>(std::min<double>(r, 9.0e18), -9.0e18);
}

conv::tc::TcArgs tc_args(const Tensor& x, const Tensor& m_or_empty, const Tensor& w, const c10::optional<Tensor>& b,
                         const c10::optional<Tensor>& key, const Tensor& y, const WorkList& wl, const ConvGeom& g) {
  conv::tc::TcArgs a{};
  a.x = x.const_data_ptr();
  a.mask = m_or_empty.data_ptr<bool>();
  a.w = w.const_data_ptr();
  a.bias = b.has_value() ? b->const_data_ptr() : nullptr;
  a.key = key_ptr(key);
  a.y = y.data_ptr();
  a.list = wl.list;
  a.count = wl.count;
  a.g = g;
  a.fine_max = 0;
  a.cap = 0;
  a.prefetch = 2;
  a.split_counts = nullptr;
  a.split_min = 0;
  a.spread = nullptr;
  a.sms = num_sms();
  a.k_split = nullptr;
  return a;
}

// The fine 3x3 launch (and the gathered-rows GEMM, from kGatherSplitChunks chunks) runs in
// thread-block clusters of this many CTAs, the most that may split an item's K (its `chunks` input
// chunks, of 64 channels, 32 in fp32; the kernel chooses the split on the device with k_split_ctas
// and records it in the call's counters): DELTACONV_TC_KSPLIT = 1, 2 or 4 (read on
// every call; A/B runs, tests of every split; 4 measured slower than 2 from 33 tiles of C = 256 on:
// benchmarks/results/fine_ksplit_ab.txt), at most the tile's chunks, and 1 without clusters (before
// Hopper, or code not compiled for sm_90).
constexpr int kKSplitCluster = 2;
template <typename Kernel>
int k_split_cluster(Kernel kernel, int64_t chunks) {
  const int64_t v = env_int("DELTACONV_TC_KSPLIT", kKSplitCluster);
  TORCH_CHECK(v == 1 || v == 2 || v == 4, "deltaconv: environment variable DELTACONV_TC_KSPLIT must be 1, 2 or 4, got '",
              std::getenv("DELTACONV_TC_KSPLIT"), "'");
  if (v == 1 || !runs_sm90_code(kernel)) return 1;
  int ks = (int)v;
  while (ks > 1 && ks > chunks) ks /= 2;
  return ks;
}

// cuTensorMapEncodeTiled from the driver (fetched once); `fallback` (how to run without it) goes into
// the error when the driver lacks it.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(const char* fallback) {
  static const std::pair<PFN_cuTensorMapEncodeTiled_v12000, int> fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    return std::make_pair(reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f), (int)found);
  }();
  TORCH_CHECK(fn.first != nullptr && fn.second == (int)cudaDriverEntryPointSuccess,
              "deltaconv: the CUDA driver does not provide cuTensorMapEncodeTiled (query result ", fn.second, "); ",
              fallback);
  return fn.first;
}

// The weight of a 3x3 or 1x1 conv ([Cout][taps][Cin], taps 9 or 1, T = fp16, bf16 or fp32 at `w`) as
// the 2-D tensor map the TMA copies of the weight-stationary and the warp-specialised kernels read
// (conv3x3_stationary.cuh, conv3x3_ring.cuh, conv1x1_ring.cuh): Cout rows of taps * Cin values,
// boxes of `bn` rows x 128 bytes (TcElem<T>::kChunk values) with the 128-byte swizzle; rows past Cout
// read as zeros. fp32 values are copied as they are (the tensor cores read them as TF32). The map
// holds the address and is encoded on every call (host work), so a captured graph keeps the weight
// it was captured with, as for every other argument. `fallback`: the switch that runs without the
// kernel, for the error.
template <typename T>
CUtensorMap conv_weight_map(const void* w, const ConvGeom& g, int taps, int bn, const char* fallback) {
  const auto encode = tensor_map_encoder(fallback);
  TORCH_CHECK(aligned16(w), "deltaconv::conv2d: the ", taps == 9 ? "3x3" : "1x1", " weight's data must be 16-byte "
              "aligned, got address ", w);
  CUtensorMap map;
  const cuuint64_t dims[2] = {(cuuint64_t)taps * g.Cin, (cuuint64_t)g.Cout};
  const cuuint64_t row_bytes[1] = {(cuuint64_t)taps * g.Cin * sizeof(T)};
  const cuuint32_t box[2] = {(cuuint32_t)conv::tc::TcElem<T>::kChunk, (cuuint32_t)bn};
  const cuuint32_t step[2] = {1, 1};
  const CUtensorMapDataType type = std::is_same<T, __half>::value          ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                   : std::is_same<T, __nv_bfloat16>::value ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const CUresult r = encode(&map, type, 2,
                            const_cast<void*>(w), dims, row_bytes, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(r == CUDA_SUCCESS, "deltaconv::conv2d: cuTensorMapEncodeTiled failed (CUresult ", (int)r,
              ") for a weight of ", g.Cout, " x ", taps, " taps x ", g.Cin);
  return map;
}

// The input of a depthwise conv (`x`: [N, C, H, W] channels_last, 16-byte aligned, C * its element
// size a multiple of 16 bytes) as the 4-D tensor map (C innermost, W, H, N) of the depthwise
// kernel's TMA halo copies (conv_kernels.cuh): boxes of `fw` x `fw` pixels x `cb` channels, no
// swizzle; box elements outside the tensor read as zeros. Encoded on every call, as
// conv_weight_map.
CUtensorMap depthwise_halo_map(const Tensor& x, int cb, int fw) {
  const auto encode = tensor_map_encoder("set DELTACONV_DW_TMA=0 to stage the depthwise halo without it");
  const CUtensorMapDataType type = x.scalar_type() == at::kHalf       ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                   : x.scalar_type() == at::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const cuuint64_t es = (cuuint64_t)x.element_size();
  const cuuint64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  CUtensorMap map;
  const cuuint64_t dims[4] = {C, W, H, N};
  const cuuint64_t strides[3] = {C * es, W * C * es, H * W * C * es};  // bytes, of dims 1..3
  const cuuint32_t box[4] = {(cuuint32_t)cb, (cuuint32_t)fw, (cuuint32_t)fw, 1};
  const cuuint32_t step[4] = {1, 1, 1, 1};
  const CUresult r = encode(&map, type, 4, const_cast<void*>(x.const_data_ptr()), dims, strides, box, step,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(r == CUDA_SUCCESS, "deltaconv::conv2d: cuTensorMapEncodeTiled failed (CUresult ", (int)r,
              ") for a depthwise input of ", x.sizes(), ", boxes of ", fw, " x ", fw, " x ", cb);
  return map;
}

// The weight-stationary 3x3 kernel (conv3x3_stationary.cuh) on its tiles: a block per
// multiprocessor and BN-channel block of C_out, its weight slice loaded once. Alone (1 or 2 K
// chunks: a.fine_max = the largest int, every tile) or in place of conv3x3_tc_kernel's fine launch.
template <typename T, int CHUNKS, int BN>
void launch_tc_3x3_stationary(const conv::tc::TcArgs& a, int64_t tiles, cudaStream_t stream) {
  using Cfg = conv::tc::StationaryCfg<CHUNKS, BN>;
  auto kernel = conv::tc::conv3x3_stationary_kernel<T, CHUNKS, BN>;
  (void)prepare_kernel(kernel, Cfg::THREADS, Cfg::smem());
  const int nb = ceil_div(a.g.Cout, Cfg::BN);
  const int64_t gx = std::max<int64_t>(1, std::min<int64_t>((tiles + Cfg::WGS - 1) / Cfg::WGS, num_sms() / nb));
  const CUtensorMap w_map = conv_weight_map<T>(a.w, a.g, 9, BN,
                                            "set DELTACONV_TC_STATIONARY=0 to use the 3x3 kernels without it");
  launch_kernel(kernel, dim3((unsigned)gx, (unsigned)nb), Cfg::THREADS, Cfg::smem(), stream, a, w_map);
}

// Whether the coarse 3x3 launch runs on the warp-specialised kernel (conv3x3_ring.cuh) in place of
// conv3x3_tc_kernel: Hopper wgmma, stride 1 or 2 (the caller's), 128 channels of C_out per block
// (the caller's), C_in in whole K chunks (TcElem<T>::kChunk). DELTACONV_TC_RING=0: never (read on
// every call: A/B runs, tests of both).
template <typename T>
bool ring_enabled(const ConvGeom& g) {
  return g.Cin % conv::tc::TcElem<T>::kChunk == 0 && wgmma_enabled() && env_switch("DELTACONV_TC_RING");
}

// One 3x3 configuration: (coarse, fine) pair of instantiations for one dtype / stride / width /
// dilation. STAT: the weight-stationary kernel with 4 K chunks of C_in and 32 channels per
// block takes the fine launch's tiles (few tiles, and the coarse launch's tail). The coarse launch
// runs on the warp-specialised kernel where ring_enabled (stride 1 with WG or stride 2 without
// dilation, 128-channel blocks).
template <typename T, int S, int TPB, int NWc, int NTc, int NWf, int NTf, int D = 1, bool WG = false,
          bool STAT = false>
void run_tc_3x3(conv::tc::TcArgs a, int64_t tiles, cudaStream_t stream) {
  using CC = conv::tc::Conv3Cfg<S, TPB, NWc, NTc, D>;
  using CF = conv::tc::Conv3Cfg<S, 1, NWf, NTf, D>;
  using RC = conv::tc::RingCfg<D, S>;
  static_assert(CC::BN == CF::BN, "coarse and fine launches must split Cout alike");
  auto kc = conv::tc::conv3x3_tc_kernel<T, S, TPB, NWc, NTc, false, D, WG>;
  auto kf = conv::tc::conv3x3_tc_kernel<T, S, 1, NWf, NTf, true, D, WG>;
  auto kr = conv::tc::conv3x3_ring_kernel<T, D, S>;
  // (stride 2 runs mma.sync in the halo kernel, WG false, and on the warp-specialised one wgmma)
  const bool ring = (S == 1 ? WG : D == 1) && CC::BN == RC::BN && ring_enabled<T>(a.g);
  a.cap = (int)tiles;
  const int smem_c = CC::smem(conv::tc::conv3x3_weight_slots(WG, false));
  const int smem_f = CF::smem(conv::tc::conv3x3_weight_slots(WG, true));
  const int occ_c = ring ? prepare_kernel(kr, RC::THREADS, RC::smem()) : prepare_kernel(kc, CC::THREADS, smem_c);
  const int tpb = ring ? RC::WGS : TPB;  // tiles per group of the coarse launch
  if constexpr (!STAT) (void)prepare_kernel(kf, CF::THREADS, smem_f);
  const int sms = num_sms();
  const int nb = ceil_div(a.g.Cout, CC::BN);
  // The coarse launch unless it would fill less than half of the machine (the count is only
  // known on the device: both are launched and one returns at once). The warp-specialised kernel
  // spreads few tiles over all its blocks, a tile per warpgroup: it takes them from a tile per two
  // multiprocessors on (C = 256 at 270 x 480: 22.9 against 24.4 us at 50 tiles, 27.1 against 37.6
  // at 132; dilation 2: faster from 33 tiles on; H200, 2026-11-22, benchmarks/results/ring_ab.txt),
  // and at stride 2, where the fine launch runs mma.sync, every tile: resnet50's stride-2 convs at
  // 1080p input, 1-25 % changed, took 14.1-34.6 us on it against 14.2-56.9 on the fine launch
  // (ring_ab.txt section 9), so the fine launch is not launched at all.
  int64_t fine_max = ring ? (S == 2 ? -1 : sms / (2 * nb))
                          : (int64_t)occ_c * sms * tpb / (2 * nb);
  fine_max = env_int("DELTACONV_TC_FINE_MAX", fine_max);
  a.fine_max = (int)std::max<int64_t>(std::min<int64_t>(fine_max, kIntMax), -1);
  const int64_t groups_c = (tiles + tpb - 1) / tpb;
  const int64_t gx_c = std::max<int64_t>(1, std::min<int64_t>(groups_c, std::max<int64_t>(1, (int64_t)occ_c * sms / nb)));
  const int64_t gx_f = std::max<int64_t>(1, std::min<int64_t>(tiles, std::max<int64_t>(a.fine_max, 1)));
  const int cluster =
      a.fine_max >= 0 && !STAT ? k_split_cluster(kf, ceil_div(a.g.Cin, conv::tc::TcElem<T>::kChunk)) : 1;
  // A tail of at most half a multiprocessor's worth of jobs past one round of the coarse launch
  // runs on the fine one (conv::tc::coarse_tile_end; k_split_grid gives it a slot per tile), where
  // it splits its K: a CTA pair per job, one CTA per multiprocessor (STAT: the weight-stationary
  // kernel takes it, the same bound). Longer tails (two split CTAs per
  // multiprocessor) were up to 13 % slower than a second coarse round (H200, 2026-11-22;
  // benchmarks/results/coarse_tail_ab.txt section 6). Which tiles form the tail follows the work
  // list's order, which its atomics make vary from call to call, and a split tile's sum is rounded
  // differently: so not under torch.use_deterministic_algorithms(True). DELTACONV_TC_TAIL=0: never
  // (A/B runs, tests).
  a.coarse_round = (int)std::min<int64_t>(gx_c * tpb, kIntMax);
  const bool tail = (STAT || cluster > 1) && env_switch("DELTACONV_TC_TAIL") &&
                    !at::globalContext().deterministicAlgorithms();
  a.tail_max = tail ? (int)std::min<int64_t>(sms / (2 * nb), gx_f) : 0;
  if (a.fine_max < tiles) {  // the coarse launch can have work
    if (ring) {
      const CUtensorMap w_map = conv_weight_map<T>(a.w, a.g, 9, RC::BN,
                                                "set DELTACONV_TC_RING=0 to use the 3x3 kernels without it");
      launch_kernel(kr, dim3((unsigned)gx_c, (unsigned)nb), RC::THREADS, RC::smem(), stream, a, w_map);
    } else {
      launch_kernel(kc, dim3((unsigned)gx_c, (unsigned)nb), CC::THREADS, smem_c, stream, a);
    }
  }
  if (a.fine_max >= 0) {  // the fine launch can have work
    if constexpr (STAT) {
      launch_tc_3x3_stationary<T, 4, 32>(a, gx_f, stream);
    } else {
      const int64_t gx = conv::tc::k_split_grid(gx_f, gx_f, cluster, nb, sms);
      launch_kernel_clustered(kf, dim3((unsigned)gx, (unsigned)nb), CF::THREADS, smem_f, stream, (unsigned)cluster, a);
    }
  }
}

// 1 or 2 K chunks of C_in (64 / 128 channels of fp16 / bf16, 32 / 64 of fp32): the weight-stationary
// kernel takes every tile, one launch.
template <typename T, int CHUNKS>
void run_tc_3x3_stationary(conv::tc::TcArgs a, int64_t tiles, cudaStream_t stream) {
  a.cap = (int)tiles;
  a.fine_max = kIntMax;
  a.coarse_round = 0;
  a.tail_max = 0;
  launch_tc_3x3_stationary<T, CHUNKS, 64>(a, tiles, stream);
}

// The 128-byte K chunks of C_in (C_in / TcElem<T>::kChunk: 64 channels of fp16 / bf16, 32 of fp32)
// of a 3x3 conv that runs on the weight-stationary kernel, 0 for one that does not: Hopper wgmma,
// stride 1, dilation 1, 1 or 2 chunks (every tile: its weights fit in shared memory beside the halos
// of four or three warpgroups; 64 channels of C_out per block) or 4 (32 channels of C_out per block,
// in place of the fine launch of conv3x3_tc_kernel). DELTACONV_TC_STATIONARY=0: none
// (conv3x3_tc_kernel's coarse and fine launches instead; read on every call: A/B runs, tests of both
// kernels).
template <typename T>
int stationary_chunks(const ConvGeom& g, bool stride2, int dilation) {
  constexpr int ck = conv::tc::TcElem<T>::kChunk;
  const int chunks = g.Cin % ck == 0 ? g.Cin / ck : 0;
  if (stride2 || dilation != 1 || (chunks != 1 && chunks != 2 && chunks != 4)) return 0;
  return wgmma_enabled() && env_switch("DELTACONV_TC_STATIONARY") ? chunks : 0;
}

// dilation 2 and 4 (the dilated backbones of the segmentation models) only with stride 1;
// wgmma (stride 1): a warpgroup per tile, 2 tiles per block in the coarse launch, 1 in the fine one.
// fp32 (TF32) as fp16, in K chunks of 32 channels.
template <typename T>
void dispatch_tc_3x3(const conv::tc::TcArgs& a, int64_t tiles, bool stride2, bool wide, int dilation,
                     cudaStream_t stream) {
  switch (stationary_chunks<T>(a.g, stride2, dilation)) {
    case 1: run_tc_3x3_stationary<T, 1>(a, tiles, stream); return;
    case 2: run_tc_3x3_stationary<T, 2>(a, tiles, stream); return;
    case 4:
      if (wide) run_tc_3x3<T, 1, 2, 4, 4, 4, 4, 1, true, true>(a, tiles, stream);
      else run_tc_3x3<T, 1, 2, 4, 2, 4, 2, 1, true, true>(a, tiles, stream);
      return;
    default: break;
  }
  if (!stride2 && wgmma_enabled()) {
    switch (dilation * 2 + (wide ? 1 : 0)) {
      case 3: run_tc_3x3<T, 1, 2, 4, 4, 4, 4, 1, true>(a, tiles, stream); break;
      case 2: run_tc_3x3<T, 1, 2, 4, 2, 4, 2, 1, true>(a, tiles, stream); break;
      case 5: run_tc_3x3<T, 1, 2, 4, 4, 4, 4, 2, true>(a, tiles, stream); break;
      case 4: run_tc_3x3<T, 1, 2, 4, 2, 4, 2, 2, true>(a, tiles, stream); break;
      case 9: run_tc_3x3<T, 1, 2, 4, 4, 4, 4, 4, true>(a, tiles, stream); break;
      default: run_tc_3x3<T, 1, 2, 4, 2, 4, 2, 4, true>(a, tiles, stream); break;
    }
    return;
  }
  if (dilation == 2) {
    if (wide) run_tc_3x3<T, 1, 2, 2, 8, 4, 4, 2>(a, tiles, stream); else run_tc_3x3<T, 1, 2, 2, 4, 2, 4, 2>(a, tiles, stream);
  } else if (dilation == 4) {
    if (wide) run_tc_3x3<T, 1, 2, 2, 8, 4, 4, 4>(a, tiles, stream); else run_tc_3x3<T, 1, 2, 2, 4, 2, 4, 4>(a, tiles, stream);
  } else if (stride2) {
    if (wide) run_tc_3x3<T, 2, 2, 2, 8, 4, 4>(a, tiles, stream); else run_tc_3x3<T, 2, 2, 2, 4, 2, 4>(a, tiles, stream);
  } else {
    if (wide) run_tc_3x3<T, 1, 2, 2, 8, 4, 4>(a, tiles, stream); else run_tc_3x3<T, 1, 2, 2, 4, 2, 4>(a, tiles, stream);
  }
}

// weight [Cout, Cin, KH, KW] (any float dtype) -> [Cout, KH, KW, Cin] in the activation dtype, in one copy;
// none when the weight is that already (channels_last memory format in the activation dtype: the
// layout DCConv2d keeps for fp16 / bf16 convs). cin_to > Cin: input channels zero-padded to cin_to
// ([Cout][KH][KW][cin_to]), still one copy. The result is 16-byte aligned (the kernels copy it in
// 16-byte pieces): a view at another offset is copied too.
Tensor relayout_weight(const Tensor& weight, at::ScalarType dtype, int64_t cin_to = 0) {
  const int64_t cin = weight.size(1);
  const Tensor view = weight.permute({0, 2, 3, 1});  // [Cout][KH][KW][Cin]
  if (cin_to <= cin && weight.scalar_type() == dtype && view.is_contiguous() && aligned16(view.const_data_ptr()))
    return view;
  const bool pad = cin_to > cin;  // the padding channels must be zero
  const auto opts = weight.options().dtype(dtype);
  const std::vector<int64_t> sizes{weight.size(0), weight.size(2), weight.size(3), pad ? cin_to : cin};
  Tensor w2 = pad ? at::zeros(sizes, opts) : at::empty(sizes, opts);
  w2.narrow(3, 0, cin).copy_(view);
  return w2;
}

// A layer's weight and bias in the activation dtype, contiguous.
struct ConvWeights {
  Tensor w;
  c10::optional<Tensor> b;
};
// tc_layout: a 4-D weight in the tensor-core layout [Cout][KH][KW][Cin] (a 1x1 weight
// [Cout, Cin, 1, 1] is that layout already); otherwise the weight's own layout. cin_to > Cin (with
// tc_layout): input channels zero-padded to cin_to ([Cout][KH][KW][cin_to]).
ConvWeights conv_weights(const Tensor& weight, const c10::optional<Tensor>& bias, at::ScalarType dtype,
                         bool tc_layout = false, int64_t cin_to = 0) {
  ConvWeights t;
  t.w = tc_layout && (weight.size(2) * weight.size(3) != 1 || cin_to > weight.size(1))
            ? relayout_weight(weight, dtype, cin_to)
            : weight.to(dtype).contiguous();
  if (bias.has_value()) t.b = bias->to(dtype).contiguous();
  return t;
}

// The per-tile split of the 3x3 tensor-core conv (conv::TileSplit), opt-in: an active output tile
// with at most DELTACONV_TC_SPLIT active pixels (of 64; 16 is a good value) is sparse; the sparse
// tiles run as pixel rows of the gathered-taps GEMM when they have at least 64 pixels per
// multiprocessor (half the machine's worth of 128-row items; with fewer the GEMM is latency-bound),
// else with the others on the 3x3 kernel. Measured on an H200 (2026-11-21, fp16, CUDA graphs;
// benchmarks/results/tile_split_ab.txt): 1.17-1.34x faster at 5-25 % changed in 24-pixel blobs for
// C=64 / 128, 2-3 us slower per conv where the pixel rows do not run (one more launch); on the
// sample videos resnet50 and fcn_resnet50 ran 0.6-1.5 % slower per frame with it, so it is off by
// default.
constexpr int kSplitPixels = 0;
// DELTACONV_TC_SPLIT=<pixels> sets the sparse-tile bound (0: no split, 64: every tile sparse) and
// DELTACONV_TC_SPLIT_MIN=<pixel rows> the count from which the pixel rows run (0: always), both
// read on every call (A/B runs, tests of both paths).
int tile_split_pixels() {
  const int64_t v = env_int("DELTACONV_TC_SPLIT", kSplitPixels);
  TORCH_CHECK(v >= 0 && v <= conv::TILE_PIX, "deltaconv: environment variable DELTACONV_TC_SPLIT must be an integer "
              "from 0 to ", conv::TILE_PIX, ", got '", std::getenv("DELTACONV_TC_SPLIT"), "'");
  return (int)v;
}
int split_min_pixels() {
  const int64_t v = env_int("DELTACONV_TC_SPLIT_MIN", (int64_t)64 * num_sms());
  TORCH_CHECK(v >= 0, "deltaconv: environment variable DELTACONV_TC_SPLIT_MIN must be an integer >= 0, got '",
              std::getenv("DELTACONV_TC_SPLIT_MIN"), "'");
  return (int)std::min<int64_t>(v, kIntMax);
}

void launch_tc_3x3(const Tensor& x, const Tensor& m, const ConvWeights& tw, const c10::optional<Tensor>& key,
                   const Tensor& y, const WorkList& wl, const ConvGeom& g, int64_t tiles, cudaStream_t stream,
                   const conv::TileSplit& split) {
  conv::tc::TcArgs a = tc_args(x, m, tw.w, tw.b, key, y, wl, g);
  a.split_counts = split.counts;
  a.split_min = split.min_pixels;
  a.k_split = wl.count + conv::kKSplitAt;
  // DELTACONV_SPREAD=0: block-index order instead of block_work's ranks (A/B runs, tests of both
  // orders). The gathered-rows GEMM keeps block-index order: its blocks are short, and ranking them
  // made deeplabv3_mobilenet_v3_large 1.3 % slower per frame (H200, 2026-11-22; block_spread_ab.txt).
  a.spread = env_switch("DELTACONV_SPREAD") ? wl.count + conv::kSpreadAt : nullptr;
  // coarse launch: 2 tiles per block (two blocks per multiprocessor; 4 tiles per block, one block,
  // was 6-16 % slower at every density on an H200 with mma.sync, and up to 10 % slower with wgmma
  // except dilated C=256 at 135x240, scratch A/B 2026-11-21); Cout > 64: 128 channels per block
  const bool wide = g.Cout > 64;
  with_tc_type(x, [&](auto t) { dispatch_tc_3x3<decltype(t)>(a, tiles, g.sh == 2, wide, g.dh, stream); });
}

constexpr int kGatherSplitChunks = 8;

// Whether a 1x1 GEMM over at most `pixels` rows (kRows1x1, wgmma, 128 channels of C_out per block:
// the caller's) runs on the warp-specialised kernel (conv1x1_ring.cuh): C_in in whole K chunks
// (TcElem<T>::kChunk), and the frame holds at least an item of 64 rows per block of a full grid (a
// block per multiprocessor and channel block). Below that, even with every pixel changed, a block
// has one warpgroup busy, which runs its chunks one after another, and conv_gather_tc_kernel, which
// splits their K over clusters, is faster (2048 -> 512 channels at 34 x 60, resnet50's layer4 at 1080p: 28.1 against
// 38.8 us at 100 %, 27.0 against 28.2 at 25 %; H200, 2026-11-22, benchmarks/results/ring_ab.txt
// section 8). DELTACONV_TC_RING1=0: never; DELTACONV_TC_RING1_MIN=n: from n items on instead (tests
// force small frames onto it with 0). Both read on every call: A/B runs, tests of both.
template <typename T>
bool ring1_enabled(const ConvGeom& g, int64_t pixels) {
  using Cfg = conv::tc::Ring1Cfg;
  const int64_t min_items = env_int("DELTACONV_TC_RING1_MIN", num_sms() / ceil_div(g.Cout, Cfg::BN));
  return g.Cin % conv::tc::TcElem<T>::kChunk == 0 && (pixels + Cfg::BM - 1) / Cfg::BM >= min_items &&
         env_switch("DELTACONV_TC_RING1");
}

// conv1x1_ring_kernel over `pixels` (the list's capacity): a block per multiprocessor and
// 128-channel block of C_out, at most one group of WGS items per block in the first round.
template <typename T>
void launch_tc_1x1_ring(const conv::tc::TcArgs& a, int64_t pixels, cudaStream_t stream) {
  using Cfg = conv::tc::Ring1Cfg;
  auto kernel = conv::tc::conv1x1_ring_kernel<T>;
  (void)prepare_kernel(kernel, Cfg::THREADS, Cfg::smem());
  const int nb = ceil_div(a.g.Cout, Cfg::BN);
  const int64_t groups = ((pixels + Cfg::BM - 1) / Cfg::BM + Cfg::WGS - 1) / Cfg::WGS;
  const int64_t gx = std::max<int64_t>(1, std::min<int64_t>(groups, num_sms() / nb));
  const CUtensorMap w_map = conv_weight_map<T>(a.w, a.g, 1, Cfg::BN,
                                            "set DELTACONV_TC_RING1=0 to use the 1x1 kernel without it");
  launch_kernel(kernel, dim3((unsigned)gx, (unsigned)nb), Cfg::THREADS, Cfg::smem(), stream, a, w_map);
}

// The gathered-rows GEMM kernel (conv_tc.cuh): `items` = the list's capacity in its units (pixels,
// or tiles for kRowsTiles); for kRows1x1 the list's side data holds the input pixels. 1x1 convs with
// 128-channel blocks go to the warp-specialised kernel where ring1_enabled.
template <typename T, int NW, int NT, int ROWS, bool WG>
void run_tc_gather(conv::tc::TcArgs a, int64_t items, cudaStream_t stream) {
  using Cfg = conv::tc::Conv1Cfg<NW, NT, WG>;
  auto k = conv::tc::conv_gather_tc_kernel<T, NW, NT, ROWS, WG>;
  // prefetch distance in stages; wgmma keeps one more slot for the group in flight (wgmma_chunk)
  a.prefetch = (int)std::min<int64_t>(5, std::max<int64_t>(1, env_int("DELTACONV_TC_PREFETCH1", WG ? 1 : 2)));
  a.cap = (int)items;
  if constexpr (ROWS == conv::tc::kRows1x1 && WG && Cfg::BN == conv::tc::Ring1Cfg::BN) {
    if (ring1_enabled<T>(a.g, items)) {
      launch_tc_1x1_ring<T>(a, items, stream);
      return;
    }
  }
  const int smem = Cfg::smem(a.prefetch + (WG ? 2 : 1));
  const int occ = prepare_kernel(k, Cfg::THREADS, smem);
  const int nb = ceil_div(a.g.Cout, Cfg::BN);
  const int64_t rows = ROWS == conv::tc::kRowsTiles ? items * conv::TILE_PIX : items;
  const int64_t blocks = (rows + Cfg::BM - 1) / Cfg::BM;
  const int sms = num_sms();
  int64_t gx = std::max<int64_t>(1, std::min<int64_t>(blocks, std::max<int64_t>(1, (int64_t)occ * sms / nb)));
  // K split (as in run_tc_3x3's fine launch): clusters whose CTAs may share an item, a slot per item
  // at every split; the partial sums pass through the stage ring, which must hold them. Only from
  // kGatherSplitChunks chunks of C_in on: with 2 or 4 (C_in 128, 256) the split made the sweep's 1 %
  // cells 2 us slower; resnet50, whose deep 1x1 convs have 8-32, ran 1.5 % faster on one-by-one
  // (H200, 2026-11-22; benchmarks/results/fine_ksplit_ab.txt).
  const int mi = WG ? 2 : 4;
  const bool ring_fits = (int64_t)Cfg::THREADS * mi * NT * 16 <= (int64_t)(a.prefetch + (WG ? 2 : 1)) * Cfg::STAGE;
  const int chunks = ceil_div(a.g.Cin, conv::tc::TcElem<T>::kChunk);
  const bool long_k = chunks >= kGatherSplitChunks;
  const int cluster = ring_fits && long_k ? k_split_cluster(k, chunks) : 1;
  gx = conv::tc::k_split_grid(gx, blocks, cluster, nb, sms);
  launch_kernel_clustered(k, dim3((unsigned)gx, (unsigned)nb), Cfg::THREADS, smem, stream, (unsigned)cluster, a);
}

// 128 output channels per block for Cout > 64 (wide), else 64; wgmma or mma.sync (see wgmma_enabled).
template <typename T, int ROWS>
void dispatch_tc_gather(const conv::tc::TcArgs& a, int64_t items, bool wide, bool wg, cudaStream_t stream) {
  if (wide) {
    if (wg) run_tc_gather<T, 2, 8, ROWS, true>(a, items, stream); else run_tc_gather<T, 2, 8, ROWS, false>(a, items, stream);
  } else {
    if (wg) run_tc_gather<T, 2, 4, ROWS, true>(a, items, stream); else run_tc_gather<T, 2, 4, ROWS, false>(a, items, stream);
  }
}

template <int ROWS>
void launch_tc_gather(const Tensor& x, const Tensor& m, const ConvWeights& tw, const c10::optional<Tensor>& key,
                      const Tensor& y, const WorkList& wl, const ConvGeom& g, int64_t items, cudaStream_t stream,
                      const conv::TileSplit* split = nullptr) {
  conv::tc::TcArgs a = tc_args(x, m, tw.w, tw.b, key, y, wl, g);
  if (split != nullptr) a.split_min = split->min_pixels;  // kRowsPixels: the pixel rows of a 3x3 split
  // the K split in the call's counters (kRowsPixels runs beside the 3x3 kernel, which records its own)
  if (ROWS != conv::tc::kRowsPixels) a.k_split = wl.count + conv::kKSplitAt;
  const bool wide = g.Cout > 64;
  with_tc_type(x, [&](auto t) { dispatch_tc_gather<decltype(t), ROWS>(a, items, wide, wgmma_enabled(), stream); });
}

// The small-Cin kernel's input: x [N, C < R, H, W] channels_last -> [N, R, H, W] channels_last, R
// channels of 16 bytes (8 of fp16 / bf16, 4 of fp32), channels C..R-1 zero, written on the active
// pixels of m only (the others are never read).
Tensor pad_channels_row(const Tensor& x, const Tensor& m, cudaStream_t stream) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const bool fp32 = x.element_size() == 4;
  const int64_t cin = 16 / x.element_size();  // one 16-byte row per pixel
  Tensor out = at::empty({N, cin, H, W}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  const int64_t pixels = N * H * W;
  if (pixels == 0) return out;
  constexpr int threads = 256;
  const unsigned blocks = (unsigned)((pixels + threads - 1) / threads);
  if (fp32)
    launch_kernel(conv::tc::pad_channels_kernel<uint32_t>, blocks, threads, 0, stream,
                  reinterpret_cast<const uint32_t*>(x.const_data_ptr()), m.data_ptr<bool>(),
                  reinterpret_cast<uint4*>(out.data_ptr()), pixels, (int)C);
  else
    launch_kernel(conv::tc::pad_channels_kernel<uint16_t>, blocks, threads, 0, stream,
                  reinterpret_cast<const uint16_t*>(x.const_data_ptr()), m.data_ptr<bool>(),
                  reinterpret_cast<uint4*>(out.data_ptr()), pixels, (int)C);
  return out;
}

// conv_small_cin_tc_kernel over the tile list (conv_small_cin_tc.cuh): persistent blocks of 4 tiles
// x NW * 32 output channels (NW = 1 for Cout <= 32, else 2).
template <typename T, int S, int NW>
void run_small_cin_tc(conv::tc::TcArgs a, int64_t tiles, cudaStream_t stream) {
  constexpr int TPB = 4, NT = 4;
  using Cfg = conv::tc::SmallCinCfg<S, TPB, NW, NT>;
  auto k = conv::tc::conv_small_cin_tc_kernel<T, S, TPB, NW, NT>;
  a.cap = (int)tiles;
  const int smem = Cfg::smem(a.g);
  const int occ = prepare_kernel(k, Cfg::THREADS, smem);
  const int nb = ceil_div(a.g.Cout, Cfg::BN);
  const int64_t groups = (tiles + TPB - 1) / TPB;
  const int64_t gx = std::max<int64_t>(1, std::min<int64_t>(groups, std::max<int64_t>(1, (int64_t)occ * num_sms() / nb)));
  launch_kernel(k, dim3((unsigned)gx, (unsigned)nb), Cfg::THREADS, smem, stream, a);
}

void launch_small_cin_tc(const Tensor& x, const Tensor& m, const ConvWeights& tw, const c10::optional<Tensor>& key,
                         const Tensor& y, const WorkList& wl, const ConvGeom& g, int64_t tiles, cudaStream_t stream) {
  const conv::tc::TcArgs a = tc_args(x, m, tw.w, tw.b, key, y, wl, g);
  const bool narrow = g.Cout <= 32;
  auto run = [&](auto t) {
    using T = decltype(t);
    if (g.sh == 1) {
      if (narrow) run_small_cin_tc<T, 1, 1>(a, tiles, stream); else run_small_cin_tc<T, 1, 2>(a, tiles, stream);
    } else {
      if (narrow) run_small_cin_tc<T, 2, 1>(a, tiles, stream); else run_small_cin_tc<T, 2, 2>(a, tiles, stream);
    }
  };
  with_tc_type(x, run);
}

// Depthwise 3x3 / 5x5, stride 1 / 2, dilation 1 / 2 (equal along both axes), and 7x7 at stride 1
// and dilation 1 (ConvNeXt), channels in whole 16-byte vectors: the vectorised kernel.
// launch_dwconv_vec returns false (nothing launched) for any other case.
template <typename T, int KS, int S, int D, int NV, int PPT, bool TMA>
void run_dwconv_vec_nv(const Tensor& x, const Tensor& m, const Tensor& w, const c10::optional<Tensor>& b,
                       const c10::optional<Tensor>& key, const Tensor& y, const WorkList& wl, const ConvGeom& g,
                       int64_t tiles, cudaStream_t stream) {
  using Cfg = conv::DwVecCfg<T, KS, S, D, NV, PPT>;
  auto kernel = conv::dwconv_vec_kernel<T, KS, S, D, NV, PPT, TMA>;
  CUtensorMap x_map{};
  if constexpr (TMA) x_map = depthwise_halo_map(x, Cfg::CB, Cfg::FW);
  TORCH_CHECK(allow_smem(kernel, Cfg::SMEM), "deltaconv::conv2d: depthwise kernel needs ", Cfg::SMEM,
              " bytes of shared memory");
  // tiles are walked grid-stride: two waves of resident blocks are enough, and a frame with no tile
  // then launches a few hundred blocks instead of up to 16 per multiprocessor per channel block
  const int cblocks = ceil_div(g.Cout, Cfg::CB);
  const int waves2 = std::max(1, 2 * resident_blocks(kernel, Cfg::THREADS, Cfg::SMEM) / cblocks);
  const dim3 grid((unsigned)std::min(list_grid(tiles), waves2), (unsigned)cblocks);
  launch_kernel(kernel, grid, Cfg::THREADS, Cfg::SMEM, stream, reinterpret_cast<const T*>(x.const_data_ptr()),
                m.data_ptr<bool>(), reinterpret_cast<const T*>(w.const_data_ptr()),
                b.has_value() ? reinterpret_cast<const T*>(b->const_data_ptr()) : nullptr, key_ptr(key),
                reinterpret_cast<T*>(y.data_ptr()), wl.list, wl.count, g, x_map);
}

// Channel blocks of 4 vectors where they leave fewer vectors idle than blocks of 8 (32 or 96
// channels of fp16: 8-vector blocks would be half or three quarters full), else 8.
// DELTACONV_DW_NARROW=0 (read on every call, for A/B runs and tests): always 8.
inline bool dwconv_narrow_blocks(int cvecs) {
  if (!env_switch("DELTACONV_DW_NARROW")) return false;
  const int idle8 = ceil_div(cvecs, 8) * 8 - cvecs, idle4 = ceil_div(cvecs, 4) * 4 - cvecs;
  return idle4 < idle8;
}

// The default output pixels per thread of the vectorised depthwise kernel at `stride`.
constexpr int dwconv_auto_ppt(int stride) { return stride == 1 ? 4 : 2; }

// Output pixels per thread of the vectorised depthwise kernel: DELTACONV_DW_PPT=<1, 2 or 4> (read on
// every call, for A/B runs and tests of each), or 0 / unset: 4 at stride 1, where a thread's four
// adjacent outputs share the input columns it loads (1.25-1.36x faster than 2 at 50-100 % changed),
// and 2 at stride 2 (1.12-1.29x faster than 1 in 4-vector channel blocks, equal to 4 within 3 % in
// 8-vector ones). H200, 2026-11-22; benchmarks/results/dwconv_ab.txt sections 5 and 6.
int dwconv_pixels_per_thread(int stride) {
  const int64_t v = env_int("DELTACONV_DW_PPT", 0);
  TORCH_CHECK(v == 0 || v == 1 || v == 2 || v == 4, "deltaconv: environment variable DELTACONV_DW_PPT must be "
              "an integer among 0, 1, 2 and 4, got '", std::getenv("DELTACONV_DW_PPT"), "'");
  return v != 0 ? (int)v : dwconv_auto_ppt(stride);
}

// The depthwise halo copied by the copy engine (TMA: Hopper, an sm_90a build, channel blocks of 8
// vectors, the default pixels per thread), unless DELTACONV_DW_TMA=0 (read on every call, for A/B
// runs and tests of both): then by cp.async. In 8-vector blocks the TMA copy was 1.03-1.13x faster
// at 50-100 % changed (C=64 at 1080x1920: 0.215 against 0.237 ms at 100 %), equal at 10 %; in
// 4-vector blocks (64-byte box rows) 0.80-0.95x, so those stay on cp.async (H200, 2026-11-22;
// benchmarks/results/dwconv_ab.txt section 7).
bool dwconv_tma_enabled() { return env_switch("DELTACONV_DW_TMA") && sm90a_device(); }

template <typename T, int KS, int S, int D, int NV>
void run_dwconv_vec_ppt(const Tensor& x, const Tensor& m, const Tensor& w, const c10::optional<Tensor>& b,
                        const c10::optional<Tensor>& key, const Tensor& y, const WorkList& wl, const ConvGeom& g,
                        int64_t tiles, cudaStream_t stream) {
  constexpr int kAutoPpt = dwconv_auto_ppt(S);
  const int ppt = dwconv_pixels_per_thread(S);
  if constexpr (NV == 8) {
    if (ppt == kAutoPpt && dwconv_tma_enabled()) {
      run_dwconv_vec_nv<T, KS, S, D, NV, kAutoPpt, true>(x, m, w, b, key, y, wl, g, tiles, stream);
      return;
    }
  }
  switch (ppt) {
    case 4: run_dwconv_vec_nv<T, KS, S, D, NV, 4, false>(x, m, w, b, key, y, wl, g, tiles, stream); break;
    case 2: run_dwconv_vec_nv<T, KS, S, D, NV, 2, false>(x, m, w, b, key, y, wl, g, tiles, stream); break;
    default: run_dwconv_vec_nv<T, KS, S, D, NV, 1, false>(x, m, w, b, key, y, wl, g, tiles, stream); break;
  }
}

template <typename T, int KS, int S, int D>
void run_dwconv_vec(const Tensor& x, const Tensor& m, const Tensor& w, const c10::optional<Tensor>& b,
                    const c10::optional<Tensor>& key, const Tensor& y, const WorkList& wl, const ConvGeom& g,
                    int64_t tiles, cudaStream_t stream) {
  if (dwconv_narrow_blocks(g.Cout / conv::Vec16<T>::N))
    run_dwconv_vec_ppt<T, KS, S, D, 4>(x, m, w, b, key, y, wl, g, tiles, stream);
  else
    run_dwconv_vec_ppt<T, KS, S, D, 8>(x, m, w, b, key, y, wl, g, tiles, stream);
}

template <typename T>
bool dispatch_dwconv_vec(const Tensor& x, const Tensor& m, const Tensor& w, const c10::optional<Tensor>& b,
                         const c10::optional<Tensor>& key, const Tensor& y, const WorkList& wl, const ConvGeom& g,
                         int64_t tiles, cudaStream_t stream) {
  const int ks = g.KH, s = g.sh, d = g.dh;
#define DC_DWV(KS, S, D)                                                                  \
  if (ks == KS && s == S && d == D) {                                                     \
    run_dwconv_vec<T, KS, S, D>(x, m, w, b, key, y, wl, g, tiles, stream);                \
    return true;                                                                          \
  }
  DC_DWV(3, 1, 1) DC_DWV(3, 2, 1) DC_DWV(5, 1, 1) DC_DWV(5, 2, 1) DC_DWV(3, 1, 2) DC_DWV(5, 1, 2)
  DC_DWV(7, 1, 1)  // ConvNeXt's
#undef DC_DWV
  return false;
}

bool launch_dwconv_vec(const Tensor& x, const Tensor& m, const Tensor& w, const c10::optional<Tensor>& b,
                       const c10::optional<Tensor>& key, const Tensor& y, const WorkList& wl, const ConvGeom& g,
                       int64_t tiles, cudaStream_t stream) {
  const int64_t vec = 16 / x.element_size();
  const bool ok = g.KH == g.KW && g.sh == g.sw && g.dh == g.dw && g.Cout % vec == 0 &&
                  reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0;
  if (!ok || !tc_enabled()) return false;
  switch (x.scalar_type()) {
    case at::kFloat: return dispatch_dwconv_vec<float>(x, m, w, b, key, y, wl, g, tiles, stream);
    case at::kHalf: return dispatch_dwconv_vec<__half>(x, m, w, b, key, y, wl, g, tiles, stream);
    case at::kBFloat16: return dispatch_dwconv_vec<__nv_bfloat16>(x, m, w, b, key, y, wl, g, tiles, stream);
    default: return false;
  }
}

// A 1x1 conv (groups 1) over the pixel list `wl` (conv1x1_mask_kernel's or an activation's, see
// pw::append_sent_rows): the tensor-core GEMM when `use_tc` (`tw` from conv_weights(..., true)), else
// conv1x1_kernel on CUDA cores. y [N, Cout, Ho, Wo] channels_last, written at the listed pixels.
void launch_conv1x1(const Tensor& x, const Tensor& m, const ConvWeights& tw, const c10::optional<Tensor>& key,
                    const Tensor& y, const WorkList& wl, const ConvGeom& g, int64_t total, bool use_tc,
                    cudaStream_t stream) {
  if (use_tc) {
    launch_tc_gather<conv::tc::kRows1x1>(x, m, tw, key, y, wl, g, total, stream);
    return;
  }
  const Tensor& w = tw.w;
  const c10::optional<Tensor>& b = tw.b;
  const int64_t cob = (int64_t)g.groups * ((g.cout_g + conv::CONV_COB - 1) / conv::CONV_COB);  // <= 65535: checked
  const dim3 grid(list_grid((total + conv::TILE_PIX - 1) / conv::TILE_PIX), (unsigned)cob);
  DC_DISPATCH_ACTIVATION_TYPES(x.scalar_type(), "deltaconv::conv2d", [&] {
    launch_kernel(conv::conv1x1_kernel<scalar_t>, grid, conv::CONV_THREADS, 0, stream,
                  reinterpret_cast<const scalar_t*>(x.const_data_ptr()), m.data_ptr<bool>(),
                  reinterpret_cast<const scalar_t*>(w.const_data_ptr()),
                  b.has_value() ? reinterpret_cast<const scalar_t*>(b->const_data_ptr()) : nullptr, key_ptr(key),
                  reinterpret_cast<scalar_t*>(y.data_ptr()), wl.list, wl.count, g);
  });
}

// ------------------------------------------------------------------------------------- conv2d
// The geometry of a checked conv2d / conv1x1_into call: input [N, Cin, H, W], weight [Cout, Cin / groups,
// KH, KW], output [N, Cout, Ho, Wo]; strides, paddings and dilations in pixels.
struct ConvCall {
  int64_t N, Cin, H, W, Cout, KH, KW, Ho, Wo;
  int sh, sw, ph, pw, dh, dw;
};

// The argument checks of conv2d and conv1x1_into (OP: the op's name); returns the call's geometry.
#define DC_CHECK_CONV2D(OP, delta, mask, weight, bias, stride, padding, dilation, groups, key, counters, input_tf32, \
                        load_mask, bias_key)                                                                      \
  [&] {                                                                                                           \
    DC_CHECK_DELTA_MASK(OP, delta, mask);                                                                         \
    DC_CHECK_TF32_FLAG(OP, "input_tf32", input_tf32, delta);                                                      \
    DC_CHECK_KEY(OP, key, delta);                                                                                 \
    DC_CHECK_STREAM_FLAGS(OP, "bias_key", bias_key, delta);                                                       \
    if (load_mask.has_value()) {                                                                                  \
      DC_CHECK_BESIDE_DELTA(OP, "load_mask", (*load_mask), delta, at::kBool);                                     \
      TORCH_CHECK(load_mask->sizes() == mask.sizes(), "deltaconv::" OP ": argument 'load_mask' must have the "    \
                  "shape of 'mask', ", mask.sizes(), ", got ", load_mask->sizes());                               \
    }                                                                                                             \
    DC_CHECK_COUNTERS(OP, counters, delta);                                                                       \
    DC_CHECK_FLOAT_PARAM(OP, "weight", weight, delta);                                                            \
    DC_CHECK_DIM(OP, "weight", weight, 4);                                                                        \
    ConvCall c{};                                                                                                 \
    c.N = delta.size(0), c.Cin = delta.size(1), c.H = delta.size(2), c.W = delta.size(3);                         \
    TORCH_CHECK(groups >= 1 && groups <= kIntMax, "deltaconv::" OP ": argument 'groups' must be >= 1, got ",      \
                groups);                                                                                          \
    c.Cout = weight.size(0), c.KH = weight.size(2), c.KW = weight.size(3);                                        \
    TORCH_CHECK(c.Cin % groups == 0 && c.Cout % groups == 0 && weight.size(1) * groups == c.Cin,                  \
                "deltaconv::" OP ": argument 'weight' of shape ", weight.sizes(), " does not fit ", c.Cin,        \
                " input channels in ", groups, " groups");                                                        \
    TORCH_CHECK(c.Cout >= 1 && c.KH >= 1 && c.KW >= 1 && c.KH <= 4096 && c.KW <= 4096,                            \
                "deltaconv::" OP ": argument 'weight' has an empty or oversized shape ", weight.sizes());         \
    DC_CHECK_BIAS(OP, bias, c.Cout, delta);                                                                       \
    std::tie(c.sh, c.sw) = pair_arg(stride, OP, "stride", 1);                                                     \
    std::tie(c.ph, c.pw) = pair_arg(padding, OP, "padding", 0);                                                   \
    std::tie(c.dh, c.dw) = pair_arg(dilation, OP, "dilation", 1);                                                 \
    const int64_t span_h = c.H + 2 * c.ph - c.dh * (c.KH - 1) - 1, span_w = c.W + 2 * c.pw - c.dw * (c.KW - 1) - 1; \
    TORCH_CHECK(span_h >= 0 && span_w >= 0, "deltaconv::" OP ": the (padded) input of size ", c.H, "x", c.W,     \
                " is smaller than the dilated kernel ", c.dh * (c.KH - 1) + 1, "x", c.dw * (c.KW - 1) + 1);       \
    c.Ho = span_h / c.sh + 1, c.Wo = span_w / c.sw + 1;                                                           \
    TORCH_CHECK(c.N * c.Ho * c.Wo <= kIntMax && c.Cout <= kIntMax, "deltaconv::" OP ": output too large");        \
    return c;                                                                                                     \
  }()

// The 1x1 convolution (groups 1, any stride and padding) of conv2d and conv1x1_into: the mask pass (the
// output pixels of m and key: mask_out [N, 1, Ho, Wo] and the work list), then the GEMM (use_tc) or the
// CUDA-core kernel at those pixels of y [N, Cout, Ho, Wo] channels_last, reading the input pixels of lm
// and adding the bias on the streams of ck.
void run_conv1x1_masked(const Tensor& x, const Tensor& m, const Tensor& lm, const Tensor& weight,
                        const c10::optional<Tensor>& bias, const c10::optional<Tensor>& key,
                        const c10::optional<Tensor>& ck, const Tensor& y, const Tensor& mask_out, const ConvGeom& g,
                        const c10::optional<Tensor>& counters, bool use_tc, cudaStream_t stream) {
  const int64_t total = (int64_t)g.N * g.Ho * g.Wo;
  const WorkList wl = work_list(x, total, stream, counters);
  const ConvWeights tw = conv_weights(weight, bias, x.scalar_type(), use_tc);
  constexpr int64_t per_block = conv::MASK1_THREADS * conv::MASK1_PPT;
  const bool same = g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0 &&
                    reinterpret_cast<uintptr_t>(m.const_data_ptr()) % 4 == 0 &&
                    reinterpret_cast<uintptr_t>(mask_out.const_data_ptr()) % 4 == 0;
  launch_kernel(same ? conv::conv1x1_mask_kernel<true> : conv::conv1x1_mask_kernel<false>,
                (unsigned)((total + per_block - 1) / per_block), conv::MASK1_THREADS, 0, stream, m.data_ptr<bool>(),
                key_ptr(key), mask_out.data_ptr<bool>(), wl.list, wl.count, g, (int)total);
  launch_conv1x1(x, lm, tw, ck, y, wl, g, total, use_tc, stream);
}

// load_mask / bias_key (recomputing convolutions, see ops.cpp): the input pixels the kernels read
// (default: mask) and the streams whose outputs get the bias (default: key); the mask pass (the work
// list and mask_out) always takes mask and key.
std::tuple<Tensor, Tensor> conv2d_cuda(const Tensor& delta, const Tensor& mask, const Tensor& weight,
                                       const c10::optional<Tensor>& bias, IntArrayRef stride, IntArrayRef padding,
                                       IntArrayRef dilation, int64_t groups, const c10::optional<Tensor>& key_in,
                                       const c10::optional<Tensor>& counters, bool input_tf32,
                                       const c10::optional<Tensor>& load_mask,
                                       const c10::optional<Tensor>& bias_key_in) {
  const c10::optional<Tensor> key = contiguous_key(key_in);
  const c10::optional<Tensor> bias_key_arg = contiguous_key(bias_key_in);
  const ConvCall c = DC_CHECK_CONV2D("conv2d", delta, mask, weight, bias, stride, padding, dilation, groups, key,
                                     counters, input_tf32, load_mask, bias_key_arg);
  const int64_t N = c.N, Cin = c.Cin, H = c.H, W = c.W, Cout = c.Cout, KH = c.KH, KW = c.KW, Ho = c.Ho, Wo = c.Wo;
  const int sh = c.sh, sw = c.sw, ph = c.ph, pw = c.pw, dh = c.dh, dw = c.dw;

  c10::cuda::CUDAGuard guard(delta.device());
  if (const int64_t cout8 = padded_cout(delta, Cin, Cout, groups, KH * KW)) {
    const auto [wp, bp] = pad_filters(weight, bias, cout8);
    const auto [y8, mask8] = conv2d_cuda(delta, mask, wp, bp, stride, padding, dilation, groups, key_in, counters,
                                         input_tf32, load_mask, bias_key_in);
    return {y8.narrow(1, 0, Cout).contiguous(at::MemoryFormat::ChannelsLast), mask8};
  }
  Tensor y = empty_delta(delta, N, Cout, Ho, Wo);
  Tensor mask_out = empty_mask(mask, N, Ho, Wo);
  if (y.numel() == 0) return {y, mask_out};  // Cout >= 1: no output pixels
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Tensor x = delta.contiguous(at::MemoryFormat::ChannelsLast);
  const Tensor m = mask.contiguous();
  // what the compute kernels take: the pixels they read (lm) and the streams they add the bias to
  // (ck); the mask passes take m and key
  const Tensor lm = load_mask.has_value() ? load_mask->contiguous() : m;
  const c10::optional<Tensor> ck = bias_key_arg.has_value() ? bias_key_arg : key;

  const ConvGeom g = conv_geom(N, Cin, H, W, Cout, Ho, Wo, KH, KW, sh, sw, ph, pw, dh, dw, groups, input_tf32);
  const int64_t tiles = N * g.tiles_h * g.tiles_w;
  const int64_t cob = groups * ((g.cout_g + conv::CONV_COB - 1) / conv::CONV_COB);
  TORCH_CHECK(cob <= 65535, "deltaconv::conv2d: too many output channel blocks (", cob, ")");
  const bool depthwise = groups > 1 && groups == Cin && Cout == Cin;
  const bool* ckp = key_ptr(ck);

  // Tensor-core path: fp16 / bf16 (or fp32 in TF32: tf32_ok), groups 1, channels multiple of 8,
  // 16-byte aligned rows; 1x1 (any stride / padding) and 3x3 (dilation 1 with equal strides 1 or 2;
  // dilation 2 or 4, stride 1). The others of at most 32 taps: gathered taps, below.
  const bool tc_dtype = tc_dtype_ok(x);
  const bool tc_ok = groups == 1 && tc_gemm_ok(x, Cin, Cout, KH * KW);
  // Few input channels (the stems: 3): fp16 / bf16 or fp32 in TF32, groups 1, dilation 1, equal
  // strides 1 or 2, 2..64 taps: two taps per k16 step (TF32: k8) from the tile's input halo
  // (conv_small_cin_tc.cuh), the delta padded to one 16-byte row per pixel (8 channels; fp32: 4).
  const int64_t small_cin_rows = 16 / x.element_size();  // channels of a 16-byte row: 8, fp32 4
  const bool small_cin = (tc_dtype || tf32_ok(x)) && groups == 1 && Cin <= small_cin_rows && Cout % 8 == 0 &&
                         dh == 1 && dw == 1 && sh == sw && (sh == 1 || sh == 2) && KH * KW >= 2 &&
                         KH * KW <= conv::tc::kSmallCinMaxTaps && Cout * KH * KW * conv::tc::kSmallCin < kIntMax;
  if (small_cin) {
    const bool aligned = reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16 == 0;
    const Tensor xp = Cin == small_cin_rows && aligned ? x : pad_channels_row(x, lm, stream);
    ConvGeom gp = g;
    gp.Cin = gp.cin_g = (int)small_cin_rows;
    const WorkList wl = work_list(delta, tiles, stream, counters);
    launch_tile_mask<false>(m, key, mask_out, wl, g, tiles, stream);
    launch_small_cin_tc(xp, lm, conv_weights(weight, bias, x.scalar_type(), true, small_cin_rows), ck, y, wl,
                        gp, tiles, stream);
    return {y, mask_out};
  }
  const bool tile3x3 = KH == 3 && KW == 3 && dh == dw && sh == sw &&
                       ((dh == 1 && (sh == 1 || sh == 2)) || ((dh == 2 || dh == 4) && sh == 1));
  const bool use_tc = tc_ok && ((KH == 1 && KW == 1) || tile3x3);
  if (use_tc && KH == 3) {
    // the 3x3 tile kernel, and gathered taps on the active pixels of the sparse tiles when they are
    // enough (split on the device, see kSplitPixels)
    const ConvWeights tw = conv_weights(weight, bias, x.scalar_type(), true);
    conv::TileSplit split;
    split.max_pixels = tile_split_pixels();
    const int64_t pixels = N * Ho * Wo;
    const WorkList wl = work_list(delta, tiles, stream, counters);
    WorkList pixel_rows;  // the gathered kernel's list: the pixels of the sparse tiles, counted by counts[1]
    if (split.max_pixels > 0) {
      pixel_rows.buf = at::empty({1 + pixels}, delta.options().dtype(at::kInt));
      pixel_rows.list = pixel_rows.buf.data_ptr<int>();
      split.counts = wl.count + 1;
      pixel_rows.count = split.counts + 1;
      split.pixels = pixel_rows.list;
      split.min_pixels = split_min_pixels();
    }
    launch_tile_mask<false>(m, key, mask_out, wl, g, tiles, stream, split);
    launch_tc_3x3(x, lm, tw, ck, y, wl, g, tiles, stream, split);
    if (split.max_pixels > 0)
      launch_tc_gather<conv::tc::kRowsPixels>(x, lm, tw, ck, y, pixel_rows, g, pixels, stream, &split);
    return {y, mask_out};
  }
  // any other kernel of at most 32 taps (dilated, 5x5, 2x2, strides 3+ or unequal): gathered taps
  if (tc_ok && !use_tc && KH * KW <= conv::tc::kMaxTaps) {
    const WorkList wl = work_list(delta, tiles, stream, counters);
    launch_tile_mask<false>(m, key, mask_out, wl, g, tiles, stream);
    launch_tc_gather<conv::tc::kRowsTiles>(x, lm, conv_weights(weight, bias, x.scalar_type(), true), ck, y, wl, g,
                                           tiles, stream);
    return {y, mask_out};
  }

  if (KH == 1 && KW == 1 && !depthwise) {
    run_conv1x1_masked(x, m, lm, weight, bias, key, ck, y, mask_out, g, counters, use_tc, stream);
    return {y, mask_out};
  }

  const ConvWeights cw = conv_weights(weight, bias, delta.scalar_type());
  const Tensor& w = cw.w;
  const c10::optional<Tensor>& b = cw.b;
  const WorkList wl = work_list(delta, tiles, stream, counters);
  launch_tile_mask<false>(m, key, mask_out, wl, g, tiles, stream);

  if (depthwise && launch_dwconv_vec(x, lm, w, b, ck, y, wl, g, tiles, stream)) return {y, mask_out};
  if (depthwise) {
    const size_t smem = (size_t)conv::dwconv_smem_floats(g) * sizeof(float);
    const dim3 grid(list_grid(tiles), (unsigned)ceil_div((int)Cout, conv::DW_CB));
    bool done = false;
    DC_DISPATCH_ACTIVATION_TYPES(x.scalar_type(), "deltaconv::conv2d", [&] {
      auto kernel = KH == 3 && KW == 3   ? conv::dwconv_kernel<scalar_t, 3>
                    : KH == 5 && KW == 5 ? conv::dwconv_kernel<scalar_t, 5>
                                         : conv::dwconv_kernel<scalar_t, 0>;
      if (!allow_smem(kernel, smem)) return;
      launch_kernel(kernel, grid, conv::CONV_THREADS, smem, stream,
                    reinterpret_cast<const scalar_t*>(x.const_data_ptr()), lm.data_ptr<bool>(),
                    reinterpret_cast<const scalar_t*>(w.const_data_ptr()),
                    b.has_value() ? reinterpret_cast<const scalar_t*>(b->const_data_ptr()) : nullptr, ckp,
                    reinterpret_cast<scalar_t*>(y.data_ptr()), wl.list, wl.count, g);
      done = true;
    });
    if (!done) launch_direct<false>(x, lm, w, b, ck, y, wl, g, tiles, stream);
    return {y, mask_out};
  }

  // Tile kernel: the largest chunk of input channels (<= 16) whose staging fits in 48 KiB, else
  // the opt-in maximum, else the direct fallback.
  const size_t optin = at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin;
  int cib = std::min<int>(16, g.cin_g);
  while (cib > 1 && (size_t)conv::conv_tile_smem_floats(g, cib) * sizeof(float) > 48 * 1024) --cib;
  size_t smem = (size_t)conv::conv_tile_smem_floats(g, cib) * sizeof(float);
  bool done = false;
  if (smem <= optin) {
    const dim3 grid(list_grid(tiles), (unsigned)cob);
    DC_DISPATCH_ACTIVATION_TYPES(x.scalar_type(), "deltaconv::conv2d", [&] {
      auto kernel = KH == 3 && KW == 3 ? conv::conv_tile_kernel<scalar_t, 3, 3> : conv::conv_tile_kernel<scalar_t, 0, 0>;
      if (!allow_smem(kernel, smem)) return;
      launch_kernel(kernel, grid, conv::CONV_THREADS, smem, stream,
                    reinterpret_cast<const scalar_t*>(x.const_data_ptr()), lm.data_ptr<bool>(),
                    reinterpret_cast<const scalar_t*>(w.const_data_ptr()),
                    b.has_value() ? reinterpret_cast<const scalar_t*>(b->const_data_ptr()) : nullptr, ckp,
                    reinterpret_cast<scalar_t*>(y.data_ptr()), wl.list, wl.count, g, cib);
      done = true;
    });
  }
  if (!done) launch_direct<false>(x, lm, w, b, ck, y, wl, g, tiles, stream);
  return {y, mask_out};
}

// ------------------------------------------------------------------------------------- conv1x1_rows
// conv2d for a 1x1 kernel, stride 1, no padding, groups 1, on a delta frame (no key), over the pixels
// that the activation before it listed (rows, with the count in counters[0]): conv2d without its
// mask pass. The output mask is `mask` itself (the caller keeps it).
// bias_key: the streams whose outputs get the bias (recomputing convolutions; default none).

// The checks of both forms (OP: the op's name); returns Cout.
#define DC_CHECK_CONV1X1_ROWS(OP, delta, mask, weight, bias, rows, counters, input_tf32, bias_key)               \
  [&] {                                                                                                         \
    DC_CHECK_DELTA_MASK(OP, delta, mask);                                                                       \
    DC_CHECK_STREAM_FLAGS(OP, "bias_key", bias_key, delta);                                                     \
    DC_CHECK_TF32_FLAG(OP, "input_tf32", input_tf32, delta);                                                    \
    const c10::optional<Tensor> counters_opt = counters;                                                        \
    DC_CHECK_COUNTERS(OP, counters_opt, delta);                                                                 \
    DC_CHECK_FLOAT_PARAM(OP, "weight", weight, delta);                                                          \
    DC_CHECK_DIM(OP, "weight", weight, 4);                                                                      \
    const int64_t cin = delta.size(1), cout = weight.size(0);                                                   \
    TORCH_CHECK(weight.size(1) == cin && weight.size(2) == 1 && weight.size(3) == 1 && cout >= 1 &&             \
                    cout <= kIntMax,                                                                            \
                "deltaconv::" OP ": argument 'weight' must have shape [Cout, ", cin, ", 1, 1], got ", weight.sizes()); \
    DC_CHECK_BIAS(OP, bias, cout, delta);                                                                       \
    const int64_t total = delta.size(0) * delta.size(2) * delta.size(3);                                        \
    DC_CHECK_BESIDE_DELTA(OP, "rows", rows, delta, at::kInt);                                                   \
    TORCH_CHECK(rows.dim() == 1 && rows.is_contiguous() && rows.numel() >= 1 + 2 * total,                       \
                "deltaconv::" OP ": argument 'rows' must be a contiguous 1-D tensor of at least ", 1 + 2 * total, \
                " elements, got shape ", rows.sizes(), " and strides ", rows.strides());                        \
    return cout;                                                                                                \
  }()

// The GEMM of both forms, checked, into y [N, Cout, H, W] channels_last (its listed pixels).
void run_conv1x1_rows(const Tensor& delta, const Tensor& mask, const Tensor& weight, const c10::optional<Tensor>& bias,
                      const Tensor& rows, Tensor& counters, bool input_tf32, const c10::optional<Tensor>& bias_key,
                      const Tensor& y, const char* op) {
  if (y.numel() == 0) return;
  const int64_t N = delta.size(0), Cin = delta.size(1), H = delta.size(2), W = delta.size(3);
  const int64_t Cout = weight.size(0);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Tensor x = delta.contiguous(at::MemoryFormat::ChannelsLast);
  const Tensor m = mask.contiguous();
  const ConvGeom g = conv_geom(N, Cin, H, W, Cout, H, W, 1, 1, 1, 1, 0, 0, 1, 1, 1, input_tf32);
  const bool use_tc = tc_gemm_ok(x, Cin, Cout, 1);
  TORCH_CHECK(use_tc || ceil_div((int)Cout, conv::CONV_COB) <= 65535, "deltaconv::", op,
              ": too many output channels (", Cout, ")");
  const WorkList wl{rows, rows.data_ptr<int>(), counters.data_ptr<int>()};
  launch_conv1x1(x, m, conv_weights(weight, bias, x.scalar_type(), use_tc), bias_key, y, wl, g, N * H * W, use_tc,
                 stream);
}

Tensor conv1x1_rows_cuda(const Tensor& delta, const Tensor& mask, const Tensor& weight,
                         const c10::optional<Tensor>& bias, const Tensor& rows, Tensor& counters, bool input_tf32,
                         const c10::optional<Tensor>& bias_key_in) {
  const c10::optional<Tensor> bias_key = contiguous_key(bias_key_in);
  const int64_t Cout =
      DC_CHECK_CONV1X1_ROWS("conv1x1_rows", delta, mask, weight, bias, rows, counters, input_tf32, bias_key);
  const int64_t N = delta.size(0), Cin = delta.size(1), H = delta.size(2), W = delta.size(3);
  c10::cuda::CUDAGuard guard(delta.device());
  if (const int64_t cout8 = padded_cout(delta, Cin, Cout, 1, 1)) {
    const auto [wp, bp] = pad_filters(weight, bias, cout8);
    return conv1x1_rows_cuda(delta, mask, wp, bp, rows, counters, input_tf32, bias_key_in)
        .narrow(1, 0, Cout)
        .contiguous(at::MemoryFormat::ChannelsLast);
  }
  Tensor y = empty_delta(delta, N, Cout, H, W);
  run_conv1x1_rows(delta, mask, weight, bias, rows, counters, input_tf32, bias_key, y, "conv1x1_rows");
  return y;
}

// conv1x1_rows writing the listed pixels of `out` ([N, Cout, H, W] channels_last, the delta's dtype and
// device), which keeps its other pixels: a convolution that keeps its whole output (value mode before a
// residual add, DCConv2d.keeps_output). Filters the tensor cores would pad (Cout not a multiple of 8)
// are refused: the caller pads them once (padded_out_channels) or takes conv1x1_rows.
void conv1x1_rows_into_cuda(const Tensor& delta, const Tensor& mask, const Tensor& weight,
                            const c10::optional<Tensor>& bias, const Tensor& rows, Tensor& counters, Tensor& out,
                            bool input_tf32, const c10::optional<Tensor>& bias_key_in) {
  const c10::optional<Tensor> bias_key = contiguous_key(bias_key_in);
  const int64_t Cout =
      DC_CHECK_CONV1X1_ROWS("conv1x1_rows_into", delta, mask, weight, bias, rows, counters, input_tf32, bias_key);
  const int64_t N = delta.size(0), Cin = delta.size(1), H = delta.size(2), W = delta.size(3);
  DC_CHECK_BESIDE_DELTA("conv1x1_rows_into", "out", out, delta, delta.scalar_type());
  TORCH_CHECK(out.dim() == 4 && out.size(0) == N && out.size(1) == Cout && out.size(2) == H && out.size(3) == W &&
                  out.is_contiguous(at::MemoryFormat::ChannelsLast),
              "deltaconv::conv1x1_rows_into: argument 'out' must be a channels_last contiguous [N, Cout, H, W] = [",
              N, ", ", Cout, ", ", H, ", ", W, "] tensor, got shape ", out.sizes(), " and strides ", out.strides());
  c10::cuda::CUDAGuard guard(delta.device());
  TORCH_CHECK(padded_cout(delta, Cin, Cout, 1, 1) == 0, "deltaconv::conv1x1_rows_into: argument 'weight' must have a "
              "multiple of 8 output channels on the tensor cores (pad the filters once), got ", Cout);
  run_conv1x1_rows(delta, mask, weight, bias, rows, counters, input_tf32, bias_key, out, "conv1x1_rows_into");
}

// ------------------------------------------------------------------------------------- conv1x1_into
// conv2d of a 1x1 kernel (groups 1, any stride and padding) writing its output pixels (those of mask_out,
// the returned [N, 1, Ho, Wo] mask) into `out` ([N, Cout, Ho, Wo] channels_last, the delta's dtype and
// device), which keeps its other pixels: a convolution keeping its whole output off a row list (the
// downsampling identity of a ResNet block, DCConv2d.keeps_output; on key frames any such convolution).
// Filters the tensor cores would pad (Cout not a multiple of 8) are refused, as in conv1x1_rows_into.
Tensor conv1x1_into_cuda(const Tensor& delta, const Tensor& mask, const Tensor& weight,
                         const c10::optional<Tensor>& bias, IntArrayRef stride, IntArrayRef padding,
                         const c10::optional<Tensor>& key_in, const c10::optional<Tensor>& counters, Tensor& out,
                         bool input_tf32, const c10::optional<Tensor>& load_mask,
                         const c10::optional<Tensor>& bias_key_in) {
  const c10::optional<Tensor> key = contiguous_key(key_in);
  const c10::optional<Tensor> bias_key = contiguous_key(bias_key_in);
  const int64_t dilation[2] = {1, 1};
  const ConvCall c = DC_CHECK_CONV2D("conv1x1_into", delta, mask, weight, bias, stride, padding, dilation, 1, key,
                                     counters, input_tf32, load_mask, bias_key);
  TORCH_CHECK(c.KH == 1 && c.KW == 1, "deltaconv::conv1x1_into: argument 'weight' must have shape [Cout, ", c.Cin,
              ", 1, 1], got ", weight.sizes());
  DC_CHECK_BESIDE_DELTA("conv1x1_into", "out", out, delta, delta.scalar_type());
  TORCH_CHECK(out.dim() == 4 && out.size(0) == c.N && out.size(1) == c.Cout && out.size(2) == c.Ho &&
                  out.size(3) == c.Wo && out.is_contiguous(at::MemoryFormat::ChannelsLast),
              "deltaconv::conv1x1_into: argument 'out' must be a channels_last contiguous [N, Cout, Ho, Wo] = [", c.N,
              ", ", c.Cout, ", ", c.Ho, ", ", c.Wo, "] tensor, got shape ", out.sizes(), " and strides ",
              out.strides());
  c10::cuda::CUDAGuard guard(delta.device());
  TORCH_CHECK(padded_cout(delta, c.Cin, c.Cout, 1, 1) == 0, "deltaconv::conv1x1_into: argument 'weight' must have a "
              "multiple of 8 output channels on the tensor cores (pad the filters once), got ", c.Cout);
  Tensor mask_out = empty_mask(mask, c.N, c.Ho, c.Wo);
  if (out.numel() == 0) return mask_out;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Tensor x = delta.contiguous(at::MemoryFormat::ChannelsLast);
  const Tensor m = mask.contiguous();
  const Tensor lm = load_mask.has_value() ? load_mask->contiguous() : m;
  const ConvGeom g = conv_geom(c.N, c.Cin, c.H, c.W, c.Cout, c.Ho, c.Wo, 1, 1, c.sh, c.sw, c.ph, c.pw, 1, 1, 1,
                               input_tf32);
  const bool use_tc = tc_gemm_ok(x, c.Cin, c.Cout, 1);
  TORCH_CHECK(use_tc || ceil_div((int)c.Cout, conv::CONV_COB) <= 65535,
              "deltaconv::conv1x1_into: too many output channels (", c.Cout, ")");
  run_conv1x1_masked(x, m, lm, weight, bias, key, bias_key.has_value() ? bias_key : key, out, mask_out, g, counters,
                     use_tc, stream);
  return mask_out;
}

// ---------------------------------------------------------------------------- conv_transpose2d
// One axis of the combined convolution of a transposed one (conv/conv_transpose_phases.cuh): J taps
// per phase, the window U >= J, the combined convolution's padding and output size, and its row of
// A = 0 (offset), for an input of `in` rows, an output of `out`, stride s, padding p, K = s * J kernel
// rows and a window of `window` rows (J, or more: zeros in its first window - J rows).
struct TransposedAxis {
  int J, U, pad, size, offset;
};

TransposedAxis transposed_axis(int64_t in, int64_t out, int s, int p, int64_t K, int window) {
  TransposedAxis t{};
  t.J = (int)(K / s);
  t.U = std::max(window, t.J);
  // output rows o = 0 .. out - 1 read input rows A - U + 1 .. A, A = (o + p) / s, inside the padding
  const int a_first = p / s, a_last = (int)((out - 1 + p) / s);
  t.pad = std::max<int>({0, t.U - 1 - a_first, (int)(a_last - in + 1)});
  t.size = (int)(in + 2 * t.pad - t.U + 1);
  t.offset = t.pad - t.U + 1;
  return t;
}

// The window of a transposed convolution's combined convolution along both axes: its own taps, but
// 2x2 (4x4 at stride 2) widened to 3x3, the 3x3 tile kernel with 2.25 times the multiply-adds: the
// gathered-taps kernel that runs a 2x2 window took 1.5 times as long at 100 % changed and 1.2 times at
// 1 % (4x4, C=64 at 540x960), the pose network's frame 6-7 % longer (H200, 2026-12-02 17:22 UTC,
// benchmarks/results/transposed_ab.txt). DELTACONV_TC_TRANSPOSED_3X3=0 keeps 2x2 (read on every call:
// A/B runs, tests of both).
int transposed_window(int64_t KH, int64_t KW, int sh, int sw) {
  const bool two_by_two = KH == 2 * sh && KW == 2 * sw;
  return two_by_two && env_switch("DELTACONV_TC_TRANSPOSED_3X3") ? 3 : 1;
}

// Whether conv_transpose2d runs as one stride-1 convolution of all its phases on the tensor cores
// (conv/conv_transpose_phases.cuh): fp16 / bf16 (float32 stays exact, on the CUDA-core kernel),
// groups 1, dilation 1, the kernel a whole number of strides along each axis (the caller checks it
// first: `rows` and `cols` assume it), and the combined convolution a tensor-core one (tc_gemm_ok, a
// window of at most kMaxTaps taps). DELTACONV_TC_TRANSPOSED=0 keeps the CUDA-core kernel (read on
// every call: A/B runs, tests of both).
bool transposed_phases_ok(const Tensor& x, int64_t Cin, int64_t Cout, int sh, int sw, int dh, int dw, int64_t groups,
                          const TransposedAxis& rows, const TransposedAxis& cols) {
  if (groups != 1 || dh != 1 || dw != 1 || !tc_dtype_ok(x) || !env_switch("DELTACONV_TC_TRANSPOSED")) return false;
  const int64_t taps = (int64_t)rows.U * cols.U;
  return taps <= conv::tc::kMaxTaps && tc_gemm_ok(x, Cin, (int64_t)sh * sw * Cout, taps) && rows.size >= 1 &&
         cols.size >= 1;
}

// The transposed convolution as one convolution of its phases (transposed_phases_ok): the combined
// filters [sh * sw * Cout][UH][UW][Cin] built from weight [Cin, Cout, KH, KW] (one kernel per call), the
// bias repeated per phase, conv2d_cuda (stride 1; `counters` as for it), then the scatter into y
// [N, Cout, Ho, Wo] and mask_out.
std::tuple<Tensor, Tensor> conv_transpose2d_phases(const Tensor& delta, const Tensor& mask, const Tensor& weight,
                                                   const c10::optional<Tensor>& bias,
                                                   const c10::optional<Tensor>& key, int64_t Ho, int64_t Wo, int sh,
                                                   int sw, int ph, int pw, const TransposedAxis& rows,
                                                   const TransposedAxis& cols, const c10::optional<Tensor>& counters) {
  const int64_t N = delta.size(0), Cin = delta.size(1), Cout = weight.size(1), phases = (int64_t)sh * sw;
  conv::PhaseGeom g{};
  g.N = (int)N; g.Cin = (int)Cin; g.Cout = (int)Cout; g.H = (int)delta.size(2); g.W = (int)delta.size(3);
  g.Ho = (int)Ho; g.Wo = (int)Wo; g.KH = (int)weight.size(2); g.KW = (int)weight.size(3);
  g.sh = sh; g.sw = sw; g.ph = ph; g.pw = pw; g.JH = rows.J; g.JW = cols.J; g.UH = rows.U; g.UW = cols.U;
  g.Hc = rows.size; g.Wc = cols.size; g.offh = rows.offset; g.offw = cols.offset;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Tensor w = weight.to(delta.scalar_type()).contiguous();
  // [phases * Cout][UH][UW][Cin], viewed as the channels_last [phases * Cout, Cin, UH, UW] conv weight
  Tensor filters = at::empty({phases * Cout, g.UH, g.UW, Cin}, w.options());
  launch_kernel(conv::phase_filters_kernel, elem_grid(filters.numel(), 256), 256, 0, stream,
                reinterpret_cast<const uint16_t*>(w.const_data_ptr()), reinterpret_cast<uint16_t*>(filters.data_ptr()),
                g);
  c10::optional<Tensor> b;
  if (bias.has_value()) b = bias->to(delta.scalar_type()).repeat({phases});
  // (its mask, the window's, is left: the scatter takes each phase's footprint from the input mask)
  const Tensor v = std::get<0>(conv2d_cuda(delta, mask, filters.permute({0, 3, 1, 2}), b, {1, 1},
                                           {rows.pad, cols.pad}, {1, 1}, 1, key, counters, false, c10::nullopt,
                                           c10::nullopt));
  Tensor y = empty_delta(delta, N, Cout, Ho, Wo);
  Tensor mask_out = empty_mask(mask, N, Ho, Wo);
  const int vecs = (int)(Cout * delta.element_size() / 16);
  const Tensor m_in = mask.contiguous();
  launch_kernel(conv::phase_scatter_kernel, elem_grid(N * Ho * Wo, conv::kScatterThreads), conv::kScatterThreads, 0,
                stream, reinterpret_cast<const uint4*>(v.const_data_ptr()), m_in.const_data_ptr<bool>(),
                key_ptr(key), reinterpret_cast<uint4*>(y.data_ptr()), mask_out.data_ptr<bool>(), g, vecs);
  return {y, mask_out};
}

std::tuple<Tensor, Tensor> conv_transpose2d_cuda(const Tensor& delta, const Tensor& mask, const Tensor& weight,
                                                 const c10::optional<Tensor>& bias, IntArrayRef stride,
                                                 IntArrayRef padding, IntArrayRef output_padding, int64_t groups,
                                                 IntArrayRef dilation, const c10::optional<Tensor>& key_in,
                                                 const c10::optional<Tensor>& counters) {
  const c10::optional<Tensor> key = contiguous_key(key_in);
  DC_CHECK_DELTA_MASK("conv_transpose2d", delta, mask);
  DC_CHECK_KEY("conv_transpose2d", key, delta);
  DC_CHECK_COUNTERS("conv_transpose2d", counters, delta);
  DC_CHECK_FLOAT_PARAM("conv_transpose2d", "weight", weight, delta);
  DC_CHECK_DIM("conv_transpose2d", "weight", weight, 4);
  const int64_t N = delta.size(0), Cin = delta.size(1), H = delta.size(2), W = delta.size(3);
  TORCH_CHECK(groups >= 1 && groups <= kIntMax, "deltaconv::conv_transpose2d: argument 'groups' must be >= 1, got ",
              groups);
  TORCH_CHECK(weight.size(0) == Cin && Cin % groups == 0, "deltaconv::conv_transpose2d: argument 'weight' of shape ",
              weight.sizes(), " does not fit ", Cin, " input channels in ", groups,
              " groups (expected [C_in, C_out/groups, kh, kw])");
  const int64_t Cout = weight.size(1) * groups, KH = weight.size(2), KW = weight.size(3);
  TORCH_CHECK(Cout >= 1 && KH >= 1 && KW >= 1 && KH <= 4096 && KW <= 4096,
              "deltaconv::conv_transpose2d: argument 'weight' has an empty or oversized shape ", weight.sizes());
  DC_CHECK_BIAS("conv_transpose2d", bias, Cout, delta);
  const auto [sh, sw] = pair_arg(stride, "conv_transpose2d", "stride", 1);
  const auto [ph, pw] = pair_arg(padding, "conv_transpose2d", "padding", 0);
  const auto [oph, opw] = pair_arg(output_padding, "conv_transpose2d", "output_padding", 0);
  const auto [dh, dw] = pair_arg(dilation, "conv_transpose2d", "dilation", 1);
  TORCH_CHECK((oph < sh || oph < dh) && (opw < sw || opw < dw), "deltaconv::conv_transpose2d: argument "
              "'output_padding' must be smaller than either stride or dilation, got output_padding ", output_padding,
              ", stride ", stride, ", dilation ", dilation);
  const int64_t Ho = (H - 1) * sh - 2 * ph + dh * (KH - 1) + oph + 1;
  const int64_t Wo = (W - 1) * sw - 2 * pw + dw * (KW - 1) + opw + 1;
  TORCH_CHECK(Ho >= 1 && Wo >= 1, "deltaconv::conv_transpose2d: output size ", Ho, "x", Wo, " is too small");
  TORCH_CHECK(N * Ho * Wo <= kIntMax, "deltaconv::conv_transpose2d: output too large");

  c10::cuda::CUDAGuard guard(delta.device());
  if (N * Ho * Wo > 0 && KH % sh == 0 && KW % sw == 0) {
    const int window = transposed_window(KH, KW, sh, sw);
    const TransposedAxis rows = transposed_axis(H, Ho, sh, ph, KH, window);
    const TransposedAxis cols = transposed_axis(W, Wo, sw, pw, KW, window);
    if (transposed_phases_ok(delta, Cin, Cout, sh, sw, dh, dw, groups, rows, cols))
      return conv_transpose2d_phases(delta, mask, weight, bias, key, Ho, Wo, sh, sw, ph, pw, rows, cols, counters);
  }
  Tensor y = empty_delta(delta, N, Cout, Ho, Wo);
  Tensor mask_out = empty_mask(mask, N, Ho, Wo);
  if (y.numel() == 0) return {y, mask_out};  // Cout >= 1: no output pixels
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Tensor x = delta.contiguous(at::MemoryFormat::ChannelsLast);
  const Tensor m = mask.contiguous();
  const ConvWeights cw = conv_weights(weight, bias, delta.scalar_type());
  const Tensor& w = cw.w;
  const c10::optional<Tensor>& b = cw.b;

  const ConvGeom g = conv_geom(N, Cin, H, W, Cout, Ho, Wo, KH, KW, sh, sw, ph, pw, dh, dw, groups);
  const int64_t tiles = N * g.tiles_h * g.tiles_w;
  const WorkList wl = work_list(delta, tiles, stream, counters);
  launch_tile_mask<true>(m, key, mask_out, wl, g, tiles, stream);
  launch_direct<true>(x, m, w, b, key, y, wl, g, tiles, stream);
  return {y, mask_out};
}

// ---------------------------------------------------------------------------------- pooling
// PyTorch's pooling_output_shape (floor / ceil mode).
int64_t pool_out_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil_mode) {
  const int64_t num = in + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  int64_t out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

Strides4 strides_of(const Tensor& t) { return Strides4{t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }

// Max pooling of the accumulated input (max_pool2d: `acc` float32, += delta on the active pixels first)
// or of the input's whole values (max_pool2d_values: acc nullptr, `delta` holds them at every pixel);
// then truncation against `sent` [N, C, Ho, Wo] on the output pixels whose window holds an active pixel.
// The callers checked the input, mask, key, tf32, acc and sent's device and dtype. Returns (the changes
// y [N, C, Ho, Wo] channels_last, mask_out [N, 1, Ho, Wo]).
std::tuple<Tensor, Tensor> run_max_pool2d(const char* op, const Tensor& delta, const Tensor& mask, const Tensor* acc,
                                          const Tensor& sent, IntArrayRef kernel_size, IntArrayRef stride,
                                          IntArrayRef padding, IntArrayRef dilation, bool ceil_mode, double threshold,
                                          const c10::optional<Tensor>& key, bool rms, bool tf32) {
  const int64_t N = delta.size(0), C = delta.size(1), H = delta.size(2), W = delta.size(3);
  const auto [kh, kw] = pair_arg(kernel_size, op, "kernel_size", 1);
  const auto [sh, sw] = stride.empty() ? std::pair<int, int>{kh, kw} : pair_arg(stride, op, "stride", 1);
  const auto [ph, pw] = pair_arg(padding, op, "padding", 0);
  const auto [dh, dw] = pair_arg(dilation, op, "dilation", 1);
  TORCH_CHECK(ph <= kh / 2 && pw <= kw / 2, "deltaconv::", op, ": argument 'padding' must be at most half of "
              "kernel_size, got padding ", padding, " and kernel_size ", kernel_size);
  const int64_t Ho = pool_out_size(H, kh, ph, sh, dh, ceil_mode);
  const int64_t Wo = pool_out_size(W, kw, pw, sw, dw, ceil_mode);
  TORCH_CHECK(Ho >= 1 && Wo >= 1, "deltaconv::", op, ": output size ", Ho, "x", Wo, " is too small for input ", H,
              "x", W);
  TORCH_CHECK(sent.dim() == 4 && sent.size(0) == N && sent.size(1) == C && sent.size(2) == Ho && sent.size(3) == Wo,
              "deltaconv::", op, ": argument 'sent' must have shape [", N, ", ", C, ", ", Ho, ", ", Wo, "], got ",
              sent.sizes());

  c10::cuda::CUDAGuard guard(delta.device());
  Tensor y = empty_delta(delta, N, C, Ho, Wo);
  Tensor mask_out = empty_mask(mask, N, Ho, Wo);
  const int64_t total_pix = N * Ho * Wo;
  if (total_pix == 0) return {y, mask_out};
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Tensor x = delta.contiguous(at::MemoryFormat::ChannelsLast);
  const Tensor m = mask.contiguous();
  PoolGeom g{(int)N, (int)C, (int)H, (int)W, (int)Ho, (int)Wo, kh, kw, sh, sw, ph, pw, dh, dw};
  const Tensor& src = acc != nullptr ? *acc : x;  // the pooled map: acc, or the whole values (channels_last)
  const Strides4 as = strides_of(src), ss = strides_of(sent);
  DC_DISPATCH_ACTIVATION_TYPES(x.scalar_type(), "deltaconv::max_pool2d", [&] {
    const int64_t in_pix = N * H * W;
    if (acc != nullptr && in_pix > 0 && C > 0) {
      launch_kernel(conv::maxpool_acc_kernel<scalar_t>,
                    persistent_grid(conv::maxpool_acc_kernel<scalar_t>, 256, group_blocks(in_pix, 5, 256)), 256, 0,
                    stream,
                    reinterpret_cast<const scalar_t*>(x.const_data_ptr()), m.data_ptr<bool>(), acc->data_ptr<float>(),
                    as, (int)C, (int)H, (int)W, in_pix);
    }
    // channels_last source and states, C <= 512: the kernel of lane groups sized to C (y is channels_last),
    // 16-byte loads of the pooled map where C allows (8 whole values of 2 bytes need C % 8 == 0), else packs of
    // 4, 2 or 1 channels (MTCNN's 10 channels: 2 per lane, 8 lanes per pixel instead of a warp)
    const bool cl = src.is_contiguous(at::MemoryFormat::ChannelsLast) &&
                    sent.is_contiguous(at::MemoryFormat::ChannelsLast) && C <= conv::kMaxpoolMaxChannels &&
                    aligned16(src.const_data_ptr()) && aligned16(sent.data_ptr()) && aligned16(y.data_ptr());
    const auto launch = [&](auto source) {  // source: the pooled map's elements (const float* or const scalar_t*)
      using S = std::remove_const_t<std::remove_pointer_t<decltype(source)>>;
      if (cl) {
        constexpr int kWide = conv::maxpool_vec<S>();
        const int vec = C % kWide == 0 ? kWide : C % 4 == 0 ? 4 : C % 2 == 0 ? 2 : 1;
        const int log2_lanes = log2_lanes_for(C, vec);
        const auto kernel = vec == kWide ? conv::maxpool_out_cl_kernel<scalar_t, S, kWide>
                            : vec == 4   ? conv::maxpool_out_cl_kernel<scalar_t, S, 4>
                            : vec == 2   ? conv::maxpool_out_cl_kernel<scalar_t, S, 2>
                                         : conv::maxpool_out_cl_kernel<scalar_t, S, 1>;
        launch_kernel(kernel, persistent_grid(kernel, 256, group_blocks(total_pix, log2_lanes, 256)), 256, 0, stream,
                      m.data_ptr<bool>(), source, reinterpret_cast<scalar_t*>(sent.data_ptr()), key_ptr(key),
                      reinterpret_cast<scalar_t*>(y.data_ptr()), mask_out.data_ptr<bool>(), g,
                      static_cast<float>(threshold), rms_limit(rms, threshold, C), total_pix, log2_lanes, tf32);
        return;
      }
      const auto kernel = conv::maxpool_out_kernel<scalar_t, S>;
      launch_kernel(kernel, persistent_grid(kernel, 256, group_blocks(total_pix, 5, 256)), 256, 0, stream,
                    m.data_ptr<bool>(), source, as, reinterpret_cast<scalar_t*>(sent.data_ptr()), ss,
                    key_ptr(key), reinterpret_cast<scalar_t*>(y.data_ptr()), mask_out.data_ptr<bool>(), g,
                    static_cast<float>(threshold), rms_limit(rms, threshold, C), total_pix, tf32);
    };
    if (acc != nullptr) {
      launch(acc->const_data_ptr<float>());
    } else {
      launch(reinterpret_cast<const scalar_t*>(x.const_data_ptr()));
    }
  });
  return {y, mask_out};
}

std::tuple<Tensor, Tensor> max_pool2d_cuda(const Tensor& delta, const Tensor& mask, const Tensor& acc,
                                           const Tensor& sent, IntArrayRef kernel_size, IntArrayRef stride,
                                           IntArrayRef padding, IntArrayRef dilation, bool ceil_mode,
                                           double threshold, const c10::optional<Tensor>& key_in, bool rms,
                                           bool tf32) {
  const c10::optional<Tensor> key = contiguous_key(key_in);
  DC_CHECK_DELTA_MASK("max_pool2d", delta, mask);
  DC_CHECK_TF32_FLAG("max_pool2d", "tf32", tf32, delta);
  DC_CHECK_KEY("max_pool2d", key, delta);
  DC_CHECK_BESIDE_DELTA("max_pool2d", "acc", acc, delta, at::kFloat);
  TORCH_CHECK(acc.sizes() == delta.sizes(), "deltaconv::max_pool2d: argument 'acc' must have the delta's shape ",
              delta.sizes(), ", got ", acc.sizes());
  DC_CHECK_BESIDE_DELTA("max_pool2d", "sent", sent, delta, delta.scalar_type());
  return run_max_pool2d("max_pool2d", delta, mask, &acc, sent, kernel_size, stride, padding, dilation, ceil_mode,
                        threshold, key, rms, tf32);
}

// Max pooling in value mode: `x` holds the input's whole values at every pixel (the activation before it
// keeps them, its `sent`), so there is no accumulator; otherwise as max_pool2d.
std::tuple<Tensor, Tensor> max_pool2d_values_cuda(const Tensor& x, const Tensor& mask, const Tensor& sent,
                                                  IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                                                  IntArrayRef dilation, bool ceil_mode, double threshold,
                                                  const c10::optional<Tensor>& key_in, bool rms, bool tf32) {
  const c10::optional<Tensor> key = contiguous_key(key_in);
  DC_CHECK_INPUT_MASK("max_pool2d_values", "x", x, mask);
  DC_CHECK_TF32_FLAG("max_pool2d_values", "tf32", tf32, x);
  DC_CHECK_KEY("max_pool2d_values", key, x);
  DC_CHECK_BESIDE_DELTA("max_pool2d_values", "sent", sent, x, x.scalar_type());
  return run_max_pool2d("max_pool2d_values", x, mask, nullptr, sent, kernel_size, stride, padding, dilation,
                        ceil_mode, threshold, key, rms, tf32);
}

std::tuple<Tensor, Tensor> avg_pool2d_cuda(const Tensor& delta, const Tensor& mask, IntArrayRef kernel_size,
                                           IntArrayRef stride, IntArrayRef padding, bool ceil_mode,
                                           bool count_include_pad, c10::optional<int64_t> divisor_override) {
  DC_CHECK_DELTA_MASK("avg_pool2d", delta, mask);
  const int64_t N = delta.size(0), C = delta.size(1), H = delta.size(2), W = delta.size(3);
  const auto [kh, kw] = pair_arg(kernel_size, "avg_pool2d", "kernel_size", 1);
  const auto [sh, sw] = stride.empty() ? std::pair<int, int>{kh, kw} : pair_arg(stride, "avg_pool2d", "stride", 1);
  const auto [ph, pw] = pair_arg(padding, "avg_pool2d", "padding", 0);
  TORCH_CHECK(ph <= kh / 2 && pw <= kw / 2, "deltaconv::avg_pool2d: argument 'padding' must be at most half of "
              "kernel_size, got padding ", padding, " and kernel_size ", kernel_size);
  if (divisor_override.has_value()) {
    TORCH_CHECK(*divisor_override != 0 && std::abs(*divisor_override) <= kIntMax,
                "deltaconv::avg_pool2d: argument 'divisor_override' must be non-zero, got ", *divisor_override);
  }
  const int64_t Ho = pool_out_size(H, kh, ph, sh, 1, ceil_mode);
  const int64_t Wo = pool_out_size(W, kw, pw, sw, 1, ceil_mode);
  TORCH_CHECK(Ho >= 1 && Wo >= 1, "deltaconv::avg_pool2d: output size ", Ho, "x", Wo, " is too small for input ", H,
              "x", W);

  c10::cuda::CUDAGuard guard(delta.device());
  Tensor y = empty_delta(delta, N, C, Ho, Wo);
  Tensor mask_out = empty_mask(mask, N, Ho, Wo);
  // one thread per output element; with C == 0 still one per output pixel (the mask)
  const int64_t total = N * Ho * Wo * std::max<int64_t>(C, 1);
  if (total == 0) return {y, mask_out};
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Tensor x = delta.contiguous(at::MemoryFormat::ChannelsLast);
  const Tensor m = mask.contiguous();
  PoolGeom g{(int)N, (int)C, (int)H, (int)W, (int)Ho, (int)Wo, kh, kw, sh, sw, ph, pw, 1, 1};
  DC_DISPATCH_ACTIVATION_TYPES(x.scalar_type(), "deltaconv::avg_pool2d", [&] {
    launch_kernel(conv::avgpool_kernel<scalar_t>, elem_grid(total, 256), 256, 0, stream,
                  reinterpret_cast<const scalar_t*>(x.const_data_ptr()), m.data_ptr<bool>(),
                  reinterpret_cast<scalar_t*>(y.data_ptr()), mask_out.data_ptr<bool>(), g, count_include_pad,
                  divisor_override.has_value() ? (int)*divisor_override : 0, divisor_override.has_value(), total);
  });
  return {y, mask_out};
}

std::tuple<Tensor, Tensor> adaptive_avg_pool2d_cuda(const Tensor& delta, const Tensor& mask, IntArrayRef output_size) {
  DC_CHECK_DELTA_MASK("adaptive_avg_pool2d", delta, mask);
  const int64_t N = delta.size(0), C = delta.size(1), H = delta.size(2), W = delta.size(3);
  const auto [Ho, Wo] = pair_arg(output_size, "adaptive_avg_pool2d", "output_size", 0);
  TORCH_CHECK(H >= 1 && W >= 1, "deltaconv::adaptive_avg_pool2d: argument 'delta' must have non-empty spatial "
              "dims, got shape ", delta.sizes());
  TORCH_CHECK(C <= 65535LL * 32, "deltaconv::adaptive_avg_pool2d: too many channels (", C, ")");

  c10::cuda::CUDAGuard guard(delta.device());
  Tensor y = empty_delta(delta, N, C, Ho, Wo);
  Tensor mask_out = empty_mask(mask, N, Ho, Wo);
  const int64_t pix = N * Ho * Wo;
  if (pix == 0) return {y, mask_out};
  TORCH_CHECK(pix <= kIntMax, "deltaconv::adaptive_avg_pool2d: output too large");
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Tensor x = delta.contiguous(at::MemoryFormat::ChannelsLast);
  const Tensor m = mask.contiguous();
  PoolGeom g{(int)N, (int)C, (int)H, (int)W, Ho, Wo, 1, 1, 1, 1, 0, 0, 1, 1};
  // the largest window (adaptive windows differ by at most one row / column) in chunks
  auto longest = [](int64_t in, int64_t out) {
    int64_t most = 0;
    for (int64_t o = 0; o < out; ++o) most = std::max(most, ((o + 1) * in + out - 1) / out - (o * in) / out);
    return most;
  };
  const int64_t chunks = (longest(H, Ho) * longest(W, Wo) + conv::kPoolChunk - 1) / conv::kPoolChunk;
  TORCH_CHECK(chunks <= 65535, "deltaconv::adaptive_avg_pool2d: pooling windows of ", chunks * conv::kPoolChunk,
              " pixels are too large");
  Tensor part = at::empty({chunks, pix, C}, delta.options().dtype(at::kFloat));
  Tensor any = at::empty({chunks, pix}, mask.options().dtype(at::kBool));
  const dim3 grid((unsigned)pix, (unsigned)chunks,
                  (unsigned)std::max<int64_t>(1, (C + conv::kPoolGroup - 1) / conv::kPoolGroup));
  const dim3 finish_grid((unsigned)pix, (unsigned)std::max<int64_t>(1, (C + 31) / 32));
  // rows of the finish: each walks every rows-th chunk one after the other (a global pool of a
  // 540x960 map has 2,025 chunks); the same for every call of a shape (deterministic sums)
  const bool many_chunks = chunks > 64;
  // lanes of the first launch: the power of two at or above the channel group's vectors
  auto log2_lanes = [&](int v) {
    const int64_t vectors = (std::min<int64_t>(C, conv::kPoolGroup) + v - 1) / v;
    int l = 0;
    while ((int64_t{1} << l) < vectors) ++l;
    return l;
  };
  DC_DISPATCH_ACTIVATION_TYPES(x.scalar_type(), "deltaconv::adaptive_avg_pool2d", [&] {
    constexpr int kVec = 16 / (int)sizeof(scalar_t);
    const auto* xp = reinterpret_cast<const scalar_t*>(x.const_data_ptr());
    const bool vec = C % kVec == 0 && aligned16(xp);
    const auto kernel =
        vec ? conv::adaptive_avgpool_kernel<scalar_t, kVec> : conv::adaptive_avgpool_kernel<scalar_t, 1>;
    launch_kernel(kernel, grid, conv::kPoolChunk, 0, stream, xp, m.data_ptr<bool>(), part.data_ptr<float>(),
                  any.data_ptr<bool>(), g, log2_lanes(vec ? kVec : 1));
    const auto finish = many_chunks ? conv::adaptive_avgpool_finish_kernel<scalar_t, 32>
                                    : conv::adaptive_avgpool_finish_kernel<scalar_t, 8>;
    launch_kernel(finish, finish_grid, many_chunks ? 32 * 32 : 32 * 8, 0, stream,
                  part.data_ptr<float>(), any.data_ptr<bool>(), reinterpret_cast<scalar_t*>(y.data_ptr()),
                  mask_out.data_ptr<bool>(), g);
  });
  return {y, mask_out};
}

// ------------------------------------------------------------------------------------ linear
std::tuple<Tensor, Tensor> linear_cuda(const Tensor& delta, const Tensor& mask, const Tensor& weight,
                                       const c10::optional<Tensor>& bias, const c10::optional<Tensor>& key_in) {
  const c10::optional<Tensor> key = contiguous_key(key_in);
  DC_CHECK_CUDA("linear", "delta", delta);
  DC_CHECK_ACTIVATION_DTYPE("linear", "delta", delta);
  DC_CHECK_DIM("linear", "delta", delta, 2);
  DC_CHECK_CUDA("linear", "mask", mask);
  DC_CHECK_SAME_DEVICE("linear", "mask", mask, delta);
  DC_CHECK_DTYPE("linear", "mask", mask, at::kBool);
  const int64_t N = delta.size(0), K = delta.size(1);
  // [N, 1] (also accepted: any [N, 1, ...] with one element per row, e.g. [N, 1, 1, 1])
  TORCH_CHECK(mask.dim() >= 2 && mask.size(0) == N && mask.numel() == N,
              "deltaconv::linear: argument 'mask' must have shape [N, 1] = [", N, ", 1], got ", mask.sizes());
  DC_CHECK_KEY("linear", key, delta);
  DC_CHECK_FLOAT_PARAM("linear", "weight", weight, delta);
  DC_CHECK_DIM("linear", "weight", weight, 2);
  TORCH_CHECK(weight.size(1) == K, "deltaconv::linear: argument 'weight' must have shape [out_features, ", K,
              "], got ", weight.sizes());
  const int64_t M = weight.size(0);
  DC_CHECK_BIAS("linear", bias, M, delta);
  TORCH_CHECK(N <= kIntMax && K <= kIntMax && M <= kIntMax && N * M <= kIntMax * 8LL,
              "deltaconv::linear: sizes too large");

  c10::cuda::CUDAGuard guard(delta.device());
  Tensor y = at::empty({N, M}, delta.options());
  Tensor mask_out = at::empty({N, 1}, mask.options());
  if (N == 0) return {y, mask_out};
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (M == 0) {  // no outputs: only the mask
    Tensor mo = mask.reshape({N, 1}).clone();
    if (key.has_value()) mo.logical_or_(key->view({N, 1}));
    return {y, mo};
  }
  const Tensor x = delta.contiguous();
  const Tensor m = mask.contiguous();
  const ConvWeights cw = conv_weights(weight, bias, delta.scalar_type());
  const Tensor& w = cw.w;
  const c10::optional<Tensor>& b = cw.b;
  const int64_t blocks = (N * M + 7) / 8;
  DC_DISPATCH_ACTIVATION_TYPES(x.scalar_type(), "deltaconv::linear", [&] {
    launch_kernel(conv::linear_kernel<scalar_t>, (unsigned)blocks, 256, 0, stream,
                  reinterpret_cast<const scalar_t*>(x.const_data_ptr()), m.data_ptr<bool>(),
                  reinterpret_cast<const scalar_t*>(w.const_data_ptr()),
                  b.has_value() ? reinterpret_cast<const scalar_t*>(b->const_data_ptr()) : nullptr, key_ptr(key),
                  reinterpret_cast<scalar_t*>(y.data_ptr()), mask_out.data_ptr<bool>(), (int)N, (int)K, (int)M);
  });
  return {y, mask_out};
}

}  // namespace
}  // namespace deltaconv

TORCH_LIBRARY_IMPL(deltaconv, CUDA, m) {
  m.impl("conv2d", &deltaconv::conv2d_cuda);
  m.impl("conv1x1_rows", &deltaconv::conv1x1_rows_cuda);
  m.impl("conv1x1_rows_into", &deltaconv::conv1x1_rows_into_cuda);
  m.impl("conv1x1_into", &deltaconv::conv1x1_into_cuda);
  m.impl("conv_transpose2d", &deltaconv::conv_transpose2d_cuda);
  m.impl("max_pool2d", &deltaconv::max_pool2d_cuda);
  m.impl("max_pool2d_values", &deltaconv::max_pool2d_values_cuda);
  m.impl("avg_pool2d", &deltaconv::avg_pool2d_cuda);
  m.impl("adaptive_avg_pool2d", &deltaconv::adaptive_avg_pool2d_cuda);
  m.impl("linear", &deltaconv::linear_cuda);
}
