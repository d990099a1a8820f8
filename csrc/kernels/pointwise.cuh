// Pointwise delta kernels (ATen-free): sparsify, densify, activation, affine_channel, add (add_values),
// mul (mul_values), concatenate. Semantics: deltaconv/backends/reference.py (the oracle). Thread mapping and packs:
// pixel_group.cuh. Launchers: csrc/pointwise_ops.cu.
//
// Shapes and layouts at every kernel boundary
//   value tensors  [N, C, H, W] channels_last: element (p, c) at p * C + c, p = (n * H + h) * W + w
//   masks          [N, 1, H, W] bool, contiguous: flag of pixel p at p
//   state          same shape and layout as the value it tracks: acc float32, sent T (the delta
//                  dtype; changes against it are computed in float32)
//   key            [N] bool or nullptr
// Arithmetic that the reference rounds step by step uses __fmul_rn/__fadd_rn/__fsub_rn, which nvcc
// never contracts into an FMA, so float32 results match the reference bit for bit.
// Every kernel writes mask_out at every pixel; value outputs only at pixels whose mask_out is true
// (elsewhere they are unspecified and left unwritten). Values at inactive input pixels are never
// read. No kernel synchronises with the host; all are CUDA-graph capturable.
#pragma once

#include "activation_fn.cuh"
#include "pixel_group.cuh"
#include "send.cuh"

