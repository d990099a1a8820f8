// Hopper's tensor memory accelerator (TMA, sm_90a) for the weight-stationary and the warp-specialised
// 3x3 kernels (2-D boxes of their weight) and the depthwise kernel (4-D boxes of its input halo): a box
// of a tensor in global memory copied into shared memory by the copy engine, its completion counted
// in bytes on an mbarrier. ATen-free; the host side (the CUtensorMaps) is in conv_ops.cu.
//
// Unlike cp.async, these copies are not part of the issuing thread's cp.async groups, so a kernel
// can wait for them and for its own cp.async groups independently (weights by chunk, halos by stage).
//
// Only the sm_90a pass of nvcc sees the instructions (DC_HAS_WGMMA); other passes compile empty
// bodies, and kernels must not call these there.
#pragma once

#include <cuda.h>
#include <cstdint>

#include "wgmma.cuh"

namespace deltaconv {
namespace conv {
namespace tc {

// mbarrier at shared address `bar` (8 bytes, 8-byte aligned): `count` arrivals complete a phase.
// One thread initialises it; a barrier of the block must follow before others wait on it.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, int count) {
#if DC_HAS_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

// Makes the initialised mbarriers visible to the copy engine (the async proxy) before a copy
// completes on them.
__device__ __forceinline__ void fence_mbarrier_init() {
#if DC_HAS_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Arrives on `bar` and expects `bytes` more bytes of copies to complete on its current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if DC_HAS_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

// Arrives on `bar` (one of its `count` arrivals of the current phase).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
#if DC_HAS_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

// Waits until the phase of parity `parity` of `bar` has completed (the first phase: parity 0).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, int parity) {
#if DC_HAS_WGMMA
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// Copies the box of `map` at element coordinates (c0 innermost, c1) into shared memory at `dst`
// (1024-byte aligned for the 128-byte swizzle), completing its bytes on `bar`. `map` must be a
// __grid_constant__ kernel parameter (the copy engine reads it by its generic address).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
#if DC_HAS_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#endif
}

// Copies the box of the 4-D `map` at element coordinates (c0 innermost .. c3) into shared memory at
// `dst` (128-byte aligned), completing its bytes on `bar`; box elements outside the tensor (negative
// coordinates included) are written as zeros. `map` as for tma_load_2d.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
#if DC_HAS_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
#endif
}

}  // namespace tc
}  // namespace conv
}  // namespace deltaconv
