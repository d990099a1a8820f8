// Tensor-core (mma.sync m16n8k16, fp32 accumulation) sparse convolution for fp16 / bf16 deltas, and
// for fp32 deltas in TF32 (mma.sync m16n8k8, wgmma k8: the two kernels below, see TcElem).
// Consumers of the work lists of conv_common.cuh:
//
//   conv3x3_tc_kernel<T, S, TPB, NW, NT, FINE, D>
//       3x3 conv, stride S (1 or 2), dilation D (1; 2 or 4 with S = 1), any padding, groups 1, Cin % 8 == 0,
//       Cout % 8 == 0. (Channel counts below are fp16 / bf16's; fp32 halves those per chunk and
//       k-step: TcElem.) Implicit GEMM over the list of active 8x8 output tiles: a block takes TPB
//       consecutive list entries (a "group"); warp w computes the 64 pixels of tile w / NW for
//       output channels [n0 + (w % NW) * NT * 8, +NT * 8). K runs over chunks of 64 input
//       channels x 9 taps. Per chunk the input halo of every tile ((7S+2D+1)^2 pixels x 64 channels,
//       inactive / outside pixels zero-filled by cp.async) sits in shared memory (double
//       buffered); the A fragments of each tap are gathered from it by ldmatrix with per-lane row
//       addresses. Per (chunk, tap) stage a [BN x 64] weight slice is streamed through a
//       3-slot cp.async ring (prefetch distance 2). The loop over (group, chunk, tap) is
//       flattened (persistent blocks, grid-stride over groups), so the next group's loads
//       overlap this group's math. Weights: [Cout][3][3][Cin] (relayout on the host side).
//       FINE selects which of two launches runs: a coarse one (TPB 2) for many tiles and a
//       fine one (TPB 1) when the device-side tile count is small (count <= fine_max), so that
//       a few tiles still spread over all multiprocessors. Both are launched; one exits at once,
//       except for one round of the coarse launch and a short tail, which the fine one takes
//       (coarse_tile_end).
//       On Hopper the fine launch runs in thread-block clusters (cluster.cuh) and, when the tiles
//       are few, 2 or 4 CTAs split a tile's K: each computes a share of its input chunks, and the
//       first adds the others' fp32 partial sums from their shared memory before the epilogue
//       (a chain of stages 1 / 2 or 1 / 4 as long).
//       WG (stride 1, sm_90a): a warpgroup per tile issues wgmma with A straight from the halo,
//       one wgmma group in flight across stages (prefetch distance 1, a 3-slot weight ring).
//       (On Hopper, stride-1 undilated convs with C_in = 64 or 128 run on conv3x3_stationary_kernel
//       instead, and with C_in = 256 it takes the fine launch's tiles: conv3x3_stationary.cuh. The
//       coarse launch of convs with C_in % 64 == 0 and C_out > 64, stride 1 or stride 2 without
//       dilation, runs on conv3x3_ring_kernel, which streams the weights by TMA through a ring:
//       conv3x3_ring.cuh.)
//   conv_gather_tc_kernel<T, NW, NT, ROWS, WG>
//       groups 1, Cin % 8 == 0: a GEMM over 128 output pixels x BN output channels per item, K in
//       chunks of 64 channels (32 in fp32: TcElem) (x taps), 3-slot cp.async ring over the flattened
//       (item, tap, chunk) loop of a persistent block; A rows gathered from global memory by input pixel index
//       (inactive / outside pixels zero-filled). WG: two warpgroups issue Hopper wgmma straight
//       from the shared-memory ring (wgmma.cuh; 1.2-1.9x faster than mma.sync on an H200);
//       otherwise 4 warps issue mma.sync from ldmatrix fragments. On Hopper, from 8 chunks of C_in
//       on, it runs in clusters of 2 CTAs that split an item's input chunks while the items are
//       few, as the 3x3 fine launch.
//       ROWS = kRows1x1: 1x1 conv (any stride / padding); rows = the listed active output
//       pixels, their input pixels precomputed by conv1x1_mask_kernel.
//       ROWS = kRowsTiles: any KH x KW <= 32 taps, stride, padding and dilation (the paths the
//       halo kernel does not take: dilated, 5x5, unequal or > 2 strides, even kernels); rows =
//       the 64 pixels of two listed 8x8 output tiles per item, each tap a shifted gather of them.
//       ROWS = kRowsPixels: the same taps over the listed active output pixels (the pixel list of
//       conv_tile_mask_kernel: the pixels of the 3x3 conv's sparsely active tiles): no work on the
//       inactive pixels of partly active tiles, at the cost of one gather per tap instead of a
//       shared halo. It runs beside the 3x3 kernel, which takes the fuller tiles.
//       Weights: [Cout][KH][KW][Cin].
//
// Shared-memory rows are 64 channels = 128 bytes = 8 chunks of 16 bytes; chunk j of row r is
// stored at chunk j ^ swz(r), which makes every ldmatrix phase (8 rows) conflict-free.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "cluster.cuh"
#include "conv_common.cuh"
#include "wgmma.cuh"

