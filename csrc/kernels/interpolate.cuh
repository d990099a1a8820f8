// Resampling of a delta (ATen-free): nearest, nearest-exact and bilinear, with the index and
// weight arithmetic of PyTorch's CUDA upsampling kernels (aten/src/ATen/native/cuda/UpSample.cuh),
// so that both the values and the output mask (the footprint: output pixels with a positive
// weight on an active input pixel) match F.interpolate exactly.
//
//   delta    [N, C, H_in, W_in]   channels_last
//   mask     [N, 1, H_in, W_in]   bool
//   out      [N, C, H_out, W_out] channels_last, written at active output pixels only
//   mask_out [N, 1, H_out, W_out] bool, every pixel written
// One pixel group (pixel_group.cuh) per output pixel.
//
// resample_rows_kernel / resample_kernel: the same arithmetic on a dense map (every pixel; the output
// densifier's, where a model ends in an upsampling: convert(fuse=True)), reading a channels_last map
// and writing NCHW.
#pragma once

#include "pixel_group.cuh"

namespace deltaconv {
namespace pw {

enum InterpMode : int { kNearest = 0, kNearestExact = 1, kBilinear = 2 };

template <typename T>
struct InterpolateParams {
  const T* delta;
  const bool* mask;
  T* out;
  bool* mask_out;
  // source-per-destination ratios, computed on the host exactly as PyTorch does:
  // nearest*: compute_scales_value; bilinear: area_pixel_compute_scale
  float scale_h, scale_w;
  int64_t pixels;          // N * H_out * W_out
  int in_h, in_w, out_h, out_w;
  int channels, log2_lanes, mode;
  bool align_corners;
};

__device__ __forceinline__ int nearest_source(float scale, int dst, int in_size, bool exact) {
  const float src = exact ? floorf((dst + 0.5f) * scale) : floorf(dst * scale);
  return min(static_cast<int>(src), in_size - 1);
}

__device__ __forceinline__ float linear_source(float scale, int dst, bool align_corners) {
  if (align_corners) return scale * dst;
  const float src = scale * (dst + 0.5f) - 0.5f;
  return src < 0.f ? 0.f : src;
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) interpolate_kernel(const InterpolateParams<T> p) {
  grid_dependency_sync();
  const PixelGroup g = pixel_group(p.log2_lanes);
  if (g.pixel >= p.pixels) return;
  const int ow = static_cast<int>(g.pixel % p.out_w);
  const int64_t t = g.pixel / p.out_w;
  const int oh = static_cast<int>(t % p.out_h);
  const int64_t n = t / p.out_h;
  const int C = p.channels;
  const int step = g.lanes * VEC;
  const int64_t in_base = n * p.in_h * p.in_w;
  T* out_row = p.out + g.pixel * C;

  if (p.mode != kBilinear) {
    const bool exact = p.mode == kNearestExact;
    const int ih = nearest_source(p.scale_h, oh, p.in_h, exact);
    const int iw = nearest_source(p.scale_w, ow, p.in_w, exact);
    const int64_t src = in_base + static_cast<int64_t>(ih) * p.in_w + iw;
    const bool m = p.mask[src];
    if (g.lane == 0) p.mask_out[g.pixel] = m;
    if (!m) return;
    const T* in_row = p.delta + src * C;
    for (int c = g.lane * VEC; c < C; c += step) {
      const Pack<T, VEC> v = *reinterpret_cast<const Pack<T, VEC>*>(in_row + c);
      *reinterpret_cast<Pack<T, VEC>*>(out_row + c) = v;
    }
    return;
  }

  const float h1r = linear_source(p.scale_h, oh, p.align_corners);
  const int h1 = static_cast<int>(h1r);
  const int h1p = (h1 < p.in_h - 1) ? 1 : 0;
  const float h1lambda = h1r - h1;
  const float h0lambda = 1.f - h1lambda;
  const float w1r = linear_source(p.scale_w, ow, p.align_corners);
  const int w1 = static_cast<int>(w1r);
  const int w1p = (w1 < p.in_w - 1) ? 1 : 0;
  const float w1lambda = w1r - w1;
  const float w0lambda = 1.f - w1lambda;

  const int64_t s00 = in_base + static_cast<int64_t>(h1) * p.in_w + w1;
  const int64_t s01 = s00 + w1p;
  const int64_t s10 = s00 + static_cast<int64_t>(h1p) * p.in_w;
  const int64_t s11 = s10 + w1p;
  // a neighbour counts when it is active and its weight is positive (h0lambda, w0lambda > 0 always)
  const bool m00 = p.mask[s00];
  const bool m01 = w1lambda > 0.f && p.mask[s01];
  const bool m10 = h1lambda > 0.f && p.mask[s10];
  const bool m11 = h1lambda > 0.f && w1lambda > 0.f && p.mask[s11];
  const bool active = m00 || m01 || m10 || m11;
  if (g.lane == 0) p.mask_out[g.pixel] = active;
  if (!active) return;
  // reading only active neighbours (zero-weight ones are not read either: they contribute 0)
  for (int c = g.lane * VEC; c < C; c += step) {
    float v00[VEC], v01[VEC], v10[VEC], v11[VEC];
    if (m00) load_f<VEC>(p.delta + s00 * C + c, v00); else fill(v00, 0.f);
    if (m01) load_f<VEC>(p.delta + s01 * C + c, v01); else fill(v01, 0.f);
    if (m10) load_f<VEC>(p.delta + s10 * C + c, v10); else fill(v10, 0.f);
    if (m11) load_f<VEC>(p.delta + s11 * C + c, v11); else fill(v11, 0.f);
    float r[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      r[i] = h0lambda * (w0lambda * v00[i] + w1lambda * v01[i]) + h1lambda * (w0lambda * v10[i] + w1lambda * v11[i]);
    }
    store_f<VEC>(out_row + c, r);
  }
}

// ---------------------------------------------------------------- dense resampling
//   x    [N, C, H_in, W_in]   channels_last (every pixel read)
//   out  [N, C, H_out, W_out] contiguous (NCHW): each thread writes kResampleRun consecutive columns of
//        one output row (n, c, oh), with one 16-byte store where the row's length allows
template <typename T>
struct ResampleParams {
  const T* x;
  T* out;
  float scale_h, scale_w;  // as InterpolateParams
  int64_t threads;         // N * C * H_out * runs per row
  int in_h, in_w, out_h, out_w;
  int channels, mode;
  bool align_corners;
};

constexpr int kResampleRun = 8;

// Stores a run r[0 .. kResampleRun) of output columns at `out` (a row of the NCHW output), of which
// the first `valid` exist: 16-byte stores when the run is whole and `out` aligned, else one by one.
template <typename T>
__device__ __forceinline__ void store_run(T* out, const float (&r)[kResampleRun], int valid) {
  constexpr int kPack = 16 / sizeof(T) < kResampleRun ? 16 / sizeof(T) : kResampleRun;
  if (valid >= kResampleRun && (reinterpret_cast<uintptr_t>(out) % (kPack * sizeof(T))) == 0) {
#pragma unroll
    for (int j = 0; j < kResampleRun; j += kPack) {
      float v[kPack];
#pragma unroll
      for (int i = 0; i < kPack; ++i) v[i] = r[j + i];
      store_f<kPack>(out + j, v);
    }
  } else {
    for (int j = 0; j < kResampleRun && j < valid; ++j) out[j] = from_f<T>(r[j]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) resample_kernel(const ResampleParams<T> p) {
  grid_dependency_sync();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= p.threads) return;
  const int runs = (p.out_w + kResampleRun - 1) / kResampleRun;
  const int ow0 = static_cast<int>(t % runs) * kResampleRun;
  const int64_t row = t / runs;  // (n * C + c) * H_out + oh
  const int oh = static_cast<int>(row % p.out_h);
  const int64_t nc = row / p.out_h;
  const int C = p.channels;
  const int c = static_cast<int>(nc % C);
  const T* x = p.x + (nc / C) * p.in_h * p.in_w * C + c;  // channel c of image n; pixel q at x[q * C]
  float r[kResampleRun];
  if (p.mode != kBilinear) {
    const bool exact = p.mode == kNearestExact;
    const T* in_row = x + static_cast<int64_t>(nearest_source(p.scale_h, oh, p.in_h, exact)) * p.in_w * C;
#pragma unroll
    for (int j = 0; j < kResampleRun; ++j) {
      const int ow = min(ow0 + j, p.out_w - 1);
      r[j] = to_f<T>(in_row[static_cast<int64_t>(nearest_source(p.scale_w, ow, p.in_w, exact)) * C]);
    }
  } else {
    const float h1r = linear_source(p.scale_h, oh, p.align_corners);
    const int h1 = static_cast<int>(h1r);
    const int h1p = (h1 < p.in_h - 1) ? 1 : 0;
    const float h1lambda = h1r - h1;
    const float h0lambda = 1.f - h1lambda;
    const T* row0 = x + static_cast<int64_t>(h1) * p.in_w * C;
    const T* row1 = row0 + static_cast<int64_t>(h1p) * p.in_w * C;
#pragma unroll
    for (int j = 0; j < kResampleRun; ++j) {
      const int ow = min(ow0 + j, p.out_w - 1);
      const float w1r = linear_source(p.scale_w, ow, p.align_corners);
      const int w1 = static_cast<int>(w1r);
      const int w1p = (w1 < p.in_w - 1) ? 1 : 0;
      const float w1lambda = w1r - w1;
      const float w0lambda = 1.f - w1lambda;
      const int64_t a = static_cast<int64_t>(w1) * C, b = a + static_cast<int64_t>(w1p) * C;
      r[j] = h0lambda * (w0lambda * to_f<T>(row0[a]) + w1lambda * to_f<T>(row0[b])) +
             h1lambda * (w0lambda * to_f<T>(row1[a]) + w1lambda * to_f<T>(row1[b]));
    }
  }
  store_run<T>(p.out + row * p.out_w + ow0, r, p.out_w - ow0);
}

// resample_rows_kernel: the same output, one block per output row (n, oh) for every channel. With
// LINEAR (bilinear) the block first blends the two input rows it reads ([W_in, C] each,
// channels_last order) into one float row in shared memory (W_in * C floats, dynamic: the vertical
// step of the interpolation, once per input element instead of once per output element); otherwise
// (nearest) it copies the one input row it reads (W_in * C elements of T). Then each thread
// computes runs of kResampleRun columns, channel by channel, from shared memory (bilinear: two
// columns of the blended row). The launcher uses it when the row fits in shared memory;
// resample_kernel (every neighbour read from global memory) otherwise. Bilinear sums in another
// order than resample_kernel and F.interpolate (vertical first), within float rounding.
template <typename T, bool LINEAR>
__global__ void __launch_bounds__(kThreads) resample_rows_kernel(const ResampleParams<T> p) {
  grid_dependency_sync();
  using Row = std::conditional_t<LINEAR, float, T>;
  extern __shared__ __align__(16) unsigned char resample_smem[];
  Row* row = reinterpret_cast<Row*>(resample_smem);
  const int oh = static_cast<int>(blockIdx.x % p.out_h);
  const int64_t n = blockIdx.x / p.out_h;
  const int C = p.channels;
  const int64_t row_elems = static_cast<int64_t>(p.in_w) * C;
  int h1, h1p = 0;
  float h1lambda = 0.f;
  if constexpr (LINEAR) {
    const float h1r = linear_source(p.scale_h, oh, p.align_corners);
    h1 = static_cast<int>(h1r);
    h1p = (h1 < p.in_h - 1) ? 1 : 0;
    h1lambda = h1r - h1;
  } else {
    h1 = nearest_source(p.scale_h, oh, p.in_h, p.mode == kNearestExact);
  }
  const float h0lambda = 1.f - h1lambda;
  const T* src = p.x + (n * p.in_h + h1) * row_elems;
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) {
    if constexpr (LINEAR) row[i] = h0lambda * to_f<T>(src[i]) + h1lambda * to_f<T>(src[h1p * row_elems + i]);
    else row[i] = src[i];
  }
  __syncthreads();
  const int runs = (p.out_w + kResampleRun - 1) / kResampleRun;
  for (int run = threadIdx.x; run < runs; run += blockDim.x) {
    const int ow0 = run * kResampleRun;
    int a[kResampleRun], b[kResampleRun];  // element offsets of the left / right neighbour (channel 0)
    float w1l[kResampleRun];
#pragma unroll
    for (int j = 0; j < kResampleRun; ++j) {
      const int ow = min(ow0 + j, p.out_w - 1);
      if constexpr (LINEAR) {
        const float w1r = linear_source(p.scale_w, ow, p.align_corners);
        const int w1 = static_cast<int>(w1r);
        a[j] = w1 * C;
        b[j] = a[j] + ((w1 < p.in_w - 1) ? C : 0);
        w1l[j] = w1r - w1;
      } else {
        a[j] = b[j] = nearest_source(p.scale_w, ow, p.in_w, p.mode == kNearestExact) * C;
        w1l[j] = 0.f;
      }
    }
    T* out = p.out + ((n * C) * p.out_h + oh) * p.out_w + ow0;
    for (int c = 0; c < C; ++c, out += static_cast<int64_t>(p.out_h) * p.out_w) {
      float r[kResampleRun];
#pragma unroll
      for (int j = 0; j < kResampleRun; ++j) {
        if constexpr (LINEAR) r[j] = (1.f - w1l[j]) * row[a[j] + c] + w1l[j] * row[b[j] + c];
        else r[j] = to_f<T>(row[a[j] + c]);
      }
      store_run<T>(out, r, p.out_w - ow0);
    }
  }
}

}  // namespace pw
}  // namespace deltaconv
