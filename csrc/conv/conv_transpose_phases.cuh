// A transposed convolution as one stride-1 convolution of all its phases (ATen-free).
//
// A transposed convolution of stride (sh, sw), dilation 1, whose kernel is a whole number of strides
// along each axis (KH = sh * JH, KW = sw * JW), splits into the sh * sw phases of its output. Output
// row o, with o + ph = sh * A + a (row phase a in [0, sh)), takes the kernel rows k = sh * j + a from
// the input rows A - j, j in [0, JH): every phase reads the same JH rows A - JH + 1 .. A. So the whole
// transposed convolution is one convolution of stride 1 and a JH x JW kernel with sh * sw * Cout
// output channels, phase (a, b)'s filters at channels [(a * sw + b) * Cout, + Cout) (phase_filters_kernel),
// followed by a depth-to-space of its output (phase_scatter_kernel): 2x2 at stride 2 a 1x1 convolution
// (the GEMM) with as many multiply-adds as the transposed convolution. The window can be taken larger,
// UH >= JH rows A - UH + 1 .. A with zeros in the first UH - JH: 4x4 at stride 2 runs its 2x2 window as
// 3x3, on the 3x3 tile kernel with 2.25 times the multiply-adds, faster than the gathered-taps kernel
// over 2x2 (conv_ops.cu: transposed_window).
//
// The convolution's mask is its window's (a superset of each phase's footprint when UH > JH), so the
// scatter derives each output pixel's flag from the input mask over its phase's JH x JW taps, the
// footprint of the transposed convolution, and copies the values of the active pixels only.
#pragma once

#include <cstdint>

#include "../kernels/grid_dependency.cuh"

