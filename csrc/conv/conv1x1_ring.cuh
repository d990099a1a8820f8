// Warp-specialised 1x1 convolution (a GEMM over the listed pixels) on Hopper wgmma:
//
//   conv1x1_ring_kernel<T>
//       1x1 conv, any stride and padding, groups 1, C_in in whole 128-byte K chunks (C_in %
//       TcElem<T>::kChunk == 0: 64 channels of fp16 / bf16, 32 of fp32), C_out % 8 == 0 (the host
//       takes it for C_out > 64), fp16 / bf16 deltas, or fp32 in TF32 (input rows rounded to nearest
//       in shared memory, round_tf32; weights as they come, rounded by the caller); in place of conv_gather_tc_kernel<kRows1x1>, with its
//       TcArgs: list[1 + l] the output pixel of GEMM row l < *count, list[1 + cap + l] its input
//       pixel (-1: a zero row). Block (x, y) computes output channels [128 y, 128 y + 128) of its
//       groups of up to WGS items of 64 rows, an item per warpgroup (items x + k gridDim.x: few
//       items spread over all blocks).
//
// Why: conv_gather_tc_kernel streams both operands with cp.async from all its threads and
// synchronises its block on every 64-channel stage, one stage ahead; at 100 % changed it ran at
// 0.55-0.73x of cuDNN (H200, benchmarks/results/kernels.csv), and it is 23-29 % of the GPU time of
// resnet50 and fcn_resnet50 frames (profile_1080p.txt). Here, as in conv3x3_ring.cuh, one block per
// multiprocessor:
//   - a producer warp (one lane) has the copy engine copy each K chunk (128-byte rows) of the block's
//     [128 x C_in] weight slice into the weight ring (weight_ring.cuh), shared by the WGS consumers;
//   - each consumer warpgroup computes one item (64 rows x 128 channels, m64n128k16 wgmma), one wgmma
//     group per chunk with one more in flight, and frees the previous chunk's slot when that group is
//     done: the warpgroups only meet at the ring;
//   - a warpgroup gathers its own rows' input chunks with cp.async into A_SLOTS slots of its own,
//     A_SLOTS - 2 chunks ahead (across items: the next item's first chunks load during this one's
//     last), with warpgroup-local barriers only.
// A warpgroup without an item in a group still passes the ring's stages on (RingReader::pass). Each
// item's sum runs in one fixed order: results do not depend on the grid.
#pragma once

#include "conv_tc.cuh"
#include "weight_ring.cuh"

