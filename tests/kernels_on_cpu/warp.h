// Runs CUDA kernel sources on the CPU for tests without a GPU: each warp's 32 lanes are
// 32 threads, __syncwarp a barrier of them, __any_sync, __ballot_sync and __shfl_sync
// exchanges through the barrier. The
// kernel's own source is compiled unchanged after this header (with -ffp-contract=off, as
// NVRTC's --fmad=false: double-precision operations round as on the GPU), so its logic
// and its order of operations are checked; what only a GPU shows (NVRTC compiling it,
// memory faults, timing) is left to the GPU tests.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
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
Dim3 blockDim, gridDim;

struct Warp {
    std::barrier<> bar{32};
    std::atomic<int> vote{0};
    std::atomic<unsigned> ballot{0};
    unsigned long long slots[32];
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

inline unsigned __ballot_sync(unsigned, bool pred) {
    if (pred) {
        this_warp->ballot.fetch_or(1u << (threadIdx.x & 31));
    }
    this_warp->bar.arrive_and_wait();
    const unsigned votes = this_warp->ballot.load();
    this_warp->bar.arrive_and_wait();
    if ((threadIdx.x & 31) == 0) {
        this_warp->ballot.store(0);
    }
    this_warp->bar.arrive_and_wait();
    return votes;
}

inline unsigned __shfl_sync(unsigned, unsigned v, int src) {
    this_warp->slots[threadIdx.x & 31] = v;
    this_warp->bar.arrive_and_wait();
    const unsigned r = (unsigned)this_warp->slots[src & 31];
    this_warp->bar.arrive_and_wait();
    return r;
}

inline int __popc(unsigned v) { return std::popcount(v); }
inline int __ffs(int v) { return v == 0 ? 0 : std::countr_zero((unsigned)v) + 1; }

// Launches `kernel` as warps of one-warp blocks, one warp after the other.
template <class F>
void launch_warps(unsigned n_warps, F kernel) {
    blockDim.x = 32;
    gridDim.x = n_warps;
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
