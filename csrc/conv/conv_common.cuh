// Shared pieces of the convolution / pooling kernels (ATen-free): element conversions, the
// geometry of a convolution, and the two "where is work" kernels that every conv path starts with.
//
// Sparse execution model of the conv family
// -----------------------------------------
// 1. A mask kernel computes the exact output mask (dilation of the input mask through the
//    receptive field, or scatter through the footprint for transposed convs; all true for key
//    streams) and appends every output tile (TILE_H x TILE_W pixels) -- or, for 1x1 convs, every
//    output pixel -- that holds an active output pixel to a compact work list
//    (`list[1..]` = ids, order unspecified; the item count in an int of its own, `count`, zero
//    before the mask kernel: see work_list in conv_ops.cu).
// 2. A compute kernel, launched with a host-side upper bound of blocks, walks the list with a
//    grid-stride loop (the count is read on the device: no host sync, CUDA-graph capturable) and
//    computes each listed item densely, reading input features only at active input pixels
//    (inactive ones count as zero, their values are never read).
// Output values outside listed items are left unwritten (they are unspecified by contract).
// A tensor-core compute kernel slots in as another consumer of the same work list.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "../kernels/grid_dependency.cuh"

namespace deltaconv {
namespace conv {

constexpr int TILE_H = 8;
constexpr int TILE_W = 8;
constexpr int TILE_PIX = TILE_H * TILE_W;

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Geometry of a (transposed) convolution. Feature maps are NHWC in memory, masks N x H x W.
// For a transposed conv, cin_g/cout_g are still "input channels per group" / "output channels
// per group" (weight [Cin, Cout/groups, KH, KW]).
struct ConvGeom {
  int N, Cin, H, W;
  int Cout, Ho, Wo;
  int KH, KW, sh, sw, ph, pw, dh, dw;
  int groups, cin_g, cout_g;
  int tiles_h, tiles_w;
  // float32 in TF32 only: the input deltas are TF32 values already (a layer with a `sent` state
  // rounded them where it sent them), so the tensor-core kernels skip their rounding pass (tc::rounds_input)
  bool input_tf32;
};

// The per-tile split of a 3x3 tensor-core conv (conv_tile_mask_kernel): the sparse active tiles
// (at most max_pixels active output pixels) are listed both as tiles (from the back of the tile
// list) and as pixel rows. On the device, the gathered-taps kernel runs the pixel rows when there
// are at least min_pixels of them (enough 128-row items to fill the machine), and the 3x3 kernel
// then takes only the other tiles; otherwise the 3x3 kernel takes all of them and the pixel rows
// are left.
struct TileSplit {
  int* counts = nullptr;  // [2] zeroed: sparse tiles, their active pixels (nullptr: no split)
  int* pixels = nullptr;  // [1 + N * Ho * Wo]: pixel ids from index 1 (index 0 unused)
  int max_pixels = 0;
  int min_pixels = 0;
};

// A work-list tile id (n * tiles_h + th) * tiles_w + tw: stream n, first output row / column.
struct TileAt {
  int n, oh0, ow0;
};
__device__ __forceinline__ TileAt tile_at(int tile, const ConvGeom& g) {
  const int tw = tile % g.tiles_w;
  const int t2 = tile / g.tiles_w;
  return {t2 / g.tiles_h, (t2 % g.tiles_h) * TILE_H, tw * TILE_W};
}

__device__ __forceinline__ bool key_of(const bool* key, int n) { return key != nullptr && key[n]; }

// Input coordinate that tap k of a (transposed) convolution reads for output coordinate o along
// one axis (stride s, padding p, dilation d); false when it falls outside [0, size) or, for a
// transposed conv, between the strided input positions.
template <bool TRANSPOSED>
__device__ __forceinline__ bool tap_input(int o, int k, int s, int p, int d, int size, int& i) {
  if (TRANSPOSED) {
    const int t = o + p - k * d;
    if (t < 0 || t % s != 0) return false;
    i = t / s;
  } else {
    i = o * s - p + k * d;
  }
  return i >= 0 && i < size;
}

// Is output pixel (n, oh, ow) reached by an active input pixel?
template <bool TRANSPOSED>
__device__ __forceinline__ bool out_pixel_active(const bool* __restrict__ mask, const ConvGeom& g, int n, int oh,
                                                 int ow) {
  const bool* mn = mask + (size_t)n * g.H * g.W;
  for (int ky = 0; ky < g.KH; ++ky) {
    int ih;
    if (!tap_input<TRANSPOSED>(oh, ky, g.sh, g.ph, g.dh, g.H, ih)) continue;
    for (int kx = 0; kx < g.KW; ++kx) {
      int iw;
      if (tap_input<TRANSPOSED>(ow, kx, g.sw, g.pw, g.dw, g.W, iw) && mn[ih * g.W + iw]) return true;
    }
  }
  return false;
}

// Same as out_pixel_active<false>, without early exit (the loads issue together instead of one
// after another). KS > 0: a KS x KS kernel known at compile time.
template <int KS>
__device__ __forceinline__ bool out_pixel_any(const bool* __restrict__ mask, const ConvGeom& g, int n, int oh,
                                              int ow) {
  const bool* mn = mask + (size_t)n * g.H * g.W;
  const int KH = KS > 0 ? KS : g.KH;
  const int KW = KS > 0 ? KS : g.KW;
  bool any = false;
#pragma unroll
  for (int ky = 0; ky < KH; ++ky) {
    const int ih = oh * g.sh - g.ph + ky * g.dh;
    const bool rok = ih >= 0 && ih < g.H;
#pragma unroll
    for (int kx = 0; kx < KW; ++kx) {
      const int iw = ow * g.sw - g.pw + kx * g.dw;
      if (rok && iw >= 0 && iw < g.W) any |= mn[ih * g.W + iw];
    }
  }
  return any;
}

// Shared-memory address of a generic pointer into shared memory (for cp.async / ldmatrix / wgmma).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy (sm_80+); zero-fills the destination when !valid (src is not read
// then).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed cp.async groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Zeroes a work list's counters (`n` ints) before the mask kernel appends to it: one small kernel
// rather than a memset, a slower node in a CUDA graph (conv_ops.cu: work_list).
__global__ void clear_counters_kernel(int* __restrict__ counters, int n) {
  grid_dependency_sync();
  for (int i = threadIdx.x; i < n; i += blockDim.x) counters[i] = 0;
}

// ---------------------------------------------------------------- spread work over multiprocessors
// A conv call's counters (zeroed before its kernels run; `counters` of conv2d): [0] the work
// list's item count, [1 .. 2] TileSplit::counts, [kKSplitAt] the K split that the 3x3 kernel's fine
// launch or the gathered-rows GEMM chose (1, 2 or 4; 0: neither ran; conv_tc.cuh), [kSpreadAt, + kSpreadInts)
// the ranks of block_work: two tickets and one bit per multiprocessor id (256).
constexpr int kKSplitAt = 3;
constexpr int kSpreadAt = 4;
constexpr int kSpreadInts = 2 + 256 / 32;
constexpr int kConvCounters = kSpreadAt + kSpreadInts;

// The work of one block of a persistent (gx, nb) grid over (item, output-channel block) pairs:
// items slot, slot + gx, ... of output-channel block nblk.
struct BlockWork {
  int slot, nblk;
};

// Which block takes which slot. Block-index order (block (x, y): slot x of channel block y) puts
// the blocks with work on shared multiprocessors when only some slots have work (all when items <
// gx; the first items % gx otherwise) and there are several channel blocks: the hardware places
// blocks (x, 0) and (x, 1) of a grid of two blocks per multiprocessor on one multiprocessor
// (placement probe on an H200, 2026-11-22; benchmarks/results/block_spread_ab.txt). There each
// block first takes a rank: the first block of the launch on its multiprocessor 0, 1, ... (ticket
// spread[0]), the others gx * nb - 1, gx * nb - 2, ... (ticket spread[1]); rank r takes slot r / nb
// of channel block r % nb, so the slots with work sit on distinct multiprocessors. The ranks are a
// permutation of [0, gx * nb) whatever the placement (one ticket counts up, the other down), so
// which block computes what never changes a result. Ranks are taken only with several channel
// blocks and when at most half of the slots have the extra work (otherwise most multiprocessors
// have work either way, and the two atomics cost up to 1 us per launch: same file). `spread`
// (nullptr: block-index order): kSpreadInts zeroed ints for this launch only. Every thread of the
// block must call it (a barrier), with the same `items`.
__device__ __forceinline__ BlockWork block_work(int* spread, int items) {
  const int gx = (int)gridDim.x, nb = (int)gridDim.y;
  const int busy = items % gx;  // slots with one item more than the others
  if (spread == nullptr || nb == 1 || busy == 0 || 2 * busy > gx) return {(int)blockIdx.x, (int)blockIdx.y};
  __shared__ int rank;
  if (threadIdx.x == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned bit = 1u << (sm & 31u);
    const unsigned seen = atomicOr(reinterpret_cast<unsigned*>(spread + 2 + ((sm >> 5) & 7u)), bit);
    rank = (seen & bit) == 0u ? atomicAdd(spread, 1) : gx * nb - 1 - atomicAdd(spread + 1, 1);
  }
  __syncthreads();
  return {rank / nb, rank % nb};
}

// Appends `cnt` items of every thread of the block to a device list whose item count is
// *counter, with one atomic per block; returns the thread's first slot (slots in thread order).
// Every thread of the block (WARPS warps) must call it: it has barriers.
template <int WARPS>
__device__ __forceinline__ int block_append(int cnt, int* counter) {
  __shared__ int warp_offset[WARPS];  // per warp: its item count, then its offset in the block
  __shared__ int block_base;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = cnt;  // inclusive prefix sum over the warp
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_offset[warp] = incl;
  __syncthreads();
  if (threadIdx.x == 0) {
    int t = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const int v = warp_offset[w];
      warp_offset[w] = t;
      t += v;
    }
    block_base = t ? atomicAdd(counter, t) : 0;
  }
  __syncthreads();
  return block_base + warp_offset[warp] + incl - cnt;
}

// Tile list: one block of 256 threads per strip of MASK_STRIP = 32 tiles of one tile row; thread
// (warp r, lane l) computes row r (8 output pixels) of tile l of the strip. Writes the output mask
// and appends the ids (n * tiles_h + th) * tiles_w + tw of the strip's active tiles to `list` (in
// x order, one atomic per block on *count); list[1 + cap + slot] gets the tile's row mask (bit r: output
// row r of the tile has an active pixel). Grid: strips_w * tiles_h * N blocks (1-D).
// split (optional, split.counts == nullptr: none): the tiles with at most split.max_pixels active
// output pixels are "sparse": listed from the back of `list` (the k-th at list[cap - k], its row
// mask at list[2 cap - k], k counted by split.counts[0]), and their active pixels
// (n * Ho + oh) * Wo + ow appended to split.pixels[1 + slot] (counted by split.counts[1], one
// atomic per block): the pixel rows of the gathered-taps kernel, which runs them instead of the 3x3
// kernel when there are enough of them (see TileSplit).
// KS: 3 = non-transposed 3x3 (unrolled; stride 1 / dilation 1 along x reads each input byte
// once), 0 = any geometry.
// Whether conv_tile_mask_kernel's column-bitmask path takes geometry g: the input columns a
// thread's 8 output pixels read along x (span = 7 sw + (KW - 1) dw + 1) fit one 32-bit word; with
// dilation only where reading the span (KH x span bytes) beats looking up every tap of the 8 pixels
// (8 KH KW: span < 8 KW), else the per-pixel path.
template <int KS>
__device__ __forceinline__ bool dilated_span_ok(const ConvGeom& g) {
  const int KW = KS > 0 ? KS : g.KW;
  const int span = 7 * g.sw + (KW - 1) * g.dw + 1;
  return g.dw == 1 ? span <= 32 : span <= 32 && span < 8 * KW;
}

constexpr int MASK_STRIP = 32;
constexpr int MASK_THREADS = TILE_H * MASK_STRIP;  // 256
static_assert(TILE_W == 8 && TILE_H == 8, "conv_tile_mask_kernel assumes 8x8 tiles");

template <bool TRANSPOSED, int KS>
__global__ void __launch_bounds__(MASK_THREADS) conv_tile_mask_kernel(const bool* __restrict__ mask,
                                                                      const bool* __restrict__ key,
                                                                      bool* __restrict__ mask_out,
                                                                      int* __restrict__ list,
                                                                      int* __restrict__ count, ConvGeom g, int cap,
                                                                      TileSplit split) {
  grid_dependency_sync();
  __shared__ unsigned rowbits[TILE_H];  // per tile row r: bit l = tile l of the strip has an active pixel in row r
  __shared__ int tile_pixels[MASK_STRIP];  // split: active output pixels of tile l of the strip
  const bool splits = split.counts != nullptr;
  if (splits && threadIdx.x < MASK_STRIP) tile_pixels[threadIdx.x] = 0;
  const int strips_w = (g.tiles_w + MASK_STRIP - 1) / MASK_STRIP;
  int b = blockIdx.x;
  const int sx = b % strips_w;
  b /= strips_w;
  const int th = b % g.tiles_h;
  const int n = b / g.tiles_h;
  const int r = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int oh = th * TILE_H + r;
  const int tw = sx * MASK_STRIP + lane;
  const int ow0 = tw * TILE_W;
  unsigned act = 0;  // bit e: pixel (oh, ow0 + e) active
  if (oh < g.Ho && tw < g.tiles_w) {
    const unsigned valid = ow0 + TILE_W <= g.Wo ? 0xFFu : (1u << (g.Wo - ow0)) - 1u;
    if (key_of(key, n)) {
      act = valid;
    } else if (!TRANSPOSED && KS == 3 && g.sw == 1 && g.dw == 1) {
      const bool* mn = mask + (size_t)n * g.H * g.W;
      unsigned cols = 0;  // bit c: input column ow0 - pw + c (c < 10) active in any of the 3 rows
#pragma unroll
      for (int ky = 0; ky < 3; ++ky) {
        const int ih = oh * g.sh - g.ph + ky * g.dh;
        if (ih >= 0 && ih < g.H) {
          const bool* row = mn + (size_t)ih * g.W;
#pragma unroll
          for (int c = 0; c < TILE_W + 2; ++c) {
            const int iw = ow0 - g.pw + c;
            if (iw >= 0 && iw < g.W && row[iw]) cols |= 1u << c;
          }
        }
      }
      act = (cols | (cols >> 1) | (cols >> 2)) & valid;
    } else if (!TRANSPOSED && dilated_span_ok<KS>(g)) {
      // the same with a runtime kernel size, stride and dilation (the stems: 7x7 or 3x3, stride
      // 2; dilated depthwise convs): bit c of cols = input column ow0 * sw - pw + c active in any
      // of the KH rows; output e reads bits e * sw + kx * dw, kx < KW
      const int KH = KS > 0 ? KS : g.KH, KW = KS > 0 ? KS : g.KW;
      const int span = 7 * g.sw + (KW - 1) * g.dw + 1;
      const int iw0 = ow0 * g.sw - g.pw;
      const bool* mn = mask + (size_t)n * g.H * g.W;
      unsigned cols = 0;
      for (int ky = 0; ky < KH; ++ky) {
        const int ih = oh * g.sh - g.ph + ky * g.dh;
        if (ih >= 0 && ih < g.H) {
          const bool* row = mn + (size_t)ih * g.W;
          for (int c = 0; c < span; ++c) {
            const int iw = iw0 + c;
            if (iw >= 0 && iw < g.W && row[iw]) cols |= 1u << c;
          }
        }
      }
      unsigned window = 0u;  // bit kx * dw for kx < KW
      for (int kx = 0; kx < KW; ++kx) window |= 1u << (kx * g.dw);
#pragma unroll
      for (int e = 0; e < TILE_W; ++e)
        if ((cols >> (e * g.sw)) & window) act |= 1u << e;
      act &= valid;
    } else {
#pragma unroll
      for (int e = 0; e < TILE_W; ++e) {
        if ((valid >> e) & 1u) {
          bool a;
          if constexpr (TRANSPOSED) a = out_pixel_active<true>(mask, g, n, oh, ow0 + e);
          else a = out_pixel_any<KS>(mask, g, n, oh, ow0 + e);
          act |= (unsigned)a << e;
        }
      }
    }
    bool* mo = mask_out + ((size_t)n * g.Ho + oh) * g.Wo + ow0;
    if (valid == 0xFFu && (reinterpret_cast<uintptr_t>(mo) & 7) == 0) {
      unsigned long long v = 0;
#pragma unroll
      for (int e = 0; e < TILE_W; ++e) v |= (unsigned long long)((act >> e) & 1u) << (8 * e);
      *reinterpret_cast<unsigned long long*>(mo) = v;
    } else {
#pragma unroll
      for (int e = 0; e < TILE_W; ++e)
        if ((valid >> e) & 1u) mo[e] = (act >> e) & 1u;
    }
  }
  bool sparse = false;  // this thread's tile is sparse (see split)
  if (splits) {  // uniform over the block: its barriers are safe
    __syncthreads();  // tile_pixels zeroed
    if (act != 0) atomicAdd(&tile_pixels[lane], __popc(act));
    __syncthreads();
    sparse = tile_pixels[lane] <= split.max_pixels;
    const unsigned mine = sparse ? act : 0u;
    int pos = block_append<MASK_THREADS / 32>(__popc(mine), split.counts + 1);
    const int pix0 = (n * g.Ho + oh) * g.Wo + ow0;
#pragma unroll
    for (int e = 0; e < TILE_W; ++e)
      if ((mine >> e) & 1u) split.pixels[1 + pos++] = pix0 + e;
  }
  const unsigned bal = __ballot_sync(0xffffffffu, act != 0);
  if (lane == 0) rowbits[r] = bal;
  __syncthreads();
  if (r == 0) {
    int rows = 0;
#pragma unroll
    for (int k = 0; k < TILE_H; ++k) rows |= (int)((rowbits[k] >> lane) & 1u) << k;
    const unsigned tiles = __ballot_sync(0xffffffffu, rows != 0 && !sparse);
    if (tiles != 0) {
      int base = 0;
      if (lane == 0) base = atomicAdd(count, __popc(tiles));
      base = __shfl_sync(0xffffffffu, base, 0);
      if (rows != 0 && !sparse) {
        const int pos = base + __popc(tiles & ((1u << lane) - 1u));
        list[1 + pos] = (n * g.tiles_h + th) * g.tiles_w + tw;
        list[1 + cap + pos] = rows;
      }
    }
    const unsigned sparse_tiles = __ballot_sync(0xffffffffu, rows != 0 && sparse);
    if (sparse_tiles != 0) {
      int base = 0;
      if (lane == 0) base = atomicAdd(split.counts, __popc(sparse_tiles));
      base = __shfl_sync(0xffffffffu, base, 0);
      if (rows != 0 && sparse) {
        const int k = base + __popc(sparse_tiles & ((1u << lane) - 1u));
        list[cap - k] = (n * g.tiles_h + th) * g.tiles_w + tw;
        list[2 * cap - k] = rows;
      }
    }
  }
}

// 1x1 convolutions: each thread 4 consecutive output pixels, 1024 per block; appends the active
// ones (linear index (n * Ho + oh) * Wo + ow) to `list` in pixel order with one atomic per block on
// *count; list[1 + total + slot] gets the input pixel ((n * H + ih) * W + iw) when it is active,
// else -1. SAME: stride 1, padding 0 (output pixel = input pixel), and `mask` / `mask_out` 4-byte
// aligned: a thread's 4 mask bytes are read and written as one word, without index arithmetic.
constexpr int MASK1_THREADS = 256;
constexpr int MASK1_PPT = 4;
static_assert(MASK1_PPT == 4, "conv1x1_mask_kernel<true>: one 4-byte word of mask per thread");
template <bool SAME>
__global__ void __launch_bounds__(MASK1_THREADS) conv1x1_mask_kernel(const bool* __restrict__ mask,
                                                                    const bool* __restrict__ key,
                                                                    bool* __restrict__ mask_out,
                                                                    int* __restrict__ list,
                                                                    int* __restrict__ count, ConvGeom g, int total) {
  grid_dependency_sync();
  const int base = (blockIdx.x * MASK1_THREADS + threadIdx.x) * MASK1_PPT;
  unsigned bits = 0;
  int src[MASK1_PPT];
  if (SAME && base + MASK1_PPT <= total) {
    const uint32_t word = *reinterpret_cast<const uint32_t*>(mask + base);
#pragma unroll
    for (int k = 0; k < MASK1_PPT; ++k) {
      const bool in = ((word >> (8 * k)) & 0xFFu) != 0;
      src[k] = in ? base + k : -1;
      const bool act = in || (key != nullptr && key_of(key, (base + k) / (g.Ho * g.Wo)));
      bits |= (unsigned)act << k;
    }
    uint32_t out = 0;
#pragma unroll
    for (int k = 0; k < MASK1_PPT; ++k) out |= ((bits >> k) & 1u) << (8 * k);
    *reinterpret_cast<uint32_t*>(mask_out + base) = out;
  } else {
#pragma unroll
    for (int k = 0; k < MASK1_PPT; ++k) {
      const int pix = base + k;
      src[k] = -1;
      if (pix < total) {
        const int ow = pix % g.Wo;
        const int t = pix / g.Wo;
        const int oh = t % g.Ho;
        const int n = t / g.Ho;
        const int ih = oh * g.sh - g.ph, iw = ow * g.sw - g.pw;
        if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) {
          const int ip = (n * g.H + ih) * g.W + iw;
          if (mask[ip]) src[k] = ip;
        }
        const bool act = src[k] >= 0 || key_of(key, n);
        mask_out[pix] = act;
        bits |= (unsigned)act << k;
      }
    }
  }
  int pos = block_append<MASK1_THREADS / 32>(__popc(bits), count);
#pragma unroll
  for (int k = 0; k < MASK1_PPT; ++k) {
    if ((bits >> k) & 1u) {
      list[1 + (size_t)total + pos] = src[k];
      list[1 + pos++] = base + k;
    }
  }
}

}  // namespace conv
}  // namespace deltaconv