namespace deltaconv {
namespace pw {

// ================================================================ sparsify
// change = x - sent (float32); pixel sent when max_c |change| > threshold (or measure > threshold
// when a measure is given), or its stream is a key stream; then send_element(x, sent) (with p.tf32,
// float32: rounded to TF32, send_element<T, true>, for a stem that reads it in TF32).
template <typename T>
struct SparsifyParams {
  const T* x;              // [N, C, H, W] frame
  T* sent;                 // [N, C, H, W] updated in place
  const float* measure;    // [N, 1, H, W] or nullptr
  const bool* key;         // [N] or nullptr
  T* out;                  // [N, C, H, W]
  bool* mask_out;          // [N, 1, H, W]
  float threshold;
  int64_t pixels, hw;      // N*H*W, H*W
  int channels, log2_lanes;
  bool tf32;               // float32 only: send the changes rounded to TF32 (send_element)
};

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) sparsify_kernel(const SparsifyParams<T> p) {
  grid_dependency_sync();
  const PixelGroup g = pixel_group(p.log2_lanes);
  if (g.pixel >= p.pixels) return;
  const int C = p.channels;
  const int64_t row = g.pixel * C;
  const int step = g.lanes * VEC;
  bool send;
  if (p.measure != nullptr) {
    send = p.measure[g.pixel] > p.threshold;
  } else {
    float m = 0.f;
    for (int c = g.lane * VEC; c < C; c += step) {
      float xv[VEC], sv[VEC];
      load_f<VEC>(p.x + row + c, xv);
      load_f<VEC>(p.sent + row + c, sv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) m = nan_max(m, fabsf(xv[i] - sv[i]));
    }
    send = group_nan_max(g, m) > p.threshold;
  }
  send = send || key_flag(p.key, g.pixel, p.hw);
  if (g.lane == 0) p.mask_out[g.pixel] = send;
  if (!send) return;
  send_row<T, VEC>(g, C, row, p.x, p.sent, p.out, [](float x, int) { return x; }, p.tf32);
}

// ================================================================ densify
// acc += delta on active pixels; out = Tout(acc) at every pixel (a dense output).
template <typename Tin, typename Tout>
struct DensifyParams {
  const Tin* delta;        // [N, C, H, W]
  const bool* mask;        // [N, 1, H, W]
  float* acc;              // [N, C, H, W] updated in place
  Tout* out;               // [N, C, H, W], every element written
  int64_t pixels;
  int channels, log2_lanes;
};

template <typename Tin, typename Tout, int VEC>
__global__ void __launch_bounds__(kThreads) densify_kernel(const DensifyParams<Tin, Tout> p) {
  grid_dependency_sync();
  const PixelGroup g = pixel_group(p.log2_lanes);
  if (g.pixel >= p.pixels) return;
  const int C = p.channels;
  const int64_t row = g.pixel * C;
  const bool active = p.mask[g.pixel];
  for (int c = g.lane * VEC; c < C; c += g.lanes * VEC) {
    float a[VEC];
    load_f<VEC>(p.acc + row + c, a);
    if (active) {
      float d[VEC];
      load_f<VEC>(p.delta + row + c, d);
#pragma unroll
      for (int i = 0; i < VEC; ++i) a[i] += d[i];
      store_f<VEC>(p.acc + row + c, a);
    }
    store_f<VEC>(p.out + row + c, a);
  }
}

// The residual add's output element as the dense add computes it in T: T(a + T(alpha * b)).
template <typename T>
__device__ __forceinline__ float residual_sum(float a, float b, float alpha) {
  return round_to<T>(__fadd_rn(a, round_to<T>(__fmul_rn(alpha, b))));
}

// ================================================================ activation
// On active pixels: acc += delta; change = T(f(acc)) - sent; sent when the change's size exceeds
// the threshold (PendingSize: max or rms over the channels) or the stream is a key stream; then
// out = send_element(f(acc), sent) (with p.tf32, float32: rounded to TF32, send_element<T, true>).
// With `rows` it also lists the sent pixels for the 1x1 convolution after it (conv1x1_rows); so
// do mul_kernel, and add_kernel with its active pixels.
// With RESIDUAL (the add_activation op: a residual add fused into the activation after it) the
// delta is the add's output, computed as add_kernel does: delta = T(a + T(alpha * b)) with
// inactive operands counted as zero, active on mask | mask_b (written to mask_sum, the add's mask).
template <typename T>
struct ActivationParams {
  const T* delta;          // [N, C, H, W] (RESIDUAL: the add's first operand)
  const bool* mask;        // [N, 1, H, W] (RESIDUAL: its mask)
  float* acc;              // [N, C, H, W] updated in place
  T* sent;                 // [N, C, H, W] updated in place
  const bool* key;         // [N] or nullptr
  T* out;                  // [N, C, H, W]; nullptr: the changes are not written (every reader takes `sent`)
  bool* mask_out;          // [N, 1, H, W]
  int kind;                // ActKind
  float param, threshold;
  float rms_limit;         // threshold^2 * C for the rms measure, < 0 for max
  int64_t pixels, hw;
  int channels, log2_lanes;
  // RESIDUAL only (nullptr / unused otherwise)
  const T* delta_b;        // [N, C, H, W] the add's second operand
  const bool* mask_b;      // [N, 1, H, W]
  bool* mask_sum;          // [N, 1, H, W] mask | mask_b, written at every pixel
  float alpha;
  // optional (nullptr: none): the sent pixels listed for the 1x1 convolution after this layer
  // (append_sent_rows): rows [1 + 2 * pixels], the count added to rows_count[0]
  int* rows;
  int* rows_count;
  bool tf32;               // float32 only: send the changes rounded to TF32 (send_element)
  // the pooled measure's first pass (nullptr otherwise): [N, C, H, W] where every active pixel's
  // pending change T(f(acc)) - sent is written, rounded to T (`out` itself unless tf32: the value
  // a send would write there); nothing is sent (mask_out is left to pooled_send_kernel, which
  // decides and sends)
  T* pending;
  const float* slopes;     // kind kPrelu: [C] float32, channel c's negative slope (nullptr otherwise)
};

// KIND: the activation fixed at compile time (an ActKind: the launcher, run_activation in
// pointwise_ops.cu, does so for ReLU, ReLU6, GELU, SiLU and hardswish), or kAnyKind to switch on
// p.kind per element. The switch inside the unrolled loops cost 19 % of this kernel's time on
// mobilenet_v2 and resnet50 at 1080p (H200, 2026-11-21;
// benchmarks/results/activation_kernel_experiments.txt), and up to 1.8x for SiLU and hardswish
// (2026-12-03, benchmarks/results/activation_fixed_ab.txt).
constexpr int kAnyKind = -1;

// The activation's parameter for channel c: kPrelu's slope of that channel (`slopes`, [C]), else the
// layer's one `param`. KIND as activation_kernel's. PReLU runs only on kernels with KIND == kPrelu
// (the launcher, run_activation, never gives kind kPrelu to a kAnyKind kernel), so the switching
// kernel reads no slope: a per-element test of the kind there cost SiLU 4-9 % and hardswish 2-5 % of
// that kernel's time (H100, 2026-12-07, benchmarks/results/prelu_ab.txt section 5).
template <int KIND>
__device__ __forceinline__ float channel_param(float param, const float* slopes, int c) {
  if constexpr (KIND == kPrelu) {
    return slopes[c];
  } else {
    return param;
  }
}

// VALUES (the activation_values op): `delta` holds the layer's whole new input on the active pixels,
// recomputed by the convolution before it from its input's whole values (no accumulator: p.acc
// unused); the rest as above, with f(delta) for f(acc).
// VALUES with RESIDUAL (the add_activation_values op: a residual add in value mode): `delta` and
// `delta_b` hold the add's operands whole at every pixel (a convolution's kept output, a layer's
// sent values), so the add's new output on the active pixels mask | mask_b is their sum
// T(a + T(alpha * b)), as the dense add computes it; f of it as above, no accumulator.
template <typename T, int VEC, int KIND, bool RESIDUAL, bool VALUES = false>
__global__ void __launch_bounds__(kThreads) activation_kernel(const ActivationParams<T> p) {
  grid_dependency_sync();
  const int kind = KIND == kAnyKind ? p.kind : computed_kind(KIND);
  const auto settle = [&](int64_t pixel) {
    bool m = p.mask[pixel];
    if constexpr (RESIDUAL) {
      m = m || p.mask_b[pixel];
      p.mask_sum[pixel] = m;
    }
    if (!m) p.mask_out[pixel] = false;
    return m;
  };
  for_each_active_pixel(p.pixels, p.log2_lanes, settle, [&](const PixelGroup& g) {
    const int C = p.channels;
    const int64_t row = g.pixel * C;
    const int step = g.lanes * VEC;
    // the operands' values where they count (VALUES: whole at every pixel; else zero where inactive)
    const bool ma = !RESIDUAL || VALUES || p.mask[g.pixel];
    const bool mb = RESIDUAL && (VALUES || p.mask_b[g.pixel]);
    PendingSize size;
    for (int c = g.lane * VEC; c < C; c += step) {
      float d[VEC], a[VEC], s[VEC];
      if (ma) load_f<VEC>(p.delta + row + c, d); else fill(d, 0.f);
      if constexpr (RESIDUAL) {
        float b[VEC];
        if (mb) load_f<VEC>(p.delta_b + row + c, b); else fill(b, 0.f);
#pragma unroll
        for (int i = 0; i < VEC; ++i) d[i] = residual_sum<T>(d[i], b[i], p.alpha);
      }
      if constexpr (VALUES) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) a[i] = d[i];
      } else {
        load_f<VEC>(p.acc + row + c, a);
#pragma unroll
        for (int i = 0; i < VEC; ++i) a[i] += d[i];
      }
      load_f<VEC>(p.sent + row + c, s);
      float change[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float y = apply_activation(kind, channel_param<KIND>(p.param, p.slopes, c + i), a[i]);
        change[i] = pending_change<T>(y, s[i]);
        size.add(change[i], p.threshold);
      }
      if constexpr (!VALUES) store_f<VEC>(p.acc + row + c, a);
      if (p.pending != nullptr) store_f<VEC>(p.pending + row + c, change);
    }
    if (p.pending != nullptr) return false;  // the pooled measure's first pass: pooled_send_kernel sends
    const bool send = group_exceeds(g, size, p.rms_limit) || key_flag(p.key, g.pixel, p.hw);
    if (g.lane == 0) p.mask_out[g.pixel] = send;
    if (!send) return false;
    // second pass over this lane's own channels (acc as just written by this thread; VALUES: delta)
    const auto f = [&](float a, int ch) {
      return apply_activation(kind, channel_param<KIND>(p.param, p.slopes, ch), a);
    };
    if constexpr (VALUES && RESIDUAL) {  // the sum again, from both operands
      const auto sum = [&](int64_t i, float (&v)[VEC]) {
        float b[VEC];
        load_f<VEC>(p.delta + i, v);
        load_f<VEC>(p.delta_b + i, b);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = residual_sum<T>(v[k], b[k], p.alpha);
      };
      send_row_loaded<T, VEC>(g, C, row, sum, p.sent, p.out, f, p.tf32, p.out != nullptr);
    } else if constexpr (VALUES) {
      send_row<T, VEC>(g, C, row, p.delta, p.sent, p.out, f, p.tf32, p.out != nullptr);
    } else {
      send_row<T, VEC>(g, C, row, p.acc, p.sent, p.out, f, p.tf32, p.out != nullptr);
    }
    return true;
  }, SentRows{p.rows, p.rows_count, p.pixels});
}

