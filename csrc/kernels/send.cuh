// Truncation of one element (ATen-free), shared by every layer that keeps a `sent` state
// (sparsify, activation, mul: pointwise.cuh; layer norm: layer_norm.cuh; max pooling:
// conv/pool_kernels.cuh).
// Semantics: `truncate` and `_send` in deltaconv/backends/reference.py.
//
// `sent` holds T values (T: the delta dtype): what downstream has received. A layer's new value y
// (float32) is rounded to T first, as the dense model rounds its outputs, and the change against
// `sent` is computed in float32.
#pragma once

#include "pixel_group.cuh"

namespace deltaconv {
namespace pw {

// `sent` after sending out = T(change), change = target - sent: the target itself, less what the
// cast to T lost (that stays pending): target - (change - out). (sent + out would leave a float
// rounding residual that threshold 0 would re-send on every later frame.)
__device__ __forceinline__ float sent_after(float target, float change, float out) {
  return __fsub_rn(target, __fsub_rn(change, out));
}

// The pending change of one element: T(y) - sent, in float32. `sent` holds T values (what
// downstream received, in the delta dtype), so the layer's new value y is rounded to T first, as
// the dense model rounds its outputs.
template <typename T>
__device__ __forceinline__ float pending_change(float y, float sent) {
  return __fsub_rn(round_to<T>(y), sent);
}

// The size of a pixel's pending change, accumulated over its channels, for the two measures a
// threshold can apply to (reference.MEASURES): "max", max_c |change| > threshold, and "rms",
// sqrt(mean_c change^2) > threshold, tested as sum_c change^2 > rms_limit = threshold^2 * C.
struct PendingSize {
  bool over = false;  // some channel's |change| > threshold
  float sq = 0.f;     // sum of change^2 over the channels seen
  __device__ __forceinline__ void add(float change, float threshold) {
    over |= fabsf(change) > threshold;
    sq = fmaf(change, change, sq);
  }
};

// Whether the pixel of group `g` is sent: rms_limit < 0 selects the max measure.
__device__ __forceinline__ bool group_exceeds(const PixelGroup& g, const PendingSize& size, float rms_limit) {
  return rms_limit >= 0.f ? group_sum(g, size.sq) > rms_limit : group_any(g, size.over);
}

// `v` rounded to nearest TF32 (ties away from zero, as cvt.rna: the tensor cores' input format),
// in a float: its 13 low mantissa bits zero.
__device__ __forceinline__ float round_to_tf32(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
  return __uint_as_float(r);
}

// Sends one element: returns out = T(T(y) - sent) and updates `sent` (a float holding a T value)
// to sent_after(T(y), change, out), which the caller stores back as T.
// TF32 (float32 deltas for convolutions that read them in TF32): out = TF32(T(y) - sent) instead,
// so that those convolutions read the deltas as they are; what the rounding left stays pending in
// `sent` as the cast's residual does (no drift), and goes out with a later change.
template <typename T, bool TF32 = false>
__device__ __forceinline__ float send_element(float y, float& sent) {
  const float target = round_to<T>(y);
  const float change = __fsub_rn(target, sent);
  const float out = TF32 ? round_to_tf32(change) : round_to<T>(change);
  sent = sent_after(target, change, out);
  return out;
}

// send_element with the TF32 choice made per launch (`tf32`, uniform over the grid; it only
// applies to float32, the other types ignore it): every truncating kernel takes it so.
template <typename T>
__device__ __forceinline__ float send_element(float y, float& sent, bool tf32) {
  if constexpr (std::is_same<T, float>::value) {
    if (tf32) return send_element<T, true>(y, sent);
  }
  return send_element<T>(y, sent);
}

// The send pass of a truncating pointwise kernel over the channels of group `g`'s lane in pixel
// row `row` (element offset p * C): out = send_element<T, TF32>(value(v, c), sent) with `sent` updated
// in place (c: the element's channel, for per-channel functions such as PReLU), the VEC values v of
// the pack at element offset i given by `load(i, v)` (one source map read as it is, send_row; or the
// sum of two, the residual add of add_activation_values). `write_out` false skips the store to `out`
// where an earlier pass left the same values there (the pooled measure's, whose neighbours read them
// concurrently).
template <typename T, int VEC, bool TF32, typename Load, typename Value>
__device__ __forceinline__ void send_row_loaded_as(const PixelGroup& g, int C, int64_t row, Load&& load, T* sent,
                                                   T* out, Value&& value, bool write_out) {
  for (int c = g.lane * VEC; c < C; c += g.lanes * VEC) {
    float v[VEC], s[VEC];
    load(row + c, v);
    load_f<VEC>(sent + row + c, s);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = send_element<T, TF32>(value(v[i], c + i), s[i]);
    if (write_out) store_f<VEC>(out + row + c, v);
    store_f<VEC>(sent + row + c, s);
  }
}

// send_row_loaded_as with the TF32 choice made per launch (`tf32`, float32 only), outside the loop.
template <typename T, int VEC, typename Load, typename Value>
__device__ __forceinline__ void send_row_loaded(const PixelGroup& g, int C, int64_t row, Load&& load, T* sent, T* out,
                                                Value&& value, bool tf32, bool write_out = true) {
  if constexpr (std::is_same<T, float>::value) {
    if (tf32) return send_row_loaded_as<T, VEC, true>(g, C, row, load, sent, out, value, write_out);
  }
  send_row_loaded_as<T, VEC, false>(g, C, row, load, sent, out, value, write_out);
}

// send_row_loaded from one map `src` ([N, C, H, W] channels_last, T or float32), read as it is.
template <typename T, int VEC, typename Src, typename Value>
__device__ __forceinline__ void send_row(const PixelGroup& g, int C, int64_t row, const Src* src, T* sent, T* out,
                                         Value&& value, bool tf32, bool write_out = true) {
  const auto load = [src](int64_t i, float (&v)[VEC]) { load_f<VEC>(src + i, v); };
  send_row_loaded<T, VEC>(g, C, row, load, sent, out, value, tf32, write_out);
}

}  // namespace pw
}  // namespace deltaconv
