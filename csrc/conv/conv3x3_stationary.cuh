// Weight-stationary 3x3 convolution on Hopper wgmma for 1, 2 or 4 K chunks of C_in (128-byte rows:
// C_in = 64, 128, 256 in fp16 / bf16, 32, 64, 128 in fp32; TcElem):
//
//   conv3x3_stationary_kernel<T, CHUNKS, BN>
//       3x3 conv, stride 1, dilation 1, any padding, groups 1, C_in = CHUNKS TcElem<T>::kChunk,
//       C_out % 8 == 0, fp16 / bf16 deltas, or fp32 in TF32 (its halos rounded to nearest in shared
//       memory, round_tf32; its weights as they come, rounded by the caller); a consumer of the 3x3
//       tile list of conv_common.cuh (TcArgs as conv3x3_tc_kernel, the sparse tiles of a TileSplit
//       included). Block (x, y) computes output channels [BN y, BN y + BN) of its tiles. 1 or 2
//       chunks (BN = 64): every tile count, one launch. 4 chunks (BN = 32): in place of
//       conv3x3_tc_kernel's fine launch (few tiles, and the tail past one round of its coarse launch;
//       coarse_tile_end), beside that coarse launch.
//
// Why: conv3x3_tc_kernel streams a [BN x 64] weight slice per (chunk, tap) stage and synchronises
// its block on every stage (9 per chunk and tile). Here the block's whole weight slice
// [BN output channels][9 taps][C_in] (72 or 144 KiB, 128-byte swizzled rows, one buffer per chunk
// and tap) is loaded into shared memory once, by the copy engine (TMA, tma.cuh) from the weight's
// tensor map (conv_ops.cu), a chunk per mbarrier: the first chunk before anything else, the others
// once the tile count shows that the block has a tile, and a warpgroup's first stage waits only for
// the first chunk. Each of its warpgroups (4, or 3 for 144 KiB) then runs a pipeline of its own over
// its tiles, with warpgroup-local barriers only:
//   - a stage is one input chunk of one tile: its halo (10 x 10 pixels x one 128-byte row, inactive
//     and outside pixels zero) is double buffered per warpgroup and loaded with cp.async two
//     stages ahead;
//   - a stage is one wgmma group of 9 taps x 4 k-steps (32 bytes each: k16, TF32 k8) of m64n(BN), A
//     straight from the halo (the 8 pixels of an output row are consecutive halo rows, rows 10
//     apart), B the chunk's and tap's buffer; the tile's last chunk stores it;
//   - while it runs, the warpgroup reads the list and the input mask for its stage after next.
// The warpgroups drift apart, so one's epilogue and loads overlap the others' tensor-core work.
// Tiles: warpgroup w of block x takes list entries w * gridDim.x + x, + WGS gridDim.x, ... (few
// tiles spread over all multiprocessors first). Results do not depend on the grid: each tile's
// sum runs in one fixed order.
#pragma once

#include "conv_tc.cuh"
#include "tma.cuh"

