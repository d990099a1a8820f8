// Pooling and linear kernels of the delta runtime (ATen-free). Semantics: deltaconv/backends/reference.py.
//
//   maxpool_acc_kernel     acc += delta on active input pixels (first of two launches: the pooling
//                          pass reads neighbours' acc, so the update must be complete before it;
//                          max_pool2d_values has no accumulator and skips it)
//   maxpool_out_kernel     a warp per output pixel: region = window holds an active pixel;
//                          y = max(src) over the window (src: acc, or the input's whole values); send y - sent when its size (max or rms
//                          over the channels, pw::PendingSize) > thr (or key): pw::send_element
//                          (tf32, float32: the changes rounded to TF32, as the activation sends them)
//   maxpool_out_cl_kernel  the same for channels_last acc and sent with C <= 512: a group of C / VEC
//                          lanes (at most 32) per output pixel, 16-byte loads of the pooled map where C
//                          allows (VEC = 4 float32 acc or 8 whole float16 / bfloat16 values), else packs
//                          of 4, 2 or 1 channels; the window maxima kept in registers from the send
//                          decision to the send
//   avgpool_kernel         one thread per output element; mask = window holds an active pixel
//   adaptive_avgpool_kernel one block per (output pixel, chunk of 256 window pixels, 256 channels):
//     lists the chunk's active pixels, sums them per channel; adaptive_avgpool_finish_kernel one
//     block per (output pixel, 32 channels) then sums the active chunks in order
//   linear_kernel          one warp per output element of an active (or key) row
#pragma once

#include <math.h>

#include "../kernels/send.cuh"
#include "conv_common.cuh"

