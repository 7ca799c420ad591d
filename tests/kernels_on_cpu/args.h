// Reads a kernel argument that a test wrote as a raw little-endian array: the file NAME in
// the directory DIR, as a vector of T. Exits with status 2 and a message where it cannot.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

template <class T>
static std::vector<T> read(const std::string& dir, const char* name) {
    const std::string path = dir + "/" + name;
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) {
        std::fprintf(stderr, "cannot open %s\n", path.c_str());
        std::exit(2);
    }
    std::fseek(f, 0, SEEK_END);
    const long bytes = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    std::vector<T> v(bytes / sizeof(T));
    if (std::fread(v.data(), 1, bytes, f) != (size_t)bytes) {
        std::fprintf(stderr, "short read of %s\n", path.c_str());
        std::exit(2);
    }
    std::fclose(f);
    return v;
}

// The fit's tables (src/gpu/tracking_fit.rs, FitTables) as the tests write them: the
// detector's rows, the gaps' steps and field sources, the field's slices and nodes, and
// the fit's settings (floats, doubles, ints; with `prefix` "track_", the tracks' own fit's
// settings where the test writes them).
struct FitTableArgs {
    std::vector<float> rows32;
    std::vector<double> rows64;
    std::vector<int> gap_steps, gap_kind, gap_slice;
    std::vector<float> slices;
    std::vector<float> pf;
    std::vector<double> pd;
    std::vector<int> pi;
    std::vector<float> nodes;
};
static FitTableArgs read_fit_tables(const std::string& dir) {
    return {read<float>(dir, "rows32"),    read<double>(dir, "rows64"),
            read<int>(dir, "gap_steps"),   read<int>(dir, "gap_kind"),
            read<int>(dir, "gap_slice"),   read<float>(dir, "slices"),
            read<float>(dir, "floats"),    read<double>(dir, "doubles"),
            read<int>(dir, "ints"),        read<float>(dir, "nodes")};
}
// The settings of the tracks' own fit (DIR/track_floats, track_doubles, track_ints).
struct FitSettingArgs {
    std::vector<float> pf;
    std::vector<double> pd;
    std::vector<int> pi;
};
static FitSettingArgs read_track_fit(const std::string& dir) {
    return {read<float>(dir, "track_floats"), read<double>(dir, "track_doubles"),
            read<int>(dir, "track_ints")};
}
