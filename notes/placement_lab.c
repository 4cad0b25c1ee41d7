/* placement_lab.c - the eleventh session's question: on this VM, does a streaming read's speed
 * depend on WHERE the memory is (its guest-physical address), not only on the moment?
 * Not part of the build or the tests. Needs root (PFNs in /proc/self/pagemap read as 0
 * otherwise) and an AVX-512 CPU:
 *   gcc -std=gnu11 -O2 -fopenmp -o /tmp/placement notes/placement_lab.c -lm
 *   /tmp/placement map 16 6           read speed of each 256 MB of a 16 GB allocation,
 *                                     grouped by guest-physical address, 6 rounds rotating
 *   /tmp/placement sets 200 FILE...   1 GB from the lowest-, middle- and highest-addressed
 *                                     2 MB chunks of a 12 GB allocation, the page cache
 *                                     holding FILE..., and as many anonymous chunks as the
 *                                     files have, spread evenly through the allocation: the
 *                                     five reads rotate every round
 *   /tmp/placement ranges 10 FILE...  one thread times each 2 MB chunk on its own: a fresh
 *                                     4 GB anonymous allocation, the page cache holding
 *                                     FILE..., and an anonymous copy of FILE... read() into
 *                                     2 MB pages (what glm --no-mmap does); all chunks in a
 *                                     new random order every round. Prints each set's mean
 *                                     of per-chunk medians, their histogram, and how well a
 *                                     chunk's speed in even rounds predicts it in odd ones
 *                                     (a correlation near 0: the moment; near 1: the place).
 *                                     After each read, a TLB probe of the same chunk: a chain
 *                                     of dependent loads, one line in each of its 512 4 KB
 *                                     pages, all in L1, so a hop costs what the TLB costs (a
 *                                     chunk the host backs with 4 KB pages misses the L1 TLB
 *                                     at every hop); printed as each set's mean of per-chunk
 *                                     medians and its correlation with the chunk's speed
 * Each read: both threads take 2 MB chunks in turn (like glm bench's 8 MB pieces), four
 * independent 64-byte XOR chains per thread, no software prefetch (glm bench's yardstick). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <immintrin.h>
#include <math.h>
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

/* One streaming read of a 2 MB chunk; the XOR of its words, so the loads are not dropped. */
__attribute__((target("avx512f"))) static long read_chunk(const uint8_t *p) {
    const __m512i *q = (const __m512i *)p;
    __m512i a = _mm512_setzero_si512(), b = a, d = a, e = a;
    for (size_t k = 0; k < CHUNK / 64; k += 4) {
        a = _mm512_xor_si512(a, q[k]); b = _mm512_xor_si512(b, q[k + 1]);
        d = _mm512_xor_si512(d, q[k + 2]); e = _mm512_xor_si512(e, q[k + 3]);
    }
    return _mm512_reduce_add_epi64(_mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(d, e)));
}

/* GB/s of one streaming read of the n chunks c[0..n). */
static double read_chunks(const Chunk *c, int n) {
    long sink = 0;
    double t0 = now();
#pragma omp parallel for schedule(dynamic, 1) reduction(^ : sink)
    for (int i = 0; i < n; i++) sink ^= read_chunk(c[i].p);
    double t = now() - t0;
    volatile long keep = sink;
    (void)keep;
    return (double)n * CHUNK / t / 1e9;
}

/* n bytes of anonymous memory, 2 MB-aligned and asked onto 2 MB pages (not yet touched) */
static uint8_t *anonymous_2mb(size_t n) {
    uint8_t *raw = mmap(NULL, n + CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) { perror("mmap"); exit(1); }
    uint8_t *b = (uint8_t *)(((uintptr_t)raw + CHUNK - 1) & ~(uintptr_t)(CHUNK - 1));
    madvise(b, n, MADV_HUGEPAGE);
    return b;
}