namespace deltaconv {
namespace conv {
namespace tc {

// The element type's units of the kernels, which all count in bytes: a K chunk is one 128-byte
// shared-memory row per pixel, loaded as 8 chunks of 16 bytes, and an mma k-step reads 32 bytes of
// a row. fp16 / bf16: 64 channels per K chunk, 8 per 16 bytes, m16n8k16. fp32 (TF32): 32 channels per
// K chunk, 4 per 16 bytes, m16n8k8. The two MMAs' fragments hold the same bytes of a row (a 32-bit
// register: two 16-bit channels or one fp32 channel), so the ldmatrix addressing, the swizzle and
// the accumulator layout are the same; only the instruction and the channel counts differ.
template <typename T>
struct TcElem {
  static constexpr int kChunk = 128 / (int)sizeof(T);  // input channels per K chunk
  static constexpr int kVec = 16 / (int)sizeof(T);     // channels per 16-byte load
  static constexpr int kStep = 32 / (int)sizeof(T);    // channels per mma k-step
};

// The shared-memory address of 16-byte piece `piece` (0..7) of 128-byte row `row` of a buffer at
// `base`, stored at piece ^ key (the 128-byte swizzle that ldmatrix and wgmma read; key: the row's
// swizzle key, row & 7 unless the buffer's layout says otherwise).
__device__ __forceinline__ uint32_t swizzled_piece(uint32_t base, int row, int piece, int key) {
  return base + row * 128 + ((piece ^ key) << 4);
}
__device__ __forceinline__ uint32_t swizzled_piece(uint32_t base, int row, int piece) {
  return swizzled_piece(base, row, piece, row & 7);
}

struct TcArgs {
  const void* x;        // [N, H, W, Cin]
  const bool* mask;     // [N, H, W]
  const void* w;        // 3x3: [Cout][3][3][Cin]; 1x1: [Cout][Cin]
  const void* bias;     // [Cout] or nullptr
  const bool* key;      // [N] or nullptr
  void* y;              // [N, Ho, Wo, Cout]
  const int* list;      // list[1 + i]: item i, list[1 + cap + i]: its side data
  ConvGeom g;
  int fine_max;         // 3x3: count <= fine_max: the fine launch takes every tile, else the coarse (but a tail)
  int coarse_round;     // 3x3: tiles of one round of the coarse launch (its blocks x TPB)
  int tail_max;         // 3x3: a tail of at most this many tiles past one coarse round goes to the fine launch
  int cap;              // capacity of the list (its side data starts at list + 1 + cap)
  int prefetch;         // cp.async prefetch distance in stages (1..5); prefetch + 1 smem slots
  const int* count;     // the list's item count (device-side; the gathered-rows kernel reads list[0] if nullptr)
  const int* split_counts;  // 3x3: TileSplit::counts (nullptr: no split)
  int split_min;            // 3x3 and its pixel rows: TileSplit::min_pixels
  int* spread;              // 3x3: kSpreadInts zeroed ints for block_work (nullptr: block-index order)
  int sms;                  // the device's multiprocessors (the K split of the 3x3 fine launch and the GEMM)
  int* k_split;             // where the 3x3 fine launch / the GEMM records its K split (nullptr: nowhere)
};

// The tiles the 3x3 kernel computes: the listed ones, and the sparse ones of a split when its
// pixel rows do not run (see TileSplit).
__device__ __forceinline__ int split_tile_count(const TcArgs& a) {
  int c = *a.count;
  if (a.split_counts != nullptr && a.split_counts[1] < a.split_min) c += a.split_counts[0];
  return c;
}
// The tiles [0, end) that the coarse 3x3 launch computes of `count`; the fine launch computes
// [end, count). All of them when there are more than fine_max, none when fewer. One round of the
// coarse launch (a group of TPB tiles per block) and a short tail (at most tail_max tiles): the
// tail runs on the fine launch, a tile per block (or cluster), which may split its K, instead of as a
// second round of a few coarse blocks, each a chain of all its stages while most multiprocessors
// idle (conv3x3 C = 256 at 5 % changed: 297 tiles, one round of 264).
__device__ __forceinline__ int coarse_tile_end(const TcArgs& a, int count) {
  if (count <= a.fine_max) return 0;
  return count > a.coarse_round && count - a.coarse_round <= a.tail_max ? a.coarse_round : count;
}
// Entry t of those tiles (`listed` = *a.count): side 0 its tile id, side 1 its row mask.
__device__ __forceinline__ int split_tile_entry(const TcArgs& a, int listed, int t, int side) {
  return t < listed ? a.list[1 + side * a.cap + t] : a.list[(side + 1) * a.cap - (t - listed)];
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_if(uint32_t (&r)[4], uint32_t addr, int pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
      " @p ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n}\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(addr), "r"(pred));
}

template <typename T>
struct Mma;
template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run_if(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                                int pred) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
        " @p mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(pred));
  }
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run_if(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                                int pred) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
        " @p mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(pred));
  }
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// TF32: fp32 fragments, loaded by the same ldmatrix as the 16-bit ones (a 32-bit lane element per
// channel), as m16n8k8's operands: the A fragment's registers a0..a3 (rows g / g + 8, channels t /
// t + 4 of the k8 step) hold the 16-bit fragment's bytes, and so do b0 / b1 (channels t / t + 4 of
// output channel g). The tensor cores read an fp32 value as TF32 by dropping its low 13 mantissa
// bits (rounding toward zero, in mma.sync's registers and in wgmma's shared-memory operands alike).
// On the deltas that is a bias that the delta states would sum frame after frame (resnet50 at t=0.02
// on one-by-one: a relative error of 2.7e-2 where rounding to nearest gives 1.9e-2), so every kernel
// rounds its stages' input operand to nearest in shared memory first (round_tf32): each thread the
// 16-byte pieces it copied, once they have landed and before the barrier that publishes them;
// unless the deltas arrive rounded (ConvGeom::input_tf32: every layer with a `sent` state rounds
// the changes it sends and keeps the rest pending, so that it is not lost frame after frame,
// deltaconv/modules/linear.py, sends_tf32). The
// weights are read as they are (truncated: a fixed error of the weights, which a delta sum does
// not accumulate): deltaconv's convolutions round them to nearest once, with their fold
// (deltaconv/modules/folding.py, round_to_tf32), and the weight-stationary and warp-specialised
// kernels copy them by TMA, past any thread.
__device__ __forceinline__ void round_tf32(uint32_t addr) {
  uint32_t v[4];
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(addr));
#pragma unroll
  for (int k = 0; k < 4; ++k) asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(v[k]) : "f"(__uint_as_float(v[k])));
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
               : "memory");
}

// Whether a kernel of element type T rounds its staged input deltas to TF32 (round_tf32): float32,
// unless they arrive rounded (ConvGeom::input_tf32).
template <typename T>
__device__ __forceinline__ bool rounds_input(const ConvGeom& g) {
  return std::is_same<T, float>::value && !g.input_tf32;
}

template <>
struct Mma<float> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <typename T>
struct Vec2;
template <>
struct Vec2<__half> {
  using type = __half2;
  static __device__ __forceinline__ __half2 make(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct Vec2<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ __nv_bfloat162 make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

// Two adjacent output channels (co, co + 1) of one pixel as a packed pair, + bias on key streams.
template <typename T>
__device__ __forceinline__ uint32_t pack2(const T* bias, bool add_bias, int co, float v0, float v1) {
  if (add_bias) {
    v0 += to_f(bias[co]);
    v1 += to_f(bias[co + 1]);
  }
  const typename Vec2<T>::type p = Vec2<T>::make(v0, v1);
  return *reinterpret_cast<const uint32_t*>(&p);
}

// 4 x 4 transpose of 32-bit values across the 4 lanes of a quad (lanes 4r .. 4r + 3): lane q's v[k]
// becomes lane k's former v[q].
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int q) {
  const bool hi2 = q & 2, hi1 = q & 1;
  uint32_t r0 = __shfl_xor_sync(0xffffffffu, hi2 ? v[0] : v[2], 2);
  uint32_t r1 = __shfl_xor_sync(0xffffffffu, hi2 ? v[1] : v[3], 2);
  if (hi2) { v[0] = r0; v[1] = r1; } else { v[2] = r0; v[3] = r1; }
  r0 = __shfl_xor_sync(0xffffffffu, hi1 ? v[0] : v[1], 1);
  r1 = __shfl_xor_sync(0xffffffffu, hi1 ? v[2] : v[3], 1);
  if (hi1) { v[0] = r0; v[2] = r1; } else { v[1] = r0; v[3] = r1; }
}

// Zero a warp's accumulators (M m16 tiles x NT n8 tiles x 4 floats per lane).
template <int M, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[M][NT][4]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// Stores row half h of an m16 tile's accumulators (n8 tile j = channels c0 + 8j .. + 7; lane
// 4r + q holds channels 2q, 2q + 1 of each) to this lane's output pixel yp (nullptr: none),
// channels below cout only, + bias on key streams. The 4 lanes of a quad share a pixel: they
// exchange values so that each stores whole n8 tiles as 16-byte vectors (a quad writes 64
// contiguous bytes per instruction). Called by all 32 lanes (shuffles). fp32: each lane stores its
// two channels as one 8-byte vector (a quad: 32 contiguous bytes), without the exchange.
template <typename T, int NT>
__device__ __forceinline__ void store_pixel(T* yp, const T* bias, bool add_bias, int c0, int cout,
                                            const float (&acc_i)[NT][4], int h) {
  const int q = threadIdx.x & 3;
  static_assert(NT % 4 == 0, "whole 16-byte vectors per lane");
  add_bias = add_bias && yp != nullptr;
  if constexpr (std::is_same<T, float>::value) {  // fp32: a lane's two channels are 8 bytes, stored as they are
    if (yp == nullptr) return;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int co = c0 + j * 8 + 2 * q;
      if (co >= cout) continue;  // cout is a multiple of 8
      float2 v = make_float2(acc_i[j][2 * h], acc_i[j][2 * h + 1]);
      if (add_bias) {
        v.x += bias[co];
        v.y += bias[co + 1];
      }
      *reinterpret_cast<float2*>(yp + co) = v;
    }
  } else {
#pragma unroll
    for (int g4 = 0; g4 < NT / 4; ++g4) {
      uint32_t v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int co = c0 + (g4 * 4 + k) * 8 + 2 * q;
        v[k] = pack2<T>(bias, add_bias && co < cout, co, acc_i[g4 * 4 + k][2 * h], acc_i[g4 * 4 + k][2 * h + 1]);
      }
      quad_transpose(v, q);  // v = channels c0 + 8 (4 g4 + q) + 0 .. 7
      const int co = c0 + (g4 * 4 + q) * 8;
      if (yp != nullptr && co < cout) *reinterpret_cast<uint4*>(yp + co) = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
}

// Epilogue of the 8x8-tile kernels: a warp's accumulators of output tile `tile` -> a.y at the tile
// rows set in `rm` (bit r: row r) that lie inside the output, plus the bias on key streams. acc[i]
// is the m16 tile of tile rows 2 (i0 + i di), +1 (mma.sync: i0 = 0, di = 1; wgmma: the warp's
// row pair, di = 0), its n8 tile j = channels c0 + i dc + 8j, +8.
template <typename T, int NT, int M>
__device__ __forceinline__ void store_tile(const TcArgs& a, int tile, int rm, int c0, const float (&acc)[M][NT][4],
                                           int i0 = 0, int di = 1, int dc = 0) {
  const ConvGeom& g = a.g;
  const int lane = threadIdx.x & 31;
  const TileAt at = tile_at(tile, g);
  const bool add_bias = a.bias != nullptr && key_of(a.key, at.n);
  const T* bias = static_cast<const T*>(a.bias);
  T* yn = static_cast<T*>(a.y) + (size_t)at.n * g.Ho * g.Wo * g.Cout;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const int r0 = 2 * (i0 + i * di);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int oh = at.oh0 + r0 + h;
      const int ow = at.ow0 + (lane >> 2);
      const bool store = ((rm >> (r0 + h)) & 1) && oh < g.Ho && ow < g.Wo;
      store_pixel<T, NT>(store ? yn + ((size_t)oh * g.Wo + ow) * g.Cout : nullptr, bias, add_bias, c0 + i * dc, g.Cout,
                         acc[i], h);
    }
  }
}

