// The steps on the packed tracks on the CPU (see warp.h and block.h): the exchange of
// segments (kernels/ca_exchange.cu) and the first hits against the origin
// (kernels/ca_first_hits.cu), after kernels/ca_common.cuh and the module's files they use
// (the triplets' tents, the fit, the candidates' hits), as the engine's module. Reads a
// batch's packed tracks as ca_tracks_pack and the clone step leave them on the device (per
// track its first hit in the packed hits and its length, its fit's words and its mark;
// per event its tracks' first and count), the events' input hits, the hits sorted into the
// grid with the grid's tables, the steps' parameters and the fits' tables, as raw
// little-endian arrays from the directory given, one file per kernel argument, and runs
// the steps DIR/shape asks for as GpuCaEngine launches them: the exchange
// (launch_exchange: ca_exchange_begin, then per round, until no event made an exchange,
// ca_exchange_fit_changed from the second, ca_exchange_pairs or
// ca_exchange_pairs_changed, ca_exchange_fit_needed, ca_exchange_evaluate and
// ca_exchange_choose, then ca_exchange_end), then the first hits (launch_first_hits:
// ca_first_hits, a block per event). The kernels with barriers or warp primitives run a
// block's threads taking turns; the fits over a grid-stride loop run their threads one after
// the other. Writes the packed tracks as the steps leave them to DIR/tracks (first hit,
// length per track), DIR/fits, DIR/hits, DIR/marks, each event's failures to
// DIR/failed (the exchange's) and DIR/fh_failed (the first hits'), and the exchange's
// state words to DIR/state.
#include <string>

#include "block.h"
#include "args.h"

