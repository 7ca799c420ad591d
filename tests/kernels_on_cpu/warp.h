// Runs CUDA kernel sources on the CPU for tests without a GPU: each warp's 32 lanes are
// 32 threads, __syncwarp a barrier of them, __any_sync a vote through the barrier. The
// kernel's own source is compiled unchanged after this header (with -ffp-contract=off, as
// NVRTC's --fmad=false: double-precision operations round as on the GPU), so its logic
// and its order of operations are checked; what only a GPU shows (NVRTC compiling it,
// memory faults, timing) is left to the GPU tests.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__

using std::ceil;
using std::fabs;
using std::fmax;
using std::isfinite;
using std::isnan;
using std::sqrt;
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

struct Dim3 {
    unsigned x = 0, y = 0, z = 0;
};
thread_local Dim3 threadIdx, blockIdx;
Dim3 blockDim;

struct Warp {
    std::barrier<> bar{32};
    std::atomic<int> vote{0};
};
thread_local Warp* this_warp;

inline void __syncwarp(unsigned = 0xffffffffu) { this_warp->bar.arrive_and_wait(); }

inline bool __any_sync(unsigned, bool pred) {
    if (pred) {
        this_warp->vote.store(1);
    }
    this_warp->bar.arrive_and_wait();
    const bool any = this_warp->vote.load() != 0;
    this_warp->bar.arrive_and_wait();
    if ((threadIdx.x & 31) == 0) {
        this_warp->vote.store(0);
    }
    this_warp->bar.arrive_and_wait();
    return any;
}

// Launches `kernel` as warps of one-warp blocks, one warp after the other.
template <class F>
void launch_warps(unsigned n_warps, F kernel) {
    blockDim.x = 32;
    for (unsigned w = 0; w < n_warps; ++w) {
        Warp warp;
        std::vector<std::thread> lanes;
        for (unsigned l = 0; l < 32; ++l) {
            lanes.emplace_back([&, l] {
                this_warp = &warp;
                threadIdx.x = l;
                blockIdx.x = w;
                kernel();
            });
        }
        for (auto& t : lanes) {
            t.join();
        }
    }
}