template <int S, int D>
struct Halo {
  static constexpr int W = 7 * S + 2 * D + 1;  // 8x8 output tile, 3x3 kernel, dilation D
  static constexpr int PIX = W * W;
  // swizzle key of halo row e (any offset of e keeps 8 consecutive pixels of one output row -
  // stride S apart in e - on 8 distinct keys)
  static __device__ __forceinline__ int swz(int e) { return (S == 1 ? e : (e >> 1)) & 7; }
};

// The input pixel that row q of the halo of the 8x8 output tile at `at` copies (3x3 kernel, stride
// S, dilation D), or -1 (a zero row) when it lies outside the input or is inactive.
template <int S, int D>
__device__ __forceinline__ int halo_source(const TcArgs& a, const TileAt& at, int q) {
  const ConvGeom& g = a.g;
  const int hy = q / Halo<S, D>::W;
  const int ih = at.oh0 * S - g.ph + hy;
  const int iw = at.ow0 * S - g.pw + (q - hy * Halo<S, D>::W);
  if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) return -1;
  const int pix = (at.n * g.H + ih) * g.W + iw;
  return a.mask[pix] ? pix : -1;
}

// A warpgroup's staging of the halo of one 8x8 output tile (3x3, stride S, dilation D), 64 input
// channels at a time, for wgmma with A straight from it: the weight-stationary and warp-specialised
// 3x3 kernels. Thread wt (0..127) of the warpgroup copies 16-byte piece wt % 8 of halo rows
// wt / 8 + 16 k, k < R (halo_source's order); p[k] holds the input pixel of its row k (-1: a zero
// row), looked up once per tile (sources) and kept for its chunks. Row q is stored at row slot(q) of
// the buffer, 128-byte swizzled by that row's address. Stride 1: slot(q) = q. Stride 2: within each
// halo row the even input columns come first, then the odd ones, so that the 8 inputs that a tap
// reads for the 8 pixels of an output row (2 columns apart) are consecutive rows, as wgmma's A
// operand needs; tap_row / GROUP_STRIDE give its first row and the bytes between output rows.
template <int D, int S = 1>
struct WarpgroupHalo {
  static_assert(S == 1 || D == 1, "stride 2 without dilation");
  static constexpr int W = Halo<S, D>::W;
  static constexpr int ROWS = Halo<S, D>::PIX;
  static constexpr int BYTES = (ROWS * 128 + 1023) / 1024 * 1024;  // one buffer, 1024-byte aligned (swizzle)
  static constexpr int R = (ROWS + 15) / 16;                       // rows per thread
  static constexpr int GROUP_STRIDE = S * W * 128;                 // bytes from one output row's A rows to the next's
  static __device__ __forceinline__ int slot(int q) {
    if constexpr (S == 1) {
      return q;
    } else {
      const int hy = q / W, hx = q - hy * W;
      return hy * W + ((hx & 1) ? (W + 1) / 2 + (hx >> 1) : (hx >> 1));
    }
  }
  // the stored row of tap (ky, kx)'s input for output pixel (0, 0) of the tile
  static __device__ __forceinline__ int tap_row(int ky, int kx) {
    if constexpr (S == 1) return D * (ky * W + kx);
    else return ky * W + ((kx & 1) ? (W + 1) / 2 : (kx >> 1));
  }
  static __device__ __forceinline__ void sources(const TcArgs& a, const TileAt& at, int wt, int (&p)[R]) {
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int e = (wt >> 3) + 16 * k;
      p[k] = e < ROWS ? halo_source<S, D>(a, at, e) : -1;
    }
  }
  // cp.async of input channels [c0, c0 + TcElem<T>::kChunk) (one 128-byte row) of this thread's rows
  // (x: [pixels][cin]) into the buffer at `hb`; the caller commits
  template <typename T>
  static __device__ __forceinline__ void copy(const T* x, int cin, int c0, uint32_t hb, int wt, const int (&p)[R]) {
    const int wj = wt & 7;
    const T* xc = x + c0 + wj * TcElem<T>::kVec;
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int e = (wt >> 3) + 16 * k;
      if (e < ROWS) {
        const int r = slot(e);
        cp_async16(swizzled_piece(hb, r, wj), p[k] >= 0 ? xc + (size_t)p[k] * cin : x, p[k] >= 0);
      }
    }
  }
  // TF32: rounds the pieces that this thread copied into the buffer at `hb` to nearest (round_tf32),
  // once they have landed; the caller's barrier publishes them
  static __device__ __forceinline__ void round(uint32_t hb, int wt) {
    const int wj = wt & 7;
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int e = (wt >> 3) + 16 * k;
      if (e < ROWS) {
        const int r = slot(e);
        round_tf32(swizzled_piece(hb, r, wj));
      }
    }
  }
};

template <int S, int TPB, int NW, int NT, int D = 1>
struct Conv3Cfg {
  static constexpr int WARPS = TPB * NW;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int BN = NW * NT * 8;
  static constexpr int TAB = TPB * Halo<S, D>::PIX + TPB;  // ints per table: halo sources + row masks
  static constexpr int HALO_BYTES = (TPB * Halo<S, D>::PIX * 128 + 1023) / 1024 * 1024;  // one buffer
  static constexpr int W_BYTES = BN * 128;
  static constexpr int TAB_BYTES = 2 * TAB * 4;
  static int smem(int slots) { return 2 * HALO_BYTES + slots * W_BYTES + TAB_BYTES + 1024; }
};