// ================================================================ pooled measure: the send pass
// The "pooled" truncation measure (reference.exceeds, POOL_SIZE 3, POOL_PEAK 4), run after
// activation_kernel wrote the pending change of every pixel of the region to `pending` (rounded to
// T: without tf32 that is `out` itself, holding what a send writes there). A pixel of the region is
// sent when
//   sum_c box_c^2 > limit * count^2  (box_c: channel c's change summed over the region pixels of
//                                     the 3x3 window around it; count: the window's pixels inside
//                                     the image, as avg_pool2d without counting the padding;
//                                     limit = threshold^2 * C: sqrt(mean_c (box_c / count)^2) > t),
// or its own sum_c change_c^2 > peak_limit ((4 * threshold)^2 * C), or its stream is a key stream;
// then `sent` is updated as activation_kernel's send pass does (send_element of f(acc)), and `out`
// written unless `pending` is `out` (the same value is there already). The sent pixels are listed
// for a 1x1 convolution after it when `rows` is given (as append_sent_rows does).
//
// Pixel groups as activation_kernel (a persistent grid): each group reads its pixel's own change
// first (past the peak guard, or a key stream, the pixel is sent without its window), then the 3x3
// window of changes straight from global memory (9 reads of each value, mostly from the caches).
// (A tiled kernel staging chunks of 16 channels with a halo in shared memory measured no faster on
// MobileNetV2 at 1080x1920: 2.05 against 2.09 ms per frame where the maps of at least 4 tiles of
// 8x32 per multiprocessor ran tiled, 4.6 ms with every map tiled; H200, 2026-11-29,
// benchmarks/results/density_experiments.txt section 5.)
constexpr float kPoolPeak = 4.f;  // reference.POOL_PEAK

