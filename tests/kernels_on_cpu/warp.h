// Runs CUDA kernel sources on the CPU for tests without a GPU: a launch's threads are
// fibers that take turns on one CPU thread (each with its own stack; a thread runs until it
// waits at a barrier, or in a loop that waits for another thread's write, SPIN_PAUSE, and
// hands over to the next), __syncthreads and __syncwarp barriers of the block's or the
// mask's threads, __any_sync, __ballot_sync and the shuffles exchanges through them. The
// kernel's own source is compiled unchanged after this header (with -ffp-contract=off, as
// NVRTC's --fmad=false: double-precision operations round as on the GPU), so its logic
// and its order of operations are checked; what only a GPU shows (NVRTC compiling it,
// memory faults, timing, threads truly at once) is left to the GPU tests.
#pragma once
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>

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
Dim3 threadIdx, blockIdx, blockDim, gridDim;

struct Warp;
struct Barrier;
// The running thread's warp and block (the block's barrier), as threadIdx and blockIdx:
// the fibers' scheduler sets them for the thread it resumes.
Warp* this_warp = nullptr;
Barrier* this_block = nullptr;

// The fibers of a launch, taking turns on this CPU thread in the order of their index.
namespace fibers {
struct Fiber {
    ucontext_t ctx;
    std::function<void(unsigned)> const* body = nullptr;
    unsigned index = 0;
    bool done = false;
    Dim3 tid, bid;
    Warp* warp = nullptr;
    Barrier* block = nullptr;
};
// Stacks of 1 MiB above a page no access is allowed to (a stack that overflows faults
// there), reserved once and reused (pages are taken as they are touched).
constexpr size_t STACK_BYTES = 1u << 20;
constexpr size_t GUARD_BYTES = 1u << 16;
inline std::vector<char*> stacks;
inline std::vector<Fiber> team;
inline size_t current = 0;
inline ucontext_t caller;
// Turns handed over since a barrier last opened or a thread ended: beyond MAX_IDLE_TURNS
// every thread left waits for another (a barrier some never reach): the launch aborts
// instead of turning forever.
inline unsigned long long idle_turns = 0;
constexpr unsigned long long MAX_IDLE_TURNS = 100'000'000ull;

inline void save(Fiber& f) {
    f.tid = threadIdx;
    f.bid = blockIdx;
    f.warp = this_warp;
    f.block = this_block;
}
inline void load(const Fiber& f) {
    threadIdx = f.tid;
    blockIdx = f.bid;
    this_warp = f.warp;
    this_block = f.block;
}
// The next fiber after `from` that has not ended, or `from` itself (which may have).
inline size_t next_after(size_t from) {
    const size_t n = team.size();
    for (size_t k = 1; k < n; ++k) {
        const size_t i = (from + k) % n;
        if (!team[i].done) return i;
    }
    return from;
}
inline void entry() {
    Fiber& f = team[current];
    (*f.body)(f.index);
    f.done = true;
    idle_turns = 0;
    const size_t i = next_after(current);
    if (i == current) setcontext(&caller);
    current = i;
    load(team[i]);
    setcontext(&team[i].ctx);
}
}  // namespace fibers

// Hands the turn to the next thread of the launch that has not ended (the caller's turn
// comes back after each of them has had one).
inline void fiber_yield() {
    using namespace fibers;
    const size_t from = current, to = next_after(from);
    if (++idle_turns > MAX_IDLE_TURNS) {
        std::fprintf(stderr,
                     "the launch's threads wait for each other forever (thread %u of block "
                     "(%u, %u) waiting)\n",
                     threadIdx.x, blockIdx.x, blockIdx.y);
        std::abort();
    }
    if (to == from) return;
    save(team[from]);
    current = to;
    load(team[to]);
    swapcontext(&team[from].ctx, &team[to].ctx);
}

// Runs body(0) .. body(n - 1) as n threads taking turns; returns when all have ended.
inline void run_fibers(unsigned n, const std::function<void(unsigned)>& body) {
    using namespace fibers;
    if (n == 0) return;
    team.assign(n, Fiber{});
    while (stacks.size() < n) {
        void* st = mmap(nullptr, GUARD_BYTES + STACK_BYTES, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (st == MAP_FAILED || mprotect(st, GUARD_BYTES, PROT_NONE) != 0) {
            std::fprintf(stderr, "cannot map a fiber's stack\n");
            std::abort();
        }
        stacks.push_back(static_cast<char*>(st) + GUARD_BYTES);
    }
    for (unsigned i = 0; i < n; ++i) {
        Fiber& f = team[i];
        f.body = &body;
        f.index = i;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = stacks[i];
        f.ctx.uc_stack.ss_size = STACK_BYTES;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, entry, 0);
    }
    current = 0;
    swapcontext(&caller, &team[0].ctx);
    team.clear();
}

// A barrier of `n` threads of a launch: each waits, taking turns with the others, until
// all n have arrived.
struct Barrier {
    explicit Barrier(int n) : expected(n) {}
    void arrive_and_wait() {
        const unsigned long long g = generation;
        if (++arrived == expected) {
            arrived = 0;
            ++generation;
            fibers::idle_turns = 0;
            return;
        }
        while (generation == g) fiber_yield();
    }
    int expected;
    int arrived = 0;
    unsigned long long generation = 0;
};

// A loop that waits for another thread's write (kernels/ca_common.cuh): the others' turn.
#define SPIN_PAUSE() fiber_yield()

// The lanes of a mask: their barrier and the words their votes gather in. A warp's full
// mask is the warp's own; a part of it (lanes that take a branch or a loop together, as a
// pair or a half of the warp) gets its own on first use.
struct Lanes {
    explicit Lanes(int n) : bar(n) {}
    Barrier bar;
    int vote = 0;
    unsigned ballot = 0;
};

struct Warp {
    Lanes all{32};
    unsigned long long slots[32];
    std::map<unsigned, std::unique_ptr<Lanes>> parts;
};
inline Lanes& lanes_of(unsigned mask) {
    if (mask == 0xffffffffu) return this_warp->all;
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
        g.vote = 1;
    }
    g.bar.arrive_and_wait();
    const bool any = g.vote != 0;
    g.bar.arrive_and_wait();
    if (first_of(mask)) {
        g.vote = 0;
    }
    g.bar.arrive_and_wait();
    return any;
}

inline unsigned __ballot_sync(unsigned mask, bool pred) {
    Lanes& g = lanes_of(mask);
    if (pred) {
        g.ballot |= 1u << (threadIdx.x & 31);
    }
    g.bar.arrive_and_wait();
    const unsigned votes = g.ballot;
    g.bar.arrive_and_wait();
    if (first_of(mask)) {
        g.ballot = 0;
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
        run_fibers(32, [&](unsigned l) {
            this_warp = &warp;
            threadIdx.x = l;
            blockIdx.x = w;
            kernel();
        });
    }
}
