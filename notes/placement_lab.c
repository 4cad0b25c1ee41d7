/* placement_lab.c - the eleventh session's question: on this VM, does a streaming read's speed
 * depend on WHERE the memory is (its guest-physical address), not only on the moment?
 * Not part of the build or the tests. Needs root (PFNs in /proc/self/pagemap read as 0
 * otherwise) and an AVX-512 CPU:
 *   gcc -std=gnu11 -O2 -fopenmp -o /tmp/placement notes/placement_lab.c
 *   /tmp/placement map 16 6           read speed of each 256 MB of a 16 GB allocation,
 *                                     grouped by guest-physical address, 6 rounds rotating
 *   /tmp/placement sets 200 FILE...   1 GB from the lowest-, middle- and highest-addressed
 *                                     2 MB chunks of a 12 GB allocation, the page cache
 *                                     holding FILE..., and as many anonymous chunks as the
 *                                     files have, spread evenly through the allocation: the
 *                                     five reads rotate every round
 * Each read: both threads take 2 MB chunks in turn (like glm bench's 8 MB pieces), four
 * independent 64-byte XOR chains per thread, no software prefetch (glm bench's yardstick). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CHUNK ((size_t)2 << 20) /* one 2 MB page */

typedef struct {
    uint64_t pfn;     /* guest-physical page number of the chunk's first byte */
    const uint8_t *p; /* the chunk, CHUNK bytes, 2 MB-aligned */
} Chunk;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int by_pfn(const void *a, const void *b) { uint64_t x = ((const Chunk *)a)->pfn, y = ((const Chunk *)b)->pfn; return x < y ? -1 : x > y; }
static double gb_at(uint64_t pfn) { return pfn * 4096.0 / (1 << 30); }

static int pagemap;
static uint64_t pfn_of(const void *p) {
    uint64_t e = 0;
    if (pread(pagemap, &e, 8, (off_t)((uintptr_t)p / 4096 * 8)) != 8) return 0;
    return e & ((1ull << 55) - 1);
}

/* GB/s of one streaming read of the n chunks c[0..n). */
__attribute__((target("avx512f"))) static double read_chunks(const Chunk *c, int n) {
    long sink = 0;
    double t0 = now();
#pragma omp parallel for schedule(dynamic, 1) reduction(^ : sink)
    for (int i = 0; i < n; i++) {
        const __m512i *q = (const __m512i *)c[i].p;
        __m512i a = _mm512_setzero_si512(), b = a, d = a, e = a;
        for (size_t k = 0; k < CHUNK / 64; k += 4) {
            a = _mm512_xor_si512(a, q[k]); b = _mm512_xor_si512(b, q[k + 1]);
            d = _mm512_xor_si512(d, q[k + 2]); e = _mm512_xor_si512(e, q[k + 3]);
        }
        sink ^= _mm512_reduce_add_epi64(_mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(d, e)));
    }
    double t = now() - t0;
    volatile long keep = sink;
    (void)keep;
    return (double)n * CHUNK / t / 1e9;
}

/* n bytes of anonymous memory on 2 MB pages, written, as chunks sorted by guest-physical address */
static Chunk *anonymous_chunks(size_t n) {
    uint8_t *raw = mmap(NULL, n + CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) { perror("mmap"); exit(1); }
    uint8_t *b = (uint8_t *)(((uintptr_t)raw + CHUNK - 1) & ~(uintptr_t)(CHUNK - 1));
    madvise(b, n, MADV_HUGEPAGE);
    memset(b, 1, n);
    Chunk *c = malloc(n / CHUNK * sizeof(Chunk));
    for (size_t i = 0; i < n / CHUNK; i++) { c[i].p = b + i * CHUNK; c[i].pfn = pfn_of(c[i].p); }
    qsort(c, n / CHUNK, sizeof(Chunk), by_pfn);
    return c;
}