// Prefetch distance in stages of conv3x3_tc_kernel: mma.sync 2; wgmma 1 in the coarse launch (two
// blocks of two tiles per multiprocessor), 3 in the fine one (one tile per block: few tiles, whose
// stages would otherwise each wait for their weight slice). Weight slots: prefetch + 1, and one more
// for wgmma's group in flight (see wgmma_chunk).
constexpr int conv3x3_prefetch(bool wg, bool fine) { return wg ? (fine ? 3 : 1) : 2; }
constexpr int conv3x3_weight_slots(bool wg, bool fine) { return conv3x3_prefetch(wg, fine) + (wg ? 2 : 1); }

__device__ __forceinline__ void cp_async_wait_dyn(int pending) {
  switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    default: cp_async_wait<5>(); break;
  }
}

// One k16 step of a warp: A rows of the 4 m16 tiles (skipped where bit i of `rp` is clear), then
// per n16 pair its B fragments and the MMAs.
template <typename T, int NT>
__device__ __forceinline__ void kstep(float (&acc)[4][NT][4], const uint32_t (&a_addr)[4], uint32_t b_addr0,
                                      int rp) {
  uint32_t a[4][4];
  if constexpr (NT <= 4) {  // registers to spare: skip the m16 tiles of inactive row pairs
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (rp & (1 << i)) ldsm_x4(a[i], a_addr[i]);
#pragma unroll
    for (int jj = 0; jj < NT / 2; ++jj) {
      uint32_t b[4];
      ldsm_x4(b, b_addr0 + jj * 16 * 128);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (rp & (1 << i)) {
          Mma<T>::run(acc[i][2 * jj], a[i], b[0], b[1]);
          Mma<T>::run(acc[i][2 * jj + 1], a[i], b[2], b[3]);
        }
      }
    }
  } else {  // NT = 8: 128 accumulators, no room for predication
#pragma unroll
    for (int i = 0; i < 4; ++i) ldsm_x4(a[i], a_addr[i]);
#pragma unroll
    for (int jj = 0; jj < NT / 2; ++jj) {
      uint32_t b[4];
      ldsm_x4(b, b_addr0 + jj * 16 * 128);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        Mma<T>::run(acc[i][2 * jj], a[i], b[0], b[1]);
        Mma<T>::run(acc[i][2 * jj + 1], a[i], b[2], b[3]);
      }
    }
  }
}

// One k16 step of a warp of the 3x3 kernel: as kstep, with B fragments double buffered across n16
// pairs. FULL: all four m16 tiles are active (rp == 0xF), so the step has no predicates and no
// branches (the common case of dense regions; per-tile predication otherwise costs more
// instructions than the MMAs themselves). In conv3x3_tc_kernel, per-stage scalar work is a few
// instructions: stage indices are counters (no divisions), producer offsets are precomputed and
// the prefetch depth is a constant 2.
template <typename T, int NT, bool FULL>
__device__ __forceinline__ void kstep3(float (&acc)[4][NT][4], const uint32_t (&a_addr)[4], uint32_t b_addr0,
                                       int rp) {
  constexpr bool PRED = !FULL && NT <= 4;  // NT = 8: no registers to spare for skipping tiles
  uint32_t a[4][4];
  uint32_t b[2][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (!PRED || (rp & (1 << i))) ldsm_x4(a[i], a_addr[i]);
  ldsm_x4(b[0], b_addr0);
#pragma unroll
  for (int jj = 0; jj < NT / 2; ++jj) {
    if (jj + 1 < NT / 2) ldsm_x4(b[(jj + 1) & 1], b_addr0 + (jj + 1) * 16 * 128);
    const uint32_t(&bb)[4] = b[jj & 1];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (!PRED || (rp & (1 << i))) {
        Mma<T>::run(acc[i][2 * jj], a[i], bb[0], bb[1]);
        Mma<T>::run(acc[i][2 * jj + 1], a[i], bb[2], bb[3]);
      }
    }
  }
}

// K steps 0 .. KS - 1 of one 64-channel chunk by a warpgroup, committed as one wgmma group:
// acc[0] / acc[1] (the two n halves of its m64nNk16) += A[64 x 16 KS] (tile at sa, 8-row groups
// a_stride bytes apart) * B[16 KS x N] (dense tile at sb), both K-major 128-byte swizzled rows.
// Returns with this group still running and the previous one done (its shared memory free), or,
// when `drain`, with both done and the accumulators final. Stages therefore need one more
// shared-memory slot than their prefetch distance + 1: the slot refilled at stage s + 1 is that of
// stage s - 1.
template <typename T, int N, int KS>
__device__ __forceinline__ void wgmma_chunk(float (&acc)[2][N / 16][4], uint32_t sa, uint32_t a_stride, uint32_t sb,
                                            bool drain) {
  wgmma_fence();
  const uint64_t da = wgmma_desc(sa, a_stride), db = wgmma_desc(sb);
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
    Wgmma<T, N>::run(acc[0], acc[1], wgmma_desc_add(da, ks * 32), wgmma_desc_add(db, ks * 32));
  wgmma_commit();
  if (drain) {
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
  } else {
    wgmma_wait<1>();
  }
}

// wgmma_chunk for a run-time step count 1..4 (one straight sequence per count: a run-time bound
// inside one sequence makes ptxas fence every wgmma). A whole chunk (full_k: C_in % 64 == 0, so
// every chunk has 4 steps) keeps one group in flight; partial chunks drain every stage (a group
// in flight across the branches makes ptxas serialize all wgmmas). Callers drain (wgmma_wait<0>,
// wgmma_fence_operands) before reading the accumulators: a drain inside a branch here would
// also make ptxas serialize them.
template <typename T, int N>
__device__ __forceinline__ void wgmma_chunk(float (&acc)[2][N / 16][4], bool full_k, int ksteps, uint32_t sa,
                                            uint32_t a_stride, uint32_t sb) {
  if (full_k) {
    wgmma_chunk<T, N, 4>(acc, sa, a_stride, sb, false);
    return;
  }
  switch (ksteps) {
    case 4: wgmma_chunk<T, N, 4>(acc, sa, a_stride, sb, true); break;
    case 3: wgmma_chunk<T, N, 3>(acc, sa, a_stride, sb, true); break;
    case 2: wgmma_chunk<T, N, 2>(acc, sa, a_stride, sb, true); break;
    default: wgmma_chunk<T, N, 1>(acc, sa, a_stride, sb, true); break;
  }
}

// The CTAs that share an item's K (a tile of the fine 3x3 launch, 128 rows of the gathered-rows
// GEMM) in clusters of kc CTAs, for `jobs` (item, output-channel block) pairs on `sms`
// multiprocessors: 4 up to a quarter of a job per multiprocessor, 2 up to one, else 1 (H200,
// 2026-11-22: benchmarks/results/fine_ksplit_ab.txt).
__host__ __device__ inline int k_split_ctas(int kc, int64_t jobs, int sms) {
  return kc >= 4 && 4 * jobs <= sms ? 4 : (kc >= 2 && jobs <= sms ? 2 : 1);
}

// CTAs along x for a launch in clusters of `cluster` CTAs whose items (at most `slots`) the kernel
// may split with k_split_ctas: at least `gx` (the launch's grid without a split), a slot per item
// at whichever split the kernel chooses, and a whole number of clusters. The split's largest CTA
// counts are at the largest item counts of split 2 and 4.
inline int64_t k_split_grid(int64_t gx, int64_t slots, int cluster, int nb, int sms) {
  for (const int64_t c : {std::min<int64_t>(slots, sms / nb), std::min<int64_t>(slots, sms / (4 * nb))})
    gx = std::max<int64_t>(gx, c * k_split_ctas(cluster, c * nb, sms));
  return (gx + cluster - 1) / cluster * cluster;
}