namespace deltaconv {
namespace conv {

struct PoolGeom {
  int N, C, H, W, Ho, Wo;
  int KH, KW, sh, sw, ph, pw, dh, dw;
};

// Strides (in elements) of a 4-D float32 state tensor, any memory format.
struct Strides4 {
  long long n, c, h, w;
};

// Persistent warps (pw::for_each_active_pixel): a warp per active input pixel, its 32 lanes
// striding over the channels.
template <typename T>
__global__ void __launch_bounds__(256)
    maxpool_acc_kernel(const T* __restrict__ x, const bool* __restrict__ mask, float* __restrict__ acc, Strides4 as,
                       int C, int H, int W, long long pixels) {
  grid_dependency_sync();
  const auto settle = [&](int64_t pixel) { return mask[pixel]; };
  pw::for_each_active_pixel(pixels, 5, settle, [&](const pw::PixelGroup& g) {
    const int w = (int)(g.pixel % W);
    const long long t = g.pixel / W;
    const int h = (int)(t % H);
    const long long n = t / H;
    float* ap = acc + n * as.n + h * as.h + w * as.w;
    const T* xp = x + g.pixel * C;
    for (int c = g.lane; c < C; c += 32) ap[c * as.c] += to_f(xp[c]);
  });
}

// Calls visit(ih, iw) for each input pixel of the pooling window whose top-left tap is (hs, ws) and
// that lies inside the map, row by row; stops at the first call that returns true and says so.
template <typename Visit>
__device__ __forceinline__ bool for_each_window_pixel(const PoolGeom& g, int hs, int ws, Visit&& visit) {
  for (int ky = 0; ky < g.KH; ++ky) {
    const int ih = hs + ky * g.dh;
    if (ih < 0 || ih >= g.H) continue;
    for (int kx = 0; kx < g.KW; ++kx) {
      const int iw = ws + kx * g.dw;
      if (iw >= 0 && iw < g.W && visit(ih, iw)) return true;
    }
  }
  return false;
}

// NaN-propagating running maximum (as torch's max pooling)
__device__ __forceinline__ void max_into(float& y, float v) {
  if (v > y || isnan(v)) y = v;
}

// The maximum of channel c of `src` (float32 acc, or T whole values; strides `as`) over the window.
template <typename S>
__device__ __forceinline__ float maxpool_window(const S* __restrict__ src, const Strides4& as, const PoolGeom& g,
                                                long long n, int c, int hs, int ws) {
  float y = -INFINITY;
  const S* ap = src + n * as.n + c * as.c;
  for_each_window_pixel(g, hs, ws, [&](int ih, int iw) {
    max_into(y, to_f(ap[ih * as.h + iw * as.w]));
    return false;
  });
  return y;
}

// The settle step of the max pooling output kernels: whether output pixel `pix`'s window holds an
// active input pixel (else its mask_out is written false here).
__device__ __forceinline__ bool maxpool_window_active(const bool* __restrict__ mask, bool* __restrict__ mask_out,
                                                      const PoolGeom& g, int64_t pix) {
  const int ow = (int)(pix % g.Wo);
  const long long t = pix / g.Wo;
  const int oh = (int)(t % g.Ho);
  const bool* mn = mask + (t / g.Ho) * g.H * g.W;
  const int hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
  if (for_each_window_pixel(g, hs, ws, [&](int ih, int iw) { return mn[ih * g.W + iw]; })) return true;
  mask_out[pix] = false;
  return false;
}

// Persistent warps (pw::for_each_active_pixel): one lane tests an output pixel's window for an
// active input pixel; a warp per output pixel whose window has one, its 32 lanes striding over the
// channels. S: the pooled source's type, float (acc, the accumulated input: max_pool2d) or T (the
// input's whole values, max_pool2d_values).
template <typename T, typename S = float>
__global__ void __launch_bounds__(256)
    maxpool_out_kernel(const bool* __restrict__ mask, const S* __restrict__ acc, Strides4 as,
                       T* __restrict__ sent, Strides4 ss, const bool* __restrict__ key, T* __restrict__ y,
                       bool* __restrict__ mask_out, PoolGeom g, float threshold, float rms_limit,
                       long long total_pix, bool tf32) {
  grid_dependency_sync();
  const auto settle = [&](int64_t pix) { return maxpool_window_active(mask, mask_out, g, pix); };
  pw::for_each_active_pixel(total_pix, 5, settle, [&](const pw::PixelGroup& warp) {
    const long long pix = warp.pixel;
    const int lane = warp.lane;
    const int ow = (int)(pix % g.Wo);
    const long long t = pix / g.Wo;
    const int oh = (int)(t % g.Ho);
    const long long n = t / g.Ho;
    const int hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
    const long long sbase = n * ss.n + oh * ss.h + ow * ss.w;
    pw::PendingSize size;
    for (int c = lane; c < g.C; c += 32)
      size.add(pw::pending_change<T>(maxpool_window(acc, as, g, n, c, hs, ws), to_f(sent[sbase + c * ss.c])),
               threshold);
    const bool send = pw::group_exceeds(warp, size, rms_limit) || key_of(key, (int)n);
    if (lane == 0) mask_out[pix] = send;
    if (!send) return;
    T* yp = y + pix * g.C;
    for (int c = lane; c < g.C; c += 32) {
      T* sp = sent + sbase + c * ss.c;
      float s = to_f(*sp);
      yp[c] = from_f<T>(pw::send_element<T>(maxpool_window(acc, as, g, n, c, hs, ws), s, tf32));
      *sp = from_f<T>(s);
    }
  });
}

constexpr int kMaxpoolMaxChannels = 512;  // the most channels maxpool_out_cl_kernel takes (its registers)
// Channels per lane and load of maxpool_out_cl_kernel's pooled map: one 16-byte load (4 float32 acc
// elements, 8 float16 / bfloat16 whole values).
template <typename S>
constexpr int maxpool_vec() {
  return 16 / (int)sizeof(S);
}

// acc [N, C, H, W] (S: float32, or T whole values as in maxpool_out_kernel) and sent [N, C, Ho, Wo]
// channels_last (C % VEC == 0, C <= kMaxpoolMaxChannels, 16-byte aligned); y [N, C, Ho, Wo] channels_last.
// VEC: channels per lane and load, maxpool_vec<S>() (a 16-byte load), else the largest of 4, 2, 1 that divides
// C. log2_lanes: lanes per output pixel, log2_lanes_for(C, VEC) (C / VEC, or C / 4 for VEC 1, rounded up to a
// power of two, at most 32), so that C <= kChunks * 32 * VEC lanes' chunks. Same results as maxpool_out_kernel
// (the same window order and NaN rule).
template <typename T, typename S = float, int VEC = maxpool_vec<S>()>
__global__ void __launch_bounds__(256)
    maxpool_out_cl_kernel(const bool* __restrict__ mask, const S* __restrict__ acc, T* __restrict__ sent,
                          const bool* __restrict__ key, T* __restrict__ y, bool* __restrict__ mask_out, PoolGeom g,
                          float threshold, float rms_limit, long long total_pix, int log2_lanes, bool tf32) {
  grid_dependency_sync();
  constexpr int kChunks = kMaxpoolMaxChannels / (32 * VEC);  // channel chunks of 32 lanes x VEC a lane holds
  const auto settle = [&](int64_t pix) { return maxpool_window_active(mask, mask_out, g, pix); };
  pw::for_each_active_pixel(total_pix, log2_lanes, settle, [&](const pw::PixelGroup& grp) {
    const long long pix = grp.pixel;
    const int ow = (int)(pix % g.Wo);
    const long long t = pix / g.Wo;
    const int oh = (int)(t % g.Ho);
    const long long n = t / g.Ho;
    const int hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
    const S* an = acc + n * g.H * g.W * (long long)g.C;
    const int step = grp.lanes * VEC;
    float mx[kChunks][VEC];
    pw::PendingSize size;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = grp.lane * VEC + k * step;
      if (c >= g.C) break;
      pw::fill(mx[k], -INFINITY);
      for_each_window_pixel(g, hs, ws, [&](int ih, int iw) {
        float v[VEC];
        pw::load_f<VEC>(an + ((long long)ih * g.W + iw) * g.C + c, v);
#pragma unroll
        for (int i = 0; i < VEC; ++i) max_into(mx[k][i], v[i]);
        return false;
      });
      float s[VEC];
      pw::load_f<VEC>(sent + pix * g.C + c, s);
#pragma unroll
      for (int i = 0; i < VEC; ++i) size.add(pw::pending_change<T>(mx[k][i], s[i]), threshold);
    }
    const bool send = pw::group_exceeds(grp, size, rms_limit) || key_of(key, (int)n);
    if (grp.lane == 0) mask_out[pix] = send;
    if (!send) return;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int c = grp.lane * VEC + k * step;
      if (c >= g.C) break;
      float s[VEC], out[VEC];
      pw::load_f<VEC>(sent + pix * g.C + c, s);
#pragma unroll
      for (int i = 0; i < VEC; ++i) out[i] = pw::send_element<T>(mx[k][i], s[i], tf32);
      pw::store_f<VEC>(y + pix * g.C + c, out);
      pw::store_f<VEC>(sent + pix * g.C + c, s);
    }
  });
}

