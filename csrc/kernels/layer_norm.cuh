// Per-pixel layer norm over the channels (ATen-free): ConvNeXt's LayerNorm, which normalises each
// pixel's C channels. Semantics: `layer_norm` in deltaconv/backends/reference.py (the oracle).
// Thread mapping and packs: pixel_group.cuh; truncation: send.cuh. Launcher: csrc/pointwise_ops.cu.
//
// Shapes and layouts (as every pointwise kernel, pointwise.cuh):
//   delta, out [N, C, H, W] channels_last; mask, mask_out [N, 1, H, W] bool
//   acc        [N, C, H, W] float32, updated in place; sent [N, C, H, W] T, updated in place
//   weight, bias [C] float32 or nullptr; key [N] bool or nullptr
// On active pixels: acc += delta; mean and variance of acc over the channels (two passes, float32);
// y = (acc - mean) * rsqrt(var + eps) * weight + bias; change = T(y) - sent; the pixel is sent when
// the change's size exceeds the threshold (max or rms) or its stream is a key stream (with p.tf32,
// float32: the changes sent rounded to TF32, as in activation). The statistics
// are summed in another order than PyTorch's layer_norm, so results agree with the reference to
// float32 rounding, not bit for bit.
#pragma once

#include "pixel_group.cuh"
#include "send.cuh"

namespace deltaconv {
namespace pw {

template <typename T>
struct LayerNormParams {
  const T* delta;          // [N, C, H, W]
  const bool* mask;        // [N, 1, H, W]
  float* acc;              // [N, C, H, W] updated in place
  T* sent;                 // [N, C, H, W] updated in place
  const float* weight;     // [C] or nullptr (no affine scale)
  const float* bias;       // [C] or nullptr
  const bool* key;         // [N] or nullptr
  T* out;                  // [N, C, H, W]
  bool* mask_out;          // [N, 1, H, W]
  float eps, threshold;
  float rms_limit;         // threshold^2 * C for the rms measure, < 0 for max
  int64_t pixels, hw;
  int channels, log2_lanes;
  // optional (nullptr: none): the sent pixels listed for the 1x1 convolution after this layer
  int* rows;
  int* rows_count;
  bool tf32;               // float32 only: send the changes rounded to TF32 (send_element)
};

// The normalised, scaled and shifted value of channel c whose accumulated input is a.
template <typename T>
__device__ __forceinline__ float layer_norm_value(const LayerNormParams<T>& p, int c, float a, float mean,
                                                  float rstd) {
  float y = __fmul_rn(__fsub_rn(a, mean), rstd);
  if (p.weight != nullptr) y = __fmul_rn(y, p.weight[c]);
  if (p.bias != nullptr) y = __fadd_rn(y, p.bias[c]);
  return y;
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) layer_norm_kernel(const LayerNormParams<T> p) {
  grid_dependency_sync();
  const auto settle = [&](int64_t pixel) {
    const bool m = p.mask[pixel];
    if (!m) p.mask_out[pixel] = false;
    return m;
  };
  for_each_active_pixel(p.pixels, p.log2_lanes, settle, [&](const PixelGroup& g) {
    const int C = p.channels;
    const int64_t row = g.pixel * C;
    const int step = g.lanes * VEC;
    // pass 1: accumulate, and the mean
    float sum = 0.f;
    for (int c = g.lane * VEC; c < C; c += step) {
      float d[VEC], a[VEC];
      load_f<VEC>(p.delta + row + c, d);
      load_f<VEC>(p.acc + row + c, a);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        a[i] += d[i];
        sum += a[i];
      }
      store_f<VEC>(p.acc + row + c, a);
    }
    const float mean = group_sum(g, sum) / static_cast<float>(C);
    // pass 2: the (biased) variance about the mean; each lane rereads its own channels
    float sq = 0.f;
    for (int c = g.lane * VEC; c < C; c += step) {
      float a[VEC];
      load_f<VEC>(p.acc + row + c, a);
#pragma unroll
      for (int i = 0; i < VEC; ++i) sq = fmaf(a[i] - mean, a[i] - mean, sq);
    }
    const float rstd = rsqrtf(group_sum(g, sq) / static_cast<float>(C) + p.eps);
    // pass 3: the pending change's size
    PendingSize size;
    for (int c = g.lane * VEC; c < C; c += step) {
      float a[VEC], s[VEC];
      load_f<VEC>(p.acc + row + c, a);
      load_f<VEC>(p.sent + row + c, s);
#pragma unroll
      for (int i = 0; i < VEC; ++i) size.add(pending_change<T>(layer_norm_value(p, c + i, a[i], mean, rstd), s[i]),
                                             p.threshold);
    }
    const bool send = group_exceeds(g, size, p.rms_limit) || key_flag(p.key, g.pixel, p.hw);
    if (g.lane == 0) p.mask_out[g.pixel] = send;
    if (!send) return false;
    // pass 4: send
    for (int c = g.lane * VEC; c < C; c += step) {
      float a[VEC], s[VEC];
      load_f<VEC>(p.acc + row + c, a);
      load_f<VEC>(p.sent + row + c, s);
#pragma unroll
      for (int i = 0; i < VEC; ++i) a[i] = send_element<T>(layer_norm_value(p, c + i, a[i], mean, rstd), s[i], p.tf32);
      store_f<VEC>(p.out + row + c, a);
      store_f<VEC>(p.sent + row + c, s);
    }
    return true;
  }, SentRows{p.rows, p.rows_count, p.pixels});
}

}  // namespace pw
}  // namespace deltaconv