template <typename T, int S, int TPB, int NW, int NT, bool FINE, int D, bool WG>
__global__ void __launch_bounds__(32 * TPB * NW, WG ? 2 : 1) conv3x3_tc_kernel(const TcArgs a) {
  grid_dependency_sync();
  using Cfg = Conv3Cfg<S, TPB, NW, NT, D>;
  using HL = Halo<S, D>;
  // WG (sm_90a, stride 1): the NW = 4 warps of a tile are a warpgroup issuing m64n(BN)k16 wgmma
  // with A straight from the halo (the 8 pixels of an output row are consecutive halo rows; rows
  // HL::W apart); warp w holds tile rows 2w, 2w + 1, acc[h] = channels h * BN / 2 .. + BN / 2.
  constexpr bool kWg = WG && DC_HAS_WGMMA != 0;
  static_assert(!WG || (S == 1 && NW == 4), "wgmma: stride 1, a warpgroup per tile");
  if constexpr (WG && !kWg) __trap();  // a pass without wgmma: the host launches WG only on sm_90a builds
  using E = TcElem<T>;
  constexpr int THREADS = Cfg::THREADS;
  constexpr int PIXT = TPB * HL::PIX;
  constexpr int P = conv3x3_prefetch(kWg, FINE);  // prefetch distance in stages
  constexpr int WS = conv3x3_weight_slots(kWg, FINE);
  constexpr int WPT = Cfg::BN * 8 / THREADS;  // 16-byte weight pieces per thread per stage
  constexpr int WROWSTEP = THREADS / 8;
  static_assert(Cfg::BN * 8 % THREADS == 0 && THREADS % 64 == 0, "producer layout");
  extern __shared__ __align__(128) unsigned char smem[];

  const int listed = *a.count;
  // this launch's tiles: [first, first + count) of the listed ones (coarse_tile_end)
  const int all_tiles = split_tile_count(a);
  const int coarse_end = coarse_tile_end(a, all_tiles);
  const int first = FINE ? coarse_end : 0;
  const int count = (FINE ? all_tiles : coarse_end) - first;
  if (count <= 0) return;
  const ConvGeom& g = a.g;
  const int ngroups = (count + TPB - 1) / TPB;
  // the fine launch (few tiles) spreads its blocks with work over the multiprocessors (block_work);
  // the coarse one keeps block-index order: ranks held in registers through its main loop cost
  // its wide instantiations 2 % where all blocks are busy, and reread from shared memory 4 % for
  // C = 64 (H200, 2026-11-22; benchmarks/results/block_spread_ab.txt)
  // K split of the fine launch (Hopper): it may run in clusters of kc CTAs along x (run_tc_3x3), and
  // then `ks` consecutive CTAs share a tile (slot x / ks): CTA x computes the input chunks
  // [chunk_lo, chunk_hi), a 1 / ks share of K, and CTA x - x % ks adds the others' partial sums
  // (cluster_reduce_acc) and stores the tile. With one tile per block its chain of stages is 1 / ks
  // as long, so the split pays while the CTAs stay few (k_split_ctas). Chosen from the device-side
  // count, the same for every CTA; the sum never depends on which CTA finishes first.
  const int kc = FINE ? cluster_size() : 1;
  const int ks = FINE ? k_split_ctas(kc, (int64_t)count * gridDim.y, a.sms) : 1;
  const int gxs = (int)gridDim.x / ks;  // slots of the launch
  if (FINE && a.k_split != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *a.k_split = ks;
  // split: the slots stay in block-index order, so that the CTAs with work fill whole clusters (a
  // CTA without work in a cluster with work waits in cluster_idle(), holding its place on the
  // multiprocessor); no split: no cluster barrier, ranks as without clusters
  BlockWork bw{(int)blockIdx.x / ks, (int)blockIdx.y};
  if constexpr (FINE) {
    if (ks == 1) bw = block_work(a.spread, ngroups);
  }
  if (bw.slot >= ngroups) {  // no tile: a cluster with tiles in other CTAs waits for them, others exit
    if (ks > 1 && ((int)blockIdx.x - (int)blockIdx.x % kc) / ks < ngroups) cluster_idle();
    return;
  }
  const int my_groups = (ngroups - 1 - bw.slot) / gxs + 1;
  if (ks > 1 && my_groups > 1) __trap();  // run_tc_3x3 launches a slot per tile at every split
  const int Cin = g.Cin;
  const int nchunks = (Cin + E::kChunk - 1) / E::kChunk;
  const int krank = FINE ? (int)blockIdx.x % ks : 0;
  const int chunk_lo = FINE ? nchunks * krank / ks : 0;
  const int chunk_hi = FINE ? nchunks * (krank + 1) / ks : nchunks;
  const int total = my_groups * (chunk_hi - chunk_lo) * 9;
  const int n0 = bw.nblk * Cfg::BN;

  const T* __restrict__ x = static_cast<const T*>(a.x);
  const T* __restrict__ w = static_cast<const T*>(a.w);
  const uint32_t halo_s = (smem_u32(smem) + 1023u) & ~1023u;  // wgmma: 1024-byte aligned swizzle
  const uint32_t w_s = halo_s + 2 * Cfg::HALO_BYTES;
  int* tab_s = reinterpret_cast<int*>(smem + (halo_s - smem_u32(smem)) + 2 * Cfg::HALO_BYTES + WS * Cfg::W_BYTES);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int slot = warp / NW;
  const int nw = warp % NW;

  // per group: input pixel of every halo row (-1: zero) and row mask of every tile -> table gi & 1
  auto prep = [&](int gi) {
    const int grp = bw.slot + gi * gxs;
    int* tab = tab_s + (gi & 1) * Cfg::TAB;
#pragma unroll
    for (int k = 0; k < (PIXT + THREADS - 1) / THREADS; ++k) {
      const int e = tid + k * THREADS;
      if (e < PIXT) {
        const int sl = e / HL::PIX;
        const int q = e - sl * HL::PIX;
        const int t = grp * TPB + sl;
        tab[e] = t < count ? halo_source<S, D>(a, tile_at(split_tile_entry(a, listed, first + t, 0), g), q) : -1;
      }
    }
    if (tid < TPB) {
      const int t = grp * TPB + tid;
      tab[PIXT + tid] = t < count ? split_tile_entry(a, listed, first + t, 1) : 0;
    }
  };

  // ---- producer constants: this thread always copies 16-byte piece wj of its rows
  const int wj = tid & 7;
  const int wrow0 = tid >> 3;
  const uint32_t wdst0 = swizzled_piece(0, wrow0, wj);  // (row + k * WROWSTEP) & 7 == row & 7
  const int woff0 = (n0 + wrow0) * 9 * Cin + wj * E::kVec;
  const int wkstep = WROWSTEP * 9 * Cin;
  unsigned wco_ok = 0;
#pragma unroll
  for (int k = 0; k < WPT; ++k)
    if (n0 + wrow0 + k * WROWSTEP < g.Cout) wco_ok |= 1u << k;

  // producer state: the stage to issue next
  int i_tap = 0, i_chunk = chunk_lo, i_gi = 0, i_ws = 0, i_hpar = 0, i_c0 = chunk_lo * E::kChunk, i_woff = i_c0;
  auto issue = [&]() {
    const bool ci_ok = i_c0 + wj * E::kVec < Cin;
    if (i_tap == 0) {
      const uint32_t hb = halo_s + i_hpar * Cfg::HALO_BYTES;
      const int* tab = tab_s + (i_gi & 1) * Cfg::TAB;
      const T* xc = x + i_c0 + wj * E::kVec;
#pragma unroll 4
      for (int e = tid >> 3; e < PIXT; e += WROWSTEP) {
        const int p = tab[e];
        const bool v = ci_ok && p >= 0;
        cp_async16(swizzled_piece(hb, e, wj, HL::swz(e)), v ? xc + (size_t)p * Cin : x, v);
      }
    }
    const uint32_t wb = w_s + i_ws * Cfg::W_BYTES + wdst0;
    const T* wsrc = w + (woff0 + i_woff);
#pragma unroll
    for (int k = 0; k < WPT; ++k) {
      const bool v = ci_ok && ((wco_ok >> k) & 1u);
      cp_async16(wb + k * WROWSTEP * 128, v ? wsrc + k * wkstep : w, v);
    }
  };
  auto advance_issue = [&]() {
    ++i_tap;
    i_woff += Cin;
    if (i_tap == 9) {
      i_tap = 0;
      i_hpar ^= 1;
      i_c0 += E::kChunk;
      if (++i_chunk == chunk_hi) {
        i_chunk = chunk_lo;
        i_c0 = chunk_lo * E::kChunk;
        ++i_gi;
      }
      i_woff = i_c0;
    }
    i_ws = i_ws == WS - 1 ? 0 : i_ws + 1;
  };

  // ---- consumer constants
  const int abase = slot * HL::PIX + ((lane >> 3) & 1) * S * HL::W + (lane & 7) * S;
  const int ka = lane >> 4;
  const uint32_t bbase = (nw * NT * 8 + (lane & 7) + ((lane >> 4) << 3)) * 128;
  const int bx = ((lane >> 3) & 1) ^ (lane & 7);

  float acc[kWg ? 2 : 4][kWg ? 2 * NT : NT][4];
  zero_acc(acc);

  prep(0);
  __syncthreads();
#pragma unroll
  for (int s = 0; s < P; ++s) {
    if (s < total) issue();
    cp_async_commit();
    advance_issue();
  }

  // consumer state: the stage to compute
  int c_ws = 0, c_hpar = 0;
  int s = 0;  // flattened stage index

#pragma unroll 1
  for (int c_gi = 0; c_gi < my_groups; ++c_gi) {
    int rm = 0, rp = 0;
#pragma unroll 1
    for (int c_chunk = chunk_lo; c_chunk < chunk_hi; ++c_chunk) {
      const int c_ksteps = min(4, (Cin - c_chunk * E::kChunk + E::kStep - 1) / E::kStep);
#pragma unroll 1
      for (int c_tap = 0; c_tap < 9; ++c_tap, ++s) {
        cp_async_wait<P - 1>();
        if (rounds_input<T>(g)) {  // TF32: this thread's pieces of the halo (round_tf32)
          if (c_tap == 0) {
            const uint32_t hb = halo_s + c_hpar * Cfg::HALO_BYTES;
            for (int e = tid >> 3; e < PIXT; e += WROWSTEP) round_tf32(swizzled_piece(hb, e, wj, HL::swz(e)));
          }
        }
        if constexpr (kWg) fence_proxy_async();
        __syncthreads();
        if (s + P < total) {
          // the table of the next group is needed by the stage after this one
          if (i_tap == 8 && i_chunk == chunk_hi - 1 && i_gi + 1 < my_groups) prep(i_gi + 1);
          issue();
        }
        cp_async_commit();
        advance_issue();

        if (c_tap == 0 && c_chunk == chunk_lo) {
          rm = tab_s[(c_gi & 1) * Cfg::TAB + PIXT + slot];  // output row mask of this warp's tile
          rp = ((rm & 0x03) ? 1 : 0) | ((rm & 0x0c) ? 2 : 0) | ((rm & 0x30) ? 4 : 0) | ((rm & 0xc0) ? 8 : 0);
        }

        if constexpr (kWg) {
          const int ky = c_tap >= 6 ? 2 : (c_tap >= 3 ? 1 : 0);
          const int c_toff = D * (ky * (HL::W - 3) + c_tap);  // (ky * W + kx) * D
          const uint32_t sa = halo_s + c_hpar * Cfg::HALO_BYTES + (slot * HL::PIX + c_toff) * 128;
          wgmma_chunk<T, Cfg::BN>(acc, Cin % E::kChunk == 0, c_ksteps, sa, HL::W * 128, w_s + c_ws * Cfg::W_BYTES);
        } else if (rp != 0) {
          const int ky = c_tap >= 6 ? 2 : (c_tap >= 3 ? 1 : 0);
          const int c_toff = D * (ky * (HL::W - 3) + c_tap);  // (ky * W + kx) * D
          const uint32_t hb = halo_s + c_hpar * Cfg::HALO_BYTES;
          const uint32_t wb = w_s + c_ws * Cfg::W_BYTES + bbase;
          uint32_t arow[4];
          int ax[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int e = abase + c_toff + 2 * i * S * HL::W;
            arow[i] = hb + e * 128;
            ax[i] = ka ^ HL::swz(e);
          }
          auto step = [&](auto full, int ks) {
            uint32_t aaddr[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) aaddr[i] = arow[i] + (((ks << 1) ^ ax[i]) << 4);
            kstep3<T, NT, decltype(full)::value>(acc, aaddr, wb + (((ks << 1) ^ bx) << 4), rp);
          };
          if (rp == 0xF && c_ksteps == 4) {  // warp-uniform: a whole tile, a whole chunk
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) step(std::true_type{}, ks);
          } else {
#pragma unroll
            for (int ks = 0; ks < 4; ++ks)
              if (ks < c_ksteps) step(std::false_type{}, ks);
          }
        }
        c_ws = c_ws == WS - 1 ? 0 : c_ws + 1;
      }
      c_hpar ^= 1;
    }

    // group done: epilogue
    if constexpr (kWg) {
      wgmma_wait<0>();
      wgmma_fence_operands(acc);
    }
    if constexpr (FINE) {
      if (ks > 1) {  // one group per block: the halo and weight ring are free once drained
        static_assert(sizeof(acc) * THREADS <= 2 * Cfg::HALO_BYTES + WS * Cfg::W_BYTES, "exchange buffer");
        cp_async_wait<0>();
        __syncthreads();
        cluster_reduce_acc<THREADS>(acc, halo_s, ks);
      }
    }
    const int grp = bw.slot + c_gi * gxs;
    const int t = grp * TPB + slot;
    if (t < count && krank == 0) {
      const int tile = split_tile_entry(a, listed, first + t, 0);
      if constexpr (kWg) store_tile<T, 2 * NT>(a, tile, rm, n0, acc, warp & 3, 0, Cfg::BN / 2);
      else if constexpr (!WG) store_tile<T, NT>(a, tile, rm, n0 + nw * NT * 8, acc);
    }
    zero_acc(acc);
  }
  cp_async_wait<0>();
}