// has_divisor: divisor_override given (non-zero; a negative one gives an empty footprint, as in
// the reference where the pooled mask is then <= 0).
template <typename T>
__global__ void avgpool_kernel(const T* __restrict__ x, const bool* __restrict__ mask, T* __restrict__ y,
                               bool* __restrict__ mask_out, PoolGeom g, bool count_include_pad, int divisor_override,
                               bool has_divisor, long long total) {
  grid_dependency_sync();
  const int cs = max(g.C, 1);  // channel slots: one even when C == 0, for the mask
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const int c = (int)(i % cs);
    const long long pix = i / cs;
    const int ow = (int)(pix % g.Wo);
    const long long t = pix / g.Wo;
    const int oh = (int)(t % g.Ho);
    const long long n = t / g.Ho;
    int hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
    int he = min(hs + g.KH, g.H + g.ph), we = min(ws + g.KW, g.W + g.pw);
    const int pool_size = (he - hs) * (we - ws);
    hs = max(hs, 0);
    ws = max(ws, 0);
    he = min(he, g.H);
    we = min(we, g.W);
    bool any = false;
    float sum = 0.f;
    const long long base = n * g.H * g.W;
    for (int ih = hs; ih < he; ++ih)
      for (int iw = ws; iw < we; ++iw) {
        const long long p = base + (long long)ih * g.W + iw;
        if (mask[p]) {
          any = true;
          if (c < g.C) sum += to_f(x[p * g.C + c]);
        }
      }
    const int div = has_divisor ? divisor_override : count_include_pad ? pool_size : (he - hs) * (we - ws);
    const bool act = any && div > 0;
    if (c == 0) mask_out[pix] = act;
    if (act && c < g.C) y[pix * g.C + c] = from_f<T>(sum / (float)div);
  }
}