#include "../../kernels/ca_common.cuh"
#include "../../kernels/ca_hit_sorting.cu"
#include "../../kernels/ca_doublets.cu"
#include "../../kernels/ca_triplets.cu"
#include "../../kernels/kalman_fit.cu"
#include "../../kernels/ca_candidates.cu"
#include "../../kernels/ca_first_hits.cu"
#include "../../kernels/ca_exchange.cu"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    // The grid's cells per event, the blocks per event of the exchange's fits and
    // evaluations and of its searches, whether the exchange runs, whether the first hits
    // are chosen again, each event's share of the first-hit step's edges.
    const auto shape = read<unsigned>(dir, "shape");
    const int n_bins = (int)shape.at(0);
    const unsigned wide = shape.at(1), search = shape.at(2);
    const bool exchange = shape.at(3) != 0, first_hits = shape.at(4) != 0;
    const unsigned edge_share = shape.at(5);
    const auto trk_n = read<unsigned>(dir, "trk_n");
    const auto trk_base = read<unsigned>(dir, "trk_base");
    const auto trk_hit_base = read<unsigned>(dir, "trk_hit_base");
    const auto hit_start = read<unsigned>(dir, "hit_start");  // n_events + 1
    const auto in_x = read<float>(dir, "in_x");
    const auto in_y = read<float>(dir, "in_y");
    const auto in_plane = read<unsigned>(dir, "in_plane");
    auto out_tracks = read<uint2>(dir, "tracks");
    auto out_fits = read<unsigned>(dir, "fits");
    auto out_hits = read<unsigned>(dir, "hits");
    auto marks = read<unsigned>(dir, "marks");
    const auto xf = read<float>(dir, "xf");
    const auto xd = read<double>(dir, "xd");
    const auto xi = read<int>(dir, "xi");
    const auto sx = read<float>(dir, "sx");
    const auto sinput = read<unsigned>(dir, "sinput");
    const auto bin_start = read<unsigned>(dir, "bin_start");
    const auto plf = read<float>(dir, "plf");
    const auto pli = read<int>(dir, "pli");
    const FitTableArgs ft = read_fit_tables(dir);
    const FitSettingArgs tf = read_track_fit(dir);
    const unsigned n_events = (unsigned)trk_n.size();
    const size_t n_tracks = out_tracks.size(), n_planes = (size_t)xi.at(EXI_N_PLANES);
    const std::vector<unsigned> failed(n_events, FAIL_NONE);
    // The step's scratch as the engine sizes it (per packed track, per input hit, per
    // event), poisoned: what the step reads it must have written.
    const unsigned pairs_per_track = (unsigned)read<unsigned>(dir, "pairs_per_track").at(0);
    std::vector<unsigned> lists(n_planes * n_tracks, 0xdeadbeefu), lens(n_tracks, 0xdeadbeefu);
    std::vector<float> chi2s(n_tracks, NAN), qops(n_tracks, NAN), firsts(5 * n_tracks, NAN);
    std::vector<float> sqops(n_tracks, NAN);
    // The last pass's tents (the kinks' bending and the first hits' pointing).
    const auto pair_i32 = read<int>(dir, "pair_i32");
    const auto tents = read<float>(dir, "tents");
    std::vector<unsigned> flags(n_tracks, 0xdeadbeefu), owner(in_x.size(), 0xdeadbeefu);
    std::vector<unsigned> pairs(pairs_per_track * n_tracks, 0xdeadbeefu);
    std::vector<unsigned long long> gains(2 * pairs.size(), 0xdeadbeefdeadbeefull);
    std::vector<unsigned> state(EX_STATE * n_events, 0xdeadbeefu), ex_failed(n_events, 0u);
    std::vector<unsigned> n_active(1, 0u);
    auto step = [&](auto kernel) {
        kernel(failed.data(), trk_n.data(), trk_base.data(), trk_hit_base.data(),
               hit_start.data(), in_x.data(), in_y.data(), in_plane.data(), out_tracks.data(),
               out_fits.data(), out_hits.data(), marks.data(), xf.data(), xd.data(), xi.data(),
               lists.data(), lens.data(), chi2s.data(), qops.data(), firsts.data(),
               flags.data(), owner.data(), sx.data(), sinput.data(), bin_start.data(), n_bins,
               plf.data(), pli.data(), pairs.data(), gains.data(), pairs_per_track,
               0xffffffffu, state.data(), ex_failed.data(), n_active.data(), ft.rows32.data(),
               ft.rows64.data(), ft.gap_steps.data(), ft.gap_kind.data(), ft.gap_slice.data(),
               ft.slices.data(), ft.pf.data(), ft.pd.data(), ft.pi.data(), ft.nodes.data(),
               tf.pf.data(), tf.pd.data(), tf.pi.data(), pair_i32.data(), tents.data(),
               sqops.data());
    };
    if (exchange) {
        launch_blocks(EX_THREADS, 1, n_events, [&] { step(ca_exchange_begin); });
        for (int round = 0; round < EX_MAX_ROUNDS; ++round) {
            if (round > 0) {
                each_thread(EX_WIDE_THREADS, wide, (int)n_events,
                            [&] { step(ca_exchange_fit_changed); });
            }
            if (round == 0) {
                each_thread(EX_WIDE_THREADS, search, (int)n_events,
                            [&] { step(ca_exchange_pairs); });
            } else {
                launch_blocks(EX_WIDE_THREADS, search, n_events,
                              [&] { step(ca_exchange_pairs_changed); });
            }
            each_thread(EX_WIDE_THREADS, wide, (int)n_events,
                        [&] { step(ca_exchange_fit_needed); });
            launch_blocks(EX_WIDE_THREADS, wide, n_events, [&] { step(ca_exchange_evaluate); });
            n_active[0] = 0;
            launch_blocks(EX_THREADS, 1, n_events, [&] { step(ca_exchange_choose); });
            if (n_active[0] == 0) break;
        }
        launch_blocks(EX_THREADS, 1, n_events, [&] { step(ca_exchange_end); });
    }
    std::vector<unsigned> fh_failed(n_events, 0u);
    if (first_hits) {
        const auto fh_d = read<double>(dir, "fh_d");
        const auto fh_i = read<int>(dir, "fh_i");
        const size_t n_hits = in_x.size();
        std::vector<double> pred_d(8 * n_tracks, NAN);
        std::vector<unsigned> pred_u(8 * n_tracks, 0xdeadbeefu), pool_h(2 * n_hits, 0xdeadbeefu);
        std::vector<unsigned long long> pool_key(2 * n_hits, 0xdeadbeefdeadbeefull);
        std::vector<unsigned> claims(n_hits, 0xdeadbeefu), chg_fit(2 * FIT_WORDS * n_tracks, 0xdeadbeefu);
        const FhEdge poison = {0xdeadbeefdeadbeefull, 0xdeadbeefu, 0xdeadbeefu};
        std::vector<FhEdge> edges((size_t)n_events * edge_share, poison);
        std::vector<FhEdge> contested((size_t)n_events * edge_share, poison);
        launch_blocks(FH_THREADS, 1, n_events, [&] {
            ca_first_hits(failed.data(), trk_n.data(), trk_base.data(), hit_start.data(),
                          in_x.data(), in_y.data(), in_plane.data(), out_tracks.data(),
                          out_fits.data(), out_hits.data(), marks.data(), fh_d.data(),
                          fh_i.data(), pair_i32.data(), tents.data(), pred_d.data(),
                          pred_u.data(), pool_h.data(), pool_key.data(), claims.data(),
                          edges.data(), contested.data(), edge_share, chg_fit.data(),
                          fh_failed.data(), ft.rows32.data(), ft.rows64.data(),
                          ft.gap_steps.data(), ft.gap_kind.data(), ft.gap_slice.data(),
                          ft.slices.data(), ft.pf.data(), ft.pd.data(), ft.pi.data(),
                          ft.nodes.data(), tf.pf.data(), tf.pd.data(), tf.pi.data());
        });
    }
    const bool ok = write_out(dir, "tracks", out_tracks) && write_out(dir, "fits", out_fits) &&
                    write_out(dir, "hits", out_hits) && write_out(dir, "marks", marks) &&
                    write_out(dir, "failed", ex_failed) && write_out(dir, "state", state) &&
                    write_out(dir, "fh_failed", fh_failed);
    return ok ? 0 : 2;
}