// ---------------------------------------------------------------- 1x1 and general (gathered rows)
constexpr int kMaxTaps = 32;  // tap paths: per-row tap validity bits
enum GatherRows : int { kRows1x1 = 0, kRowsTiles = 1, kRowsPixels = 2 };

// Output coordinates of GEMM row l of a tap path; false when the row has no output pixel.
template <int ROWS>
__device__ __forceinline__ bool gather_row(const int* __restrict__ list, int count, const ConvGeom& g, int l, int& n,
                                           int& oh, int& ow) {
  if constexpr (ROWS == kRowsTiles) {
    const int t = l / TILE_PIX;
    if (t >= count) return false;
    const TileAt at = tile_at(list[1 + t], g);
    const int p = l - t * TILE_PIX;
    n = at.n;
    oh = at.oh0 + p / TILE_W;
    ow = at.ow0 + p % TILE_W;
    return oh < g.Ho && ow < g.Wo;
  } else {
    if (l >= count) return false;
    const int pix = list[1 + l];
    ow = pix % g.Wo;
    const int t = pix / g.Wo;
    oh = t % g.Ho;
    n = t / g.Ho;
    return true;
  }
}

// WG: two warpgroups (8 warps), one per 64-row half, each issuing m64n(BN)k16 wgmma; otherwise
// 2 x NW warps of 64 rows x NT * 8 channels issuing mma.sync.
template <int NW, int NT, bool WG>
struct Conv1Cfg {
  static constexpr int BM = 128;
  static constexpr int WARPS = WG ? 8 : 2 * NW;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int BN = NW * NT * 8;
  static constexpr int A_BYTES = BM * 128;
  static constexpr int B_BYTES = BN * 128;
  static constexpr int STAGE = A_BYTES + B_BYTES;
  static constexpr int RPT = BM * 8 / THREADS;  // A rows loaded per thread per stage
  // + 1024: the stages start 1024-byte aligned (wgmma's 128-byte swizzle)
  static int smem(int slots) { return slots * STAGE + 1024; }
};

