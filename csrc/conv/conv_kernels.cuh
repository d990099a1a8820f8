// Compute kernels of sparse delta convolution (CUDA cores, fp32 accumulation). Each consumes the
// work list written by conv_tile_mask_kernel / conv1x1_mask_kernel (see conv_common.cuh).
//
//   conv_tile_kernel<T, KH, KW>  dense conv of one 8x8 output tile x 32 output channels of one
//                                group; input footprint (with halo) and weights staged in shared
//                                memory per chunk of input channels. KH = KW = 0: runtime size.
//   conv1x1_kernel<T>            1x1 conv: a GEMM over groups of 64 listed active pixels.
//   dwconv_kernel<T, KS>         depthwise (groups == Cin == Cout): 8x8 tile x 32 channels.
//   dwconv_vec_kernel<T,KS,S,D,NV,PPT,TMA> depthwise 3x3 / 5x5, stride 1 / 2, dilation 1 / 2, and 7x7,
//                                16-byte vectors, PPT output pixels per thread; TMA: the halo copied
//                                by the copy engine (Hopper).
//   conv_direct_kernel<T, TR>    smem-free fallback for any geometry and the transposed conv.
#pragma once

#include "conv_common.cuh"
#include "tma.cuh"

namespace deltaconv {
namespace conv {

constexpr int CONV_THREADS = 256;
constexpr int CONV_COB = 32;  // output channels per block (tile and 1x1 kernels)

// Stride between the channel planes of the staged input: odd, so that the stores of consecutive
// channels hit different banks.
__host__ __device__ inline int conv_tile_plane(int fhw) { return fhw | 1; }

// Shared-memory floats of conv_tile_kernel for `cib` input channels per chunk.
__host__ __device__ inline int conv_tile_in_floats(const ConvGeom& g, int cib) {
  const int fh = (TILE_H - 1) * g.sh + (g.KH - 1) * g.dh + 1;
  const int fw = (TILE_W - 1) * g.sw + (g.KW - 1) * g.dw + 1;
  return ((cib * conv_tile_plane(fh * fw)) + 3) & ~3;  // keep the weight block 16-byte aligned
}
__host__ __device__ inline int conv_tile_smem_floats(const ConvGeom& g, int cib) {
  return conv_tile_in_floats(g, cib) + cib * g.KH * g.KW * CONV_COB;
}

// Thread layout shared by the tile and 1x1 kernels: thread t computes output channels
// co0 + (t % 8) * 4 + [0, 4) for pixels (t / 8) and (t / 8) + 32 of the 64-pixel item.
template <typename T, int KH_, int KW_>
__global__ void __launch_bounds__(CONV_THREADS)
    conv_tile_kernel(const T* __restrict__ x, const bool* __restrict__ mask, const T* __restrict__ w,
                     const T* __restrict__ bias, const bool* __restrict__ key, T* __restrict__ y,
                     const int* __restrict__ list, const int* __restrict__ count_in, ConvGeom g, int cib) {
  grid_dependency_sync();
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int KH = KH_ > 0 ? KH_ : g.KH;
  const int KW = KW_ > 0 ? KW_ : g.KW;
  const int KK = KH * KW;
  const int FH = (TILE_H - 1) * g.sh + (KH - 1) * g.dh + 1;
  const int FW = (TILE_W - 1) * g.sw + (KW - 1) * g.dw + 1;
  const int FHW = FH * FW;
  const int PLANE = conv_tile_plane(FHW);
  float* in_s = smem;                                // [cib][PLANE]
  float* w_s = smem + conv_tile_in_floats(g, cib);  // [cib][KK][CONV_COB]

  const int cob_per_group = (g.cout_g + CONV_COB - 1) / CONV_COB;
  const int grp = blockIdx.y / cob_per_group;
  const int co0 = (blockIdx.y % cob_per_group) * CONV_COB;  // within the group
  const int tid = threadIdx.x;
  const int cg = tid % 8;
  const int pg = tid / 8;
  const int count = *count_in;

  int pbase[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int p = pg + 32 * j;
    pbase[j] = (p / TILE_W) * g.sh * FW + (p % TILE_W) * g.sw;
  }

  for (int item = blockIdx.x; item < count; item += gridDim.x) {
    const int tile = list[1 + item];
    const TileAt at = tile_at(tile, g);
    const int n = at.n, oh0 = at.oh0, ow0 = at.ow0;
    const int ih0 = oh0 * g.sh - g.ph, iw0 = ow0 * g.sw - g.pw;
    const bool* mn = mask + (size_t)n * g.H * g.W;

    float acc[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;

    for (int c0 = 0; c0 < g.cin_g; c0 += cib) {
      const int cc = min(cib, g.cin_g - c0);
      __syncthreads();  // previous chunk / item done with the smem
      const int cbase = grp * g.cin_g + c0;
      for (int idx = tid; idx < FHW * cc; idx += CONV_THREADS) {
        const int c = idx % cc;
        const int q = idx / cc;
        const int ih = ih0 + q / FW, iw = iw0 + q % FW;
        float v = 0.f;
        if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) {
          const int pix = ih * g.W + iw;
          if (mn[pix]) v = to_f(x[(((size_t)n * g.H * g.W) + pix) * g.Cin + cbase + c]);
        }
        in_s[c * PLANE + q] = v;
      }
      for (int idx = tid; idx < cc * KK * CONV_COB; idx += CONV_THREADS) {
        const int co = idx % CONV_COB;
        const int q = idx / CONV_COB;
        const int k = q % KK;
        const int c = q / KK;
        float v = 0.f;
        if (co0 + co < g.cout_g) v = to_f(w[((size_t)(grp * g.cout_g + co0 + co) * g.cin_g + c0 + c) * KK + k]);
        w_s[idx] = v;
      }
      __syncthreads();
      for (int c = 0; c < cc; ++c) {
        const float* ic = in_s + c * PLANE;
        const float* wc = w_s + c * KK * CONV_COB + cg * 4;
#pragma unroll
        for (int ky = 0; ky < KH; ++ky) {
#pragma unroll
          for (int kx = 0; kx < KW; ++kx) {
            const float4 wv = *reinterpret_cast<const float4*>(wc + (ky * KW + kx) * CONV_COB);
            const int off = ky * g.dh * FW + kx * g.dw;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const float a = ic[pbase[j] + off];
              acc[j][0] = fmaf(a, wv.x, acc[j][0]);
              acc[j][1] = fmaf(a, wv.y, acc[j][1]);
              acc[j][2] = fmaf(a, wv.z, acc[j][2]);
              acc[j][3] = fmaf(a, wv.w, acc[j][3]);
            }
          }
        }
      }
    }

    const bool kn = key_of(key, n);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int p = pg + 32 * j;
      const int oh = oh0 + p / TILE_W, ow = ow0 + p % TILE_W;
      if (oh >= g.Ho || ow >= g.Wo) continue;
      T* yp = y + (((size_t)n * g.Ho + oh) * g.Wo + ow) * g.Cout + grp * g.cout_g;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int co = co0 + cg * 4 + i;
        if (co >= g.cout_g) continue;
        float v = acc[j][i];
        if (kn && bias != nullptr) v += to_f(bias[grp * g.cout_g + co]);
        yp[co] = from_f<T>(v);
      }
    }
  }
}