__device__ __forceinline__ int adaptive_start(int o, int out, int in) {
  return (int)(((long long)o * in) / out);
}
__device__ __forceinline__ int adaptive_end(int o, int out, int in) {
  return (int)(((long long)(o + 1) * in + out - 1) / out);
}

// Adaptive average pooling in two launches, so that a large window (global pooling of a whole
// feature map) spreads over many blocks and the sum stays deterministic (each sum in one fixed
// order, whatever the timing):
//   adaptive_avgpool_kernel        grid (N * Ho * Wo, chunks, ceil(C / kPoolGroup)); block 256
//                                  (kPoolChunk). Block (pix, z, cg) takes the window's pixels
//                                  [z * kPoolChunk, (z + 1) * kPoolChunk) (row-major in the window),
//                                  one per thread, and lists the active ones in shared memory in
//                                  window order (cg == 0 writes any[z][pix] = whether there is one);
//                                  with none that is all it does. Otherwise its threads, as
//                                  2^log2_lanes lanes of V channels x the rest as rows (row r: the
//                                  r-th, (r + rows)-th, ... listed pixel), sum the listed pixels'
//                                  values of channel group cg ([cg * kPoolGroup, + kPoolGroup)), the
//                                  rows then added in order, into part[z][pix][c] (float32).
//   adaptive_avgpool_finish_kernel grid (N * Ho * Wo, ceil(C / 32)); block 32 channels x ROWS
//                                  rows (8, or 32 for windows of many chunks): row r adds part[z]
//                                  over the active chunks z = r, r + ROWS, ... of the window, the
//                                  rows then added in order; mask = some chunk active;
//                                  y = sum / window size.
// With nothing active, the first launch reads the mask once per channel group and the second the
// chunks' flags.
constexpr int kPoolChunk = 256;
constexpr int kPoolGroup = 256;

__device__ __forceinline__ void adaptive_window(const PoolGeom& g, long long pix, long long& n, int& hs, int& ws,
                                                int& wl, int& cnt) {
  const int ow = (int)(pix % g.Wo);
  const long long t = pix / g.Wo;
  const int oh = (int)(t % g.Ho);
  n = t / g.Ho;
  hs = adaptive_start(oh, g.Ho, g.H);
  ws = adaptive_start(ow, g.Wo, g.W);
  wl = adaptive_end(ow, g.Wo, g.W) - ws;
  cnt = (adaptive_end(oh, g.Ho, g.H) - hs) * wl;
}