template <typename T, int NW, int NT, int ROWS, bool WG>
__global__ void __launch_bounds__(Conv1Cfg<NW, NT, WG>::THREADS) conv_gather_tc_kernel(const TcArgs a) {
  grid_dependency_sync();
  constexpr bool TAPS = ROWS != kRows1x1;
  using Cfg = Conv1Cfg<NW, NT, WG>;
  // WG (sm_90a): warpgroup wg = warp / 4 computes rows wg * 64 .. + 63 of the item, one
  // m64n(BN)k16 per k16 step; warp w holds rows 16 w .. 16 w + 15 of the item, acc[i][j] =
  // channels i * NT * 8 + 8 j (i: the two n halves). Otherwise (mma.sync) warp (wm, nw) computes
  // rows wm * 64 + 16 i (i < 4), channels nw * NT * 8 + 8 j.
  constexpr bool kWg = WG && DC_HAS_WGMMA != 0;
  constexpr int MI = kWg ? 2 : 4;
  static_assert(!WG || NW == 2, "wgmma: BN = 2 * NT * 8 = one instruction's N");
  if constexpr (WG && !kWg) __trap();  // a pass without wgmma: the host launches WG only on sm_90a builds
  using E = TcElem<T>;
  constexpr int BM = Cfg::BM;
  constexpr int THREADS = Cfg::THREADS;
  constexpr int RSTEP = THREADS / 8;
  extern __shared__ __align__(128) unsigned char smem[];

  // listed pixels or tiles (kRowsTiles). The host always sets a.count; without the list[0] fallback
  // nvcc 13.0 allocates this kernel's registers differently (74-120 against 76-116) and it ran 2-5 %
  // slower in whole models (H200, 2026-11-21 23:02 UTC, profile_model.py A/B), so it stays.
  const int count = a.count != nullptr ? *a.count : a.list[0];
  if (ROWS == kRowsPixels && count < a.split_min) return;  // the 3x3 kernel takes these tiles
  const int rows = ROWS == kRowsTiles ? count * TILE_PIX : count;  // GEMM rows
  const int items = (rows + BM - 1) / BM;
  // K split (Hopper), as in conv3x3_tc_kernel's fine launch: in clusters of kc CTAs along x (see
  // run_tc_gather), ks consecutive CTAs share an item (slot x / ks) while the (item, channel block)
  // jobs are few (k_split_ctas); CTA x runs the input chunks [ch_lo, ch_lo + nch_k) and CTA
  // x - x % ks adds the others' partial sums before the epilogue. Without a split: as before.
  const int kc = cluster_size();
  const int ks = k_split_ctas(kc, (int64_t)items * gridDim.y, a.sms);
  const int slot = (int)blockIdx.x / ks;
  const int gxs = (int)gridDim.x / ks;  // slots of the launch
  if (slot >= items) {  // no item: a cluster with items in other CTAs waits for them, others exit
    if (ks > 1 && ((int)blockIdx.x - (int)blockIdx.x % kc) / ks < items) cluster_idle();
    return;
  }
  if (a.k_split != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *a.k_split = ks;
  const ConvGeom& g = a.g;
  const int my_items = (items - 1 - slot) / gxs + 1;
  if (ks > 1 && my_items > 1) __trap();  // run_tc_gather launches a slot per item at every split
  const int nch = (g.Cin + E::kChunk - 1) / E::kChunk;
  const int krank = (int)blockIdx.x % ks;
  const int ch_lo = nch * krank / ks;
  const int nch_k = nch * (krank + 1) / ks - ch_lo;  // this CTA's chunks
  const int KK = TAPS ? g.KH * g.KW : 1;
  const int per_item = KK * nch_k;  // stages per item
  const int total = my_items * per_item;
  const int n0 = blockIdx.y * Cfg::BN;
  const int HWo = g.Ho * g.Wo;
  const int P = a.prefetch;
  const int wslots = P + (kWg ? 2 : 1);  // wgmma: one group in flight (see wgmma_chunk)

  const T* __restrict__ x = static_cast<const T*>(a.x);
  const T* __restrict__ w = static_cast<const T*>(a.w);
  const int* __restrict__ list = a.list;
  const int* __restrict__ srcs = a.list + 1 + (size_t)a.cap;  // input pixel per slot, -1: zero
  const uint32_t s_base = (smem_u32(smem) + 1023u) & ~1023u;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp / NW;
  const int nw = warp % NW;
  const int jl = tid & 7;   // the 16-byte chunk this thread loads
  const int r0 = tid >> 3;  // first A row this thread loads

  // per loaded row: 1x1: its input pixel (-1: zero); TAPS: the input pixel of tap (0, 0) when in
  // range ((n * H + ih) * W + iw, computed per tap from ih / iw) and which taps read an active pixel
  int src[Cfg::RPT];
  int rih[TAPS ? Cfg::RPT : 1], riw[TAPS ? Cfg::RPT : 1], rn[TAPS ? Cfg::RPT : 1];
  uint32_t rtaps[TAPS ? Cfg::RPT : 1];
  int src_item = -1;
  // 1x1: the next item's input pixels, loaded one item ahead so that their global-load latency
  // overlaps this item's MMAs instead of stalling the producer
  int src_next[TAPS ? 1 : Cfg::RPT];
  auto load_srcs = [&](int it, int (&dst)[TAPS ? 1 : Cfg::RPT]) {
    const int item = slot + it * gxs;
#pragma unroll
    for (int k = 0; k < (TAPS ? 1 : Cfg::RPT); ++k) {
      const int l = item * BM + r0 + k * RSTEP;
      dst[k] = l < count ? srcs[l] : -1;
    }
  };
  if constexpr (!TAPS) load_srcs(0, src_next);

  auto issue = [&](int s) {
    const int it = s / per_item;
    const int rem = s - it * per_item;
    const int tap = TAPS ? rem / nch_k : 0;
    const int ch = ch_lo + rem - tap * nch_k;
    const int item = slot + it * gxs;
    if (it != src_item) {
      src_item = it;
#pragma unroll
      for (int k = 0; k < Cfg::RPT; ++k) {
        const int l = item * BM + r0 + k * RSTEP;
        if constexpr (TAPS) {
          rtaps[k] = 0;
          rn[k] = 0;
          rih[k] = riw[k] = 0;
          int n, oh, ow;
          if (gather_row<ROWS>(list, count, g, l, n, oh, ow)) {
            rn[k] = n;
            rih[k] = oh * g.sh - g.ph;
            riw[k] = ow * g.sw - g.pw;
            const bool* mn = a.mask + (size_t)n * g.H * g.W;
            for (int q = 0; q < KK; ++q) {
              const int ky = q / g.KW;
              const int ih = rih[k] + ky * g.dh, iw = riw[k] + (q - ky * g.KW) * g.dw;
              if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W && mn[ih * g.W + iw]) rtaps[k] |= 1u << q;
            }
          }
        }
      }
      if constexpr (!TAPS) {  // items are issued in order: the prefetched sources are this item's
#pragma unroll
        for (int k = 0; k < Cfg::RPT; ++k) src[k] = src_next[k];
        if (it + 1 < my_items) load_srcs(it + 1, src_next);
      }
    }
    if constexpr (TAPS) {
      const int ky = tap / g.KW;
      const int dy = ky * g.dh, dx = (tap - ky * g.KW) * g.dw;
#pragma unroll
      for (int k = 0; k < Cfg::RPT; ++k)
        src[k] = (rtaps[k] >> tap) & 1 ? (rn[k] * g.H + rih[k] + dy) * g.W + riw[k] + dx : -1;
    }
    const uint32_t sa = s_base + (s % wslots) * Cfg::STAGE;
    const uint32_t sb = sa + Cfg::A_BYTES;
    const int c0 = ch * E::kChunk;
    const int ci = c0 + jl * E::kVec;
#pragma unroll
    for (int k = 0; k < Cfg::RPT; ++k) {
      const int r = r0 + k * RSTEP;
      const bool v = src[k] >= 0 && ci < g.Cin;
      cp_async16(swizzled_piece(sa, r, jl), v ? x + (size_t)src[k] * g.Cin + ci : x, v);
    }
    // 1x1 with one chunk of C_in: every stage's weight slice is the same, so each slot keeps the
    // one it got on its first use
    if (!TAPS && nch == 1 && s >= wslots) return;
#pragma unroll
    for (int k = 0; k < (Cfg::BN * 8 + THREADS - 1) / THREADS; ++k) {
      const int idx = tid + k * THREADS;
      if (Cfg::BN * 8 % THREADS == 0 || idx < Cfg::BN * 8) {
        const int nn = idx >> 3;
        const int j = idx & 7;
        const int co = n0 + nn;
        const int cw = c0 + j * E::kVec;
        const bool v = co < g.Cout && cw < g.Cin;
        cp_async16(swizzled_piece(sb, nn, j), v ? w + ((size_t)co * KK + tap) * g.Cin + cw : w, v);
      }
    }
  };

  const int arow = wm * 64 + (lane & 15);
  const int ka = lane >> 4;
  const int kb = (lane >> 3) & 1;
  const int brow = nw * NT * 8 + (lane & 7) + ((lane >> 4) << 3);
  const int aswz = lane & 7;  // == (arow + 16 i) & 7
  const int bswz = lane & 7;

  float acc[MI][NT][4];
  zero_acc(acc);
  int opix[MI][2];  // per m16 tile and row half: the output pixel this lane stores (-1: none)
  // the epilogue of an item: acc -> a.y at opix, + the bias on key streams
  auto store_rows = [&](const int (&pix_of)[MI][2]) {
    const T* bias = static_cast<const T*>(a.bias);
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      const int c0 = n0 + (kWg ? i : nw) * NT * 8;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int pix = pix_of[i][h];
        const bool add_bias = bias != nullptr && pix >= 0 && key_of(a.key, pix / HWo);
        T* yp = pix >= 0 ? static_cast<T*>(a.y) + (size_t)pix * g.Cout : nullptr;
        store_pixel<T, NT>(yp, bias, add_bias, c0, g.Cout, acc[i], h);
      }
    }
  };

