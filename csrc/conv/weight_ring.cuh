// The weight ring of the warp-specialised tensor-core kernels (conv3x3_ring.cuh, conv1x1_ring.cuh):
// one producer lane has the copy engine (TMA) copy weight slices into SLOTS shared-memory slots, and
// the block's consumer warpgroups read each slice with wgmma, in the same order. Two mbarriers per
// slot: full[k] completes when slot k's copy has landed (one arrival, the producer's, plus the
// copy's bytes); empty[k] when every consumer warpgroup is done with it (one arrival per
// warpgroup). A slot's barriers live at full_s + 8 k and empty_s + 8 k (shared addresses).
// ATen-free; sm_90a only (tma.cuh).
#pragma once

#include "tma.cuh"

namespace deltaconv {
namespace conv {
namespace tc {

// Dynamic shared memory of one block of a warp-specialised kernel, at most: an H100 / H200 block's
// 227 KiB (one block per multiprocessor).
constexpr int kRingSmem = 227 * 1024;

// How a warp-specialised launch stripes its list entries (tiles, items) [0, count) over its blocks
// and their WGS consumer warpgroups: warpgroup w of block x takes entries x + (gi WGS + w) gridDim.x,
// gi = 0, 1, ... (few entries spread over all blocks, one per warpgroup first). Group gi of a block
// is its warpgroups' gi-th entries; every warpgroup passes through the ring stages of all the groups
// of warpgroup 0, which has the most.
template <int WGS>
struct RingStripes {
  int count, round;
  __device__ __forceinline__ explicit RingStripes(int entries) : count(entries), round(WGS * (int)gridDim.x) {}
  __device__ __forceinline__ int entry(int gi, int w) const {
    return (int)blockIdx.x + w * (int)gridDim.x + gi * round;
  }
  // the groups in which warpgroup w has an entry
  __device__ __forceinline__ int groups(int w) const {
    const int first = entry(0, w);
    return first < count ? (count - 1 - first) / round + 1 : 0;
  }
};

// A position in the weight ring: the slot of a stage and the parity of that slot's current round
// (its mbarriers' phase), advanced one stage at a time by the producer and by each consumer.
template <int SLOTS>
struct RingPos {
  int slot = 0, phase = 0;
  __device__ __forceinline__ void next() {
    if (++slot == SLOTS) {
      slot = 0;
      phase ^= 1;
    }
  }
};

// The SLOTS full / empty barrier pairs, by one thread; a barrier of the block must follow before
// anyone waits on them. `consumers`: the warpgroups that free each slot.
template <int SLOTS>
__device__ __forceinline__ void ring_init(uint32_t full_s, uint32_t empty_s, int consumers) {
  for (int k = 0; k < SLOTS; ++k) {
    mbarrier_init(full_s + 8 * k, 1);
    mbarrier_init(empty_s + 8 * k, consumers);
  }
  fence_mbarrier_init();
}

// The producer's next stage: waits until slot r.slot is free, then has the copy engine copy the box
// of `map` at (c0, c1) into it (slot k at slots_s + k * SLOT_BYTES), completing on full[r.slot].
template <int SLOTS, int SLOT_BYTES>
__device__ __forceinline__ void ring_produce(RingPos<SLOTS>& r, uint32_t full_s, uint32_t empty_s, uint32_t slots_s,
                                             const CUtensorMap* map, int c0, int c1) {
  mbarrier_wait(empty_s + 8 * r.slot, r.phase ^ 1);  // a fresh barrier passes parity 1 at once
  mbarrier_arrive_expect_tx(full_s + 8 * r.slot, SLOT_BYTES);
  tma_load_2d(slots_s + r.slot * SLOT_BYTES, map, c0, c1, full_s + 8 * r.slot);
  r.next();
}

// The producer lane's whole work: for each of `groups` groups, the weight slice of every K chunk c0
// of C_in = `cin` (`chunk` channels: one 128-byte row) and tap of TAPS (the box at (tap * cin + c0,
// n0): C_out rows of TAPS * cin values), chunk by chunk and tap by tap within a chunk, the order in
// which the consumers read them.
template <int SLOTS, int SLOT_BYTES, int TAPS>
__device__ __forceinline__ void ring_produce_groups(uint32_t full_s, uint32_t empty_s, uint32_t slots_s,
                                                    const CUtensorMap* map, int groups, int cin, int chunk, int n0) {
  RingPos<SLOTS> r;
#pragma unroll 1
  for (int gi = 0; gi < groups; ++gi)
#pragma unroll 1
    for (int c0 = 0; c0 < cin; c0 += chunk)
#pragma unroll 1
      for (int tap = 0; tap < TAPS; ++tap)
        ring_produce<SLOTS, SLOT_BYTES>(r, full_s, empty_s, slots_s, map, tap * cin + c0, n0);
}

// A consumer warpgroup's side of the ring: its position, and the slot whose wgmma group may still
// run (freed once the next stage's group is issued and that one is done; -1: none). `leader`: the
// warpgroup's one thread that frees slots (a warpgroup's wgmma completes as a whole, so one lane's
// wait covers its four warps).
template <int SLOTS, int SLOT_BYTES>
struct RingReader {
  RingPos<SLOTS> r;
  int held = -1;

  // One stage: waits for the next slot's weights (BN rows x one 128-byte K chunk), issues its 4
  // k-steps of 32 bytes (m64nBNk16; TF32: k8) on the A operand at descriptor `da` as one wgmma group, runs `during()` while the
  // tensor cores work, then waits for the previous stage's group and frees that slot.
  template <typename T, int BN, typename F>
  __device__ __forceinline__ void stage(float (&acc)[2][BN / 16][4], uint32_t full_s, uint32_t empty_s,
                                        uint32_t slots_s, uint64_t da, bool leader, F&& during) {
    mbarrier_wait(full_s + 8 * r.slot, r.phase);
    wgmma_fence_operands(acc);
    wgmma_fence();
    const uint64_t db = wgmma_desc(slots_s + r.slot * SLOT_BYTES);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      Wgmma<T, BN>::run(acc[0], acc[1], wgmma_desc_add(da, ks * 32), wgmma_desc_add(db, ks * 32));
    wgmma_commit();
    wgmma_fence_operands(acc);
    during();
    wgmma_wait<1>();  // the previous stage's group is done
    wgmma_fence_operands(acc);
    if (leader && held >= 0) mbarrier_arrive(empty_s + 8 * held);
    held = r.slot;
    r.next();
  }

  // After a tile's or item's last stage: waits for its group (the accumulators final) and frees its slot.
  template <int BN>
  __device__ __forceinline__ void drain(float (&acc)[2][BN / 16][4], uint32_t empty_s, bool leader) {
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
    if (leader && held >= 0) mbarrier_arrive(empty_s + 8 * held);
    held = -1;
  }

  // A warpgroup with no more work passes the ring's next `stages` stages on (waits for each and
  // frees it), so that the ring's phases stay the same for all. Called by the leader ALONE: had the
  // others waited too, one could fall a phase behind the thread that frees, wait for a phase of its
  // slot that never completes, and hang the block.
  __device__ __forceinline__ void pass(uint32_t full_s, uint32_t empty_s, int stages) {
#pragma unroll 1
    for (; stages > 0; --stages) {
      mbarrier_wait(full_s + 8 * r.slot, r.phase);
      mbarrier_arrive(empty_s + 8 * r.slot);
      r.next();
    }
  }
};

}  // namespace tc
}  // namespace conv
}  // namespace deltaconv
