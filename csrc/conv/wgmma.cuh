// Hopper warpgroup MMA (wgmma, sm_90a) for the tensor-core convolutions: D[64 x N] += A[64 x 16] *
// B[16 x N] per instruction (fp16 / bf16; fp32 in TF32: A[64 x 8] * B[8 x N], the same 32 bytes of
// each row), issued by the 4 warps of a warpgroup, A and B read from shared memory
// through matrix descriptors, the fp32 accumulators in registers.
//
// Operand layout: both K-major with the 128-byte swizzle: rows of 64 fp16/bf16 = 128 bytes, the
// 16-byte chunk j of row r stored at chunk j ^ (r & 7), r counted from a 1024-byte-aligned buffer
// start (the layout the conv kernels already write with cp.async). A k16 step starts 32 bytes further into the rows.
//
// Accumulators: warp w of the warpgroup holds rows 16w .. 16w + 15 of the 64; per n8 tile j, lane
// l holds rows l / 4 and l / 4 + 8 at columns 8j + 2 (l % 4), +1: mma.sync's m16n8 C fragment.
//
// Only the sm_90a pass of nvcc sees the instructions (DC_HAS_WGMMA); other passes compile empty
// bodies, and kernels must not call these there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DC_HAS_WGMMA 1
#else
#define DC_HAS_WGMMA 0
#endif

