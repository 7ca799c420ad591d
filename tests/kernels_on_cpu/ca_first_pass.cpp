// The finder's first-pass kernels on the CPU (see warp.h): kernels/ca_doublets.cu,
// ca_triplets.cu, ca_dead_ends.cu, ca_neighbours.cu and ca_evolution.cu after
// kernels/ca_common.cuh, as the engine's module. Reads a batch of sorted hits (the CPU finder's own sorting, in the
// layout src/gpu/tracking_ca.rs uploads: sx, sy, splane, each event's first hit, sorted
// count and cell starts) and the steps' tables as raw little-endian arrays from the
// directory given, one file per kernel argument, and runs the full searches as the engine
// launches them, each step from the previous one's output: for each the count, the
// per-event scan (ca_event_scan, ca_event_budget), the write; then the evolution plane
// by plane. The
// loops of one thread per item with no barrier and nothing shared run their threads one
// after the other (the atomic counts of the neighbours' index are then plain adds); the
// triplets' write goes through each warp's queue, so its blocks run warp after warp, a
// warp's 32 lanes as threads taking turns; the hits' binning, a block's threads taking turns
// (block.h). Writes the doublets to DIR/dbl (a,
// b, tx, ty bits each), their gaps to DIR/dgap, the triplets to DIR/trip (left and right
// doublet, q/p, its sigma and the chi-square as bits, the planes' word, the count of left
// neighbours, has_right, level) and the left neighbours to DIR/left, the events' one after
// the other.
#include <fstream>
#include <string>

#include "block.h"
#include "args.h"

#include "../../kernels/ca_common.cuh"
#include "../../kernels/ca_hit_sorting.cu"
#include "../../kernels/ca_doublets.cu"
#include "../../kernels/ca_triplets.cu"
#include "../../kernels/ca_dead_ends.cu"
#include "../../kernels/ca_neighbours.cu"
#include "../../kernels/ca_evolution.cu"

// Runs `kernel` on a grid of blocks_x x blocks_y blocks of CA_THREADS threads: each block's
// warps one after the other, a warp's 32 lanes as threads taking turns (launch_warps).
template <class F>
void launch_blocks_by_warps(unsigned blocks_x, unsigned blocks_y, F kernel) {
    blockDim.x = CA_THREADS;
    gridDim.x = blocks_x;
    for (unsigned y = 0; y < blocks_y; ++y) {
        for (unsigned x = 0; x < blocks_x; ++x) {
            for (unsigned w = 0; w < CA_THREADS / 32; ++w) {
                Warp warp;
                run_fibers(32, [&](unsigned l) {
                    this_warp = &warp;
                    threadIdx.x = 32 * w + l;
                    blockIdx.x = x;
                    blockIdx.y = y;
                    kernel();
                });
            }
        }
    }
}