/* The page cache holding the files, as 2 MB chunks (each file mapped 2 MB-aligned, paged in). */
static Chunk *file_chunks(int nf, char **files, int *count) {
    Chunk *c = NULL;
    int n = 0;
    for (int f = 0; f < nf; f++) {
        int fd = open(files[f], O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) { perror(files[f]); exit(1); }
        size_t len = (size_t)st.st_size & ~(CHUNK - 1);
        if (len == 0) continue;
        uint8_t *raw = mmap(NULL, len + CHUNK, PROT_READ, MAP_SHARED, fd, 0); /* an aligned hole */
        munmap(raw, len + CHUNK);
        uint8_t *m = mmap((void *)(((uintptr_t)raw + CHUNK - 1) & ~(uintptr_t)(CHUNK - 1)), len, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
        madvise(m, len, MADV_HUGEPAGE);
        volatile uint8_t touch = 0;
        for (size_t i = 0; i < len; i += 4096) touch ^= m[i];
        c = realloc(c, (n + len / CHUNK) * sizeof(Chunk));
        for (size_t i = 0; i < len; i += CHUNK) { c[n].p = m + i; c[n].pfn = pfn_of(m + i); n++; }
    }
    *count = n;
    return c;
}

static void map_speeds(size_t gb, int rounds) {
    const int per_group = 128, nc = (int)((gb << 30) / CHUNK), ng = nc / per_group; /* 256 MB groups */
    Chunk *c = anonymous_chunks(gb << 30);
    double *sum = calloc(ng, sizeof(double));
    for (int r = 0; r < rounds; r++) /* each round starts elsewhere, so no group always goes first */
        for (int i = 0; i < ng; i++) { int g = (i + 7 * r) % ng; sum[g] += read_chunks(c + g * per_group, per_group); }
    for (int g = 0; g < ng; g++)
        printf("guest-physical %5.1f-%5.1f GB: %.1f GB/s\n", gb_at(c[g * per_group].pfn), gb_at(c[g * per_group + per_group - 1].pfn), sum[g] / rounds);
}

static void set_speeds(int rounds, int nf, char **files) {
    const size_t n = (size_t)12 << 30;
    const int nc = (int)(n / CHUNK), one_gb = 512;
    Chunk *c = anonymous_chunks(n);
    int nw;
    Chunk *w = file_chunks(nf, files, &nw);
    /* as many anonymous chunks as the files have, taken evenly through the allocation: the
     * same size and spread as the files, to tell the page cache from a big working set */
    int ns = nw < nc ? nw : nc;
    Chunk *spread = malloc((size_t)ns * sizeof(Chunk));
    for (int i = 0; i < ns; i++) spread[i] = c[(size_t)i * nc / ns];
    const Chunk *set[5] = {c, c + nc / 2 - one_gb / 2, c + nc - one_gb, w, spread};
    const int count[5] = {one_gb, one_gb, one_gb, nw, ns};
    const char *name[5] = {"low", "mid", "high", "files", "spread"};
    uint64_t wlo = ~0ull, whi = 0;
    for (int i = 0; i < nw; i++) { if (w[i].pfn < wlo) wlo = w[i].pfn; if (w[i].pfn > whi) whi = w[i].pfn; }
    for (int s = 0; s < 3; s++) printf("%s: 1 GB at guest-physical %.1f-%.1f GB\n", name[s], gb_at(set[s][0].pfn), gb_at(set[s][one_gb - 1].pfn));
    printf("files: %d MB at guest-physical %.1f-%.1f GB\n", 2 * nw, gb_at(wlo), gb_at(whi));
    double sum[5] = {0};
    for (int r = 0; r < rounds; r++) {
        double v[5];
        for (int j = 0; j < 5; j++) { /* rotate who goes first */
            int s = (j + r) % 5;
            v[s] = 0;
            for (int pass = 0; pass < 3; pass++) v[s] += read_chunks(set[s], count[s]) / 3;
            sum[s] += v[s];
        }
        printf("round %3d: low %.1f mid %.1f high %.1f files %.1f spread %.1f GB/s\n", r, v[0], v[1], v[2], v[3], v[4]);
        fflush(stdout);
    }
    printf("mean:      low %.1f mid %.1f high %.1f files %.1f spread %.1f GB/s\n", sum[0] / rounds, sum[1] / rounds, sum[2] / rounds, sum[3] / rounds, sum[4] / rounds);
}

int main(int argc, char **argv) {
    pagemap = open("/proc/self/pagemap", O_RDONLY);
    if (pagemap < 0) { perror("/proc/self/pagemap"); return 1; }
    if (argc >= 4 && !strcmp(argv[1], "map")) map_speeds((size_t)atol(argv[2]), atoi(argv[3]));
    else if (argc >= 4 && !strcmp(argv[1], "sets")) set_speeds(atoi(argv[2]), argc - 3, argv + 3);
    else { fprintf(stderr, "usage: placement map GB ROUNDS | placement sets ROUNDS FILE...\n"); return 1; }
    return 0;
}