/* n bytes of anonymous memory on 2 MB pages, written, as chunks sorted by guest-physical address */
static Chunk *anonymous_chunks(size_t n) {
    uint8_t *b = anonymous_2mb(n);
    memset(b, 1, n);
    Chunk *c = malloc(n / CHUNK * sizeof(Chunk));
    for (size_t i = 0; i < n / CHUNK; i++) { c[i].p = b + i * CHUNK; c[i].pfn = pfn_of(c[i].p); }
    qsort(c, n / CHUNK, sizeof(Chunk), by_pfn);
    return c;
}

/* The files as 2 MB chunks: copy = 0, the page cache holding them (each file mapped 2 MB-aligned,
 * paged in); copy = 1, an anonymous copy read() into 2 MB pages, as glm --no-mmap loads them. */
static Chunk *file_chunks(int nf, char **files, int copy, int *count) {
    Chunk *c = NULL;
    int n = 0;
    for (int f = 0; f < nf; f++) {
        int fd = open(files[f], O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) { perror(files[f]); exit(1); }
        size_t len = (size_t)st.st_size & ~(CHUNK - 1);
        if (len == 0) { close(fd); continue; }
        uint8_t *m;
        if (copy) {
            m = anonymous_2mb(len);
            for (size_t o = 0; o < len;) {
                ssize_t k = read(fd, m + o, len - o < ((size_t)64 << 20) ? len - o : (size_t)64 << 20);
                if (k <= 0) { perror(files[f]); exit(1); }
                o += (size_t)k;
            }
        } else {
            uint8_t *raw = mmap(NULL, len + CHUNK, PROT_READ, MAP_SHARED, fd, 0); /* an aligned hole */
            munmap(raw, len + CHUNK);
            m = mmap((void *)(((uintptr_t)raw + CHUNK - 1) & ~(uintptr_t)(CHUNK - 1)), len, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
            madvise(m, len, MADV_HUGEPAGE);
            volatile uint8_t touch = 0;
            for (size_t i = 0; i < len; i += 4096) touch ^= m[i];
        }
        close(fd);
        c = realloc(c, (n + len / CHUNK) * sizeof(Chunk));
        for (size_t i = 0; i < len; i += CHUNK) { c[n].p = m + i; c[n].pfn = pfn_of(m + i); n++; }
    }
    *count = n;
    return c;
}

static int by_float(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return x < y ? -1 : x > y; }

/* Pearson correlation of x[0..n) and y[0..n). */
static double correlation(const double *x, const double *y, int n) {
    double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
    for (int i = 0; i < n; i++) { sx += x[i]; sy += y[i]; sxx += x[i] * x[i]; syy += y[i] * y[i]; sxy += x[i] * y[i]; }
    return (sxy / n - sx * sy / n / n) / sqrt((sxx / n - sx * sx / n / n) * (syy / n - sy * sy / n / n));
}

/* ns per hop of a chain of dependent loads through the lines at p + hop[0..512): one line in
 * each 4 KB page of the chunk, at different offsets so all 512 fit L1's sets. The chain is
 * walked once untimed (into L1), then 20 times timed; `v & zero` makes each address depend on
 * the load before it without changing it. */
static uint32_t hop[512];
static volatile uint64_t zero;
static double tlb_probe(const uint8_t *p) {
    uint64_t z = zero, v = 0;
    for (int i = 0; i < 512; i++) v += *(const volatile uint64_t *)(p + hop[i] + (v & z));
    double t0 = now();
    for (int r = 0; r < 20; r++)
        for (int i = 0; i < 512; i++) v += *(const uint64_t *)(p + hop[i] + (v & z));
    double t = now() - t0;
    zero += v & z;
    return t / (20 * 512) * 1e9;
}

static float median_of(float *v, int n) { qsort(v, n, sizeof *v, by_float); return v[n / 2]; }

/* Each chunk's own read speed on one thread, the chunks of all sets in a new random order
 * every round, so a set's figure is not one moment of the host's. */
static void range_speeds(int rounds, int nf, char **files) {
    enum { SETS = 3 };
    int count[SETS];
    Chunk *set[SETS];
    const char *name[SETS] = {"anonymous", "page cache", "copy"};
    count[0] = (int)(((size_t)4 << 30) / CHUNK);
    set[0] = anonymous_chunks((size_t)4 << 30);
    set[1] = file_chunks(nf, files, 0, &count[1]);
    set[2] = file_chunks(nf, files, 1, &count[2]);
    int total = count[0] + count[1] + count[2];
    const uint8_t **p = malloc(total * sizeof *p);
    int *owner = malloc(total * sizeof *owner), *order = malloc(total * sizeof *order);
    float *gbs = malloc((size_t)total * rounds * sizeof *gbs); /* [chunk][round] */
    float *ns = malloc((size_t)total * rounds * sizeof *ns);   /* [chunk][round]: TLB probe */
    for (int s = 0, t = 0; s < SETS; s++)
        for (int i = 0; i < count[s]; i++, t++) { p[t] = set[s][i].p; owner[t] = s; }
    uint64_t rng = 88172645463325252ull;
    for (int i = 0; i < 512; i++) hop[i] = (uint32_t)(i * 4096 + i * 64 % 4096);
    for (int i = 511; i > 0; i--) { /* a random walk through the pages, not one the prefetcher follows */
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        int j = (int)(rng % (uint64_t)(i + 1));
        uint32_t x = hop[i]; hop[i] = hop[j]; hop[j] = x;
    }
    long sink = 0;
    for (int r = 0; r < rounds; r++) {
        for (int t = 0; t < total; t++) order[t] = t;
        for (int t = total - 1; t > 0; t--) { /* Fisher-Yates with xorshift64 */
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            int j = (int)(rng % (uint64_t)(t + 1)), x = order[t];
            order[t] = order[j]; order[j] = x;
        }
        for (int t = 0; t < total; t++) {
            int c = order[t];
            double t0 = now();
            sink ^= read_chunk(p[c]);
            gbs[(size_t)c * rounds + r] = (float)(CHUNK / (now() - t0) / 1e9);
            ns[(size_t)c * rounds + r] = (float)tlb_probe(p[c]);
        }
    }
    volatile long keep = sink;
    (void)keep;
    double *even = malloc(total * sizeof *even), *odd = malloc(total * sizeof *odd);
    double *speed = malloc(total * sizeof *speed), *probe = malloc(total * sizeof *probe);
    for (int s = 0; s < SETS; s++) {
        double sum = 0, probe_sum = 0;
        int bins[20] = {0}, m = 0;
        for (int t = 0; t < total; t++) {
            if (owner[t] != s) continue;
            float *v = gbs + (size_t)t * rounds;
            even[m] = odd[m] = 0;
            for (int r = 0; r < rounds; r++) *(r % 2 ? &odd[m] : &even[m]) += v[r];
            even[m] /= (rounds + 1) / 2; odd[m] /= rounds / 2;
            speed[m] = median_of(v, rounds);
            probe[m] = median_of(ns + (size_t)t * rounds, rounds);
            sum += speed[m];
            probe_sum += probe[m];
            bins[speed[m] >= 100 ? 19 : (int)(speed[m] / 5)]++;
            m++;
        }
        printf("%-10s %5d MB: per-chunk median %.1f GB/s (mean), even/odd rounds correlation %.2f; TLB probe %.2f ns/hop (mean), correlation with speed %.2f; chunks by GB/s:",
               name[s], 2 * m, sum / m, correlation(even, odd, m), probe_sum / m, correlation(speed, probe, m));
        for (int b = 0; b < 20; b++) if (bins[b]) printf(" %d-%d:%d", 5 * b, 5 * b + 5, bins[b]);
        printf("\n");
    }
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
    Chunk *w = file_chunks(nf, files, 0, &nw);
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
    else if (argc >= 4 && !strcmp(argv[1], "ranges") && atoi(argv[2]) >= 2) range_speeds(atoi(argv[2]), argc - 3, argv + 3);
    else { fprintf(stderr, "usage: placement map GB ROUNDS | placement sets ROUNDS FILE... | placement ranges ROUNDS FILE...\n"); return 1; }
    return 0;
}
