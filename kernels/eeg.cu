// EEG source power: what follows the GEMM Y = K X of the inverse kernel with a batch of
// sample blocks ("frames"). Compiled at start-up by NVRTC (src/gpu/nvrtc.rs).
//
// Layouts (all float32 unless said):
//   y        column-major [3S, n_frames * T] (ld = ld_y = 3S): sample g of the batch is the
//            column at y + g * ld_y; rows 3s, 3s+1, 3s+2 are the x, y, z components of
//            source s. Sample g belongs to frame g / T, time t = g % T.
//   scale    [S] per-source factor applied after the orientation norm.
//   amp      [n_frames][S][T] amplitudes (only when requested; may be null).
//   tile_*   [n_frames][n_tiles] per-tile peak (power, source): tile = SOURCE_TILE sources.
//   roi      [n_roi] source indices of the region of interest.
//   stats    [n_frames][T] ROI mean power, then [n_frames] peak power (float), then
//            [n_frames] peak source (int), all in one buffer so one copy brings them back.
//
// amplitude(s, t) = scale[s] * sqrt(sum_j Y[3s+j, t]^2); power = amplitude^2.
// Peak: argmax over all sources of sum_t power; ties go to the lowest source index. Every
// reduction has a fixed order, so results do not depend on scheduling.

#define SOURCE_TILE 256
#define TIME_CHUNK 32

__device__ __forceinline__ void better(float &p, int &i, float op, int oi) {
    // Larger power wins; equal power: lower index wins. NaN never wins.
    if (op > p || (op == p && oi < i)) { p = op; i = oi; }
}

extern "C" __global__ void __launch_bounds__(SOURCE_TILE)
eeg_source_power(const float *__restrict__ y, long long ld_y, const float *__restrict__ scale,
                 int n_sources, int n_times, float *__restrict__ amp,
                 float *__restrict__ tile_power, int *__restrict__ tile_source)
{
    __shared__ float amp_tile[SOURCE_TILE][TIME_CHUNK + 1];
    __shared__ float warp_power[SOURCE_TILE / 32];
    __shared__ int warp_source[SOURCE_TILE / 32];

    const int frame = blockIdx.y;
    const int n_tiles = gridDim.x;
    const int s0 = blockIdx.x * SOURCE_TILE;
    const int s = s0 + threadIdx.x;
    const bool valid = s < n_sources;
    const float sc = valid ? scale[s] : 0.0f;
    const float *yf = y + (long long)frame * n_times * ld_y + 3LL * s;

    float power = 0.0f;
    for (int t0 = 0; t0 < n_times; t0 += TIME_CHUNK) {
        const int tn = min(TIME_CHUNK, n_times - t0);
        #pragma unroll 4
        for (int tt = 0; tt < tn; ++tt) {
            float a = 0.0f;
            if (valid) {
                const float *col = yf + (long long)(t0 + tt) * ld_y;
                const float cx = col[0], cy = col[1], cz = col[2];
                a = sc * sqrtf(cx * cx + cy * cy + cz * cz);
            }
            power += a * a;
            if (amp) amp_tile[threadIdx.x][tt] = a;
        }
        if (amp) {
            __syncthreads();
            // Coalesced write: consecutive threads write consecutive times of a source.
            const int n_valid = min(SOURCE_TILE, n_sources - s0);
            float *af = amp + (long long)frame * n_sources * n_times;
            for (int i = threadIdx.x; i < n_valid * tn; i += SOURCE_TILE) {
                const int sl = i / tn, tt = i - sl * tn;
                af[(long long)(s0 + sl) * n_times + t0 + tt] = amp_tile[sl][tt];
            }
            __syncthreads();
        }
    }

    float bp = valid ? power : -1.0f;
    int bi = valid ? s : 0x7fffffff;
    for (int off = 16; off > 0; off >>= 1) {
        const float op = __shfl_down_sync(0xffffffffu, bp, off);
        const int oi = __shfl_down_sync(0xffffffffu, bi, off);
        better(bp, bi, op, oi);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { warp_power[warp] = bp; warp_source[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SOURCE_TILE / 32; ++w) better(bp, bi, warp_power[w], warp_source[w]);
        tile_power[(long long)frame * n_tiles + blockIdx.x] = bp;
        tile_source[(long long)frame * n_tiles + blockIdx.x] = bi;
    }
}

// One block per (frame, sample): the ROI mean power of that sample, reduced over the
// block in a fixed order; the blocks of sample 0 also reduce the frame's peak over the
// tiles' peaks. Grid (n_frames, n_times), STATS_THREADS threads.
#define STATS_THREADS 256

extern "C" __global__ void __launch_bounds__(STATS_THREADS)
eeg_frame_stats(const float *__restrict__ y, long long ld_y, const float *__restrict__ scale,
                int n_times, const int *__restrict__ roi, int n_roi,
                const float *__restrict__ tile_power, const int *__restrict__ tile_source, int n_tiles,
                float *__restrict__ roi_power, float *__restrict__ peak_power, int *__restrict__ peak_source)
{
    __shared__ float warp_sum[STATS_THREADS / 32];
    __shared__ float warp_power[STATS_THREADS / 32];
    __shared__ int warp_source[STATS_THREADS / 32];
    const int frame = blockIdx.x, t = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    const float *col = y + ((long long)frame * n_times + t) * ld_y;
    float acc = 0.0f;
    #pragma unroll 4
    for (int r = threadIdx.x; r < n_roi; r += STATS_THREADS) {
        const int s = roi[r];
        const float cx = col[3LL * s], cy = col[3LL * s + 1], cz = col[3LL * s + 2];
        const float a = scale[s] * sqrtf(cx * cx + cy * cy + cz * cz);
        acc += a * a;
    }
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if (lane == 0) warp_sum[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < STATS_THREADS / 32; ++w) total += warp_sum[w];
        roi_power[(long long)frame * n_times + t] = n_roi > 0 ? total / (float)n_roi : 0.0f;
    }
    if (t != 0) return;

    float bp = -1.0f;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n_tiles; i += STATS_THREADS)
        better(bp, bi, tile_power[(long long)frame * n_tiles + i], tile_source[(long long)frame * n_tiles + i]);
    for (int off = 16; off > 0; off >>= 1) {
        const float op = __shfl_down_sync(0xffffffffu, bp, off);
        const int oi = __shfl_down_sync(0xffffffffu, bi, off);
        better(bp, bi, op, oi);
    }
    if (lane == 0) { warp_power[warp] = bp; warp_source[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < STATS_THREADS / 32; ++w) better(bp, bi, warp_power[w], warp_source[w]);
        peak_power[frame] = bp;
        peak_source[frame] = bi;
    }
}