constexpr int C1_CIB = 32;  // input channels per chunk of the 1x1 kernel
constexpr int C1_PLANE = TILE_PIX + 1;  // odd: conflict-free stores of consecutive channels

template <typename T>
__global__ void __launch_bounds__(CONV_THREADS)
    conv1x1_kernel(const T* __restrict__ x, const bool* __restrict__ mask, const T* __restrict__ w,
                   const T* __restrict__ bias, const bool* __restrict__ key, T* __restrict__ y,
                   const int* __restrict__ list, const int* __restrict__ count_in, ConvGeom g) {
  grid_dependency_sync();
  __shared__ __align__(16) float in_s[C1_CIB * C1_PLANE];  // [c][pixel]
  __shared__ __align__(16) float w_s[C1_CIB * CONV_COB];   // [c][co]
  __shared__ long long in_off[TILE_PIX];                   // element offset of the input pixel, -1: zero
  __shared__ long long out_off[TILE_PIX];                  // element offset of the output pixel, -1: none
  __shared__ bool out_key[TILE_PIX];

  const int cob_per_group = (g.cout_g + CONV_COB - 1) / CONV_COB;
  const int grp = blockIdx.y / cob_per_group;
  const int co0 = (blockIdx.y % cob_per_group) * CONV_COB;
  const int tid = threadIdx.x;
  const int cg = tid % 8;
  const int pg = tid / 8;
  const int count = *count_in;
  const int items = (count + TILE_PIX - 1) / TILE_PIX;

  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    __syncthreads();  // previous item done with in_off / out_off
    if (tid < TILE_PIX) {
      const int l = item * TILE_PIX + tid;
      long long io = -1, oo = -1;
      bool kn = false;
      if (l < count) {
        const int pix = list[1 + l];
        const int ow = pix % g.Wo;
        const int t = pix / g.Wo;
        const int oh = t % g.Ho;
        const int n = t / g.Ho;
        const int ih = oh * g.sh - g.ph, iw = ow * g.sw - g.pw;
        oo = (long long)pix * g.Cout + grp * g.cout_g;
        kn = key_of(key, n);
        if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) {
          const long long ip = ((long long)n * g.H + ih) * g.W + iw;
          if (mask[ip]) io = ip * g.Cin + grp * g.cin_g;
        }
      }
      in_off[tid] = io;
      out_off[tid] = oo;
      out_key[tid] = kn;
    }
    __syncthreads();

    float acc[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;

    for (int c0 = 0; c0 < g.cin_g; c0 += C1_CIB) {
      const int cc = min(C1_CIB, g.cin_g - c0);
      __syncthreads();
      for (int idx = tid; idx < TILE_PIX * cc; idx += CONV_THREADS) {
        const int c = idx % cc;
        const int p = idx / cc;
        const long long io = in_off[p];
        in_s[c * C1_PLANE + p] = io >= 0 ? to_f(x[io + c0 + c]) : 0.f;
      }
      for (int idx = tid; idx < cc * CONV_COB; idx += CONV_THREADS) {
        const int co = idx % CONV_COB;
        const int c = idx / CONV_COB;
        w_s[idx] = co0 + co < g.cout_g ? to_f(w[(size_t)(grp * g.cout_g + co0 + co) * g.cin_g + c0 + c]) : 0.f;
      }
      __syncthreads();
#pragma unroll 4
      for (int c = 0; c < cc; ++c) {
        const float4 wv = *reinterpret_cast<const float4*>(w_s + c * CONV_COB + cg * 4);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float a = in_s[c * C1_PLANE + pg + 32 * j];
          acc[j][0] = fmaf(a, wv.x, acc[j][0]);
          acc[j][1] = fmaf(a, wv.y, acc[j][1]);
          acc[j][2] = fmaf(a, wv.z, acc[j][2]);
          acc[j][3] = fmaf(a, wv.w, acc[j][3]);
        }
      }
    }

