// Thread-block clusters (Hopper and newer; ATen-free): the fine 3x3 launch may split a tile's K (its
// 64-channel input chunks) over consecutive CTAs of a cluster, and the first of them adds the
// others' fp32 partial sums, read from their shared memory, in rank order (so a result never
// depends on which CTA finished first). Launched without a cluster attribute, or compiled for an architecture
// before sm_90, a block is a cluster of one: cluster_size() is 1 and cluster_sync() does nothing.
#pragma once

#include <stdint.h>

namespace deltaconv {
namespace conv {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DC_HAS_CLUSTER 1
#else
#define DC_HAS_CLUSTER 0
#endif

// A cluster special register: %cluster_nctarank (NCTARANK: CTAs in this block's cluster) or
// %cluster_ctarank (this block's rank in it); `single` for a cluster of one (before sm_90).
template <bool NCTARANK>
__device__ __forceinline__ int cluster_register(int single) {
#if DC_HAS_CLUSTER
  unsigned r;
  if constexpr (NCTARANK) asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  else asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  (void)single;
  return (int)r;
#else
  return single;
#endif
}

// CTAs in this block's cluster.
__device__ __forceinline__ int cluster_size() { return cluster_register<true>(1); }

// This block's rank in its cluster (0 .. cluster_size() - 1).
__device__ __forceinline__ int cluster_rank() { return cluster_register<false>(0); }

// Barrier of every thread of every CTA of the cluster (all threads call it, warp-uniformly): shared
// memory written before it by any CTA of the cluster is visible to the cluster's reads after it.
__device__ __forceinline__ void cluster_sync() {
#if DC_HAS_CLUSTER
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// The 16 bytes at shared-memory address `addr` (this CTA's address space) of the cluster's CTA `rank`.
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t addr, int rank) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if DC_HAS_CLUSTER
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
#else
  (void)addr;
  (void)rank;
#endif
  return v;
}

// Sums a tile's accumulators over the `ks` consecutive CTAs of the cluster that share it (ks > 1
// divides the cluster size) into the first one's: every thread holds M x NT float4
// of partial sums (its CTA's K range) in `acc`; CTA r with r % ks != 0 writes them to its shared
// memory at `xs` (float4 k of thread t at xs + (k * THREADS + t) * 16: THREADS * M * NT * 16 bytes,
// free by the time of the call), then CTA r with r % ks == 0 adds those of CTA r + 1, r + 2, ... in
// that order. Every thread of every CTA of the cluster calls it or cluster_idle() once: two
// cluster barriers (the second keeps the others' shared memory alive until it has been read). Only
// the first CTA's acc holds the sum afterwards.
template <int THREADS, int M, int NT>
__device__ __forceinline__ void cluster_reduce_acc(float (&acc)[M][NT][4], uint32_t xs, int ks) {
  const int rank = cluster_rank();
  const int krank = rank % ks;
  const uint32_t mine = xs + threadIdx.x * 16u;
  if (krank != 0) {
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(mine + (i * NT + j) * THREADS * 16u),
                     "f"(acc[i][j][0]), "f"(acc[i][j][1]), "f"(acc[i][j][2]), "f"(acc[i][j][3])
                     : "memory");
  }
  cluster_sync();
  if (krank == 0) {
    for (int r = 1; r < ks; ++r) {
#pragma unroll
      for (int i = 0; i < M; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const float4 v = ld_cluster_f4(mine + (i * NT + j) * THREADS * 16u, rank + r);
          acc[i][j][0] += v.x;
          acc[i][j][1] += v.y;
          acc[i][j][2] += v.z;
          acc[i][j][3] += v.w;
        }
    }
  }
  cluster_sync();
}

// The part in cluster_reduce_acc's barriers of a CTA without a tile.
__device__ __forceinline__ void cluster_idle() {
  cluster_sync();
  cluster_sync();
}

}  // namespace conv
}  // namespace deltaconv
