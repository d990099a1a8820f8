// Records the multiprocessor (%smid) of every block of a grid; see block_placement_probe.py.
#include <cuda_runtime.h>
#include <cstdio>
__global__ void probe_kernel(int* out, int spin) {
  extern __shared__ char smem[];
  unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  long long t0 = clock64();
  while (clock64() - t0 < spin) {}
  if (threadIdx.x == 0) out[blockIdx.x + gridDim.x * blockIdx.y] = (int)s;
  smem[threadIdx.x] = 0;
}
extern "C" int probe(int gx, int gy, int threads, int smem, int spin, int* host) {
  int* d; cudaMalloc(&d, gx * gy * sizeof(int));
  cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int occ = 0; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, probe_kernel, threads, smem);
  probe_kernel<<<dim3(gx, gy), threads, smem>>>(d, spin);
  cudaError_t e = cudaDeviceSynchronize();
  cudaMemcpy(host, d, gx * gy * sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return e == cudaSuccess ? occ : -1;
}
