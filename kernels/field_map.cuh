// The field map's lookup in double precision, FieldMap::at of src/tracking/field.rs
// operation by operation (compile with --fmad=false so that the products and sums round
// as the CPU's do). Prepended to the kernels that read the map in double precision
// (kernels/ca_clones.cu; kalman_fit.cu carries the same lookup as `at_f64`).
//
// The map: nodes (bx, by, bz) in tesla, C order of [nx][ny][nz]; node (ix, iy, iz) at
// origin + (ix, iy, iz) * step. Outside the grid, the field of the nearest point of the
// grid box; NaN positions read the first cell.

struct FieldMap64 {
    const float* nodes;  // [nx][ny][nz][3], tesla
    int n[3];
    double origin[3];    // mm
    double inv_step[3];  // 1 / step_mm, as FieldMap rounds it
};

// FieldMap::at: trilinear between the eight nodes around (px, py, pz), in the CPU's order
// (x outer, then y, then z; weights (wx wy) wz; sums component by component).
__device__ void field_map_at_f64(const FieldMap64& g, double px, double py, double pz,
                                 double b[3]) {
    const double pos[3] = {px, py, pz};
    int cell[3];
    double frac[3];
    for (int a = 0; a < 3; ++a) {
        const int n = g.n[a];
        double u = (pos[a] - g.origin[a]) * g.inv_step[a];
        if (isnan(u)) {
            u = 0.0;
        } else {
            u = u < 0.0 ? 0.0 : (u > (double)(n - 1) ? (double)(n - 1) : u);
        }
        // u is in [0, n - 1]: truncation is the floor.
        const int i = min((int)u, n - 2);
        cell[a] = i;
        frac[a] = u - (double)i;
    }
    b[0] = 0.0;
    b[1] = 0.0;
    b[2] = 0.0;
    for (int dx = 0; dx < 2; ++dx) {
        const double wx = dx ? frac[0] : 1.0 - frac[0];
        for (int dy = 0; dy < 2; ++dy) {
            const double wy = dy ? frac[1] : 1.0 - frac[1];
            for (int dz = 0; dz < 2; ++dz) {
                const double wz = dz ? frac[2] : 1.0 - frac[2];
                const double w = wx * wy * wz;
                const long long idx =
                    ((long long)(cell[0] + dx) * g.n[1] + cell[1] + dy) * g.n[2] + cell[2] + dz;
                const float* v = g.nodes + 3 * idx;
                b[0] += w * (double)v[0];
                b[1] += w * (double)v[1];
                b[2] += w * (double)v[2];
            }
        }
    }
}