namespace deltaconv {
namespace conv {

// The geometry of the combined convolution. Per axis: s stride, p the transposed convolution's
// padding, J = K / s taps per phase, U >= J the window, the combined output's size and its row of
// A = 0, offset (row A + offset holds output rows o = s * A - p + a; conv_ops.cu: transposed_axis).
struct PhaseGeom {
  int N, Cin, Cout, H, W, Ho, Wo;       // the transposed convolution's shapes (Cout per phase)
  int KH, KW, sh, sw, ph, pw;           // its kernel, stride, padding
  int JH, JW, UH, UW;                   // taps per phase, the window
  int Hc, Wc, offh, offw;               // the combined output's size and the offset of row / column A = 0
};

// combined[(a * sw + b) * Cout + co][uh][uw][ci] (the [C_out][KH][KW][C_in] layout of the tensor-core
// convolutions) from weight [Cin][Cout][KH][KW], both of a 16-bit dtype: the tap of phase (a, b) that
// window row uh (input row A - UH + 1 + uh) holds, j = UH - 1 - uh (kernel row sh * j + a), else 0.
__global__ void phase_filters_kernel(const uint16_t* __restrict__ weight, uint16_t* __restrict__ combined,
                                     PhaseGeom g) {
  grid_dependency_sync();
  const int64_t total = (int64_t)g.sh * g.sw * g.Cout * g.UH * g.UW * g.Cin;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = t;
    const int ci = (int)(r % g.Cin);
    r /= g.Cin;
    const int uw = (int)(r % g.UW);
    r /= g.UW;
    const int uh = (int)(r % g.UH);
    r /= g.UH;
    const int co = (int)(r % g.Cout);
    const int phase = (int)(r / g.Cout);
    const int a = phase / g.sw, b = phase % g.sw;
    const int jh = g.UH - 1 - uh, jw = g.UW - 1 - uw;
    uint16_t v = 0;
    if (jh < g.JH && jw < g.JW) {
      const int kh = g.sh * jh + a, kw = g.sw * jw + b;
      v = weight[(((int64_t)ci * g.Cout + co) * g.KH + kh) * g.KW + kw];
    }
    combined[t] = v;
  }
}

// Per output pixel (n, oy, ox), oy + ph = sh * A + a and ox + pw = sw * B + b (phase (a, b)): its flag,
// key[n] or an active input pixel among its phase's taps (rows A - j, j < JH, columns alike) in mask
// [N, 1, H, W]; when set, its Cout values from src [N, sh * sw * Cout, Hc, Wc] (channels_last) at
// (A + offh, B + offw), channels from (a * sw + b) * Cout on, into y [N, Cout, Ho, Wo] (channels_last);
// `vecs`: 16-byte vectors per pixel of y. A warp per 32 consecutive output pixels, grid-stride: each
// lane derives one pixel's flag, then the warp copies the active pixels' vectors together (32 at a
// time, in the order of y), so a frame with few changes reads little more than the mask. y's inactive
// pixels stay unwritten, as every convolution leaves them.
constexpr int kScatterThreads = 256;

__device__ __forceinline__ bool phase_pixel_on(const bool* __restrict__ mask, const bool* __restrict__ key,
                                               const PhaseGeom& g, int64_t pix) {
  const int ox = (int)(pix % g.Wo), oy = (int)(pix / g.Wo % g.Ho);
  const int64_t n = pix / ((int64_t)g.Wo * g.Ho);
  if (key != nullptr && key[n]) return true;
  const int iy0 = (oy + g.ph) / g.sh, ix0 = (ox + g.pw) / g.sw;  // tap 0: A, B
  for (int jh = 0; jh < g.JH; ++jh) {
    const int iy = iy0 - jh;
    if (iy < 0 || iy >= g.H) continue;
    const bool* row = mask + (n * g.H + iy) * g.W;
    for (int jw = 0; jw < g.JW; ++jw) {
      const int ix = ix0 - jw;
      if (ix >= 0 && ix < g.W && row[ix]) return true;
    }
  }
  return false;
}

// Where output pixel `pix`'s values start in src, in 16-byte vectors.
__device__ __forceinline__ int64_t phase_source(const PhaseGeom& g, int64_t pix, int vecs) {
  const int ox = (int)(pix % g.Wo), oy = (int)(pix / g.Wo % g.Ho);
  const int64_t n = pix / ((int64_t)g.Wo * g.Ho);
  const int64_t at = (n * g.Hc + (oy + g.ph) / g.sh + g.offh) * g.Wc + (ox + g.pw) / g.sw + g.offw;
  return (at * g.sh * g.sw + ((oy + g.ph) % g.sh) * g.sw + (ox + g.pw) % g.sw) * vecs;
}

__global__ void __launch_bounds__(kScatterThreads)
    phase_scatter_kernel(const uint4* __restrict__ src, const bool* __restrict__ mask, const bool* __restrict__ key,
                         uint4* __restrict__ y, bool* __restrict__ mask_out, PhaseGeom g, int vecs) {
  grid_dependency_sync();
  __shared__ int listed[kScatterThreads];  // per warp: the lanes of its active pixels, in order
  const int lane = threadIdx.x & 31;
  int* list = listed + (threadIdx.x & ~31);
  const int64_t pixels = (int64_t)g.N * g.Ho * g.Wo;
  const int64_t stride = (int64_t)gridDim.x * kScatterThreads;
  for (int64_t base = (int64_t)blockIdx.x * kScatterThreads + (threadIdx.x & ~31); base < pixels; base += stride) {
    const int64_t pix = base + lane;
    const bool on = pix < pixels && phase_pixel_on(mask, key, g, pix);
    if (pix < pixels) mask_out[pix] = on;
    const unsigned active = __ballot_sync(0xffffffffu, on);
    if (active == 0) continue;
    const int64_t from = on ? phase_source(g, pix, vecs) : 0;  // this lane's pixel, shuffled to the copiers
    if (on) list[__popc(active & ((1u << lane) - 1))] = lane;
    __syncwarp();
    const int total = __popc(active) * vecs;
    for (int e0 = 0; e0 < total; e0 += 32) {  // uniform trip count: every lane takes part in the shuffle
      const int e = min(e0 + lane, total - 1), k = e / vecs, v = e - k * vecs;
      const int owner = active == 0xffffffffu ? k : list[k];
      const int64_t at = __shfl_sync(0xffffffffu, from, owner);
      if (e0 + lane < total) y[(base + owner) * vecs + v] = src[at + v];
    }
    __syncwarp();
  }
}

}  // namespace conv
}  // namespace deltaconv
