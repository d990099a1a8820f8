// Device helpers of the pointwise kernels (ATen-free): element conversions, packed loads/stores of
// VEC consecutive channels, and the "pixel group" thread mapping with its lane reductions.
//
// Thread mapping shared by every pointwise kernel
// -----------------------------------------------
// Feature maps are channels_last: pixel p = (n * H + h) * W + w owns the C consecutive elements
// [p * C, (p + 1) * C). One group of `lanes` threads (a power of two <= 32, chosen by the launcher
// from C so that small channel counts do not leave most of a warp idle; 32 = one warp per pixel)
// handles one pixel at a time (pixel_group: one pixel per group, for kernels that touch every
// pixel; for_each_active_pixel: a persistent grid whose groups walk the pixels and skip the
// inactive ones, for kernels that only work on active pixels); lane l handles channels l*VEC,
// l*VEC + lanes*VEC, ... in packs of VEC. VEC = 16 bytes / sizeof(activation element) when
// C % VEC == 0 and every pointer is 16-byte aligned, else 1. Groups never straddle a warp (blocks
// are multiples of 32 threads), so a group exits as a whole (inactive pixel, past the end) and its
// reductions use only its own lanes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "grid_dependency.cuh"

namespace deltaconv {
namespace pw {

constexpr int kThreads = 256;  // threads per block of every pointwise kernel

// ---------------------------------------------------------------- element conversions
template <typename T> struct Elem;
template <> struct Elem<float> {
  static __device__ __forceinline__ float to(float v) { return v; }
  static __device__ __forceinline__ float from(float v) { return v; }
};
template <> struct Elem<__half> {
  static __device__ __forceinline__ float to(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from(float v) { return __float2half_rn(v); }
};
template <> struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ float to(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
};

template <typename T> __device__ __forceinline__ float to_f(T v) { return Elem<T>::to(v); }
template <typename T> __device__ __forceinline__ T from_f(float v) { return Elem<T>::from(v); }
// `v` rounded to T's precision (what a PyTorch op computing in T stores), as a float
template <typename T> __device__ __forceinline__ float round_to(float v) { return to_f<T>(from_f<T>(v)); }

// ---------------------------------------------------------------- packed loads and stores
// N consecutive elements of T; aligned to min(N * sizeof(T), 16) bytes so that a pack is moved
// with 16-byte (or smaller) vector instructions.
template <typename T, int N>
struct alignas((N * sizeof(T)) < 16 ? (N * sizeof(T)) : 16) Pack {
  T v[N];
};

// out[i] = float(p[i]), i < N. `p` must be aligned like Pack<T, N>.
template <int N, typename T>
__device__ __forceinline__ void load_f(const T* p, float (&out)[N]) {
  const Pack<T, N> pk = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_f<T>(pk.v[i]);
}

// p[i] = T(in[i]) (round to nearest even), i < N. `p` must be aligned like Pack<T, N>.
template <int N, typename T>
__device__ __forceinline__ void store_f(T* p, const float (&in)[N]) {
  Pack<T, N> pk;
#pragma unroll
  for (int i = 0; i < N; ++i) pk.v[i] = from_f<T>(in[i]);
  *reinterpret_cast<Pack<T, N>*>(p) = pk;
}

template <int N>
__device__ __forceinline__ void fill(float (&v)[N], float x) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = x;
}

// ---------------------------------------------------------------- pixel groups
struct PixelGroup {
  int64_t pixel;  // the pixel this group handles (may be past the end: the caller checks)
  int lane;       // 0 .. lanes-1
  int lanes;      // threads per pixel, a power of two <= 32
  unsigned mask;  // the group's lanes within the warp (for *_sync intrinsics)
};

__device__ __forceinline__ PixelGroup pixel_group(int log2_lanes) {
  PixelGroup g;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  g.lanes = 1 << log2_lanes;
  g.pixel = t >> log2_lanes;
  g.lane = threadIdx.x & (g.lanes - 1);
  const int first = (threadIdx.x & 31) & ~(g.lanes - 1);
  g.mask = g.lanes == 32 ? 0xffffffffu : (((1u << g.lanes) - 1u) << first);
  return g;
}

// ---------------------------------------------------------------- persistent pixel groups
// Kernels that only work on active pixels (activation, affine_channel, add, mul, concatenate; max
// pooling) run a grid of at most as many blocks as are resident at once, and group `gid` of the G
// groups in the grid handles pixels gid, gid + G, gid + 2G, ...: at any moment the groups work on
// neighbouring pixels, as with one group per pixel. The lanes of a group look up `lanes` of its
// pixels at once (lane j the j-th next one), settle the inactive ones alone, and the group then
// runs the active ones. A frame where little changed thus costs a few hundred blocks instead of
// one block per 256 / lanes pixels. (Giving each warp a run of 32 consecutive pixels instead made
// frames with many active pixels 4-7x slower on an H200: the warps then stream from addresses 32
// pixels apart.)
//
// settle(pixel) -> bool: called by one lane per pixel; writes what an inactive pixel needs and
//                        returns whether the pixel is active.
// body(g):               called by every lane of the group for each active pixel g.pixel; may only
//                        synchronise within the group (g.mask). It may return a bool (the pixel
//                        was sent), which the batch hook gets.
// after(g, base, groups, sent): the batch hook, called by every lane of the warp after each batch
//                        (so the warp's groups then take the same number of batches, those past
//                        the end with none active): lane j of group g looked up pixel
//                        base + j * groups, and bit j of `sent` (the same on the group's lanes) is
//                        set where body returned true. Without it (NoBatchHook) a group stops
//                        after its own last batch.
struct NoBatchHook {
  __device__ __forceinline__ void operator()(const PixelGroup&, int64_t, int64_t, unsigned) const {}
};

template <typename Settle, typename Body, typename After = NoBatchHook>
__device__ __forceinline__ void for_each_active_pixel(int64_t pixels, int log2_lanes, Settle&& settle, Body&& body,
                                                      After&& after = After{}) {
  constexpr bool kHook = !std::is_same_v<std::decay_t<After>, NoBatchHook>;
  const int li = threadIdx.x & 31;
  PixelGroup g;
  g.lanes = 1 << log2_lanes;
  g.lane = li & (g.lanes - 1);
  const int first_lane = li & ~(g.lanes - 1);
  g.mask = g.lanes == 32 ? 0xffffffffu : (((1u << g.lanes) - 1u) << first_lane);
  const int64_t groups = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> log2_lanes;
  const int64_t gid = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> log2_lanes;
  // with a hook, the warp's first group sets the number of batches
  const int64_t lead = kHook ? gid - (li >> log2_lanes) : gid;
  for (int64_t base = gid; base - gid + lead < pixels; base += groups << log2_lanes) {
    const int64_t mine = base + g.lane * groups;
    const bool active = mine < pixels && settle(mine);
    unsigned bits = __ballot_sync(g.mask, active) >> first_lane;
    unsigned sent = 0u;
    while (bits != 0u) {
      const int j = __ffs(static_cast<int>(bits)) - 1;
      bits &= bits - 1u;
      g.pixel = base + j * groups;
      if constexpr (std::is_same_v<decltype(body(g)), bool>) {
        if (body(g)) sent |= 1u << j;
      } else {
        body(g);
      }
    }
    if constexpr (kHook) after(g, base, groups, sent);
  }
}

// The batch hook that lists the sent pixels for a 1x1 convolution after this layer (stride 1, no
// padding: output pixel = input pixel): appends each pixel of `sent` (see for_each_active_pixel) as
// rows[1 + k] = rows[1 + cap + k] = pixel, k = atomicAdd(count, ...), the work list that
// conv1x1_mask_kernel would write (conv_common.cuh); one atomic per warp and batch. Called by every
// lane of the warp. cap: the pixels of the map (the list's capacity).
__device__ __forceinline__ void append_sent_rows(const PixelGroup& g, int64_t base, int64_t groups, unsigned sent,
                                                 int* rows, int* count, int64_t cap) {
  const int li = threadIdx.x & 31;
  const int first_lane = li & ~(g.lanes - 1);
  const int n = g.lane == 0 ? __popc(sent) : 0;  // the group's rows, held by its lane 0
  int incl = n;  // rows of the groups up to this lane's, inclusive
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (li >= o) incl += v;
  }
  const int total = __shfl_sync(0xffffffffu, incl, 31);
  if (total == 0) return;  // uniform over the warp
  int start = 0;
  if (li == 0) start = atomicAdd(count, total);
  start = __shfl_sync(0xffffffffu, start, 0) + __shfl_sync(0xffffffffu, incl - n, first_lane);
  if ((sent >> g.lane) & 1u) {
    const int k = start + __popc(sent & ((1u << g.lane) - 1u));
    const int pixel = static_cast<int>(base + g.lane * groups);
    rows[1 + k] = pixel;
    rows[1 + cap + k] = pixel;
  }
}

// The batch hook of the kernels that can list their sent pixels: append_sent_rows when `rows` is
// given (nullptr: nothing to list).
struct SentRows {
  int* rows;
  int* count;
  int64_t cap;
  __device__ __forceinline__ void operator()(const PixelGroup& g, int64_t base, int64_t groups, unsigned sent) const {
    if (rows != nullptr) append_sent_rows(g, base, groups, sent, rows, count, cap);
  }
};

// Whether `pred` holds on any lane of the group.
__device__ __forceinline__ bool group_any(const PixelGroup& g, bool pred) { return __any_sync(g.mask, pred) != 0; }

// Sum of `v` over the lanes of the group (every lane gets the result).
__device__ __forceinline__ float group_sum(const PixelGroup& g, float v) {
  for (int o = g.lanes >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(g.mask, v, o);
  return v;
}

// max that propagates NaN (like torch.amax)
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || a > b) ? a : b; }

// NaN-propagating max of `v` over the lanes of the group (every lane gets the result).
__device__ __forceinline__ float group_nan_max(const PixelGroup& g, float v) {
  for (int o = g.lanes >> 1; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(g.mask, v, o));
  return v;
}

__device__ __forceinline__ bool flag(const bool* p, int64_t i) { return p != nullptr && p[i]; }

// The key flag of pixel `pixel` (stream pixel / hw); the division only runs when there are keys.
__device__ __forceinline__ bool key_flag(const bool* key, int64_t pixel, int64_t hw) {
  return key != nullptr && key[pixel / hw];
}

}  // namespace pw
}  // namespace deltaconv
