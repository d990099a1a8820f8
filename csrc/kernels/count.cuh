// Active-pixel counting for per-layer statistics (ATen-free): the masks of up to kMaxCount layers
// in one launch, so a frame's statistics cost one kernel, not one per layer.
//
//   count_active_kernel(CountBatch b)      grid (b.first[b.count]), kCountThreads threads
//     b.mask[i]   b.n[i] bytes, each 0 or 1 (a bool mask of any shape, contiguous)
//     b.stats[i]  float64 [4] of layer i: [active pixels of this frame, sum over frames since
//                 zeroed, scratch partial sum, scratch finished-block count]; the scratch pair is
//                 zero between launches.
//     b.first[i]  the first block of mask i: blocks first[i] .. first[i + 1] - 1 count it
//   Block x of mask i counts its share of the mask (16-byte loads where the mask is 16-byte
//   aligned), adds it to stats[i][2], then counts itself done in stats[i][3]; the last of mask i's
//   blocks moves the total to stats[i][0], adds it to stats[i][1] and zeroes the scratch pair. No
//   host synchronisation (CUDA-graph capturable).
#pragma once

#include <stdint.h>

#include "grid_dependency.cuh"

namespace deltaconv {
namespace stats {

constexpr int kCountThreads = 256;
// 256 masks per launch: every zoo model's layers in one (mobilenet_v2 and resnet50 took two launches
// of 64, deeplabv3_mobilenet_v3_large three). The batch is passed by value as the kernel's parameter,
// 7,176 bytes: past the classic 4 KiB limit, within the 32,764 bytes of CUDA >= 12.1 on sm_70+.
constexpr int kMaxCount = 256;
constexpr int64_t kCountPerBlock = (int64_t)kCountThreads * 64;  // bytes: 4 16-byte words per thread

struct CountBatch {  // 8 + 8 + 8 + 4 bytes per mask, plus first[count] and the count
  const uint8_t* mask[kMaxCount];
  double* stats[kMaxCount];
  int64_t n[kMaxCount];
  int first[kMaxCount + 1];  // first[count]: the grid
  int count;
};
static_assert(sizeof(CountBatch) <= 32764, "count_active_kernel's parameter exceeds CUDA's limit");

__global__ void __launch_bounds__(kCountThreads) count_active_kernel(const CountBatch b) {
  grid_dependency_sync();
  __shared__ unsigned long long warp_sums[kCountThreads / 32];
  // the mask of this block: the last i with first[i] <= blockIdx.x (a uniform binary search)
  const int x = blockIdx.x;
  int i = 0;
  for (int half = kMaxCount / 2; half > 0; half >>= 1)
    if (i + half < b.count && b.first[i + half] <= x) i += half;
  const int blocks = b.first[i + 1] - b.first[i];
  const uint8_t* mask = b.mask[i];
  const int64_t n = b.n[i];
  const int64_t tid = (int64_t)(x - b.first[i]) * blockDim.x + threadIdx.x;
  const int64_t threads = (int64_t)blocks * blockDim.x;
  unsigned long long count = 0;
  int64_t tail = 0;
  if ((reinterpret_cast<uintptr_t>(mask) & 15) == 0) {  // bytes are 0 or 1: set bits = true bytes
    const uint4* words = reinterpret_cast<const uint4*>(mask);
    const int64_t nw = n / 16;
    for (int64_t k = tid; k < nw; k += threads) {
      const uint4 w = __ldg(words + k);
      count += __popc(w.x) + __popc(w.y) + __popc(w.z) + __popc(w.w);
    }
    tail = nw * 16;
  }
  for (int64_t k = tail + tid; k < n; k += threads) count += mask[k] != 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) count += __shfl_down_sync(0xffffffffu, count, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long block = 0;
#pragma unroll
    for (int w = 0; w < kCountThreads / 32; ++w) block += warp_sums[w];
    double* s = b.stats[i];
    atomicAdd(s + 2, (double)block);
    __threadfence();
    const double done = atomicAdd(s + 3, 1.0);
    if (done == (double)(blocks - 1)) {  // the last block of mask i: every partial is in s[2]
      __threadfence();
      const double total = atomicAdd(s + 2, 0.0);
      s[0] = total;
      s[1] += total;
      s[2] = 0.0;
      s[3] = 0.0;
    }
  }
}

}  // namespace stats
}  // namespace deltaconv