#pragma unroll 1
  for (int s = 0; s < P; ++s) {
    if (s < total) issue(s);
    cp_async_commit();
  }

#pragma unroll 1
  for (int s = 0; s < total; ++s) {
    cp_async_wait_dyn(P - 1);
    if (rounds_input<T>(a.g)) {  // TF32: this thread's pieces of the input rows (round_tf32)
      const uint32_t sa = s_base + (s % wslots) * Cfg::STAGE;
#pragma unroll
      for (int k = 0; k < Cfg::RPT; ++k) {
        const int r = r0 + k * RSTEP;
        round_tf32(swizzled_piece(sa, r, jl));
      }
    }
    if constexpr (kWg) fence_proxy_async();
    __syncthreads();
    if (s + P < total) issue(s + P);
    cp_async_commit();

    const int it = s / per_item;
    const int rem = s - it * per_item;
    const int ch = ch_lo + rem % nch_k;
    const int ksteps = min(4, (g.Cin - ch * E::kChunk + E::kStep - 1) / E::kStep);
    const uint32_t sa = s_base + (s % wslots) * Cfg::STAGE;
    const uint32_t sb = sa + Cfg::A_BYTES;
    const int item = slot + it * gxs;
    const int rows_left = rows - item * BM - wm * 64;  // valid rows of this warp's 64
    const int rp = (rows_left > 0 ? 1 : 0) | (rows_left > 16 ? 2 : 0) | (rows_left > 32 ? 4 : 0) |
                   (rows_left > 48 ? 8 : 0);

    // output pixel of each row this lane stores (-1: none), read before the MMAs so that the
    // list's global-load latency overlaps them
    const bool last = rem == per_item - 1;
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int l = item * BM + (kWg ? warp * 16 : wm * 64 + i * 16) + (lane >> 2) + 8 * h;
        int pix = -1;
        if (last) {
          if constexpr (ROWS == kRowsTiles) {
            int n, oh, ow;
            if (gather_row<ROWS>(list, count, g, l, n, oh, ow)) pix = (n * g.Ho + oh) * g.Wo + ow;
          } else if (l < count) {  // the listed output pixel
            pix = list[1 + l];
          }
        }
        opix[i][h] = pix;
      }
    }

    if constexpr (kWg) {
      wgmma_chunk<T, Cfg::BN>(acc, g.Cin % E::kChunk == 0, ksteps, sa + (warp >> 2) * 64 * 128, 1024, sb);
    } else if (rp != 0) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        if (ks < ksteps) {
          uint32_t aaddr[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) aaddr[i] = sa + (arow + i * 16) * 128 + ((((ks << 1) | ka) ^ aswz) << 4);
          kstep<T, NT>(acc, aaddr, sb + brow * 128 + ((((ks << 1) | kb) ^ bswz) << 4), rp);
        }
      }
    }

    if (last && ks == 1) {
      if constexpr (kWg) {
        wgmma_wait<0>();
        wgmma_fence_operands(acc);
      }
      store_rows(opix);
      zero_acc(acc);
    }
  }
  cp_async_wait<0>();
  if (ks > 1) {  // one item per block, its epilogue after the loop: the stage ring (>= the
    // accumulators: run_tc_gather) is free once drained
    if constexpr (kWg) {
      wgmma_wait<0>();
      wgmma_fence_operands(acc);
    }
    __syncthreads();
    cluster_reduce_acc<THREADS>(acc, s_base, ks);
    if (krank == 0) store_rows(opix);
  }
}

}  // namespace tc
}  // namespace conv
}  // namespace deltaconv