namespace deltaconv {
namespace conv {
namespace tc {

// The weight ring takes what the input slots leave of kRingSmem.
struct Ring1Cfg {
  static constexpr int BN = 128;                  // output channels per block
  static constexpr int BM = 64;                   // GEMM rows per item (a warpgroup's wgmma M)
  static constexpr int WGS = 4;                   // consumer warpgroups = items per group
  static constexpr int THREADS = 128 * WGS + 32;  // and the producer warp
  static constexpr int A_SLOTS = 4;               // input-chunk slots per warpgroup
  static constexpr int DIST = A_SLOTS - 2;        // input chunks loaded ahead
  static constexpr int RPT = BM / 16;             // input rows each thread copies per chunk
  static constexpr int A_BYTES = BM * 128;        // one item's rows x one 128-byte K chunk
  static constexpr int SLOT_BYTES = BN * 128;     // one weight chunk: BN rows of one 128-byte K chunk
  static constexpr int FIXED = WGS * A_SLOTS * A_BYTES + 1024;  // input slots, alignment
  static constexpr int SLOTS = (kRingSmem - FIXED - 256) / SLOT_BYTES;
  static_assert(DIST >= 1 && SLOTS >= 3 && SLOTS <= 16, "input slots and weight ring");
  // bytes of dynamic shared memory: weight ring, input slots and alignment, 2 SLOTS mbarriers
  static constexpr int smem() { return SLOTS * SLOT_BYTES + FIXED + 2 * 8 * SLOTS; }
};

// w_map: the weight [C_out][C_in] as a 2-D tensor map, boxes of 128 rows x 128 bytes with the 128-byte
// swizzle (conv_ops.cu: conv_weight_map with 1 tap).
template <typename T>
__global__ void __launch_bounds__(Ring1Cfg::THREADS, 1)
    conv1x1_ring_kernel(const TcArgs a, const __grid_constant__ CUtensorMap w_map) {
  grid_dependency_sync();
#if DC_HAS_WGMMA
  using Cfg = Ring1Cfg;
  constexpr int WGS = Cfg::WGS;
  constexpr int A_SLOTS = Cfg::A_SLOTS;
  constexpr int RPT = Cfg::RPT;
  constexpr int DIST = Cfg::DIST;
  const ConvGeom& g = a.g;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t w_s = (smem_u32(smem) + 1023u) & ~1023u;      // weight slot k at + k SLOT_BYTES
  const uint32_t in_s = w_s + Cfg::SLOTS * Cfg::SLOT_BYTES;    // warpgroup w's slot k: + (w A_SLOTS + k) A_BYTES
  const uint32_t full_s = in_s + WGS * A_SLOTS * Cfg::A_BYTES;  // mbarrier full[k] at + 8 k
  const uint32_t empty_s = full_s + 8 * Cfg::SLOTS;             // mbarrier empty[k] at + 8 k
  const int tid = threadIdx.x;
  if (tid == 0) ring_init<Cfg::SLOTS>(full_s, empty_s, WGS);
  const int count = *a.count;  // GEMM rows
  const int items = (count + Cfg::BM - 1) / Cfg::BM;
  const RingStripes<WGS> stripes(items);
  if ((int)blockIdx.x >= items) return;
  __syncthreads();  // the mbarriers initialised before anyone uses them: the only block-wide barrier
  if (a.k_split != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) *a.k_split = 1;
  const int my_groups = stripes.groups(0);
  const int Cin = g.Cin;
  constexpr int CK_T = TcElem<T>::kChunk;  // input channels per K chunk
  const int chunks = Cin / CK_T;
  const int n0 = (int)blockIdx.y * Cfg::BN;

  if (tid >= 128 * WGS) {  // ---- the producer warp: one lane issues the weight chunks
    if (tid == 128 * WGS)
      ring_produce_groups<Cfg::SLOTS, Cfg::SLOT_BYTES, 1>(full_s, empty_s, w_s, &w_map, my_groups, Cin, CK_T, n0);
    return;  // the consumers wait for every copy before they exit
  }

  // ---- consumer warpgroup wg: item gi of its own is list rows stripes.entry(gi, wg) * BM .. + BM - 1
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // warp-uniform (wgmma descriptors in uniform registers)
  const int wt = tid & 127;
  const int lane = tid & 31;
  const uint32_t a_s = in_s + wg * A_SLOTS * Cfg::A_BYTES;
  const int mine = stripes.groups(wg);  // items of this warpgroup
  const int stages = mine * chunks;
  const T* __restrict__ x = static_cast<const T*>(a.x);
  const int* __restrict__ srcs = a.list + 1 + (size_t)a.cap;

  // The input loads, stage by stage (stage q = item q / chunks, chunk q % chunks, into slot q %
  // A_SLOTS): thread wt copies 16-byte piece wt % 8 of rows wt / 8 + 16 k (k < RPT), whose input
  // pixels it looks up once per item. One cp.async group per stage, empty past the last.
  const int wj = wt & 7;
  int src[RPT];
  int l_gi = 0, l_chunk = 0, l_slot = 0, l_q = 0;
  auto load_next = [&]() {
    if (l_q < stages) {
      if (l_chunk == 0) {
        const int l0 = stripes.entry(l_gi, wg) * Cfg::BM;
#pragma unroll
        for (int k = 0; k < RPT; ++k) {
          const int l = l0 + (wt >> 3) + 16 * k;
          src[k] = l < count ? srcs[l] : -1;
        }
      }
      const uint32_t sa = a_s + l_slot * Cfg::A_BYTES;
      const T* xc = x + l_chunk * CK_T + wj * TcElem<T>::kVec;
#pragma unroll
      for (int k = 0; k < RPT; ++k) {
        const int r = (wt >> 3) + 16 * k;
        cp_async16(swizzled_piece(sa, r, wj), src[k] >= 0 ? xc + (size_t)src[k] * Cin : x, src[k] >= 0);
      }
      if (++l_chunk == chunks) {
        l_chunk = 0;
        ++l_gi;
      }
      if (++l_slot == A_SLOTS) l_slot = 0;
      ++l_q;
    }
    cp_async_commit();
  };
#pragma unroll 1
  for (int q = 0; q < DIST; ++q) load_next();

  const T* bias = static_cast<const T*>(a.bias);
  const int HWo = g.Ho * g.Wo;
  float acc[2][Cfg::BN / 16][4];  // warp w: item rows 16w .. 16w + 15; acc[h]: channels n0 + 64 h .. + 63
  zero_acc(acc);  // (and after each item: zeroed inside the chunk loop, ptxas would drain every stage)
  RingReader<Cfg::SLOTS, Cfg::SLOT_BYTES> ring;
  const bool leader = wt == 0;
  int slot = 0;  // this stage's input slot
#pragma unroll 1
  for (int gi = 0; gi < mine; ++gi) {
    // the output pixel of the two rows this lane stores (-1: none), loaded now, used after the chunks
    int opix[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int l = stripes.entry(gi, wg) * Cfg::BM + (wt >> 5) * 16 + (lane >> 2) + 8 * h;
      opix[h] = l < count ? a.list[1 + l] : -1;
    }
#pragma unroll 1
    for (int chunk = 0; chunk < chunks; ++chunk) {
      // this stage's input chunk, copied by all of the warpgroup, visible to its wgmmas; and every
      // warp past the previous stage's wgmma_wait<1>: the stage before it is done, its slot free
      cp_async_wait<DIST - 1>();
      if (rounds_input<T>(g)) {  // TF32: this thread's pieces of the chunk (round_tf32)
        const uint32_t sa = a_s + slot * Cfg::A_BYTES;
#pragma unroll
        for (int k = 0; k < RPT; ++k) {
          const int r = (wt >> 3) + 16 * k;
          round_tf32(swizzled_piece(sa, r, wj));
        }
      }
      fence_proxy_async();
      warpgroup_sync(wg);
      load_next();
      ring.template stage<T, Cfg::BN>(acc, full_s, empty_s, w_s, wgmma_desc(a_s + slot * Cfg::A_BYTES), leader, [] {});
      if (++slot == A_SLOTS) slot = 0;
    }
    // the item's last stage: drain, free its weight slot, store
    ring.template drain<Cfg::BN>(acc, empty_s, leader);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pix = opix[h];
      const bool add_bias = bias != nullptr && pix >= 0 && key_of(a.key, pix / HWo);
      T* yp = pix >= 0 ? static_cast<T*>(a.y) + (size_t)pix * g.Cout : nullptr;
#pragma unroll
      for (int c = 0; c < 2; ++c) store_pixel<T, Cfg::BN / 16>(yp, bias, add_bias, n0 + 64 * c, g.Cout, acc[c], h);
    }
    zero_acc(acc);
  }
  // groups where this warpgroup has no item: pass their stages on
  if (leader) ring.pass(full_s, empty_s, (my_groups - mine) * chunks);
  cp_async_wait<0>();
#else
  __trap();  // a pass without wgmma: the host launches this kernel only on sm_90a builds
#endif
}

}  // namespace tc
}  // namespace conv
}  // namespace deltaconv
