/* glm_hip.hip - the GLM-5.2 forward pass on GPUs, with handwritten kernels.
 *
 * One source for three builds:
 *   make hip    hipcc, AMD (default --offload-arch=gfx942,gfx950; GPU_ARCH=gfx90a etc.)
 *   make cuda   nvcc, NVIDIA (sm_90 by default), through the compatibility section below
 *   make emu    plain C++ on the CPU under tests/hip_emu.h (WARP=32 or 64), for CI
 *
 * It computes the same function as glm.c's forward() (sections 1-6 there) and its MTP
 * layer's mtp_forward (section 7), op by op and in the same order; the names follow
 * glm.c (matmul, rmsnorm, layernorm, rope, indexer + topk_select, mla_attend_absorbed,
 * attention, swiglu, moe_route, moe, layer_forward, head, forward_hidden). Bare § numbers and pitfalls refer to docs/MODEL.md, "glm.c §N" to
 * glm.c's numbered sections. The tie rules are part of that function: top-k keeps the higher score,
 * then the lower index; the q_a / kv_a latent norms use eps 1e-6; attention is the
 * absorbed MLA over the latent cache restricted to the indexer's selection, and
 * "shared" layers reuse the selection of the last "full" layer (IndexShare).
 *
 * Nothing assumes a wave width: AMD gfx9 waves are 64 lanes, NVIDIA warps 32. Blocks
 * are 256 threads (a multiple of both); WAVE is only used for lane arithmetic.
 * Activations and accumulations are fp32; weights stay in their file format in
 * device memory and are decoded in registers (weight-only quantization, as on the CPU).
 *
 * Several GPUs: the decoder layers are split into contiguous ranges, one per device;
 * each device holds its layers' weights and KV cache plus its own scratch, in one
 * allocation per layer (weights and cache rows) and one each for the embedding, lm_head,
 * the MTP layer and the scratch, never one allocation for a device's whole share. The
 * residual stream (and the indexer selection, which IndexShare carries from layer to
 * layer) is copied to the next device at a range boundary. Device 0 also holds the
 * embedding, the last device the final norm and lm_head, and the MTP layer (if the
 * checkpoint has one) with its own cache rows: it needs the lm_head, and only its
 * input's embedding rows come from device 0.
 */

/* ======================================================================== */
/* 0. compatibility: HIP, CUDA, or the CPU emulation                        */

#if defined(GLM_EMU)
#include "tests/hip_emu.h" /* defines WAVE, SHFL_XOR, LAUNCH, DYN_SHARED and the hip* API */
#define UNROLL

#elif defined(__CUDACC__)
#include <cuda_runtime.h>
#define WAVE 32
#define UNROLL _Pragma("unroll")
/* CUDA 9+ requires the _sync shuffles; every lane of the warp takes part in ours */
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), WAVE)
#define LAUNCH(k, grid, block, shmem, stream, ...) k<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#define hipError_t cudaError_t
#define hipSuccess cudaSuccess
#define hipGetErrorString cudaGetErrorString
#define hipGetLastError cudaGetLastError
#define hipGetDeviceCount cudaGetDeviceCount
#define hipSetDevice cudaSetDevice
#define hipGetDevice cudaGetDevice
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipDeviceProp_t cudaDeviceProp
#define hipMemGetInfo cudaMemGetInfo
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipHostMalloc(p, n, flags) cudaMallocHost((p), (n))
#define hipHostFree cudaFreeHost
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemcpyPeer cudaMemcpyPeer
#define hipMemset cudaMemset
#define hipMemsetAsync cudaMemsetAsync
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipStream_t cudaStream_t
#define hipEvent_t cudaEvent_t
#define hipEventCreate cudaEventCreate
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipStreamCreate cudaStreamCreate
#define hipStreamDestroy cudaStreamDestroy
#define hipGraph_t cudaGraph_t
#define hipGraphExec_t cudaGraphExec_t
#define hipStreamBeginCapture cudaStreamBeginCapture
#define hipStreamEndCapture cudaStreamEndCapture
#define hipStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define hipGraphInstantiateWithFlags cudaGraphInstantiateWithFlags
#define hipGraphLaunch cudaGraphLaunch
#define hipGraphDestroy cudaGraphDestroy
#define hipGraphExecDestroy cudaGraphExecDestroy

#else /* HIP on AMD */
#include <hip/hip_runtime.h>
/* warpSize is not a compile-time constant from ROCm 7 on, and __AMDGCN_WAVEFRONT_SIZE
 * is gone from recent clang: decide from the target. gfx9 (MI300X gfx942, MI355X
 * gfx950, MI250 gfx90a) is wave64; RDNA compiles wave32 by default. The host pass
 * never uses WAVE for anything but array bounds. */
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define WAVE __AMDGCN_WAVEFRONT_SIZE
#elif defined(__GFX9__) || !defined(__HIP_DEVICE_COMPILE__)
#define WAVE 64
#else
#define WAVE 32
#endif
#define UNROLL _Pragma("unroll")
/* The xor shuffle through ds_bpermute: present in every ROCm, unlike __shfl_xor_sync
 * (ROCm 6.2+) or the mask-less __shfl_xor (deprecated later). */
/* The lane from the wave's execution mask (mbcnt counts the lanes below this one), as
 * HIP's __lane_id(): no work-item id read and no division. */
__device__ __forceinline__ int lane_id() {
#if WAVE == 64
    return (int)__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
#else
    return (int)__builtin_amdgcn_mbcnt_lo(~0u, 0u);
#endif
}
__device__ __forceinline__ float shfl_xor_f32(float v, int m) {
    return __int_as_float(__builtin_amdgcn_ds_bpermute((lane_id() ^ m) << 2, __float_as_int(v)));
}
__device__ __forceinline__ int shfl_xor_i32(int v, int m) {
    return __builtin_amdgcn_ds_bpermute((lane_id() ^ m) << 2, v);
}
__device__ __forceinline__ float shfl_xor_any(float v, int m) { return shfl_xor_f32(v, m); }
__device__ __forceinline__ int shfl_xor_any(int v, int m) { return shfl_xor_i32(v, m); }
#define SHFL_XOR(v, m) shfl_xor_any((v), (m))
#define LAUNCH(k, grid, block, shmem, stream, ...) hipLaunchKernelGGL(k, (grid), (block), (shmem), (stream), __VA_ARGS__)
#endif

#include <math.h>
#include <limits.h>
#include <stdint.h>

/* Every kernel run is counted (gpu_launch_count; a replayed graph adds its kernels):
 * glm plan's launches per token (tools/plan.c) are checked against this count under the
 * emulation. Launches go to g_stream: the null stream, except while a decode step is
 * captured into a graph (gpu_graph_step), when g_pos_dev also points the kernels that
 * take a position at the device's copy of it. */
static long g_launches, g_graph_launches, g_graph_captures;
static hipStream_t g_stream;
static const int *g_pos_dev;
/* While a step is captured, the device copy of its i-th sequence's position; else NULL
 * (the kernels take the host's). */
static const int *span_pos_dev(int i) { return g_pos_dev ? g_pos_dev + i : NULL; }
#define LAUNCHED(k, grid, block, shmem, stream, ...) do { g_launches++; (void)(stream); LAUNCH(k, grid, block, shmem, g_stream, __VA_ARGS__); } while (0)

/* Which kernels run where a fast kernel sits beside its plain one: the plain ones are
 * the kernel tests' reference and, with GLM_GPU_KERNELS=plain, what a user on new
 * hardware falls back to while bisecting a fast kernel. Chosen once, at gpu_load
 * (the kernel tests switch it with gpuk_use_plain). */
static int g_plain_kernels;
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern "C" {
#include "glm.h"
}

#define BLOCK 256        /* threads per block everywhere: 4 waves of 64 or 8 warps of 32 */
#define MAX_WAVES (BLOCK / 32)
#define GEMV_ROWS 32     /* matrix rows per block in the matrix-vector kernels */
#define GEMV_GROUP 4     /* decode: rows a wave works on together, sharing each x chunk */
#define GEMV_MAXN 8      /* up to this many tokens share one pass over the weights; more: tiled */
#define TM 64            /* tiled matrix product: rows x tokens x depth per tile */
#define TN 32
#define TK 32
#define GPU_MAX_DEVICES 16

/* ======================================================================== */
/* 1. numbers (model.c §1), decoded with bit operations: no tables in device memory */

struct DMat {            /* a Mat whose bytes live in device memory */
    int fmt, rows, cols;
    const uint8_t *w;
    const float *fp8_scale;  /* FP8: [ceil(rows/128)][ceil(cols/128)] */
    const uint8_t *mx_scale; /* MXFP4: [rows][cols/32] */
};

__device__ __forceinline__ float bf16_f32(uint32_t b) { return __uint_as_float(b << 16); }

/* OCP E4M3FN: bias 7, S.1111.111 is NaN; subnormals are man * 2^-9. */
__device__ __forceinline__ float fp8_f32(uint32_t b) {
    uint32_t e = (b >> 3) & 15, m = b & 7;
    float v = e ? __uint_as_float(((e + 120) << 23) | (m << 20)) : (float)m * 0.001953125f;
    if ((b & 0x7f) == 0x7f) v = __uint_as_float(0x7fc00000u);
    return (b & 0x80) ? -v : v;
}

/* E2M1 nibble: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. */
__device__ __forceinline__ float e2m1_f32(uint32_t c) {
    uint32_t e = (c >> 1) & 3, m = c & 1;
    float v = e ? __uint_as_float(((e + 126) << 23) | (m << 22)) : 0.5f * (float)m;
    return (c & 8) ? -v : v;
}

/* E8M0: 2^(s-127); s = 0 is the fp32 subnormal 2^-127; 255 is NaN. */
__device__ __forceinline__ float e8m0_f32(uint32_t s) { /* selects, not branches: no wait per scale in a hot loop */
    return __uint_as_float(s == 255 ? 0x7fc00000u : s ? s << 23 : 0x00400000u);
}

/* glm.c's silu and sigmoid (the SwiGLU gate, the router's scores) */
static __device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

/* W[r][k] as mat_dequant_row() computes it (same products, so the same bits). */
__device__ __forceinline__ float mat_elem(const DMat &W, int r, int k) {
    switch (W.fmt) {
    case WF_F32: return ((const float *)W.w)[(size_t)r * W.cols + k];
    case WF_BF16: return bf16_f32(((const uint16_t *)W.w)[(size_t)r * W.cols + k]);
    case WF_FP8: return fp8_f32(W.w[(size_t)r * W.cols + k]) * W.fp8_scale[(size_t)(r / 128) * ((W.cols + 127) / 128) + k / 128];
    default: {
        uint32_t byte = W.w[(size_t)r * (W.cols / 2) + k / 2];
        return e2m1_f32((k & 1) ? byte >> 4 : byte & 15) * e8m0_f32(W.mx_scale[(size_t)r * (W.cols / 32) + k / 32]);
    }
    }
}

/* ======================================================================== */
/* 2. reductions: waves with xor shuffles, blocks through shared memory      */

__device__ __forceinline__ float wave_sum(float v) {
    for (int m = WAVE / 2; m > 0; m >>= 1) v += SHFL_XOR(v, m);
    return v;
}
__device__ __forceinline__ float wave_max(float v) {
    for (int m = WAVE / 2; m > 0; m >>= 1) v = fmaxf(v, SHFL_XOR(v, m));
    return v;
}

/* Every thread gets the sum; each adds the per-wave partials in the same order, so
 * all threads agree bit for bit. The leading barrier lets callers reuse `red`. */
__device__ float block_sum(float v) {
    __shared__ float red[MAX_WAVES];
    v = wave_sum(v);
    int lane = threadIdx.x % WAVE, w = threadIdx.x / WAVE, nw = blockDim.x / WAVE;
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

__device__ float block_max(float v) {
    __shared__ float red[MAX_WAVES];
    v = wave_max(v);
    int lane = threadIdx.x % WAVE, w = threadIdx.x / WAVE, nw = blockDim.x / WAVE;
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float s = red[0];
    for (int i = 1; i < nw; i++) s = fmaxf(s, red[i]);
    return s;
}

/* glm.c's better(): higher score first, then the lower index; NaN ranks below every
 * number (even -inf), NaNs among themselves by index. Index -1 = nothing. */
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return false;
    if (va != va || vb != vb) return vb != vb && (va == va || ia < ib);
    return va > vb || (va == vb && ia < ib);
}

/* The best (value, index) of the block; every thread gets it. */
__device__ void block_best(float &v, int &idx) {
    __shared__ float rv[MAX_WAVES];
    __shared__ int ri[MAX_WAVES];
    for (int m = WAVE / 2; m > 0; m >>= 1) {
        float ov = SHFL_XOR(v, m);
        int oi = SHFL_XOR(idx, m);
        if (better(ov, oi, v, idx)) { v = ov; idx = oi; }
    }
    int lane = threadIdx.x % WAVE, w = threadIdx.x / WAVE, nw = blockDim.x / WAVE;
    __syncthreads();
    if (lane == 0) { rv[w] = v; ri[w] = idx; }
    __syncthreads();
    v = rv[0]; idx = ri[0];
    for (int i = 1; i < nw; i++)
        if (better(rv[i], ri[i], v, idx)) { v = rv[i]; idx = ri[i]; }
}

/* Exclusive prefix sum of one int per thread, in thread order (Hillis-Steele). */
__device__ int block_exclusive_scan(int v, int *total) {
    __shared__ int s[BLOCK];
    int t = threadIdx.x;
    __syncthreads();
    s[t] = v;
    __syncthreads();
    for (int off = 1; off < BLOCK; off <<= 1) {
        int add = t >= off ? s[t - off] : 0;
        __syncthreads();
        s[t] += add;
        __syncthreads();
    }
    *total = s[BLOCK - 1];
    return s[t] - v;
}

/* ======================================================================== */
/* 3. matrix products (glm.c §1): y[t][i] = Σ_k x[t][k] · W[r0+i][k]          */
/*
 * Few tokens (n <= GEMV_MAXN, decode): waves own rows, lanes stride over 16-byte
 * chunks of a row (one MXFP4 block, 8 BF16, 16 FP8 values), so each weight byte is
 * read once for all n tokens; a wave sum finishes the row. Prefill (more tokens): a tiled
 * product, TM rows x TN tokens per block, with the tile of W dequantized into shared
 * memory; its sums run over k in order, exactly as glm.c's dot() after
 * mat_dequant_row(). `z` batches independent products (the per-head un-absorb).
 */

/* One token (decode): a wave takes GEMV_GROUP rows at a time, so each chunk of x it
 * loads serves several rows and the loads of those rows' weights are in flight
 * together. Per row the sum runs exactly as in gemv_rows below (same chunks, same
 * order, same wave sum), so both give the same bits. */
__device__ void gemv_rows1(const DMat &W, const float *x, float *y, int r0, int nr) {
    const int lane = threadIdx.x % WAVE, nw = blockDim.x / WAVE, cols = W.cols;
    /* E2M1 values in shared memory, one copy per bank: lane l reads column l % 32, so
     * the 32 lanes of a pass never conflict. A lookup replaces ~9 integer operations
     * per nibble, which would otherwise bound this product below memory speed. */
    __shared__ float e2m1_lut[16][32];
    for (int i = threadIdx.x; i < 16 * 32; i += blockDim.x) e2m1_lut[i / 32][i % 32] = e2m1_f32(i / 32);
    __syncthreads();
    const float *lut = &e2m1_lut[0][threadIdx.x % 32];
    const int end = (int)((blockIdx.x + 1) * GEMV_ROWS) < nr ? (int)((blockIdx.x + 1) * GEMV_ROWS) : nr;
    for (int i0 = blockIdx.x * GEMV_ROWS + (threadIdx.x / WAVE) * GEMV_GROUP; i0 < end; i0 += nw * GEMV_GROUP) {
        const int nrow = end - i0 < GEMV_GROUP ? end - i0 : GEMV_GROUP;
        float acc[GEMV_GROUP];
        UNROLL for (int j = 0; j < GEMV_GROUP; j++) acc[j] = 0.0f;
        if (W.fmt == WF_MXFP4) {
            for (int b = lane; b < cols / 32; b += WAVE) {
                float xb[32];
                UNROLL for (int k = 0; k < 32; k++) xb[k] = x[b * 32 + k];
                UNROLL for (int j = 0; j < GEMV_GROUP; j++) if (j < nrow) {
                    const size_t r = (size_t)(r0 + i0 + j);
                    uint4 q = ((const uint4 *)(W.w + r * (cols / 2)))[b];
                    uint32_t word[4] = {q.x, q.y, q.z, q.w};
                    float s = e8m0_f32(W.mx_scale[r * (cols / 32) + b]), part = 0.0f;
                    UNROLL for (int k = 0; k < 32; k++) part += lut[32 * ((word[k / 8] >> (4 * (k % 8))) & 15)] * xb[k];
                    acc[j] += part * s;
                }
            }
        } else if (W.fmt == WF_BF16 && cols % 8 == 0) {
            for (int c = lane; c < cols / 8; c += WAVE) {
                float xb[8];
                UNROLL for (int k = 0; k < 8; k++) xb[k] = x[c * 8 + k];
                UNROLL for (int j = 0; j < GEMV_GROUP; j++) if (j < nrow) {
                    uint4 q = ((const uint4 *)(W.w + (size_t)(r0 + i0 + j) * cols * 2))[c];
                    uint32_t word[4] = {q.x, q.y, q.z, q.w};
                    UNROLL for (int k = 0; k < 8; k++) acc[j] += bf16_f32((word[k / 2] >> (16 * (k % 2))) & 0xffff) * xb[k];
                }
            }
        } else if (W.fmt == WF_FP8 && cols % 16 == 0) {
            for (int c = lane; c < cols / 16; c += WAVE) {
                float xb[16];
                UNROLL for (int k = 0; k < 16; k++) xb[k] = x[c * 16 + k];
                UNROLL for (int j = 0; j < GEMV_GROUP; j++) if (j < nrow) {
                    const int r = r0 + i0 + j;
                    uint4 q = ((const uint4 *)(W.w + (size_t)r * cols))[c];
                    uint32_t word[4] = {q.x, q.y, q.z, q.w};
                    float s = W.fp8_scale[(size_t)(r / 128) * ((cols + 127) / 128) + c * 16 / 128], part = 0.0f;
                    UNROLL for (int k = 0; k < 16; k++) part += fp8_f32((word[k / 4] >> (8 * (k % 4))) & 0xff) * xb[k];
                    acc[j] += part * s;
                }
            }
        } else {
            for (int k = lane; k < cols; k += WAVE) {
                float xv = x[k];
                UNROLL for (int j = 0; j < GEMV_GROUP; j++) if (j < nrow) acc[j] += mat_elem(W, r0 + i0 + j, k) * xv;
            }
        }
        UNROLL for (int j = 0; j < GEMV_GROUP; j++) {
            float s = wave_sum(acc[j]);
            if (lane == 0 && j < nrow) y[i0 + j] = s;
        }
    }
}

/* Up to GEMV_MAXN tokens: one wave per row, the row's weights decoded once for all tokens. */
template <int NT>
__device__ void gemv_rows(const DMat &W, const float *x, int ldx, float *y, int ldy, int r0, int nr, int n) {
    const int lane = threadIdx.x % WAVE, nw = blockDim.x / WAVE, cols = W.cols;
    for (int i = blockIdx.x * GEMV_ROWS + threadIdx.x / WAVE; i < (int)((blockIdx.x + 1) * GEMV_ROWS) && i < nr; i += nw) {
        const int r = r0 + i;
        float acc[NT];
        UNROLL for (int t = 0; t < NT; t++) acc[t] = 0.0f;
        if (W.fmt == WF_MXFP4) { /* 16 bytes = 32 nibbles = one E8M0 block */
            const uint4 *w = (const uint4 *)(W.w + (size_t)r * (cols / 2));
            const uint8_t *sc = W.mx_scale + (size_t)r * (cols / 32);
            for (int b = lane; b < cols / 32; b += WAVE) {
                uint4 q = w[b];
                uint32_t word[4] = {q.x, q.y, q.z, q.w};
                float v[32];
                UNROLL for (int j = 0; j < 32; j++) v[j] = e2m1_f32((word[j / 8] >> (4 * (j % 8))) & 15);
                float s = e8m0_f32(sc[b]);
                UNROLL for (int t = 0; t < NT; t++) if (t < n) {
                    const float *xb = x + (size_t)t * ldx + b * 32;
                    float part = 0.0f;
                    UNROLL for (int j = 0; j < 32; j++) part += v[j] * xb[j];
                    acc[t] += part * s;
                }
            }
        } else if (W.fmt == WF_BF16 && cols % 8 == 0) {
            const uint4 *w = (const uint4 *)(W.w + (size_t)r * cols * 2);
            for (int c = lane; c < cols / 8; c += WAVE) {
                uint4 q = w[c];
                uint32_t word[4] = {q.x, q.y, q.z, q.w};
                float v[8];
                UNROLL for (int j = 0; j < 8; j++) v[j] = bf16_f32((word[j / 2] >> (16 * (j % 2))) & 0xffff);
                UNROLL for (int t = 0; t < NT; t++) if (t < n) {
                    const float *xb = x + (size_t)t * ldx + c * 8;
                    UNROLL for (int j = 0; j < 8; j++) acc[t] += v[j] * xb[j];
                }
            }
        } else if (W.fmt == WF_FP8 && cols % 16 == 0) { /* one fp32 multiplier per 128x128 block */
            const uint4 *w = (const uint4 *)(W.w + (size_t)r * cols);
            const float *scale = W.fp8_scale + (size_t)(r / 128) * ((cols + 127) / 128);
            for (int c = lane; c < cols / 16; c += WAVE) {
                uint4 q = w[c];
                uint32_t word[4] = {q.x, q.y, q.z, q.w};
                float v[16];
                UNROLL for (int j = 0; j < 16; j++) v[j] = fp8_f32((word[j / 4] >> (8 * (j % 4))) & 0xff);
                float s = scale[c * 16 / 128];
                UNROLL for (int t = 0; t < NT; t++) if (t < n) {
                    const float *xb = x + (size_t)t * ldx + c * 16;
                    float part = 0.0f;
                    UNROLL for (int j = 0; j < 16; j++) part += v[j] * xb[j];
                    acc[t] += part * s;
                }
            }
        } else { /* F32, or rows not a multiple of 16 bytes: element by element */
            for (int k = lane; k < cols; k += WAVE) {
                float v = mat_elem(W, r, k);
                UNROLL for (int t = 0; t < NT; t++) if (t < n) acc[t] += v * x[(size_t)t * ldx + k];
            }
        }
        UNROLL for (int t = 0; t < NT; t++) {
            float s = wave_sum(acc[t]);
            if (lane == 0 && t < n) y[(size_t)t * ldy + i] = s;
        }
    }
}

__global__ void __launch_bounds__(BLOCK) k_gemv1(DMat W, const float *x, int ldx, float *y, int ldy, int r0, int nr, int zr, int zx, int zy) {
    int z = blockIdx.z;
    gemv_rows1(W, x + (size_t)z * zx, y + (size_t)z * zy, r0 + z * zr, nr);
    (void)ldx; (void)ldy;
}

__global__ void __launch_bounds__(BLOCK) k_gemvn(DMat W, const float *x, int ldx, float *y, int ldy, int r0, int nr, int n, int zr, int zx, int zy) {
    int z = blockIdx.z;
    gemv_rows<GEMV_MAXN>(W, x + (size_t)z * zx, ldx, y + (size_t)z * zy, ldy, r0 + z * zr, nr, n);
}

/* The routed experts: block row y is one (token, slot) pair; its expert's matrix
 * comes from a device table, so the choice never goes back to the host. */
__global__ void __launch_bounds__(BLOCK) k_gemv_experts(const DMat *table, const int *idx, const float *x, int ldx, int x_div, float *y, int ldy, int nr) {
    int slot = blockIdx.y;
    DMat W = table[idx[slot]];
    gemv_rows1(W, x + (size_t)(slot / x_div) * ldx, y + (size_t)slot * ldy, 0, nr);
}

__global__ void __launch_bounds__(BLOCK) k_gemm(DMat W, const float *x, int ldx, float *y, int ldy, int r0, int nr, int n, int zr, int zx, int zy) {
    __shared__ float ws[TM][TK + 1];
    __shared__ float xs[TN][TK + 1];
    const int z = blockIdx.z, row0 = blockIdx.x * TM, tok0 = blockIdx.y * TN, cols = W.cols;
    x += (size_t)z * zx;
    y += (size_t)z * zy;
    r0 += z * zr;
    const int tr = threadIdx.x % TM, tc = (threadIdx.x / TM) * (TN * TM / BLOCK); /* 8 tokens per thread */
    float acc[TN * TM / BLOCK];
    UNROLL for (int j = 0; j < TN * TM / BLOCK; j++) acc[j] = 0.0f;
    for (int k0 = 0; k0 < cols; k0 += TK) {
        for (int i = threadIdx.x; i < TM * TK; i += BLOCK) {
            int r = i / TK, k = i % TK;
            ws[r][k] = (row0 + r < nr && k0 + k < cols) ? mat_elem(W, r0 + row0 + r, k0 + k) : 0.0f;
        }
        for (int i = threadIdx.x; i < TN * TK; i += BLOCK) {
            int t = i / TK, k = i % TK;
            xs[t][k] = (tok0 + t < n && k0 + k < cols) ? x[(size_t)(tok0 + t) * ldx + k0 + k] : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < TK && k0 + k < cols; k++) {
            float w = ws[tr][k];
            UNROLL for (int j = 0; j < TN * TM / BLOCK; j++) acc[j] += w * xs[tc + j][k];
        }
        __syncthreads();
    }
    UNROLL for (int j = 0; j < TN * TM / BLOCK; j++)
        if (row0 + tr < nr && tok0 + tc + j < n) y[(size_t)(tok0 + tc + j) * ldy + row0 + tr] = acc[j];
}


/* ======================================================================== */
/* 3b. the fast matrix-vector products (decode; up to GEMV_MAXN tokens)     */
/*
 * A decode step reads every weight once, so these kernels have one job: keep HBM busy.
 * The plain kernels above (k_gemv1, k_gemvn, k_gemv_experts) are their reference in the
 * kernel tests and run instead with GLM_GPU_KERNELS=plain. What differs:
 *   - the format is a template argument, so the hot loop has no format switch;
 *   - every load of a step is issued before any use: a wave streams GF_RPW rows at once
 *     (rows past the end are clamped to the last row, never branched around) and the
 *     next step's weights are loaded before this step's are decoded, so each lane keeps
 *     2 x GF_RPW x 16 bytes in flight (128 bytes on a 64-wide wave);
 *   - x is staged in shared memory once per block, in coalesced loads, with 4 floats of
 *     padding after each chunk's worth so that the lanes of a 16-byte read start on
 *     different banks;
 *   - a block owns GF_BLOCK_ROWS rows and a range of the columns: a matrix with few rows
 *     (the router, kv_a, the indexer's wk) is split along k into enough blocks to fill the
 *     GPU, and the last block of a row range to finish adds the partial sums in split
 *     order (deterministic, one launch);
 *   - MXFP4 and FP8 are decoded without tables: on gfx950 by the hardware conversions
 *     (two values per instruction, then packed fp32 FMAs), elsewhere by bit operations.
 * The sums run in another order than glm.c's (several partial sums per lane, the k split),
 * so the results agree with the plain kernels to rounding, not bit for bit.
 */
#define GF_BLOCK_ROWS 16                        /* rows per block, whatever the wave width */
#define GF_RPW (GF_BLOCK_ROWS / (BLOCK / WAVE)) /* rows a wave streams together: 4 (wave 64) or 2 (32) */
#define GF_XS_FLOATS 4096                       /* shared memory for x: 16 KB (MI300X: 4 blocks per CU) */
#define GF_MAX_SPLIT 32                         /* k splits at most */
#define GF_MIN_SPLIT_CHUNKS (2 * 64)            /* a split covers at least this many 16-byte chunks */

#if defined(__gfx950__) || defined(GLM_EMU_GFX950)
#define GF_HW_CVT 1 /* v_cvt_scalef32_pk_f32_fp4 and v_cvt_pk_f32_fp8 (OCP E4M3 on gfx950) */
#elif defined(__gfx942__) || defined(GLM_EMU_GFX942)
#define GF_FNUZ_CVT 1 /* v_cvt_pk_f32_fp8 decodes FNUZ E4M3 (bias 8) on gfx942 */
#endif

/* A value every lane of the wave holds, in a scalar register: the rows a wave streams
 * then have scalar base addresses, and each load adds one per-lane offset to them. */
__device__ __forceinline__ int wave_uniform(int v) {
#if defined(__AMDGCN__) && defined(__HIP_DEVICE_COMPILE__)
    return __builtin_amdgcn_readfirstlane(v);
#else
    return v;
#endif
}

/* A pair of floats: on AMD a clang vector, so that x += a * b on it is one packed FMA
 * (v_pk_fma_f32, gfx90a and later); elsewhere two floats. */
#if defined(__AMDGCN__)
typedef float f32x2 __attribute__((ext_vector_type(2)));
__device__ __forceinline__ f32x2 pair(float a, float b) { return f32x2{a, b}; }
#else
#if !defined(GLM_EMU) /* (the emulation defines it with gfx950's conversions) */
struct f32x2 { float x, y; };
#endif
__device__ __forceinline__ f32x2 pair(float a, float b) { f32x2 p; p.x = a; p.y = b; return p; }
__device__ __forceinline__ f32x2 operator*(f32x2 a, f32x2 b) { return pair(a.x * b.x, a.y * b.y); }
__device__ __forceinline__ f32x2 &operator+=(f32x2 &a, f32x2 b) { a.x += b.x; a.y += b.y; return a; }
#endif

/* The layout of one format: values per 16-byte chunk. */
template <int FMT> struct GfFormat;
template <> struct GfFormat<WF_BF16> { enum { CE = 8 }; };
template <> struct GfFormat<WF_FP8> { enum { CE = 16 }; };
template <> struct GfFormat<WF_MXFP4> { enum { CE = 32 }; };

/* OCP E4M3 without a table: the seven magnitude bits at fp32 bits 20..26 give the value
 * times 2^-120 exactly (subnormals included); 0x7f (NaN) is handled per chunk. */
__device__ __forceinline__ float e4m3_bits(uint32_t b) {
    return __uint_as_float(((b & 0x7fu) << 20) | ((b & 0x80u) << 24)) * 1.329228e36f; /* 2^120 */
}

/* Nonzero if a byte of w is S.1111.111 (NaN in E4M3FN). */
__device__ __forceinline__ uint32_t e4m3_nan_bytes(uint32_t w) {
    uint32_t m = (w & 0x7f7f7f7fu) ^ 0x7f7f7f7fu; /* a zero byte where the magnitude is 0x7f */
    return (m - 0x01010101u) & ~m & 0x80808080u;
}

#if defined(GF_FNUZ_CVT)
/* gfx942 has no OCP FP8 or FP4 conversion, only FNUZ E4M3 (bias 8, 0x80 is NaN, no
 * other NaN). Its decode of a byte is half the OCP value for every byte but 0x80 (OCP
 * -0) and S.1111.111 (OCP NaN); and the FNUZ byte S.0EE.M00 built from an E2M1 nibble
 * S.EE.M is the nibble's value times 2^-7, subnormals included. So both formats go
 * through the hardware two values per instruction, with the -0 bytes made +0 first
 * and the factor folded into the caller's scale. */
/* w with the sign cleared in every byte whose other seven bits are zero */
__device__ __forceinline__ uint32_t fnuz_no_neg_zero(uint32_t w) {
    return w & ((((w & 0x7f7f7f7fu) + 0x7f7f7f7fu) & 0x80808080u) | 0x7f7f7f7fu);
}
/* four nibbles, one per byte (bits 0-3 of each), as FNUZ bytes S.0EE.M00 (zero: 0x00) */
__device__ __forceinline__ uint32_t fnuz_from_e2m1(uint32_t n4) {
    const uint32_t mag = n4 & 0x07070707u, sign = n4 & (mag + 0x07070707u) & 0x08080808u;
    return (sign << 4) | (mag << 2);
}
#endif

/* A 16-byte chunk of a row is CE values in four 32-bit words, and each word decodes to
 * CE/8 pairs of values (on AMD a pair is what one decode instruction gives). One token's
 * sum over the chunk (gf_dot) takes the pairs in order,
 *   acc += weight pair * the pair of x values it meets,
 * acc a pair (one packed FMA on AMD, two floats elsewhere), then acc.x + acc.y. MXFP4 and
 * FP8 decode to the values before the block scale (applied by the caller), on gfx942 to a
 * power-of-two fraction of them that gf_dot multiplies back. Decoding costs more than the
 * FMAs: a product of several tokens decodes each chunk once (gf_chunk_decode) and sums
 * every token over the decoded pairs in the same order as a lone token's gf_chunk_dot, so
 * each token's sum has the same bits either way. */