template <typename T>
struct PooledSendParams {
  const bool* region;      // [N, 1, H, W] the pixels whose change `pending` holds (the others count as 0)
  const T* pending;        // [N, C, H, W] written by activation_kernel (`out`, or a scratch map with tf32)
  const float* acc;        // [N, C, H, W] float32, as activation_kernel left it (nullptr with `values`)
  T* sent;                 // [N, C, H, W] updated in place
  const bool* key;         // [N] or nullptr
  T* out;                  // [N, C, H, W]
  bool* mask_out;          // [N, 1, H, W]
  int kind;                // ActKind
  float param;
  float limit;             // threshold^2 * C, < 0: every pixel of the region (a negative threshold)
  float peak_limit;        // (kPoolPeak * threshold)^2 * C, likewise
  int64_t pixels, hw;
  int height, width, channels, log2_lanes;
  int* rows;               // optional, as in ActivationParams
  int* rows_count;
  bool tf32;               // float32 only: send the changes rounded to TF32 (send_element)
  const T* values;         // activation_values (nullptr otherwise): [N, C, H, W] the whole input, sent
                           // as f(values) where acc is not kept
  const float* slopes;     // kind kPrelu: as in ActivationParams; nullptr for every other kind
};

// grid: a persistent one of pixel groups (for_each_active_pixel)
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) pooled_send_kernel(const PooledSendParams<T> p) {
  grid_dependency_sync();
  const auto settle = [&](int64_t pixel) {
    const bool m = p.region[pixel];
    if (!m) p.mask_out[pixel] = false;
    return m;
  };
  for_each_active_pixel(p.pixels, p.log2_lanes, settle, [&](const PixelGroup& g) {
    const int C = p.channels;
    float own_sq = 0.f;
    for (int c = g.lane * VEC; c < C; c += g.lanes * VEC) {
      float v[VEC];
      load_f<VEC>(p.pending + g.pixel * C + c, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) own_sq = fmaf(v[i], v[i], own_sq);
    }
    bool send = group_sum(g, own_sq) > p.peak_limit || key_flag(p.key, g.pixel, p.hw);
    if (!send) {
      const int W = p.width;
      const int x = static_cast<int>(g.pixel % W);
      const int y = static_cast<int>((g.pixel / W) % p.height);
      const int y0 = max(y - 1, 0), y1 = min(y + 1, p.height - 1);
      const int x0 = max(x - 1, 0), x1 = min(x + 1, W - 1);
      const float count = static_cast<float>((y1 - y0 + 1) * (x1 - x0 + 1));
      unsigned window = 0u;  // bit 3 * (dy + 1) + (dx + 1): that neighbour is in the image and the region
      for (int yy = y0; yy <= y1; ++yy)
        for (int xx = x0; xx <= x1; ++xx)
          if (p.region[g.pixel + static_cast<int64_t>(yy - y) * W + (xx - x)])
            window |= 1u << (3 * (yy - y + 1) + (xx - x + 1));
      float box_sq = 0.f;
      for (int c = g.lane * VEC; c < C; c += g.lanes * VEC) {
        float box[VEC];
        fill(box, 0.f);
#pragma unroll
        for (int k = 0; k < 9; ++k) {
          if (!((window >> k) & 1u)) continue;
          float v[VEC];
          load_f<VEC>(p.pending + (g.pixel + static_cast<int64_t>(k / 3 - 1) * W + (k % 3 - 1)) * C + c, v);
#pragma unroll
          for (int i = 0; i < VEC; ++i) box[i] += v[i];
        }
#pragma unroll
        for (int i = 0; i < VEC; ++i) box_sq = fmaf(box[i], box[i], box_sq);
      }
      send = group_sum(g, box_sq) > p.limit * count * count;
    }
    if (g.lane == 0) p.mask_out[g.pixel] = send;
    if (send) {
      const int kind = computed_kind(p.kind);
      const auto act = [&](float a, int ch) {  // the send pass only: one uniform test per element
        return apply_activation(kind, p.slopes != nullptr ? p.slopes[ch] : p.param, a);
      };
      if (p.values != nullptr) {
        send_row<T, VEC>(g, C, g.pixel * C, p.values, p.sent, p.out, act, p.tf32, p.pending != p.out);
      } else {
        send_row<T, VEC>(g, C, g.pixel * C, p.acc, p.sent, p.out, act, p.tf32, p.pending != p.out);
      }
    }
    return send;
  }, SentRows{p.rows, p.rows_count, p.pixels});
}

