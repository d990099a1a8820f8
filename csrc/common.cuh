// Shared helpers for the deltaconv CUDA launchers: argument checks that name the argument and the
// value received, dtype dispatch over the activation dtypes, and the launch check.
// Kernel templates (the *.cuh files under csrc/kernels and csrc/conv) stay free of ATen; only
// launchers (*.cu) include this header.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

namespace deltaconv {

// The activation dtypes every op supports.
inline bool is_activation_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

#define DC_CHECK_CUDA(op, name, t)                                                                   \
  TORCH_CHECK((t).is_cuda(), "deltaconv::" op ": argument '" name "' must be a CUDA tensor, got ", \
              (t).device())

#define DC_CHECK_DTYPE(op, name, t, expected)                                                        \
  TORCH_CHECK((t).scalar_type() == (expected), "deltaconv::" op ": argument '" name "' must have dtype ", \
              (expected), ", got ", (t).scalar_type())

#define DC_CHECK_ACTIVATION_DTYPE(op, name, t)                                                        \
  TORCH_CHECK(::deltaconv::is_activation_dtype((t).scalar_type()), "deltaconv::" op ": argument '" name \
              "' must be float32, float16 or bfloat16, got ", (t).scalar_type())

#define DC_CHECK_DIM(op, name, t, d)                                                                  \
  TORCH_CHECK((t).dim() == (d), "deltaconv::" op ": argument '" name "' must be ", (d), "-D, got shape ", \
              (t).sizes())

#define DC_CHECK_SAME_DEVICE(op, name, t, ref)                                                        \
  TORCH_CHECK((t).device() == (ref).device(), "deltaconv::" op ": argument '" name "' is on ", (t).device(), \
              " but the delta is on ", (ref).device())

#define DC_CHECK_CHANNELS_LAST(op, name, t)                                                           \
  TORCH_CHECK((t).is_contiguous(at::MemoryFormat::ChannelsLast),                                     \
              "deltaconv::" op ": argument '" name "' must be channels_last contiguous (call "         \
              ".contiguous(memory_format=torch.channels_last)), got strides ", (t).strides())

// Dispatch over float / half / bfloat16 with the CUDA element type bound to `scalar_t`.
#define DC_DISPATCH_ACTIVATION_TYPES(TYPE, NAME, ...)                                                 \
  [&] {                                                                                              \
    switch (TYPE) {                                                                                  \
      case at::kFloat: { using scalar_t = float; return __VA_ARGS__(); }                             \
      case at::kHalf: { using scalar_t = __half; return __VA_ARGS__(); }                             \
      case at::kBFloat16: { using scalar_t = __nv_bfloat16; return __VA_ARGS__(); }                  \
      default: TORCH_CHECK(false, NAME ": unsupported dtype ", TYPE);                                \
    }                                                                                                \
  }()

// After every kernel launch.
#define DC_LAUNCH_CHECK() C10_CUDA_KERNEL_LAUNCH_CHECK()

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The rms measure's limit on sum_c change^2 for `threshold` over `channels` channels (sqrt of the
// mean > threshold), or -1 for the max measure (what the kernels' PendingSize tests read). Below a
// negative threshold every change lies under both measures, so that case takes the max test.
inline float rms_limit(bool rms, double threshold, int64_t channels) {
  return rms && threshold >= 0 ? static_cast<float>(threshold * threshold * static_cast<double>(channels)) : -1.f;
}

}  // namespace deltaconv