#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int p = pg + 32 * j;
      const long long oo = out_off[p];
      if (oo < 0) continue;
      const bool kn = out_key[p];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int co = co0 + cg * 4 + i;
        if (co >= g.cout_g) continue;
        float v = acc[j][i];
        if (kn && bias != nullptr) v += to_f(bias[grp * g.cout_g + co]);
        y[oo + co] = from_f<T>(v);
      }
    }
  }
}

// Depthwise: 256 threads = 32 channels x 8 output rows; each thread computes the 8 pixels of its
// row of the 8x8 tile for its channel. KS = 0: runtime KH x KW.
constexpr int DW_CB = 32;
__host__ __device__ inline int dwconv_smem_floats(const ConvGeom& g) {
  const int fh = (TILE_H - 1) * g.sh + (g.KH - 1) * g.dh + 1;
  const int fw = (TILE_W - 1) * g.sw + (g.KW - 1) * g.dw + 1;
  return fh * fw * DW_CB + g.KH * g.KW * DW_CB;
}

template <typename T, int KS>
__global__ void __launch_bounds__(CONV_THREADS)
    dwconv_kernel(const T* __restrict__ x, const bool* __restrict__ mask, const T* __restrict__ w,
                  const T* __restrict__ bias, const bool* __restrict__ key, T* __restrict__ y,
                  const int* __restrict__ list, const int* __restrict__ count_in, ConvGeom g) {
  grid_dependency_sync();
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int KH = KS > 0 ? KS : g.KH;
  const int KW = KS > 0 ? KS : g.KW;
  const int KK = KH * KW;
  const int FH = (TILE_H - 1) * g.sh + (KH - 1) * g.dh + 1;
  const int FW = (TILE_W - 1) * g.sw + (KW - 1) * g.dw + 1;
  const int FHW = FH * FW;
  float* in_s = smem;              // [FH * FW][DW_CB]
  float* w_s = smem + FHW * DW_CB;  // [KK][DW_CB]
  const int C = g.Cout;
  const int c0 = blockIdx.y * DW_CB;
  const int tid = threadIdx.x;
  const int cl = tid % DW_CB;
  const int row = tid / DW_CB;
  const int c = c0 + cl;
  const int count = *count_in;
  if ((int)blockIdx.x >= count) return;  // no tile for this block: skip staging the weights

  for (int idx = tid; idx < KK * DW_CB; idx += CONV_THREADS) {
    const int cc = idx % DW_CB;
    const int k = idx / DW_CB;
    w_s[idx] = c0 + cc < C ? to_f(w[(size_t)(c0 + cc) * KK + k]) : 0.f;
  }
  const float b = (bias != nullptr && c < C) ? to_f(bias[c]) : 0.f;

  for (int item = blockIdx.x; item < count; item += gridDim.x) {
    const int tile = list[1 + item];
    const TileAt at = tile_at(tile, g);
    const int n = at.n, oh0 = at.oh0, ow0 = at.ow0;
    const int ih0 = oh0 * g.sh - g.ph, iw0 = ow0 * g.sw - g.pw;
    const bool* mn = mask + (size_t)n * g.H * g.W;
    __syncthreads();  // w_s written / previous item done
    for (int idx = tid; idx < FHW * DW_CB; idx += CONV_THREADS) {
      const int cc = idx % DW_CB;
      const int q = idx / DW_CB;
      const int ih = ih0 + q / FW, iw = iw0 + q % FW;
      float v = 0.f;
      if (c0 + cc < C && ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) {
        const int pix = ih * g.W + iw;
        if (mn[pix]) v = to_f(x[((size_t)n * g.H * g.W + pix) * C + c0 + cc]);
      }
      in_s[idx] = v;
    }
    __syncthreads();
    float acc[TILE_W];
#pragma unroll
    for (int i = 0; i < TILE_W; ++i) acc[i] = 0.f;
#pragma unroll
    for (int ky = 0; ky < KH; ++ky) {
      const float* ir = in_s + ((row * g.sh + ky * g.dh) * FW) * DW_CB + cl;
#pragma unroll
      for (int kx = 0; kx < KW; ++kx) {
        const float wv = w_s[(ky * KW + kx) * DW_CB + cl];
        const float* ik = ir + kx * g.dw * DW_CB;
#pragma unroll
        for (int i = 0; i < TILE_W; ++i) acc[i] = fmaf(ik[i * g.sw * DW_CB], wv, acc[i]);
      }
    }
    const int oh = oh0 + row;
    if (c < C && oh < g.Ho) {
      const bool kn = key_of(key, n);
      T* yr = y + ((size_t)n * g.Ho + oh) * g.Wo * C + c;
#pragma unroll
      for (int i = 0; i < TILE_W; ++i) {
        const int ow = ow0 + i;
        if (ow < g.Wo) yr[(size_t)ow * C] = from_f<T>(kn ? acc[i] + b : acc[i]);
      }
    }
  }
}