// ================================================================ affine_channel
// out = T(delta * scale[c] + shift[c]) in float32 (scale and shift as given, float32), rounded to T
// once, as a dense float16 BatchNorm rounds only its output; the shift only for key streams.
// Active: mask or key.
template <typename T>
struct AffineParams {
  const T* delta;          // [N, C, H, W]
  const bool* mask;        // [N, 1, H, W]
  const float* scale;      // [C] or nullptr
  const float* shift;      // [C] or nullptr
  const bool* key;         // [N] or nullptr
  T* out;                  // [N, C, H, W]
  bool* mask_out;          // [N, 1, H, W]
  int64_t pixels, hw;
  int channels, log2_lanes;
};

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) affine_channel_kernel(const AffineParams<T> p) {
  grid_dependency_sync();
  const auto settle = [&](int64_t pixel) {
    const bool active = p.mask[pixel] || key_flag(p.key, pixel, p.hw);
    p.mask_out[pixel] = active;
    return active;
  };
  for_each_active_pixel(p.pixels, p.log2_lanes, settle, [&](const PixelGroup& g) {
    const bool m = p.mask[g.pixel], k = key_flag(p.key, g.pixel, p.hw);
    const int C = p.channels;
    const int64_t row = g.pixel * C;
    for (int c = g.lane * VEC; c < C; c += g.lanes * VEC) {
      float v[VEC];
      if (m) {
        load_f<VEC>(p.delta + row + c, v);
      } else {
        fill(v, 0.f);
      }
      if (p.scale != nullptr) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] = __fmul_rn(v[i], p.scale[c + i]);
      }
      if (k && p.shift != nullptr) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] = __fadd_rn(v[i], p.shift[c + i]);
      }
      store_f<VEC>(p.out + row + c, v);
    }
  });
}