namespace deltaconv {
namespace conv {
namespace tc {

// Descriptor of a K-major, 128-byte-swizzled tile whose row 0 is at shared address `addr`: rows
// of 8-row groups are 128 bytes apart, the groups `group_stride` bytes apart (1024: a dense tile).
// The swizzle is that of the absolute address (chunk j of the row at address r stored at
// j ^ ((r >> 7) & 7)), so a tile may start at any row of a 1024-byte-aligned buffer with the
// descriptor's base-offset field 0 (measured on an H200: the 3x3 kernel's taps start at arbitrary
// halo rows and equal the reference; setting the field to (addr >> 7) & 7 gives wrong results).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t group_stride = 1024) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(group_stride >> 4) << 32) | (1ull << 62);
}

// wgmma_desc(addr + bytes, stride) from d = wgmma_desc(addr, stride), bytes a multiple of 16 and
// addr + bytes below 256 KiB: only the start-address field (the low 14 bits, in 16-byte units)
// changes and it does not carry. On a warp-uniform d this is one uniform add per operand and
// wgmma, where a fresh wgmma_desc took about seven instructions (mask, shift and or of the address,
// two moves into uniform registers).
__device__ __forceinline__ uint64_t wgmma_desc_add(uint64_t d, uint32_t bytes) {
  return (d & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)d + (bytes >> 4));
}

// Orders this thread's earlier shared-memory writes (cp.async included) before later reads by the
// tensor cores' async proxy; a barrier must follow before other threads' wgmma.
__device__ __forceinline__ void fence_proxy_async() {
#if DC_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Barrier of the 128 threads of warpgroup `wg` (named barrier 1 + wg; 0 is __syncthreads').
__device__ __forceinline__ void warpgroup_sync(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}
__device__ __forceinline__ void wgmma_fence() {
#if DC_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if DC_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Pins accumulators to their registers across the wgmma sequence (the compiler must not move them
// between issue and wait: ptxas would serialize the wgmmas), as CUTLASS's warpgroup_fence_operand.
template <int M, int NT>
__device__ __forceinline__ void wgmma_fence_operands(float (&acc)[M][NT][4]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(acc[i][j][e])::"memory");
}
// Waits until at most N committed wgmma groups of this warp are pending (N = 0: accumulators
// final, all their shared memory free).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if DC_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// m64n32k16: the 16 f32 accumulators of a lane as asm operands %0..%15 (d0: n8 tiles 0..1 of the
// instruction, d1: n8 tiles 2..3, each [2][4] as in mma.sync's C fragment)
#define DC_WGMMA_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define DC_WGMMA_BIND32(d0, d1) \
  "+f"(d0[0][0]), "+f"(d0[0][1]), "+f"(d0[0][2]), "+f"(d0[0][3]), "+f"(d0[1][0]), "+f"(d0[1][1]), \
  "+f"(d0[1][2]), "+f"(d0[1][3]), "+f"(d1[0][0]), "+f"(d1[0][1]), "+f"(d1[0][2]), "+f"(d1[0][3]), \
  "+f"(d1[1][0]), "+f"(d1[1][1]), "+f"(d1[1][2]), "+f"(d1[1][3])

// m64n64k16: the 32 f32 accumulators of a lane as asm operands %0..%31 (d0: n8 tiles
// 0..3 of the instruction, d1: n8 tiles 4..7, each [4][4] as in mma.sync's C fragment)
#define DC_WGMMA_D64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
  " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define DC_WGMMA_BIND64(d0, d1) \
  "+f"(d0[0][0]), "+f"(d0[0][1]), "+f"(d0[0][2]), "+f"(d0[0][3]), "+f"(d0[1][0]), "+f"(d0[1][1]), \
  "+f"(d0[1][2]), "+f"(d0[1][3]), "+f"(d0[2][0]), "+f"(d0[2][1]), "+f"(d0[2][2]), "+f"(d0[2][3]), \
  "+f"(d0[3][0]), "+f"(d0[3][1]), "+f"(d0[3][2]), "+f"(d0[3][3]), "+f"(d1[0][0]), "+f"(d1[0][1]), \
  "+f"(d1[0][2]), "+f"(d1[0][3]), "+f"(d1[1][0]), "+f"(d1[1][1]), "+f"(d1[1][2]), "+f"(d1[1][3]), \
  "+f"(d1[2][0]), "+f"(d1[2][1]), "+f"(d1[2][2]), "+f"(d1[2][3]), "+f"(d1[3][0]), "+f"(d1[3][1]), \
  "+f"(d1[3][2]), "+f"(d1[3][3])

// m64n128k16: the 64 f32 accumulators of a lane as asm operands %0..%63 (d0: n8 tiles
// 0..7 of the instruction, d1: n8 tiles 8..15, each [8][4] as in mma.sync's C fragment)
#define DC_WGMMA_D128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
  " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
  " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
  " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define DC_WGMMA_BIND128(d0, d1) \
  "+f"(d0[0][0]), "+f"(d0[0][1]), "+f"(d0[0][2]), "+f"(d0[0][3]), "+f"(d0[1][0]), "+f"(d0[1][1]), \
  "+f"(d0[1][2]), "+f"(d0[1][3]), "+f"(d0[2][0]), "+f"(d0[2][1]), "+f"(d0[2][2]), "+f"(d0[2][3]), \
  "+f"(d0[3][0]), "+f"(d0[3][1]), "+f"(d0[3][2]), "+f"(d0[3][3]), "+f"(d0[4][0]), "+f"(d0[4][1]), \
  "+f"(d0[4][2]), "+f"(d0[4][3]), "+f"(d0[5][0]), "+f"(d0[5][1]), "+f"(d0[5][2]), "+f"(d0[5][3]), \
  "+f"(d0[6][0]), "+f"(d0[6][1]), "+f"(d0[6][2]), "+f"(d0[6][3]), "+f"(d0[7][0]), "+f"(d0[7][1]), \
  "+f"(d0[7][2]), "+f"(d0[7][3]), "+f"(d1[0][0]), "+f"(d1[0][1]), "+f"(d1[0][2]), "+f"(d1[0][3]), \
  "+f"(d1[1][0]), "+f"(d1[1][1]), "+f"(d1[1][2]), "+f"(d1[1][3]), "+f"(d1[2][0]), "+f"(d1[2][1]), \
  "+f"(d1[2][2]), "+f"(d1[2][3]), "+f"(d1[3][0]), "+f"(d1[3][1]), "+f"(d1[3][2]), "+f"(d1[3][3]), \
  "+f"(d1[4][0]), "+f"(d1[4][1]), "+f"(d1[4][2]), "+f"(d1[4][3]), "+f"(d1[5][0]), "+f"(d1[5][1]), \
  "+f"(d1[5][2]), "+f"(d1[5][3]), "+f"(d1[6][0]), "+f"(d1[6][1]), "+f"(d1[6][2]), "+f"(d1[6][3]), \
  "+f"(d1[7][0]), "+f"(d1[7][1]), "+f"(d1[7][2]), "+f"(d1[7][3])
template <typename T, int N>
struct Wgmma;  // run(d0, d1, desc_a, desc_b): D += A * B, m64nNk16, d0 / d1 the two halves of N

// K and the trailing immediates per type: fp16 / bf16 k16 with scale-d, scale-a, scale-b and the
// two transpose flags (0: K-major); fp32 (TF32) k8 (32 bytes of a row, as a k16 step of the 16-bit
// types), whose operands are always K-major and take no transpose flags.
#if DC_HAS_WGMMA
#define DC_WGMMA_RUN(PTX_TYPE, K, N, DESCS, IMM)                                                               \
  asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k" #K ".f32." PTX_TYPE "." PTX_TYPE " " DC_WGMMA_D##N \
               ", " DESCS IMM ";\n"                                                                           \
               : DC_WGMMA_BIND##N(d0, d1)                                                                     \
               : "l"(da), "l"(db))
#else
#define DC_WGMMA_RUN(PTX_TYPE, K, N, DESCS, IMM) ((void)d0, (void)d1, (void)da, (void)db)
#endif

#define DC_DEFINE_WGMMA(TYPE, PTX_TYPE, K, N, DESCS, IMM)                                                  \
  template <>                                                                                              \
  struct Wgmma<TYPE, N> {                                                                                  \
    static __device__ __forceinline__ void run(float (&d0)[N / 16][4], float (&d1)[N / 16][4], uint64_t da, \
                                               uint64_t db) {                                              \
      DC_WGMMA_RUN(PTX_TYPE, K, N, DESCS, IMM);                                                            \
    }                                                                                                      \
  };
DC_DEFINE_WGMMA(__half, "f16", 16, 32, "%16, %17", ", 1, 1, 1, 0, 0")
DC_DEFINE_WGMMA(__half, "f16", 16, 64, "%32, %33", ", 1, 1, 1, 0, 0")
DC_DEFINE_WGMMA(__half, "f16", 16, 128, "%64, %65", ", 1, 1, 1, 0, 0")
DC_DEFINE_WGMMA(__nv_bfloat16, "bf16", 16, 32, "%16, %17", ", 1, 1, 1, 0, 0")
DC_DEFINE_WGMMA(__nv_bfloat16, "bf16", 16, 64, "%32, %33", ", 1, 1, 1, 0, 0")
DC_DEFINE_WGMMA(__nv_bfloat16, "bf16", 16, 128, "%64, %65", ", 1, 1, 1, 0, 0")
DC_DEFINE_WGMMA(float, "tf32", 8, 32, "%16, %17", ", 1, 1, 1")
DC_DEFINE_WGMMA(float, "tf32", 8, 64, "%32, %33", ", 1, 1, 1")
DC_DEFINE_WGMMA(float, "tf32", 8, 128, "%64, %65", ", 1, 1, 1")
#undef DC_DEFINE_WGMMA
#undef DC_WGMMA_RUN

}  // namespace tc
}  // namespace conv
}  // namespace deltaconv