// V: channels per lane (16-byte loads: C % V == 0 and x 16-byte aligned; else 1). 2^log2_lanes:
// the power of two at or above min(C, kPoolGroup) / V.
template <typename T, int V>
__global__ void __launch_bounds__(kPoolChunk)
    adaptive_avgpool_kernel(const T* __restrict__ x, const bool* __restrict__ mask, float* __restrict__ part,
                            bool* __restrict__ any_out, PoolGeom g, int log2_lanes) {
  grid_dependency_sync();
  static_assert(kPoolGroup % V == 0, "a lane's channels must not straddle two channel groups");
  constexpr int kWarps = kPoolChunk / 32;
  __shared__ int listed[kPoolChunk];  // active pixels' offsets in the image, in window order
  __shared__ int warp_active[kWarps];
  __shared__ float partial[kPoolChunk * V];
  const long long pix = blockIdx.x;
  const long long npix = gridDim.x;
  long long n;
  int hs, ws, wl, cnt;
  adaptive_window(g, pix, n, hs, ws, wl, cnt);
  const int q = blockIdx.y * kPoolChunk + threadIdx.x;
  const long long image = n * g.H * g.W;
  int off = 0;
  bool act = false;
  if (q < cnt) {
    off = (hs + q / wl) * g.W + ws + q % wl;
    act = mask[image + off];
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned ballot = __ballot_sync(0xffffffffu, act);
  if (lane == 0) warp_active[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, listed_count = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int k = warp_active[w];
    before += w < warp ? k : 0;
    listed_count += k;
  }
  if (blockIdx.z == 0 && threadIdx.x == 0) any_out[blockIdx.y * npix + pix] = listed_count > 0;
  if (listed_count == 0) return;  // uniform over the block
  if (act) listed[before + __popc(ballot & ((1u << lane) - 1u))] = off;
  __syncthreads();
  const int lanes = 1 << log2_lanes, rows = kPoolChunk >> log2_lanes;
  const int cl = threadIdx.x & (lanes - 1), r = threadIdx.x >> log2_lanes;
  const int c = blockIdx.z * kPoolGroup + cl * V;  // cl * V < kPoolGroup: lanes <= kPoolGroup / V
  float sum[V];
  pw::fill(sum, 0.f);
  if (c < g.C) {
    const T* xc = x + image * g.C + c;
#pragma unroll 4
    for (int k = r; k < listed_count; k += rows) {
      float v[V];
      pw::load_f<V>(xc + (long long)listed[k] * g.C, v);
#pragma unroll
      for (int i = 0; i < V; ++i) sum[i] += v[i];
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) partial[threadIdx.x * V + i] = sum[i];
  __syncthreads();
  if (r == 0 && c < g.C) {
    float* out = part + (blockIdx.y * npix + pix) * g.C + c;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      float t = 0.f;
      for (int k = 0; k < rows; ++k) t += partial[(k * lanes + cl) * V + i];
      out[i] = t;
    }
  }
}

template <typename T, int ROWS>
__global__ void __launch_bounds__(32 * ROWS)
    adaptive_avgpool_finish_kernel(const float* __restrict__ part, const bool* __restrict__ any_in,
                                   T* __restrict__ y, bool* __restrict__ mask_out, PoolGeom g) {
  grid_dependency_sync();
  __shared__ float partial[ROWS][33];
  const long long pix = blockIdx.x;
  const long long npix = gridDim.x;
  const int cl = threadIdx.x % 32, r = threadIdx.x / 32;
  const int c = blockIdx.y * 32 + cl;
  long long n;
  int hs, ws, wl, cnt;
  adaptive_window(g, pix, n, hs, ws, wl, cnt);
  const int used = (cnt + kPoolChunk - 1) / kPoolChunk;  // chunks of this window
  float sum = 0.f;
  bool any = false;
  for (int z = r; z < used; z += ROWS) {
    if (any_in[z * npix + pix]) {
      any = true;
      if (c < g.C) sum += part[(z * npix + pix) * g.C + c];
    }
  }
  partial[r][cl] = sum;
  const bool act = __syncthreads_or(any);
  if (blockIdx.y == 0 && threadIdx.x == 0) mask_out[pix] = act;
  if (!act || r != 0 || c >= g.C) return;
  float t = 0.f;
#pragma unroll
  for (int k = 0; k < ROWS; ++k) t += partial[k][cl];
  y[pix * g.C + c] = from_f<T>(t / (float)cnt);
}

// One warp per (row n, output feature m); x [N, K], w [M, K], y [N, M]; mask / key per row.
template <typename T>
__global__ void __launch_bounds__(256)
    linear_kernel(const T* __restrict__ x, const bool* __restrict__ mask, const T* __restrict__ w,
                  const T* __restrict__ bias, const bool* __restrict__ key, T* __restrict__ y,
                  bool* __restrict__ mask_out, int N, int K, int M) {
  grid_dependency_sync();
  const long long wid = blockIdx.x * (long long)(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (wid >= (long long)N * M) return;
  const int n = (int)(wid / M);
  const int m = (int)(wid % M);
  const bool act = mask[n];
  const bool kn = key_of(key, n);
  if (m == 0 && lane == 0) mask_out[n] = act || kn;
  if (!act && !kn) return;
  float sum = 0.f;
  if (act) {
    const T* xr = x + (size_t)n * K;
    const T* wr = w + (size_t)m * K;
    for (int k = lane; k < K; k += 32) sum = fmaf(to_f(xr[k]), to_f(wr[k]), sum);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  if (lane == 0) {
    if (kn && bias != nullptr) sum += to_f(bias[m]);
    y[(size_t)n * M + m] = from_f<T>(sum);
  }
}

}  // namespace conv
}  // namespace deltaconv