// ================================================================ add
// out = a + T(alpha * b) (inactive operands count as zero); mask = mask_a | mask_b.
// WHOLE (the add_values op: an add in value mode, DCAdd.keeps_sum): `a` and `b` hold the operands
// whole at every pixel, and `out` is the add's kept whole sum, updated in place: it takes
// T(a + T(alpha * b)), the dense add's value, on the active pixels mask_a | mask_b and keeps the rest.
template <typename T>
struct AddParams {
  const T* a;              // [N, C, H, W]
  const bool* mask_a;      // [N, 1, H, W]
  const T* b;              // [N, C, H, W]
  const bool* mask_b;      // [N, 1, H, W]
  T* out;                  // [N, C, H, W]
  bool* mask_out;          // [N, 1, H, W]
  float alpha;
  int64_t pixels;
  int channels, log2_lanes;
  int* rows;               // optional (nullptr: none): the active pixels listed as in ActivationParams
  int* rows_count;
};

// The body of add_kernel / add_values_kernel (after their grid_dependency_sync()).
template <typename T, int VEC, bool WHOLE>
__device__ __forceinline__ void add_pixels(const AddParams<T>& p) {
  const auto settle = [&](int64_t pixel) {
    const bool active = p.mask_a[pixel] || p.mask_b[pixel];
    p.mask_out[pixel] = active;
    return active;
  };
  for_each_active_pixel(p.pixels, p.log2_lanes, settle, [&](const PixelGroup& g) {
    const bool ma = WHOLE || p.mask_a[g.pixel], mb = WHOLE || p.mask_b[g.pixel];
    const int C = p.channels;
    const int64_t row = g.pixel * C;
    for (int c = g.lane * VEC; c < C; c += g.lanes * VEC) {
      float va[VEC], vb[VEC];
      if (ma) load_f<VEC>(p.a + row + c, va); else fill(va, 0.f);
      if (mb) load_f<VEC>(p.b + row + c, vb); else fill(vb, 0.f);
#pragma unroll
      for (int i = 0; i < VEC; ++i) va[i] = __fadd_rn(va[i], round_to<T>(__fmul_rn(p.alpha, vb[i])));
      store_f<VEC>(p.out + row + c, va);
    }
    return true;
  }, SentRows{p.rows, p.rows_count, p.pixels});
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) add_kernel(const AddParams<T> p) {
  grid_dependency_sync();
  add_pixels<T, VEC, false>(p);
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) add_values_kernel(const AddParams<T> p) {
  grid_dependency_sync();
  add_pixels<T, VEC, true>(p);
}

// ================================================================ mul
// acc_a += delta_a, acc_b += delta_b (on their active pixels); y = acc_a * acc_b over the region
// mask_a | mask_b, then truncation against `sent` as in activation. An operand may be spatially
// broadcast ([N, C, 1, 1] against an [N, C, H, W] output, squeeze-excite): its acc is updated
// beforehand by accumulate_rows_kernel and its flag/row is that of pixel n. With p.tf32 (float32) the
// changes are sent rounded to TF32, as in activation.
// mul_values_kernel (the mul_values op, a product in value mode): `a` and `b` hold the operands whole
// at every pixel (layers' sent values), so y = a * b on the region, no accumulators (acc_a / acc_b
// unused, no accumulate_rows_kernel).
template <typename T>
struct MulParams {
  const T* a;              // [N, C, H, W] or [N, C, 1, 1] (a_bcast)
  const bool* mask_a;      // [N, 1, H, W] or [N, 1, 1, 1]
  float* acc_a;            // like a, updated in place (nullptr in mul_values_kernel)
  const T* b;              // like a, with b_bcast
  const bool* mask_b;
  float* acc_b;
  T* sent;                 // [N, C, H, W] output shape, updated in place
  const bool* key;         // [N] or nullptr
  T* out;                  // [N, C, H, W]
  bool* mask_out;          // [N, 1, H, W]
  float threshold;
  float rms_limit;         // threshold^2 * C for the rms measure, < 0 for max
  int64_t pixels, hw;      // of the output
  int channels, log2_lanes;
  bool a_bcast, b_bcast;
  int* rows;               // optional (nullptr: none): the sent pixels listed as in ActivationParams
  int* rows_count;
  bool tf32;               // float32 only: send the changes rounded to TF32 (send_element)
};

// acc[r, c] += delta[r, c] for rows r (streams) whose mask[r] is set; one thread per element.
template <typename T>
__global__ void __launch_bounds__(kThreads) accumulate_rows_kernel(const T* __restrict__ delta,
                                                                   const bool* __restrict__ mask,
                                                                   float* __restrict__ acc, int64_t rows,
                                                                   int channels) {
  grid_dependency_sync();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * channels) return;
  if (mask[i / channels]) acc[i] += to_f<T>(delta[i]);
}

