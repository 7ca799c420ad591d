// kernels/ca_clones.cu on the CPU (see warp.h): reads a batch and the tables as raw
// little-endian arrays from the directory given, one file per kernel argument, runs the
// kernels as the engine launches them (a thread per track; warps striding over the
// tracks, fewer than the GPU's; a warp per event), and writes the marks to DIR/marks.
#include <cstdio>
#include <string>

#include "warp.h"
#include "args.h"
#include "../../kernels/field_map.cuh"
#include "../../kernels/ca_clones.cu"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    const auto ints = read<int>(dir, "ints");
    const auto doubles = read<double>(dir, "doubles");
    const auto plane_z = read<double>(dir, "plane_z");
    const auto nodes = read<float>(dir, "nodes");
    const auto event_start = read<unsigned>(dir, "event_start");
    const auto track_hit_start = read<unsigned>(dir, "track_hit_start");
    const auto hit_plane = read<unsigned>(dir, "hit_plane");
    const auto hit_x = read<float>(dir, "hit_x");
    const auto hit_y = read<float>(dir, "hit_y");
    const auto fits = read<double>(dir, "fits");
    const int n_events = (int)event_start.size() - 1;
    const int n_tracks = (int)track_hit_start.size() - 1;
    const int n_hits = (int)hit_plane.size();
    // Poisoned: every mark must be written.
    std::vector<unsigned> marks(n_tracks, 0xdeadbeefu);
    std::vector<unsigned long long> masks(n_tracks, ~0ull);
    std::vector<unsigned> refs((size_t)n_tracks * REF_WORDS, 0xdeadbeefu);
    auto run = [&](auto kernel) {
        kernel(event_start.data(), n_events, track_hit_start.data(), n_tracks, hit_plane.data(),
               hit_x.data(), hit_y.data(), n_hits, fits.data(), plane_z.data(), ints.data(),
               doubles.data(), nodes.data(), marks.data(), masks.data(), refs.data());
    };
    launch_warps((n_tracks + 31) / 32, [&] { run(ca_clone_masks); });
    // A few warps, each striding over many tracks (the GPU launches one per track).
    launch_warps(std::max(1, std::min(n_tracks, 7)), [&] { run(ca_clone_refs); });
    launch_warps(n_events, [&] { run(ca_clones); });
    FILE* out = std::fopen((dir + "/marks").c_str(), "wb");
    if (!out || std::fwrite(marks.data(), sizeof(unsigned), marks.size(), out) != marks.size()) {
        std::fprintf(stderr, "cannot write %s/marks\n", dir.c_str());
        return 2;
    }
    std::fclose(out);
    return 0;
}
