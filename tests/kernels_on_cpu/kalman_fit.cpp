// kernels/kalman_fit.cu on the CPU (see warp.h): reads a batch packed as
// src/gpu/tracking_fit.rs packs it and the fit's tables as raw little-endian arrays from
// the directory given, one file per kernel argument, runs the kernel with one thread per
// candidate as the engine launches it (blocks of 128 threads, run one thread after the
// other: the kernel's threads share nothing), and writes the output words to DIR/out.
#include <bit>
#include <math.h>
#include <cstdio>
#include <string>

#include "warp.h"
#include "args.h"

#define __noinline__ __attribute__((noinline))
inline float __uint_as_float(unsigned v) { return std::bit_cast<float>(v); }
inline float __int_as_float(int v) { return std::bit_cast<float>(v); }
inline unsigned __float_as_uint(float v) { return std::bit_cast<unsigned>(v); }
inline double __longlong_as_double(long long v) { return std::bit_cast<double>(v); }
using std::exp;
using std::fmin;
using std::log;

#include "../../kernels/kalman_fit.cu"

// The exchange's trial fits (kernels/ca_exchange.cu): kalman_fit_track_within, each
// track's retry only within its bound, its words written as the kalman_fit kernel writes
// them.
static void fit_within(const unsigned* hits, int n_tracks, int stride, int kmax,
                       const FitTableArgs& a, const std::vector<float>& within,
                       std::vector<unsigned>& out) {
    const KalmanTables T = {a.rows32.data(), a.rows64.data(), a.gap_steps.data(),
                            a.gap_kind.data(), a.gap_slice.data(), a.slices.data(),
                            a.pf.data(),      a.pd.data(),      a.pi.data(),
                            a.nodes.data()};
    for (int t = 0; t < n_tracks; ++t) {
        KalmanResult r;
        kalman_fit_track_within(batch_hits(hits, stride, kmax, t), (int)hits[t], kmax, T, r,
                                within.at(t));
        store_batch_fit(r, out.data(), stride, t);
    }
}

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    const auto shape = read<int>(dir, "shape");  // n_tracks, stride, kmax[, within]
    const int n_tracks = shape.at(0), stride = shape.at(1), kmax = shape.at(2);
    const auto hits = read<unsigned>(dir, "hits");
    const FitTableArgs t = read_fit_tables(dir);
    // Poisoned: every word of a candidate must be written.
    std::vector<unsigned> out((size_t)OUT_WORDS * stride, 0xdeadbeefu);
    blockDim.x = 128;
    gridDim.x = (n_tracks + 127) / 128;
    if (shape.size() > 3 && shape[3] != 0) {
        // Each track's retry only within DIR/within's bound.
        fit_within(hits.data(), n_tracks, stride, kmax, t, read<float>(dir, "within"), out);
        gridDim.x = 0;
    }
    for (unsigned b = 0; b < gridDim.x; ++b) {
        for (unsigned l = 0; l < blockDim.x; ++l) {
            blockIdx.x = b;
            threadIdx.x = l;
            kalman_fit(hits.data(), n_tracks, stride, kmax, t.rows32.data(), t.rows64.data(),
                       t.gap_steps.data(), t.gap_kind.data(), t.gap_slice.data(),
                       t.slices.data(), t.pf.data(), t.pd.data(), t.pi.data(), t.nodes.data(),
                       out.data());
        }
    }
    FILE* f = std::fopen((dir + "/out").c_str(), "wb");
    if (!f || std::fwrite(out.data(), sizeof(unsigned), out.size(), f) != out.size()) {
        std::fprintf(stderr, "cannot write %s/out\n", dir.c_str());
        return 2;
    }
    std::fclose(f);
    return 0;
}