// An operand's value at channels [c, c + VEC) of output row `row` (of row `brow`, its stream's, when
// broadcast): VALUES, its whole value in d; otherwise its accumulator, to which d is added first where
// `active` (not broadcast: accumulate_rows_kernel did that).
template <typename T, int VEC, bool VALUES>
__device__ __forceinline__ void mul_operand(const T* d, float* acc, bool bcast, bool active, int64_t row,
                                            int64_t brow, int c, float (&v)[VEC]) {
  if constexpr (VALUES) {
    load_f<VEC>(d + (bcast ? brow : row) + c, v);
    return;
  }
  if (bcast) {
    load_f<VEC>(acc + brow + c, v);
    return;
  }
  load_f<VEC>(acc + row + c, v);
  if (active) {
    float dv[VEC];
    load_f<VEC>(d + row + c, dv);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] += dv[i];
    store_f<VEC>(acc + row + c, v);
  }
}

// The body of mul_kernel / mul_values_kernel (after their grid_dependency_sync()).
template <typename T, int VEC, bool VALUES>
__device__ __forceinline__ void mul_pixels(const MulParams<T>& p) {
  const auto mask_a = [&](int64_t pixel) { return p.mask_a[p.a_bcast ? pixel / p.hw : pixel]; };
  const auto mask_b = [&](int64_t pixel) { return p.mask_b[p.b_bcast ? pixel / p.hw : pixel]; };
  const auto settle = [&](int64_t pixel) {
    const bool active = mask_a(pixel) || mask_b(pixel);
    if (!active) p.mask_out[pixel] = false;
    return active;
  };
  for_each_active_pixel(p.pixels, p.log2_lanes, settle, [&](const PixelGroup& g) {
    const bool ma = mask_a(g.pixel), mb = mask_b(g.pixel);
    const int64_t n = g.pixel / p.hw;
    const int C = p.channels;
    const int64_t row = g.pixel * C;
    const int64_t brow = n * C;
    const int step = g.lanes * VEC;
    PendingSize size;
    for (int c = g.lane * VEC; c < C; c += step) {
      float va[VEC], vb[VEC], s[VEC];
      mul_operand<T, VEC, VALUES>(p.a, p.acc_a, p.a_bcast, ma, row, brow, c, va);
      mul_operand<T, VEC, VALUES>(p.b, p.acc_b, p.b_bcast, mb, row, brow, c, vb);
      load_f<VEC>(p.sent + row + c, s);
#pragma unroll
      for (int i = 0; i < VEC; ++i) size.add(pending_change<T>(__fmul_rn(va[i], vb[i]), s[i]), p.threshold);
    }
    const bool send = group_exceeds(g, size, p.rms_limit) || flag(p.key, n);
    if (g.lane == 0) p.mask_out[g.pixel] = send;
    if (!send) return false;
    for (int c = g.lane * VEC; c < C; c += step) {
      float va[VEC], vb[VEC], s[VEC];
      mul_operand<T, VEC, VALUES>(p.a, p.acc_a, p.a_bcast, false, row, brow, c, va);
      mul_operand<T, VEC, VALUES>(p.b, p.acc_b, p.b_bcast, false, row, brow, c, vb);
      load_f<VEC>(p.sent + row + c, s);
#pragma unroll
      for (int i = 0; i < VEC; ++i) va[i] = send_element<T>(__fmul_rn(va[i], vb[i]), s[i], p.tf32);
      store_f<VEC>(p.out + row + c, va);
      store_f<VEC>(p.sent + row + c, s);
    }
    return true;
  }, SentRows{p.rows, p.rows_count, p.pixels});
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) mul_kernel(const MulParams<T> p) {
  grid_dependency_sync();
  mul_pixels<T, VEC, false>(p);
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) mul_values_kernel(const MulParams<T> p) {
  grid_dependency_sync();
  mul_pixels<T, VEC, true>(p);
}

// ================================================================ concatenate (channels)
// out[p, off_i + c] = input_i[p, c] where mask_i[p], 0 where not; mask_out = OR of the masks.
constexpr int kMaxConcat = 32;

