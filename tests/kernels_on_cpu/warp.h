// Runs CUDA kernel sources on the CPU for tests without a GPU: each warp's 32 lanes are
// 32 threads, __syncwarp a barrier of the mask's lanes, __any_sync, __ballot_sync and the
// shuffles exchanges through it. The
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
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
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

// The lanes of a mask: their barrier and the words their votes gather in. A warp's full
// mask is the warp's own; a part of it (lanes that take a branch or a loop together, as a
// pair or a half of the warp) gets its own on first use.
struct Lanes {
    explicit Lanes(int n) : bar(n) {}
    std::barrier<> bar;
    std::atomic<int> vote{0};
    std::atomic<unsigned> ballot{0};
};

struct Warp {
    Lanes all{32};
    unsigned long long slots[32];
    std::mutex parts_lock;
    std::map<unsigned, std::unique_ptr<Lanes>> parts;
};
thread_local Warp* this_warp;

inline Lanes& lanes_of(unsigned mask) {
    if (mask == 0xffffffffu) return this_warp->all;
    std::lock_guard<std::mutex> g(this_warp->parts_lock);
    auto& p = this_warp->parts[mask];
    if (!p) p = std::make_unique<Lanes>(std::popcount(mask));
    return *p;
}

// The lowest lane of a mask (which resets its gathered words).
inline bool first_of(unsigned mask) {
    return (threadIdx.x & 31) == (unsigned)std::countr_zero(mask);
}

inline void __syncwarp(unsigned mask = 0xffffffffu) { lanes_of(mask).bar.arrive_and_wait(); }

inline bool __any_sync(unsigned mask, bool pred) {
    Lanes& g = lanes_of(mask);
    if (pred) {
        g.vote.store(1);
    }
    g.bar.arrive_and_wait();
    const bool any = g.vote.load() != 0;
    g.bar.arrive_and_wait();
    if (first_of(mask)) {
        g.vote.store(0);
    }
    g.bar.arrive_and_wait();
    return any;
}

inline unsigned __ballot_sync(unsigned mask, bool pred) {
    Lanes& g = lanes_of(mask);
    if (pred) {
        g.ballot.fetch_or(1u << (threadIdx.x & 31));
    }
    g.bar.arrive_and_wait();
    const unsigned votes = g.ballot.load();
    g.bar.arrive_and_wait();
    if (first_of(mask)) {
        g.ballot.store(0);
    }
    g.bar.arrive_and_wait();
    return votes;
}

// A value through the lanes' slots, as its bits.
template <class T>
unsigned long long to_slot(T v) {
    static_assert(sizeof(T) <= sizeof(unsigned long long));
    unsigned long long s = 0;
    std::memcpy(&s, &v, sizeof(T));
    return s;
}
template <class T>
T from_slot(unsigned long long s) {
    T v;
    std::memcpy(&v, &s, sizeof(T));
    return v;
}

// Lane `src(lane)`'s value of `v`, for the lanes of `mask`.
template <class T, class Src>
T exchange_lanes(unsigned mask, T v, Src src) {
    Lanes& g = lanes_of(mask);
    const unsigned lane = threadIdx.x & 31;
    this_warp->slots[lane] = to_slot(v);
    g.bar.arrive_and_wait();
    const T r = from_slot<T>(this_warp->slots[src(lane) & 31]);
    g.bar.arrive_and_wait();
    return r;
}

template <class T>
T __shfl_sync(unsigned mask, T v, int src) {
    return exchange_lanes(mask, v, [&](unsigned) { return (unsigned)src; });
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int o) {
    return exchange_lanes(mask, v, [&](unsigned lane) { return lane ^ (unsigned)o; });
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, int o) {
    const unsigned d = (unsigned)o;
    const T r = exchange_lanes(mask, v, [&](unsigned lane) { return lane >= d ? lane - d : lane; });
    return (threadIdx.x & 31) >= d ? r : v;
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
