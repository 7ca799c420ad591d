// The finder's candidate step on the CPU (see warp.h and block.h): kernels/ca_candidates.cu
// after kernels/ca_common.cuh and kernels/kalman_fit.cu, as the engine's module. Reads a
// batch's first-pass arrays in the layout src/gpu/tracking_ca.rs keeps on the device (the
// events' input hits, each sorted hit's input index, the doublets, triplets, neighbour
// index and levels, the used flags per input hit), the fit's tables and the limits, as raw
// little-endian arrays from the directory given, one file per kernel argument, and runs
// the step as GpuCaEngine::select_candidates launches it, once per entry of DIR/appends
// (0: from scratch, 1: appended to the call before): ca_candidates_order (a block per
// event), ca_event_budget, ca_candidates_chains (its threads one after the other), then
// ca_candidates or ca_candidates_small (a block of 256 or 128 threads per event, all
// together: the choice's warp, the fits, the second chances fitted ahead by the other
// warps); with the second round, the chains walked again around the used hits and chosen
// again. After call k it writes DIR/tracks<k> (per event its accepted count, 0xffffffff
// where it failed, then per accepted track its hit count, its hits as input indices and
// its fit's words) and DIR/used<k> (the used flags per input hit). Then the last call's
// tracks packed (kernels/ca_tracks.cu), to DIR/packed in the same form, and copied into
// the clone step's layout, to DIR/clone_*.
#include <climits>
#include <string>

#include "block.h"
#include "args.h"

