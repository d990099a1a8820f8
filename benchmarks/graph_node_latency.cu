// Latency of CUDA-graph nodes: a chain of 100 small dependent kernels (256 blocks of 256 threads,
// each adding 1 to a 64K-int buffer) captured into one graph, with plain launches or with
// programmatic dependent launch (each kernel waits with griddepcontrol.wait, then triggers its
// dependents), and with or without a 16-byte cudaMemsetAsync node before every third kernel.
// Prints the median microseconds per kernel of 50 replays (after 10), CUDA events. Standalone: no
// torch, no deltaconv. Behind benchmarks/results/launch_ab.txt section 0 (H200, 2026-11-21):
//
//   nvcc -O2 -arch=sm_90a -o /tmp/graph_node_latency benchmarks/graph_node_latency.cu
//   /tmp/graph_node_latency
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x)                                                                   \
  do {                                                                           \
    cudaError_t e = (x);                                                         \
    if (e != cudaSuccess) {                                                      \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));          \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

__global__ void k_small(int* buf, int n, int add) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) buf[i] += add;
}

int main() {
  const int n = 1 << 16, chain = 100;
  int *buf, *cnt;
  CK(cudaMalloc(&buf, n * sizeof(int)));
  CK(cudaMalloc(&cnt, 64));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int mode = 0; mode < 4; ++mode) {
    bool pdl = mode & 1, memset = mode & 2;
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < chain; ++i) {
      if (memset && i % 3 == 0) CK(cudaMemsetAsync(cnt, 0, 16, s));
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(n / 256); cfg.blockDim = dim3(256); cfg.stream = s;
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = at; cfg.numAttrs = pdl ? 1 : 0;
      CK(cudaLaunchKernelEx(&cfg, k_small, buf, n, 1));
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    std::vector<float> t;
    for (int r = 0; r < 60; ++r) {
      cudaEventRecord(a, s); CK(cudaGraphLaunch(ge, s)); cudaEventRecord(b, s); cudaEventSynchronize(b);
      float ms; cudaEventElapsedTime(&ms, a, b); if (r >= 10) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    const float med = t[t.size() / 2];
    printf("pdl=%d memset=%d: %.3f us per kernel (median graph %.1f us)\n", pdl, memset, med * 1000 / chain,
           med * 1000);
  }
  int h[4]; CK(cudaMemcpy(h, buf, 16, cudaMemcpyDeviceToHost));
  printf("buf[0]=%d (expect %d)\n", h[0], 4 * chain * 60);
  return 0;
}
