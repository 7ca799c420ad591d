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

// The best (power, source) of the block, in a fixed order: across each warp, then warp by
// warp. Every thread of the block calls it; thread 0 gets the result.
template <int WARPS>
__device__ __forceinline__ void block_best(float &bp, int &bi, float *warp_power, int *warp_source) {
    for (int off = 16; off > 0; off >>= 1) {
        const float op = __shfl_down_sync(0xffffffffu, bp, off);
        const int oi = __shfl_down_sync(0xffffffffu, bi, off);
        better(bp, bi, op, oi);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { warp_power[warp] = bp; warp_source[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < WARPS; ++w) better(bp, bi, warp_power[w], warp_source[w]);
}

// The frame's peak over its tiles' peaks, written by thread 0. Every thread of the block
// (WARPS warps) calls it.
template <int WARPS>
__device__ __forceinline__ void frame_peak(const float *__restrict__ tile_power, const int *__restrict__ tile_source,
                                           int n_tiles, int frame, float *warp_power, int *warp_source,
                                           float *__restrict__ peak_power, int *__restrict__ peak_source) {
    float bp = -1.0f;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n_tiles; i += 32 * WARPS)
        better(bp, bi, tile_power[(long long)frame * n_tiles + i], tile_source[(long long)frame * n_tiles + i]);
    block_best<WARPS>(bp, bi, warp_power, warp_source);
    if (threadIdx.x == 0) {
        peak_power[frame] = bp;
        peak_source[frame] = bi;
    }
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
    block_best<SOURCE_TILE / 32>(bp, bi, warp_power, warp_source);
    if (threadIdx.x == 0) {
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

    frame_peak<STATS_THREADS / 32>(tile_power, tile_source, n_tiles, frame, warp_power, warp_source,
                                   peak_power, peak_source);
}

// ---------------------------------------------------------------------------------------
// Fused path (sm_80 and later): the product Y = K X on the tensor cores in "3xTF32"
// (each float32 operand split into a TF32 head and a TF32 tail; head*head + head*tail +
// tail*head keeps float32 accuracy), with the orientation norm, the source scale, the
// per-source power over the frame, the optional amplitudes and the per-tile peak computed
// from the accumulators in registers. Y never goes to memory.
//
// Operator layout ("fragment order", packed once at upload by the host): sources in groups
// of 16; per group, per k-step of 8 channels, per component m (x, y, z), per lane, the four
// values of that lane's m16n8k8 A fragment:
//   kfrag[(((group * ksteps + ks) * 3 + m) * 32 + lane) * 4 + r] =
//       K[3 * (16 * group + lane / 4 + 8 * (r % 2)) + m][8 * ks + lane % 4 + 4 * (r / 2)]
// (zero outside the operator). One float4 load per lane per (k-step, component), coalesced.
//
// The three components of a source are rows of three separate 16-row tiles, so the lane
// that holds the x component of (source, sample) in its accumulators also holds y and z:
// the norm needs no data exchange.
//
// x:        sample-major [F*T, C] (as staged by the host).
// One warp per group of 16 sources, FUSED_WARPS warps per block (a tile of 16*FUSED_WARPS
// sources); every block loops over the frames of the batch, reading its slice of the
// operator from L1/L2 after the first frame.

#define FUSED_WARPS 4
#define FUSED_NT 4            // n8 tiles per pass: 32 samples
#define FUSED_KSLAB 8         // k-steps of split samples staged in shared memory at once

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define TRIGD_HAVE_TF32 1
#endif

#ifdef TRIGD_HAVE_TF32
__device__ __forceinline__ unsigned tf32_head(float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

__device__ __forceinline__ void split_tf32(float v, unsigned &hi, unsigned &lo) {
    hi = tf32_head(v);
    lo = tf32_head(v - __uint_as_float(hi));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

extern "C" __global__ void __launch_bounds__(32 * FUSED_WARPS)
eeg_fused_tf32x3(const float4 *__restrict__ kfrag, int ksteps, const float *__restrict__ x,
                 int n_channels, const float *__restrict__ scale, int n_sources,
                 int n_frames, int n_times, float *__restrict__ amp,
                 float *__restrict__ tile_power, int *__restrict__ tile_source)
{
#ifndef TRIGD_HAVE_TF32
    // The host selects this kernel only on sm_80 and later.
    __trap();
#else
    __shared__ float warp_power[FUSED_WARPS];
    __shared__ int warp_source[FUSED_WARPS];
    // The samples of the current 32-sample chunk, split into TF32 head and tail, in B
    // fragment order: {head b0, head b1, tail b0, tail b1} per (k-step, n-tile, lane).
    // Shared by the block's warps, split once.
    __shared__ uint4 bfrag[FUSED_KSLAB][FUSED_NT][32];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gq = lane >> 2, tq = lane & 3;
    const int group = blockIdx.x * FUSED_WARPS + warp;
    const int n_tiles = gridDim.x;
    const int src0 = group * 16 + gq, src1 = src0 + 8;
    const bool ok0 = src0 < n_sources, ok1 = src1 < n_sources;
    const float sc0 = ok0 ? scale[src0] : 0.0f, sc1 = ok1 ? scale[src1] : 0.0f;
    const bool group_live = group * 16 < n_sources;
    const float4 *kg = kfrag + (long long)group * ksteps * 3 * 32 + lane;

    for (int f = 0; f < n_frames; ++f) {
        float p0 = 0.0f, p1 = 0.0f;
        const float *xf = x + (long long)f * n_times * n_channels;
        for (int t0 = 0; t0 < n_times; t0 += 8 * FUSED_NT) {
            float acc[3][FUSED_NT][4];
            #pragma unroll
            for (int m = 0; m < 3; ++m)
                #pragma unroll
                for (int j = 0; j < FUSED_NT; ++j)
                    #pragma unroll
                    for (int r = 0; r < 4; ++r) acc[m][j][r] = 0.0f;
            for (int ks0 = 0; ks0 < ksteps; ks0 += FUSED_KSLAB) {
                const int nks = min(FUSED_KSLAB, ksteps - ks0);
                __syncthreads();
                for (int e = threadIdx.x; e < nks * FUSED_NT * 32; e += 32 * FUSED_WARPS) {
                    const int l = e & 31, j = (e >> 5) % FUSED_NT, k = e / (32 * FUSED_NT);
                    const int t = t0 + 8 * j + (l >> 2);
                    const int c0 = 8 * (ks0 + k) + (l & 3), c1 = c0 + 4;
                    const float *xs = xf + (long long)t * n_channels;
                    const float v0 = (t < n_times && c0 < n_channels) ? __ldg(xs + c0) : 0.0f;
                    const float v1 = (t < n_times && c1 < n_channels) ? __ldg(xs + c1) : 0.0f;
                    uint4 b;
                    split_tf32(v0, b.x, b.z);
                    split_tf32(v1, b.y, b.w);
                    bfrag[k][j][l] = b;
                }
                __syncthreads();
                if (group_live) {
                    // The operator fragments of the next k-step are loaded while this one
                    // multiplies (two k-steps of loads in flight per warp).
                    float4 next[3];
                    #pragma unroll
                    for (int m = 0; m < 3; ++m) next[m] = __ldg(kg + (ks0 * 3 + m) * 32);
                    for (int k = 0; k < nks; ++k) {
                        const int ks = ks0 + k;
                        float4 cur[3];
                        #pragma unroll
                        for (int m = 0; m < 3; ++m) cur[m] = next[m];
                        if (k + 1 < nks) {
                            #pragma unroll
                            for (int m = 0; m < 3; ++m) next[m] = __ldg(kg + ((ks + 1) * 3 + m) * 32);
                        }
                        uint4 b[FUSED_NT];
                        #pragma unroll
                        for (int j = 0; j < FUSED_NT; ++j) b[j] = bfrag[k][j][lane];
                        #pragma unroll
                        for (int m = 0; m < 3; ++m) {
                            const float4 av = cur[m];
                            unsigned ah[4], al[4];
                            split_tf32(av.x, ah[0], al[0]);
                            split_tf32(av.y, ah[1], al[1]);
                            split_tf32(av.z, ah[2], al[2]);
                            split_tf32(av.w, ah[3], al[3]);
                            #pragma unroll
                            for (int j = 0; j < FUSED_NT; ++j) {
                                // Small terms first.
                                mma_tf32(acc[m][j], al, b[j].x, b[j].y);
                                mma_tf32(acc[m][j], ah, b[j].z, b[j].w);
                                mma_tf32(acc[m][j], ah, b[j].x, b[j].y);
                            }
                        }
                    }
                }
            }
            // Epilogue: accumulator r holds row gq + 8 * (r / 2), sample 2 * tq + r % 2.
            #pragma unroll
            for (int j = 0; j < FUSED_NT; ++j) {
                #pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int t = t0 + 8 * j + 2 * tq + (r & 1);
                    const float cx = acc[0][j][r], cy = acc[1][j][r], cz = acc[2][j][r];
                    const bool hi = r >= 2;
                    const float a = (hi ? sc1 : sc0) * sqrtf(cx * cx + cy * cy + cz * cz);
                    if (t < n_times) {
                        if (hi) p1 += a * a; else p0 += a * a;
                        if (amp && (hi ? ok1 : ok0))
                            amp[((long long)f * n_sources + (hi ? src1 : src0)) * n_times + t] = a;
                    }
                }
            }
        }
        // The four lanes of a row hold disjoint samples of the same two sources.
        p0 += __shfl_xor_sync(0xffffffffu, p0, 1);
        p1 += __shfl_xor_sync(0xffffffffu, p1, 1);
        p0 += __shfl_xor_sync(0xffffffffu, p0, 2);
        p1 += __shfl_xor_sync(0xffffffffu, p1, 2);
        float bp = ok0 ? p0 : -1.0f;
        int bi = ok0 ? src0 : 0x7fffffff;
        if (ok1) better(bp, bi, p1, src1);
        block_best<FUSED_WARPS>(bp, bi, warp_power, warp_source);
        if (threadIdx.x == 0) {
            tile_power[(long long)f * n_tiles + blockIdx.x] = bp;
            tile_source[(long long)f * n_tiles + blockIdx.x] = bi;
        }
        __syncthreads();
    }
#endif
}

// The region-of-interest power for the fused path, in plain float32 from the ROI rows of
// the operator (gathered at upload, row-major [3 * n_roi, C]): grid (n_frames, n_chunks),
// ROI_WARPS warps per block, one ROI source per warp, one lane per sample (the operator
// values are broadcast to the lanes). The block stages `ts` samples at a time in shared
// memory (dynamic, ts * (C + 1) floats: the odd stride keeps the lanes on distinct banks)
// and adds its warps' powers per sample in order into partial[frame][chunk][t];
// eeg_fused_reduce adds the chunks in order.
#define ROI_WARPS 16

extern "C" __global__ void __launch_bounds__(32 * ROI_WARPS)
eeg_roi_partial(const float *__restrict__ k_roi, const float *__restrict__ roi_scale, int n_roi,
                const float *__restrict__ x, int n_channels, int n_times, int ts,
                float *__restrict__ partial)
{
    extern __shared__ float xs[];
    __shared__ float power[ROI_WARPS][32];
    const int frame = blockIdx.x, chunk = blockIdx.y, n_chunks = gridDim.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = chunk * ROI_WARPS + warp;
    const int stride = n_channels + 1;
    const float *xf = x + (long long)frame * n_times * n_channels;
    float *out = partial + ((long long)frame * n_chunks + chunk) * n_times;
    const float *k = k_roi + 3LL * r * n_channels;
    const float sc = r < n_roi ? roi_scale[r] : 0.0f;
    for (int t0 = 0; t0 < n_times; t0 += ts) {
        const int tn = min(ts, n_times - t0);
        __syncthreads();
        for (int i = threadIdx.x; i < tn * n_channels; i += 32 * ROI_WARPS) {
            const int tt = i / n_channels, c = i - tt * n_channels;
            xs[tt * stride + c] = xf[(long long)t0 * n_channels + i];
        }
        __syncthreads();
        // 32 channels at a time: the lanes load the operator rows coalesced (one memory
        // latency per chunk), then broadcast each channel's values by shuffle.
        float cx = 0.0f, cy = 0.0f, cz = 0.0f;
        if (r < n_roi) {
            const float *xl = xs + lane * stride;
            for (int c0 = 0; c0 < n_channels; c0 += 32) {
                const int c = c0 + lane;
                const float kx = c < n_channels ? __ldg(k + c) : 0.0f;
                const float ky = c < n_channels ? __ldg(k + n_channels + c) : 0.0f;
                const float kz = c < n_channels ? __ldg(k + 2 * n_channels + c) : 0.0f;
                const int cn = min(32, n_channels - c0);
                for (int i = 0; i < cn; ++i) {
                    const float v = lane < tn ? xl[c0 + i] : 0.0f;
                    cx = fmaf(__shfl_sync(0xffffffffu, kx, i), v, cx);
                    cy = fmaf(__shfl_sync(0xffffffffu, ky, i), v, cy);
                    cz = fmaf(__shfl_sync(0xffffffffu, kz, i), v, cz);
                }
            }
        }
        float p = 0.0f;
        if (r < n_roi && lane < tn) {
            const float a = sc * sqrtf(cx * cx + cy * cy + cz * cz);
            p = a * a;
        }
        power[warp][lane] = p;
        __syncthreads();
        if (threadIdx.x < tn) {
            float total = 0.0f;
            for (int w = 0; w < ROI_WARPS; ++w) total += power[w][threadIdx.x];
            out[t0 + threadIdx.x] = total;
        }
    }
}

// Per frame: the ROI mean power per sample from the partial sums (added in order) and the
// peak over the tiles' peaks. Grid (n_frames), STATS_THREADS threads.
extern "C" __global__ void __launch_bounds__(STATS_THREADS)
eeg_fused_reduce(const float *__restrict__ partial, int n_partials, int n_roi, int n_times,
                 const float *__restrict__ tile_power, const int *__restrict__ tile_source, int n_tiles,
                 float *__restrict__ roi_power, float *__restrict__ peak_power, int *__restrict__ peak_source)
{
    __shared__ float warp_power[STATS_THREADS / 32];
    __shared__ int warp_source[STATS_THREADS / 32];
    const int frame = blockIdx.x;
    const float *pf = partial + (long long)frame * n_partials * n_times;
    for (int t = threadIdx.x; t < n_times; t += STATS_THREADS) {
        // Loads issued ahead (independent of the sum), added in order.
        float total = 0.0f;
        int i = 0;
        for (; i + 8 <= n_partials; i += 8) {
            float v[8];
            #pragma unroll
            for (int u = 0; u < 8; ++u) v[u] = pf[(long long)(i + u) * n_times + t];
            #pragma unroll
            for (int u = 0; u < 8; ++u) total += v[u];
        }
        for (; i < n_partials; ++i) total += pf[(long long)i * n_times + t];
        roi_power[(long long)frame * n_times + t] = n_roi > 0 ? total / (float)n_roi : 0.0f;
    }
    frame_peak<STATS_THREADS / 32>(tile_power, tile_source, n_tiles, frame, warp_power, warp_source,
                                   peak_power, peak_source);
}