#include "../../kernels/ca_common.cuh"
#include "../../kernels/kalman_fit.cu"
#include "../../kernels/ca_candidates.cu"
#include "../../kernels/ca_tracks.cu"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    // n_events, threads of the candidate blocks, the second round, min_hits, the CPU's
    // limits (candidates, candidate hits, tracks), each event's shares of the candidate
    // and candidate-hit arenas, the chain arena.
    const auto shape = read<unsigned>(dir, "shape");
    const unsigned n_events = shape.at(0), threads = shape.at(1), divert = shape.at(2);
    const unsigned min_hits = shape.at(3), max_cand = shape.at(4), hits_cap = shape.at(5);
    const unsigned max_tracks = shape.at(6), share_cand = shape.at(7), share_hits = shape.at(8);
    const unsigned max_chain_hits = shape.at(9), refit = shape.at(10);
    const double max_chi2_ndf = read<double>(dir, "max_chi2_ndf").at(0);
    const auto appends = read<int>(dir, "appends");
    const auto in_x = read<float>(dir, "in_x");
    const auto in_y = read<float>(dir, "in_y");
    const auto in_plane = read<unsigned>(dir, "in_plane");
    const auto hit_start = read<unsigned>(dir, "hit_start");
    const auto sinput = read<unsigned>(dir, "sinput");
    auto used = read<unsigned>(dir, "used");
    const auto dbl = read<uint4>(dir, "dbl");
    const auto dbl_base = read<unsigned>(dir, "dbl_base");
    const auto trip_base = read<unsigned>(dir, "trip_base");
    const auto trip_n = read<unsigned>(dir, "trip_n");
    const auto tleft = read<unsigned>(dir, "tleft");
    const auto tright = read<unsigned>(dir, "tright");
    const auto tchi2 = read<float>(dir, "tchi2");
    const auto tqop = read<float>(dir, "tqop");
    const auto tsigma = read<float>(dir, "tsigma");
    const auto level = read<unsigned>(dir, "level");
    const auto has_right = read<unsigned>(dir, "has_right");
    const auto nb_off = read<unsigned>(dir, "nb_off");
    const auto nb_count = read<unsigned>(dir, "nb_count");
    const auto nb_base = read<unsigned>(dir, "nb_base");
    const auto left = read<unsigned>(dir, "left");
    const FitTableArgs ft = read_fit_tables(dir);
    const size_t n_trip = tleft.size();
    std::vector<unsigned> failed(n_events, FAIL_NONE), overflow(8, 0u);
    // The order's keys (two per triplet), the chains' places, the arenas: poisoned, so that
    // what the step reads it must have written.
    std::vector<unsigned long long> keys(2 * n_trip + 64, 0xdeadbeefdeadbeefull);
    std::vector<unsigned> n_end(n_events, 0xdeadbeefu), chain_off(n_trip, 0xdeadbeefu);
    std::vector<unsigned> chain_total(n_events, 0xdeadbeefu), chain_base(n_events, 0xdeadbeefu);
    std::vector<unsigned> chain_n(n_events, 0xdeadbeefu), chain_fork(n_trip, 0xdeadbeefu);
    std::vector<unsigned> chain_hits(max_chain_hits, 0xdeadbeefu);
    const size_t n_share = (size_t)n_events * share_cand;
    const uint4 poison = make_uint4(0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu);
    std::vector<uint4> cand(n_share, poison);
    std::vector<unsigned> chits((size_t)n_events * share_hits, 0xdeadbeefu);
    std::vector<unsigned> fits(n_share * FIT_WORDS, 0xdeadbeefu), acc(n_share, 0xdeadbeefu);
    std::vector<unsigned> n_cand(n_events, 0u), n_chits(n_events, 0u), n_acc(n_events, 0u);
    const unsigned min_level = (min_hits < 3 ? 3 : min_hits) - 2;
    auto chains = [&](int second) {
        each_thread(CA_THREADS, 2, (int)n_events, [&] {
            ca_candidates_chains(hit_start.data(), sinput.data(), dbl.data(), dbl_base.data(),
                                 trip_base.data(), tleft.data(), tright.data(), tchi2.data(),
                                 tqop.data(), tsigma.data(), level.data(), nb_off.data(),
                                 nb_count.data(), nb_base.data(), left.data(), keys.data(),
                                 n_end.data(), failed.data(), chain_off.data(),
                                 chain_base.data(), chain_fork.data(), chain_hits.data(),
                                 used.data(), second);
        });
    };
    auto choose = [&](int append) {
        launch_blocks(threads, 1, n_events, [&] {
#define HARNESS_ARGS                                                                          \
    in_x.data(), in_y.data(), in_plane.data(), hit_start.data(), sinput.data(), dbl.data(),   \
        dbl_base.data(), trip_base.data(), tleft.data(), tright.data(), tchi2.data(),         \
        level.data(), nb_off.data(), nb_count.data(), nb_base.data(), left.data(),            \
        keys.data(), n_end.data(), chain_off.data(), chain_base.data(), chain_fork.data(),    \
        chain_hits.data(), failed.data(), overflow.data(), used.data(), cand.data(),           \
        chits.data(), fits.data(), acc.data(), n_cand.data(), n_chits.data(), n_acc.data(),   \
        share_cand, share_hits, max_cand, hits_cap, max_tracks, min_hits, max_chi2_ndf,       \
        append, ft.rows32.data(), ft.rows64.data(), ft.gap_steps.data(), ft.gap_kind.data(),  \
        ft.gap_slice.data(), ft.slices.data(), ft.pf.data(), ft.pd.data(), ft.pi.data(),      \
        ft.nodes.data()
            if (threads == CAND_THREADS) {
                ca_candidates(HARNESS_ARGS);
            } else {
                ca_candidates_small(HARNESS_ARGS);
            }
#undef HARNESS_ARGS
        });
    };
    for (size_t k = 0; k < appends.size(); ++k) {
        launch_blocks(ORDER_THREADS, 1, n_events, [&] {
            ca_candidates_order(trip_base.data(), trip_n.data(), level.data(), has_right.data(),
                                tchi2.data(), failed.data(), overflow.data(), min_level,
                                keys.data(), n_end.data(), chain_off.data(),
                                chain_total.data());
        });
        launch_blocks(CA_THREADS, 1, 1, [&] {
            ca_event_budget(chain_total.data(), chain_base.data(), chain_n.data(),
                            failed.data(), n_events, UINT_MAX, max_chain_hits,
                            FAIL_CANDIDATES, overflow.data());
        });
        chains(0);
        choose(appends[k]);
        if (divert) {
            chains(1);
            choose(1);
        }
        std::vector<unsigned> out;
        for (unsigned e = 0; e < n_events; ++e) {
            if (failed[e]) {
                out.push_back(0xffffffffu);
                continue;
            }
            out.push_back(n_acc[e]);
            const size_t cb = (size_t)e * share_cand;
            for (unsigned i = 0; i < n_acc[e]; ++i) {
                const unsigned c = acc[cb + i];
                const uint4 r = cand[cb + c];
                out.push_back(r.y);
                for (unsigned h = 0; h < r.y; ++h) {
                    out.push_back(chits[(size_t)e * share_hits + r.x + h]);
                }
                for (unsigned w = 0; w < FIT_WORDS; ++w) {
                    out.push_back(fits[(cb + c) * FIT_WORDS + w]);
                }
            }
        }
        const std::string t = "tracks" + std::to_string(k), u = "used" + std::to_string(k);
        if (!write_out(dir, t.c_str(), out) || !write_out(dir, u.c_str(), used)) return 2;
    }
    // The last call's accepted tracks packed as GpuCaEngine::read_tracks packs them
    // (ca_tracks_count, ca_event_budget for the tracks and for their hits,
    // ca_tracks_pack), fitted again with the tracks' own fit where `refit`; written to
    // DIR/packed as the calls' tracks are.
    const FitSettingArgs tf = read_track_fit(dir);
    std::vector<unsigned> trk_n(n_events, 0xdeadbeefu), trk_hits(n_events, 0xdeadbeefu);
    std::vector<unsigned> trk_base(n_events, 0xdeadbeefu), trk_hit_base(n_events, 0xdeadbeefu);
    std::vector<unsigned> total(n_events, 0u);
    launch_blocks(CA_THREADS, 1, n_events, [&] {
        ca_tracks_count(failed.data(), n_acc.data(), acc.data(), cand.data(), share_cand,
                        trk_n.data(), trk_hits.data());
    });
    launch_blocks(CA_THREADS, 1, 1, [&] {
        ca_event_budget(trk_n.data(), trk_base.data(), total.data(), failed.data(), n_events,
                        UINT_MAX, UINT_MAX, 0u, overflow.data());
    });
    launch_blocks(CA_THREADS, 1, 1, [&] {
        ca_event_budget(trk_hits.data(), trk_hit_base.data(), total.data(), failed.data(),
                        n_events, UINT_MAX, UINT_MAX, 0u, overflow.data());
    });
    size_t n_tracks = 0, n_hits = 0;
    for (unsigned e = 0; e < n_events; ++e) {
        n_tracks += trk_n[e];
        n_hits += trk_hits[e];
    }
    std::vector<uint2> out_tracks(n_tracks, make_uint2(0xdeadbeefu, 0xdeadbeefu));
    std::vector<unsigned> out_fits(FIT_WORDS * n_tracks, 0xdeadbeefu), out_hits(n_hits, 0xdeadbeefu);
    launch_blocks(CA_THREADS, 3, n_events, [&] {
        ca_tracks_pack(failed.data(), n_acc.data(), acc.data(), cand.data(), chits.data(),
                       fits.data(), share_cand, share_hits, trk_base.data(), trk_hit_base.data(),
                       out_tracks.data(), out_fits.data(), out_hits.data(), (int)refit,
                       in_x.data(), in_y.data(), in_plane.data(), hit_start.data(),
                       ft.rows32.data(), ft.rows64.data(), ft.gap_steps.data(),
                       ft.gap_kind.data(), ft.gap_slice.data(), ft.slices.data(),
                       tf.pf.data(), tf.pd.data(), tf.pi.data(), ft.nodes.data());
    });
    std::vector<unsigned> packed;
    for (unsigned e = 0; e < n_events; ++e) {
        packed.push_back(trk_n[e]);
        for (unsigned k = 0; k < trk_n[e]; ++k) {
            const uint2 r = out_tracks[trk_base[e] + k];
            packed.push_back(r.y);
            for (unsigned h = 0; h < r.y; ++h) packed.push_back(out_hits[r.x + h]);
            for (unsigned w = 0; w < FIT_WORDS; ++w) {
                packed.push_back(out_fits[(size_t)(trk_base[e] + k) * FIT_WORDS + w]);
            }
        }
    }
    // The packed tracks copied into the clone step's layout (ca_tracks_clone_input), to
    // DIR/clone_*.
    std::vector<unsigned> event_start(n_events + 1, 0xdeadbeefu);
    std::vector<unsigned> track_hit_start(n_tracks + 1, 0xdeadbeefu);
    std::vector<unsigned> hit_plane(n_hits, 0xdeadbeefu);
    std::vector<float> hit_x(n_hits, NAN), hit_y(n_hits, NAN);
    std::vector<double> clone_fits(CLONE_FIT_WORDS * n_tracks, NAN);
    launch_blocks(CA_THREADS, 3, n_events, [&] {
        ca_tracks_clone_input(n_events, failed.data(), trk_n.data(), trk_base.data(),
                              trk_hits.data(), trk_hit_base.data(), hit_start.data(),
                              in_x.data(), in_y.data(), in_plane.data(), out_tracks.data(),
                              out_fits.data(), out_hits.data(), event_start.data(),
                              track_hit_start.data(), hit_plane.data(), hit_x.data(),
                              hit_y.data(), clone_fits.data());
    });
    const bool ok = write_out(dir, "packed", packed) &&
                    write_out(dir, "clone_event_start", event_start) &&
                    write_out(dir, "clone_track_hit_start", track_hit_start) &&
                    write_out(dir, "clone_hit_plane", hit_plane) &&
                    write_out(dir, "clone_hit_x", hit_x) && write_out(dir, "clone_hit_y", hit_y) &&
                    write_out(dir, "clone_fits", clone_fits);
    return ok ? 0 : 2;
}