template <typename T>
struct ConcatParams {
  const T* in[kMaxConcat];       // [N, C_i, H, W]
  const bool* mask[kMaxConcat];  // [N, 1, H, W]
  int channels[kMaxConcat];      // C_i
  int offset[kMaxConcat];        // sum of C_j, j < i
  T* out;                        // [N, sum C_i, H, W]
  bool* mask_out;                // [N, 1, H, W]
  int64_t pixels;
  int count, total_channels, log2_lanes;
};

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) concatenate_kernel(const ConcatParams<T> p) {
  grid_dependency_sync();
  const auto settle = [&](int64_t pixel) {
    bool any = false;
    for (int i = 0; i < p.count; ++i) any = any || p.mask[i][pixel];
    p.mask_out[pixel] = any;
    return any;
  };
  for_each_active_pixel(p.pixels, p.log2_lanes, settle, [&](const PixelGroup& g) {
    T* out_row = p.out + g.pixel * p.total_channels;
    for (int i = 0; i < p.count; ++i) {
      const int C = p.channels[i];
      const bool m = p.mask[i][g.pixel];
      const T* in_row = p.in[i] + g.pixel * C;
      for (int c = g.lane * VEC; c < C; c += g.lanes * VEC) {
        float v[VEC];
        if (m) load_f<VEC>(in_row + c, v); else fill(v, 0.f);
        store_f<VEC>(out_row + p.offset[i] + c, v);
      }
    }
  });
}

// ================================================================ interleaved channels
// torch.channel_shuffle(torch.cat([a, b], 1), 2) cut into `parts` equal chunks along the channels
// (ShuffleNet V2's block tail and the next block's split, in one pass): shuffled channel j is
// channel j / 2 of a (j even) or of b (j odd) where that input's mask is set, else 0; part q holds
// shuffled channels [q * part_channels, (q + 1) * part_channels) as a channels_last tensor of its
// own. mask_out = mask_a OR mask_b. VEC > 1 (even): a lane reads VEC / 2 channels of each input
// and writes VEC shuffled channels (C % VEC == 0, so a pack never straddles two parts).
constexpr int kMaxInterleaveParts = 2;

template <typename T>
struct InterleaveParams {
  const T* in[2];                  // a, b: [N, C, H, W]
  const bool* mask[2];             // [N, 1, H, W]
  T* out[kMaxInterleaveParts];     // [N, part_channels, H, W] each (parts of them)
  bool* mask_out;                  // [N, 1, H, W]
  int64_t pixels;
  int channels;                    // C (of each input)
  int part_channels;               // 2 C / parts
  int log2_lanes;
};

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) interleave_channels_kernel(const InterleaveParams<T> p) {
  grid_dependency_sync();
  static_assert(VEC == 1 || VEC % 2 == 0, "a pack takes the same channels of both inputs");
  const auto settle = [&](int64_t pixel) {
    const bool any = p.mask[0][pixel] || p.mask[1][pixel];
    p.mask_out[pixel] = any;
    return any;
  };
  for_each_active_pixel(p.pixels, p.log2_lanes, settle, [&](const PixelGroup& g) {
    const bool ma = p.mask[0][g.pixel], mb = p.mask[1][g.pixel];
    const T* a = p.in[0] + g.pixel * p.channels;
    const T* b = p.in[1] + g.pixel * p.channels;
    for (int j = g.lane * VEC; j < 2 * p.channels; j += g.lanes * VEC) {
      float v[VEC];
      if constexpr (VEC == 1) {
        const bool odd = j & 1;
        v[0] = (odd ? mb : ma) ? to_f<T>((odd ? b : a)[j >> 1]) : 0.f;
      } else {
        constexpr int kHalf = VEC / 2;
        float va[kHalf], vb[kHalf];
        if (ma) load_f<kHalf>(a + j / 2, va); else fill(va, 0.f);
        if (mb) load_f<kHalf>(b + j / 2, vb); else fill(vb, 0.f);
#pragma unroll
        for (int e = 0; e < kHalf; ++e) {
          v[2 * e] = va[e];
          v[2 * e + 1] = vb[e];
        }
      }
      const int q = j >= p.part_channels;  // parts <= 2
      store_f<VEC>(p.out[q] + g.pixel * p.part_channels + (j - q * p.part_channels), v);
    }
  });
}

}  // namespace pw
}  // namespace deltaconv