/* The pairs of one word of a chunk (CE/8 of them). */
template <int FMT> struct GfWord {
    f32x2 p[GfFormat<FMT>::CE / 8];
};
template <int FMT> __device__ __forceinline__ GfWord<FMT> gf_w_word(uint32_t w, const float *lut);

template <> __device__ __forceinline__ GfWord<WF_BF16> gf_w_word<WF_BF16>(uint32_t w, const float *) {
    return {{pair(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u))}};
}

/* bytes (0, 1), then (2, 3) */
template <> __device__ __forceinline__ GfWord<WF_FP8> gf_w_word<WF_FP8>(uint32_t w, const float *) {
#if defined(GF_HW_CVT)
    return {{__builtin_amdgcn_cvt_pk_f32_fp8((int)w, false), __builtin_amdgcn_cvt_pk_f32_fp8((int)w, true)}};
#elif defined(GF_FNUZ_CVT)
    const int f = (int)fnuz_no_neg_zero(w);
    return {{__builtin_amdgcn_cvt_pk_f32_fp8(f, false), __builtin_amdgcn_cvt_pk_f32_fp8(f, true)}};
#else
    return {{pair(e4m3_bits(w), e4m3_bits(w >> 8)), pair(e4m3_bits(w >> 16), e4m3_bits(w >> 24))}};
#endif
}

/* bytes 0..3, each's low nibble (the lower column) in .x; on gfx942 the even nibbles as
 * pairs of columns (0, 2), (4, 6), then the odd ones (1, 3), (5, 7) */
template <> __device__ __forceinline__ GfWord<WF_MXFP4> gf_w_word<WF_MXFP4>(uint32_t w, const float *lut) {
#if defined(GF_HW_CVT)
    (void)lut;
    return {{__builtin_amdgcn_cvt_scalef32_pk_f32_fp4(w, 1.0f, 0), __builtin_amdgcn_cvt_scalef32_pk_f32_fp4(w, 1.0f, 1),
             __builtin_amdgcn_cvt_scalef32_pk_f32_fp4(w, 1.0f, 2), __builtin_amdgcn_cvt_scalef32_pk_f32_fp4(w, 1.0f, 3)}};
#elif defined(GF_FNUZ_CVT)
    (void)lut;
    const int lo = (int)fnuz_from_e2m1(w), hi = (int)fnuz_from_e2m1(w >> 4);
    return {{__builtin_amdgcn_cvt_pk_f32_fp8(lo, false), __builtin_amdgcn_cvt_pk_f32_fp8(lo, true), __builtin_amdgcn_cvt_pk_f32_fp8(hi, false),
             __builtin_amdgcn_cvt_pk_f32_fp8(hi, true)}};
#else
    /* a table lookup per nibble (one shared-memory read, the index from a bit-field
     * extract) costs fewer instructions than placing the bits by shifts and masks (about
     * four, then a multiply); lut is this lane's bank */
    GfWord<WF_MXFP4> d;
    UNROLL for (int i = 0; i < 4; i++) d.p[i] = pair(lut[32 * ((w >> (8 * i)) & 15)], lut[32 * ((w >> (8 * i + 4)) & 15)]);
    return d;
#endif
}

/* The x values weight pair p of the chunk meets. */
template <int FMT> __device__ __forceinline__ f32x2 gf_x_pair(const float *xs, int p) {
#if defined(GF_FNUZ_CVT)
    if (FMT == WF_MXFP4) {
        const float *xk = xs + 8 * (p / 4);
        const int c = (p % 2) * 4 + (p % 4) / 2; /* pairs (0, 2), (4, 6), (1, 3), (5, 7) */
        return pair(xk[c], xk[c + 2]);
    }
#endif
    return pair(xs[2 * p], xs[2 * p + 1]);
}

/* Whether the chunk holds an FP8 NaN (S.1111.111) that its decode does not make NaN itself. */
template <int FMT> __device__ __forceinline__ bool gf_nan(const uint32_t (&w)[4]) {
#if defined(GF_HW_CVT)
    (void)w;
    return false; /* gfx950 decodes OCP E4M3, NaN included */
#else
    return FMT == WF_FP8 && (e4m3_nan_bytes(w[0]) | e4m3_nan_bytes(w[1]) | e4m3_nan_bytes(w[2]) | e4m3_nan_bytes(w[3]));
#endif
}

/* One token's Σ over the chunk: weight pair p times gf_x_pair(xs, p) for its x chunk xs
 * (in registers); w_word(k) gives word k's pairs. */
template <int FMT, class WWord> __device__ __forceinline__ float gf_dot(WWord w_word, bool nan, const float *xs) {
    enum { PW = GfFormat<FMT>::CE / 8 };
    f32x2 acc = pair(0.0f, 0.0f);
    UNROLL for (int k = 0; k < 4; k++) {
        const GfWord<FMT> wk = w_word(k);
        UNROLL for (int i = 0; i < PW; i++) {
            const f32x2 xp = gf_x_pair<FMT>(xs, k * PW + i);
            if (FMT == WF_BF16) { /* two scalar sums: the same numbers as a packed FMA, fewer scalar registers on gfx950 (k_mlp_down) */
                acc.x += wk.p[i].x * xp.x;
                acc.y += wk.p[i].y * xp.y;
            } else
                acc += wk.p[i] * xp;
        }
    }
    if (nan) return __uint_as_float(0x7fc00000u);
#if defined(GF_FNUZ_CVT)
    if (FMT == WF_FP8) return 2.0f * (acc.x + acc.y);      /* exact */
    if (FMT == WF_MXFP4) return 128.0f * (acc.x + acc.y);  /* 2^7, exact */
#endif
    return acc.x + acc.y;
}

/* Σ_k W(q)[k] · xs[k] for one 16-byte chunk q of one row and one token, decoding as it goes;
 * xs is the chunk's x, in registers (read from shared memory once for all the rows a wave
 * streams). */
template <int FMT> __device__ __forceinline__ float gf_chunk_dot(uint4 q, const float *xs, const float *lut) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    /* (w captured by value: by reference, clang keeps w in memory longer and schedules
     * gfx950's expert gate/up with 15 more VGPRs, one wave fewer per SIMD) */
    return gf_dot<FMT>([=](int k) { return gf_w_word<FMT>(w[k], lut); }, gf_nan<FMT>(w), xs);
}

/* A chunk decoded once for several tokens' gf_dot. */
template <int FMT> struct GfChunk {
    GfWord<FMT> word[4];
    bool nan;
};
template <int FMT> __device__ __forceinline__ GfChunk<FMT> gf_chunk_decode(uint4 q, const float *lut) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    GfChunk<FMT> d;
    UNROLL for (int k = 0; k < 4; k++) d.word[k] = gf_w_word<FMT>(w[k], lut);
    d.nan = gf_nan<FMT>(w);
    return d;
}
template <int FMT> __device__ __forceinline__ float gf_chunk_dot_decoded(const GfChunk<FMT> &d, const float *xs) {
    return gf_dot<FMT>([&](int k) { return d.word[k]; }, d.nan, xs);
}

/* The block scale of chunk c of row r, as loaded (its bits) and as a value (1 for BF16): the
 * loads go out with the weights', the decode comes after. */
template <int FMT> __device__ __forceinline__ uint32_t gf_scale_bits(const DMat &W, size_t r, int c) {
    if (FMT == WF_MXFP4) return W.mx_scale[r * (W.cols / 32) + c];
    if (FMT == WF_FP8) return __float_as_uint(W.fp8_scale[(r / 128) * ((W.cols + 127) / 128) + c * 16 / 128]);
    return 0;
}
template <int FMT> __device__ __forceinline__ float gf_scale(uint32_t bits) {
    if (FMT == WF_MXFP4) return e8m0_f32(bits);
    if (FMT == WF_FP8) return __uint_as_float(bits);
    return 1.0f;
}

/* y[t][i] (+ the k split's partials) for the block's GF_BLOCK_ROWS rows of W from row r0,
 * over chunks [c0, c1), n <= NT tokens; `part` non-NULL: write this split's partial sums
 * there ([n][nr], this split's slice) instead of y. */
/* The shared memory of the fast products, one of each per block whatever the formats a
 * kernel instantiates: x staged (padded chunks) and the E2M1 table (16 values x 32 banks). */
__device__ __forceinline__ float *gf_xs() {
    __shared__ __attribute__((aligned(16))) float xs[GF_XS_FLOATS];
    return xs;
}
__device__ __forceinline__ float *gf_e2m1_lut() {
    __shared__ float lut[16 * 32];
    return lut;
}

/* The row sums out[t][j] (every lane holds them) of rows i0..i0+GF_RPW-1 (clamped into
 * nr) of W from row r0, over chunks [c0, c1), for n <= NT tokens of x (rows ldx apart;
 * xrows: token t is row xrows[t] of x instead, an array in shared memory).
 * GLU: the input is SiLU(x) * x2, formed as x is staged (the SwiGLU down projection reads
 * gate and up outputs and needs no launch of its own). Every thread of the block calls it
 * (it stages x together). */
template <int FMT, int NT, bool GLU>
__device__ __forceinline__ void gemv_fast_sums(const DMat &W, const float *x, const float *x2, int ldx, int r0, int nr, int n, int c0, int c1, int i0,
                                               float (&out)[NT][GF_RPW], const int *xrows = nullptr) {
    enum { CE = GfFormat<FMT>::CE, CS = CE + 4 /* padded chunk in shared memory */, PIECE = GF_XS_FLOATS / (NT * CS) };
    float *xs = gf_xs();
    const float *lut = gf_e2m1_lut() + threadIdx.x % 32;
    if (FMT == WF_MXFP4) {
        float *t = gf_e2m1_lut();
        for (int i = threadIdx.x; i < 16 * 32; i += blockDim.x) t[i] = e2m1_f32(i / 32);
    }
    const int lane = threadIdx.x % WAVE;
    const int row_bytes = FMT == WF_BF16 ? W.cols * 2 : FMT == WF_FP8 ? W.cols : W.cols / 2;
    const uint8_t *wrow[GF_RPW];
    size_t rr[GF_RPW];
    UNROLL for (int j = 0; j < GF_RPW; j++) {
        rr[j] = (size_t)(r0 + (i0 + j < nr ? i0 + j : nr - 1)); /* clamped: loaded, never stored */
        wrow[j] = W.w + rr[j] * row_bytes;
    }
    float acc[NT][GF_RPW];
    UNROLL for (int t = 0; t < NT; t++) UNROLL for (int j = 0; j < GF_RPW; j++) acc[t][j] = 0.0f;
    /* a lane takes the chunks c0 + lane, c0 + lane + WAVE, ...: every chunk of a row lands
     * in the same lane, in the same order, whatever the piece length (which shrinks as NT
     * grows), so each token's sums are those of its one-token product bit for bit (a
     * --draft verify step is computed as its decode steps would be). cf: this lane's first
     * chunk of the piece. */
    for (int p0 = c0, cf = lane; p0 < c1; p0 += PIECE, cf = (cf - PIECE) & (WAVE - 1)) {
        const int pn = c1 - p0 < PIECE ? c1 - p0 : PIECE;
        __syncthreads(); /* the previous piece is read by every wave */
        for (int t = 0; t < n; t++)
            for (int e = threadIdx.x; e < pn * CE; e += blockDim.x) {
                const size_t at = (size_t)(xrows ? xrows[t] : t) * ldx + (size_t)p0 * CE + e;
                xs[(t * PIECE + e / CE) * CS + e % CE] = GLU ? silu_f(x[at]) * x2[at] : x[at];
            }
        __syncthreads();
        if (i0 >= nr || cf >= pn) continue; /* after the barrier: a lane without a chunk here waits at the next one */
        uint4 q[GF_RPW], qn[GF_RPW];
        uint32_t sb[GF_RPW], sbn[GF_RPW];
        UNROLL for (int j = 0; j < GF_RPW; j++) {
            q[j] = ((const uint4 *)wrow[j])[p0 + cf];
            sb[j] = gf_scale_bits<FMT>(W, rr[j], p0 + cf);
        }
        for (int c = cf; c < pn; c += WAVE) {
            const int cn = c + WAVE < pn ? c + WAVE : c; /* the next step's chunk, clamped */
            UNROLL for (int j = 0; j < GF_RPW; j++) {
                qn[j] = ((const uint4 *)wrow[j])[p0 + cn];
                sbn[j] = gf_scale_bits<FMT>(W, rr[j], p0 + cn);
            }
            float sc[GF_RPW];
            UNROLL for (int j = 0; j < GF_RPW; j++) sc[j] = gf_scale<FMT>(sb[j]);
            /* one token: its x chunk in registers for all the rows; several: each row's
             * chunk decoded once for all of them (decoding costs more than the FMAs), then
             * each token's x chunk read again per row, since all their chunks at once would
             * not fit in registers */
            UNROLL for (int j = 0; j < (NT == 1 ? 1 : GF_RPW); j++) {
                GfChunk<FMT> wj;
                if (NT > 1) wj = gf_chunk_decode<FMT>(q[j], lut);
                UNROLL for (int t = 0; t < NT; t++) if (NT == 1 || t < n) { /* (NT 1: n is 1) */
                    float xv[CE];
                    const float *xt = xs + (t * PIECE + c) * CS;
                    UNROLL for (int k = 0; k < CE; k += 4) {
                        const float4 v = *(const float4 *)(xt + k);
                        xv[k] = v.x; xv[k + 1] = v.y; xv[k + 2] = v.z; xv[k + 3] = v.w;
                    }
                    if (NT == 1) UNROLL for (int i = 0; i < GF_RPW; i++) acc[t][i] += gf_chunk_dot<FMT>(q[i], xv, lut) * sc[i];
                    else acc[t][j] += gf_chunk_dot_decoded<FMT>(wj, xv) * sc[j];
                }
            }
            UNROLL for (int j = 0; j < GF_RPW; j++) { q[j] = qn[j]; sb[j] = sbn[j]; }
        }
    }
    UNROLL for (int t = 0; t < NT; t++) UNROLL for (int j = 0; j < GF_RPW; j++) out[t][j] = wave_sum(acc[t][j]);
}

/* y[t][i] for the block's GF_BLOCK_ROWS rows of W from row r0 (blockIdx.x), over chunks
 * [c0, c1), n <= NT tokens. */
template <int FMT, int NT>
__device__ __forceinline__ void gemv_fast_rows(const DMat &W, const float *x, int ldx, float *y, int ldy, int r0, int nr, int n, int c0, int c1) {
    const int i0 = blockIdx.x * GF_BLOCK_ROWS + wave_uniform(threadIdx.x / WAVE) * GF_RPW; /* this wave's first row (of nr) */
    float out[NT][GF_RPW];
    gemv_fast_sums<FMT, NT, false>(W, x, NULL, ldx, r0, nr, n, c0, c1, i0, out);
    if (threadIdx.x % WAVE == 0)
        UNROLL for (int t = 0; t < NT; t++) UNROLL for (int j = 0; j < GF_RPW; j++)
            if (t < n && i0 + j < nr) y[(size_t)t * ldy + i0 + j] = out[t][j];
}


/* Split k over gridDim.y blocks per row range: split ks writes its sums to its slice of
 * `part` ([z][ks][t][nr]); the last of a row range's splits to finish (a counter per row
 * range and z, left at 0 again) adds them in split order into y. */
template <int FMT, int NT>
__global__ void __launch_bounds__(BLOCK) k_gemv_fast(DMat W, const float *x, int ldx, float *y, int ldy, int r0, int nr, int n, int zr, int zx, int zy,
                                                     float *part, unsigned *count) {
    const int z = blockIdx.z, ks = blockIdx.y, nks = gridDim.y, chunks = W.cols / GfFormat<FMT>::CE;
    const int c0 = (int)((long)chunks * ks / nks), c1 = (int)((long)chunks * (ks + 1) / nks);
    x += (size_t)z * zx;
    y += (size_t)z * zy;
    r0 += z * zr;
    if (nks == 1) { gemv_fast_rows<FMT, NT>(W, x, ldx, y, ldy, r0, nr, n, c0, c1); return; }
    float *mine = part + ((size_t)z * nks + ks) * n * nr;
    gemv_fast_rows<FMT, NT>(W, x, ldx, mine, nr, r0, nr, n, c0, c1);
    __shared__ unsigned arrived;
    __threadfence(); /* this split's sums are visible before the count says so */
    __syncthreads();
    if (threadIdx.x == 0) arrived = atomicAdd(&count[(size_t)z * gridDim.x + blockIdx.x], 1u);
    __syncthreads();
    if (arrived != (unsigned)nks - 1) return;
    __threadfence(); /* ... and read after it */
    const int i_lo = blockIdx.x * GF_BLOCK_ROWS, i_n = nr - i_lo < GF_BLOCK_ROWS ? nr - i_lo : GF_BLOCK_ROWS;
    for (int e = threadIdx.x; e < n * i_n; e += blockDim.x) {
        const int t = e / i_n, i = i_lo + e % i_n;
        float s = 0.0f;
        for (int k = 0; k < nks; k++) s += ((volatile const float *)part)[(((size_t)z * nks + k) * n + t) * nr + i];
        y[(size_t)t * ldy + i] = s;
    }
    if (threadIdx.x == 0) count[(size_t)z * gridDim.x + blockIdx.x] = 0;
}

/* The pointers of an expert's matrix come from memory, so the compiler cannot tell they
 * are global and would use flat loads, which also wait on shared memory; they always are. */
__device__ __forceinline__ void assume_global(const DMat &W) {
#if defined(__AMDGCN__) && defined(__HIP_DEVICE_COMPILE__)
    __builtin_assume(!__builtin_amdgcn_is_shared((const void *)W.w) && !__builtin_amdgcn_is_private((const void *)W.w));
    __builtin_assume(!__builtin_amdgcn_is_shared((const void *)W.mx_scale) && !__builtin_amdgcn_is_private((const void *)W.mx_scale));
    __builtin_assume(!__builtin_amdgcn_is_shared((const void *)W.fp8_scale) && !__builtin_amdgcn_is_private((const void *)W.fp8_scale));
#else
    (void)W;
#endif
}

/* Several tokens' routed experts, block row ts = slot t * A + s (token t's s-th chosen
 * expert e = idx[ts]): whether this block runs e, i.e. no earlier token chose e (a token's
 * A slots hold distinct experts). If so, take(p, u) records every slot p >= ts that chose
 * e as the u-th of *m (thread 0 fills them; the block waits for it). */
template <class Take> __device__ __forceinline__ bool expert_slots(const int *idx, int ts, int A, int slots, int *m, Take take) {
    const int e = idx[ts];
    for (int p = 0; p < ts / A * A; p++)
        if (idx[p] == e) return false;
    if (threadIdx.x == 0) {
        *m = 0;
        for (int p = ts; p < slots; p++)
            if (idx[p] == e) take(p, (*m)++);
    }
    __syncthreads();
    return true;
}

/* The MLP of a decode step (glm.c moe(): the shared expert and the A chosen experts
 * weighted in index order, here added in the order k_mlp_down gives; a dense layer's SwiGLU
 * is the same with no routed experts and its MLP as the "shared" one). A lone token: two
 * launches, k_mlp_gate_up and k_mlp_down. Several (glm serve's batch, a --draft verify):
 * the shared expert or dense MLP is one product over all the tokens, each of its weights
 * read once for the step as every other product of the step reads them, and a routed
 * expert's gate, up and down projection run once for all the tokens that chose it: the
 * down projections write each slot's sums (k_mlp_down_grouped) and the last block of a row
 * range to finish adds them per token in slot order (a dense layer's down projection:
 * k_mlp_shared_down).
 * Either way a token's sums are those it gets alone, bit for bit (gemv_fast_sums sums each
 * token as its one-token product does, and the terms are added in the same order).
 *
 * Part 1, gate and up. Block row y < n * A * 2: token t's s-th chosen expert (format EF),
 * y = (t * A + s) * 2 + g, run for every token that chose it by the first one's block;
 * with a shared expert (S = A + 1, else S = A) the two rows after those, g = y - n * A * 2,
 * run it (SF) for all n <= NT tokens at once. g picks gate (h1) or up (h2). Rows
 * [t * S + s][FI], the shared expert's at s = A. */
template <int EF, int SF, int NT>
__global__ void __launch_bounds__(BLOCK) k_mlp_gate_up(const DMat *gate_t, const DMat *up_t, DMat sh_gate, DMat sh_up, const int *idx, int A, int S,
                                                       const float *x, int ldx, float *h1, float *h2, int FI, int n) {
    const int routed = n * A * 2;
    if ((int)blockIdx.y < routed && NT == 1) { /* a lone token */
        const int g = blockIdx.y & 1, s = blockIdx.y >> 1;
        const DMat W = (g ? up_t : gate_t)[idx[s]];
        assume_global(W);
        gemv_fast_rows<EF, 1>(W, x, 0, (g ? h2 : h1) + (size_t)s * FI, 0, 0, FI, 1, 0, W.cols / GfFormat<EF>::CE);
    } else if ((int)blockIdx.y < routed) {
        /* several tokens: the block of the first token to choose expert e runs it for every
         * token that did, each of its gate and up weights read once for the step; the
         * other such blocks have nothing to do */
        const int g = blockIdx.y & 1, ts = blockIdx.y >> 1;
        __shared__ int tok[NT], dst[NT], m; /* the tokens' rows of x, their rows of h1/h2 */
        if (!expert_slots(idx, ts, A, n * A, &m, [&](int p, int u) { tok[u] = p / A; dst[u] = p / A * S + p % A; })) return;
        const DMat W = (g ? up_t : gate_t)[idx[ts]];
        assume_global(W);
        const int i0 = blockIdx.x * GF_BLOCK_ROWS + wave_uniform(threadIdx.x / WAVE) * GF_RPW;
        float out[NT][GF_RPW];
        gemv_fast_sums<EF, NT, false>(W, x, NULL, ldx, 0, FI, m, 0, W.cols / GfFormat<EF>::CE, i0, out, tok);
        float *h = g ? h2 : h1;
        if (threadIdx.x % WAVE == 0)
            UNROLL for (int u = 0; u < NT; u++) UNROLL for (int j = 0; j < GF_RPW; j++)
                if (u < m && i0 + j < FI) h[(size_t)dst[u] * FI + i0 + j] = out[u][j];
    } else {
        const int g = blockIdx.y - routed;
        const DMat &W = g ? sh_up : sh_gate;
        gemv_fast_rows<SF, NT>(W, x, ldx, (g ? h2 : h1) + (size_t)A * FI, S * FI, 0, FI, n, 0, W.cols / GfFormat<SF>::CE);
    }
}

/* Part 2 of several tokens in a dense layer: its down projection of SiLU(h1) * h2 (the
 * "shared" rows, s = A = 0) for all n <= NT tokens, into y [n][H]. */
template <int SF, int NT>
__global__ void __launch_bounds__(BLOCK) k_mlp_shared_down(DMat sh_down, int A, int S, const float *h1, const float *h2, int FI, float *y, int H, int n) {
    const int i0 = blockIdx.x * GF_BLOCK_ROWS + wave_uniform(threadIdx.x / WAVE) * GF_RPW;
    const size_t at = (size_t)A * FI; /* token t's row: (t * S + A) * FI */
    float o[NT][GF_RPW];
    gemv_fast_sums<SF, NT, true>(sh_down, h1 + at, h2 + at, S * FI, 0, H, n, 0, sh_down.cols / GfFormat<SF>::CE, i0, o);
    if (threadIdx.x % WAVE == 0)
        UNROLL for (int t = 0; t < NT; t++) UNROLL for (int j = 0; j < GF_RPW; j++)
            if (t < n && i0 + j < H) y[(size_t)t * H + i0 + j] = o[t][j];
}

/* Part 2 of several tokens with routed experts, one launch: block row y < n * A is slot
 * y = t * A + s (token t's s-th chosen expert e, format EF); the block of the first token
 * to choose e runs e's down projection of SiLU(h1) * h2 for every slot that chose it, each
 * of its weights read once for the step, into that slot's row of slot_y [n * A + n][H];
 * the other such blocks have nothing to compute. With a shared expert (S = A + 1), block
 * row n * A runs its down projection (SF) for all n tokens, into slot_y's rows n * A + t.
 * The last block of a row range to arrive (a counter per row range, left at 0 again) adds
 * each token's terms as k_mlp_down does (the chosen experts weighted, in slot order, then
 * the shared expert) and writes y [n][H] once. */
template <int EF, int SF, int NT>
__global__ void __launch_bounds__(BLOCK) k_mlp_down_grouped(const DMat *down_t, DMat sh_down, const int *idx, const float *w, int A, int S, const float *h1,
                                                            const float *h2, int FI, float *slot_y, float *y, int H, int n, unsigned *count) {
    const int routed = n * A, i0 = blockIdx.x * GF_BLOCK_ROWS + wave_uniform(threadIdx.x / WAVE) * GF_RPW;
    __shared__ int rows[NT], dst[NT], m; /* the slots' rows of h1/h2 and of slot_y */
    __shared__ unsigned arrived;
    float o[NT][GF_RPW];
    if ((int)blockIdx.y < routed) {
        const int ts = blockIdx.y;
        if (expert_slots(idx, ts, A, routed, &m, [&](int p, int u) { rows[u] = p / A * S + p % A; dst[u] = p; })) {
            const DMat W = down_t[idx[ts]];
            assume_global(W);
            gemv_fast_sums<EF, NT, true>(W, h1, h2, FI, 0, H, m, 0, W.cols / GfFormat<EF>::CE, i0, o, rows);
            if (threadIdx.x % WAVE == 0)
                UNROLL for (int u = 0; u < NT; u++) UNROLL for (int j = 0; j < GF_RPW; j++)
                    if (u < m && i0 + j < H) slot_y[(size_t)dst[u] * H + i0 + j] = o[u][j];
        }
    } else {
        const size_t at = (size_t)A * FI; /* token t's row: (t * S + A) * FI */
        gemv_fast_sums<SF, NT, true>(sh_down, h1 + at, h2 + at, S * FI, 0, H, n, 0, sh_down.cols / GfFormat<SF>::CE, i0, o);
        if (threadIdx.x % WAVE == 0)
            UNROLL for (int t = 0; t < NT; t++) UNROLL for (int j = 0; j < GF_RPW; j++)
                if (t < n && i0 + j < H) slot_y[(size_t)(routed + t) * H + i0 + j] = o[t][j];
    }
    __threadfence(); /* this block's sums are visible before the count says so */
    __syncthreads();
    if (threadIdx.x == 0) arrived = atomicAdd(&count[blockIdx.x], 1u);
    __syncthreads();
    if (arrived != gridDim.y - 1) return;
    __threadfence(); /* ... and read after it */
    const volatile float *sy = slot_y;
    const int i_lo = blockIdx.x * GF_BLOCK_ROWS, i_n = H - i_lo < GF_BLOCK_ROWS ? H - i_lo : GF_BLOCK_ROWS;
    for (int q = threadIdx.x; q < n * i_n; q += blockDim.x) {
        const int t = q / i_n, i = i_lo + q % i_n;
        float acc = 0.0f;
        for (int k = 0; k < A; k++) {
            const float wk = w[t * A + k], ok = sy[(size_t)(t * A + k) * H + i];
            acc = k == 0 ? wk * ok : acc + wk * ok;
        }
        y[(size_t)t * H + i] = S > A ? acc + sy[(size_t)(routed + t) * H + i] : acc;
    }
    if (threadIdx.x == 0) count[blockIdx.x] = 0;
}

/* Part 2 of a lone token, for the block's rows of y: each chosen expert's down projection
 * of SiLU(h1) * h2, weighted by w and added in slot (= expert index) order, then the
 * shared expert's (unscaled, pitfall 8), as k_mlp_down_grouped adds them; the sum is
 * written once, so the combine needs no launch and no atomics. y [H] (the MLP's output,
 * D->out). glm.c adds the shared expert first: taking it last keeps its product after the
 * routed ones here and in k_mlp_down_grouped, where it is a block of its own. */
template <int EF, int SF>
__global__ void __launch_bounds__(BLOCK) k_mlp_down(const DMat *down_t, DMat sh_down, const int *idx, const float *w, int A, int S, const float *h1,
                                                    const float *h2, int FI, float *y, int H) {
    const int i0 = blockIdx.x * GF_BLOCK_ROWS + wave_uniform(threadIdx.x / WAVE) * GF_RPW;
    float acc[GF_RPW], o[1][GF_RPW];
    UNROLL for (int j = 0; j < GF_RPW; j++) acc[j] = 0.0f;
    /* slot k < A: the chosen experts; k = A: the shared one. One call site per format
     * keeps one copy of the product's loop. */
    for (int k = 0; k < S; k++) {
        const DMat W = k == A ? sh_down : down_t[idx[k]];
        if (k < A) assume_global(W);
        const size_t at = (size_t)k * FI;
        if (EF == SF || k < A) gemv_fast_sums<EF, 1, true>(W, h1 + at, h2 + at, 0, 0, H, 1, 0, W.cols / GfFormat<EF>::CE, i0, o);
        else gemv_fast_sums<SF, 1, true>(W, h1 + at, h2 + at, 0, 0, H, 1, 0, W.cols / GfFormat<SF>::CE, i0, o);
        const float wk = k == A ? 1.0f : w[k];
        UNROLL for (int j = 0; j < GF_RPW; j++) acc[j] = k == 0 ? wk * o[0][j] : acc[j] + wk * o[0][j];
    }
    if (threadIdx.x % WAVE == 0)
        UNROLL for (int j = 0; j < GF_RPW; j++)
            if (i0 + j < H) y[i0 + j] = acc[j];
}

/* The routed experts (decode): block row y is one (token, slot) pair, as k_gemv_experts.
 * Every expert of the layer has format FMT (checked at upload). */
template <int FMT>
__global__ void __launch_bounds__(BLOCK) k_gemv_experts_fast(const DMat *table, const int *idx, const float *x, int ldx, int x_div, float *y, int ldy, int nr) {
    const int slot = blockIdx.y;
    DMat W = table[idx[slot]];
    assume_global(W);
    gemv_fast_rows<FMT, 1>(W, x + (size_t)(slot / x_div) * ldx, 0, y + (size_t)slot * ldy, 0, 0, nr, 1, 0, W.cols / GfFormat<FMT>::CE);
}

/* ======================================================================== */
/* 3c. the prefill product on matrix cores                                   */
/*
 * A prompt chunk reuses every weight for many tokens, so its products are bound by
 * arithmetic rather than by memory, and the arithmetic belongs on the matrix units:
 *   AMD gfx90a, gfx942, gfx950   v_mfma_f32_32x32x8_bf16 (builtin ..._32x32x8bf16_1k): one
 *                                wave of 64 adds a 32x8 by 8x32 bf16 product to a 32x32
 *                                fp32 tile;
 *   NVIDIA sm_80 and later       mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: one
 *                                warp of 32 adds a 16x16 by 16x8 product to a 16x8 tile;
 *   anything else                the same tiles with FMAs (mma_step's fallback), e.g.
 *                                RDNA, gfx908, CUDA before sm_80.
 * Both instructions multiply bf16 and add in fp32, so
 *   - the activations go in as bf16 (x rounded to nearest even), as every production
 *     engine runs prefill and as glm.c's bf16 path (GLM_PRECISION=bf16) does: the result
 *     differs from the fp32 product by the rounding of x, 1e-3 to 6e-3 relative (L2), not
 *     by the order of the sums only (tests/gpu/kernel_test.c, test_gemm_mma);
 *   - the weights are decoded once per tile into bf16 in shared memory: BF16 as it is,
 *     MXFP4 exactly (an E2M1 value times a power of two has two significant bits), FP8
 *     and F32 rounded to nearest even (FP8 times its fp32 block scale, the product
 *     mat_elem computes, as glm.c's bf16 path rounds it). F32 weights take this path too.
 * k_gemm (section 3) is the reference and runs instead with GLM_GPU_KERNELS=plain.
 *
 * A block of 256 threads computes a BM x BN tile of y (BM rows of W by BN tokens), with
 * k in steps of BK. Two shapes, both 2048 weights and 2048 activations per step, so
 * every thread loads two 16-byte chunks of each whatever the shape:
 *   square  (n > 32)   BM 64, BN 64, BK 32: the waves split the tile (2x2 waves of 32x32
 *                      on AMD, 4x2 warps of 16x32 on NVIDIA);
 *   skinny  (n <= 32)  BM 32, BN 32, BK 64: the waves split k instead (AMD: 4 waves each
 *                      a quarter of every step; NVIDIA: 2x2 warps of 16x16 and k in 2),
 *                      and add their partial tiles in a fixed order at the end: half the
 *                      rows per block, so a tall matrix with few tokens (an expert's share
 *                      of a chunk, a short prompt) spreads over twice the blocks.
 * The weights of step k+1 are loaded from global memory into registers before step k's
 * instructions run from shared memory, and written to the other of two shared buffers
 * after them: one barrier per step, the loads' latency hidden behind the arithmetic.
 * Rows past nr, tokens past n and columns past cols are zeros in the tiles (a zero adds
 * nothing), and the results outside the matrix are never stored.
 */

