// Warp-specialised 3x3 convolution on Hopper wgmma for C_in in whole 128-byte K chunks (64 channels
// of fp16 / bf16, 32 of fp32; TcElem), the coarse launch's tiles:
//
//   conv3x3_ring_kernel<T, D, S>
//       3x3 conv, stride S (1, or 2 with D = 1), dilation D (1, 2 or 4), any padding, groups 1,
//       C_in % TcElem<T>::kChunk == 0, C_out % 8 == 0 (the host takes it for C_out > 64), fp16 / bf16
//       deltas, or fp32 in TF32 (halos rounded to nearest in shared memory, round_tf32; weights as
//       they come, rounded by the caller); in
//       place of conv3x3_tc_kernel's coarse launch (the tiles [0, coarse_tile_end) of the 3x3 tile
//       list, TcArgs as there). Block (x, y) computes output channels [128 y, 128 y + 128) of its
//       groups of up to WGS tiles, a tile per warpgroup (list entries x + k gridDim.x: few tiles
//       spread over all blocks).
//
// Why: conv3x3_tc_kernel's coarse launch streams a [128 x 64] weight slice per (chunk, tap) stage
// with cp.async from all its threads, one stage ahead, and synchronises its block on every stage;
// its shared memory (two blocks per multiprocessor) holds no deeper ring. Nsight Compute at
// C = 256, 100 % changed: the tensor pipe busy 61 % of cycles, 583 against cuDNN's 755 TFLOP/s
// (benchmarks/results/ncu_conv3x3_fine.txt). Here, one block per multiprocessor:
//   - a producer warp (one lane) has the copy engine (TMA, tma.cuh) copy each stage's weight slice
//     from the weight's tensor map into a ring of SLOTS slots: it waits for slot k to be free
//     (mbarrier empty[k]: one arrival per warpgroup) and the copy completes on mbarrier full[k];
//   - each of the WGS consumer warpgroups computes one tile of the group (64 pixels x 128 output
//     channels, m64n128k16 wgmma with A straight from its halo, as conv3x3_tc_kernel), one wgmma
//     group per stage with one more in flight; it frees the previous stage's slot when that group
//     is done, so the warpgroups only meet at the ring and drift apart (one's epilogue overlaps the
//     others' tensor-core work);
//   - a warpgroup stages its own halo ((7S + 2D + 1)^2 pixels x one 128-byte row per input chunk,
//     inactive and outside pixels zero; WarpgroupHalo's layout) with cp.async, double buffered:
//     chunk h + 1's copies are issued at tap 1 of chunk h, once chunk h - 1's wgmmas (same buffer)
//     are done, and waited for before chunk h + 1's first tap; warpgroup-local barriers only.
// A warpgroup without a tile in a group (the block's last) still waits for and frees every stage of
// the ring (its thread 0 alone), so that the ring's phases stay the same for all. Each tile's sum
// runs in one fixed order: results do not depend on the grid.
#pragma once

#include "conv_tc.cuh"
#include "weight_ring.cuh"