// 16 bytes of T as floats: 8 halves / bf16s or 4 floats.
template <typename T>
struct Vec16 {
  static constexpr int N = 16 / sizeof(T);
  static __device__ __forceinline__ void to_f(const uint4& u, float (&f)[16 / sizeof(T)]) {
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = conv::to_f(e[i]);
  }
  static __device__ __forceinline__ uint4 from_f(const float (&f)[16 / sizeof(T)]) {
    uint4 u;
    T* e = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int i = 0; i < N; ++i) e[i] = conv::from_f<T>(f[i]);
    return u;
  }
};

// Depthwise KS x KS, stride S, dilation D, C % Vec16<T>::N == 0, 16-byte aligned rows: the
// vectorised path. A block owns a channel block of NV 16-byte vectors (NV = 8: 64 channels of
// fp16 / bf16, 32 of fp32; NV = 4: half that, for channel counts that would leave half of an
// 8-vector block idle) and walks the tile list; per tile the input halo of (7S + (KS-1)D + 1)^2
// pixels is staged in shared memory as raw 16-byte vectors by cp.async, double-buffered: the next
// tile's halo is in flight while the block computes the current one (one barrier per tile). The
// halo is copied whatever the mask (outside the image and past the channels zero-filled); the
// mask byte of each copied vector is loaded with it and inactive pixels are zeroed in shared memory
// once the copy has landed, so no load waits on the mask. Thread t computes PPT adjacent output
// pixels of one row of the 8x8 tile for vector t % NV (a block has NV * 64 / PPT threads; at stride
// 1 the PPT pixels share all but KS - 1 of the input columns a thread reads, and each input vector
// is converted to float once for all of them); fp32 accumulation, weights as fp32
// [KS*KS][channels of the block] in shared memory.
// TMA (sm_90a; the launcher takes it for 8-vector blocks): one thread has the copy engine fetch the
// whole halo as one box of a 4-D tensor map of the input ([N][H][W][C]: outside the image and past
// the channels it writes zeros), completing on an mbarrier per buffer; each thread looks up the mask
// of 1-3 halo pixels (not of each of its 7-19 vectors) and zeroes the vectors of those that are
// inactive once the box has landed. This takes the per-vector address arithmetic, bounds tests and
// mask loads of the cp.async staging off every thread.
template <typename T, int KS, int S, int D, int NV_, int PPT_>
struct DwVecCfg {
  static_assert(NV_ == 4 || NV_ == 8, "depthwise channel block: 4 or 8 vectors");
  static_assert(PPT_ == 1 || PPT_ == 2 || PPT_ == 4, "depthwise: 1, 2 or 4 output pixels per thread");
  static constexpr int NV = NV_;                           // 16-byte vectors per block
  static constexpr int STRIDE = S;
  static constexpr int VEC = Vec16<T>::N;
  static constexpr int CB = NV * VEC;                      // channels per block
  static constexpr int PPT = PPT_;                         // output pixels per thread (one row)
  static constexpr int GPR = TILE_W / PPT;                 // thread groups per tile row
  static constexpr int THREADS = NV * TILE_PIX / PPT;      // one thread per vector and PPT pixels
  static constexpr int FW = (TILE_W - 1) * S + (KS - 1) * D + 1;  // halo width (= height)
  static constexpr int HALO = FW * FW * NV;                // 16-byte vectors per halo buffer
  static constexpr int HALO_VECS = (HALO + 7) / 8 * 8;     // a buffer's size, 128-byte aligned (TMA)
  static constexpr int LOADS = (HALO + THREADS - 1) / THREADS;  // vectors per thread (cp.async)
  static constexpr int MASKS = (FW * FW + THREADS - 1) / THREADS;  // halo pixels per thread (TMA)
  // bytes: two halo buffers, the weights, two mbarriers (TMA)
  static constexpr int SMEM = 2 * HALO_VECS * 16 + KS * KS * CB * 4 + 16;
};