/* The instruction's shape follows the wave width: wave 64 is AMD's 32x32x8 MFMA, wave
 * 32 NVIDIA's m16n8k16 (the CPU emulation runs the same pairing, so CI exercises both
 * operand layouts). MMA_M rows of W by MMA_N tokens by MMA_K of depth. */
#if WAVE == 64
#define MMA_M 32
#define MMA_N 32
#define MMA_K 8
#else
#define MMA_M 16
#define MMA_N 8
#define MMA_K 16
#endif
#define MMA_CN (MMA_M * MMA_N / WAVE) /* fp32 results per lane: 16 (AMD) or 4 (NVIDIA) */
#define MMA_PAD 8                     /* bf16 after each row of a shared tile: rows start on different banks */

#if defined(GLM_EMU)
#if WAVE == 64
#define MMA_MFMA 1 /* tests/hip_emu.h implements the builtin from AMD's layout */
#else
#define MMA_SYNC 1 /* ... and mma.sync from PTX's */
#endif
#elif defined(__CUDACC__)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MMA_SYNC 1
#endif
#elif defined(__gfx90a__) || defined(__gfx942__) || defined(__gfx950__)
#define MMA_MFMA 1
#endif

/* The accumulator tile of one instruction, MMA_CN floats per lane: the MFMA's own
 * register vector on AMD, an array elsewhere. */
#if defined(MMA_MFMA) && defined(GLM_EMU)
typedef emu_s16x4 mma_ab;
typedef emu_f32x16 MmaC;
#elif defined(MMA_MFMA)
typedef short mma_ab __attribute__((ext_vector_type(4)));
typedef float MmaC __attribute__((ext_vector_type(16)));
#else
struct MmaC {
    float v[MMA_CN];
    __device__ __forceinline__ float &operator[](int i) { return v[i]; }
};
#endif

/* fp32 -> bf16, round to nearest even; NaN stays a (quiet) NaN. */
__device__ __forceinline__ uint32_t f32_bf16_rne(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) { return f32_bf16_rne(lo) | (f32_bf16_rne(hi) << 16); }
__device__ __forceinline__ uint4 mma_u4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    uint4 q;
    q.x = a; q.y = b; q.z = c; q.w = d;
    return q;
}

/* Where result v of this lane sits in the instruction's MMA_M x MMA_N tile (row of W,
 * token). Sources, for the result and the operand layouts below:
 *   AMD: "AMD Instinct MI300 ISA Reference Guide" (CDNA3), section 7 "Matrix Arithmetic
 *   Instructions", and AMD's Matrix Instruction Calculator (amd_matrix_instruction_calculator,
 *   --instruction v_mfma_f32_32x32x8_bf16 --detail-instruction --register-layout): D[i][j]
 *   is in lane j + 32 * ((i / 4) % 2), register 4 * (i / 8) + i % 4. The same map appears in
 *   llama.cpp's ggml-cuda/mma.cuh (tile<32, 32> get_i / get_j on AMD_MFMA).
 *   NVIDIA: PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"
 *   (groupID = lane / 4, threadID_in_group = lane % 4): c0, c1 at row groupID, columns
 *   2 * threadID_in_group + 0, 1; c2, c3 the same at row groupID + 8. */
__device__ __forceinline__ void mma_c_coord(int v, int lane, int &row, int &tok) {
#if WAVE == 64
    row = 8 * (v / 4) + 4 * (lane / 32) + v % 4;
    tok = lane % 32;
#else
    row = lane / 4 + 8 * (v / 2);
    tok = 2 * (lane % 4) + v % 2;
#endif
}

#if defined(MMA_SYNC) && !defined(GLM_EMU)
/* d = a · b + d for one warp; a: 4 words of bf16 pairs, b: 2 (layouts in mma_step). */
__device__ __forceinline__ void mma_sync_bf16_16x8x16(MmaC &d, const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d.v[0]), "+f"(d.v[1]), "+f"(d.v[2]), "+f"(d.v[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#elif defined(MMA_SYNC)
__device__ __forceinline__ void mma_sync_bf16_16x8x16(MmaC &d, const uint32_t a[4], const uint32_t b[2]) { emu_mma_m16n8k16_bf16(d.v, a, b); }
#endif

/* c += A · B for one instruction tile, its operands in shared memory as bf16 rows of
 * depth: a = the first of MMA_M rows of W (A[i][k] = a[i * ld + k0 + k]), b = the first of
 * MMA_N tokens (B[k][j] = b[j * ld + k0 + k]), ld bf16 apart. Each lane reads exactly the
 * operand registers the instruction wants from it:
 *   AMD 32x32x8: A[i][k] in lane i + 32 * (k / 4), element k % 4 of its 4 bf16; B[k][j] in
 *     lane j + 32 * (k / 4), element k % 4 (ISA guide and calculator above; mma.cuh's
 *     tile<32, 4> on AMD): 8 consecutive bytes of a row for every lane.
 *   NVIDIA m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"; row-major A, column-major
 *     B): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9],
 *     a3 = A[g+8][2t+8, 2t+9]; b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g], g = lane / 4,
 *     t = lane % 4, the lower k in the lower half: one 32-bit word of a row each.
 * Without matrix units each lane computes its own results (mma_c_coord) with FMAs. */
__device__ __forceinline__ void mma_step(MmaC &c, const uint16_t *a, const uint16_t *b, int ld, int k0) {
    const int lane = threadIdx.x % WAVE;
#if defined(MMA_MFMA)
    const mma_ab av = *(const mma_ab *)(a + (lane % 32) * ld + k0 + 4 * (lane / 32));
    const mma_ab bv = *(const mma_ab *)(b + (lane % 32) * ld + k0 + 4 * (lane / 32));
    c = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(av, bv, c, 0, 0, 0);
#elif defined(MMA_SYNC)
    const int g = lane / 4, t = lane % 4;
    const uint32_t *a0 = (const uint32_t *)(a + g * ld + k0), *a8 = (const uint32_t *)(a + (g + 8) * ld + k0);
    const uint32_t *bg = (const uint32_t *)(b + g * ld + k0);
    const uint32_t av[4] = {a0[t], a8[t], a0[t + 4], a8[t + 4]}, bv[2] = {bg[t], bg[t + 4]};
    mma_sync_bf16_16x8x16(c, av, bv);
#else
    UNROLL for (int v = 0; v < MMA_CN; v++) {
        int row, tok;
        mma_c_coord(v, lane, row, tok);
        float s = c[v];
        for (int k = 0; k < MMA_K; k++) s += bf16_f32(a[row * ld + k0 + k]) * bf16_f32(b[tok * ld + k0 + k]);
        c[v] = s;
    }
#endif
}

/* The two tile shapes (see the top of this section). WTM x WTN: one wave's part of the
 * tile, FN instructions side by side along the tokens; WGM x WGN x WGK waves along rows,
 * tokens and k; each wave runs KSTEPS instruction steps per BK. */
template <bool SKINNY> struct MmaCfg {
    enum {
        BM = SKINNY ? 32 : 64, BN = SKINNY ? 32 : 64, BK = SKINNY ? 64 : 32,
        WTM = MMA_M, WTN = WAVE == 64 ? 32 : (SKINNY ? 16 : 32),
        WGM = BM / WTM, WGN = BN / WTN, WGK = (BLOCK / WAVE) / (WGM * WGN),
        FN = WTN / MMA_N, KSTEPS = BK / MMA_K / WGK,
        LD = BK + MMA_PAD,                   /* bf16 per row of a shared tile */
        STAGE = 2 * (BM + BN) * LD * 2,      /* bytes: two buffers of W and x tiles */
        CLD = BM + 1,                        /* floats per token row of the result tile */
        RESULT = WGK * BN * CLD * 4,         /* bytes: one result tile per k slice */
        SMEM = STAGE > RESULT ? STAGE : RESULT,
    };
    static_assert(WGM * WGN * WGK * WAVE == BLOCK && KSTEPS * WGK * MMA_K == BK, "tile shape");
};

/* The 16-byte chunks of a BM x BK weight tile and a BN x BK activation tile one thread
 * carries from global memory to shared memory: chunk j of this thread is number
 * threadIdx.x + j * BLOCK. */
struct MmaLoads {
    uint4 w[2];
    float ws[2]; /* the chunk's block scale (FP8, MXFP4) */
    float4 x[2];
};

/* Values per 16-byte chunk of a row of W. */
__device__ __forceinline__ int mma_chunk_elems(int fmt) { return fmt == WF_F32 ? 4 : fmt == WF_BF16 ? 8 : fmt == WF_FP8 ? 16 : 32; }

/* Step k0's chunks into registers. A chunk is loaded whole where the row is a multiple of
 * 16 bytes (cols a multiple of the chunk's values; MXFP4 always is), else byte by byte with
 * zeros past the last column. */
template <bool SKINNY>
__device__ __forceinline__ void mma_load(MmaLoads &L, const DMat &W, const float *x, int ldx, const int *x_rows, int r0, int nr, int n, int row0, int tok0,
                                         int k0, bool xvec) {
    typedef MmaCfg<SKINNY> C;
    const int cols = W.cols, ce = mma_chunk_elems(W.fmt), cpr = C::BK / ce;
    const int ebytes = W.fmt == WF_F32 ? 4 : W.fmt == WF_BF16 ? 2 : 1; /* MXFP4: half a byte, handled below */
    UNROLL for (int j = 0; j < 2; j++) {
        const int c = threadIdx.x + j * BLOCK, r = c / cpr, k = k0 + (c % cpr) * ce;
        uint4 q = mma_u4(0u, 0u, 0u, 0u);
        float s = 1.0f;
        if (r < C::BM && row0 + r < nr && k < cols) {
            const size_t gr = (size_t)(r0 + row0 + r);
            if (W.fmt == WF_MXFP4) {
                q = *(const uint4 *)(W.w + gr * (cols / 2) + k / 2);
                s = e8m0_f32(W.mx_scale[gr * (cols / 32) + k / 32]);
            } else {
                const uint8_t *p = W.w + (gr * cols + k) * ebytes;
                if (cols % ce == 0) q = *(const uint4 *)p;
                else {
                    uint32_t word[4] = {0u, 0u, 0u, 0u};
                    const int nb = (cols - k < ce ? cols - k : ce) * ebytes;
                    for (int b = 0; b < nb; b++) word[b / 4] |= (uint32_t)p[b] << (8 * (b % 4));
                    q = mma_u4(word[0], word[1], word[2], word[3]);
                }
                if (W.fmt == WF_FP8) s = W.fp8_scale[(gr / 128) * ((cols + 127) / 128) + k / 128];
            }
        }
        L.w[j] = q;
        L.ws[j] = s;
        /* activations: BN x BK floats, 4 per chunk */
        const int t = c / (C::BK / 4), kx = k0 + (c % (C::BK / 4)) * 4;
        float4 v;
        v.x = v.y = v.z = v.w = 0.0f;
        if (tok0 + t < n && kx < cols) {
            const float *xr = x + (size_t)(x_rows ? x_rows[tok0 + t] : tok0 + t) * ldx + kx;
            if (xvec) v = *(const float4 *)xr;
            else {
                v.x = xr[0];
                if (kx + 1 < cols) v.y = xr[1];
                if (kx + 2 < cols) v.z = xr[2];
                if (kx + 3 < cols) v.w = xr[3];
            }
        }
        L.x[j] = v;
    }
}

/* The registers of mma_load, decoded to bf16, into shared buffer ws (weights) / xs. */
template <bool SKINNY>
__device__ __forceinline__ void mma_store(const MmaLoads &L, int fmt, uint16_t *ws, uint16_t *xs) {
    typedef MmaCfg<SKINNY> C;
    const int ce = mma_chunk_elems(fmt), cpr = C::BK / ce;
    UNROLL for (int j = 0; j < 2; j++) {
        const int c = threadIdx.x + j * BLOCK, r = c / cpr;
        if (r < C::BM) {
            uint16_t *d = ws + r * C::LD + (c % cpr) * ce;
            const uint4 q = L.w[j];
            const uint32_t w[4] = {q.x, q.y, q.z, q.w};
            const float s = L.ws[j];
            if (fmt == WF_BF16) *(uint4 *)d = q;
            else if (fmt == WF_F32) {
                uint2 o;
                o.x = bf16_pair(__uint_as_float(w[0]), __uint_as_float(w[1]));
                o.y = bf16_pair(__uint_as_float(w[2]), __uint_as_float(w[3]));
                *(uint2 *)d = o;
            } else if (fmt == WF_FP8) {
                uint32_t o[8];
                UNROLL for (int i = 0; i < 8; i++) {
                    const uint32_t b = w[i / 2] >> (16 * (i % 2));
                    o[i] = bf16_pair(fp8_f32(b & 0xff) * s, fp8_f32((b >> 8) & 0xff) * s);
                }
                *(uint4 *)d = mma_u4(o[0], o[1], o[2], o[3]);
                *(uint4 *)(d + 8) = mma_u4(o[4], o[5], o[6], o[7]);
            } else { /* MXFP4: byte i holds columns 2i (low nibble) and 2i+1 */
                uint32_t o[16];
                UNROLL for (int i = 0; i < 16; i++) {
                    const uint32_t b = w[i / 4] >> (8 * (i % 4));
                    o[i] = bf16_pair(e2m1_f32(b & 15) * s, e2m1_f32((b >> 4) & 15) * s);
                }
                UNROLL for (int i = 0; i < 4; i++) *(uint4 *)(d + 8 * i) = mma_u4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]);
            }
        }
        const float4 v = L.x[j];
        uint2 o;
        o.x = bf16_pair(v.x, v.y);
        o.y = bf16_pair(v.z, v.w);
        *(uint2 *)(xs + (c / (C::BK / 4)) * C::LD + (c % (C::BK / 4)) * 4) = o;
    }
}

/* mma_tile<SKINNY>(W, x, ldx, x_rows, y, ldy, y_rows, r0, nr, n, row0, tok0): one block's tile of
 *     y[t][i] = Σ_k bf16(x[x_rows ? x_rows[t] : t][k]) · bf16(W[r0 + i][k])   (fp32 sums)
 * for rows i in [row0, row0 + BM) ∩ [0, nr) and tokens t in [tok0, tok0 + BN) ∩ [0, n),
 * BM x BN = MmaCfg<SKINNY> (64 x 64, or 32 x 32 for SKINNY). x's rows are ldx floats apart
 * and may be gathered: x_rows (device memory, n entries) names the row of x each token
 * reads, NULL reads row t; likewise token t's results go to row y_rows[t] (NULL: t) of y.
 * Every thread of the block must call it (barriers; it uses MmaCfg::SMEM bytes of shared
 * memory). The grouped experts (k_gemm_grouped) call it with one expert's W, x_rows = the
 * tokens routed to that expert and y_rows = their slots. */
template <bool SKINNY>
__device__ __forceinline__ void mma_tile(const DMat &W, const float *x, int ldx, const int *x_rows, float *y, int ldy, const int *y_rows, int r0, int nr, int n,
                                         int row0, int tok0) {
    typedef MmaCfg<SKINNY> C;
    __shared__ __attribute__((aligned(16))) uint16_t smem[C::SMEM / 2];
    const int wid = threadIdx.x / WAVE, wk = wid % C::WGK, wm = wid / C::WGK % C::WGM, wn = wid / C::WGK / C::WGM;
    const int cols = W.cols, nk = (cols + C::BK - 1) / C::BK;
    const bool xvec = ((ldx | cols) & 3) == 0 && ((uintptr_t)x & 15) == 0;
    MmaC acc[C::FN];
    UNROLL for (int f = 0; f < C::FN; f++) UNROLL for (int v = 0; v < MMA_CN; v++) acc[f][v] = 0.0f;
    MmaLoads L;
    mma_load<SKINNY>(L, W, x, ldx, x_rows, r0, nr, n, row0, tok0, 0, xvec);
    mma_store<SKINNY>(L, W.fmt, smem, smem + C::BM * C::LD); /* buffer b at smem + b * (BM + BN) * LD */
    __syncthreads();
    for (int kt = 0; kt < nk; kt++) {
        const uint16_t *ws = smem + (kt & 1) * (C::BM + C::BN) * C::LD, *xs = ws + C::BM * C::LD;
        if (kt + 1 < nk) mma_load<SKINNY>(L, W, x, ldx, x_rows, r0, nr, n, row0, tok0, (kt + 1) * C::BK, xvec); /* in flight during the steps */
        UNROLL for (int s = 0; s < C::KSTEPS; s++) {
            const int k = (wk * C::KSTEPS + s) * MMA_K;
            UNROLL for (int f = 0; f < C::FN; f++) mma_step(acc[f], ws + wm * C::WTM * C::LD, xs + (wn * C::WTN + f * MMA_N) * C::LD, C::LD, k);
        }
        uint16_t *next = smem + ((kt + 1) & 1) * (C::BM + C::BN) * C::LD;
        if (kt + 1 < nk) mma_store<SKINNY>(L, W.fmt, next, next + C::BM * C::LD);
        __syncthreads(); /* the other buffer is complete, and nobody reads this one any more */
    }
    /* each wave's results into shared memory (the staging buffers are free now), then
     * the k slices added in order and stored along rows, which are y's contiguous axis */
    float *res = (float *)smem;
    const int lane = threadIdx.x % WAVE;
    UNROLL for (int f = 0; f < C::FN; f++) UNROLL for (int v = 0; v < MMA_CN; v++) {
        int row, tok;
        mma_c_coord(v, lane, row, tok);
        res[(wk * C::BN + wn * C::WTN + f * MMA_N + tok) * C::CLD + wm * C::WTM + row] = acc[f][v];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < C::BM * C::BN; e += BLOCK) {
        const int t = e / C::BM, i = e % C::BM;
        float s = res[t * C::CLD + i];
        for (int q = 1; q < C::WGK; q++) s += res[(q * C::BN + t) * C::CLD + i];
        if (row0 + i < nr && tok0 + t < n) y[(size_t)(y_rows ? y_rows[tok0 + t] : tok0 + t) * ldy + row0 + i] = s;
    }
}

/* The prefill product y = x · W[r0 .. r0+nr)ᵀ on matrix cores, same arguments as k_gemm;
 * grid (row tiles, token tiles, z). */
template <bool SKINNY>
__global__ void __launch_bounds__(BLOCK) k_gemm_mma(DMat W, const float *x, int ldx, float *y, int ldy, int r0, int nr, int n, int zr, int zx, int zy) {
    const int z = blockIdx.z;
    mma_tile<SKINNY>(W, x + (size_t)z * zx, ldx, (const int *)0, y + (size_t)z * zy, ldy, (const int *)0, r0 + z * zr, nr, n, blockIdx.x * MmaCfg<SKINNY>::BM,
                     blockIdx.y * MmaCfg<SKINNY>::BN);
}

/* The same with x's rows gathered (mma_tile's x_rows): the kernel tests' check of the
 * gather a grouped-expert kernel relies on. */
template <bool SKINNY>
__global__ void __launch_bounds__(BLOCK) k_gemm_mma_rows(DMat W, const float *x, int ldx, const int *x_rows, float *y, int ldy, int r0, int nr, int n) {
    mma_tile<SKINNY>(W, x, ldx, x_rows, y, ldy, (const int *)0, r0, nr, n, blockIdx.x * MmaCfg<SKINNY>::BM, blockIdx.y * MmaCfg<SKINNY>::BN);
}

/* The experts of a prefill chunk, grouped (k_moe_group sorted the (token, slot) pairs by
 * expert, the shared expert as expert E over every token): block (x, y, z) is row tile x
 * of tile y of the list, up to BN pairs of one expert, on the matrix cores (mma_tile), so
 * each expert's weights are read once per chunk for all its tokens. z picks the matrix:
 * gate (z = 0, into y) or up (z = 1, into y_z1) in one launch; the down projection is
 * launched with z = 0 only. Pair p is slot pair_slot[p] (token * A + k, or n * A + token
 * for the shared expert): its input row is x_rows[p] (pair_tok: the token's, for gate and
 * up; pair_slot: the slot's own, for down) and its output row y[slot], where
 * k_moe_combine finds it. */
__global__ void __launch_bounds__(BLOCK) k_gemm_grouped(const DMat *table, const DMat *table_z1, const int *tiles, const int *n_tiles, const int *group_end,
                                                        const int *x_rows, const int *pair_slot, const float *x, int ldx, float *y, float *y_z1, int ldy, int nr) {
    if ((int)blockIdx.y >= *n_tiles) return;
    const int e = tiles[2 * blockIdx.y], p0 = tiles[2 * blockIdx.y + 1], BN = MmaCfg<true>::BN, z = blockIdx.z;
    const int n = group_end[e] - p0 < BN ? group_end[e] - p0 : BN;
    const DMat W = (z ? table_z1 : table)[e]; /* e = E: the shared expert, the tables' last entry */
    assume_global(W);
    mma_tile<true>(W, x, ldx, x_rows + p0, z ? y_z1 : y, ldy, pair_slot + p0, 0, nr, n, blockIdx.x * MmaCfg<true>::BM, 0);
}

/* Host side: the skinny shape for up to 32 tokens, the square one above. */
static void gemm_mma(float *y, int ldy, const float *x, int ldx, const DMat &W, int r0, int nr, int n, int nz, int zr, int zx, int zy) {
    if (n <= MmaCfg<true>::BN)
        LAUNCHED(k_gemm_mma<true>, dim3((nr + MmaCfg<true>::BM - 1) / MmaCfg<true>::BM, (n + MmaCfg<true>::BN - 1) / MmaCfg<true>::BN, nz), dim3(BLOCK), 0, 0, W, x,
                 ldx, y, ldy, r0, nr, n, zr, zx, zy);
    else
        LAUNCHED(k_gemm_mma<false>, dim3((nr + MmaCfg<false>::BM - 1) / MmaCfg<false>::BM, (n + MmaCfg<false>::BN - 1) / MmaCfg<false>::BN, nz), dim3(BLOCK), 0, 0,
                 W, x, ldx, y, ldy, r0, nr, n, zr, zx, zy);
}

/* One instruction on known operands, for the kernel tests (gpuk_mma): a, b, c are the
 * MMA_M x MMA_K, MMA_K x MMA_N and MMA_M x MMA_N matrices, row-major, a and b as bf16;
 * one wave puts them in shared memory, runs mma_step once and writes d = a · b + c. */
__global__ void k_mma_once(const uint16_t *a, const uint16_t *b, const float *c, float *d) {
    __shared__ __attribute__((aligned(16))) uint16_t as[MMA_M * (MMA_K + MMA_PAD)], bs[MMA_N * (MMA_K + MMA_PAD)];
    const int lane = threadIdx.x, ld = MMA_K + MMA_PAD;
    for (int e = lane; e < MMA_M * MMA_K; e += WAVE) as[(e / MMA_K) * ld + e % MMA_K] = a[e];
    for (int e = lane; e < MMA_K * MMA_N; e += WAVE) bs[(e % MMA_N) * ld + e / MMA_N] = b[e]; /* token-major, as x's tile */
    __syncthreads();
    MmaC acc;
    int row, tok;
    UNROLL for (int v = 0; v < MMA_CN; v++) { mma_c_coord(v, lane, row, tok); acc[v] = c[row * MMA_N + tok]; }
    mma_step(acc, as, bs, ld, 0);
    UNROLL for (int v = 0; v < MMA_CN; v++) { mma_c_coord(v, lane, row, tok); d[row * MMA_N + tok] = acc[v]; }
}

/* ======================================================================== */
/* 4. small ops (glm.c §2 "small ops")                                       */

/* x[t] = embed[tokens[t]] (glm.c: mat_dequant_row on the embedding) */
__global__ void __launch_bounds__(BLOCK) k_embed(DMat E, const int *tokens, float *x) {
    int t = blockIdx.x, r = tokens[t];
    for (int k = threadIdx.x; k < E.cols; k += blockDim.x) x[(size_t)t * E.cols + k] = mat_elem(E, r, k);
}

/* RMSNorm (§3.1), one row per block; y may be x. */
__global__ void __launch_bounds__(BLOCK) k_rmsnorm(float *y, int ldy, const float *x, int ldx, const float *w, int n, float eps) {
    const float *xr = x + (size_t)blockIdx.x * ldx;
    float *yr = y + (size_t)blockIdx.x * ldy;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = w[i] * (xr[i] * r);
}

/* Interleaved RoPE on `nvec` vectors per token (heads), `dims` rotary dims starting at
 * `off` in each. cos/sin come from a table the host filled with glm.c's own formula
 * (double angles), so both paths rotate by the same fp32 numbers. */
__device__ __forceinline__ void rope_pair(float *u, int i, const float *cs) {
    float c = cs[2 * i], s = cs[2 * i + 1], a = u[2 * i], b = u[2 * i + 1];
    u[2 * i] = a * c - b * s;
    u[2 * i + 1] = a * s + b * c;
}

/* One token's nvec vectors (stride apart), each rotated over its dims from offset off,
 * with cs its position's cos/sin pairs; the whole block shares the work. */
__device__ void rope_vectors(float *v, int nvec, int stride, int off, int dims, const float *cs) {
    const int half = dims / 2;
    for (int j = threadIdx.x; j < nvec * half; j += blockDim.x) rope_pair(v + (size_t)(j / half) * stride + off, j % half, cs);
}

__global__ void __launch_bounds__(BLOCK) k_rope(float *v, int ld_tok, int nvec, int stride, int off, int dims, int pos0, const float *table,
                                                const int *pos_dev) {
    if (pos_dev) pos0 = *pos_dev; /* a captured decode step: the position from device memory (see gpu_graph_step) */
    const int t = blockIdx.x;
    rope_vectors(v + (size_t)t * ld_tok, nvec, stride, off, dims, table + (size_t)(pos0 + t) * dims);
}

/* glm.c attention(): the token's cache row = [RMSNorm(c) (eps 1e-6), RoPE(k_pe)] from its
 * kv_a output src, with cs its position's cos/sin pairs. */
__device__ void kv_append_row(float *row, const float *src, const float *norm_w, int KR, int DR, const float *cs) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < KR; i += blockDim.x) ss += src[i] * src[i];
    ss = block_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)KR + 1e-6f);
    for (int i = threadIdx.x; i < KR; i += blockDim.x) row[i] = norm_w[i] * (src[i] * r);
    for (int i = threadIdx.x; i < DR / 2; i += blockDim.x) {
        float pair[2] = {src[KR + 2 * i], src[KR + 2 * i + 1]};
        float c = cs[2 * i], s = cs[2 * i + 1];
        row[KR + 2 * i] = pair[0] * c - pair[1] * s;
        row[KR + 2 * i + 1] = pair[0] * s + pair[1] * c;
    }
}

/* attention()'s RoPE of the query heads and the cache append of the same token, one
 * launch: the two touch different data (q; ckv -> the cache row). */
__device__ void rope_q_kv_append_row(float *q_row, int nvec, int stride, int off, float *cache_row, const float *ckv_row, const float *norm_w, int KR,
                                     int DR, const float *cs) {
    rope_vectors(q_row, nvec, stride, off, DR, cs);
    kv_append_row(cache_row, ckv_row, norm_w, KR, DR, cs);
}

/* One sequence's n tokens (block t: position pos0 + t), its cache rows in latent. */
__global__ void __launch_bounds__(BLOCK) k_rope_q_kv_append(float *q, int ld_tok, int nvec, int stride, int off, float *latent, const float *ckv,
                                                            const float *norm_w, int KR, int DR, int pos0, const float *table, const int *pos_dev) {
    if (pos_dev) pos0 = *pos_dev;
    const int t = blockIdx.x, pos = pos0 + t;
    rope_q_kv_append_row(q + (size_t)t * ld_tok, nvec, stride, off, latent + (size_t)pos * (KR + DR), ckv + (size_t)t * (KR + DR), norm_w, KR, DR,
                         table + (size_t)pos * DR);
}

/* The rows of glm serve's decode step, each its sequence's only token: row r at position
 * rows.pos[r] (a captured step: pos_dev[r]) of the cache rows rows.cache[r]. */
struct GRows {
    float *cache[GEMV_MAXN]; /* each row's cache slot in this layer: latent rows, or the indexer's keys */
    int pos[GEMV_MAXN];
};
__global__ void __launch_bounds__(BLOCK) k_rope_q_kv_append_rows(float *q, int ld_tok, int nvec, int stride, int off, GRows rows, const float *ckv,
                                                                 const float *norm_w, int KR, int DR, const float *table, const int *pos_dev) {
    const int r = blockIdx.x, pos = pos_dev ? pos_dev[r] : rows.pos[r];
    rope_q_kv_append_row(q + (size_t)r * ld_tok, nvec, stride, off, rows.cache[r] + (size_t)pos * (KR + DR), ckv + (size_t)r * (KR + DR), norm_w, KR,
                         DR, table + (size_t)pos * DR);
}


/* SwiGLU's middle: h1 = SiLU(h1) ⊙ h2 */
__global__ void __launch_bounds__(BLOCK) k_silu_mul(float *h1, const float *h2, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) h1[i] = silu_f(h1[i]) * h2[i];
}

/* residual add: x += y */
__global__ void __launch_bounds__(BLOCK) k_add(float *x, const float *y, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] += y[i];
}

/* k_add then k_rmsnorm in one launch, one row per block: x += y, a = RMSNorm(x; w). Each
 * thread reads back only the elements it wrote, so no barrier is needed between the two;
 * the sums are k_rmsnorm's, bit for bit (gpuk_add_rmsnorm's test). */
__global__ void __launch_bounds__(BLOCK) k_add_rmsnorm(float *x, const float *y, float *a, const float *w, int n, float eps) {
    float *xr = x + (size_t)blockIdx.x * n, *ar = a + (size_t)blockIdx.x * n;
    const float *yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i] + yr[i];
        xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) ar[i] = w[i] * (xr[i] * r);
}

/* ======================================================================== */
/* 5. the DSA lightning indexer (§3.4)                                      */

/* The token's indexer key: LayerNorm with bias (eps 1e-6), then RoPE on the first
 * DR dims, written straight into the indexer-key cache. */
__device__ void ix_key_row(float *k, const float *x, const float *w, const float *b, int ID, int DR, const float *cs) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < ID; i += blockDim.x) s += x[i];
    float mean = block_sum(s) / (float)ID;
    float v = 0.0f;
    for (int i = threadIdx.x; i < ID; i += blockDim.x) v += (x[i] - mean) * (x[i] - mean);
    float var = block_sum(v) / (float)ID, r = 1.0f / sqrtf(var + 1e-6f);
    for (int i = threadIdx.x; i < ID; i += blockDim.x) k[i] = (x[i] - mean) * r * w[i] + b[i];
    __syncthreads(); /* the rotation pairs elements other threads wrote */
    for (int i = threadIdx.x; i < DR / 2; i += blockDim.x) rope_pair(k, i, cs);
}
__global__ void __launch_bounds__(BLOCK) k_ix_key(float *cache, const float *ix_k, const float *w, const float *b, int ID, int DR, int pos0, const float *table,
                                                  const int *pos_dev) {
    if (pos_dev) pos0 = *pos_dev;
    const int t = blockIdx.x, pos = pos0 + t;
    ix_key_row(cache + (size_t)pos * ID, ix_k + (size_t)t * ID, w, b, ID, DR, table + (size_t)pos * DR);
}

/* The rows of glm serve's decode step (GRows, rows.cache: each slot's indexer keys), one
 * launch: row r's query heads (nvec of ID dims, RoPE on the first DR, as k_rope) and its
 * key, as k_ix_key. */
__global__ void __launch_bounds__(BLOCK) k_ix_rope_key_rows(float *q, int ld_tok, int nvec, GRows rows, const float *ix_k, const float *w, const float *b,
                                                            int ID, int DR, const float *table, const int *pos_dev) {
    const int r = blockIdx.x, pos = pos_dev ? pos_dev[r] : rows.pos[r];
    const float *cs = table + (size_t)pos * DR;
    rope_vectors(q + (size_t)r * ld_tok, nvec, ID, 0, DR, cs);
    ix_key_row(rows.cache[r] + (size_t)pos * ID, ix_k + (size_t)r * ID, w, b, ID, DR, cs);
}

/* score[t][j] = Σ_h (w[h]/sqrt(IH)) · ReLU(q_h · k_j / sqrt(ID)) for every visible key j.
 * One thread per key, heads and dims in glm.c's order. Tokens that see at most
 * index_topk keys keep them all and need no scores. */
