// Shared helpers for the deltaconv CUDA launchers: argument checks that name the argument and the
// value received, dtype dispatch over the activation dtypes, and the kernel launch (with its check).
// Kernel templates (the *.cuh files under csrc/kernels and csrc/conv) stay free of ATen; only
// launchers (*.cu) include this header.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

namespace deltaconv {

// The largest int: sizes and counts the kernels index with int must be at most this.
constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// The activation dtypes every op supports.
inline bool is_activation_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

#define DC_CHECK_CUDA(op, name, t)                                                                   \
  TORCH_CHECK((t).is_cuda(), "deltaconv::" op ": argument '" name "' must be a CUDA tensor, got ", \
              (t).device())

#define DC_CHECK_DTYPE(op, name, t, expected)                                                        \
  TORCH_CHECK((t).scalar_type() == (expected), "deltaconv::" op ": argument '" name "' must have dtype ", \
              (expected), ", got ", (t).scalar_type())

#define DC_CHECK_ACTIVATION_DTYPE(op, name, t)                                                        \
  TORCH_CHECK(::deltaconv::is_activation_dtype((t).scalar_type()), "deltaconv::" op ": argument '" name \
              "' must be float32, float16 or bfloat16, got ", (t).scalar_type())

#define DC_CHECK_DIM(op, name, t, d)                                                                  \
  TORCH_CHECK((t).dim() == (d), "deltaconv::" op ": argument '" name "' must be ", (d), "-D, got shape ", \
              (t).sizes())

#define DC_CHECK_SAME_DEVICE(op, name, t, ref)                                                        \
  TORCH_CHECK((t).device() == (ref).device(), "deltaconv::" op ": argument '" name "' is on ", (t).device(), \
              " but the delta is on ", (ref).device())

#define DC_CHECK_CHANNELS_LAST(op, name, t)                                                           \
  TORCH_CHECK((t).is_contiguous(at::MemoryFormat::ChannelsLast),                                     \
              "deltaconv::" op ": argument '" name "' must be channels_last contiguous (call "         \
              ".contiguous(memory_format=torch.channels_last)), got strides ", (t).strides())

// A TF32 switch (the truncating ops' tf32, the convolutions' input_tf32) set for deltas other than
// float32: refused, naming the switch and the dtype. `op` may be a variable here.
#define DC_CHECK_TF32_FLAG(op, name, flag, t)                                                          \
  TORCH_CHECK(!(flag) || (t).scalar_type() == at::kFloat, "deltaconv::", op, ": argument '" name       \
              "' needs float32 deltas, got ", (t).scalar_type())

// Dispatch over float / half / bfloat16 with the CUDA element type bound to `scalar_t`.
#define DC_DISPATCH_ACTIVATION_TYPES(TYPE, NAME, ...)                                                 \
  [&] {                                                                                              \
    switch (TYPE) {                                                                                  \
      case at::kFloat: { using scalar_t = float; return __VA_ARGS__(); }                             \
      case at::kHalf: { using scalar_t = __half; return __VA_ARGS__(); }                             \
      case at::kBFloat16: { using scalar_t = __nv_bfloat16; return __VA_ARGS__(); }                  \
      default: TORCH_CHECK(false, NAME ": unsupported dtype ", TYPE);                                \
    }                                                                                                \
  }()

// compute(), run once per (kernel, current device, extra) and cached: the driver queries of the
// launchers (attributes, occupancy) would otherwise run on every launch. Each call site (each
// `Compute` type) has its own cache; compute() runs under that cache's lock.
template <typename Extra, typename Compute>
auto cached_per_kernel(const void* kernel, const Extra& extra, Compute&& compute) -> decltype(compute()) {
  using Value = decltype(compute());
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, Extra>, Value> cache;
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  const auto key = std::make_tuple(kernel, dev, extra);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const Value value = compute();
  cache.emplace(key, value);
  return value;
}

// Whether the current device is Hopper or newer and runs `kernel` from code compiled for sm_90 or
// newer (not JIT-compiled from older PTX): what programmatic dependent launch and thread-block
// clusters need. Cached per (kernel, device).
template <typename... KArgs>
bool runs_sm90_code(void (*kernel)(KArgs...)) {
  return cached_per_kernel(reinterpret_cast<const void*>(kernel), 0, [&] {
    cudaFuncAttributes attr{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel)));
    return at::cuda::getCurrentDeviceProperties()->major >= 9 && attr.binaryVersion >= 90;
  });
}