// Issues the cp.async copies of tile `tile`'s input halo (channel vectors [v0, v0 + NV)) into
// `buf` ([FW * FW][NV] 16-byte vectors; outside the image / past the channels zero-filled) and
// loads into `active[l]` the mask of the pixel of this thread's l-th vector (false outside).
template <typename Cfg>
__device__ __forceinline__ void dwv_stage_halo(uint4* buf, bool (&active)[Cfg::LOADS], const uint4* xv,
                                               const bool* mask, int tile, const ConvGeom& g, int v0, int cvecs) {
  const TileAt at = tile_at(tile, g);
  const int ih0 = at.oh0 * Cfg::STRIDE - g.ph, iw0 = at.ow0 * Cfg::STRIDE - g.pw;
  const bool* mn = mask + (size_t)at.n * g.H * g.W;
  const uint4* xn = xv + (size_t)at.n * g.H * g.W * cvecs;
#pragma unroll
  for (int l = 0; l < Cfg::LOADS; ++l) {
    const int idx = threadIdx.x + l * Cfg::THREADS;
    active[l] = false;
    if (idx < Cfg::HALO) {
      const int q = idx / Cfg::NV, vv = idx % Cfg::NV;
      const int ih = ih0 + q / Cfg::FW, iw = iw0 + q % Cfg::FW;
      const bool inside = v0 + vv < cvecs && ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
      const int pix = inside ? ih * g.W + iw : 0;
      cp_async16(smem_u32(buf + idx), inside ? xn + (size_t)pix * cvecs + v0 + vv : xv, inside);
      if (inside) active[l] = mn[pix];
    }
  }
  cp_async_commit();
}