namespace deltaconv {
namespace conv {
namespace tc {

// Shared memory of one block of conv3x3_ring_kernel (at most kRingSmem bytes): WGS warpgroups' two
// halo buffers each, and as many 16 KiB weight slots as fit.
template <int D, int S = 1>
struct RingCfg {
  static constexpr int BN = 128;                   // output channels per block
  static constexpr int HALO_BYTES = WarpgroupHalo<D, S>::BYTES;
  static constexpr int WGS = HALO_BYTES <= 20 * 1024 ? 4 : 2;  // consumer warpgroups = tiles per group
  static constexpr int THREADS = 128 * WGS + 32;   // and the producer warp
  static constexpr int SLOT_BYTES = BN * 128;      // one (chunk, tap): BN rows of one 128-byte K chunk
  static constexpr int FIXED = WGS * 2 * HALO_BYTES + 1024;  // halos, alignment
  static constexpr int SLOTS = (kRingSmem - FIXED - 256) / SLOT_BYTES;
  static_assert(SLOTS >= 3 && SLOTS <= 16, "weight ring");
  // bytes of dynamic shared memory: weight ring, halos and alignment, 2 SLOTS mbarriers
  static constexpr int smem() { return SLOTS * SLOT_BYTES + FIXED + 2 * 8 * SLOTS; }
};

// w_map: the weight [C_out][3][3][C_in] as a 2-D tensor map of C_out rows of 9 C_in values, boxes of
// 128 rows x 128 bytes with the 128-byte swizzle (conv_ops.cu: conv_weight_map with 9 taps).
template <typename T, int D, int S>
__global__ void __launch_bounds__(RingCfg<D, S>::THREADS, 1)
    conv3x3_ring_kernel(const TcArgs a, const __grid_constant__ CUtensorMap w_map) {
  grid_dependency_sync();
#if DC_HAS_WGMMA
  using Cfg = RingCfg<D, S>;
  using WH = WarpgroupHalo<D, S>;
  constexpr int R = WH::R;
  constexpr int WGS = Cfg::WGS;
  const ConvGeom& g = a.g;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t w_s = (smem_u32(smem) + 1023u) & ~1023u;           // slot k at + k SLOT_BYTES
  const uint32_t halos_s = w_s + Cfg::SLOTS * Cfg::SLOT_BYTES;      // warpgroup w's buffer b at + (2 w + b) HALO_BYTES
  const uint32_t full_s = halos_s + WGS * 2 * Cfg::HALO_BYTES;      // mbarrier full[k] at + 8 k
  const uint32_t empty_s = full_s + 8 * Cfg::SLOTS;                 // mbarrier empty[k] at + 8 k
  const int tid = threadIdx.x;
  if (tid == 0) ring_init<Cfg::SLOTS>(full_s, empty_s, WGS);
  const int listed = *a.count;
  const int count = coarse_tile_end(a, split_tile_count(a));  // this launch's tiles: [0, count)
  const RingStripes<WGS> stripes(count);
  if ((int)blockIdx.x >= count) return;
  __syncthreads();  // the mbarriers initialised before anyone uses them: the only block-wide barrier
  const int my_groups = stripes.groups(0);
  const int Cin = g.Cin;
  constexpr int CK_T = TcElem<T>::kChunk;  // input channels per K chunk
  const int chunks = Cin / CK_T;
  const int n0 = (int)blockIdx.y * Cfg::BN;

  if (tid >= 128 * WGS) {  // ---- the producer warp: one lane issues the weight slices
    if (tid == 128 * WGS)
      ring_produce_groups<Cfg::SLOTS, Cfg::SLOT_BYTES, 9>(full_s, empty_s, w_s, &w_map, my_groups, Cin, CK_T, n0);
    return;  // the consumers wait for every copy before they exit
  }

  // ---- consumer warpgroup wg: tile wg of each group; halo index h = gi * chunks + chunk, buffer h % 2
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // warp-uniform (wgmma descriptors in uniform registers)
  const int wt = tid & 127;
  const uint32_t halo_s = halos_s + wg * 2 * Cfg::HALO_BYTES;
  const T* __restrict__ x = static_cast<const T*>(a.x);
  auto entry = [&](int gi) { return stripes.entry(gi, wg); };  // list entry of tile gi

  // p: the halo sources of group gi's tile (WarpgroupHalo), found at its first chunk and kept for the
  // others; false when this warpgroup has no tile in group gi
  auto sources = [&](int gi, int chunk, int (&p)[R]) {
    if (gi >= my_groups || entry(gi) >= count) return false;
    if (chunk == 0) WH::sources(a, tile_at(split_tile_entry(a, listed, entry(gi), 0), g), wt, p);
    return true;
  };
  // copy input chunk `chunk` of a halo into buffer `buf` (nothing if !any), one cp.async group either way
  auto load_halo = [&](bool any, const int (&p)[R], int buf, int chunk) {
    if (any) WH::copy(x, Cin, chunk * CK_T, halo_s + buf * Cfg::HALO_BYTES, wt, p);
    cp_async_commit();
  };

  int p[R];
  load_halo(sources(0, 0, p), p, 0, 0);
  float acc[2][Cfg::BN / 16][4];  // warp w: tile rows 2w, 2w + 1; acc[h]: channels n0 + 64 h .. + 63
  zero_acc(acc);  // (and after each tile: zeroed inside the stage loop, ptxas would drain every stage)
  RingReader<Cfg::SLOTS, Cfg::SLOT_BYTES> ring;
  const bool leader = wt == 0;
  int h = 0;  // halo index
#pragma unroll 1
  for (int gi = 0; gi < my_groups; ++gi) {
    if (entry(gi) >= count) {  // no tile in this group nor later: pass the ring's remaining stages on
      if (leader) ring.pass(full_s, empty_s, (my_groups - gi) * chunks * 9);
      break;
    }
#pragma unroll 1
    for (int chunk = 0; chunk < chunks; ++chunk, ++h) {
      const uint32_t hb = halo_s + (h & 1) * Cfg::HALO_BYTES;
      const int next_gi = chunk + 1 == chunks ? gi + 1 : gi;
      const int next_chunk = chunk + 1 == chunks ? 0 : chunk + 1;
      bool next_any = false;
      // this chunk's halo, copied by all of the warpgroup, visible to its wgmmas
      cp_async_wait<0>();
      if (rounds_input<T>(g)) WH::round(hb, wt);  // TF32
      fence_proxy_async();
      warpgroup_sync(wg);
#pragma unroll 1
      for (int tap = 0; tap < 9; ++tap) {
        const int ky = tap >= 6 ? 2 : (tap >= 3 ? 1 : 0);
        const uint64_t da = wgmma_desc(hb + WH::tap_row(ky, tap - 3 * ky) * 128, WH::GROUP_STRIDE);
        // while the tensor cores run: the next halo's sources (its tile's input mask)
        ring.template stage<T, Cfg::BN>(acc, full_s, empty_s, w_s, da, leader, [&] {
          if (tap == 1) next_any = sources(next_gi, next_chunk, p);
        });
        if (tap == 1) {  // chunk h - 1's wgmmas (the other buffer) are done in every warp
          warpgroup_sync(wg);
          load_halo(next_any, p, (h + 1) & 1, next_chunk);
        }
      }
    }
    // the tile's last stage: drain, free its slot, store
    ring.template drain<Cfg::BN>(acc, empty_s, leader);
    const int t = entry(gi);
    store_tile<T, Cfg::BN / 16>(a, split_tile_entry(a, listed, t, 0), split_tile_entry(a, listed, t, 1), n0, acc,
                                wt >> 5, 0, Cfg::BN / 2);
    zero_acc(acc);
  }
  cp_async_wait<0>();
#else
  __trap();  // a pass without wgmma: the host launches this kernel only on sm_90a builds
#endif
}

}  // namespace tc
}  // namespace conv
}  // namespace deltaconv
