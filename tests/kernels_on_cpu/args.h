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
