/* kernels_vs_reads.c - the thirteenth session's question: how close do the committed decode
 * kernels (simd.c's matvec_bf16, one format at a time) come to what the memory under them can
 * give? Each round times, over the same 1 GiB of a shard (1.1 GB or more)'s page cache and in a rotating order:
 *   - the kernel, 2 threads taking 8 MB runs of rows as decode does (a matrix of 6144 columns
 *     laid over the file's bytes; FP8 and MXFP4 scales in anonymous memory, as the loader copies
 *     the FP8 ones; the MXFP4 ones are counted in its bytes);
 *   - glm bench's yardstick, a plain streaming read (no software prefetch);
 *   - the same read asking for one line 64 KB ahead at every 4 KB page, the trick the BF16
 *     rows use (the hardware prefetcher stops at each page).
 * Not part of the build or the tests:
 *   gcc -std=c11 -O2 -fopenmp -Dmain=glm_cli_main -o /tmp/kvr notes/kernels_vs_reads.c \
 *       glm.c json.c synth.c simd.c convert.c tokenizer.c -lm
 *   /tmp/kvr 6 /work/bench/glm2/model-00001-of-00003.safetensors 1   # 1 BF16, 2 FP8, 3 MXFP4
 * Pitfall met on the way (why it calls the real kernels): hand copies of a kernel in a lab
 * measured what the copy did, not the kernel. One fed x ~ 1 with scales ~ 1e-3 and left out the
 * 2^64 / 2^56 that simd.c's FP8 path carries: its sums were fp32 subnormals and its loop ran
 * ~15% slow; another let GCC fold the weight load into each shift (four loads of a line
 * instead of one) and lost 25%. */
#define _GNU_SOURCE
#undef main
#include "../glm.h"
#include <fcntl.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

/* A streaming read of p[0..n), n a multiple of 256; far: one line 64 KB ahead at each 4 KB page. */
__attribute__((target("avx512f"))) static long read_stream(const uint8_t *p, size_t n, int far) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 256) {
        if (far && ((uintptr_t)(p + i) & 4095) == 0) _mm_prefetch((const char *)p + i + 65536, _MM_HINT_T2);
        a = _mm512_add_epi64(a, _mm512_loadu_si512(p + i)); b = _mm512_add_epi64(b, _mm512_loadu_si512(p + i + 64));
        c = _mm512_add_epi64(c, _mm512_loadu_si512(p + i + 128)); d = _mm512_add_epi64(d, _mm512_loadu_si512(p + i + 192));
    }
    return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: kvr ROUNDS SHARD FORMAT(1 bf16, 2 fp8, 3 mxfp4)\n"); return 1; }
    const int rounds = atoi(argv[1]), cols = 6144;
    const WeightFormat fmt = (WeightFormat)atoi(argv[3]);
    if (rounds < 1 || fmt < WF_BF16 || fmt > WF_MXFP4) { fprintf(stderr, "kvr: need ROUNDS >= 1 and FORMAT 1, 2 or 3\n"); return 1; }
    number_tables_init();
    kernels_init(NULL);
    if (!kernels.matvec_bf16) { fprintf(stderr, "kvr: needs the AVX512-BF16 kernels\n"); return 1; }
    int fd = open(argv[2], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || st.st_size < (1l << 30) + (1l << 20)) { fprintf(stderr, "kvr: %s: need a file of 1.1 GB or more\n", argv[2]); return 1; }
    const uint8_t *map = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    for (off_t o = 0; o < st.st_size; o += 4096) (void)*(volatile const uint8_t *)(map + o); /* page it in */

    const size_t row_bytes = fmt == WF_FP8 ? cols : fmt == WF_MXFP4 ? cols / 2 : 2 * cols;
    const int rows_per_run = (int)((8u << 20) / row_bytes), runs = (int)(((size_t)1 << 30) / row_bytes / rows_per_run);
    Mat W = {.fmt = fmt, .rows = runs * rows_per_run, .cols = cols, .w = map + 4096};
    W.bytes = (size_t)W.rows * row_bytes;
    float *fp8_scale = malloc(sizeof(float) * (W.rows / 128 + 1) * (cols / 128));
    for (int i = 0; i < (W.rows / 128 + 1) * (cols / 128); i++) fp8_scale[i] = ldexpf(1.0f + (i % 5) * 0.1f, -10 - i % 3);
    uint8_t *mx_scale = malloc((size_t)W.rows * (cols / 32));
    for (size_t i = 0; i < (size_t)W.rows * (cols / 32); i++) mx_scale[i] = (uint8_t)(118 + (i * 7) % 13);
    W.fp8_scale = fp8_scale;
    W.mx_scale = mx_scale;
    if (fmt == WF_MXFP4) W.bytes += (size_t)W.rows * (cols / 32);

    float *x = malloc(sizeof(float) * cols), *xs = malloc(sizeof(float) * (cols + 128)), *y = malloc(sizeof(float) * W.rows);
    for (int i = 0; i < cols; i++) x[i] = sinf(0.37f * i);
    matvec_order_bf16(&W, x, xs);
    const size_t run_bytes = (size_t)rows_per_run * row_bytes;
    double gbs[3] = {0}, log_ratio[3] = {0};
    long sink = 0;
    for (int r = 0; r < rounds; r++) {
        double g[3];
        for (int k = 0; k < 3; k++) {
            const int what = (k + r) % 3; /* 0 kernel, 1 plain read, 2 read with the page prefetch */
            double t = now();
            if (what == 0) {
#pragma omp parallel for schedule(dynamic, 1)
                for (int q = 0; q < runs; q++) kernels.matvec_bf16(&W, q * rows_per_run, rows_per_run, xs, y + q * rows_per_run);
            } else {
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : sink)
                for (int q = 0; q < runs; q++) sink += read_stream(W.w + q * run_bytes, run_bytes, what == 2);
            }
            t = now() - t;
            g[what] = (what == 0 ? W.bytes : runs * run_bytes) / t / 1e9;
        }
        for (int k = 0; k < 3; k++) { gbs[k] += g[k] / rounds; log_ratio[k] += log(g[0] / g[k]) / rounds; }
    }
    printf("format %d: kernel %.1f GB/s, plain read %.1f, read with page prefetch %.1f; kernel x plain %.3f, x page-prefetch read %.3f (geometric means of %d rounds; y[0] %g, %ld)\n",
           (int)fmt, gbs[0], gbs[1], gbs[2], exp(log_ratio[1]), exp(log_ratio[2]), rounds, y[0], sink & 1);
    return 0;
}
