// The native pointwise non-linearities (deltaconv/activations.py NATIVE_KINDS), in float32, with
// the formulas of PyTorch's CUDA kernels so that results agree to the last bit or so.
#pragma once

#include <math.h>

namespace deltaconv {
namespace pw {

// Same order as kActivationKinds in pointwise_ops.cu.
enum ActKind : int {
  kIdentity = 0,
  kRelu,
  kRelu6,
  kLeakyRelu,    // param: negative slope
  kHardswish,
  kHardsigmoid,
  kSilu,
  kSigmoid,
  kGelu,         // param: 0 exact (erf), 1 tanh approximation
  kTanh,
  kElu,          // param: alpha
  kPrelu,        // param: the negative slope of the element's channel (ActivationParams::slopes[c]);
                 // computed as kLeakyRelu with that slope (computed_kind)
  kNumActKinds
};

// The kind whose formula apply_activation applies for `kind`: PReLU is LeakyReLU with the channel's
// slope as param (as torch's prelu kernel: input > 0 ? input : weight * input). apply_activation has
// no case of its own for kPrelu: one more case label turned more of the switching kernel's switches
// into jump tables and cost sigmoid up to 13 % and SiLU up to 7 % there (H100, 2026-12-07,
// benchmarks/results/prelu_ab.txt section 6).
__host__ __device__ constexpr int computed_kind(int kind) { return kind == kPrelu ? kLeakyRelu : kind; }

__device__ __forceinline__ float apply_activation(int kind, float param, float x) {
  switch (kind) {
    case kRelu:
      return x < 0.f ? 0.f : x;  // NaN propagates, like torch.relu
    case kRelu6:
      return x < 0.f ? 0.f : (x > 6.f ? 6.f : x);
    case kLeakyRelu:
      return x > 0.f ? x : x * param;
    case kHardswish:
      return x * fminf(fmaxf(x + 3.f, 0.f), 6.f) * (1.f / 6.f);
    case kHardsigmoid:
      return fminf(fmaxf(x + 3.f, 0.f), 6.f) * (1.f / 6.f);
    case kSilu:
      return x / (1.f + expf(-x));
    case kSigmoid:
      return 1.f / (1.f + expf(-x));
    case kGelu:
      if (param != 0.f) {
        const float kBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5);
        const float kKappa = 0.044715f;
        const float inner = kBeta * (x + kKappa * (x * x * x));
        return 0.5f * x * (1.f + tanhf(inner));
      }
      return x * 0.5f * (1.f + erff(x * static_cast<float>(M_SQRT1_2)));
    case kTanh:
      return tanhf(x);
    case kElu:
      return x <= 0.f ? expm1f(x) * param : x;
    default:  // kIdentity
      return x;
  }
}

}  // namespace pw
}  // namespace deltaconv
