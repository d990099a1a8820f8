// Programmatic dependent launch (Hopper and newer; ATen-free).
//
// With DELTACONV_PDL=1 the launchers start every deltaconv kernel with the programmatic stream
// serialization attribute (common.cuh: launch_kernel, pdl_enabled), so a kernel's blocks may be
// scheduled while the kernel before it in the stream is still running, and a CUDA graph replays
// the chain without a full drain between nodes. That needs a rule every kernel follows: it calls
// grid_dependency_sync() first, before it reads or writes global memory, in every block (also
// blocks that return at once). The call waits until the previous kernel has completed and its
// writes are visible, then lets the next kernel launch; since every kernel waits before it lets
// the next one start, the chain stays ordered as in a plain stream. In a plain launch it returns
// at once. Compiled for an architecture before sm_90 it does nothing, and the launcher then
// launches without the attribute.
#pragma once

namespace deltaconv {

__device__ __forceinline__ void grid_dependency_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace deltaconv
