// An experiment (benchmarks/experiments/value_activation.py): the memory traffic of a non-linear
// layer in delta mode (the library) against value mode (benchmarks/experiments/value_mode.py).
//
// Both kernels run ReLU6 with the rms truncation measure over a list of active pixels of a
// channels-last [P, C] float16 map, a warp (or a group of C / 8 lanes when C < 256) per pixel, 8
// channels (16 bytes) per lane and step, as the library's activation_kernel does
// (csrc/kernels/pointwise.cuh), including its two passes (the send re-reads its inputs):
//   delta: reads the delta (fp16) and the accumulator (fp32), writes the accumulator, reads `sent`
//          (fp16); a sent pixel writes `sent` and the change (`out`, fp16): 14 + 4 bytes per element;
//   value: reads the recomputed input x (fp16) and `sent`; a sent pixel writes `sent` (what the
//          next convolution reads): 4 + 2 bytes per element.
// send: 0 sends no pixel, 1 every pixel, else by the measure against `threshold`.
//
// Build (this CPU machine; run on the GPU machine, torch loads the CUDA runtime first):
//   nvcc -O3 -arch=sm_90a -shared -Xcompiler -fPIC -cudart shared \
//       benchmarks/experiments/value_activation.cu -o value_activation.so
#include <cuda_fp16.h>
#include <cstdint>

namespace {

__device__ __forceinline__ void load8(const __half* p, float v[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ void store8(__half* p, const float v[8]) {
  uint4 u;
  __half2* h = reinterpret_cast<__half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}

__device__ __forceinline__ float relu6(float a) { return fminf(fmaxf(a, 0.f), 6.f); }
__device__ __forceinline__ float round_h(float a) { return __half2float(__float2half_rn(a)); }

template <bool VALUE>
__global__ void __launch_bounds__(256) act_kernel(const int* __restrict__ pixels, int n, int C, int log2_lanes,
                                                  const __half* __restrict__ in, float* __restrict__ acc,
                                                  __half* __restrict__ sent, __half* __restrict__ out,
                                                  float limit, int send_mode) {
  const int lanes = 1 << log2_lanes;
  const int lane = threadIdx.x & (lanes - 1);
  const int group = (blockIdx.x * blockDim.x + threadIdx.x) >> log2_lanes;
  const bool live = group < n;
  const int64_t row = live ? static_cast<int64_t>(pixels[group]) * C : 0;
  float sq = 0.f;
  if (live) {
    for (int c = lane * 8; c < C; c += lanes * 8) {
      float x[8], s[8];
      load8(in + row + c, x);
      if (!VALUE) {
        float4* a4 = reinterpret_cast<float4*>(acc + row + c);
        float4 a0 = a4[0], a1 = a4[1];
        x[0] += a0.x; x[1] += a0.y; x[2] += a0.z; x[3] += a0.w;
        x[4] += a1.x; x[5] += a1.y; x[6] += a1.z; x[7] += a1.w;
        a4[0] = make_float4(x[0], x[1], x[2], x[3]);
        a4[1] = make_float4(x[4], x[5], x[6], x[7]);
      }
      load8(sent + row + c, s);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float d = round_h(relu6(x[i])) - s[i];
        sq = fmaf(d, d, sq);
      }
    }
  }
  for (int o = lanes >> 1; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o, lanes);
  const bool send = live && (send_mode == 1 || (send_mode == 2 && sq > limit));
  if (!send) return;
  for (int c = lane * 8; c < C; c += lanes * 8) {  // second pass: re-read, as the library's send
    float x[8], s[8], y[8];
    if (VALUE) {
      load8(in + row + c, x);
    } else {
      const float4* a4 = reinterpret_cast<const float4*>(acc + row + c);
      const float4 a0 = a4[0], a1 = a4[1];
      x[0] = a0.x; x[1] = a0.y; x[2] = a0.z; x[3] = a0.w;
      x[4] = a1.x; x[5] = a1.y; x[6] = a1.z; x[7] = a1.w;
    }
    load8(sent + row + c, s);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      y[i] = round_h(relu6(x[i]));
      s[i] = y[i] - s[i];
    }
    store8(sent + row + c, y);
    if (!VALUE) store8(out + row + c, s);
  }
}

}  // namespace

extern "C" int launch(int value, const int* pixels, int n, int C, const void* in, float* acc, void* sent,
                      void* out, float limit, int send_mode) {
  int log2_lanes = 5;
  while (log2_lanes > 0 && (8 << log2_lanes) > C) --log2_lanes;
  const int64_t threads = static_cast<int64_t>(n) << log2_lanes;
  const int blocks = static_cast<int>((threads + 255) / 256);
  if (blocks == 0) return 0;
  if (value)
    act_kernel<true><<<blocks, 256>>>(pixels, n, C, log2_lanes, static_cast<const __half*>(in), acc,
                                      static_cast<__half*>(sent), static_cast<__half*>(out), limit, send_mode);
  else
    act_kernel<false><<<blocks, 256>>>(pixels, n, C, log2_lanes, static_cast<const __half*>(in), acc,
                                       static_cast<__half*>(sent), static_cast<__half*>(out), limit, send_mode);
  return static_cast<int>(cudaGetLastError());
}
