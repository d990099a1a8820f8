// Tensor-core sparse convolution for few input channels (the stems of image models: 3 channels),
// fp16 / bf16, and fp32 in TF32, fp32 accumulation. Consumer of the tile list of conv_tile_mask_kernel.
// One pixel's input channels are one 16-byte row: 8 of fp16 / bf16, 4 of fp32 (TcElem<T>::kVec; the
// channel counts below are the 16-bit ones); a k16 step of fp16 and a k8 step of TF32 both read two
// of them (conv_tc.cuh, TcElem).
//
//   pad_channels_kernel<E>
//       x [pixels, C] (C < 16 / sizeof(E) elements of E's size) -> [pixels, 16 / sizeof(E)],
//       channels C.. zero, on the pixels whose mask is set (the others are never read and stay
//       unwritten).
//   conv_small_cin_tc_kernel<T, S, TPB, NW, NT>
//       Cin == 8 (fewer channels padded to 8 by pad_channels_kernel), groups 1, dilation 1,
//       stride S (1 or 2) along both axes, 2..64 taps (KH x KW), any padding, Cout % 8 == 0.
//       Implicit GEMM per listed 8x8 output tile: M = the tile's 64 pixels, N = BN output
//       channels (blockIdx.y), K = taps x 8 channels, two taps per k16 step. One 16-byte row of
//       shared memory is one input pixel's 8 channels, i.e. the K slice of one tap, so the A
//       fragment of a (pixel, tap pair) is an ldmatrix with per-lane addresses straight into the
//       tile's input halo ((7S + KH) x (7S + KW) pixels, inactive / outside pixels zero-filled by
//       cp.async, double buffered across the block's groups of TPB tiles). The block's weights
//       ([BN][KP][8], KP = taps rounded up to even, zero beyond the taps and Cout) stay resident
//       for the whole persistent block. Warp w computes tile w / NW, output channels
//       [n0 + (w % NW) * NT * 8, +NT * 8). Weights in global memory: [Cout][KH][KW][8].
//
// Compared with gathering every (pixel, tap) piece from global memory, each input pixel crosses
// L2 once per tile instead of once per tap that reads it (49 / 4 times for a 7x7 stride-2 stem).
#pragma once

#include "conv_tc.cuh"