// TMA: has the copy engine fetch the input halo of the tile at `at` (channels [v0 * VEC, + CB), as
// dwv_stage_halo) from `map` into shared memory at `dst`, completing on the mbarrier `bar`. One
// thread calls it.
template <typename Cfg>
__device__ __forceinline__ void dwv_tma_halo(uint32_t dst, const CUtensorMap* map, uint32_t bar, const TileAt& at,
                                             const ConvGeom& g, int v0) {
  tc::mbarrier_arrive_expect_tx(bar, Cfg::HALO * 16);  // the whole box, its zero-filled part included
  tc::tma_load_4d(dst, map, v0 * Cfg::VEC, at.ow0 * Cfg::STRIDE - g.pw, at.oh0 * Cfg::STRIDE - g.ph, at.n, bar);
}

// TMA: loads into `zero[l]` whether halo pixel threadIdx.x + l * THREADS of the tile at `at` lies in
// the image and is inactive (so that its copied vectors must be zeroed).
template <typename Cfg>
__device__ __forceinline__ void dwv_halo_inactive(bool (&zero)[Cfg::MASKS], const bool* mask, const TileAt& at,
                                                  const ConvGeom& g) {
  const int ih0 = at.oh0 * Cfg::STRIDE - g.ph, iw0 = at.ow0 * Cfg::STRIDE - g.pw;
  const bool* mn = mask + (size_t)at.n * g.H * g.W;
#pragma unroll
  for (int l = 0; l < Cfg::MASKS; ++l) {
    const int q = threadIdx.x + l * Cfg::THREADS;
    zero[l] = false;
    if (q < Cfg::FW * Cfg::FW) {
      const int ih = ih0 + q / Cfg::FW, iw = iw0 + q % Cfg::FW;
      if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) zero[l] = !mn[ih * g.W + iw];
    }
  }
}