// The engine's per-event scan: ca_event_scan over SCAN_BLOCKS blocks per event (here one
// after the other: the first takes every tile's ticket, each tile's look-back finds the one
// before it published), then ca_event_budget placing the events in order, without a
// limit. For each event e, the items first(e) .. first(e) + n(e) of `count` get their
// exclusive prefix within the event in `off`; the events' bases (their running total) and
// sizes.
struct EventScan {
    std::vector<unsigned> base, n;
    unsigned total = 0;
};
#define SCAN_BLOCKS 3
template <class First, class N>
EventScan scan_events(int n_events, First first, N n, const std::vector<unsigned>& count,
                      std::vector<unsigned>& off) {
    std::vector<unsigned> from(n_events), m(n_events), total(n_events, 0xdeadbeefu);
    std::vector<unsigned> failed(n_events, 0u);
    size_t items = 0;
    for (int e = 0; e < n_events; ++e) {
        from[e] = first(e);
        m[e] = n(e);
        items = std::max(items, (size_t)from[e] + m[e]);
    }
    // Status words from base / SCAN_TILE + e, a tile each; a new epoch on cleared words.
    std::vector<unsigned long long> status(items / SCAN_TILE + n_events + 2, 0ull);
    std::vector<unsigned long long> tickets(n_events, 0ull);
    // The epoch's base as the engine sets it before its first scans, and the first scan.
    const unsigned epoch_base = 0u;
    launch_blocks(SCAN_THREADS, SCAN_BLOCKS, (unsigned)n_events, [&] {
        ca_event_scan(count.data(), off.data(), from.data(), m.data(), 0u, failed.data(),
                      total.data(), 0, status.data(), tickets.data(), &epoch_base, 1u);
    });
    EventScan r;
    r.base.assign(n_events, 0xdeadbeefu);
    r.n.assign(n_events, 0xdeadbeefu);
    std::vector<unsigned> overflow(8, 0u);
    launch_blocks(CA_THREADS, 1, 1, [&] {
        ca_event_budget(total.data(), r.base.data(), r.n.data(), failed.data(),
                        (unsigned)n_events, 0xffffffffu, 0xffffffffu, 1u, overflow.data());
    });
    for (int e = 0; e < n_events; ++e) r.total += r.n[e];
    return r;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    const auto sx = read<float>(dir, "sx");
    const auto sy = read<float>(dir, "sy");
    const auto splane = read<unsigned>(dir, "splane");
    const auto hit_start = read<unsigned>(dir, "hit_start");
    const auto n_sorted = read<unsigned>(dir, "n_sorted");
    const auto bin_start = read<unsigned>(dir, "bin_start");
    const auto plf = read<float>(dir, "plf");
    const auto pli = read<int>(dir, "pli");
    const auto pld = read<double>(dir, "pld");
    const auto g = read<float>(dir, "g");
    const auto prf = read<float>(dir, "prf");
    const auto pri = read<int>(dir, "pri");
    const auto tents = read<float>(dir, "tents");
    const auto shape = read<int>(dir, "shape");  // n_planes, reach
    const int n_planes = shape.at(0), reach = shape.at(1);
    const double nb_chi2_max = read<double>(dir, "nb_chi2").at(0);
    const int n_events = (int)hit_start.size();
    const int n_bins = (int)(bin_start.size() / n_events) - 1;
    const size_t n_hits = sx.size();
    const std::vector<unsigned> failed(n_events, 0u);
    // The hits sorted into the grid by the kernels (ca_bin_hits with three blocks per event,
    // the cells' scan on the host, ca_place_hits, ca_rank_hits) from the events' input hits
    // (DIR/in_x, in_y, in_plane, and DIR/in_start with a last entry), written to
    // DIR/sorted for the test to compare with the CPU's sorting (the steps below run on
    // the CPU's, which the test gives).
    {
        const auto in_x = read<float>(dir, "in_x");
        const auto in_y = read<float>(dir, "in_y");
        const auto in_plane = read<unsigned>(dir, "in_plane");
        const auto in_start = read<unsigned>(dir, "in_start");
        const unsigned max_hits = read<unsigned>(dir, "max_hits").at(0);
        const size_t n_in = in_x.size();
        std::vector<unsigned> hit_bin(n_in, 0xdeadbeefu), bin_count(bin_start.size(), 0u);
        std::vector<unsigned> k_sorted(n_events, 0xdeadbeefu), k_failed(n_events, 0u);
        std::vector<unsigned> overflow(8, 0u);
        launch_blocks(CA_THREADS, 3, (unsigned)n_events, [&] {
            ca_bin_hits(in_x.data(), in_y.data(), in_plane.data(), in_start.data(), plf.data(),
                        pli.data(), n_planes, n_bins, hit_bin.data(), bin_count.data());
        });
        std::vector<unsigned> k_bin_start(bin_start.size(), 0u), cursor(bin_start.size(), 0u);
        const unsigned cells = (unsigned)n_bins + 1;
        scan_events(
            n_events, [&](int e) { return (size_t)e * cells; }, [&](int) { return cells; },
            bin_count, k_bin_start);
        std::vector<unsigned> scratch(n_in, 0xdeadbeefu), k_splane(n_in, 0xdeadbeefu);
        std::vector<unsigned> k_sinput(n_in, 0xdeadbeefu);
        std::vector<float> k_sx(n_in, NAN), k_sy(n_in, NAN);
        each_thread(CA_THREADS, 2, n_events, [&] {
            ca_place_hits(in_start.data(), hit_bin.data(), k_bin_start.data(), cursor.data(),
                          n_bins, max_hits, k_sorted.data(), k_failed.data(), overflow.data(),
                          scratch.data());
        });
        each_thread(CA_THREADS, 2, n_events, [&] {
            ca_rank_hits(in_x.data(), in_y.data(), in_plane.data(), in_start.data(),
                         hit_bin.data(), k_bin_start.data(), n_bins, k_sorted.data(),
                         k_failed.data(), scratch.data(), k_sx.data(), k_sy.data(),
                         k_splane.data(), k_sinput.data());
        });
        // Per event: its sorted count, then per sorted hit x, y bits, plane, input index,
        // then its cell starts.
        std::vector<unsigned> out;
        for (int e = 0; e < n_events; ++e) {
            out.push_back(k_failed[e] ? 0xffffffffu : k_sorted[e]);
            for (unsigned h = 0; h < k_sorted[e] && !k_failed[e]; ++h) {
                const size_t i = in_start[e] + h;
                out.insert(out.end(), {__float_as_uint(k_sx[i]), __float_as_uint(k_sy[i]),
                                       k_splane[i], k_sinput[i]});
            }
            for (int b = 0; b <= n_bins; ++b) out.push_back(k_bin_start[(size_t)e * (n_bins + 1) + b]);
        }
        if (!write_out(dir, "sorted", out)) return 2;
    }
    // A later pass where DIR/used marks the hits earlier tracks took (per input hit, with
    // each sorted hit's input index in DIR/sinput): the windows scan the free hits only.
    const bool later = std::ifstream(dir + "/used").good();
    std::vector<float> fx, fy;
    std::vector<unsigned> fmap, free_start, n_free;
    // Per event, the items of each step: the sorted hits from their first.
    auto hits_from = [&](int e) { return hit_start[e]; };
    auto sorted_n = [&](int e) { return n_sorted[e]; };
    if (later) {
        const auto used = read<unsigned>(dir, "used");
        const auto sinput = read<unsigned>(dir, "sinput");
        std::vector<unsigned> flags(n_hits, 0xdeadbeefu), prefix(n_hits, 0u);
        each_thread(CA_THREADS, 2, n_events, [&] {
            ca_free_flags(hit_start.data(), n_sorted.data(), sinput.data(), used.data(),
                          failed.data(), flags.data());
        });
        n_free = scan_events(n_events, hits_from, sorted_n, flags, prefix).n;
        fx.assign(n_hits, NAN);
        fy.assign(n_hits, NAN);
        fmap.assign(n_hits, 0xdeadbeefu);
        free_start.assign(bin_start.size(), 0xdeadbeefu);
        each_thread(CA_THREADS, 2, n_events, [&] {
            ca_free_hits(hit_start.data(), n_sorted.data(), bin_start.data(), n_bins,
                         failed.data(), flags.data(), prefix.data(), n_free.data(), sx.data(),
                         sy.data(), fx.data(), fy.data(), fmap.data(), free_start.data());
        });
    }
    // Poisoned: every hit's count must be written (in a later pass the caller zeroes the
    // used hits' counts).
    std::vector<unsigned> dbl_count(n_hits, later ? 0u : 0xdeadbeefu), dbl_off(n_hits, 0u);
    std::vector<unsigned> dcache(n_hits * DBL_CACHE, 0xdeadbeefu), dbl_base(n_events, 0u);
    std::vector<uint4> dbl;
    std::vector<unsigned> dgap;
    auto doublets = [&](int write) {
        ca_doublets(sx.data(), sy.data(), splane.data(), hit_start.data(), n_sorted.data(),
                    bin_start.data(), later ? fx.data() : nullptr, later ? fy.data() : nullptr,
                    later ? fmap.data() : nullptr, later ? free_start.data() : nullptr,
                    later ? n_free.data() : nullptr, n_bins, plf.data(), pli.data(),
                    pld.data(), g.data(), failed.data(), write, dbl_count.data(),
                    dbl_off.data(), dbl_base.data(), dbl.data(), dgap.data(), dcache.data());
    };
    // The count (a lane per hit to scan), then the write: on fresh hits a lane per hit
    // too, in a later pass through each warp's queue.
    auto run = [&](int write) {
        if (write && later) {
            launch_blocks_by_warps(2, (unsigned)n_events, [&] { doublets(1); });
        } else {
            each_thread(CA_THREADS, 2, n_events, [&] { doublets(write); });
        }
    };
    run(0);
    // The per-event exclusive scan and the events' places in the arena.
    const EventScan ds = scan_events(n_events, hits_from, sorted_n, dbl_count, dbl_off);
    const unsigned total = ds.total;
    dbl_base = ds.base;
    dbl.assign(total, make_uint4(0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu));
    dgap.assign(total, 0xdeadbeefu);
    run(1);
    // Triplets from these doublets.
    const std::vector<unsigned> dbl_n = ds.n;
    auto doublets_from = [&](int e) { return dbl_base[e]; };
    auto doublets_n = [&](int e) { return dbl_n[e]; };
    std::vector<unsigned> trip_count(total, 0xdeadbeefu), trip_off(total, 0u);
    std::vector<unsigned> trip_base(n_events, 0u), end_count(total), end_cursor(total);
    std::vector<unsigned> tleft, tright, tplane, has_right;
    std::vector<float> tqop, tsigma, tchi2;
    auto triplets = [&](int write) {
        ca_triplets(sx.data(), sy.data(), splane.data(), hit_start.data(), dbl_count.data(),
                    dbl_off.data(), dbl_base.data(), dbl_n.data(), dbl.data(), dgap.data(),
                    plf.data(), prf.data(), pri.data(), tents.data(), g.data(), n_planes, reach,
                    failed.data(), write, trip_count.data(), trip_off.data(), trip_base.data(),
                    tleft.data(), tright.data(), tqop.data(), tsigma.data(), tchi2.data(),
                    tplane.data(), has_right.data(), end_count.data(), end_cursor.data());
    };
    each_thread(CA_THREADS, 2, n_events, [&] { triplets(0); });
    const EventScan ts = scan_events(n_events, doublets_from, doublets_n, trip_count, trip_off);
    const unsigned n_trip = ts.total;
    trip_base = ts.base;
    tleft.assign(n_trip, 0xdeadbeefu);
    tright.assign(n_trip, 0xdeadbeefu);
    tplane.assign(n_trip, 0xdeadbeefu);
    has_right.assign(n_trip, 0xdeadbeefu);
    tqop.assign(n_trip, NAN);
    tsigma.assign(n_trip, NAN);
    tchi2.assign(n_trip, NAN);
    launch_blocks_by_warps(2, (unsigned)n_events, [&] { triplets(1); });
    std::vector<unsigned> trip_n = ts.n;
    // The dead ends pruned where DIR/dead_ends gives the first plane a chain may end on by
    // leaving the detector (the engine's first pass of a finder whose first pass runs to
    // the last plane): ca_dead_ends_clear, ca_dead_ends plane by plane downstream first,
    // the per-event scan of the marks, ca_dead_ends_gather, ca_dead_ends_copy_back.
    if (std::ifstream(dir + "/dead_ends").good()) {
        const unsigned first_end = read<unsigned>(dir, "dead_ends").at(0);
        const auto exits = read<float>(dir, "exits");
        std::vector<unsigned> continues(total, 0xdeadbeefu), keep(n_trip, 0xdeadbeefu);
        std::vector<unsigned> koff(n_trip, 0u);
        each_thread(CA_THREADS, 2, n_events, [&] {
            ca_dead_ends_clear(dbl_base.data(), dbl_n.data(), failed.data(), continues.data());
        });
        for (int plane = n_planes - 1; plane >= 0; --plane) {
            each_thread(CA_THREADS, 2, n_events, [&] {
                ca_dead_ends(sx.data(), sy.data(), hit_start.data(), dbl_base.data(), dbl.data(),
                             trip_base.data(), trip_n.data(), tleft.data(), tright.data(),
                             tplane.data(), exits.data(), n_planes, first_end, failed.data(),
                             (unsigned)plane, continues.data(), keep.data());
            });
        }
        const EventScan ks = scan_events(
            n_events, [&](int e) { return trip_base[e]; }, [&](int e) { return trip_n[e]; },
            keep, koff);
        std::vector<unsigned> o_left(n_trip, 0xdeadbeefu), o_right(n_trip, 0xdeadbeefu);
        std::vector<unsigned> o_plane(n_trip, 0xdeadbeefu);
        std::vector<float> o_qop(n_trip, NAN), o_sigma(n_trip, NAN), o_chi2(n_trip, NAN);
        each_thread(CA_THREADS, 2, n_events, [&] {
            ca_dead_ends_gather(trip_base.data(), trip_n.data(), failed.data(), keep.data(),
                                koff.data(), tleft.data(), tright.data(), tqop.data(),
                                tsigma.data(), tchi2.data(), tplane.data(), o_left.data(),
                                o_right.data(), o_qop.data(), o_sigma.data(), o_chi2.data(),
                                o_plane.data());
        });
        each_thread(CA_THREADS, 2, n_events, [&] {
            ca_dead_ends_copy_back(trip_base.data(), trip_n.data(), failed.data(), ks.n.data(),
                                   o_left.data(), o_right.data(), o_qop.data(),
                                   o_sigma.data(), o_chi2.data(), o_plane.data(), tleft.data(),
                                   tright.data(), tqop.data(), tsigma.data(), tchi2.data(),
                                   tplane.data(), has_right.data());
        });
    }
    // Neighbours and levels from these triplets, the steps one thread after the other.
    std::vector<unsigned> end_off(total, 0u), ending(n_trip, 0xdeadbeefu);
    each_thread(CA_THREADS, 2, n_events, [&] {
        ca_neighbours_ending(dbl_base.data(), trip_base.data(), trip_n.data(), tright.data(),
                             failed.data(), 0, end_count.data(), end_off.data(),
                             end_cursor.data(), ending.data());
    });
    scan_events(n_events, doublets_from, doublets_n, end_count, end_off);
    each_thread(CA_THREADS, 2, n_events, [&] {
        ca_neighbours_ending(dbl_base.data(), trip_base.data(), trip_n.data(), tright.data(),
                             failed.data(), 1, end_count.data(), end_off.data(),
                             end_cursor.data(), ending.data());
    });
    each_thread(CA_THREADS, 2, n_events, [&] {
        ca_neighbours_sort_ending(dbl_base.data(), dbl_n.data(), trip_base.data(), failed.data(),
                                  end_count.data(), end_off.data(), ending.data());
    });
    std::vector<unsigned> nb_count(n_trip, 0xdeadbeefu), nb_off(n_trip, 0u);
    std::vector<unsigned> nb_base(n_events, 0u), left;
    auto neighbours = [&](int write) {
        each_thread(CA_THREADS, 2, n_events, [&] {
            ca_neighbours(dbl_base.data(), trip_base.data(), trip_n.data(), tleft.data(),
                          tqop.data(), tsigma.data(), end_count.data(), end_off.data(),
                          ending.data(), nb_chi2_max, failed.data(), write, nb_count.data(),
                          nb_off.data(), nb_base.data(), left.data(), has_right.data());
        });
    };
    neighbours(0);
    const EventScan ns = scan_events(
        n_events, [&](int e) { return trip_base[e]; }, [&](int e) { return trip_n[e]; },
        nb_count, nb_off);
    nb_base = ns.base;
    left.assign(ns.total, 0xdeadbeefu);
    neighbours(1);
    std::vector<unsigned> level(n_trip, 0xdeadbeefu);
    for (int plane = 0; plane < n_planes; ++plane) {
        each_thread(CA_THREADS, 2, n_events, [&] {
            ca_evolution(trip_base.data(), trip_n.data(), tplane.data(), nb_count.data(),
                         nb_off.data(), nb_base.data(), left.data(), failed.data(),
                         (unsigned)plane, level.data());
        });
    }
    std::vector<unsigned> trip;
    trip.reserve((size_t)n_trip * 9);
    for (int e = 0; e < n_events; ++e) {
        for (unsigned t = trip_base[e]; t < trip_base[e] + trip_n[e]; ++t) {
            trip.insert(trip.end(), {tleft[t], tright[t], __float_as_uint(tqop[t]),
                                     __float_as_uint(tsigma[t]), __float_as_uint(tchi2[t]),
                                     tplane[t], nb_count[t], has_right[t], level[t]});
        }
    }
    const bool ok = write_out(dir, "dbl", dbl) && write_out(dir, "dgap", dgap) &&
                    write_out(dir, "trip", trip) && write_out(dir, "left", left);
    return ok ? 0 : 2;
}