namespace deltaconv {
namespace conv {
namespace tc {

constexpr int kSmallCin = 8;        // input channels of the 16-bit kernel (one 16-byte row per pixel)
constexpr int kSmallCinMaxTaps = 64;

// E: an unsigned integer of the element's size (uint16_t, uint32_t)
template <typename E>
__global__ void pad_channels_kernel(const E* __restrict__ x, const bool* __restrict__ mask, uint4* __restrict__ out,
                                    int64_t pixels, int C) {
  grid_dependency_sync();
  constexpr int kC = 16 / (int)sizeof(E);
  const int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= pixels || !mask[p]) return;
  union {
    uint4 u;
    E h[kC];
  } v;
#pragma unroll
  for (int c = 0; c < kC; ++c) v.h[c] = c < C ? x[p * C + c] : (E)0;
  out[p] = v.u;
}

template <int S, int TPB, int NW, int NT>
struct SmallCinCfg {
  static constexpr int WARPS = TPB * NW;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int BN = NW * NT * 8;
  // 16-byte units
  static __host__ __device__ int taps_padded(const ConvGeom& g) { return (g.KH * g.KW + 1) & ~1; }
  static __host__ __device__ int pitch(const ConvGeom& g) { return taps_padded(g) | 1; }  // odd: conflict-free B rows
  static __host__ __device__ int halo_w(const ConvGeom& g) { return 7 * S + g.KW; }
  static __host__ __device__ int halo_pix(const ConvGeom& g) { return (7 * S + g.KH) * halo_w(g); }
  // bytes: weights, 2 halo buffers of TPB tiles, the tap offset table
  static __host__ __device__ int w_bytes(const ConvGeom& g) { return BN * pitch(g) * 16; }
  static __host__ __device__ int halo_bytes(const ConvGeom& g) { return TPB * halo_pix(g) * 16; }
  static int smem(const ConvGeom& g) { return w_bytes(g) + 2 * halo_bytes(g) + taps_padded(g) * 4; }
};

template <typename T, int S, int TPB, int NW, int NT>
__global__ void __launch_bounds__(32 * TPB * NW) conv_small_cin_tc_kernel(const TcArgs a) {
  grid_dependency_sync();
  using Cfg = SmallCinCfg<S, TPB, NW, NT>;
  constexpr int THREADS = Cfg::THREADS;
  extern __shared__ __align__(128) unsigned char smem[];

  const int count = *a.count;
  const int ngroups = (count + TPB - 1) / TPB;
  if ((int)blockIdx.x >= ngroups) return;
  const ConvGeom& g = a.g;
  const int my_groups = (ngroups - 1 - (int)blockIdx.x) / (int)gridDim.x + 1;
  const int KK = g.KH * g.KW;
  const int KP = Cfg::taps_padded(g);
  const int pitch = Cfg::pitch(g);
  const int HW = Cfg::halo_w(g);
  const int HPIX = Cfg::halo_pix(g);
  const int n0 = blockIdx.y * Cfg::BN;
  constexpr int CIN = TcElem<T>::kVec;  // input channels: one 16-byte row per pixel

  const T* __restrict__ x = static_cast<const T*>(a.x);
  const T* __restrict__ w = static_cast<const T*>(a.w);
  const int* __restrict__ list = a.list;
  const uint32_t w_s = smem_u32(smem);
  const uint32_t halo_s = w_s + Cfg::w_bytes(g);
  const int halo_bytes = Cfg::halo_bytes(g);
  int* toff_s = reinterpret_cast<int*>(smem + Cfg::w_bytes(g) + 2 * halo_bytes);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int slot = warp / NW;
  const int nw = warp % NW;

  // resident weights (16-byte piece kk of row n: tap kk of output channel n0 + n) and the halo
  // offset of every tap (taps past the last read tap 0: their weights are zero)
  for (int e = tid; e < Cfg::BN * KP; e += THREADS) {
    const int n = e / KP, kk = e - n * KP;
    const bool v = n0 + n < g.Cout && kk < KK;
    cp_async16(w_s + (n * pitch + kk) * 16, v ? w + ((size_t)(n0 + n) * KK + kk) * CIN : w, v);
  }
  for (int kk = tid; kk < KP; kk += THREADS) toff_s[kk] = kk < KK ? (kk / g.KW) * HW + kk % g.KW : 0;

  // input halos of group gi's tiles -> buffer gi & 1 (tiles past the list are not loaded: their
  // warps skip the MMAs)
  auto issue_halo = [&](int gi) {
    const int grp = (int)blockIdx.x + gi * (int)gridDim.x;
    const uint32_t hb = halo_s + (gi & 1) * halo_bytes;
#pragma unroll 4
    for (int e = tid; e < TPB * HPIX; e += THREADS) {
      const int sl = e / HPIX;
      const int q = e - sl * HPIX;
      const int t = grp * TPB + sl;
      if (t < count) {
        const TileAt at = tile_at(list[1 + t], g);
        const int hy = q / HW;
        const int ih = at.oh0 * S - g.ph + hy;
        const int iw = at.ow0 * S - g.pw + (q - hy * HW);
        int pix = 0;
        bool v = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
        if (v) {
          pix = (at.n * g.H + ih) * g.W + iw;
          v = a.mask[pix];
        }
        cp_async16(hb + e * 16, v ? x + (size_t)pix * CIN : x, v);
      }
    }
  };

  issue_halo(0);
  cp_async_commit();

  // per lane: halo pixel of tap 0 for m16 tile i (output rows 2i + (lane >> 3 & 1), column
  // lane & 7 of the tile); k half (lane >> 4) = the second tap of a pair; B rows
  int abase[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) abase[i] = slot * HPIX + (2 * i + ((lane >> 3) & 1)) * S * HW + (lane & 7) * S;
  const int ka = lane >> 4;
  const uint32_t bbase = w_s + ((nw * NT * 8 + (lane & 7) + ((lane >> 4) << 3)) * pitch + ((lane >> 3) & 1)) * 16;

  float acc[4][NT][4];
  zero_acc(acc);

#pragma unroll 1
  for (int gi = 0; gi < my_groups; ++gi) {
    if (gi + 1 < my_groups) issue_halo(gi + 1);
    cp_async_commit();
    cp_async_wait<1>();
    if (rounds_input<T>(a.g)) {  // TF32: this thread's landed halo pieces (round_tf32)
      const uint32_t hb = halo_s + (gi & 1) * halo_bytes;
      const int first = ((int)blockIdx.x + gi * (int)gridDim.x) * TPB;
      for (int e = tid; e < TPB * HPIX; e += THREADS)
        if (first + e / HPIX < count) round_tf32(hb + e * 16);
    }
    __syncthreads();

    const int grp = (int)blockIdx.x + gi * (int)gridDim.x;
    const int t = grp * TPB + slot;
    const int rm = t < count ? list[1 + a.cap + t] : 0;  // output row mask of this warp's tile
    const int rp = ((rm & 0x03) ? 1 : 0) | ((rm & 0x0c) ? 2 : 0) | ((rm & 0x30) ? 4 : 0) | ((rm & 0xc0) ? 8 : 0);
    if (rp != 0) {
      const uint32_t hb = halo_s + (gi & 1) * halo_bytes;
#pragma unroll 1
      for (int kp = 0; kp < KP; kp += 2) {
        const int to = toff_s[kp + ka];
        uint32_t av[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (rp & (1 << i)) ldsm_x4(av[i], hb + (abase[i] + to) * 16);
#pragma unroll
        for (int jj = 0; jj < NT / 2; ++jj) {
          uint32_t b[4];
          ldsm_x4(b, bbase + (jj * 16 * pitch + kp) * 16);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (rp & (1 << i)) {
              Mma<T>::run(acc[i][2 * jj], av[i], b[0], b[1]);
              Mma<T>::run(acc[i][2 * jj + 1], av[i], b[2], b[3]);
            }
          }
        }
      }
      // epilogue: the active rows of the tile
      store_tile<T, NT>(a, list[1 + t], rm, n0 + nw * NT * 8, acc);
      zero_acc(acc);
    }
    __syncthreads();  // buffer gi & 1 is refilled by the next iteration's issue_halo(gi + 2)
  }
  cp_async_wait<0>();
}

}  // namespace tc
}  // namespace conv
}  // namespace deltaconv
