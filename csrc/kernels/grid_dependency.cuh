// Programmatic dependent launch (Hopper and newer; ATen-free).
//
// With DELTACONV_PDL=1 the launchers start every deltaconv kernel with the programmatic stream
// serialization attribute (common.cuh: launch_kernel, pdl_enabled), so a CUDA graph replays the
// chain without a full drain between nodes: a kernel may be launched once every block of the
// kernel before it has exited, before that kernel's completion is flushed. That needs a rule every
// kernel follows: it calls grid_dependency_sync() first, before it reads or writes global memory,
// in every block (also blocks that return at once). The call waits until the previous kernel has
// completed and its writes are visible, so the chain stays ordered as in a plain stream. (One
// exception: the weight-stationary 3x3 kernel requests its first weight chunk before the call, as
// no kernel of its op writes weights; conv3x3_stationary.cuh.) In a
// plain launch it returns at once. Compiled for an architecture before sm_90 it does nothing, and
// the launcher then launches without the attribute.
//
// No kernel triggers its dependents early (griddepcontrol.launch_dependents): with the trigger
// right after the wait, the next kernel's blocks could sit on the multiprocessors while this one
// ran, and deeplabv3_mobilenet_v3_large ran 2.7 % slower per frame; without it every kernel cell
// and model measured was as fast or faster (H200, 2026-11-21, benchmarks/results/launch_ab.txt).
#pragma once

namespace deltaconv {

__device__ __forceinline__ void grid_dependency_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace deltaconv