// x_map (TMA only): the input as a 4-D tensor map with boxes of FW x FW pixels x CB channels.
template <typename T, int KS, int S, int D, int NV, int PPT_, bool TMA>
__global__ void __launch_bounds__(NV * TILE_PIX / PPT_)
    dwconv_vec_kernel(const T* __restrict__ x, const bool* __restrict__ mask, const T* __restrict__ w,
                      const T* __restrict__ bias, const bool* __restrict__ key, T* __restrict__ y,
                      const int* __restrict__ list, const int* __restrict__ count_in, ConvGeom g,
                      const __grid_constant__ CUtensorMap x_map) {
  grid_dependency_sync();
  using Cfg = DwVecCfg<T, KS, S, D, NV, PPT_>;
  constexpr int VEC = Cfg::VEC, CB = Cfg::CB, FW = Cfg::FW, KK = KS * KS, PPT = Cfg::PPT;
  if constexpr (TMA && !DC_HAS_WGMMA) __trap();  // the host launches TMA only on sm_90a builds
  extern __shared__ __align__(128) float4 smem4[];
  uint4* halo_s = reinterpret_cast<uint4*>(smem4);                        // [2][HALO_VECS]: [FW * FW][NV]
  float* w_s = reinterpret_cast<float*>(smem4) + 2 * Cfg::HALO_VECS * 4;  // [KK][CB]
  const uint32_t bar_s = smem_u32(w_s + KK * CB);                         // TMA: an mbarrier per buffer
  const int C = g.Cout;
  const int cvecs = C / VEC;
  const int v0 = blockIdx.y * NV;  // first vector of this block
  const int tid = threadIdx.x;
  const int v = tid % NV;
  const int pp = tid / NV;
  const int row = pp / Cfg::GPR, col = (pp % Cfg::GPR) * PPT;
  const bool vok = v0 + v < cvecs;
  const int count = *count_in;
  if ((int)blockIdx.x >= count) return;  // no tile for this block: skip staging the weights
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  uint4* yv = reinterpret_cast<uint4*>(y);
  bool active[Cfg::LOADS];  // cp.async: the mask of each vector this thread copies
  bool zero[Cfg::MASKS];    // TMA: the halo pixels of this thread to zero
  if constexpr (TMA) {
    const TileAt first = tile_at(list[1 + blockIdx.x], g);
    if (tid == 0) {
      tc::mbarrier_init(bar_s, 1);
      tc::mbarrier_init(bar_s + 8, 1);
      tc::fence_mbarrier_init();
      dwv_tma_halo<Cfg>(smem_u32(halo_s), &x_map, bar_s, first, g, v0);
    }
    dwv_halo_inactive<Cfg>(zero, mask, first, g);
    __syncthreads();  // the mbarriers are initialised before any thread waits on them
  } else {
    dwv_stage_halo<Cfg>(halo_s, active, xv, mask, list[1 + blockIdx.x], g, v0, cvecs);
  }

  for (int idx = tid; idx < KK * CB; idx += Cfg::THREADS) {
    const int cc = idx % CB, k = idx / CB;
    const int c = v0 * VEC + cc;
    w_s[idx] = c < C ? to_f(w[(size_t)c * KK + k]) : 0.f;
  }
  float b[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) b[i] = (bias != nullptr && vok) ? to_f(bias[(v0 + v) * VEC + i]) : 0.f;

  // this block's k-th item uses halo buffer k & 1, for the (k >> 1)-th time (TMA: that parity of the
  // buffer's mbarrier phase)
  for (int item = blockIdx.x, k = 0; item < count; item += gridDim.x, ++k) {
    const int buf = k & 1;
    uint4* in_s = halo_s + buf * Cfg::HALO_VECS;
    if constexpr (TMA) {
      tc::mbarrier_wait(bar_s + 8 * buf, (k >> 1) & 1);  // the item's halo has landed
#pragma unroll
      for (int l = 0; l < Cfg::MASKS; ++l) {
        if (zero[l]) {  // lanes start at different vectors: their 16-byte stores spread over the banks
          uint4* px = in_s + (tid + l * Cfg::THREADS) * NV;
#pragma unroll
          for (int j = 0; j < NV; ++j) px[(j + tid) & (NV - 1)] = make_uint4(0, 0, 0, 0);
        }
      }
      // orders this thread's accesses to the buffers before the copy engine's next writes to them
      tc::fence_proxy_async();
    } else {
      cp_async_wait<0>();  // this thread's copies of the item's halo have landed: zero its inactive pixels
#pragma unroll
      for (int l = 0; l < Cfg::LOADS; ++l) {
        const int idx = tid + l * Cfg::THREADS;
        if (idx < Cfg::HALO && !active[l]) in_s[idx] = make_uint4(0, 0, 0, 0);
      }
    }
    // the halo (and, first time, w_s) is complete; every thread is done with the other buffer
    __syncthreads();
    const int tile = list[1 + item];
    const int next = item + gridDim.x;
    if (next < count) {
      if constexpr (TMA) {
        const TileAt at_next = tile_at(list[1 + next], g);
        if (tid == 0)
          dwv_tma_halo<Cfg>(smem_u32(halo_s + (buf ^ 1) * Cfg::HALO_VECS), &x_map, bar_s + 8 * (buf ^ 1), at_next,
                            g, v0);
        dwv_halo_inactive<Cfg>(zero, mask, at_next, g);
      } else {
        dwv_stage_halo<Cfg>(halo_s + (buf ^ 1) * Cfg::HALO_VECS, active, xv, mask, list[1 + next], g, v0, cvecs);
      }
    }
    const TileAt at = tile_at(tile, g);
    const int n = at.n, oh0 = at.oh0, ow0 = at.ow0;
    float acc[PPT][VEC];
#pragma unroll
    for (int j = 0; j < PPT; ++j)
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[j][i] = 0.f;
#pragma unroll
    for (int ky = 0; ky < KS; ++ky) {
#pragma unroll
      for (int kx = 0; kx < KS; ++kx) {
        float wv[VEC];
        const float4* wp = reinterpret_cast<const float4*>(w_s + (ky * KS + kx) * CB + v * VEC);
#pragma unroll
        for (int i = 0; i < VEC / 4; ++i) {
          const float4 t = wp[i];
          wv[4 * i] = t.x; wv[4 * i + 1] = t.y; wv[4 * i + 2] = t.z; wv[4 * i + 3] = t.w;
        }
#pragma unroll
        for (int j = 0; j < PPT; ++j) {
          float xf[VEC];
          Vec16<T>::to_f(in_s[((row * S + ky * D) * FW + (col + j) * S + kx * D) * NV + v], xf);
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc[j][i] = fmaf(xf[i], wv[i], acc[j][i]);
        }
      }
    }
    const int oh = oh0 + row;
    if (vok && oh < g.Ho) {
      const bool kn = key_of(key, n);
#pragma unroll
      for (int j = 0; j < PPT; ++j) {
        const int ow = ow0 + col + j;
        if (ow < g.Wo) {
          if (kn) {
#pragma unroll
            for (int i = 0; i < VEC; ++i) acc[j][i] += b[i];
          }
          yv[(((size_t)n * g.Ho + oh) * g.Wo + ow) * cvecs + v0 + v] = Vec16<T>::from_f(acc[j]);
        }
      }
    }
  }
}