__global__ void __launch_bounds__(BLOCK) k_ix_scores(float *scores, int ld, const float *ix_q, const float *ix_w, const float *cache, int IH, int ID, int K, int pos0,
                                                     const int *pos_dev) {
    if (pos_dev) pos0 = *pos_dev;
    int t = blockIdx.y, visible = pos0 + t + 1, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (visible <= K || j >= visible) return;
    const float q_scale = 1.0f / sqrtf((float)ID), w_scale = 1.0f / sqrtf((float)IH);
    const float *q = ix_q + (size_t)t * IH * ID, *w = ix_w + (size_t)t * IH, *k = cache + (size_t)j * ID;
    float sum = 0.0f;
    for (int h = 0; h < IH; h++) {
        float d = 0.0f;
        for (int i = 0; i < ID; i++) d += q[(size_t)h * ID + i] * k[i];
        d *= q_scale;
        sum += (w[h] * w_scale) * (d > 0.0f ? d : 0.0f);
    }
    scores[(size_t)t * ld + j] = sum;
}

#define IX_KEYS 32       /* keys per block of k_ix_scores_tiled */
#define IX_TOKENS 8      /* tokens per block of it: each key tile is read once for all of them (a chunk: a GEMM's tiling) */
#define IX_HEADS 32      /* the most indexer heads it holds (GLM-5.2: 32) */
#define IX_DIM 128       /* the widest indexer head it holds (GLM-5.2: 128) */

/* The same scores as k_ix_scores, each key read from memory once for all heads and for
 * IX_TOKENS tokens of a chunk (tiled over keys and tokens, as a GEMM of the queries by the
 * keys with a ReLU-weighted sum over heads as its epilogue). Grid (key tiles of IX_KEYS,
 * token groups of IX_TOKENS): the block stages its tile's keys (consecutive cache rows:
 * coalesced) once, then each token's queries q [IH][ID], in shared memory. Thread (key
 * j = tid % 32, head group g = tid / 32) computes q_h · k_j for the heads h = g, g+8, ...
 * over the dims in order (32 lanes share g, so q reads are broadcasts); the
 * weighted ReLU terms go to shared memory and are added over h = 0..IH-1 in order, so a
 * score has k_ix_scores' operations in k_ix_scores' order. Long contexts give many blocks. */
__global__ void __launch_bounds__(BLOCK) k_ix_scores_tiled(float *scores, int ld, const float *ix_q, const float *ix_w, const float *cache, int IH, int ID, int K, int pos0,
                                                           int n, const int *pos_dev) {
    if (pos_dev) pos0 = *pos_dev;
    __shared__ float q_s[IX_HEADS * IX_DIM];
    __shared__ float k_s[IX_KEYS][IX_DIM + 1]; /* +1: the lanes of a wave read 32 different rows */
    __shared__ float term[IX_HEADS][IX_KEYS + 1];
    const int t0 = blockIdx.y * IX_TOKENS, j0 = blockIdx.x * IX_KEYS;
    const int t_end = t0 + IX_TOKENS < n ? t0 + IX_TOKENS : n, seen = pos0 + t_end; /* the group's last token sees the most keys */
    if (seen <= K || j0 >= seen) return; /* the whole block: no barrier is skipped */
    const float q_scale = 1.0f / sqrtf((float)ID), w_scale = 1.0f / sqrtf((float)IH);
    for (int e = threadIdx.x; e < IX_KEYS * ID; e += BLOCK) { /* the key tile, once for the group's tokens */
        int k = e / ID, i = e % ID;
        k_s[k][i] = j0 + k < seen ? cache[(size_t)(j0 + k) * ID + i] : 0.0f;
    }
    const int jl = threadIdx.x % IX_KEYS, g = threadIdx.x / IX_KEYS;
    constexpr int GROUPS = BLOCK / IX_KEYS, PER = IX_HEADS / GROUPS;
    for (int t = t0; t < t_end; t++) {
        const int visible = pos0 + t + 1;
        if (visible <= K || j0 >= visible) continue; /* uniform: t is the block's */
        const float *q = ix_q + (size_t)t * IH * ID, *w = ix_w + (size_t)t * IH;
        __syncthreads(); /* the previous token's q and terms are read */
        for (int e = threadIdx.x; e < IH * ID; e += BLOCK) q_s[e] = q[e];
        __syncthreads();
        float d[PER];
        UNROLL for (int a = 0; a < PER; a++) d[a] = 0.0f;
        for (int i = 0; i < ID; i++) {
            float kv = k_s[jl][i];
            UNROLL for (int a = 0; a < PER; a++) {
                int h = g + GROUPS * a;
                if (h < IH) d[a] += q_s[h * ID + i] * kv;
            }
        }
        UNROLL for (int a = 0; a < PER; a++) {
            int h = g + GROUPS * a;
            if (h < IH) {
                float dd = d[a] * q_scale;
                term[h][jl] = (w[h] * w_scale) * (dd > 0.0f ? dd : 0.0f);
            }
        }
        __syncthreads();
        if (threadIdx.x < IX_KEYS && j0 + (int)threadIdx.x < visible) {
            float sum = 0.0f;
            for (int h = 0; h < IH; h++) sum += term[h][threadIdx.x];
            scores[(size_t)t * ld + j0 + threadIdx.x] = sum;
        }
    }
}

/* fp32 -> uint32 whose unsigned order is the float order (+0 and -0 equal). */
__device__ __forceinline__ uint32_t order_key(float f) {
    if (f != f) return 0; /* NaN below -inf, as glm.c's better() */
    uint32_t u = __float_as_uint(f);
    if ((u << 1) == 0) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* topk_select on the GPU, one token per block: a radix select finds the k-th best key
 * T (four passes of 8 bits), then one ordered sweep keeps every key above T and the
 * lowest-index keys equal to T. The kept set is exactly glm.c's (higher score, then
 * lower index); it is written in index order. */
__device__ void topk_block(const float *score, int nv, int k, int *sel) {
    __shared__ unsigned hist[256];
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ int s_remain;
    if (threadIdx.x == 0) { s_prefix = 0; s_mask = 0; s_remain = k; }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        uint32_t prefix = s_prefix, mask = s_mask;
        for (int j = threadIdx.x; j < nv; j += blockDim.x) {
            uint32_t key = order_key(score[j]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int remain = s_remain, above = 0;
            for (int d = 255; d >= 0; d--) {
                if (above + (int)hist[d] >= remain) {
                    s_remain = remain - above;
                    s_prefix = prefix | ((uint32_t)d << shift);
                    break;
                }
                above += (int)hist[d];
            }
            s_mask = mask | (255u << shift);
        }
        __syncthreads();
    }
    const uint32_t T = s_prefix;
    const int n_eq = s_remain; /* keys equal to T that are kept, lowest index first */
    int gt_before = 0, eq_before = 0;
    for (int j0 = 0; j0 < nv; j0 += BLOCK) {
        int j = j0 + threadIdx.x;
        uint32_t key = j < nv ? order_key(score[j]) : 0;
        int gt = j < nv && key > T, eq = j < nv && key == T, total;
        int excl = block_exclusive_scan(gt | (eq << 16), &total);
        int my_gt = gt_before + (excl & 0xffff), my_eq = eq_before + (excl >> 16);
        if (gt || (eq && my_eq < n_eq)) sel[my_gt + (my_eq < n_eq ? my_eq : n_eq)] = j;
        gt_before += total & 0xffff;
        eq_before += total >> 16;
    }
}

/* a token that sees `visible` keys: its selection sel (and its count *n_sel) */
__device__ void topk_row(const float *scores, int visible, int K, int *sel, int *n_sel) {
    if (visible <= K) { /* every visible key is kept: attention is dense causal */
        for (int j = threadIdx.x; j < visible; j += blockDim.x) sel[j] = j;
        if (threadIdx.x == 0) *n_sel = visible;
        return;
    }
    topk_block(scores, visible, K, sel);
    if (threadIdx.x == 0) *n_sel = K;
}
__global__ void __launch_bounds__(BLOCK) k_topk(const float *scores, int ld, int K, int pos0, int *sel_all, int *n_sel, const int *pos_dev) {
    if (pos_dev) pos0 = *pos_dev;
    const int t = blockIdx.x;
    topk_row(scores + (size_t)t * ld, pos0 + t + 1, K, sel_all + (size_t)t * K, n_sel + t);
}
/* k_topk for the rows of glm serve's decode step (GRows positions; rows.cache unused). */
__global__ void __launch_bounds__(BLOCK) k_topk_rows(const float *scores, int ld, int K, GRows rows, int *sel_all, int *n_sel, const int *pos_dev) {
    const int r = blockIdx.x, pos = pos_dev ? pos_dev[r] : rows.pos[r];
    topk_row(scores + (size_t)r * ld, pos + 1, K, sel_all + (size_t)r * K, n_sel + r);
}

/* ======================================================================== */
/* 6. MLA attention, absorbed form (§4.2)                                   */

/* absorb: q_abs[t][h][0:KR] = Σ_i q_nope[t][h][i] · W_UK[h][i][:], then the roped q_pe.
 * Block (h, column chunk); threads own columns j, so rows of kv_b are read coalesced
 * and the sum over i runs in glm.c's order. */
__global__ void __launch_bounds__(BLOCK) k_q_absorb(float *q_abs, const float *q, DMat kv_b, int n, int NH, int DN, int DR, int DV, int KR) {
    const int h = blockIdx.x, j = blockIdx.y * blockDim.x + threadIdx.x, QD = DN + DR, AD = KR + DR;
    for (int t0 = 0; t0 < n; t0 += GEMV_MAXN) {
        float acc[GEMV_MAXN];
        UNROLL for (int u = 0; u < GEMV_MAXN; u++) acc[u] = 0.0f;
        if (j < KR)
            for (int i = 0; i < DN; i++) {
                float w = mat_elem(kv_b, h * (DN + DV) + i, j);
                UNROLL for (int u = 0; u < GEMV_MAXN; u++)
                    if (t0 + u < n) acc[u] += q[((size_t)(t0 + u) * NH + h) * QD + i] * w;
            }
        UNROLL for (int u = 0; u < GEMV_MAXN; u++)
            if (j < KR && t0 + u < n) q_abs[((size_t)(t0 + u) * NH + h) * AD + j] = acc[u];
    }
    if (blockIdx.y == 0)
        for (int e = threadIdx.x; e < n * DR; e += blockDim.x) {
            int t = e / DR, i = e % DR;
            q_abs[((size_t)t * NH + h) * AD + KR + i] = q[((size_t)t * NH + h) * QD + DN + i];
        }
}

/* Scores over the selected cache rows, softmax, and the latent value sum, for one
 * (head, token) per block. `sc` is this pair's slice of a global scratch. */
__global__ void __launch_bounds__(BLOCK) k_mla_attend(float *o_lat, float *scores, const float *q_abs, const float *latent, const int *sel_all, const int *n_sel,
                                                      int NH, int KR, int DR, int K, float scale) {
    const int h = blockIdx.x, t = blockIdx.y, AD = KR + DR;
    const int lane = threadIdx.x % WAVE, wid = threadIdx.x / WAVE, nw = blockDim.x / WAVE;
    const float *qa = q_abs + ((size_t)t * NH + h) * AD;
    const int *sel = sel_all + (size_t)t * K, ns = n_sel[t];
    float *sc = scores + ((size_t)t * NH + h) * K;
    for (int j = wid; j < ns; j += nw) { /* one wave per key */
        const float *c = latent + (size_t)sel[j] * AD;
        float d = 0.0f;
        for (int i = lane; i < AD; i += WAVE) d += qa[i] * c[i];
        d = wave_sum(d);
        if (lane == 0) sc[j] = d * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < ns; j += blockDim.x) mx = fmaxf(mx, sc[j]);
    mx = block_max(mx);
    float part = 0.0f;
    for (int j = threadIdx.x; j < ns; j += blockDim.x) { float e = expf(sc[j] - mx); sc[j] = e; part += e; }
    float sum = block_sum(part); /* its barriers also publish the sc[j] writes */
    float *o = o_lat + ((size_t)t * NH + h) * KR;
    for (int i = threadIdx.x; i < KR; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < ns; j++) acc += (sc[j] / sum) * latent[(size_t)sel[j] * AD + i];
        o[i] = acc;
    }
}

/* Eight consecutive elements W[r][k0..k0+8) with mat_elem's values (same products, so
 * the same bits), in one load where the format allows: 16 bytes of BF16, 8 of FP8, 4 of
 * MXFP4 (k0 % 8 == 0 keeps those within one scale block and aligned). */
__device__ __forceinline__ void mat_elems8(const DMat &W, int r, int k0, float *v) {
    const int cols = W.cols;
    if (k0 + 8 > cols) {
        UNROLL for (int k = 0; k < 8; k++) v[k] = k0 + k < cols ? mat_elem(W, r, k0 + k) : 0.0f;
    } else if (W.fmt == WF_BF16 && cols % 8 == 0) {
        uint4 q = *(const uint4 *)(W.w + ((size_t)r * cols + k0) * 2);
        uint32_t word[4] = {q.x, q.y, q.z, q.w};
        UNROLL for (int k = 0; k < 8; k++) v[k] = bf16_f32((word[k / 2] >> (16 * (k % 2))) & 0xffff);
    } else if (W.fmt == WF_FP8 && cols % 8 == 0) {
        uint2 q = *(const uint2 *)(W.w + (size_t)r * cols + k0);
        uint32_t word[2] = {q.x, q.y};
        float s = W.fp8_scale[(size_t)(r / 128) * ((cols + 127) / 128) + k0 / 128];
        UNROLL for (int k = 0; k < 8; k++) v[k] = fp8_f32((word[k / 4] >> (8 * (k % 4))) & 0xff) * s;
    } else if (W.fmt == WF_MXFP4) {
        uint32_t word = *(const uint32_t *)(W.w + (size_t)r * (cols / 2) + k0 / 2);
        float s = e8m0_f32(W.mx_scale[(size_t)r * (cols / 32) + k0 / 32]);
        UNROLL for (int k = 0; k < 8; k++) v[k] = e2m1_f32((word >> (4 * k)) & 15) * s;
    } else {
        UNROLL for (int k = 0; k < 8; k++) v[k] = mat_elem(W, r, k0 + k);
    }
}

#define ABS_COLS 64      /* q_abs columns per block of k_q_absorb_wide */
#define ABS_NT 4         /* tokens (of a chunk) that share one pass over the block's W_UK rows (8: SGPR spills) */

/* The same q_abs as k_q_absorb, as a wide GEMV. Grid (head h, chunk of ABS_COLS
 * columns): NH x KR/64 blocks (512 for GLM-5.2) instead of NH x 2, so the rows of W_UK
 * stream through many blocks at once. Thread (column octet o = tid % 8, row group
 * rg = tid / 8) decodes 8 consecutive columns of rows i = rg, rg+32, ... (one vector
 * load per row) and keeps 8 columns x ABS_NT tokens of partial sums; each W_UK element is
 * read once for NT tokens (1 for decode, whose registers then hold 8 sums, not 64;
 * ABS_NT for chunks). The 32 row groups are added in shared memory in order. */
template <int NT>
__global__ void __launch_bounds__(BLOCK) k_q_absorb_wide(float *q_abs, const float *q, DMat kv_b, int n, int NH, int DN, int DR, int DV, int KR) {
    constexpr int OCTETS = ABS_COLS / 8, GROUPS = BLOCK / OCTETS;
    __shared__ float part[GROUPS][ABS_COLS + 1];
    const int h = blockIdx.x, o = threadIdx.x % OCTETS, rg = threadIdx.x / OCTETS, QD = DN + DR, AD = KR + DR;
    const int j0 = blockIdx.y * ABS_COLS + o * 8;
    for (int t0 = 0; t0 < n; t0 += NT) {
        float acc[NT][8];
        UNROLL for (int u = 0; u < NT; u++) UNROLL for (int k = 0; k < 8; k++) acc[u][k] = 0.0f;
        if (j0 < KR)
            for (int i = rg; i < DN; i += GROUPS) {
                float w[8];
                mat_elems8(kv_b, h * (DN + DV) + i, j0, w);
                UNROLL for (int u = 0; u < NT; u++)
                    if (t0 + u < n) {
                        float x = q[((size_t)(t0 + u) * NH + h) * QD + i];
                        UNROLL for (int k = 0; k < 8; k++) acc[u][k] += x * w[k];
                    }
            }
        UNROLL for (int u = 0; u < NT; u++) { /* (unrolled: acc stays in registers) */
            if (t0 + u >= n) break;
            __syncthreads(); /* the last token's sums are read */
            UNROLL for (int k = 0; k < 8; k++) part[rg][o * 8 + k] = acc[u][k];
            __syncthreads();
            const int c = threadIdx.x, j = blockIdx.y * ABS_COLS + c;
            if (c < ABS_COLS && j < KR) {
                float s = 0.0f;
                for (int g = 0; g < GROUPS; g++) s += part[g][c];
                q_abs[((size_t)(t0 + u) * NH + h) * AD + j] = s;
            }
        }
    }
    if (blockIdx.y == 0)
        for (int e = threadIdx.x; e < n * DR; e += blockDim.x) {
            int t = e / DR, i = e % DR;
            q_abs[((size_t)t * NH + h) * AD + KR + i] = q[((size_t)t * NH + h) * QD + DN + i];
        }
}

/* FlashMLA-style attention: one workgroup per (slice of a token's selected keys, token)
 * holds all NH heads, so each selected latent row is read once for all of them (the
 * plain kernel reads it once per head). Grid (slices, tokens); a slice is a whole
 * number of tiles of MLA_KEYS keys and workgroups past a token's n_sel exit at once.
 * Per tile:
 *   scores   S[h][k] = q_abs[h] · c_k over AD dims, MLA_DIMS at a time: q (NH x 32) and
 *            the rows (64 x 32) staged in shared memory; thread (4 heads, 4 keys); the
 *            dims are added in order, as glm.c's dot;
 *   softmax  online, per head (4 threads each): running max m, sum l; the tile's
 *            exp(S - m) replace S in shared memory, the old sums are rescaled;
 *   values   o[h][c] = o[h][c]·rescale + Σ_k p[h][k] · c_k[c], rows staged MLA_VKEYS at a
 *            time; thread (8 heads, 16 columns c = cg + 32m): NH x KR accumulators in
 *            registers, 128 per thread at GLM-5.2's 64 x 512.
 * One slice writes o / l straight to o_lat; several write (o, m, l) for k_mla_combine.
 * Shared memory: ~35 KB, static (under CUDA's 48 KB static limit). */
#define MLA_HEADS 64     /* the most heads a workgroup holds (GLM-5.2: 64) */
#define MLA_KEYS 64      /* selected keys per tile; slices are whole tiles */
#define MLA_DIMS 32      /* q / latent dims per step of the score phase */
#define MLA_VKEYS 8      /* latent rows per step of the value phase */
#define MLA_COLS 16      /* value columns per thread: KR <= 32 x 16 = 512 */
#define MLA_MAX_SLICES 64
#define MLA_QS (MLA_HEADS + 4) /* row pitch of the staged q and latent chunks */
#define MLA_LS (MLA_KEYS + 4)
#define MLA_STAGE (MLA_DIMS * (MLA_QS + MLA_LS) > MLA_VKEYS * 32 * MLA_COLS ? MLA_DIMS * (MLA_QS + MLA_LS) : MLA_VKEYS * 32 * MLA_COLS)
#if BLOCK != 256
#error "k_mla_attend_split maps 256 threads onto 64 heads x 64 keys"
#endif

__global__ void __launch_bounds__(BLOCK) k_mla_attend_split(float *o_lat, float *part_o, float *part_ml, const float *q_abs, const float *latent, const int *sel_all,
                                                            const int *n_sel, int NH, int KR, int DR, int K, float scale, int n_slices, int slice_len) {
    __shared__ float stage[MLA_STAGE];                 /* score phase: q chunk, row chunk; value phase: rows */
    __shared__ float p_s[MLA_KEYS][MLA_HEADS + 1];     /* the tile's scores, then their exp */
    __shared__ float m_s[MLA_HEADS], l_s[MLA_HEADS], alpha_s[MLA_HEADS];
    __shared__ int rows[MLA_KEYS];
    const int s = blockIdx.x, t = blockIdx.y, AD = KR + DR, tid = threadIdx.x, ns = n_sel[t];
    /* the last slice takes every key left, should n_sel exceed the host's bound */
    const int kbeg = s * slice_len, kend = s == n_slices - 1 || kbeg + slice_len >= ns ? ns : kbeg + slice_len;
    if (kbeg >= ns) return; /* the whole workgroup: this token has fewer keys */
    const int *sel = sel_all + (size_t)t * K;
    const float *qa = q_abs + (size_t)t * NH * AD;
    float *q_s = stage, *c_s = stage + MLA_DIMS * MLA_QS, *v_s = stage;
    const int hq = tid / 16, kq = tid % 16;            /* score phase: heads 4hq.., keys 4kq.. */
    const int hg = tid / 32, cg = tid % 32;            /* value phase: heads 8hg.., columns cg + 32m */
    if (tid < MLA_HEADS) { m_s[tid] = -INFINITY; l_s[tid] = 0.0f; }
    float acc[8][MLA_COLS];
    UNROLL for (int a = 0; a < 8; a++) UNROLL for (int m = 0; m < MLA_COLS; m++) acc[a][m] = 0.0f;
    for (int k0 = kbeg; k0 < kend; k0 += MLA_KEYS) {
        const int nk = kend - k0 < MLA_KEYS ? kend - k0 : MLA_KEYS;
        __syncthreads(); /* the last tile's rows, p_s and stage are read */
        if (tid < MLA_KEYS) rows[tid] = tid < nk ? sel[k0 + tid] : -1;
        float S[4][4];
        UNROLL for (int a = 0; a < 4; a++) UNROLL for (int b = 0; b < 4; b++) S[a][b] = 0.0f;
        for (int d0 = 0; d0 < AD; d0 += MLA_DIMS) {
            __syncthreads(); /* rows are written; the last chunk is read */
            for (int e = tid; e < MLA_HEADS * MLA_DIMS; e += BLOCK) {
                int h = e / MLA_DIMS, d = e % MLA_DIMS;
                q_s[d * MLA_QS + h] = h < NH && d0 + d < AD ? qa[(size_t)h * AD + d0 + d] : 0.0f;
            }
            for (int e = tid; e < MLA_KEYS * MLA_DIMS; e += BLOCK) {
                int k = e / MLA_DIMS, d = e % MLA_DIMS, r = rows[k];
                c_s[d * MLA_LS + k] = r >= 0 && d0 + d < AD ? latent[(size_t)r * AD + d0 + d] : 0.0f;
            }
            __syncthreads();
            for (int d = 0; d < MLA_DIMS; d++) {
                float qv[4], cv[4];
                UNROLL for (int a = 0; a < 4; a++) qv[a] = q_s[d * MLA_QS + 4 * hq + a];
                UNROLL for (int b = 0; b < 4; b++) cv[b] = c_s[d * MLA_LS + 4 * kq + b];
                UNROLL for (int a = 0; a < 4; a++) UNROLL for (int b = 0; b < 4; b++) S[a][b] += qv[a] * cv[b];
            }
        }
        UNROLL for (int a = 0; a < 4; a++) UNROLL for (int b = 0; b < 4; b++)
            p_s[4 * kq + b][4 * hq + a] = 4 * kq + b < nk ? S[a][b] * scale : -INFINITY;
        __syncthreads();
        { /* online softmax: head h = tid / 4, its keys part, part + 4, ... */
            const int h = tid / 4, part = tid % 4;
            const float m_old = m_s[h];
            float mx = -INFINITY;
            for (int k = part; k < MLA_KEYS; k += 4) mx = fmaxf(mx, p_s[k][h]);
            mx = fmaxf(mx, SHFL_XOR(mx, 1));
            mx = fmaxf(mx, SHFL_XOR(mx, 2));
            const float m_new = fmaxf(m_old, mx); /* finite: a tile has a key */
            float sum = 0.0f;
            for (int k = part; k < MLA_KEYS; k += 4) { float e = expf(p_s[k][h] - m_new); p_s[k][h] = e; sum += e; }
            sum += SHFL_XOR(sum, 1);
            sum += SHFL_XOR(sum, 2);
            if (part == 0) {
                const float alpha = expf(m_old - m_new); /* 0 on the first tile */
                alpha_s[h] = alpha;
                l_s[h] = l_s[h] * alpha + sum;
                m_s[h] = m_new;
            }
        }
        __syncthreads();
        UNROLL for (int a = 0; a < 8; a++) {
            const float alpha = alpha_s[8 * hg + a];
            UNROLL for (int m = 0; m < MLA_COLS; m++) acc[a][m] *= alpha;
        }
        for (int kk = 0; kk < nk; kk += MLA_VKEYS) {
            __syncthreads(); /* stage is free (the scores, or the last rows, are read) */
            for (int e = tid; e < MLA_VKEYS * KR; e += BLOCK) {
                int k = e / KR, c = e % KR;
                v_s[k * (32 * MLA_COLS) + c] = kk + k < nk ? latent[(size_t)rows[kk + k] * AD + c] : 0.0f;
            }
            __syncthreads();
            for (int k = 0; k < MLA_VKEYS; k++) {
                float p[8], v[MLA_COLS];
                UNROLL for (int a = 0; a < 8; a++) p[a] = p_s[kk + k][8 * hg + a];
                UNROLL for (int m = 0; m < MLA_COLS; m++) v[m] = v_s[k * (32 * MLA_COLS) + cg + 32 * m];
                UNROLL for (int a = 0; a < 8; a++) UNROLL for (int m = 0; m < MLA_COLS; m++) acc[a][m] += p[a] * v[m];
            }
        }
    }
    /* one slice: the normalised o_lat; several: the slice's sums for the combine */
    float *dst = n_slices == 1 ? o_lat + (size_t)t * NH * KR : part_o + ((size_t)t * n_slices + s) * NH * KR;
    UNROLL for (int a = 0; a < 8; a++) {
        const int h = 8 * hg + a;
        if (h >= NH) continue;
        const float l = n_slices == 1 ? l_s[h] : 1.0f;
        UNROLL for (int m = 0; m < MLA_COLS; m++) {
            const int c = cg + 32 * m;
            if (c < KR) dst[(size_t)h * KR + c] = acc[a][m] / l;
        }
    }
    if (n_slices > 1 && tid < NH) {
        part_ml[(((size_t)t * n_slices + s) * NH + tid) * 2] = m_s[tid];
        part_ml[(((size_t)t * n_slices + s) * NH + tid) * 2 + 1] = l_s[tid];
    }
}

/* Merges the slices of k_mla_attend_split for one (head, token) per block, in slice
 * order (deterministic): with M the largest slice max, o = Σ_s o_s·exp(m_s - M) / Σ_s
 * l_s·exp(m_s - M). Grid (NH, tokens); a token uses the slices its n_sel reaches. */
__global__ void __launch_bounds__(BLOCK) k_mla_combine(float *o_lat, const float *part_o, const float *part_ml, const int *n_sel, int NH, int KR, int n_slices, int slice_len) {
    __shared__ float w_s[MLA_MAX_SLICES];
    const int h = blockIdx.x, t = blockIdx.y, reach = (n_sel[t] + slice_len - 1) / slice_len, used = reach < n_slices ? reach : n_slices;
    const float *ml = part_ml + ((size_t)t * n_slices * NH + h) * 2;
    if (threadIdx.x == 0) {
        float M = -INFINITY, L = 0.0f;
        for (int s = 0; s < used; s++) M = fmaxf(M, ml[(size_t)s * NH * 2]);
        for (int s = 0; s < used; s++) L += ml[(size_t)s * NH * 2 + 1] * expf(ml[(size_t)s * NH * 2] - M);
        for (int s = 0; s < used; s++) w_s[s] = expf(ml[(size_t)s * NH * 2] - M) / L;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < KR; c += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < used; s++) o += part_o[(((size_t)t * n_slices + s) * NH + h) * KR + c] * w_s[s];
        o_lat[((size_t)t * NH + h) * KR + c] = o;
    }
}

/* ======================================================================== */
/* 7. MoE routing (§3.7) and the expert mix                                 */

/* moe_route for one token per block. `scr` holds [E] scores, [E] selection keys and
 * [G] group scores. Chosen experts come out sorted by expert index, the order in which
 * glm.c's moe() adds them up. */
__global__ void __launch_bounds__(BLOCK) k_moe_route(const float *logits, const float *bias, float *scr, int *idx_all, float *w_all,
                                                     int E, int A, int G, int topk_group, int norm_topk_prob, float routed_scale) {
    const int t = blockIdx.x, per = E / G;
    const float *lg = logits + (size_t)t * E;
    float *score = scr + (size_t)t * (2 * E + G), *sel = score + E, *gscore = sel + E;
    int *idx = idx_all + (size_t)t * A;
    float *weight = w_all + (size_t)t * A;
    for (int e = threadIdx.x; e < E; e += blockDim.x) { score[e] = sigmoid_f(lg[e]); sel[e] = score[e] + bias[e]; }
    __syncthreads();
    if (G > 1) { /* keep the topk_group groups with the largest sum of their two best experts */
        for (int g = threadIdx.x; g < G; g += blockDim.x) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (sel[e] > b1) { b2 = b1; b1 = sel[e]; }
                else if (sel[e] > b2) b2 = sel[e];
            }
            gscore[g] = b1 + b2;
        }
        __syncthreads();
        __shared__ int kept_group[64];
        for (int g0 = 0; g0 < G; g0 += 64) {
            /* group g is kept iff fewer than topk_group groups are better than it */
            for (int g = g0 + threadIdx.x; g < G && g < g0 + 64; g += blockDim.x) {
                int rank = 0;
                for (int o = 0; o < G; o++) rank += better(gscore[o], o, gscore[g], g);
                kept_group[g - g0] = rank < topk_group;
            }
            __syncthreads();
            for (int e = g0 * per + threadIdx.x; e < (g0 + 64) * per && e < E; e += blockDim.x)
                if (!kept_group[e / per - g0]) sel[e] = -INFINITY;
            __syncthreads();
        }
    }
    /* A rounds of a block-wide best over the experts not chosen yet (idx[0..k)); better()
     * ranks NaN last, so every round finds one (E >= A) and best is never -1 */
    for (int k = 0; k < A; k++) {
        float v = 0.0f;
        int best = -1;
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= idx[j] == e;
            if (!taken && better(sel[e], e, v, best)) { v = sel[e]; best = e; }
        }
        block_best(v, best);
        if (threadIdx.x == 0) idx[k] = best;
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        for (int i = 1; i < A; i++) /* insertion sort by expert index */
            for (int j = i; j > 0 && idx[j - 1] > idx[j]; j--) { int tmp = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = tmp; }
        float sum = 0.0f;
        for (int k = 0; k < A; k++) { weight[k] = score[idx[k]]; sum += weight[k]; }
        for (int k = 0; k < A; k++) weight[k] = (norm_topk_prob ? weight[k] / (sum + 1e-20f) : weight[k]) * routed_scale;
    }
}

/* y[t] = base[t] (or y[t]) + Σ_k w[t][k] · expert_out[t][k], experts in ascending index order */
__global__ void __launch_bounds__(BLOCK) k_moe_combine(float *y, const float *ex_y, const float *w, int A, int H, const float *base) {
    int t = blockIdx.x;
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
        float acc = (base ? base : y)[(size_t)t * H + j]; /* the shared expert's output (base: the grouped one's rows) */
        for (int k = 0; k < A; k++) acc += w[t * A + k] * ex_y[((size_t)t * A + k) * H + j];
        y[(size_t)t * H + j] = acc;
    }
}

/* A prefill chunk's (token, slot) pairs grouped by expert, for k_gemm_grouped (one block):
 * group_end[e] = where expert e's pairs end in pair_slot (they start where e-1's end),
 * pair_slot[p] = the slot (token * A + k) of pair p, pair_tok[p] its token, and the tile list:
 * n_shared > 0 adds the shared expert as expert E, its pair for token t at slot slots + t; tile i is
 * (expert, first pair) of up to `tile` pairs; *n_tiles of them. The order of the pairs
 * within an expert is the order the atomics hand out, which changes no result: each
 * pair's row is computed on its own. */
#define MOE_MAX_EXPERTS 1024
__global__ void __launch_bounds__(BLOCK) k_moe_group(const int *idx, int slots, int A, int E, int n_shared, int tile, int *group_end, int *pair_slot,
                                                     int *pair_tok, int *tiles, int *n_tiles) {
    __shared__ int count[MOE_MAX_EXPERTS], next[MOE_MAX_EXPERTS];
    for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < slots; s += blockDim.x) atomicAdd(&count[idx[s]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int at = 0, nt = 0;
        for (int e = 0; e < E; e++) {
            next[e] = at;
            for (int p = at; p < at + count[e]; p += tile) { tiles[2 * nt] = e; tiles[2 * nt + 1] = p; nt++; }
            at += count[e];
            group_end[e] = at;
        }
        for (int p = at; p < at + n_shared; p += tile) { tiles[2 * nt] = E; tiles[2 * nt + 1] = p; nt++; } /* the shared expert */
        group_end[E] = at + n_shared;
        *n_tiles = nt;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < n_shared; t += blockDim.x) { /* after the routed pairs: slots + t, token t */
        pair_slot[slots + t] = slots + t;
        pair_tok[slots + t] = t;
    }
    for (int s = threadIdx.x; s < slots; s += blockDim.x) {
        const int p = atomicAdd(&next[idx[s]], 1);
        pair_slot[p] = s;
        pair_tok[p] = s / A;
    }
}

