/* rows_lab.c - the fourteenth session's few-token expert product: simd.c's gemm_rows_bf16
 * (matmul_rows' path for <= 64 tokens) on MXFP4 matrices of an expert's shape (2048 x 6144),
 * two threads taking 4-row calls as matmul_rows hands them out. Three timings a round:
 *   cold     a new matrix each call, laid over 0.54 GB of a shard's page cache (the weights'
 *            bytes; the scales are sane values in anonymous memory),
 *   hot      the same matrix every call (6.3 MB, in L3),
 *   dequant  cold, with no tokens: the rows' dequantization to bf16 alone.
 * "GFLOP/s" counts 2 x rows x cols x tokens; "weights" is the matrix bytes over the time.
 *   gcc -std=c11 -O2 -fopenmp -Dmain=glm_cli_main -o /tmp/rows_lab notes/rows_lab.c \
 *       glm.c json.c synth.c simd.c convert.c tokenizer.c -lm
 *   /tmp/rows_lab /work/bench/glm2/model-00002-of-00003.safetensors 15     # 15 tokens
 * Measured (2026-12-06, 15 tokens, FMA peak ~420): before 45dad65 (the last tokens one at a
 * time) cold ~285 GFLOP/s, hot ~310; with it cold 295-340, hot 370-385. The dequantization
 * alone reads 14-16 GB/s of weights. Over 6-36 tokens (before 45dad65) the time per GB of
 * weights was 0.06 s + 0.0076 s per token: at 15 tokens a third of it is dequantization, and
 * the tiles run at ~1.2x the FMA peak, where alone in cache they reach ~1.6x. A software
 * prefetch of the next 4 rows, and k-blocking the tiles so 4 rows' chunk stays in L1, gained
 * nothing here. */
#define _GNU_SOURCE
#undef main
#include "../glm.h"
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

int main(int argc, char **argv) {
    const int R = 2048, K = 6144, n = argc == 3 ? atoi(argv[2]) : 0;
    const size_t wbytes = (size_t)R * K / 2, sbytes = (size_t)R * K / 32;
    if (argc != 3 || n < 1 || n > 64) { fprintf(stderr, "usage: rows_lab SHARD TOKENS (1..64; a shard of 0.6 GB or more)\n"); return 1; }
    number_tables_init();
    kernels_init(NULL);
    if (!kernels.gemm_rows_bf16) { fprintf(stderr, "rows_lab: needs the AVX512-BF16 kernels\n"); return 1; }
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    const int nmat = (int)((1u << 30) / wbytes) / 2, T = omp_get_max_threads(); /* 85 matrices, 0.54 GB */
    if (fd < 0 || fstat(fd, &st) || (size_t)st.st_size < nmat * wbytes) { fprintf(stderr, "rows_lab: %s: need a file of 0.6 GB or more\n", argv[1]); return 1; }
    const uint8_t *map = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) { fprintf(stderr, "rows_lab: %s: cannot map it\n", argv[1]); return 1; }
    for (off_t o = 0; o < st.st_size; o += 4096) (void)*(volatile const uint8_t *)(map + o); /* page it in */
    uint8_t *sc = malloc(sbytes);
    for (size_t i = 0; i < sbytes; i++) sc[i] = (uint8_t)(120 + i % 8); /* 2^-7 .. 2^0 */
    uint16_t *X = aligned_alloc(64, (size_t)n * (K + 64) * 2), *wbuf = aligned_alloc(64, (size_t)T * 4 * (K + 32) * 2);
    float *Y = aligned_alloc(64, (size_t)n * R * 4);
    for (size_t i = 0; i < (size_t)n * (K + 64); i++) X[i] = (uint16_t)(0x3f80 + i % 7);
    for (int round = 0; round < 4; round++) {
        for (int kind = 0; kind < 3; kind++) { /* cold, hot, dequant */
            double t0 = now();
            for (int m = 0; m < nmat; m++) {
                Mat W = {.fmt = WF_MXFP4, .rows = R, .cols = K, .w = map + (size_t)(kind == 1 ? 0 : m) * wbytes, .mx_scale = sc};
#pragma omp parallel
                {
                    uint16_t *wb = wbuf + (size_t)omp_get_thread_num() * 4 * (K + 32);
#pragma omp for schedule(dynamic, 4)
                    for (int i = 0; i < R; i += 4) kernels.gemm_rows_bf16(&W, i, 4, X, K + 64, kind == 2 ? 0 : n, Y + i, R, wb);
                }
            }
            double t = now() - t0;
            if (kind < 2) printf("%s: %.1f GFLOP/s, weights %.1f GB/s   ", kind ? "hot" : "cold", 2.0 * R * K * n * nmat / t / 1e9, nmat * (wbytes + sbytes) / t / 1e9);
            else printf("dequant alone (cold): weights %.1f GB/s", nmat * (wbytes + sbytes) / t / 1e9);
        }
        printf("   (FMA peak %.1f GFLOP/s)\n", kernels.fma_peak() / 1e9);
    }
    return 0;
}