// Fallback for any geometry (no shared memory), and the transposed convolution (gather form).
// Conv weight [Cout, cin_g, KH, KW]; transposed weight [Cin, cout_g, KH, KW].
template <typename T, bool TRANSPOSED>
__global__ void __launch_bounds__(CONV_THREADS)
    conv_direct_kernel(const T* __restrict__ x, const bool* __restrict__ mask, const T* __restrict__ w,
                       const T* __restrict__ bias, const bool* __restrict__ key, T* __restrict__ y,
                       const int* __restrict__ list, const int* __restrict__ count_in, ConvGeom g) {
  grid_dependency_sync();
  const int count = *count_in;
  const int per_tile = TILE_PIX * g.Cout;
  for (int item = blockIdx.x; item < count; item += gridDim.x) {
    const int tile = list[1 + item];
    const TileAt at = tile_at(tile, g);
    const int n = at.n;
    const bool kn = key_of(key, n);
    const bool* mn = mask + (size_t)n * g.H * g.W;
    for (int idx = threadIdx.x; idx < per_tile; idx += blockDim.x) {
      const int co = idx % g.Cout;
      const int p = idx / g.Cout;
      const int oh = at.oh0 + p / TILE_W, ow = at.ow0 + p % TILE_W;
      if (oh >= g.Ho || ow >= g.Wo) continue;
      const int grp = co / g.cout_g;
      const int col = co % g.cout_g;
      float acc = 0.f;
      for (int ky = 0; ky < g.KH; ++ky) {
        int ih;
        if (!tap_input<TRANSPOSED>(oh, ky, g.sh, g.ph, g.dh, g.H, ih)) continue;
        for (int kx = 0; kx < g.KW; ++kx) {
          int iw;
          if (!tap_input<TRANSPOSED>(ow, kx, g.sw, g.pw, g.dw, g.W, iw)) continue;
          const int pix = ih * g.W + iw;
          if (!mn[pix]) continue;
          const T* xp = x + ((size_t)n * g.H * g.W + pix) * g.Cin + grp * g.cin_g;
          const int k = ky * g.KW + kx;
          const int KK = g.KH * g.KW;
          for (int ci = 0; ci < g.cin_g; ++ci) {
            const size_t wi = TRANSPOSED ? ((size_t)(grp * g.cin_g + ci) * g.cout_g + col) * KK + k
                                         : ((size_t)co * g.cin_g + ci) * KK + k;
            acc = fmaf(to_f(xp[ci]), to_f(w[wi]), acc);
          }
        }
      }
      if (kn && bias != nullptr) acc += to_f(bias[co]);
      y[(((size_t)n * g.Ho + oh) * g.Wo + ow) * g.Cout + co] = from_f<T>(acc);
    }
  }
}

}  // namespace conv
}  // namespace deltaconv