namespace deltaconv {
namespace conv {
namespace tc {

// CHUNKS: 128-byte K chunks of C_in; BN: output channels per block (64, or 32 for 4 chunks). Four
// warpgroups per block for 72 KiB of weights (1 chunk); three for 144 KiB (2 chunks, or 4 with
// BN = 32: the shared memory holds no fourth warpgroup's halos).
template <int CHUNKS, int BN_>
struct StationaryCfg {
  static constexpr int BN = BN_;
  static constexpr int TAPS = 9;
  static constexpr int TAP_BYTES = BN * 128;       // one (chunk, tap): BN rows of one 128-byte K chunk
  static constexpr int W_BYTES = CHUNKS * TAPS * TAP_BYTES;
  static_assert((BN == 32 || BN == 64) && W_BYTES <= 2 * TAPS * 64 * 128, "at most 144 KiB of weights");
  static constexpr int WGS = W_BYTES <= TAPS * 64 * 128 ? 4 : 3;  // warpgroups per block (one block per multiprocessor)
  static constexpr int THREADS = 128 * WGS;
  static constexpr int HALO_W = Halo<1, 1>::W;     // 10: an 8x8 output tile's input rows / columns
  static constexpr int HALO_BYTES = WarpgroupHalo<1>::BYTES;
  static constexpr int BAR_BYTES = 8 * CHUNKS;    // an mbarrier per chunk of the weights
  // bytes of dynamic shared memory: weights, two halo buffers per warpgroup, the mbarriers, 1024 for
  // alignment
  static constexpr int smem() { return W_BYTES + WGS * 2 * HALO_BYTES + BAR_BYTES + 1024; }
};

// w_map: the weight [C_out][3][3][C_in] as a 2-D tensor map of C_out rows of 9 C_in values, boxes of
// BN rows x 128 bytes with the 128-byte swizzle (conv_ops.cu: conv_weight_map with 9 taps).
template <typename T, int CHUNKS, int BN>
__global__ void __launch_bounds__(StationaryCfg<CHUNKS, BN>::THREADS, 1)
    conv3x3_stationary_kernel(const TcArgs a, const __grid_constant__ CUtensorMap w_map) {
#if DC_HAS_WGMMA
  using Cfg = StationaryCfg<CHUNKS, BN>;
  using WH = WarpgroupHalo<1>;
  constexpr int R = WH::R;
  constexpr int CK_T = TcElem<T>::kChunk;  // input channels per K chunk
  constexpr int CIN = CHUNKS * CK_T;
  const ConvGeom& g = a.g;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t w_s = (smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t bar_s = w_s + Cfg::W_BYTES + Cfg::WGS * 2 * Cfg::HALO_BYTES;  // mbarrier of chunk c: + 8 c
  const int tid = threadIdx.x;
  const int n0 = (int)blockIdx.y * Cfg::BN;

  // ---- the weight slice, once: buffer chunk * 9 + tap holds output channels [n0, n0 + BN) (rows
  // past C_out zero) x input channels [64 chunk, + 64) of the tap, the box at (tap C_in + 64 chunk,
  // n0) of w_map, 128-byte swizzled as wgmma reads it; chunk c's buffers complete on mbarrier c.
  auto request_chunk = [&](int c) {
    mbarrier_arrive_expect_tx(bar_s + 8 * c, Cfg::TAPS * Cfg::TAP_BYTES);
#pragma unroll
    for (int tap = 0; tap < Cfg::TAPS; ++tap)
      tma_load_2d(w_s + (c * Cfg::TAPS + tap) * Cfg::TAP_BYTES, &w_map, tap * CIN + c * CK_T, n0, bar_s + 8 * c);
  };
  // The first chunk is requested before the wait for the kernel before (programmatic dependent
  // launch), which is this op's mask pass or coarse 3x3 launch: neither writes the weights, and the
  // kernels before it have completed, since every deltaconv kernel waits before it exits
  // (grid_dependency.cuh). The other chunks (needed a stage or more later) only by blocks with a
  // tile: the launch that stands in for conv3x3_tc_kernel's fine one (C_in = 256) is often empty
  // (its coarse launch takes every tile from about 10 % changed on), and an empty block must wait
  // for the copies into its shared memory before it exits.
  if (tid == 0) {
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) mbarrier_init(bar_s + 8 * c, 1);
    fence_mbarrier_init();
    request_chunk(0);
  }
  grid_dependency_sync();
  const int listed = *a.count;
  // this launch's tiles: [begin, count) of the listed ones; all of them unless it stands in for the
  // fine launch of conv3x3_tc_kernel (C_in = 256), which leaves the others to the coarse launch
  // (coarse_tile_end)
  const int count = split_tile_count(a);
  const int begin = coarse_tile_end(a, count);
  if ((int)blockIdx.x >= count - begin) {  // no warpgroup of this block has a tile
    if (tid == 0) mbarrier_wait(bar_s, 0);
    return;
  }
  if (tid == 0) {
#pragma unroll
    for (int c = 1; c < CHUNKS; ++c) request_chunk(c);
  }

  // ---- this warpgroup's tiles and halo buffers; stage s = (its tile s / CHUNKS, input chunk
  // s % CHUNKS), its halo in buffer s % 2
  // the warpgroup, warp-uniform to the compiler (so the wgmma descriptors stay in uniform registers)
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int wt = tid & 127;
  const int slots = (int)gridDim.x * Cfg::WGS;
  const int first = begin + wg * (int)gridDim.x + (int)blockIdx.x;
  const int stages = first < count ? ((count - 1 - first) / slots + 1) * CHUNKS : 0;
  const uint32_t halo_s = w_s + Cfg::W_BYTES + wg * 2 * Cfg::HALO_BYTES;
  const T* __restrict__ x = static_cast<const T*>(a.x);

  // p: the halo sources of stage s's tile (WarpgroupHalo), found when s starts a tile and kept for
  // its other chunks; false when there is no stage s
  auto entry = [&](int s) { return first + s / CHUNKS * slots; };  // the list entry of stage s's tile
  auto sources = [&](int s, int (&p)[R]) {
    if (s >= stages) return false;
    if (s % CHUNKS == 0) WH::sources(a, tile_at(split_tile_entry(a, listed, entry(s), 0), g), wt, p);
    return true;
  };
  // copy input chunk `chunk` of a halo into buffer `buf` (nothing if !any), one cp.async group either way
  auto load_halo = [&](bool any, const int (&p)[R], int buf, int chunk) {
    if (any) WH::copy(x, CIN, chunk * CK_T, halo_s + buf * Cfg::HALO_BYTES, wt, p);
    cp_async_commit();
  };

  int p[R];
  load_halo(sources(0, p), p, 0, 0);
  load_halo(sources(1, p), p, 1, 1 % CHUNKS);
  __syncthreads();  // the mbarriers initialised before anyone waits on them: the only block-wide barrier
  if (stages == 0) {  // warpgroup 0 has a tile, so the block stays until the weights have landed
    cp_async_wait<0>();
    return;
  }

  float acc[2][Cfg::BN / 16][4];  // warp w: tile rows 2w, 2w + 1; acc[h]: channels n0 + h BN / 2 .. + BN / 2 - 1
#pragma unroll 1
  for (int s = 0, chunk = 0; s < stages; ++s, chunk = chunk == CHUNKS - 1 ? 0 : chunk + 1) {
    cp_async_wait<1>();  // this thread's pieces of this stage's halo (the next one's may be in flight)
    if (rounds_input<T>(g)) WH::round(halo_s + (s & 1) * Cfg::HALO_BYTES, wt);  // TF32
    fence_proxy_async();
    warpgroup_sync(wg);
    if (s < CHUNKS) mbarrier_wait(bar_s + 8 * chunk, 0);  // the chunk's weights, before its first use
    if (chunk == 0) zero_acc(acc);
    wgmma_fence_operands(acc);
    wgmma_fence();
    // A: the halo from its row of tap (ky, kx), 8-row groups one halo row (10 pixels) apart; B:
    // the chunk's and tap's weight buffer
    const uint64_t da = wgmma_desc(halo_s + (s & 1) * Cfg::HALO_BYTES, Cfg::HALO_W * 128);
    const uint64_t db = wgmma_desc(w_s + chunk * Cfg::TAPS * Cfg::TAP_BYTES);
#pragma unroll
    for (int tap = 0; tap < Cfg::TAPS; ++tap) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)  // 32-byte k-steps of the 128-byte chunk
        Wgmma<T, Cfg::BN>::run(acc[0], acc[1], wgmma_desc_add(da, ((tap / 3) * Cfg::HALO_W + tap % 3) * 128 + ks * 32),
                               wgmma_desc_add(db, tap * Cfg::TAP_BYTES + ks * 32));
    }
    wgmma_commit();
    wgmma_fence_operands(acc);
    // while the tensor cores run: the halo sources of stage s + 2, the list entry of this tile
    const bool more = sources(s + 2, p);
    const bool last = chunk == CHUNKS - 1;
    int tile = 0, rm = 0;
    if (last) {
      tile = split_tile_entry(a, listed, entry(s), 0);
      rm = split_tile_entry(a, listed, entry(s), 1);
    }
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
    warpgroup_sync(wg);  // every warp's wgmmas are done with buffer s % 2
    load_halo(more, p, s & 1, (s + 2) % CHUNKS);
    if (last) {
      if constexpr (Cfg::BN == 64) {
        store_tile<T, 4>(a, tile, rm, n0, acc, wt >> 5, 0, 32);
      } else {  // one m16 row block of 4 n8 tiles: store_tile's whole 16-byte vectors per lane
        float o[1][4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[0][j][e] = acc[j >> 1][j & 1][e];
        store_tile<T, 4>(a, tile, rm, n0, o, wt >> 5);
      }
    }
  }
  cp_async_wait<0>();
#else
  grid_dependency_sync();
  __trap();  // a pass without wgmma: the host launches this kernel only on sm_90a builds
#endif
}

}  // namespace tc
}  // namespace conv
}  // namespace deltaconv