/* ======================================================================== */
/* 8. sampling (glm.c §10) on the last device: only the token id comes back   */

/* One block. Greedy: the first index of the largest logit. Otherwise softmax at the
 * temperature; with top_p < 1 the candidates (p >= (1-top_p)/(V-1), as glm.c) are
 * sorted (probability down, index up) by a bitonic sort, the nucleus is the shortest
 * prefix whose mass exceeds top_p, and u (drawn on the host from glm.c's generator)
 * picks from it. */
__global__ void __launch_bounds__(BLOCK) k_sample(const float *logits, int V, float temperature, float top_p, float u, float *prob, int *cand, int P, int *out) {
    float v = 0.0f;
    int best = -1;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (better(logits[i], i, v, best)) { v = logits[i]; best = i; }
    block_best(v, best);
    if (logits[0] != logits[0]) best = 0; /* glm.c argmax: nothing beats a NaN first logit (never -1) */
    if (temperature <= 0.0f) {
        if (threadIdx.x == 0) *out = best;
        return;
    }
    const float mx = v;
    float part = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) { float e = expf((logits[i] - mx) / temperature); prob[i] = e; part += e; }
    float sum = block_sum(part);
    for (int i = threadIdx.x; i < V; i += blockDim.x) prob[i] /= sum;
    __syncthreads();
    if (top_p < 1.0f) {
        const float cutoff = (1.0f - top_p) / (float)(V - 1);
        int m = 0;
        for (int i0 = 0; i0 < V; i0 += BLOCK) { /* ordered compaction */
            int i = i0 + threadIdx.x, keep = i < V && prob[i] >= cutoff, total;
            int at = block_exclusive_scan(keep, &total);
            if (keep) cand[m + at] = i;
            m += total;
        }
        int np2 = 1;
        while (np2 < m) np2 <<= 1;
        if (np2 > P) np2 = P;
        for (int i = m + threadIdx.x; i < np2; i += blockDim.x) cand[i] = -1;
        __syncthreads();
        for (int size = 2; size <= np2; size <<= 1)
            for (int stride = size / 2; stride > 0; stride >>= 1) {
                for (int i = threadIdx.x; i < np2; i += blockDim.x) {
                    int j = i ^ stride;
                    if (j > i) {
                        int a = cand[i], b = cand[j];
                        bool a_first = better(a >= 0 ? prob[a] : 0.0f, a, b >= 0 ? prob[b] : 0.0f, b);
                        bool up = (i & size) == 0; /* this run sorts best-first */
                        if (up ? !a_first : a_first) { cand[i] = b; cand[j] = a; }
                    }
                }
                __syncthreads();
            }
        if (threadIdx.x == 0) {
            float cum = 0.0f;
            int last = m - 1;
            for (int i = 0; i < m; i++) { cum += prob[cand[i]]; if (cum > top_p) { last = i; break; } }
            int n = last + 1;
            float s = cum < top_p ? cum : 0.0f;
            if (s == 0.0f) for (int i = 0; i < n; i++) s += prob[cand[i]];
            float r = u * s, cdf = 0.0f;
            int pick = n > 0 ? cand[n - 1] : V - 1; /* no candidate: NaN probabilities */
            for (int i = 0; i < n; i++) { cdf += prob[cand[i]]; if (r < cdf) { pick = cand[i]; break; } }
            *out = pick;
        }
    } else if (threadIdx.x == 0) {
        float cdf = 0.0f;
        int pick = V - 1;
        for (int i = 0; i < V; i++) { cdf += prob[i]; if (u < cdf) { pick = i; break; } }
        *out = pick;
    }
}

/* The fast sampler: the same pick as k_sample, bit for bit, without sorting the
 * vocabulary. Launches: k_sample_best (many blocks), then k_sample_softmax (one block);
 * greedy and top_p >= 1 end there; top_p < 1 adds k_sample_hist (many blocks) and
 * k_sample_nucleus (one block).
 *
 * Same floats as k_sample: the maximum is the same element whatever the reduction's
 * order (better() is a total order); the softmax sum is k_sample's own order (thread t
 * adds i = t, t+256, ... then block_sum), so every probability e_i / sum has the same
 * bits; the walks over the nucleus and over the vocabulary are the same sequential
 * sums over the same candidates in the same order. Only the way the candidates are
 * found and ordered differs: a histogram of their mass picks a threshold, only the
 * candidates above it are gathered and sorted, and if the exact walk does not reach
 * top_p among them the next lower bin follows (its candidates all rank below the ones
 * already sorted, so the sorted list just grows at its end). */
#define SAMPLE_BLOCKS 128      /* blocks of the sweeps over the vocabulary (<= BLOCK) */
#define SAMPLE_BINS 1024       /* a probability's bits >> 20, its exponent and 3 mantissa bits: p <= 1 is bin <= 1016 */
#define SAMPLE_SORT_CAP 2048   /* a group of candidates up to this size is sorted in shared memory */
#define SAMPLE_MASS_ONE 1073741824.0f /* 2^30: the histogram's mass in integers, so its sums do not depend on order */

/* The host's handles on the sampler's device buffers (one set per last device). */
struct SampleBufs {
    float *prob;          /* [V] k_sample: probabilities; fast: exp((l - max) / T), divided on use */
    int *cand, P;         /* k_sample's candidates, P = V rounded up to a power of two */
    float *best_v, *sum;  /* [SAMPLE_BLOCKS] per-block best logit; [1] the softmax sum */
    int *best_i;          /* [SAMPLE_BLOCKS] its index */
    unsigned *hist;       /* [2][SAMPLE_BINS] candidates and their mass per bin */
    unsigned long long *sorted; /* [2P] the nucleus so far, best first (room for a group's padding) */
    int *out;             /* the token */
};

__device__ __forceinline__ int prob_bin(float p) { return (int)(__float_as_uint(p) >> 20); }

/* A candidate as one integer whose descending order is k_sample's order: probability
 * down (a positive float's bits are ordered as its value), then index up. */
__device__ __forceinline__ unsigned long long cand_key(float p, int i) {
    return ((unsigned long long)__float_as_uint(p) << 32) | (0xffffffffu - (unsigned)i);
}
__device__ __forceinline__ float cand_prob(unsigned long long k) { return __uint_as_float((unsigned)(k >> 32)); }
__device__ __forceinline__ int cand_index(unsigned long long k) { return (int)(0xffffffffu - (unsigned)k); }

/* Sorts a[0..n) descending, n a power of two, by the whole block (a is shared or global). */
__device__ void bitonic_sort_desc(unsigned long long *a, int n) {
    __syncthreads();
    for (int size = 2; size <= n; size <<= 1)
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                int j = i ^ stride;
                if (j > i) {
                    unsigned long long x = a[i], y = a[j];
                    bool down = (i & size) == 0; /* this run sorts best-first */
                    if (down ? x < y : x > y) { a[i] = y; a[j] = x; }
                }
            }
            __syncthreads();
        }
}

/* Greedy's first half, and the softmax's maximum: each block's best (value, index)
 * over a grid-strided share of the logits, by better(). Row blockIdx.y of logits [rows][V]
 * (one row but for k_argmax_rows) into best_v, best_i [rows][gridDim.x]. */
__global__ void __launch_bounds__(BLOCK) k_sample_best(const float *logits, int V, float *best_v, int *best_i) {
    logits += (size_t)blockIdx.y * V;
    best_v += (size_t)blockIdx.y * gridDim.x;
    best_i += (size_t)blockIdx.y * gridDim.x;
    float v = 0.0f;
    int best = -1;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < V; i += gridDim.x * BLOCK)
        if (better(logits[i], i, v, best)) { v = logits[i]; best = i; }
    block_best(v, best);
    if (threadIdx.x == 0) { best_v[blockIdx.x] = v; best_i[blockIdx.x] = best; }
}

/* One block: the blocks' bests reduced (greedy ends here), then exp((l - max) / T) into
 * prob and their sum in k_sample's order. A sequential sum cannot be split, so this
 * pass is 256 threads whatever the grid; each keeps eight loads in flight. top_p >= 1:
 * thread 0 walks the vocabulary's CDF in index order, as k_sample. top_p < 1: the
 * histogram is cleared for k_sample_hist. */
__global__ void __launch_bounds__(BLOCK) k_sample_softmax(const float *logits, int V, float temperature, float top_p, float u, const float *best_v,
                                                         const int *best_i, int nb, float *prob, float *sum_out, unsigned *hist, int *out) {
    float v = 0.0f;
    int best = -1;
    if ((int)threadIdx.x < nb) { v = best_v[threadIdx.x]; best = best_i[threadIdx.x]; }
    block_best(v, best);
    if (logits[0] != logits[0]) best = 0; /* glm.c argmax: nothing beats a NaN first logit */
    if (temperature <= 0.0f) {
        if (threadIdx.x == 0) *out = best;
        return;
    }
    const float mx = v;
    float part = 0.0f;
    int i = threadIdx.x;
    for (; i + 7 * BLOCK < V; i += 8 * BLOCK) {
        float l[8];
        UNROLL for (int k = 0; k < 8; k++) l[k] = logits[i + k * BLOCK];
        UNROLL for (int k = 0; k < 8; k++) { float e = expf((l[k] - mx) / temperature); prob[i + k * BLOCK] = e; part += e; }
    }
    for (; i < V; i += BLOCK) { float e = expf((logits[i] - mx) / temperature); prob[i] = e; part += e; }
    const float sum = block_sum(part); /* its barriers also publish prob to thread 0 */
    if (top_p < 1.0f) {
        for (int b = threadIdx.x; b < 2 * SAMPLE_BINS; b += BLOCK) hist[b] = 0;
        if (threadIdx.x == 0) *sum_out = sum;
    } else if (threadIdx.x == 0) {
        float cdf = 0.0f;
        int pick = V - 1;
        for (int j = 0; j < V; j++) { cdf += prob[j] / sum; if (u < cdf) { pick = j; break; } }
        *out = pick;
    }
}

/* Greedy's second half for several rows (glm serve's decode batch), one block per row:
 * the row's nb blocks' bests reduced, as k_sample_softmax reduces them at temperature 0,
 * into out[row]. Only the token ids cross to the host, not rows x V logits. */
__global__ void __launch_bounds__(BLOCK) k_argmax_rows(const float *logits, int V, const float *best_v, const int *best_i, int nb, int *out) {
    const int row = blockIdx.x;
    float v = 0.0f;
    int best = -1;
    if ((int)threadIdx.x < nb) { v = best_v[row * nb + threadIdx.x]; best = best_i[row * nb + threadIdx.x]; }
    block_best(v, best);
    if (logits[(size_t)row * V] != logits[(size_t)row * V]) best = 0; /* glm.c argmax: nothing beats a NaN first logit */
    if (threadIdx.x == 0) out[row] = best;
}

/* Per bin of the probability's top bits, how many candidates (p >= (1-top_p)/(V-1), as
 * k_sample) and their mass in units of 2^-30, rounded down: integer sums, so the
 * histogram is the same whatever order the blocks run in. */
__global__ void __launch_bounds__(BLOCK) k_sample_hist(const float *prob, int V, const float *sum_p, float top_p, unsigned *hist) {
    __shared__ unsigned count[SAMPLE_BINS], mass[SAMPLE_BINS];
    for (int b = threadIdx.x; b < SAMPLE_BINS; b += BLOCK) { count[b] = 0; mass[b] = 0; }
    __syncthreads();
    const float sum = *sum_p, cutoff = (1.0f - top_p) / (float)(V - 1);
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < V; i += gridDim.x * BLOCK) {
        float p = prob[i] / sum;
        if (p >= cutoff) {
            atomicAdd(&count[prob_bin(p)], 1u);
            atomicAdd(&mass[prob_bin(p)], (unsigned)(p * SAMPLE_MASS_ONE));
        }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < SAMPLE_BINS; b += BLOCK)
        if (count[b]) { atomicAdd(&hist[b], count[b]); atomicAdd(&hist[SAMPLE_BINS + b], mass[b]); }
}

/* One block: the nucleus and the pick. The first group is every bin from the top down
 * to the one where the histogram's mass passes top_p; its candidates are gathered (in
 * any order: the sort's key is a total order), sorted and walked exactly as k_sample
 * walks its sorted list. Rounding can leave the walk at or below top_p where the
 * histogram said the mass was enough; then the next lower nonempty bin is gathered,
 * sorted and appended, until the walk passes top_p or the candidates run out.
 * start_higher (tests only) starts that many nonempty bins above the estimate, so the
 * widening runs. */
__global__ void __launch_bounds__(BLOCK) k_sample_nucleus(const float *prob, int V, const float *sum_p, float top_p, float u, const unsigned *hist,
                                                         int start_higher, unsigned long long *sorted, int *out) {
    __shared__ unsigned long long tile[SAMPLE_SORT_CAP];
    __shared__ int s_lo, s_hi, s_m, s_fill, s_n;
    __shared__ float s_cum;
    const float sum = *sum_p, cutoff = (1.0f - top_p) / (float)(V - 1);
    if (threadIdx.x == 0) {
        unsigned long long mass = 0;
        int lo = -1;
        for (int b = SAMPLE_BINS - 1; b >= 0; b--)
            if (hist[b]) {
                lo = b;
                mass += hist[SAMPLE_BINS + b];
                if ((double)mass > (double)top_p * SAMPLE_MASS_ONE) break;
            }
        for (int k = 0; k < start_higher && lo >= 0; k++) {
            int up = lo + 1;
            while (up < SAMPLE_BINS && !hist[up]) up++;
            if (up < SAMPLE_BINS) lo = up;
        }
        s_lo = lo; s_hi = SAMPLE_BINS - 1; s_n = -1; s_cum = 0.0f;
    }
    __syncthreads();
    int placed = 0; /* sorted[0..placed) is the head of k_sample's sorted candidate list */
    while (s_lo >= 0) {
        const int lo = s_lo, hi = s_hi;
        if (threadIdx.x == 0) {
            int m = 0;
            for (int b = lo; b <= hi; b++) m += (int)hist[b];
            s_m = m; s_fill = 0;
        }
        __syncthreads();
        const int m = s_m;
        int np2 = 1;
        while (np2 < m) np2 <<= 1;
        unsigned long long *buf = np2 <= SAMPLE_SORT_CAP ? tile : sorted + placed;
        for (int i = threadIdx.x; i < V; i += BLOCK) {
            float p = prob[i] / sum;
            if (p >= cutoff && prob_bin(p) >= lo && prob_bin(p) <= hi) buf[atomicAdd(&s_fill, 1)] = cand_key(p, i);
        }
        __syncthreads(); /* s_fill == m now: the histogram counted the same predicate */
        for (int i = m + threadIdx.x; i < np2; i += BLOCK) buf[i] = 0; /* padding sorts last */
        bitonic_sort_desc(buf, np2);
        if (buf == tile) {
            for (int i = threadIdx.x; i < m; i += BLOCK) sorted[placed + i] = tile[i];
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            float cum = s_cum;
            for (int j = 0; j < m; j++) {
                cum += cand_prob(sorted[placed + j]);
                if (cum > top_p) { s_n = placed + j + 1; break; }
            }
            s_cum = cum;
            int next = lo - 1;
            while (next >= 0 && !hist[next]) next--;
            s_hi = lo - 1;
            s_lo = s_n >= 0 ? -1 : next;
        }
        placed += m;
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        /* k_sample's n and mass: its recount of the mass adds the same terms in the same
         * order as the walk, so the mass is the walk's sum */
        const int n = s_n >= 0 ? s_n : placed;
        const float r = u * s_cum;
        float cdf = 0.0f;
        int pick = n > 0 ? cand_index(sorted[n - 1]) : V - 1;
        for (int j = 0; j < n; j++) { cdf += cand_prob(sorted[j]); if (r < cdf) { pick = cand_index(sorted[j]); break; } }
        *out = pick;
    }
}

/* Sampling on the device: k_sample under GLM_GPU_KERNELS=plain, else the fast kernels. */
static int g_sample_start_higher; /* tests only: see k_sample_nucleus */
static void sample_launch(const float *logits, int V, float temperature, float top_p, float u, const SampleBufs &S) {
    if (g_plain_kernels) {
        LAUNCHED(k_sample, dim3(1), dim3(BLOCK), 0, 0, logits, V, temperature, top_p, u, S.prob, S.cand, S.P, S.out);
        return;
    }
    LAUNCHED(k_sample_best, dim3(SAMPLE_BLOCKS), dim3(BLOCK), 0, 0, logits, V, S.best_v, S.best_i);
    LAUNCHED(k_sample_softmax, dim3(1), dim3(BLOCK), 0, 0, logits, V, temperature, top_p, u, (const float *)S.best_v, (const int *)S.best_i, SAMPLE_BLOCKS, S.prob,
             S.sum, S.hist, S.out);
    if (temperature > 0.0f && top_p < 1.0f) {
        LAUNCHED(k_sample_hist, dim3(SAMPLE_BLOCKS), dim3(BLOCK), 0, 0, (const float *)S.prob, V, (const float *)S.sum, top_p, S.hist);
        LAUNCHED(k_sample_nucleus, dim3(1), dim3(BLOCK), 0, 0, (const float *)S.prob, V, (const float *)S.sum, top_p, u, (const unsigned *)S.hist,
                 g_sample_start_higher, S.sorted, S.out);
    }
}

/* The greedy token of each of rows [n][V] into S.out[0..n): k_sample at temperature 0 row
 * by row under GLM_GPU_KERNELS=plain, else k_sample_best over all rows at once (a grid of
 * SAMPLE_BLOCKS x n) and k_argmax_rows. */
static void argmax_rows_launch(const float *logits, int V, int n, const SampleBufs &S) {
    if (g_plain_kernels) {
        for (int r = 0; r < n; r++)
            LAUNCHED(k_sample, dim3(1), dim3(BLOCK), 0, 0, logits + (size_t)r * V, V, 0.0f, 1.0f, 0.0f, S.prob, S.cand, S.P, S.out + r);
        return;
    }
    LAUNCHED(k_sample_best, dim3(SAMPLE_BLOCKS, n), dim3(BLOCK), 0, 0, logits, V, S.best_v, S.best_i);
    LAUNCHED(k_argmax_rows, dim3(n), dim3(BLOCK), 0, 0, logits, V, (const float *)S.best_v, (const int *)S.best_i, SAMPLE_BLOCKS, S.out);
}

/* ======================================================================== */
/* 9. host side: devices, the plan, the upload                              */

