// What the harnesses of the finder's kernels share beyond warp.h: a block's threads take
// turns (__syncthreads a barrier of them, `__shared__` one instance per kernel
// function, the blocks one after the other), the device's atomics, shuffles and fences
// as the CPU's, the launches the engine makes, and writing an output.
#pragma once
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "warp.h"

#define __launch_bounds__(...)
#define __noinline__ __attribute__((noinline))
inline float __int_as_float(int v) { return std::bit_cast<float>(v); }
inline int __float_as_int(float v) { return std::bit_cast<int>(v); }
inline unsigned __float_as_uint(float v) { return std::bit_cast<unsigned>(v); }
inline float __uint_as_float(unsigned v) { return std::bit_cast<float>(v); }
inline double __longlong_as_double(long long v) { return std::bit_cast<double>(v); }
inline long long __double_as_longlong(double v) { return std::bit_cast<long long>(v); }
using std::exp;
using std::fmaxf;
using std::fmin;
using std::fminf;
using std::log;
struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// A block's threads (launch_blocks): its barrier, this_block.
inline void __syncthreads() {
    if (!this_block) {
        std::fprintf(stderr, "__syncthreads outside launch_blocks\n");
        std::abort();
    }
    this_block->arrive_and_wait();
}
// Loads and stores past L1, and fences: the CPU's, ordered.
template <class T>
T __ldcg(const T* p) {
    std::atomic_thread_fence(std::memory_order_acquire);
    return *p;
}
template <class T>
void __stcg(T* p, T v) {
    *p = v;
    std::atomic_thread_fence(std::memory_order_release);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// Shared memory: one instance per kernel function; a launch's blocks run one after the
// other, each starting from what the last left (as a GPU's does not promise: the kernels
// initialise what they read).
#define __shared__ static
template <class T>
T atomicAdd(T* p, T v) {
    return std::atomic_ref<T>(*p).fetch_add(v);
}
template <class T>
T atomicOr(T* p, T v) {
    return std::atomic_ref<T>(*p).fetch_or(v);
}
template <class T>
T atomicAnd(T* p, T v) {
    return std::atomic_ref<T>(*p).fetch_and(v);
}
template <class T>
T atomicExch(T* p, T v) {
    return std::atomic_ref<T>(*p).exchange(v);
}
template <class T>
T atomicMin(T* p, T v) {
    std::atomic_ref<T> r(*p);
    T old = r.load();
    while (v < old && !r.compare_exchange_weak(old, v)) {
    }
    return old;
}
template <class T>
T atomicMax(T* p, T v) {
    std::atomic_ref<T> r(*p);
    T old = r.load();
    while (v > old && !r.compare_exchange_weak(old, v)) {
    }
    return old;
}

// Runs `kernel` on a grid of blocks_x x blocks_y blocks of `threads` threads, a block's
// threads taking turns (__syncthreads a barrier of them; each warp's 32 for the warp's
// primitives), the blocks one after the other (so `static` shared memory is the block's):
// the same `threads` threads take every block in turn, all of them done with one before
// the next starts.
template <class F>
void launch_blocks(unsigned threads, unsigned blocks_x, unsigned blocks_y, F kernel) {
    blockDim.x = threads;
    gridDim.x = blocks_x;
    Barrier block((int)threads), done((int)threads);
    std::vector<Warp> warps(threads / 32);
    run_fibers(threads, [&](unsigned t) {
        this_block = &block;
        this_warp = &warps[t / 32];
        threadIdx.x = t;
        for (unsigned y = 0; y < blocks_y; ++y) {
            for (unsigned x = 0; x < blocks_x; ++x) {
                blockIdx.x = x;
                blockIdx.y = y;
                kernel();
                done.arrive_and_wait();
            }
        }
    });
}

// Runs `step` as a launch of `blocks` blocks of `threads` threads per event (blockIdx.y
// the event), one thread after the other: for the loops of one thread per item with no
// barrier and nothing shared.
template <class F>
void each_thread(unsigned threads, unsigned blocks, int n_events, F step) {
    blockDim.x = threads;
    gridDim.x = blocks;
    for (int e = 0; e < n_events; ++e) {
        for (unsigned b = 0; b < gridDim.x; ++b) {
            for (unsigned t = 0; t < threads; ++t) {
                blockIdx.x = b;
                blockIdx.y = (unsigned)e;
                threadIdx.x = t;
                step();
            }
        }
    }
}

// Writes `v` raw to DIR/name; false where it cannot.
template <class T>
bool write_out(const std::string& dir, const char* name, const std::vector<T>& v) {
    FILE* f = std::fopen((dir + "/" + name).c_str(), "wb");
    const bool ok = f && std::fwrite(v.data(), sizeof(T), v.size(), f) == v.size();
    if (f) std::fclose(f);
    if (!ok) std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name);
    return ok;
}