// Whether `kernel` may start before the previous kernel in the stream has finished (programmatic
// dependent launch, see kernels/grid_dependency.cuh), opt-in: DELTACONV_PDL set and not 0 (read on
// every launch, so a CUDA graph keeps what was set when it was captured), the device Hopper or
// newer, and the kernel's code compiled for sm_90 or newer (so that its grid_dependency_sync()
// waits; code JIT-compiled from older PTX would not). Cached per (kernel, device). Off by default
// until a full GPU test run on it: on an H200 (2026-11-21, benchmarks/results/launch_ab.txt
// section 4) it saved 0.3-1.3 us per conv call and 0-1.3 % per model frame.
template <typename... KArgs>
bool pdl_enabled(void (*kernel)(KArgs...)) {
  const char* v = std::getenv("DELTACONV_PDL");
  if (v == nullptr || *v == 0 || std::strcmp(v, "0") == 0) return false;
  return runs_sm90_code(kernel);
}

// Launch `kernel` on `stream` in thread-block clusters of `cluster_x` blocks along x (1: no cluster;
// Hopper and newer; grid.x a multiple of it), with programmatic dependent launch where pdl_enabled,
// and check the launch. Every deltaconv kernel opens with grid_dependency_sync() and is launched
// through here or launch_kernel.
template <typename... KArgs, typename... Args>
void launch_kernel_clustered(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             unsigned cluster_x, Args&&... args) {
  TORCH_CHECK(cluster_x >= 1 && grid.x % cluster_x == 0, "deltaconv: a grid of ", grid.x,
              " blocks along x does not split into clusters of ", cluster_x);
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled(kernel)) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = n;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// launch_kernel_clustered without clusters.
template <typename... KArgs, typename... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  launch_kernel_clustered(kernel, grid, block, smem, stream, 1u, std::forward<Args>(args)...);
}

// Blocks of `threads` threads with `smem` bytes of dynamic shared memory of `kernel` resident at
// once on the current device: the grid of a persistent kernel (pw::for_each_active_pixel). Cached
// per (kernel, device, threads, smem).
template <typename... KArgs>
int resident_blocks(void (*kernel)(KArgs...), int threads, size_t smem = 0) {
  return cached_per_kernel(reinterpret_cast<const void*>(kernel), std::make_pair(threads, smem), [&] {
    int per_sm = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    return std::max(1, per_sm) * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  });
}

// The grid of a persistent kernel that needs `wanted` blocks: at most the resident ones.
template <typename... KArgs>
unsigned persistent_grid(void (*kernel)(KArgs...), int threads, int64_t wanted) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(wanted, resident_blocks(kernel, threads))));
}

// Whether the A/B switch `name` (an environment variable, read on every call) is on: unset, or
// set to anything but "0".
inline bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// log2 of the lanes a pixel group gives `channels` channels in packs of `vec`: the smallest power of
// two covering the packs, at most 32 lanes (pw::PixelGroup: the pointwise and max pooling kernels).
// Unvectorised kernels (vec 1) give each lane at least 4 channels: a 3-channel input frame then takes
// one thread per pixel, not four (a quarter of the blocks to schedule).
inline int log2_lanes_for(int64_t channels, int vec) {
  const int per_lane = vec == 1 ? 4 : vec;
  const int64_t packs = (channels + per_lane - 1) / per_lane;
  int l = 0;
  while (l < 5 && (int64_t{1} << l) < packs) ++l;
  return l;
}

// Blocks of `threads` threads that give each of `pixels` pixels a group of 2^log2_lanes threads
// (pw::pixel_group; lanes from log2_lanes_for): the grid of a one-group-per-pixel launch, or the
// blocks a persistent one (pw::for_each_active_pixel) would want.
inline int64_t group_blocks(int64_t pixels, int log2_lanes, int threads) {
  return ((pixels << log2_lanes) + threads - 1) / threads;
}

// Whether `p` is 16-byte aligned (a 16-byte vector load or store may use it).
inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0; }

// The rms measure's limit on sum_c change^2 for `threshold` over `channels` channels (sqrt of the
// mean > threshold), or -1 for the max measure (what the kernels' PendingSize tests read). Below a
// negative threshold every change lies under both measures, so that case takes the max test.
inline float rms_limit(bool rms, double threshold, int64_t channels) {
  return rms && threshold >= 0 ? static_cast<float>(threshold * threshold * static_cast<double>(channels)) : -1.f;
}

}  // namespace deltaconv