#define CHECK(call)                                                                            \
    do {                                                                                       \
        hipError_t e_ = (call);                                                                \
        if (e_ != hipSuccess) glm_fatal("GPU: %s failed: %s", #call, hipGetErrorString(e_)); \
    } while (0)

static void dfree(const void *p) { if (p) CHECK(hipFree((void *)p)); }


/* Per device: where the split products keep their partial sums (the device's scratch,
 * or for the kernel tests an allocation of their own), and its compute units. */
#define GF_COUNTS 1024 /* row ranges x z of one split product (it is split only below 2 blocks per CU) */
static struct { float *part; unsigned *count; size_t part_cap; int cus; } g_split[GPU_MAX_DEVICES]; /* cus: device_cus's cache */

/* A device's compute units (cached). */
static int device_cus(int dev) {
    if (!g_split[dev].cus) {
        hipDeviceProp_t p;
        CHECK(hipGetDeviceProperties(&p, dev));
        g_split[dev].cus = p.multiProcessorCount > 0 ? p.multiProcessorCount : 1;
    }
    return g_split[dev].cus;
}

/* Floats for the splits' partial sums on a device: a product is split only while its row
 * ranges give fewer than 2 blocks per CU, and then into about that many blocks, so
 * splits x rows stay near 2 x CUs x GF_BLOCK_ROWS per token (twice that here, for the
 * rounding); a product that would need more is not split. */
static size_t split_part_floats(int dev) { return (size_t)2 * (2 * device_cus(dev) + 1) * GF_BLOCK_ROWS * GEMV_MAXN; }

/* A bump allocator over one device allocation. With base == NULL it only counts,
 * which is how the plan learns each device's bytes before anything is allocated. */
struct Arena {
    char *base;
    size_t used, size;
};

static void *arena_take(Arena *A, size_t bytes) {
    size_t off = (A->used + 255) & ~(size_t)255;
    A->used = off + bytes;
    if (!A->base) return NULL;
    if (A->used > A->size) glm_fatal("GPU: arena overflow (%zu > %zu bytes)", A->used, A->size);
    return A->base + off;
}

struct GLayer {          /* a Layer whose matrices and vectors live on its device */
    int dev;
    float *input_norm, *post_norm, *q_a_norm, *kv_a_norm, *ix_knorm_w, *ix_knorm_b, *router_bias;
    DMat q_a, q_b, kv_a, kv_b, o, ix_wq_b, ix_wk, ix_weights, gate, up, down, router, sh_gate, sh_up, sh_down;
    DMat *ex_gate, *ex_up, *ex_down; /* device tables [E + 1]: the experts, then the shared expert's matrix */
    int ex_fmt[3];       /* gate, up, down: the format every expert shares, or -1 (k_gemv_experts_fast) */
    int mlp_ef, mlp_sf;  /* the decode MLP's fused kernels (glm.h gpu_mlp_fused): expert and shared/dense formats, or -1 */
    int has_indexer;
    float *latent;       /* [T][KR+DR] this layer's cache */
    float *index_k;      /* [T][ID] (full layers) */
};

struct GDev {            /* one device: its layer range, weights, cache and a RunState's worth of scratch */
    int id, l0, l1;
    Arena scratch;
    size_t wbytes, kv_bytes;
    void **allocs;       /* this device's allocations (one per layer, the embedding, lm_head, the MTP layer, scratch), freed by gpu_free */
    int n_allocs, cap_allocs;
    float *rope;         /* [T][DR] cos, sin pairs */
    float *x, *a, *cq, *q, *ckv, *q_abs, *o_lat, *o_heads, *out, *ix_scores, *att_scores, *ix_q, *ix_k, *ix_w;
    float *router, *route_scr, *ex_w, *h1, *h2, *eh1, *eh2, *ex_y, *logits;
    float *mla_part, *mla_ml; /* k_mla_attend_split's slices: [rows][NH][KR] sums, [rows][NH] (max, sum) */
    float *eh;           /* [cap][2H] the MTP layer's input (last device, with an MTP layer) */
    int *sel, *n_sel, *ex_idx, *tokens;
    int *grp_end, *grp_slot, *grp_tok, *grp_tiles, *grp_n; /* k_moe_group's: [E+1], [cap][A+1] x2, [2][tiles], [1] */
    SampleBufs samp;     /* the sampler's buffers (last device) */
    float *split_part;   /* [split_part_floats] the split products' partial sums (k_gemv_fast) */
    unsigned *split_count; /* [GF_COUNTS] their arrival counters, kept at 0 between launches */
    hipStream_t stream;  /* (with graphs) where this device's share of a step is captured and launched */
    int *pos_dev;        /* [GEMV_MAXN] (with graphs) each sequence's position in the step, which the captured kernels read */
};

struct GMtp {            /* the MTP layer (glm.h Mtp) on the last device, its cache rows in that device's KV arena */
    GLayer layer;
    DMat eh_proj;
    float *enorm, *hnorm, *head_norm;
};

#define GRAPH_KEY (4 + GEMV_MAXN * (3 + 2 * GPU_MAX_DEVICES)) /* rows, sequences, all_logits, hidden; per sequence: graph_key */
#define GRAPH_CACHE 4    /* captured steps kept: a decode step and --draft's verify step alternate */
struct GpuGraph {        /* one step's shapes, captured: a graph per device */
    hipGraphExec_t exec[GPU_MAX_DEVICES]; /* exec[0] NULL: unused */
    int key[GRAPH_KEY];  /* the launch shapes it holds (graph_key) */
    long kernels;        /* its kernels on all devices (the launch counter adds them at each replay) */
    unsigned long last_use;
};

/* One sequence's rows of a step (glm.c's Span): rows start..start+n-1 of the chunk, at
 * positions pos.., appended to and attending over cache slot `slot` (glm serve's
 * sequences each have their own rows in every layer's cache). */
struct GSpan {
    int start, n, pos, slot;
};

struct GpuModel {
    const Model *m;
    Config c;
    int n_dev, ctx, pos, cap;
    int slots;           /* cache slots (gpu_load_slots); the MTP layer's cache has one */
    int slot;            /* the slot of the one-sequence entry points (gpu_use_slot) */
    GDev dev[GPU_MAX_DEVICES];
    GLayer *layers;
    DMat embed, lm_head;
    float *final_norm;
    GMtp *mtp;           /* NULL: the checkpoint has no MTP layer */
    size_t upload_total, upload_done;
    double upload_t0;
    /* decode and verify steps as graphs, one per device (graph_step; GLM_GPU_GRAPH=0: off) */
    int graphs;
    GpuGraph graph[GRAPH_CACHE]; /* the captured steps, the least recently used replaced */
    unsigned long graph_clock;
};

static size_t mat_bytes(const Mat *W, size_t *scale_bytes) {
    size_t rc = (size_t)W->rows * W->cols;
    switch (W->fmt) {
    case WF_F32: *scale_bytes = 0; return rc * 4;
    case WF_BF16: *scale_bytes = 0; return rc * 2;
    case WF_FP8: *scale_bytes = (size_t)((W->rows + 127) / 128) * ((W->cols + 127) / 128) * sizeof(float); return rc;
    default: *scale_bytes = rc / 32; return rc / 2;
    }
}

static void upload(GpuModel *g, void *dst, const void *src, size_t n) {
    if (!dst || !n) return;
    CHECK(hipMemcpy(dst, src, n, hipMemcpyHostToDevice));
    g->upload_done += n;
    progress("gpu: uploading weights", g->upload_done, g->upload_total, g->upload_t0);
}

static DMat up_mat(GpuModel *g, Arena *A, const Mat *W) {
    DMat d;
    memset(&d, 0, sizeof d);
    if (!W->rows) return d;
    d.fmt = W->fmt; d.rows = W->rows; d.cols = W->cols;
    size_t sb, wb = mat_bytes(W, &sb);
    void *w = arena_take(A, wb);
    upload(g, w, W->w, wb);
    d.w = (const uint8_t *)w;
    if (W->fmt == WF_FP8) { void *s = arena_take(A, sb); upload(g, s, W->fp8_scale, sb); d.fp8_scale = (const float *)s; }
    if (W->fmt == WF_MXFP4) { void *s = arena_take(A, sb); upload(g, s, W->mx_scale, sb); d.mx_scale = (const uint8_t *)s; }
    return d;
}

static float *up_vec(GpuModel *g, Arena *A, const float *v, int n) {
    if (!v) return NULL;
    float *d = (float *)arena_take(A, (size_t)n * sizeof(float));
    upload(g, d, v, (size_t)n * sizeof(float));
    return d;
}

/* The format all E experts share if the fast expert kernel can read it, else -1. */
static int experts_fmt(const Mat *ex, int E) {
    for (int e = 1; e < E; e++)
        if (ex[e].fmt != ex[0].fmt) return -1;
    return E > 0 && gpu_chunks_ok(ex[0].fmt, ex[0].cols) ? ex[0].fmt : -1;
}

/* The device table of a layer's E experts' matrices, and after them `shared` (the shared
 * expert's matrix, already on the device: the grouped prefill runs it as expert E). */
static DMat *up_experts(GpuModel *g, Arena *A, const Mat *ex, int E, const DMat &shared) {
    DMat *host = (DMat *)calloc((size_t)E + 1, sizeof(DMat));
    if (!host) glm_fatal("out of memory");
    for (int e = 0; e < E; e++) host[e] = up_mat(g, A, &ex[e]);
    host[E] = shared;
    DMat *d = (DMat *)arena_take(A, ((size_t)E + 1) * sizeof(DMat));
    if (d) CHECK(hipMemcpy(d, host, ((size_t)E + 1) * sizeof(DMat), hipMemcpyHostToDevice));
    free(host);
    return d;
}

/* Places (or, with a counting arena, measures) one layer's weights. */
static void up_layer(GpuModel *g, Arena *A, GLayer *G, const Layer *L, int dense) {
    const Config *c = &g->c;
    G->input_norm = up_vec(g, A, L->input_norm, c->hidden);
    G->post_norm = up_vec(g, A, L->post_norm, c->hidden);
    G->q_a = up_mat(g, A, &L->q_a);
    G->q_a_norm = up_vec(g, A, L->q_a_norm, c->q_lora_rank);
    G->q_b = up_mat(g, A, &L->q_b);
    G->kv_a = up_mat(g, A, &L->kv_a);
    G->kv_a_norm = up_vec(g, A, L->kv_a_norm, c->kv_lora_rank);
    G->kv_b = up_mat(g, A, &L->kv_b);
    G->o = up_mat(g, A, &L->o);
    G->has_indexer = L->has_indexer;
    if (L->has_indexer) {
        G->ix_wq_b = up_mat(g, A, &L->ix_wq_b);
        G->ix_wk = up_mat(g, A, &L->ix_wk);
        G->ix_knorm_w = up_vec(g, A, L->ix_knorm_w, c->index_head_dim);
        G->ix_knorm_b = up_vec(g, A, L->ix_knorm_b, c->index_head_dim);
        G->ix_weights = up_mat(g, A, &L->ix_weights);
    }
    if (!gpu_mlp_fused(c, L, &G->mlp_ef, &G->mlp_sf)) G->mlp_ef = G->mlp_sf = -1;
    if (dense) {
        G->gate = up_mat(g, A, &L->gate);
        G->up = up_mat(g, A, &L->up);
        G->down = up_mat(g, A, &L->down);
    } else {
        G->router = up_mat(g, A, &L->router);
        G->router_bias = up_vec(g, A, L->router_bias, c->n_experts);
        if (c->n_shared) {
            G->sh_gate = up_mat(g, A, &L->sh_gate);
            G->sh_up = up_mat(g, A, &L->sh_up);
            G->sh_down = up_mat(g, A, &L->sh_down);
        }
        G->ex_fmt[0] = experts_fmt(L->ex_gate, c->n_experts);
        G->ex_fmt[1] = experts_fmt(L->ex_up, c->n_experts);
        G->ex_fmt[2] = experts_fmt(L->ex_down, c->n_experts);
        G->ex_gate = up_experts(g, A, L->ex_gate, c->n_experts, G->sh_gate);
        G->ex_up = up_experts(g, A, L->ex_up, c->n_experts, G->sh_up);
        G->ex_down = up_experts(g, A, L->ex_down, c->n_experts, G->sh_down);
    }
}

/* Places (or measures) the MTP layer: its decoder layer (MoE, with its own indexer) and
 * the input and head pieces around it. */
static void up_mtp(GpuModel *g, Arena *A, GMtp *G, const Mtp *P) {
    const int H = g->c.hidden;
    up_layer(g, A, &G->layer, &P->layer, P->layer.dense);
    G->eh_proj = up_mat(g, A, &P->eh_proj);
    G->enorm = up_vec(g, A, P->enorm, H);
    G->hnorm = up_vec(g, A, P->hnorm, H);
    G->head_norm = up_vec(g, A, P->head_norm, H);
}

static int imax(int a, int b) { return a > b ? a : b; }
static int imin(int a, int b) { return a < b ? a : b; }

/* Slices per token for k_mla_attend_split (*slice_len keys each, whole tiles): enough
 * workgroups for 2 per compute unit over the n tokens, no slice shorter than a tile, at
 * most MLA_MAX_SLICES. kmax bounds a token's selection (what the host knows: pos0 + n
 * and index_topk). One slice: no combine. A step of up to GEMV_MAXN tokens (a --draft
 * verify step) splits each token's keys as a one-token step does, so that its rows are
 * its decode steps' bit for bit (the combine adds the same slices in the same order). */
static int mla_slice_target(int cus, int n, int kmax) { /* the count returned never exceeds it */
    if (n <= GEMV_MAXN) n = 1;
    const int tiles = imax((kmax + MLA_KEYS - 1) / MLA_KEYS, 1), want = (2 * cus + n - 1) / n;
    const int S = want < tiles ? want : tiles;
    return S > MLA_MAX_SLICES ? MLA_MAX_SLICES : imax(S, 1);
}

static int mla_slices(int cus, int n, int kmax, int *slice_len) {
    const int tiles = imax((kmax + MLA_KEYS - 1) / MLA_KEYS, 1), per = (tiles + mla_slice_target(cus, n, kmax) - 1) / mla_slice_target(cus, n, kmax);
    *slice_len = per * MLA_KEYS;
    return (tiles + per - 1) / per;
}

/* The shapes the fast attention and indexer kernels hold (GLM-5.2's fit); others run the plain ones. */
static int mla_fast(const Config *c) { return c->n_heads <= MLA_HEADS && c->kv_lora_rank <= 32 * MLA_COLS; }
static int ix_fast(const Config *c) { return c->index_n_heads <= IX_HEADS && c->index_head_dim <= IX_DIM; }
/* The indexer's scoring kernel for vmax visible keys: the tiled one (fast kernels and
 * shapes it fits) or the plain one, and its blocks along the keys. */
static int ix_tiled(const Config *c) { return !g_plain_kernels && ix_fast(c); }
static unsigned ix_key_blocks(const Config *c, int vmax) { return ix_tiled(c) ? (vmax + IX_KEYS - 1) / IX_KEYS : (vmax + BLOCK - 1) / BLOCK; }

/* The most tiles k_moe_group can list for a chunk of n tokens: every expert's pairs (the
 * shared expert's n too) in tiles of BN (k_gemm_grouped's mma_tile<true>), the last one of
 * each partly full. */
static int grouped_tiles(const Config *c, int n) { return (n * (c->n_active + 1) + MmaCfg<true>::BN - 1) / MmaCfg<true>::BN + c->n_experts + 1; }

/* Scratch of one device for chunks of up to g->cap tokens (glm.c runstate_init). */
static void take_scratch(GpuModel *g, GDev *D, int last) {
    const Config *c = &g->c;
    Arena *A = &D->scratch;
    size_t B = (size_t)g->cap, T = (size_t)g->ctx, F = (size_t)sizeof(float);
    int ffn = imax(imax(c->dense_inter, c->n_shared * c->moe_inter), c->moe_inter);
    int QD = c->qk_nope + c->qk_rope, AD = c->kv_lora_rank + c->qk_rope, K = c->index_topk;
    D->rope = (float *)arena_take(A, T * c->qk_rope * F);
    D->x = (float *)arena_take(A, B * c->hidden * F);
    D->a = (float *)arena_take(A, B * c->hidden * F);
    D->out = (float *)arena_take(A, B * c->hidden * F);
    D->cq = (float *)arena_take(A, B * c->q_lora_rank * F);
    D->q = (float *)arena_take(A, B * c->n_heads * QD * F);
    D->ckv = (float *)arena_take(A, B * AD * F);
    D->q_abs = (float *)arena_take(A, B * c->n_heads * AD * F);
    D->o_lat = (float *)arena_take(A, B * c->n_heads * c->kv_lora_rank * F);
    D->o_heads = (float *)arena_take(A, B * c->n_heads * c->v_head * F);
    D->ix_scores = (float *)arena_take(A, B * T * F);
    D->att_scores = (float *)arena_take(A, B * c->n_heads * K * F);
    size_t slice_rows = 0; /* the most (token, slice) pairs of a chunk, for any selection up to K */
    for (int n = 1; n <= g->cap; n++) {
        int S = mla_slice_target(device_cus(D->id), n, K);
        if (S > 1 && (size_t)n * S > slice_rows) slice_rows = (size_t)n * S;
    }
    D->mla_part = (float *)arena_take(A, slice_rows * c->n_heads * c->kv_lora_rank * F);
    D->mla_ml = (float *)arena_take(A, slice_rows * c->n_heads * 2 * F);
    D->ix_q = (float *)arena_take(A, B * c->index_n_heads * c->index_head_dim * F);
    D->ix_k = (float *)arena_take(A, B * c->index_head_dim * F);
    D->ix_w = (float *)arena_take(A, B * c->index_n_heads * F);
    D->sel = (int *)arena_take(A, B * K * sizeof(int));
    D->n_sel = (int *)arena_take(A, B * sizeof(int));
    D->router = (float *)arena_take(A, B * c->n_experts * F);
    D->route_scr = (float *)arena_take(A, B * (2 * c->n_experts + c->n_group) * F);
    D->ex_idx = (int *)arena_take(A, B * c->n_active * sizeof(int));
    D->ex_w = (float *)arena_take(A, B * c->n_active * F);
    D->h1 = (float *)arena_take(A, B * ffn * F);
    D->h2 = (float *)arena_take(A, B * ffn * F);
    D->eh1 = (float *)arena_take(A, B * (c->n_active + 1) * c->moe_inter * F); /* + the shared expert's row (k_mlp_gate_up) */
    D->eh2 = (float *)arena_take(A, B * (c->n_active + 1) * c->moe_inter * F);
    D->ex_y = (float *)arena_take(A, B * (c->n_active + 1) * c->hidden * F); /* + the shared expert's rows (k_gemm_grouped) */
    D->grp_end = (int *)arena_take(A, (size_t)(c->n_experts + 1) * sizeof(int));
    D->grp_slot = (int *)arena_take(A, B * (c->n_active + 1) * sizeof(int));
    D->grp_tok = (int *)arena_take(A, B * (c->n_active + 1) * sizeof(int));
    D->grp_tiles = (int *)arena_take(A, 2 * grouped_tiles(c, (int)B) * sizeof(int));
    D->grp_n = (int *)arena_take(A, sizeof(int));
    D->tokens = (int *)arena_take(A, B * sizeof(int));
    D->split_part = (float *)arena_take(A, split_part_floats(D->id) * F);
    D->split_count = (unsigned *)arena_take(A, GF_COUNTS * sizeof(unsigned));
    if (last) {
        int P = 1;
        while (P < c->vocab_size) P <<= 1;
        D->logits = (float *)arena_take(A, B * c->vocab_size * F);
        SampleBufs *S = &D->samp;
        S->P = P;
        S->prob = (float *)arena_take(A, (size_t)c->vocab_size * F);
        S->cand = (int *)arena_take(A, (size_t)P * sizeof(int));
        S->best_v = (float *)arena_take(A, B * SAMPLE_BLOCKS * F); /* [B][SAMPLE_BLOCKS]: gpu_argmax_rows */
        S->best_i = (int *)arena_take(A, B * SAMPLE_BLOCKS * sizeof(int));
        S->sum = (float *)arena_take(A, F);
        S->hist = (unsigned *)arena_take(A, 2 * SAMPLE_BINS * sizeof(unsigned));
        S->sorted = (unsigned long long *)arena_take(A, 2 * (size_t)P * sizeof(unsigned long long));
        S->out = (int *)arena_take(A, B * sizeof(int));
        if (g->m->mtp) D->eh = (float *)arena_take(A, B * 2 * c->hidden * F);
    }
}

static size_t layer_kv_bytes(const Config *c, int full, int T) {
    return (size_t)T * ((size_t)(c->kv_lora_rank + c->qk_rope) + (full ? (size_t)c->index_head_dim : 0)) * sizeof(float);
}

/* The split: contiguous layer ranges with about equal bytes per device (weights + KV),
 * counting the embedding on device 0 and lm_head on the last. Every device gets at
 * least one layer. */
static void plan_split(GpuModel *g, const size_t *layer_bytes, size_t head_bytes, size_t tail_bytes) {
    const int L = g->c.n_layers, N = g->n_dev;
    double total = (double)head_bytes + (double)tail_bytes, before = (double)head_bytes;
    for (int l = 0; l < L; l++) total += (double)layer_bytes[l];
    int prev = 0;
    for (int l = 0; l < L; l++) {
        int d = (int)((before + layer_bytes[l] / 2.0) * N / total);
        if (d > prev + 1) d = prev + 1;
        if (d < prev) d = prev;
        if (d < N - (L - l)) d = N - (L - l);
        if (d > N - 1) d = N - 1;
        g->layers[l].dev = d;
        prev = d;
        before += (double)layer_bytes[l];
    }
    for (int d = 0; d < N; d++) { g->dev[d].l0 = L; g->dev[d].l1 = 0; }
    for (int l = 0; l < L; l++) {
        GDev *D = &g->dev[g->layers[l].dev];
        if (l < D->l0) D->l0 = l;
        D->l1 = l + 1;
    }
}

static void rope_table(const Config *c, int T, float *out) { /* out: [T][qk_rope], glm.c's angles per position */
    for (int p = 0; p < T; p++) rope_angles(out + (size_t)p * c->qk_rope, c->qk_rope, p, c->rope_theta);
}

/* One device allocation of `bytes` for `what` (a layer, the embedding, ...), kept on D's list.
 * A failure is one error line naming the device, the piece and the bytes. */
static Arena dev_alloc(GDev *D, size_t bytes, const char *what) {
    Arena A = {NULL, 0, bytes};
    if (D->n_allocs == D->cap_allocs) {
        int cap = D->cap_allocs ? 2 * D->cap_allocs : 16;
        void **p = (void **)realloc(D->allocs, (size_t)cap * sizeof(void *));
        if (!p) glm_fatal("out of memory");
        D->allocs = p;
        D->cap_allocs = cap;
    }
    void *base = NULL;
    hipError_t e = hipMalloc(&base, bytes ? bytes : 1);
    if (e != hipSuccess || !base) {
        (void)hipGetLastError(); /* clear the sticky error */
        glm_fatal("GPU %d: cannot allocate %zu bytes (%.3f GB) for %s: %s", D->id, bytes, bytes / 1e9, what,
                  e != hipSuccess ? hipGetErrorString(e) : "no memory returned");
    }
    D->allocs[D->n_allocs++] = base;
    A.base = (char *)base;
    return A;
}

/* Places (or, with a counting arena, measures) one decoder layer's weights and its KV cache rows:
 * a layer lives in one allocation. */
static void up_layer_kv(GpuModel *g, Arena *A, GLayer *G, const Layer *L, int dense) {
    const Config *c = &g->c;
    const size_t rows = (size_t)g->ctx * g->slots; /* slot s: rows s*ctx .. */
    up_layer(g, A, G, L, dense);
    G->latent = (float *)arena_take(A, rows * (c->kv_lora_rank + c->qk_rope) * sizeof(float));
    G->index_k = G->has_indexer ? (float *)arena_take(A, rows * c->index_head_dim * sizeof(float)) : NULL;
}

/* Slot s's cache rows of layer L (glm serve's sequence s; the MTP layer has slot 0 only). */
static float *slot_latent(const GpuModel *g, const GLayer *L, int s) {
    return L->latent + (size_t)s * g->ctx * (g->c.kv_lora_rank + g->c.qk_rope);
}
static float *slot_index_k(const GpuModel *g, const GLayer *L, int s) {
    return L->index_k ? L->index_k + (size_t)s * g->ctx * g->c.index_head_dim : NULL;
}

static void zero_kv(GpuModel *g, const GLayer *G, int slots) {
    const Config *c = &g->c;
    const size_t rows = (size_t)g->ctx * slots;
    CHECK(hipMemset(G->latent, 0, rows * (c->kv_lora_rank + c->qk_rope) * sizeof(float)));
    if (G->index_k) CHECK(hipMemset(G->index_k, 0, rows * c->index_head_dim * sizeof(float)));
}

/* The scratch a device takes for chunks of g->cap tokens (a counting pass of take_scratch). */
static size_t scratch_bytes(GpuModel *g, GDev *D) {
    D->scratch.base = NULL;
    D->scratch.used = 0;
    take_scratch(g, D, D->id == g->n_dev - 1);
    return D->scratch.used;
}

/* What device d can take: its free memory (to *free_b) less some room for the runtime's
 * own allocations (code objects, launch queues). */
static size_t device_room(int d, size_t *free_b) {
    size_t total_b = 0;
    CHECK(hipSetDevice(d));
    CHECK(hipMemGetInfo(free_b, &total_b));
    size_t margin = total_b / 64 < ((size_t)512 << 20) ? total_b / 64 : ((size_t)512 << 20);
    return *free_b > margin ? *free_b - margin : 0;
}

/* Tokens per prefill chunk: GLM_GPU_CHUNK if set; otherwise GPU_MAX_CHUNK (or the context),
 * halved while some device cannot hold its weights, cache and the scratch of such a chunk
 * (activations, indexer and attention scores, the experts' rows all grow with it), down
 * to 64. Large chunks let each expert's weights serve many tokens. */
#define GPU_MAX_CHUNK 2048
static int prefill_chunk(GpuModel *g) {
    const char *e = getenv("GLM_GPU_CHUNK");
    if (e && *e) {
        char *end;
        long v = strtol(e, &end, 10);
        if (*end || v < 1 || v > GPU_MAX_CHUNK) glm_fatal("GLM_GPU_CHUNK=%s: expected 1..%d tokens", e, GPU_MAX_CHUNK);
        return v < g->ctx ? (int)v : g->ctx;
    }
    int cap = g->ctx < GPU_MAX_CHUNK ? g->ctx : GPU_MAX_CHUNK;
    for (;; cap /= 2) {
        g->cap = cap;
        int fits = 1;
        for (int d = 0; d < g->n_dev; d++) {
            size_t free_b;
            fits &= g->dev[d].wbytes + g->dev[d].kv_bytes + scratch_bytes(g, &g->dev[d]) <= device_room(d, &free_b);
        }
        if (fits || cap <= 64) return cap;
    }
}

/* GLM_GPU_KERNELS: "fast" (the default) or "plain" */
static void choose_kernels(void) {
    const char *k = getenv("GLM_GPU_KERNELS");
    if (!k || !*k || !strcmp(k, "fast")) g_plain_kernels = 0;
    else if (!strcmp(k, "plain")) g_plain_kernels = 1;
    else glm_fatal("GLM_GPU_KERNELS=%s: expected fast or plain", k);
}

/* GLM_GPU_GRAPH: "1" (the default) or "0" */
static int choose_graphs(void) {
    const char *e = getenv("GLM_GPU_GRAPH");
    if (!e || !*e || !strcmp(e, "1")) return 1;
    if (!strcmp(e, "0")) return 0;
    glm_fatal("GLM_GPU_GRAPH=%s: expected 1 or 0", e);
}

extern "C" GpuModel *gpu_load_slots(const Model *m, int n_gpus, int ctx, int slots) {
    choose_kernels();
    const int graphs = choose_graphs();
    int count = 0;
    hipError_t e = hipGetDeviceCount(&count);
    if (e != hipSuccess || count == 0) glm_fatal("--gpu: no GPU found (%s)", e != hipSuccess ? hipGetErrorString(e) : "0 devices");
    if (n_gpus < 1 || n_gpus > count || n_gpus > GPU_MAX_DEVICES)
        glm_fatal("--gpus %d: %d GPU(s) visible (at most %d supported)", n_gpus, count, GPU_MAX_DEVICES);
    if (n_gpus > m->cfg.n_layers) glm_fatal("--gpus %d: the model has only %d layers to split", n_gpus, m->cfg.n_layers);
    GpuModel *g = (GpuModel *)calloc(1, sizeof(GpuModel));
    if (!g) glm_fatal("out of memory");
    g->m = m;
    g->c = m->cfg;
    g->n_dev = n_gpus;
    g->ctx = ctx;
    if (slots < 1 || (size_t)ctx * slots > INT_MAX) glm_fatal("gpu_load_slots: %d cache slots of %d tokens", slots, ctx);
    g->slots = slots;
    g->cap = ctx < 64 ? ctx : 64; /* chosen below, once the devices' shares are known */
    const Config *c = &g->c;
    g->layers = (GLayer *)calloc((size_t)c->n_layers, sizeof(GLayer));
    if (!g->layers) glm_fatal("out of memory");

    /* measure: every piece through a counting arena (a layer: its weights and its KV cache rows) */
    size_t *lb = (size_t *)calloc((size_t)c->n_layers, sizeof(size_t));
    if (!lb) glm_fatal("out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        Arena A = {NULL, 0, 0};
        GLayer tmp;
        memset(&tmp, 0, sizeof tmp);
        up_layer_kv(g, &A, &tmp, &m->layers[l], c->dense[l]);
        lb[l] = A.used;
    }
    Arena H = {NULL, 0, 0}, Tl = {NULL, 0, 0};
    up_mat(g, &H, &m->embed);
    up_mat(g, &Tl, &m->lm_head);
    up_vec(g, &Tl, m->final_norm, c->hidden);
    Arena M = {NULL, 0, 0}; /* the MTP layer, if any: on the last device with lm_head, which it uses; its cache rows in its allocation */
    size_t mtp_kv = 0;
    if (m->mtp) {
        GMtp tmp;
        memset(&tmp, 0, sizeof tmp);
        up_mtp(g, &M, &tmp, m->mtp);
        mtp_kv = layer_kv_bytes(c, m->mtp->layer.has_indexer, ctx);
        arena_take(&M, (size_t)ctx * (c->kv_lora_rank + c->qk_rope) * sizeof(float));
        if (tmp.layer.has_indexer) arena_take(&M, (size_t)ctx * c->index_head_dim * sizeof(float));
    }
    plan_split(g, lb, H.used, Tl.used + M.used);

    /* each device's weights and KV cache rows */
    for (int d = 0; d < n_gpus; d++) {
        GDev *D = &g->dev[d];
        D->id = d;
        size_t wbytes = d == 0 ? H.used : 0, kv = 0;
        if (d == n_gpus - 1) wbytes += Tl.used;
        if (d == n_gpus - 1 && m->mtp) { wbytes += M.used - mtp_kv; kv += mtp_kv; }
        for (int l = D->l0; l < D->l1; l++) {
            wbytes += lb[l] - layer_kv_bytes(c, c->full_index[l], ctx * slots);
            kv += layer_kv_bytes(c, c->full_index[l], ctx * slots);
        }
        D->wbytes = wbytes;
        D->kv_bytes = kv;
    }
    g->cap = prefill_chunk(g);

    /* the plan: bytes per device, checked against what each device has free */
    fprintf(stderr, "glm: gpu plan: %d layers on %d device(s), context %d tokens, prefill in chunks of %d\n", c->n_layers, n_gpus, ctx, g->cap);
    int fits = 1;
    for (int d = 0; d < n_gpus; d++) {
        GDev *D = &g->dev[d];
        const size_t wbytes = D->wbytes, kv = D->kv_bytes;
        D->scratch.size = scratch_bytes(g, D);
        size_t need = wbytes + kv + D->scratch.size, free_b = 0;
        hipDeviceProp_t prop;
        CHECK(hipGetDeviceProperties(&prop, d));
        int ok = need <= device_room(d, &free_b);
        fits &= ok;
        fprintf(stderr, "  device %d (%s): layers %d-%d%s%s%s: weights %.3f GB + KV cache %.3f GB + scratch %.3f GB = %.3f GB of %.3f GB free%s\n",
                d, prop.name, D->l0, D->l1 - 1, d == 0 ? " + embedding" : "", d == n_gpus - 1 ? " + lm_head" : "",
                d == n_gpus - 1 && m->mtp ? " + MTP layer" : "", wbytes / 1e9, kv / 1e9,
                D->scratch.size / 1e9, need / 1e9, free_b / 1e9, ok ? "" : "  <-- does not fit");
    }
    if (!fits)
        glm_fatal("--gpus %d: the model does not fit in GPU memory (see the plan above); use more GPUs (--gpus N) or a smaller --ctx", n_gpus);

    /* allocate and upload: one allocation per layer (its weights and cache rows), the embedding,
     * lm_head with the final norm, the MTP layer with its cache rows, and the scratch, so that no
     * single allocation has to find one free range for a whole device's share */
    g->upload_total = m->weight_bytes + (m->mtp ? m->mtp->bytes : 0);
    g->upload_t0 = now_s();
    float *rt = (float *)malloc((size_t)ctx * c->qk_rope * sizeof(float));
    if (!rt) glm_fatal("out of memory");
    rope_table(c, ctx, rt);
    for (int d = 0; d < n_gpus; d++) {
        GDev *D = &g->dev[d];
        CHECK(hipSetDevice(d));
        if (d == 0) {
            Arena A = dev_alloc(D, H.used, "embedding");
            g->embed = up_mat(g, &A, &m->embed);
        }
        for (int l = D->l0; l < D->l1; l++) {
            char what[32];
            snprintf(what, sizeof what, "layer %d", l);
            Arena A = dev_alloc(D, lb[l], what);
            GLayer *G = &g->layers[l];
            up_layer_kv(g, &A, G, &m->layers[l], c->dense[l]);
            zero_kv(g, G, g->slots);
        }
        if (d == n_gpus - 1) {
            Arena A = dev_alloc(D, Tl.used, "lm_head");
            g->lm_head = up_mat(g, &A, &m->lm_head);
            g->final_norm = up_vec(g, &A, m->final_norm, c->hidden);
            if (m->mtp) { /* its own cache rows (glm.c: latent row n_layers, indexer slot n_index_layers) */
                g->mtp = (GMtp *)calloc(1, sizeof(GMtp));
                if (!g->mtp) glm_fatal("out of memory");
                GLayer *G = &g->mtp->layer;
                Arena MA = dev_alloc(D, M.used, "MTP layer");
                up_mtp(g, &MA, g->mtp, m->mtp);
                G->dev = d;
                G->latent = (float *)arena_take(&MA, (size_t)ctx * (c->kv_lora_rank + c->qk_rope) * sizeof(float));
                G->index_k = G->has_indexer ? (float *)arena_take(&MA, (size_t)ctx * c->index_head_dim * sizeof(float)) : NULL;
                zero_kv(g, G, 1);
            }
        }
        D->scratch = dev_alloc(D, D->scratch.size, "scratch");
        take_scratch(g, D, d == n_gpus - 1);
        CHECK(hipMemset(D->split_count, 0, GF_COUNTS * sizeof(unsigned)));
        g_split[d].part = D->split_part;
        g_split[d].count = D->split_count;
        g_split[d].part_cap = split_part_floats(d);
        CHECK(hipMemcpy(D->rope, rt, (size_t)ctx * c->qk_rope * sizeof(float), hipMemcpyHostToDevice));
    }
    free(rt);
    free(lb);
    g->upload_done = g->upload_total;
    progress("gpu: uploading weights", g->upload_done, g->upload_total, g->upload_t0);
    g->graphs = graphs;
    for (int d = 0; g->graphs && d < n_gpus; d++) {
        CHECK(hipSetDevice(d)); /* a stream belongs to the device current when it is made */
        CHECK(hipStreamCreate(&g->dev[d].stream));
        CHECK(hipMalloc((void **)&g->dev[d].pos_dev, GEMV_MAXN * sizeof(int)));
    }
    CHECK(hipSetDevice(0));
    return g;
}

extern "C" GpuModel *gpu_load(const Model *m, int n_gpus, int ctx) { return gpu_load_slots(m, n_gpus, ctx, 1); }

extern "C" void gpu_use_slot(GpuModel *g, int s) {
    if (s < 0 || s >= g->slots) glm_fatal("gpu_use_slot: slot %d of %d", s, g->slots);
    g->slot = s;
}

extern "C" long gpu_launch_count(void) { return g_launches; }

extern "C" void gpu_free(GpuModel *g) {
    if (getenv("GLM_GPU_LAUNCHES")) {
        fprintf(stderr, "glm: gpu: %ld kernel launches\n", g_launches);
        fprintf(stderr, "glm: gpu: %ld steps as graphs, %ld captures\n", g_graph_launches, g_graph_captures);
    }
    if (!g) return;
    for (int d = 0; g->graphs && d < g->n_dev; d++) {
        CHECK(hipSetDevice(d));
        for (int i = 0; i < GRAPH_CACHE; i++)
            if (g->graph[i].exec[d]) CHECK(hipGraphExecDestroy(g->graph[i].exec[d]));
        CHECK(hipStreamDestroy(g->dev[d].stream));
        CHECK(hipFree(g->dev[d].pos_dev));
    }
    for (int d = 0; d < g->n_dev; d++) {
        GDev *D = &g->dev[d];
        CHECK(hipSetDevice(d));
        g_split[d].part = NULL; /* it lived in the scratch */
        g_split[d].count = NULL;
        for (int i = 0; i < D->n_allocs; i++) dfree(D->allocs[i]);
        free(D->allocs);
    }
    free(g->layers);
    free(g->mtp); /* its memory is one of the last device's allocations */
    free(g);
}

/* ======================================================================== */
/* 10. the forward pass, in glm.c's order                                    */

static unsigned blocks_for(size_t n) { size_t b = (n + BLOCK - 1) / BLOCK; return (unsigned)(b < 4096 ? (b ? b : 1) : 4096); }

/* A split product fills the GPU: enough splits of k that row ranges x splits give every
 * compute unit two blocks, each split at least GF_MIN_SPLIT_CHUNKS chunks (a step for
 * every lane); 1 where the rows alone are enough or the scratch is too small. */
static int g_split_min_chunks = GF_MIN_SPLIT_CHUNKS; /* the kernel tests lower it to split small shapes */
static int gemv_splits(int dev, int row_blocks, int nz, int n, int nr, int chunks) {
    const int blocks = row_blocks * nz;
    int ks = (2 * device_cus(dev) + blocks - 1) / blocks, most = chunks / g_split_min_chunks;
    if (ks > most) ks = most;
    if (ks > GF_MAX_SPLIT) ks = GF_MAX_SPLIT;
    if (ks < 2 || !g_split[dev].part || (size_t)nz * ks * n * nr > g_split[dev].part_cap || (size_t)blocks > GF_COUNTS) return 1;
    return ks;
}

template <int FMT>
static void gemv_fast(float *y, int ldy, const float *x, int ldx, const DMat &W, int r0, int nr, int n, int nz, int zr, int zx, int zy) {
    int dev;
    CHECK(hipGetDevice(&dev));
    const int rb = (nr + GF_BLOCK_ROWS - 1) / GF_BLOCK_ROWS, ks = gemv_splits(dev, rb, nz, n, nr, W.cols / GfFormat<FMT>::CE);
    /* (a variable: the template's comma would split the macro's arguments) */
    void (*k)(DMat, const float *, int, float *, int, int, int, int, int, int, int, float *, unsigned *) =
        n == 1 ? k_gemv_fast<FMT, 1> : k_gemv_fast<FMT, GEMV_MAXN>;
    LAUNCHED(k, dim3(rb, ks, nz), dim3(BLOCK), 0, 0, W, x, ldx, y, ldy, r0, nr, n, zr, zx, zy, g_split[dev].part, g_split[dev].count);
}

/* matmul_rows: n tokens, nz independent products offset by zr rows / zx, zy floats. */
static void matmul_rows(float *y, int ldy, const float *x, int ldx, const DMat &W, int r0, int nr, int n, int nz = 1, int zr = 0, int zx = 0, int zy = 0) {
    if (!g_plain_kernels && n <= GEMV_MAXN && gpu_chunks_ok(W.fmt, W.cols)) {
        if (W.fmt == WF_BF16) gemv_fast<WF_BF16>(y, ldy, x, ldx, W, r0, nr, n, nz, zr, zx, zy);
        else if (W.fmt == WF_FP8) gemv_fast<WF_FP8>(y, ldy, x, ldx, W, r0, nr, n, nz, zr, zx, zy);
        else gemv_fast<WF_MXFP4>(y, ldy, x, ldx, W, r0, nr, n, nz, zr, zx, zy);
    } else if (n == 1)
        LAUNCHED(k_gemv1, dim3((nr + GEMV_ROWS - 1) / GEMV_ROWS, 1, nz), dim3(BLOCK), 0, 0, W, x, ldx, y, ldy, r0, nr, zr, zx, zy);
    else if (n <= GEMV_MAXN)
        LAUNCHED(k_gemvn, dim3((nr + GEMV_ROWS - 1) / GEMV_ROWS, 1, nz), dim3(BLOCK), 0, 0, W, x, ldx, y, ldy, r0, nr, n, zr, zx, zy);
    else if (!g_plain_kernels) gemm_mma(y, ldy, x, ldx, W, r0, nr, n, nz, zr, zx, zy);
    else
        LAUNCHED(k_gemm, dim3((nr + TM - 1) / TM, (n + TN - 1) / TN, nz), dim3(BLOCK), 0, 0, W, x, ldx, y, ldy, r0, nr, n, zr, zx, zy);
}

static void matmul(float *y, const float *x, const DMat &W, int n) { matmul_rows(y, W.rows, x, W.cols, W, 0, W.rows, n); }

static void rmsnorm(float *y, const float *x, const float *w, int dim, int n, float eps) {
    LAUNCHED(k_rmsnorm, dim3(n), dim3(BLOCK), 0, 0, y, dim, x, dim, w, dim, eps);
}

/* indexer_select: queries of the chunk's B rows, then for each sequence (span) its keys
 * into its cache slot, its scores over that slot's keys and its top-k into sel. */
/* The indexer's scores of span i's tokens that see more than index_topk keys (its slot's
 * keys, appended already). */
static void ix_scores_span(GpuModel *g, GDev *D, const GLayer *L, const GSpan *sp, int i) {
    const Config *c = &g->c;
    const int IH = c->index_n_heads, ID = c->index_head_dim, K = c->index_topk;
    const int t0 = sp->start, n = sp->n, pos0 = sp->pos, vmax = pos0 + n;
    const float *q = D->ix_q + (size_t)t0 * IH * ID, *w = D->ix_w + (size_t)t0 * IH, *keys = slot_index_k(g, L, sp->slot);
    float *scores = D->ix_scores + (size_t)t0 * g->ctx;
    if (vmax > K && ix_tiled(c))
        LAUNCHED(k_ix_scores_tiled, dim3(ix_key_blocks(c, vmax), (n + IX_TOKENS - 1) / IX_TOKENS), dim3(BLOCK), 0, 0, scores, g->ctx, q, w, keys, IH, ID, K,
                 pos0, n, span_pos_dev(i));
    else if (vmax > K)
        LAUNCHED(k_ix_scores, dim3(ix_key_blocks(c, vmax), n), dim3(BLOCK), 0, 0, scores, g->ctx, q, w, keys, IH, ID, K, pos0, span_pos_dev(i));
}

/* Whether the step is glm serve's decode batch: several sequences, one row each (row i
 * sequence i), whose per-token kernels then run once for all rows (the *_rows kernels). */
static bool one_row_each(const GSpan *sp, int n_sp) {
    bool one = n_sp > 1;
    for (int i = 0; i < n_sp; i++) one = one && sp[i].n == 1 && sp[i].start == i;
    return one;
}

static void indexer_select(GpuModel *g, GDev *D, const GLayer *L, int B, const GSpan *sp, int n_sp) {
    const Config *c = &g->c;
    const int IH = c->index_n_heads, ID = c->index_head_dim, K = c->index_topk;
    matmul(D->ix_q, D->cq, L->ix_wq_b, B);
    matmul(D->ix_k, D->a, L->ix_wk, B);
    matmul(D->ix_w, D->a, L->ix_weights, B);
    if (one_row_each(sp, n_sp)) { /* the RoPE and key of all rows, each sequence's scores, the top-k of all rows */
        GRows rows;
        for (int i = 0; i < n_sp; i++) { rows.cache[i] = slot_index_k(g, L, sp[i].slot); rows.pos[i] = sp[i].pos; }
        LAUNCHED(k_ix_rope_key_rows, dim3(n_sp), dim3(BLOCK), 0, 0, D->ix_q, IH * ID, IH, rows, (const float *)D->ix_k, (const float *)L->ix_knorm_w,
                 (const float *)L->ix_knorm_b, ID, c->qk_rope, (const float *)D->rope, g_pos_dev);
        for (int i = 0; i < n_sp; i++)
            ix_scores_span(g, D, L, &sp[i], i);
        LAUNCHED(k_topk_rows, dim3(n_sp), dim3(BLOCK), 0, 0, (const float *)D->ix_scores, g->ctx, K, rows, D->sel, D->n_sel, g_pos_dev);
        return;
    }
    for (int i = 0; i < n_sp; i++) {
        const int t0 = sp[i].start, n = sp[i].n, pos0 = sp[i].pos;
        float *q = D->ix_q + (size_t)t0 * IH * ID, *scores = D->ix_scores + (size_t)t0 * g->ctx, *keys = slot_index_k(g, L, sp[i].slot);
        LAUNCHED(k_rope, dim3(n), dim3(BLOCK), 0, 0, q, IH * ID, IH, ID, 0, c->qk_rope, pos0, (const float *)D->rope, span_pos_dev(i));
        LAUNCHED(k_ix_key, dim3(n), dim3(BLOCK), 0, 0, keys, (const float *)D->ix_k + (size_t)t0 * ID, (const float *)L->ix_knorm_w,
                 (const float *)L->ix_knorm_b, ID, c->qk_rope, pos0, (const float *)D->rope, span_pos_dev(i));
        ix_scores_span(g, D, L, &sp[i], i);
        LAUNCHED(k_topk, dim3(n), dim3(BLOCK), 0, 0, (const float *)scores, g->ctx, K, pos0, D->sel + (size_t)t0 * K, D->n_sel + t0, span_pos_dev(i));
    }
}

/* q_abs for n tokens: the wide GEMV, or the plain kernel (one block per head and 256 columns). */
static void q_absorb(const Config *c, float *q_abs, const float *q, const DMat &kv_b, int n) {
    const int NH = c->n_heads, DN = c->qk_nope, DR = c->qk_rope, DV = c->v_head, KR = c->kv_lora_rank;
    if (g_plain_kernels)
        LAUNCHED(k_q_absorb, dim3(NH, (KR + BLOCK - 1) / BLOCK), dim3(BLOCK), 0, 0, q_abs, q, kv_b, n, NH, DN, DR, DV, KR);
    else if (n == 1)
        LAUNCHED(k_q_absorb_wide<1>, dim3(NH, (KR + ABS_COLS - 1) / ABS_COLS), dim3(BLOCK), 0, 0, q_abs, q, kv_b, n, NH, DN, DR, DV, KR);
    else
        LAUNCHED(k_q_absorb_wide<ABS_NT>, dim3(NH, (KR + ABS_COLS - 1) / ABS_COLS), dim3(BLOCK), 0, 0, q_abs, q, kv_b, n, NH, DN, DR, DV, KR);
}

/* o_lat of n tokens over their selections (sel, n_sel on the device; kmax bounds n_sel):
 * the split kernel over slices (chosen here, or `slices` when > 0, for the tests) and
 * the combine when there are several; or the plain kernel, one block per (head, token). */
static void attend_selected(const Config *c, int cus, float *o_lat, float *part_o, float *part_ml, float *att_scores, const float *q_abs, const float *latent,
                            const int *sel, const int *n_sel, int n, int kmax, int slices) {
    const int NH = c->n_heads, DR = c->qk_rope, KR = c->kv_lora_rank, K = c->index_topk;
    const float scale = 1.0f / sqrtf((float)(c->qk_nope + DR)); /* 1/sqrt(qk_head_dim) (pitfall 7) */
    if (g_plain_kernels || !mla_fast(c)) {
        LAUNCHED(k_mla_attend, dim3(NH, n), dim3(BLOCK), 0, 0, o_lat, att_scores, q_abs, latent, sel, n_sel, NH, KR, DR, K, scale);
        return;
    }
    int len, S = mla_slices(cus, n, kmax, &len);
    if (slices > 0) { /* the tests' choice: at most slices (<= MLA_MAX_SLICES), whole tiles */
        const int tiles = imax((kmax + MLA_KEYS - 1) / MLA_KEYS, 1), per = (tiles + imin(slices, MLA_MAX_SLICES) - 1) / imin(slices, MLA_MAX_SLICES);
        len = per * MLA_KEYS;
        S = (tiles + per - 1) / per;
    }
    LAUNCHED(k_mla_attend_split, dim3(S, n), dim3(BLOCK), 0, 0, o_lat, part_o, part_ml, q_abs, latent, sel, n_sel, NH, KR, DR, K, scale, S, len);
    if (S > 1) LAUNCHED(k_mla_combine, dim3(NH, n), dim3(BLOCK), 0, 0, o_lat, (const float *)part_o, (const float *)part_ml, n_sel, NH, KR, S, len);
}

/* The absorbed attention of the chunk's B rows: q_abs for all, each sequence (span) over
 * its selection of its own cache slot's rows, the un-absorb for all. */
static void mla_attend_absorbed(GpuModel *g, GDev *D, const GLayer *L, int B, const GSpan *sp, int n_sp) {
    const Config *c = &g->c;
    const int NH = c->n_heads, DN = c->qk_nope, DR = c->qk_rope, DV = c->v_head, KR = c->kv_lora_rank, K = c->index_topk;
    q_absorb(c, D->q_abs, D->q, L->kv_b, B);
    for (int i = 0; i < n_sp; i++) { /* (the slices' scratch is reused: the stream runs the spans in turn) */
        const size_t t0 = (size_t)sp[i].start;
        const int kmax = sp[i].pos + sp[i].n < K ? sp[i].pos + sp[i].n : K;
        attend_selected(c, device_cus(D->id), D->o_lat + t0 * NH * KR, D->mla_part, D->mla_ml, D->att_scores + t0 * NH * K, D->q_abs + t0 * NH * (KR + DR),
                        slot_latent(g, L, sp[i].slot), D->sel + t0 * K, D->n_sel + t0, sp[i].n, kmax, 0);
    }
    /* un-absorb: o_heads[t][h] = W_UV[h] · o_lat[t][h], all heads in one launch */
    matmul_rows(D->o_heads, NH * DV, D->o_lat, NH * KR, L->kv_b, DN, DV, B, NH, DN + DV, KR, DV);
}

/* The attention block (glm.c attention) of the chunk's B rows, which belong to the
 * sequences sp[0..n_sp): the projections for all rows at once (each weight read once),
 * then each sequence's RoPE, cache rows, indexer and attention over its own slot. */
static void attention(GpuModel *g, GDev *D, const GLayer *L, int B, const GSpan *sp, int n_sp) {
    const Config *c = &g->c;
    const int NH = c->n_heads, DN = c->qk_nope, DR = c->qk_rope, QR = c->q_lora_rank, AD = c->kv_lora_rank + DR;
    matmul(D->cq, D->a, L->q_a, B);
    rmsnorm(D->cq, D->cq, L->q_a_norm, QR, B, 1e-6f); /* eps 1e-6 for the q/kv latent norms (pitfall 4) */
    matmul(D->q, D->cq, L->q_b, B);
    matmul(D->ckv, D->a, L->kv_a, B);
    /* q_pe's RoPE and the token's cache row [RMSNorm(c), RoPE(k_pe)] in one launch: for
     * all rows when each sequence has one (glm serve's decode step), else per sequence */
    if (one_row_each(sp, n_sp)) {
        GRows rows;
        for (int i = 0; i < n_sp; i++) { rows.cache[i] = slot_latent(g, L, sp[i].slot); rows.pos[i] = sp[i].pos; }
        LAUNCHED(k_rope_q_kv_append_rows, dim3(n_sp), dim3(BLOCK), 0, 0, D->q, NH * (DN + DR), NH, DN + DR, DN, rows, (const float *)D->ckv,
                 (const float *)L->kv_a_norm, c->kv_lora_rank, DR, (const float *)D->rope, g_pos_dev);
    } else {
        for (int i = 0; i < n_sp; i++)
            LAUNCHED(k_rope_q_kv_append, dim3(sp[i].n), dim3(BLOCK), 0, 0, D->q + (size_t)sp[i].start * NH * (DN + DR), NH * (DN + DR), NH, DN + DR,
                     DN, slot_latent(g, L, sp[i].slot), (const float *)D->ckv + (size_t)sp[i].start * AD, (const float *)L->kv_a_norm,
                     c->kv_lora_rank, DR, sp[i].pos, (const float *)D->rope, span_pos_dev(i));
    }
    if (L->has_indexer) indexer_select(g, D, L, B, sp, n_sp);
    /* a shared layer keeps D->sel from the last full layer (IndexShare, §3.6) */
    mla_attend_absorbed(g, D, L, B, sp, n_sp);
    matmul(D->out, D->o_heads, L->o, B);
}

/* A decode step's MLP for n tokens: k_mlp_gate_up, then the down projections (one token:
 * k_mlp_down; several: k_mlp_down_grouped where there are routed experts, else
 * k_mlp_shared_down). A routed experts per token from the tables (idx, w: k_moe_route's)
 * and S - A (0 or 1) shared / dense MLP (sg, su, sd) of FI rows; y [n][H]; slot_y
 * [n * (A + 1)][H] scratch (several tokens). ef, sf: the formats (glm.h gpu_mlp_fused). */
static void mlp_decode(int ef, int sf, const DMat *gate_t, const DMat *up_t, const DMat *down_t, const DMat &sg, const DMat &su, const DMat &sd,
                       const int *idx, const float *w, int A, int S, const float *x, int ldx, float *h1, float *h2, int FI, float *y, int H, int n,
                       float *slot_y) {
    typedef void GateUp(const DMat *, const DMat *, DMat, DMat, const int *, int, int, const float *, int, float *, float *, int, int);
    typedef void SharedDown(DMat, int, int, const float *, const float *, int, float *, int, int);
    typedef void Down(const DMat *, DMat, const int *, const float *, int, int, const float *, const float *, int, float *, int);
    typedef void DownGrouped(const DMat *, DMat, const int *, const float *, int, int, const float *, const float *, int, float *, float *, int, int,
                             unsigned *);
    GateUp *ku = NULL;
    SharedDown *ks = NULL;
    Down *kd = NULL;
    DownGrouped *kg = NULL;
#define MLP_FORMATS(E, F)                                                                                             \
    if (ef == E && sf == F) {                                                                                          \
        ku = n == 1 ? k_mlp_gate_up<E, F, 1> : k_mlp_gate_up<E, F, GEMV_MAXN>;                                         \
        ks = k_mlp_shared_down<F, GEMV_MAXN>;                                                                          \
        kd = k_mlp_down<E, F>;                                                                                         \
        kg = k_mlp_down_grouped<E, F, GEMV_MAXN>;                                                                      \
    }
    MLP_FORMATS(WF_BF16, WF_BF16) MLP_FORMATS(WF_FP8, WF_FP8) MLP_FORMATS(WF_MXFP4, WF_MXFP4) MLP_FORMATS(WF_FP8, WF_BF16) MLP_FORMATS(WF_MXFP4, WF_BF16)
#undef MLP_FORMATS
    if (!ku) glm_fatal("GPU: no fused MLP for formats %d/%d", ef, sf);
    if (n > GEMV_MAXN) glm_fatal("mlp_decode: %d tokens (1..%d)", n, GEMV_MAXN);
    const unsigned row_blocks = (unsigned)((H + GF_BLOCK_ROWS - 1) / GF_BLOCK_ROWS);
    if (A > 0 && n > 1 && row_blocks > GF_COUNTS) glm_fatal("mlp_decode: %d rows, more than %d row ranges", H, GF_COUNTS * GF_BLOCK_ROWS);
    LAUNCHED(ku, dim3((FI + GF_BLOCK_ROWS - 1) / GF_BLOCK_ROWS, n * A * 2 + (S > A ? 2 : 0)), dim3(BLOCK), 0, 0, gate_t, up_t, sg, su, idx, A, S, x,
             ldx, h1, h2, FI, n);
    if (n == 1)
        LAUNCHED(kd, dim3(row_blocks), dim3(BLOCK), 0, 0, down_t, sd, idx, w, A, S, (const float *)h1, (const float *)h2, FI, y, H);
    else if (A > 0) {
        int dev;
        CHECK(hipGetDevice(&dev));
        LAUNCHED(kg, dim3(row_blocks, n * A + (S > A ? 1 : 0)), dim3(BLOCK), 0, 0, down_t, sd, idx, w, A, S, (const float *)h1, (const float *)h2, FI,
                 slot_y, y, H, n, g_split[dev].count);
    } else
        LAUNCHED(ks, dim3(row_blocks), dim3(BLOCK), 0, 0, sd, A, S, (const float *)h1, (const float *)h2, FI, y, H, n);
}

/* The fused decode MLP (mlp_decode) applies to this layer and step (decode, fast kernels). */
static bool mlp_fused_now(const GLayer *L, int n) { return !g_plain_kernels && n <= GEMV_MAXN && L->mlp_ef >= 0; }

static void swiglu(GDev *D, float *y, const float *x, const DMat &gate, const DMat &up, const DMat &down, int n) {
    matmul(D->h1, x, gate, n);
    matmul(D->h2, x, up, n);
    size_t m = (size_t)n * gate.rows;
    LAUNCHED(k_silu_mul, dim3(blocks_for(m)), dim3(BLOCK), 0, 0, D->h1, (const float *)D->h2, m);
    matmul(y, D->h1, down, n);
}

/* One routed-expert product for every (token, slot): y[slot] = W[idx[slot]] · x[slot / x_div]
 * (nr rows each); fmt: the layer's experts' shared format, or -1 (the plain kernel). */
static void experts(const DMat *table, int fmt, const int *idx, const float *x, int ldx, int x_div, float *y, int ldy, int nr, unsigned slots) {
    void (*k)(const DMat *, const int *, const float *, int, int, float *, int, int) = k_gemv_experts;
    unsigned rows_per_block = GEMV_ROWS;
    if (!g_plain_kernels && fmt >= 0) {
        k = fmt == WF_BF16 ? k_gemv_experts_fast<WF_BF16> : fmt == WF_FP8 ? k_gemv_experts_fast<WF_FP8> : k_gemv_experts_fast<WF_MXFP4>;
        rows_per_block = GF_BLOCK_ROWS;
    }
    LAUNCHED(k, dim3((nr + rows_per_block - 1) / rows_per_block, slots), dim3(BLOCK), 0, 0, table, idx, x, ldx, x_div, y, ldy, nr);
}

static void moe(GpuModel *g, GDev *D, const GLayer *L, const float *x, float *y, int n) {
    const Config *c = &g->c;
    const int H = c->hidden, A = c->n_active, FI = c->moe_inter;
    matmul(D->router, x, L->router, n);
    LAUNCHED(k_moe_route, dim3(n), dim3(BLOCK), 0, 0, (const float *)D->router, (const float *)L->router_bias, D->route_scr, D->ex_idx, D->ex_w, c->n_experts, A,
           c->n_group, c->topk_group, c->norm_topk_prob, c->routed_scale);
    if (mlp_fused_now(L, n)) {
        mlp_decode(L->mlp_ef, L->mlp_sf, L->ex_gate, L->ex_up, L->ex_down, L->sh_gate, L->sh_up, L->sh_down, D->ex_idx, D->ex_w, A,
                   A + (c->n_shared ? 1 : 0), x, H, D->eh1, D->eh2, FI, y, H, n, D->ex_y);
        return;
    }
    const unsigned slots = (unsigned)(n * A);
    if (n > GEMV_MAXN && !g_plain_kernels && c->n_shared <= 1) {
        /* prefill: each expert once, over all its tokens, the shared one (unscaled, pitfall 8)
         * as expert E over every token; gate and up in one launch */
        const int ns = c->n_shared ? n : 0, BN = MmaCfg<true>::BN, BM = MmaCfg<true>::BM, E = c->n_experts; /* the shared expert: entry E of the tables */
        const unsigned tiles = (unsigned)grouped_tiles(c, n), rows = slots + (unsigned)ns;
        LAUNCHED(k_moe_group, dim3(1), dim3(BLOCK), 0, 0, (const int *)D->ex_idx, (int)slots, A, E, ns, BN, D->grp_end, D->grp_slot, D->grp_tok, D->grp_tiles,
                 D->grp_n);
        const int *T = D->grp_tiles, *nt = D->grp_n, *end = D->grp_end, *ps = D->grp_slot, *pt = D->grp_tok;
        LAUNCHED(k_gemm_grouped, dim3((FI + BM - 1) / BM, tiles, 2), dim3(BLOCK), 0, 0, (const DMat *)L->ex_gate, (const DMat *)L->ex_up, T, nt, end, pt, ps, x,
                 H, D->eh1, D->eh2, FI, FI);
        LAUNCHED(k_silu_mul, dim3(blocks_for((size_t)rows * FI)), dim3(BLOCK), 0, 0, D->eh1, (const float *)D->eh2, (size_t)rows * FI);
        LAUNCHED(k_gemm_grouped, dim3((H + BM - 1) / BM, tiles, 1), dim3(BLOCK), 0, 0, (const DMat *)L->ex_down, (const DMat *)NULL, T, nt, end, ps, ps,
                 (const float *)D->eh1, FI, D->ex_y, (float *)NULL, H, H);
        if (!ns) CHECK(hipMemsetAsync(y, 0, (size_t)n * H * sizeof(float), g_stream)); /* no shared expert: the sum starts at 0 */
        LAUNCHED(k_moe_combine, dim3(n), dim3(BLOCK), 0, 0, y, (const float *)D->ex_y, (const float *)D->ex_w, A, H,
                 ns ? (const float *)D->ex_y + (size_t)slots * H : (const float *)NULL);
        return;
    }
    if (c->n_shared) swiglu(D, y, x, L->sh_gate, L->sh_up, L->sh_down, n); /* unscaled (pitfall 8) */
    else CHECK(hipMemsetAsync(y, 0, (size_t)n * H * sizeof(float), g_stream));
    /* decode (or the plain kernels): one product per (token, slot) */
    experts(L->ex_gate, L->ex_fmt[0], D->ex_idx, x, H, A, D->eh1, FI, FI, slots);
    experts(L->ex_up, L->ex_fmt[1], D->ex_idx, x, H, A, D->eh2, FI, FI, slots);
    LAUNCHED(k_silu_mul, dim3(blocks_for((size_t)slots * FI)), dim3(BLOCK), 0, 0, D->eh1, (const float *)D->eh2, (size_t)slots * FI);
    experts(L->ex_down, L->ex_fmt[2], D->ex_idx, D->eh1, FI, 1, D->ex_y, H, H, slots);
    LAUNCHED(k_moe_combine, dim3(n), dim3(BLOCK), 0, 0, y, (const float *)D->ex_y, (const float *)D->ex_w, A, H, (const float *)NULL);
}

/* The residual stream and the current selection move to the device of the next layer.
 * Both devices are synchronized first: the source's results must be complete, and the
 * destination may still run (or have queued) the previous chunk's kernels that read its
 * x / sel / n_sel. ROCm's hipMemcpyPeer does not wait for the destination's work
 * (CUDA's cudaMemcpyPeer does), so without the second sync the copy could overwrite
 * them under those kernels. */
static void hand_over(GpuModel *g, GDev *from, GDev *to, int B) {
    const Config *c = &g->c;
    CHECK(hipSetDevice(to->id));
    CHECK(hipDeviceSynchronize());
    CHECK(hipSetDevice(from->id));
    CHECK(hipDeviceSynchronize());
    CHECK(hipMemcpyPeer(to->x, to->id, from->x, from->id, (size_t)B * c->hidden * sizeof(float)));
    CHECK(hipMemcpyPeer(to->sel, to->id, from->sel, from->id, (size_t)B * c->index_topk * sizeof(int)));
    CHECK(hipMemcpyPeer(to->n_sel, to->id, from->n_sel, from->id, (size_t)B * sizeof(int)));
    CHECK(hipSetDevice(to->id));
}

/* The residual add of a layer's MLP output (D->out) into D->x, where no next layer's
 * norm takes it over (before a hand-over to another device, or the head). */
static void residual_add(GpuModel *g, GDev *D, int B) {
    const size_t nh = (size_t)B * g->c.hidden;
    LAUNCHED(k_add, dim3(blocks_for(nh)), dim3(BLOCK), 0, 0, D->x, (const float *)D->out, nh);
}

/* One decoder layer L on the chunk's B rows, the sequences sp[0..n_sp) (glm.c layer_forward):
 * pre-norm attention and pre-norm MLP (dense) or MoE, each added to D->x. The MTP
 * layer (g->mtp->layer, its own cache rows) runs through the same code. To save a
 * launch per layer, the MLP's output is left in D->out: the next layer adds it as it
 * norms its input (pending = 1), else the caller does (residual_add). */
static void layer_forward(GpuModel *g, GDev *D, const GLayer *L, int dense, int B, const GSpan *sp, int n_sp, int pending) {
    const Config *c = &g->c;
    const int H = c->hidden;
    if (pending) LAUNCHED(k_add_rmsnorm, dim3(B), dim3(BLOCK), 0, 0, D->x, (const float *)D->out, D->a, (const float *)L->input_norm, H, c->rms_eps);
    else rmsnorm(D->a, D->x, L->input_norm, H, B, c->rms_eps);
    attention(g, D, L, B, sp, n_sp);
    /* the residual add and the MLP's norm in one launch */
    LAUNCHED(k_add_rmsnorm, dim3(B), dim3(BLOCK), 0, 0, D->x, (const float *)D->out, D->a, (const float *)L->post_norm, H, c->rms_eps);
    if (dense && mlp_fused_now(L, B))
        mlp_decode(L->mlp_ef, L->mlp_sf, NULL, NULL, NULL, L->gate, L->up, L->down, NULL, NULL, 0, 1, D->a, H, D->h1, D->h2, c->dense_inter, D->out, H, B,
                   NULL);
    else if (dense) swiglu(D, D->out, D->a, L->gate, L->up, L->down, B);
    else moe(g, D, L, D->a, D->out, B);
}

/* The output head of a chunk on the last device D (glm.c head(); the MTP layer's with
 * its shared_head.norm): rows start..start+B-1 of n are D->x; RMSNorm(x; norm) ->
 * hidden (host, if wanted) and -> lm_head -> logits of every row (all_logits) or of the
 * n-th only (into D->logits, and to `logits` unless it is NULL). head_rows launches,
 * head_copy copies out (after a graph, the copies follow its launch). */
static void head_rows(GpuModel *g, GDev *D, const float *norm, int start, int B, int n, int all_logits, int hidden) {
    const Config *c = &g->c;
    const int H = c->hidden;
    if (all_logits || hidden) rmsnorm(D->a, D->x, norm, H, B, c->rms_eps);
    if (all_logits) matmul(D->logits, D->a, g->lm_head, B);
    else if (start + B == n && hidden) matmul(D->logits, D->a + (size_t)(B - 1) * H, g->lm_head, 1); /* its row is normed already */
    else if (start + B == n) { /* the last token only */
        rmsnorm(D->a, D->x + (size_t)(B - 1) * H, norm, H, 1, c->rms_eps);
        matmul(D->logits, D->a, g->lm_head, 1);
    }
}

static void head_copy(GpuModel *g, GDev *D, int start, int B, int n, float *logits, int all_logits, float *hidden) {
    const int H = g->c.hidden, V = g->c.vocab_size;
    if (hidden) CHECK(hipMemcpy(hidden + (size_t)start * H, D->a, (size_t)B * H * sizeof(float), hipMemcpyDeviceToHost));
    if (all_logits && logits) CHECK(hipMemcpy(logits + (size_t)start * V, D->logits, (size_t)B * V * sizeof(float), hipMemcpyDeviceToHost));
    else if (start + B == n && logits) CHECK(hipMemcpy(logits, D->logits, (size_t)V * sizeof(float), hipMemcpyDeviceToHost));
}

static void head(GpuModel *g, GDev *D, const float *norm, int start, int B, int n, float *logits, int all_logits, float *hidden) {
    head_rows(g, D, norm, start, B, n, all_logits, hidden != NULL);
    head_copy(g, D, start, B, n, logits, all_logits, hidden);
}

/* Runs tokens[0..n) at positions pos.. and appends them to the cache. Writes
 * logits [n][V] if all_logits, else only the last token's [V] (to `logits` unless it
 * is NULL; they also stay on the device for gpu_sample); hidden [n][H] (if not NULL):
 * each token's final-normed hidden state, the MTP layer's h_t (glm.c forward_hidden). */
/* Device D's share of a step of B tokens (the sequences sp[0..n_sp)): the embedding
 * (device 0, from its D->tokens), its layers l0..l1-1, and the last one's residual add.
 * Only launches: a graph captures exactly this. */
static void device_layers(GpuModel *g, GDev *D, int B, const GSpan *sp, int n_sp) {
    const Config *c = &g->c;
    if (D->id == 0) LAUNCHED(k_embed, dim3(B), dim3(BLOCK), 0, 0, g->embed, (const int *)D->tokens, D->x);
    for (int l = D->l0; l < D->l1; l++) /* from the second layer on, the previous MLP's output is still to add */
        layer_forward(g, D, &g->layers[l], c->dense[l], B, sp, n_sp, l > D->l0);
    residual_add(g, D, B);
}

/* The B tokens in device 0's D->tokens (the sequences sp[0..n_sp)) through every layer,
 * device after device; returns the last device, whose x holds the last layer's output. */
static GDev *run_layers(GpuModel *g, int B, const GSpan *sp, int n_sp) {
    for (int d = 0; d < g->n_dev; d++) {
        if (d > 0) hand_over(g, &g->dev[d - 1], &g->dev[d], B);
        device_layers(g, &g->dev[d], B, sp, n_sp);
    }
    return &g->dev[g->n_dev - 1];
}

/* What a step launches that depends on its sequences (sp[0..n_sp), B rows) beyond what
 * the kernels read from device memory: the row count, the products' and MLP's kernels,
 * what the head copies out, and per sequence its row count and cache slot (the cache rows'
 * addresses), the indexer's scoring grid (none before the context passes index_topk) and
 * each device's attention slice count and length (from its compute units). A captured
 * step replays while these stay the same; the positions the kernels read from pos_dev. */
static void graph_key(GpuModel *g, const GSpan *sp, int n_sp, int B, int all_logits, int hidden, int key[GRAPH_KEY]) {
    const Config *c = &g->c;
    const int K = c->index_topk;
    memset(key, 0, GRAPH_KEY * sizeof(int));
    key[0] = B;
    key[1] = n_sp;
    key[2] = all_logits;
    key[3] = hidden;
    for (int i = 0; i < n_sp; i++) {
        int *k = key + 4 + i * (3 + 2 * GPU_MAX_DEVICES);
        const int vmax = sp[i].pos + sp[i].n;
        k[0] = sp[i].n;
        k[1] = sp[i].slot;
        k[2] = vmax > K ? (int)ix_key_blocks(c, vmax) : 0;
        for (int d = 0; d < g->n_dev && mla_fast(c); d++) k[3 + 2 * d] = mla_slices(device_cus(d), sp[i].n, vmax < K ? vmax : K, &k[4 + 2 * d]);
    }
}

/* A decode step, --draft's verify step (up to GEMV_MAXN tokens of one sequence) or glm
 * serve's decode step of several sequences (one token each), with the fast kernels, as
 * one graph launch per device instead of ~18 launches per layer. Each device's share
 * (device_layers; the last one's also head_rows) is captured once on its own stream, the
 * kernels that take a position reading their sequence's from that device's pos_dev, and
 * replayed with the new tokens and positions while graph_key stays the same: a new slice
 * of keys every few dozen positions captures it again. Between devices the residual
 * stream is handed over as run_layers does (hand_over: both devices synchronized, then
 * the peer copies); the head's copies to the host follow the last graph. */
static void graph_step(GpuModel *g, const GSpan *sp, int n_sp, const int *tokens, int B, float *logits, int all_logits, float *hidden) {
    int key[GRAPH_KEY], pos[GEMV_MAXN];
    graph_key(g, sp, n_sp, B, all_logits, hidden != NULL, key);
    for (int i = 0; i < n_sp; i++) pos[i] = sp[i].pos;
    GpuGraph *G = NULL, *oldest = &g->graph[0];
    for (int i = 0; i < GRAPH_CACHE; i++) {
        if (g->graph[i].exec[0] && !memcmp(key, g->graph[i].key, sizeof key)) G = &g->graph[i];
        if (g->graph[i].last_use < oldest->last_use) oldest = &g->graph[i];
    }
    if (!G) {
        G = oldest;
        const long before = g_launches;
        for (int d = 0; d < g->n_dev; d++) {
            GDev *D = &g->dev[d];
            CHECK(hipSetDevice(d));
            if (G->exec[d]) CHECK(hipGraphExecDestroy(G->exec[d]));
            hipGraph_t graph;
            CHECK(hipStreamBeginCapture(D->stream, hipStreamCaptureModeThreadLocal));
            g_stream = D->stream;
            g_pos_dev = D->pos_dev;
            device_layers(g, D, B, sp, n_sp);
            if (d == g->n_dev - 1) head_rows(g, D, g->final_norm, 0, B, B, all_logits, hidden != NULL);
            g_stream = 0;
            g_pos_dev = NULL;
            CHECK(hipStreamEndCapture(D->stream, &graph));
            CHECK(hipGraphInstantiateWithFlags(&G->exec[d], graph, 0));
            CHECK(hipGraphDestroy(graph));
        }
        g_graph_captures++;
        G->kernels = g_launches - before;
        g_launches = before;
        memcpy(G->key, key, sizeof key);
    }
    G->last_use = ++g->graph_clock;
    CHECK(hipSetDevice(0));
    CHECK(hipMemcpyAsync(g->dev[0].tokens, tokens, (size_t)B * sizeof(int), hipMemcpyHostToDevice, g->dev[0].stream));
    for (int d = 0; d < g->n_dev; d++) {
        GDev *D = &g->dev[d];
        if (d > 0) hand_over(g, &g->dev[d - 1], D, B); /* leaves device d current */
        CHECK(hipMemcpyAsync(D->pos_dev, pos, (size_t)n_sp * sizeof(int), hipMemcpyHostToDevice, D->stream));
        CHECK(hipGraphLaunch(G->exec[d], D->stream));
    }
    g_graph_launches++;
    g_launches += G->kernels;
    /* the null stream waits for the last device's stream (a blocking stream) */
    head_copy(g, &g->dev[g->n_dev - 1], 0, B, B, logits, all_logits, hidden);
}

/* One step of B rows (the sequences sp[0..n_sp); tokens on the host), rows start..start+B-1
 * of the n the caller asked for: one graph per device where the step can be one (all n
 * rows at once, at most GEMV_MAXN, the fast kernels), else launch by launch; the head's
 * logits and hidden states as head() writes them. */
static void forward_step(GpuModel *g, const GSpan *sp, int n_sp, const int *tokens, int B, int start, int n, float *logits, int all_logits,
                         float *hidden) {
    if (g->graphs && !g_plain_kernels && start == 0 && B == n && B <= GEMV_MAXN) {
        graph_step(g, sp, n_sp, tokens, B, logits, all_logits, hidden);
        return;
    }
    CHECK(hipSetDevice(0));
    CHECK(hipMemcpy(g->dev[0].tokens, tokens, (size_t)B * sizeof(int), hipMemcpyHostToDevice));
    GDev *D = run_layers(g, B, sp, n_sp);
    head(g, D, g->final_norm, start, B, n, logits, all_logits, hidden);
}

extern "C" void gpu_forward_hidden(GpuModel *g, int pos, const int *tokens, int n, float *logits, int all_logits, float *hidden) {
    g->pos = pos; /* the cache beyond pos is overwritten, as on the CPU (chat rewinds it) */
    if (g->pos + n > g->ctx) glm_fatal("--ctx %d: %d more tokens do not fit the context (%d cached)", g->ctx, n, g->pos);
    for (int start = 0; start < n; start += g->cap) {
        const int B = n - start < g->cap ? n - start : g->cap;
        const GSpan one = {0, B, g->pos, g->slot};
        forward_step(g, &one, 1, tokens + start, B, start, n, logits, all_logits, hidden);
        g->pos += B;
    }
    CHECK(hipGetLastError());
}

extern "C" void gpu_forward(GpuModel *g, int pos, const int *tokens, int n, float *logits, int all_logits) {
    gpu_forward_hidden(g, pos, tokens, n, logits, all_logits, NULL);
}

/* One decode step of n sequences at once (glm serve's batch; glm.c forward_batch with
 * one row each): row i is tokens[i] at position pos[i] of the sequence in cache slot
 * slot[i]. Every weight is read once for all rows; each row's RoPE, cache rows and
 * attention use its own slot. logits [n][V] (host). A row's logits are bit for bit those
 * it gets alone: the few-token products sum each row as the one-token ones do, and each
 * sequence's attention runs as its own launch. */
extern "C" void gpu_forward_rows(GpuModel *g, const int *slot, const int *pos, const int *tokens, int n, float *logits) {
    static_assert(GPU_BATCH_MAX == GEMV_MAXN, "glm.h's GPU_BATCH_MAX is GEMV_MAXN");
    GSpan sp[GEMV_MAXN];
    if (n < 1 || n > GEMV_MAXN || n > g->cap) glm_fatal("gpu_forward_rows: %d rows (1..%d)", n, GEMV_MAXN < g->cap ? GEMV_MAXN : g->cap);
    for (int i = 0; i < n; i++) {
        if (slot[i] < 0 || slot[i] >= g->slots) glm_fatal("gpu_forward_rows: slot %d of %d", slot[i], g->slots);
        if (pos[i] < 0 || pos[i] >= g->ctx) glm_fatal("--ctx %d: no room for a token at position %d", g->ctx, pos[i]);
        sp[i] = (GSpan){i, 1, pos[i], slot[i]};
    }
    forward_step(g, sp, n, tokens, n, 0, n, logits, 1, NULL);
    CHECK(hipGetLastError());
}

/* The MTP layer (glm.c mtp_forward_hidden) at its rows mtp_pos.. for n rows, on the
 * last device: row i pairs the main model's final-normed hidden[i] (host, from
 * gpu_forward_hidden) with next[i]:
 *   u = eh_proj · [RMSNorm(embed(next[i]); enorm) ; RMSNorm(hidden[i]; hnorm)]
 * then the MoE decoder layer on its own cache rows, shared_head.norm and the main
 * lm_head. The embedding is looked up on device 0 (which holds it) and copied over. */
/* shared (n == 1 only): the row runs no indexer and attends to the host's selection
 * shared[0..n_shared) (glm.c mtp_draft_shared); keep: the last row's selection, copied
 * back for the draft steps that will share it. */
static void mtp_rows(GpuModel *g, int mtp_pos, const float *hidden, const int *next, int n, float *logits, int all_logits,
                     float *out_hidden, MtpSelection *keep, const int *shared, int n_shared) {
    const Config *c = &g->c;
    const int H = c->hidden;
    const GMtp *P = g->mtp;
    GLayer shared_layer;
    const GLayer *L = P ? &P->layer : NULL;
    if (!P) glm_fatal("--mtp: the GPU copy of the model has no MTP layer");
    if (mtp_pos + n > g->ctx) glm_fatal("--ctx %d: %d more MTP rows do not fit the context (%d cached)", g->ctx, n, mtp_pos);
    GDev *D0 = &g->dev[0], *D = &g->dev[g->n_dev - 1];
    for (int start = 0; start < n; start += g->cap) {
        const int B = n - start < g->cap ? n - start : g->cap;
        const size_t nh = (size_t)B * H;
        CHECK(hipSetDevice(D0->id));
        CHECK(hipMemcpy(D0->tokens, next + start, (size_t)B * sizeof(int), hipMemcpyHostToDevice));
        if (D0 == D) LAUNCHED(k_embed, dim3(B), dim3(BLOCK), 0, 0, g->embed, (const int *)D0->tokens, D->a);
        else { /* device 0's scratch is free between forward passes */
            LAUNCHED(k_embed, dim3(B), dim3(BLOCK), 0, 0, g->embed, (const int *)D0->tokens, D0->out);
            CHECK(hipDeviceSynchronize());
            CHECK(hipSetDevice(D->id)); /* ROCm's peer copy does not wait for the destination's queued work (see hand_over) */
            CHECK(hipDeviceSynchronize());
            CHECK(hipMemcpyPeer(D->a, D->id, D0->out, D0->id, nh * sizeof(float)));
            CHECK(hipSetDevice(D->id));
        }
        CHECK(hipMemcpy(D->out, hidden + (size_t)start * H, nh * sizeof(float), hipMemcpyHostToDevice));
        LAUNCHED(k_rmsnorm, dim3(B), dim3(BLOCK), 0, 0, D->eh, 2 * H, (const float *)D->a, H, (const float *)P->enorm, H, c->rms_eps);
        LAUNCHED(k_rmsnorm, dim3(B), dim3(BLOCK), 0, 0, D->eh + H, 2 * H, (const float *)D->out, H, (const float *)P->hnorm, H, c->rms_eps);
        matmul(D->x, D->eh, P->eh_proj, B);
        if (shared) { /* row 0 of the chunk's selection, which attention reads as it is */
            CHECK(hipMemcpy(D->sel, shared, (size_t)n_shared * sizeof(int), hipMemcpyHostToDevice));
            CHECK(hipMemcpy(D->n_sel, &n_shared, sizeof(int), hipMemcpyHostToDevice));
            shared_layer = P->layer;
            shared_layer.has_indexer = 0;
            L = &shared_layer;
        }
        const GSpan one = {0, B, mtp_pos + start, 0}; /* the MTP layer's cache: one slot */
        layer_forward(g, D, L, g->m->mtp->layer.dense, B, &one, 1, 0);
        residual_add(g, D, B);
        if (keep && start + B == n) { /* the MTP layer is always "full": its indexer just chose D->sel */
            CHECK(hipMemcpy(&keep->n_sel, D->n_sel + (B - 1), sizeof(int), hipMemcpyDeviceToHost));
            CHECK(hipMemcpy(keep->sel, D->sel + (size_t)(B - 1) * c->index_topk, (size_t)keep->n_sel * sizeof(int), hipMemcpyDeviceToHost));
            keep->pos = mtp_pos + n - 1;
        }
        head(g, D, P->head_norm, start, B, n, logits, all_logits, NULL);
        if (out_hidden && start + B == n) {
            rmsnorm(D->a, D->x + (size_t)(B - 1) * H, P->head_norm, H, 1, c->rms_eps);
            CHECK(hipMemcpy(out_hidden, D->a, (size_t)H * sizeof(float), hipMemcpyDeviceToHost));
        }
    }
    CHECK(hipGetLastError());
}

extern "C" void gpu_mtp_forward(GpuModel *g, int mtp_pos, const float *hidden, const int *next, int n, float *logits, int all_logits,
                                float *out_hidden) {
    mtp_rows(g, mtp_pos, hidden, next, n, logits, all_logits, out_hidden, NULL, NULL, 0);
}

extern "C" void gpu_mtp_forward_keep(GpuModel *g, int mtp_pos, const float *hidden, const int *next, int n, float *logits,
                                     int all_logits, float *out_hidden, MtpSelection *keep) {
    mtp_rows(g, mtp_pos, hidden, next, n, logits, all_logits, out_hidden, keep, NULL, 0);
}

extern "C" void gpu_mtp_draft_shared(GpuModel *g, int mtp_pos, const float *h, int next, float *logits, float *out_hidden,
                                     const int *sel, int n_sel) {
    if (n_sel < 1 || n_sel > g->c.index_topk) glm_fatal("gpu_mtp_draft_shared: %d selected rows (1..%d)", n_sel, g->c.index_topk);
    mtp_rows(g, mtp_pos, h, &next, 1, logits, 0, out_hidden, NULL, sel, n_sel);
}

/* Samples from the last token's logits of the latest gpu_forward; u is uniform in
 * [0, 1) from glm.c's generator (unused when temperature <= 0). */
extern "C" int gpu_sample(GpuModel *g, float temperature, float top_p, float u) {
    GDev *D = &g->dev[g->n_dev - 1];
    CHECK(hipSetDevice(D->id));
    sample_launch(D->logits, g->c.vocab_size, temperature, top_p, u, D->samp);
    int tok;
    CHECK(hipMemcpy(&tok, D->samp.out, sizeof(int), hipMemcpyDeviceToHost));
    CHECK(hipGetLastError());
    return tok;
}

/* The greedy token of each of the latest forward's n rows of logits (gpu_forward_rows'
 * rows, or gpu_forward_hidden's last row with n = 1): the pick gpu_sample makes at
 * temperature 0, row by row, with n ints copied back in place of n x V floats. */
extern "C" void gpu_argmax_rows(GpuModel *g, int n, int *tokens) {
    GDev *D = &g->dev[g->n_dev - 1];
    if (n < 1 || n > g->cap) glm_fatal("gpu_argmax_rows: %d rows (1..%d)", n, g->cap);
    CHECK(hipSetDevice(D->id));
    argmax_rows_launch(D->logits, g->c.vocab_size, n, D->samp);
    CHECK(hipMemcpy(tokens, D->samp.out, (size_t)n * sizeof(int), hipMemcpyDeviceToHost));
    CHECK(hipGetLastError());
}

/* ======================================================================== */
/* 11. entry points for the kernel tests (tests/gpu/kernel_test.c)           */
/*
 * Each takes host arrays, runs one kernel (or one block of the forward pass) on
 * device 0 and returns the result, so the test can hold it against glm.c's own op.
 */

/* The kernel tests run each fast kernel and its plain reference on the same input. */
extern "C" void gpuk_use_plain(int on) { g_plain_kernels = on; }

static void *dev_copy(const void *src, size_t n) {
    void *d;
    CHECK(hipMalloc(&d, n ? n : 1));
    if (src && n) CHECK(hipMemcpy(d, src, n, hipMemcpyHostToDevice));
    return d;
}
static void host_copy(void *dst, const void *src, size_t n) { CHECK(hipMemcpy(dst, src, n, hipMemcpyDeviceToHost)); }

static DMat dev_mat(const Mat *W) {
    DMat d;
    memset(&d, 0, sizeof d);
    d.fmt = W->fmt; d.rows = W->rows; d.cols = W->cols;
    size_t sb, wb = mat_bytes(W, &sb);
    d.w = (const uint8_t *)dev_copy(W->w, wb);
    if (W->fmt == WF_FP8) d.fp8_scale = (const float *)dev_copy(W->fp8_scale, sb);
    if (W->fmt == WF_MXFP4) d.mx_scale = (const uint8_t *)dev_copy(W->mx_scale, sb);
    return d;
}
static void dev_mat_free(DMat *d) { dfree(d->w); dfree(d->fp8_scale); dfree(d->mx_scale); }

/* The split products' smallest split (in chunks): the tests lower it so that their small
 * matrices are split along k as GLM-5.2's router and kv_a are. */
extern "C" void gpuk_gemv_split_min(int chunks) { g_split_min_chunks = chunks > 0 ? chunks : GF_MIN_SPLIT_CHUNKS; }

/* y[t][i] = x[t] · W[r0+i] for n tokens, i < nr (matmul_rows; picks gemv or tiled by n) */
extern "C" void gpuk_matmul_rows(float *y, const float *x, const Mat *W, int r0, int nr, int n) {
    CHECK(hipSetDevice(0));
    if (!g_split[0].part) { /* no model loaded: scratch of the tests' own */
        g_split[0].part_cap = 1 << 20;
        g_split[0].part = (float *)dev_copy(NULL, g_split[0].part_cap * sizeof(float));
        g_split[0].count = (unsigned *)dev_copy(NULL, GF_COUNTS * sizeof(unsigned));
        CHECK(hipMemset(g_split[0].count, 0, GF_COUNTS * sizeof(unsigned)));
    }
    DMat d = dev_mat(W);
    float *dx = (float *)dev_copy(x, (size_t)n * W->cols * sizeof(float)), *dy = (float *)dev_copy(NULL, (size_t)n * nr * sizeof(float));
    matmul_rows(dy, nr, dx, W->cols, d, r0, nr, n);
    host_copy(y, dy, (size_t)n * nr * sizeof(float));
    dev_mat_free(&d); dfree(dx); dfree(dy);
}

extern "C" void gpuk_embed(float *y, const Mat *E, const int *tokens, int n) {
    CHECK(hipSetDevice(0));
    DMat d = dev_mat(E);
    int *dt = (int *)dev_copy(tokens, (size_t)n * sizeof(int));
    float *dy = (float *)dev_copy(NULL, (size_t)n * E->cols * sizeof(float));
    LAUNCHED(k_embed, dim3(n), dim3(BLOCK), 0, 0, d, (const int *)dt, dy);
    host_copy(y, dy, (size_t)n * E->cols * sizeof(float));
    dev_mat_free(&d); dfree(dt); dfree(dy);
}

extern "C" void gpuk_rmsnorm(float *y, const float *x, const float *w, int dim, int n, float eps) {
    CHECK(hipSetDevice(0));
    float *dx = (float *)dev_copy(x, (size_t)n * dim * 4), *dw = (float *)dev_copy(w, (size_t)dim * 4);
    rmsnorm(dx, dx, dw, dim, n, eps); /* in place, as attention() uses it */
    host_copy(y, dx, (size_t)n * dim * 4);
    dfree(dx); dfree(dw);
}

/* k_add_rmsnorm against its two plain kernels: x += y, a = RMSNorm(x); a_ref from k_add,
 * k_rmsnorm (must be equal bit for bit), x_out the sum. */
extern "C" void gpuk_add_rmsnorm(float *a, float *a_ref, float *x_out, const float *x, const float *y, const float *w, int dim, int n, float eps) {
    CHECK(hipSetDevice(0));
    const size_t bytes = (size_t)n * dim * 4;
    float *dx = (float *)dev_copy(x, bytes), *dx2 = (float *)dev_copy(x, bytes), *dy = (float *)dev_copy(y, bytes), *dw = (float *)dev_copy(w, (size_t)dim * 4);
    float *da = (float *)dev_copy(x, bytes), *da2 = (float *)dev_copy(x, bytes);
    LAUNCHED(k_add_rmsnorm, dim3(n), dim3(BLOCK), 0, 0, dx, (const float *)dy, da, (const float *)dw, dim, eps);
    LAUNCHED(k_add, dim3(blocks_for((size_t)n * dim)), dim3(BLOCK), 0, 0, dx2, (const float *)dy, (size_t)n * dim);
    rmsnorm(da2, dx2, dw, dim, n, eps);
    host_copy(a, da, bytes);
    host_copy(a_ref, da2, bytes);
    host_copy(x_out, dx, bytes);
    dfree(dx); dfree(dx2); dfree(dy); dfree(dw); dfree(da); dfree(da2);
}

/* The indexer key path: LayerNorm (eps 1e-6) then RoPE of the first `rope_dims` at
 * position pos; table is [pos+1][rope_dims] from the host. */
extern "C" void gpuk_layernorm_rope(float *y, const float *x, const float *w, const float *b, int dim, int rope_dims, int pos, const float *table) {
    CHECK(hipSetDevice(0));
    float *dx = (float *)dev_copy(x, (size_t)dim * 4), *dw = (float *)dev_copy(w, (size_t)dim * 4), *db = (float *)dev_copy(b, (size_t)dim * 4);
    float *dc = (float *)dev_copy(NULL, (size_t)(pos + 1) * dim * 4), *dt = (float *)dev_copy(table, (size_t)(pos + 1) * rope_dims * 4);
    LAUNCHED(k_ix_key, dim3(1), dim3(BLOCK), 0, 0, dc, (const float *)dx, (const float *)dw, (const float *)db, dim, rope_dims, pos, (const float *)dt, (const int *)NULL);
    host_copy(y, dc + (size_t)pos * dim, (size_t)dim * 4);
    dfree(dx); dfree(dw); dfree(db); dfree(dc); dfree(dt);
}

/* RoPE on nvec vectors of `stride` floats at rotary offset off, position pos. */
extern "C" void gpuk_rope(float *v, int nvec, int stride, int off, int dims, int pos, const float *table) {
    CHECK(hipSetDevice(0));
    float *dv = (float *)dev_copy(v, (size_t)nvec * stride * 4), *dt = (float *)dev_copy(table, (size_t)(pos + 1) * dims * 4);
    LAUNCHED(k_rope, dim3(1), dim3(BLOCK), 0, 0, dv, nvec * stride, nvec, stride, off, dims, pos, (const float *)dt, (const int *)NULL);
    host_copy(v, dv, (size_t)nvec * stride * 4);
    dfree(dv); dfree(dt);
}

/* topk_select of n scores into sel[k], in ascending index order */
extern "C" void gpuk_topk(int *sel, const float *score, int n, int k) {
    CHECK(hipSetDevice(0));
    float *ds = (float *)dev_copy(score, (size_t)n * 4);
    int *dsel = (int *)dev_copy(NULL, (size_t)k * 4), *dn = (int *)dev_copy(NULL, 4);
    LAUNCHED(k_topk, dim3(1), dim3(BLOCK), 0, 0, (const float *)ds, n, k, n - 1, dsel, dn, (const int *)NULL);
    host_copy(sel, dsel, (size_t)k * 4);
    dfree(ds); dfree(dsel); dfree(dn);
}

extern "C" void gpuk_moe_route(int *idx, float *w, const Config *c, const float *logits, const float *bias, int n) {
    CHECK(hipSetDevice(0));
    const int E = c->n_experts, A = c->n_active;
    float *dl = (float *)dev_copy(logits, (size_t)n * E * 4), *db = (float *)dev_copy(bias, (size_t)E * 4);
    float *ds = (float *)dev_copy(NULL, (size_t)n * (2 * E + c->n_group) * 4), *dw = (float *)dev_copy(NULL, (size_t)n * A * 4);
    int *di = (int *)dev_copy(NULL, (size_t)n * A * 4);
    LAUNCHED(k_moe_route, dim3(n), dim3(BLOCK), 0, 0, (const float *)dl, (const float *)db, ds, di, dw, E, A, c->n_group, c->topk_group, c->norm_topk_prob,
           c->routed_scale);
    host_copy(idx, di, (size_t)n * A * 4);
    host_copy(w, dw, (size_t)n * A * 4);
    dfree(dl); dfree(db); dfree(ds); dfree(dw); dfree(di);
}

extern "C" void gpuk_silu_mul(float *h1, const float *h2, int n) {
    CHECK(hipSetDevice(0));
    float *d1 = (float *)dev_copy(h1, (size_t)n * 4), *d2 = (float *)dev_copy(h2, (size_t)n * 4);
    LAUNCHED(k_silu_mul, dim3(blocks_for((size_t)n)), dim3(BLOCK), 0, 0, d1, (const float *)d2, (size_t)n);
    host_copy(h1, d1, (size_t)n * 4);
    dfree(d1); dfree(d2);
}

/* Each of rows [n][V]'s greedy token into out[n], by the plain or the fast kernels. */
extern "C" void gpuk_argmax_rows(const float *logits, int V, int n, int *out) {
    CHECK(hipSetDevice(0));
    SampleBufs S;
    S.P = 1;
    while (S.P < V) S.P <<= 1;
    float *dl = (float *)dev_copy(logits, (size_t)n * V * 4);
    S.prob = (float *)dev_copy(NULL, (size_t)V * 4);
    S.cand = (int *)dev_copy(NULL, (size_t)S.P * 4);
    S.best_v = (float *)dev_copy(NULL, (size_t)n * SAMPLE_BLOCKS * 4);
    S.best_i = (int *)dev_copy(NULL, (size_t)n * SAMPLE_BLOCKS * 4);
    S.out = (int *)dev_copy(NULL, (size_t)n * 4);
    argmax_rows_launch(dl, V, n, S);
    host_copy(out, S.out, (size_t)n * 4);
    dfree(dl); dfree(S.prob); dfree(S.cand); dfree(S.best_v); dfree(S.best_i); dfree(S.out);
}

/* Samples from logits[V] with the draw u, by the plain or the fast kernels (gpuk_use_plain);
 * probs (if not NULL, temperature > 0, top_p < 1): the softmax, as k_sample stores it or,
 * for the fast kernels, their exp values divided by their sum as those kernels divide them. */
extern "C" int gpuk_sample(const float *logits, int V, float temperature, float top_p, float u, float *probs) {
    CHECK(hipSetDevice(0));
    SampleBufs S;
    S.P = 1;
    while (S.P < V) S.P <<= 1;
    float *dl = (float *)dev_copy(logits, (size_t)V * 4);
    S.prob = (float *)dev_copy(NULL, (size_t)V * 4);
    S.cand = (int *)dev_copy(NULL, (size_t)S.P * 4);
    S.best_v = (float *)dev_copy(NULL, SAMPLE_BLOCKS * 4);
    S.best_i = (int *)dev_copy(NULL, SAMPLE_BLOCKS * 4);
    S.sum = (float *)dev_copy(NULL, 4);
    S.hist = (unsigned *)dev_copy(NULL, 2 * SAMPLE_BINS * 4);
    S.sorted = (unsigned long long *)dev_copy(NULL, 2 * (size_t)S.P * 8);
    S.out = (int *)dev_copy(NULL, 4);
    sample_launch(dl, V, temperature, top_p, u, S);
    int tok;
    host_copy(&tok, S.out, 4);
    if (probs) {
        host_copy(probs, S.prob, (size_t)V * 4);
        float sum;
        host_copy(&sum, S.sum, 4);
        if (!g_plain_kernels) for (int i = 0; i < V; i++) probs[i] /= sum;
    }
    dfree(dl); dfree(S.prob); dfree(S.cand); dfree(S.best_v); dfree(S.best_i); dfree(S.sum); dfree(S.hist); dfree(S.sorted); dfree(S.out);
    return tok;
}

/* Tests only: the fast sampler's first group starts this many nonempty bins above the
 * histogram's estimate, so the widening path (k_sample_nucleus) runs. */
extern "C" void gpuk_sample_start_higher(int bins) { g_sample_start_higher = bins; }

/* q_abs [n][NH][KR+DR] from q [n][NH][DN+DR] and kv_b (the fast or the plain kernel, as
 * gpuk_use_plain says); c gives the shapes. */
extern "C" void gpuk_q_absorb(float *q_abs, const float *q, const Mat *kv_b, const Config *c, int n) {
    CHECK(hipSetDevice(0));
    const int NH = c->n_heads, AD = c->kv_lora_rank + c->qk_rope;
    DMat d = dev_mat(kv_b);
    float *dq = (float *)dev_copy(q, (size_t)n * NH * (c->qk_nope + c->qk_rope) * 4), *da = (float *)dev_copy(NULL, (size_t)n * NH * AD * 4);
    q_absorb(c, da, dq, d, n);
    host_copy(q_abs, da, (size_t)n * NH * AD * 4);
    dev_mat_free(&d); dfree(dq); dfree(da);
}

/* o_lat [n][NH][KR] over the selections sel [n][K] / n_sel [n] of latent [T][KR+DR]
 * (fast or plain, as gpuk_use_plain says); slices > 0 forces at most that many slices,
 * 0 lets the host choose for `cus` compute units. kmax: the bound the host passes. */
extern "C" void gpuk_mla_attend(float *o_lat, const float *q_abs, const float *latent, int T, const int *sel, const int *n_sel, const Config *c, int n, int kmax,
                                int cus, int slices) {
    CHECK(hipSetDevice(0));
    const int NH = c->n_heads, KR = c->kv_lora_rank, AD = KR + c->qk_rope, K = c->index_topk;
    float *dq = (float *)dev_copy(q_abs, (size_t)n * NH * AD * 4), *dl = (float *)dev_copy(latent, (size_t)T * AD * 4);
    int *ds = (int *)dev_copy(sel, (size_t)n * K * 4), *dn = (int *)dev_copy(n_sel, (size_t)n * 4);
    const size_t rows = (size_t)n * MLA_MAX_SLICES;
    float *dpo = (float *)dev_copy(NULL, rows * NH * KR * 4), *dml = (float *)dev_copy(NULL, rows * NH * 2 * 4);
    float *dsc = (float *)dev_copy(NULL, (size_t)n * NH * K * 4), *dout = (float *)dev_copy(NULL, (size_t)n * NH * KR * 4);
    /* NaN in every scratch float: a slice read that was never written shows */
    CHECK(hipMemset(dpo, 0xff, rows * NH * KR * 4));
    CHECK(hipMemset(dml, 0xff, rows * NH * 2 * 4));
    CHECK(hipMemset(dout, 0xff, (size_t)n * NH * KR * 4));
    attend_selected(c, cus, dout, dpo, dml, dsc, dq, dl, ds, dn, n, kmax, slices);
    host_copy(o_lat, dout, (size_t)n * NH * KR * 4);
    dfree(dq); dfree(dl); dfree(ds); dfree(dn); dfree(dpo); dfree(dml); dfree(dsc); dfree(dout);
}

/* The indexer's scores [n][T] of tokens at positions pos0.. over the key cache [T][ID]
 * (T >= pos0 + n), from q [n][IH][ID] and weights [n][IH]; entries a token does not
 * score (keys it cannot see, or all of them while it sees <= index_topk) are left NaN. */
extern "C" void gpuk_ix_scores(float *scores, const float *ix_q, const float *ix_w, const float *keys, int T, const Config *c, int n, int pos0) {
    CHECK(hipSetDevice(0));
    const int IH = c->index_n_heads, ID = c->index_head_dim, K = c->index_topk, vmax = pos0 + n;
    float *dq = (float *)dev_copy(ix_q, (size_t)n * IH * ID * 4), *dw = (float *)dev_copy(ix_w, (size_t)n * IH * 4), *dk = (float *)dev_copy(keys, (size_t)T * ID * 4);
    float *dsc = (float *)dev_copy(NULL, (size_t)n * T * 4);
    CHECK(hipMemset(dsc, 0xff, (size_t)n * T * 4));
    if (ix_tiled(c))
        LAUNCHED(k_ix_scores_tiled, dim3(ix_key_blocks(c, vmax), (n + IX_TOKENS - 1) / IX_TOKENS), dim3(BLOCK), 0, 0, dsc, T, (const float *)dq, (const float *)dw,
                 (const float *)dk, IH, ID, K, pos0, n, (const int *)NULL);
    else
        LAUNCHED(k_ix_scores, dim3(ix_key_blocks(c, vmax), n), dim3(BLOCK), 0, 0, dsc, T, (const float *)dq, (const float *)dw, (const float *)dk, IH, ID, K, pos0,
                 (const int *)NULL);
    host_copy(scores, dsc, (size_t)n * T * 4);
    dfree(dq); dfree(dw); dfree(dk); dfree(dsc);
}

/* One attention block (projections, cache append, indexer or shared selection,
 * absorbed MLA, o_proj) of `layer` for n tokens at position pos0, on the model
 * loaded by gpu_load(m, 1, ctx): a[n][H] in, out[n][H] back, and the selection. */
extern "C" void gpuk_attention(GpuModel *g, int layer, const float *a, int n, int pos0, float *out, int *sel, int *n_sel) {
    GDev *D = &g->dev[g->layers[layer].dev];
    const Config *c = &g->c;
    CHECK(hipSetDevice(D->id));
    CHECK(hipMemcpy(D->a, a, (size_t)n * c->hidden * 4, hipMemcpyHostToDevice));
    const GSpan one = {0, n, pos0, 0};
    attention(g, D, &g->layers[layer], n, &one, 1);
    host_copy(out, D->out, (size_t)n * c->hidden * 4);
    host_copy(sel, D->sel, (size_t)n * c->index_topk * 4);
    host_copy(n_sel, D->n_sel, (size_t)n * 4);
}

/* The MLP of `layer` (dense SwiGLU or MoE) for n tokens. */
extern "C" void gpuk_mlp(GpuModel *g, int layer, const float *a, int n, float *out) {
    GDev *D = &g->dev[g->layers[layer].dev];
    const Config *c = &g->c;
    CHECK(hipSetDevice(D->id));
    CHECK(hipMemcpy(D->a, a, (size_t)n * c->hidden * 4, hipMemcpyHostToDevice));
    if (c->dense[layer]) swiglu(D, D->out, D->a, g->layers[layer].gate, g->layers[layer].up, g->layers[layer].down, n);
    else moe(g, D, &g->layers[layer], D->a, D->out, n);
    host_copy(out, D->out, (size_t)n * c->hidden * 4);
}

/* Times one launch of the decode matrix-vector product (for tests/gpu_check.sh):
 * returns seconds per call over `iters` calls, W already in host memory. */
extern "C" double gpuk_time_gemv(const Mat *W, int iters) {
    CHECK(hipSetDevice(0));
    DMat d = dev_mat(W);
    float *dx = (float *)dev_copy(NULL, (size_t)W->cols * 4), *dy = (float *)dev_copy(NULL, (size_t)W->rows * 4);
    CHECK(hipMemset(dx, 0, (size_t)W->cols * 4));
    matmul(dy, dx, d, 1);
    hipEvent_t e0, e1;
    CHECK(hipEventCreate(&e0));
    CHECK(hipEventCreate(&e1));
    CHECK(hipEventRecord(e0, 0));
    for (int i = 0; i < iters; i++) matmul(dy, dx, d, 1);
    CHECK(hipEventRecord(e1, 0));
    CHECK(hipEventSynchronize(e1));
    float ms;
    CHECK(hipEventElapsedTime(&ms, e0, e1));
    CHECK(hipGetLastError());
    dev_mat_free(&d); dfree(dx); dfree(dy);
    CHECK(hipEventDestroy(e0));
    CHECK(hipEventDestroy(e1));
    return ms / 1e3 / iters;
}

/* Times the prefill product of n tokens (matmul_rows: the matrix cores unless
 * GLM_GPU_KERNELS=plain) for tests/gpu_check.sh: seconds per call over `iters` calls. */
extern "C" double gpuk_time_gemm(const Mat *W, int n, int iters) {
    CHECK(hipSetDevice(0));
    DMat d = dev_mat(W);
    float *dx = (float *)dev_copy(NULL, (size_t)n * W->cols * 4), *dy = (float *)dev_copy(NULL, (size_t)n * W->rows * 4);
    CHECK(hipMemset(dx, 0, (size_t)n * W->cols * 4));
    matmul(dy, dx, d, n);
    hipEvent_t e0, e1;
    CHECK(hipEventCreate(&e0));
    CHECK(hipEventCreate(&e1));
    CHECK(hipEventRecord(e0, 0));
    for (int i = 0; i < iters; i++) matmul(dy, dx, d, n);
    CHECK(hipEventRecord(e1, 0));
    CHECK(hipEventSynchronize(e1));
    float ms;
    CHECK(hipEventElapsedTime(&ms, e0, e1));
    CHECK(hipGetLastError());
    dev_mat_free(&d); dfree(dx); dfree(dy);
    CHECK(hipEventDestroy(e0));
    CHECK(hipEventDestroy(e1));
    return ms / 1e3 / iters;
}

/* Device-to-device copy bandwidth (bytes read + written per second) of `bytes`. */
extern "C" double gpuk_copy_bandwidth(size_t bytes, int iters) {
    CHECK(hipSetDevice(0));
    void *a, *b;
    CHECK(hipMalloc(&a, bytes));
    CHECK(hipMalloc(&b, bytes));
    CHECK(hipMemset(a, 1, bytes));
    CHECK(hipMemcpy(b, a, bytes, hipMemcpyDeviceToDevice));
    hipEvent_t e0, e1;
    CHECK(hipEventCreate(&e0));
    CHECK(hipEventCreate(&e1));
    CHECK(hipEventRecord(e0, 0));
    for (int i = 0; i < iters; i++) CHECK(hipMemcpyAsync(b, a, bytes, hipMemcpyDeviceToDevice, 0));
    CHECK(hipEventRecord(e1, 0));
    CHECK(hipEventSynchronize(e1));
    float ms;
    CHECK(hipEventElapsedTime(&ms, e0, e1));
    dfree(a); dfree(b);
    CHECK(hipEventDestroy(e0));
    CHECK(hipEventDestroy(e1));
    return 2.0 * (double)bytes * iters / (ms / 1e3);
}

/* The matrix instruction of this build (section 3c) once: its shape, then d = a · b + c for
 * row-major a [M][K] and b [K][N] (bf16 bits) and c, d [M][N], computed by one wave. */
extern "C" void gpuk_mma_shape(int *m, int *n, int *k) { *m = MMA_M; *n = MMA_N; *k = MMA_K; }
extern "C" void gpuk_mma(float *d, const uint16_t *a, const uint16_t *b, const float *c) {
    CHECK(hipSetDevice(0));
    uint16_t *da = (uint16_t *)dev_copy(a, MMA_M * MMA_K * 2), *db = (uint16_t *)dev_copy(b, MMA_K * MMA_N * 2);
    float *dc = (float *)dev_copy(c, MMA_M * MMA_N * 4), *dd = (float *)dev_copy(NULL, MMA_M * MMA_N * 4);
    LAUNCHED(k_mma_once, dim3(1), dim3(WAVE), 0, 0, (const uint16_t *)da, (const uint16_t *)db, (const float *)dc, dd);
    host_copy(d, dd, MMA_M * MMA_N * 4);
    dfree(da); dfree(db); dfree(dc); dfree(dd);
}

/* k_gemm_mma as matmul_rows launches it, nz products offset by zr rows / zx, zy floats
 * (x_rows NULL), or with the rows of x gathered (k_gemm_mma_rows, nz = 1): y has y_floats
 * floats, x x_floats; skinny picks the tile shape (-1: as matmul_rows does). */
extern "C" void gpuk_gemm_mma(float *y, int ldy, size_t y_floats, const float *x, int ldx, size_t x_floats, const int *x_rows, const Mat *W, int r0, int nr,
                              int n, int nz, int zr, int zx, int zy, int skinny) {
    CHECK(hipSetDevice(0));
    DMat d = dev_mat(W);
    float *dx = (float *)dev_copy(x, x_floats * 4), *dy = (float *)dev_copy(y, y_floats * 4);
    int *dr = x_rows ? (int *)dev_copy(x_rows, (size_t)n * 4) : NULL;
    if (skinny < 0) skinny = n <= MmaCfg<true>::BN;
    const int bm = skinny ? (int)MmaCfg<true>::BM : (int)MmaCfg<false>::BM, bn = skinny ? (int)MmaCfg<true>::BN : (int)MmaCfg<false>::BN;
    const dim3 grid((nr + bm - 1) / bm, (n + bn - 1) / bn, x_rows ? 1 : nz);
    if (x_rows && skinny) LAUNCHED(k_gemm_mma_rows<true>, grid, dim3(BLOCK), 0, 0, d, (const float *)dx, ldx, (const int *)dr, dy, ldy, r0, nr, n);
    else if (x_rows) LAUNCHED(k_gemm_mma_rows<false>, grid, dim3(BLOCK), 0, 0, d, (const float *)dx, ldx, (const int *)dr, dy, ldy, r0, nr, n);
    else if (skinny) LAUNCHED(k_gemm_mma<true>, grid, dim3(BLOCK), 0, 0, d, (const float *)dx, ldx, dy, ldy, r0, nr, n, zr, zx, zy);
    else LAUNCHED(k_gemm_mma<false>, grid, dim3(BLOCK), 0, 0, d, (const float *)dx, ldx, dy, ldy, r0, nr, n, zr, zx, zy);
    host_copy(y, dy, y_floats * 4);
    dev_mat_free(&d); dfree(dx); dfree(dy);
    if (dr) dfree(dr);
}
