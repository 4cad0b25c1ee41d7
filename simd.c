/* simd.c - AVX-512 versions of the fast path's hot loops (fast.c; the plain ops are glm.c's), chosen at run time.
 *
 * Each kernel computes what the plain C loop in glm.c computes (same products, same
 * fp32 accumulation, only the summation order differs; the bf16 kernels: the same on
 * activations rounded to bf16), so the plain loops stay the
 * readable reference and tests/test_kernels.sh checks every kernel against them on
 * random inputs, including lengths that are not multiples of the vector width.
 *
 * Decode is memory-bound: a matrix-vector product must turn each weight byte into
 * a float and multiply it faster than memory delivers it. The tricks:
 *   BF16   a bf16 is the top half of an fp32: zero-extend and shift by 16 (two in a
 *          dword: one shift widens the low one, one mask the high one).
 *   FP8    E4M3 -> fp32 by bit placement: sign to bit 31, the 7 magnitude bits to
 *          bits 26..20. That float is the E4M3 value times 2^-120, subnormals
 *          included. Decode places the bytes with in-lane shuffles (vpshufb) and
 *          scales x by 2^64 instead of each weight by 2^120 (measured 1.3-1.4x
 *          faster decode than widening through fp16); elsewhere one multiply
 *          by 2^120 makes it exact.
 *   MXFP4  the 16 E2M1 values fit one 512-bit register: vpermps looks up 16 nibbles
 *          at once. x is pre-split per 32-block into its 16 even and 16 odd
 *          elements to match the low/high nibbles of the packed bytes (and, in
 *          the fp32 kernels, BF16's low and high words).
 * With bf16 products (the default where vdpbf16ps outpaces FMA), decode skips the fp32
 * widening altogether: x is rounded to bf16 and vdpbf16ps takes the weights as (nearly)
 * stored; see "Decode with bf16 activations" below.
 * One row at a time: each thread then reads one sequential stream, which the memory
 * system serves best (four interleaved rows measured slower from mmap'd 4 KB pages);
 * BF16 rows too wide for x to stay in L1 included (see matvec_bf16_avx512).
 *
 * GLM_KERNELS=c forces the plain loops, GLM_KERNELS=avx2 the AVX2 set (the fallback
 * for CPUs without AVX-512), otherwise the best the CPU has is taken.
 */
#include "glm.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Column of x at position p of matvec_split_x's order for W: MXFP4 and BF16 split each
 * whole 32-block into its 16 even then 16 odd columns (the low and high nibbles of MXFP4's
 * 16 bytes; the low and high halves of BF16's 16 words, each widened by one shift or one
 * mask); a BF16 row's last partial block and the other formats keep x's order. */
static int split_column(const Mat *W, int p) {
    const int split = W->fmt == WF_MXFP4 || (W->fmt == WF_BF16 && p < W->cols / 32 * 32);
    return split ? p / 32 * 32 + 2 * (p % 16) + (p % 32) / 16 : p;
}

/* xs = x as the fp32 SIMD matvec reads it for W's format (split_column's order). */
void matvec_split_x(const Mat *W, const float *x, float *xs) {
    if (W->fmt != WF_MXFP4 && W->fmt != WF_BF16) return; /* read as x */
    for (int p = 0; p < W->cols; p++) xs[p] = x[split_column(W, p)];
}

/* The n tokens' x (token t at x + (rows ? rows[t] : t)*ldx) as kernels.matvec_n_packed
 * reads them: in groups of PACK_GROUP tokens (the last may have fewer), each group
 * vector by vector, the group's tokens side by side, 16 floats each: float j of vector v
 * of token g of a group of G at (v*G + g)*16 + j. A vector holds positions 16v.. of x in
 * matvec_split_x's order for W, zeros past the row's end.
 * One pointer with constant offsets then reaches every token's x: a kernel that sums
 * eight tokens has no general registers to spare for eight pointers. */
void pack_tokens_x(const Mat *W, const float *x, size_t ldx, const int *rows, int n, float *xp) {
    const int nv = (W->cols + 15) / 16;
    for (int t0 = 0; t0 < n; t0 += PACK_GROUP) {
        const int G = n - t0 < PACK_GROUP ? n - t0 : PACK_GROUP;
        float *group = xp + (size_t)t0 * nv * 16;
        for (int g = 0; g < G; g++) {
            const float *xt = x + (size_t)(rows ? rows[t0 + g] : t0 + g) * ldx;
            for (int p = 0; p < 16 * nv; p++) group[((size_t)(p / 16) * G + g) * 16 + p % 16] = p < W->cols ? xt[split_column(W, p)] : 0.0f;
        }
    }
}

/* Column of x that position p of the prepared vector holds (past the matrix: >= cols). */
static int bf16_x_column(WeightFormat fmt, int p) {
    if (fmt == WF_FP8) /* per 64 columns: the 32 even ones, then the 32 odd ones */
        return p / 64 * 64 + 2 * (p % 32) + (p % 64) / 32;
    if (fmt == WF_MXFP4) /* per 128 columns: word j of vector v (32 words each) is column 4j + v */
        return p / 128 * 128 + 4 * (p % 32) + (p % 128) / 32;
    return p;
}

void matvec_order_bf16(const Mat *W, const float *x, float *xs) {
    const int n = W->cols, np = (n + 127) & ~127;
    if (W->fmt == WF_BF16) { /* in order: a copy, not the column-by-column loop below (one
                              * thread runs this before each product; W_UV's pool has 64 x's) */
        memcpy(xs, x, (size_t)n * sizeof(float));
        memset(xs + n, 0, (size_t)(np - n) * sizeof(float));
        return;
    }
    const float mult = W->fmt == WF_FP8 ? 0x1p64f : 1.0f; /* exact: a power of two */
    for (int p = 0; p < np; p++) {
        int c = bf16_x_column(W->fmt, p);
        xs[p] = c < n ? x[c] * mult : 0.0f;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

AVX512 static inline __m512 bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

AVX512 static inline __m512 bf16x16_masked(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* E4M3 bytes -> fp32 values (see the header comment; decode uses the fp16 route below). The bit-placed float is the
 * value times 2^-120 and may be an fp32 subnormal; multiplying by 2^120 at once keeps
 * every later product normal (subnormal arithmetic is slow on some CPUs). */
AVX512 static inline __m512 fp8x16(__m128i bytes) {
    __m512i d = _mm512_cvtepi8_epi32(bytes);
    __m512 tiny = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(d, 20), _mm512_set1_epi32((int)0x87F00000u)));
    return _mm512_mul_ps(tiny, _mm512_set1_ps(0x1p120f));
}

AVX512 static float dot_f32_avx512(const float *a, const float *b, int n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* e^x for 16 floats. x = k·ln2 + r with k an integer and |r| <= ln2/2, so e^x = 2^k · e^r;
 * e^r is its Taylor series to r^7 (the first term left out, r^8/8! < 2^-33 here, is under
 * a hundredth of an fp32 step) and scalef multiplies by 2^k without overflow or a
 * subnormal trap. ln2 is split in two (Cody and Waite) so that k·ln2_hi is exact. Inputs
 * below -104 give 0 (e^-104 is under the smallest subnormal); NaN stays NaN. */
AVX512 static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x); /* max(c, NaN) is NaN */
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x); /* ln2_hi: 9 significant bits */
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);      /* ln2 - ln2_hi */
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

/* x = softmax(x): the plain loop in glm.c (softmax) with 16 lanes, e^x as exp16, and one
 * multiply by 1/sum in place of n divisions. Attention takes a softmax over up to 2048
 * selected keys per head and token: scalar, its expf alone was 2.4% of a 4096-token
 * prefill's samples; 16 lanes made 4096-token prefills ~8% faster. Within 5e-7 of double
 * exp, relative (tests/kernels_test.c). */
AVX512 static void softmax_avx512(float *x, int n) {
    __m512 mx = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
    const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1);
    mx = _mm512_mask_max_ps(mx, tail, mx, _mm512_maskz_loadu_ps(tail, x + i));
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
        _mm512_storeu_ps(x + i, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (tail) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + i), m));
        _mm512_mask_storeu_ps(x + i, tail, e);
        sum = _mm512_mask_add_ps(sum, tail, sum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
    if (tail) _mm512_mask_storeu_ps(x + i, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), inv));
}

/* The indexer's score of n keys (glm.c, index_relu_sums): a key's 32 head products are
 * two vectors, so its weighted ReLU sum is 2 multiplies, 2 maxes, a multiply and an FMA and
 * one horizontal add, where the scalar loop took ~4 operations per head. Scalar, it was
 * 5.6% of a 4096-token prefill's samples. */
AVX512 static void index_relu_sums_avx512(const float *d, int n, const float *wh, float q_scale, float *out) {
    const __m512 w0 = _mm512_loadu_ps(wh), w1 = _mm512_loadu_ps(wh + 16), qs = _mm512_set1_ps(q_scale), zero = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        __m512 a = _mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(d + (size_t)j * 32), qs), zero);
        __m512 b = _mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(d + (size_t)j * 32 + 16), qs), zero);
        out[j] = _mm512_reduce_add_ps(_mm512_fmadd_ps(a, w0, _mm512_mul_ps(b, w1)));
    }
}

AVX512 static void axpy_f32_avx512(float *y, float a, const float *x, int n) {
    __m512 av = _mm512_set1_ps(a);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* Software prefetch ahead in a row's stream, into L2 (hint T2). The hardware prefetcher
 * stops at each 4 KB page and the out-of-order window holds only a few KB of loads, so
 * without help the memory system idles at every page boundary. Into L2, not L1: a core
 * tracks only a few dozen L1 misses, and prefetches holding them cap a thread's stream.
 * The distance depends on the loop's instructions per byte: FP8 and MXFP4 rows (~10
 * instructions per 64 bytes) want 8 KB; BF16 rows (~4) are kept up with by the hardware
 * prefetcher, and a software prefetch only slowed them. -DAHEAD_BF16=... (and the
 * others) rebuild with another distance to re-measure on a new machine. */
#define PREFETCH_AHEAD 4096
#define PREFETCH(p) _mm_prefetch((const char *)(p) + PREFETCH_AHEAD, _MM_HINT_T2)
#define PREFETCH_AT(p, ahead) do { if ((ahead) > 0) _mm_prefetch((const char *)(p) + (ahead), _MM_HINT_T2); } while (0) /* ahead 0: none */
#ifndef AHEAD_BF16 /* overridable (-DAHEAD_BF16=...) to re-measure them */
#define AHEAD_BF16 0
#endif
#ifndef AHEAD_FP8
#define AHEAD_FP8 8192
#endif
#ifndef AHEAD_MXFP4
#define AHEAD_MXFP4 8192
#endif
/* Besides, every decode row asks for one line 64 KB ahead of itself (AHEAD_FAR), and
 * BF16 rows (which have no per-line prefetch) one at every 4 KB of the row: the hardware
 * prefetcher works on physical pages, and a load 64 KB ahead starts the next page's
 * stream (and any page walk it needs) early. In glm bench this took decode from ~0.88 to
 * ~0.95 of the read bandwidth, and the per-page line of BF16 rows a further ~5%. FP8 and
 * MXFP4 rows already touch each page 8 KB ahead with their per-line prefetch. */
#ifndef AHEAD_FAR
#define AHEAD_FAR 65536
#endif
/* FP8 for decode, 16 bytes at a time with in-lane shuffles only: the 16 bytes are copied to
 * each 128-bit lane, vpshufb puts byte i at the top of 32-bit lane i (zeros below), an
 * arithmetic shift by 4 moves the 7 magnitude bits to 26..20 and the sign copies over
 * 30..27, which the mask clears. That is the fp32 of (E4M3 value) x 2^-120, as in
 * fp8x16 (subnormals included); x * 2^64 and 2^56 on the sum put it back without the
 * products going subnormal (those below 2^-70 would; they are zero for any purpose). */
AVX512 static inline __m512 fp8x16_placed(const uint8_t *p) {
    const __m512i to_top = _mm512_set_epi8(15, -1, -1, -1, 14, -1, -1, -1, 13, -1, -1, -1, 12, -1, -1, -1,
                                           11, -1, -1, -1, 10, -1, -1, -1, 9, -1, -1, -1, 8, -1, -1, -1,
                                           7, -1, -1, -1, 6, -1, -1, -1, 5, -1, -1, -1, 4, -1, -1, -1,
                                           3, -1, -1, -1, 2, -1, -1, -1, 1, -1, -1, -1, 0, -1, -1, -1);
    __m512i top = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p)), to_top);
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_srai_epi32(top, 4), _mm512_set1_epi32((int)0x87F00000u)));
}

/* ---- Weight products in fp32 (--fp32; the default where vdpbf16ps is no faster than FMA) ----
 *
 * One token's sums and a few tokens' sums take the same operations in the same order, so
 * a token's result does not depend on the tokens beside it (glm serve's batches, the
 * --draft verify pass). Each (row, token) keeps two 16-lane sums and y = reduce(sum 0 +
 * sum 1); per format, what goes into them:
 *   BF16   per 32-block, its 16 words at even columns widened (a shift) times x's evens
 *          into sum 0, the 16 at odd columns (a mask) times the odds into sum 1
 *          (matvec_split_x); the row's last partial block in order: columns 16..31 of it
 *          into sum 1.
 *   FP8    vector v of the row (columns 16v..16v+15), the bit-placed weight (E4M3 x
 *          2^-120, fp8x16_placed), into sum v & 1, against x' = x * scale * 2^64 for the
 *          row's 128x128 scale block: the scale costs one multiply per column every 128
 *          rows instead of one per weight, and 2^56 on the sum puts the powers of two back.
 *   MXFP4  per 32-block, the 16 E2M1 values times the block's scale (exact: a power of two)
 *          are the table vpermps looks up; the low nibbles (even columns) go into sum 0
 *          against x's evens, the high nibbles into sum 1 against the odds (matvec_split_x).
 *   F32    (the router) as FP8, the weights as they are.
 * Several tokens share each decoded weight vector, up to F32_GROUP of them (16 sums in
 * registers), their x interleaved by pack_tokens_x. Eight tokens' x no longer fit L1 together
 * (8 x 24 KB at 6144 columns), so such a pass goes over chunks of rows a block of columns
 * at a time: the block's x stays in L1 for all the chunk's rows while their sums wait in
 * memory. */
#define F32_GROUP PACK_GROUP /* tokens per pass over a row (8) */
#define F32_L1_FLOATS 8192   /* the floats of x (32 KB) an unblocked pass of several tokens may read */
/* Overridable (-DF32_CHUNK_ROWS=...) to re-measure them. 8 to 32 rows by 256 to 1024 columns
 * measured alike within the host's noise; 16 x 512 keeps a block's x (16 KB at 8 tokens)
 * and the chunk's sums (16 KB) in L1 together. The weights two pieces ahead (a piece: one
 * row's part of a block) are fetched into L1 meanwhile; 4 and 8 pieces measured slower. */
#ifndef F32_CHUNK_ROWS
#define F32_CHUNK_ROWS 16  /* rows per chunk of a blocked pass */
#endif
#ifndef F32_BLOCK_COLS
#define F32_BLOCK_COLS 512 /* columns per block of a blocked pass (a multiple of 32) */
#endif
#ifndef F32_AHEAD
#define F32_AHEAD 2        /* pieces ahead */
#endif
#define MV32 AVX512 static inline __attribute__((always_inline)) void

typedef struct { __m512 s[F32_GROUP][2]; } RowSums; /* one row's two sums for each token */

/* the lanes of a 16-float vector holding nj (<= 0: none, >= 16: all) elements */
static inline __mmask16 row_mask(int nj) { return nj >= 16 ? 0xFFFF : nj <= 0 ? 0 : (__mmask16)((1u << nj) - 1); }

AVX512 static inline __m512 fp8x16_placed_masked(const uint8_t *p, __mmask16 m) {
    uint8_t b[16] = {0};
    for (int i = 0; i < 16; i++) if (m >> i & 1) b[i] = p[i];
    return fp8x16_placed(b);
}

/* The G tokens' FMAs for 32 columns: a0[g] += w0 · (token g's vector at x), a1[g] += w1 ·
 * (its next one); x interleaved (pack_tokens_x). */
MV32 fma_tokens(__m512 w0, __m512 w1, const float *x, __m512 *a0, __m512 *a1, const int G) {
    #pragma GCC unroll 8
    for (int g = 0; g < G; g++) {
        a0[g] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + 16 * g), a0[g]);
        a1[g] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16 * (G + g)), a1[g]);
    }
}

/* The same for a row's last 1..31 columns: m0, m1 (row_mask of them and of 16 fewer) mask
 * the two vectors, and sum 1 is left alone when the second is empty. */
MV32 fma_tokens_tail(__m512 w0, __m512 w1, __mmask16 m0, __mmask16 m1, const float *x, __m512 *a0, __m512 *a1, const int G) {
    #pragma GCC unroll 8
    for (int g = 0; g < G; g++) {
        a0[g] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m0, x + 16 * g), a0[g]);
        if (m1) a1[g] = _mm512_fmadd_ps(w1, _mm512_maskz_loadu_ps(m1, x + 16 * (G + g)), a1[g]);
    }
}

/* The per-format loops of row_sums: sums a0, a1 of G tokens over row r's columns [k, k1),
 * x interleaved from the vector at k on (x += 32*G per 32 columns); pf: see row_sums. */
#define F32_LOOP_ARGS const Mat *W, int r, int k, int k1, const float *x, const uint8_t *pf, __m512 *a0, __m512 *a1, const int G
MV32 sums_bf16(F32_LOOP_ARGS) {
    const uint16_t *w = (const uint16_t *)W->w + (size_t)r * W->cols;
    const uint8_t *p = pf;
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    for (; k + 32 <= k1; k += 32, x += 32 * G) { /* x split: evens, then odds */
        if (pf) { _mm_prefetch((const char *)p, _MM_HINT_T0); p += 64; }
        else PREFETCH(w + k);
        const __m512i pairs = _mm512_loadu_si512(w + k); /* word 2i: column 2i, in a dword's low half */
        fma_tokens(_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)), _mm512_castsi512_ps(_mm512_and_si512(pairs, high)), x, a0, a1, G);
    }
    if (k < k1) { /* the last partial block in x's own order: vector 2j into sum 0, 2j+1 into sum 1 */
        const __mmask16 m0 = row_mask(k1 - k), m1 = row_mask(k1 - k - 16);
        fma_tokens_tail(bf16x16_masked(w + k, m0), bf16x16_masked(w + k + 16, m1), m0, m1, x, a0, a1, G);
    }
}

MV32 sums_f32(F32_LOOP_ARGS) {
    const float *w = (const float *)W->w + (size_t)r * W->cols;
    const uint8_t *p = pf;
    for (; k + 32 <= k1; k += 32, x += 32 * G) {
        if (pf) { _mm_prefetch((const char *)p, _MM_HINT_T0); _mm_prefetch((const char *)p + 64, _MM_HINT_T0); p += 128; }
        else { PREFETCH(w + k); PREFETCH(w + k + 16); }
        fma_tokens(_mm512_loadu_ps(w + k), _mm512_loadu_ps(w + k + 16), x, a0, a1, G);
    }
    if (k < k1) {
        const __mmask16 m0 = row_mask(k1 - k), m1 = row_mask(k1 - k - 16);
        fma_tokens_tail(_mm512_maskz_loadu_ps(m0, w + k), _mm512_maskz_loadu_ps(m1, w + k + 16), m0, m1, x, a0, a1, G);
    }
}

MV32 sums_fp8(F32_LOOP_ARGS) {
    const uint8_t *w = W->w + (size_t)r * W->cols;
    const uint8_t *p = pf;
    for (; k + 32 <= k1; k += 32, x += 32 * G) {
        if (pf) { if (k % 64 == 0) _mm_prefetch((const char *)p, _MM_HINT_T0); p += 32; }
        else PREFETCH(w + k);
        fma_tokens(fp8x16_placed(w + k), fp8x16_placed(w + k + 16), x, a0, a1, G);
    }
    if (k < k1) {
        const __mmask16 m0 = row_mask(k1 - k), m1 = row_mask(k1 - k - 16);
        fma_tokens_tail(fp8x16_placed_masked(w + k, m0), fp8x16_placed_masked(w + k + 16, m1), m0, m1, x, a0, a1, G);
    }
}

/* Each E2M1 value times each E8M0 scale (the products are exact): a block's table is one
 * load instead of a broadcast and a multiply. A few tokens' MXFP4 sums are bound by the
 * vector ports, not by memory (per 32 weights: the decode's 4 instructions and 2 FMAs per
 * token), so the multiply was one instruction in 7-9. Filled by kernels_init. */
static float mx_e2m1_scaled[256][16] __attribute__((aligned(64)));

/* One MXFP4 block as fp32: its 16 bytes w (scale byte sc) -> lo, the values of the low
 * nibbles (even columns), and hi, those of the high nibbles (odd columns). */
AVX512 static inline void mxfp4x32(const uint8_t *w, uint8_t sc, __m512 *lo, __m512 *hi) {
    const __m512 table = _mm512_load_ps(mx_e2m1_scaled[sc]);
    const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)w));
    *lo = _mm512_permutexvar_ps(d, table);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), table);
}

MV32 sums_mxfp4(F32_LOOP_ARGS) { /* columns a multiple of 32 */
    const uint8_t *w = W->w + (size_t)r * (W->cols / 2), *sc = W->mx_scale + (size_t)r * (W->cols / 32);
    const uint8_t *p = pf;
    for (; k < k1; k += 32, x += 32 * G) {
        if (pf) { if (k % 128 == 0) _mm_prefetch((const char *)p, _MM_HINT_T0); p += 16; }
        else PREFETCH(w + k / 2);
        __m512 lo, hi;
        mxfp4x32(w + k / 2, sc[k / 32], &lo, &hi);
        fma_tokens(lo, hi, x, a0, a1, G);
    }
}

/* One token's sums of rows r and r + 1 of an MXFP4 matrix, whole rows, into s0 and s1:
 * each row's operations those of sums_mxfp4 in the same order, so each row's sums are bit
 * for bit its own. One row alone is two chains of
 * FMAs, each waiting ~4 cycles for the last: a lone token's MXFP4 row then runs at 16 bytes
 * per 4 cycles a core (~8 GB/s measured in L2), below a core's share of the memory's
 * bandwidth; two rows make four chains. */
AVX512 static __attribute__((noinline)) void row_sums2_mxfp4_1(const Mat *W, int r, const float *x, RowSums *s0, RowSums *s1) {
    const int n = W->cols;
    const uint8_t *w0 = W->w + (size_t)r * (n / 2), *w1 = w0 + n / 2, *sc0 = W->mx_scale + (size_t)r * (n / 32), *sc1 = sc0 + n / 32;
    __m512 a00 = s0->s[0][0], a01 = s0->s[0][1], a10 = s1->s[0][0], a11 = s1->s[0][1];
    for (int k = 0; k < n; k += 32, x += 32) {
        PREFETCH(w0 + k / 2);
        PREFETCH(w1 + k / 2);
        __m512 lo0, hi0, lo1, hi1;
        mxfp4x32(w0 + k / 2, sc0[k / 32], &lo0, &hi0);
        mxfp4x32(w1 + k / 2, sc1[k / 32], &lo1, &hi1);
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        a00 = _mm512_fmadd_ps(lo0, x0, a00);
        a01 = _mm512_fmadd_ps(hi0, x1, a01);
        a10 = _mm512_fmadd_ps(lo1, x0, a10);
        a11 = _mm512_fmadd_ps(hi1, x1, a11);
    }
    s0->s[0][0] = a00; s0->s[0][1] = a01; s1->s[0][0] = a10; s1->s[0][1] = a11;
}

/* row_sums: adds row r's columns [k0, k1) for G tokens into *sums: the format's loop (sums_*), q the
 * tokens' x as pack_tokens_x lays them out (one token: x itself, or matvec_split_x's xs),
 * k0 a multiple of 32 and so is k1 unless it is the row's end. pf: the weights to fetch
 * into L1 meanwhile (a later piece of a blocked pass), or NULL for a whole row, which
 * fetches its own stream ahead. One function for each format and G: inlined into the row
 * loops, GCC kept one of the 16 sums in memory (a store and a load on the FMA chain of
 * every iteration, which then took ~13 cycles instead of ~10). */
#define ROW_SUMS_FMT(G, F)                                                                                                  \
    AVX512 static __attribute__((noinline)) void row_sums_##F##_##G(const Mat *W, int r, int k0, int k1, const float *q,     \
                                                                     const uint8_t *pf, RowSums *sums) {                    \
        __m512 a0[F32_GROUP], a1[F32_GROUP];                                                                                \
        _Pragma("GCC unroll 8") for (int g = 0; g < G; g++) { a0[g] = sums->s[g][0]; a1[g] = sums->s[g][1]; }             \
        sums_##F(W, r, k0, k1, q + (size_t)(k0 / 16) * G * 16, pf, a0, a1, G);                                              \
        _Pragma("GCC unroll 8") for (int g = 0; g < G; g++) { sums->s[g][0] = a0[g]; sums->s[g][1] = a1[g]; }             \
    }
#define ROW_SUMS(G) ROW_SUMS_FMT(G, f32) ROW_SUMS_FMT(G, bf16) ROW_SUMS_FMT(G, fp8) ROW_SUMS_FMT(G, mxfp4)
ROW_SUMS(1) ROW_SUMS(2) ROW_SUMS(3) ROW_SUMS(4) ROW_SUMS(5) ROW_SUMS(6) ROW_SUMS(7) ROW_SUMS(8)
typedef void RowSumsFn(const Mat *W, int r, int k0, int k1, const float *q, const uint8_t *pf, RowSums *sums);
#define ROW_SUMS_ROW(F) {row_sums_##F##_1, row_sums_##F##_2, row_sums_##F##_3, row_sums_##F##_4, \
                         row_sums_##F##_5, row_sums_##F##_6, row_sums_##F##_7, row_sums_##F##_8}
static RowSumsFn *const row_sums_fn[4][F32_GROUP] = {ROW_SUMS_ROW(f32), ROW_SUMS_ROW(bf16), ROW_SUMS_ROW(fp8), ROW_SUMS_ROW(mxfp4)};
static inline void row_sums_g(const Mat *W, int r, int k0, int k1, const float *q, const uint8_t *pf, RowSums *sums, int G) {
    row_sums_fn[W->fmt][G - 1](W, r, k0, k1, q, pf, sums);
}

/* FP8's x' for the rows of scale block rb: q (G tokens interleaved) times
 * scale[rb][column / 128] * 2^64, into xq (one token's x is x itself: its last vector
 * may be partial). */
AVX512 static void fp8_x_scaled(const Mat *W, int rb, const float *q, float *xq, int G) {
    const int n = W->cols, nb = (n + 127) / 128;
    const float *scale = W->fp8_scale + (size_t)rb * nb;
    for (int k = 0; k < n; k += 16) {
        const __mmask16 m = row_mask(n - k);
        const __m512 s = _mm512_set1_ps(scale[k / 128] * 0x1p64f);
        const size_t v = (size_t)(k / 16) * G * 16;
        for (int g = 0; g < G; g++) _mm512_mask_storeu_ps(xq + v + 16 * g, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, q + v + 16 * g), s));
    }
}

AVX512 static inline void zero_sums(RowSums *sums, int G) {
    for (int g = 0; g < G; g++) sums->s[g][0] = sums->s[g][1] = _mm512_setzero_ps();
}

AVX512 static inline void store_sums(const RowSums *sums, float post, float *y, size_t ldy, int G) {
    for (int g = 0; g < G; g++) y[g * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(sums->s[g][0], sums->s[g][1])) * post;
}

/* Where row r's weights for column k start. */
AVX512 static inline const uint8_t *weight_at(const Mat *W, int r, int k) {
    const size_t i = (size_t)r * W->cols + k;
    return W->fmt == WF_F32 ? W->w + 4 * i : W->fmt == WF_BF16 ? W->w + 2 * i : W->fmt == WF_FP8 ? W->w + i : W->w + i / 2;
}

/* y[g*ldy + i] = W[r0+i]·x_g for i < nr and G tokens, q: their x interleaved
 * (pack_tokens_x; one token: x itself, or matvec_split_x's xs for MXFP4 and BF16).
 * Results below fp32's normal range are flushed to zero (MXCSR's FTZ): on Intel cores an
 * FMA that underflows costs ~100 cycles, and such a term (< 2^-126) changes no sum. An
 * E4M3 subnormal placed as fp32 is a subnormal operand, which such cores also handle
 * slowly; real checkpoints hold ~1e-4 of those codes, so they stay exact. */
AVX512 static void rows_f32(const Mat *W, int r0, int nr, const float *q, float *y, size_t ldy, int G) {
    const int n = W->cols, fp8 = W->fmt == WF_FP8;
    const float post = fp8 ? 0x1p56f : 1.0f;
    const int blocked = G > 1 && G * n > F32_L1_FLOATS;
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8000); /* FTZ */
    float xq[fp8 ? G * ((n + 15) & ~15) : 1]; /* FP8's x' for the rows' scale block */
    const float *x = fp8 ? xq : q;
    int qb = -1; /* FP8: the scale block xq is for */
    if (!blocked) { /* one row at a time, whole: each thread reads one sequential stream */
        int i = 0;
        if (G == 1 && W->fmt == WF_MXFP4) /* one token: two rows at a time (row_sums2_mxfp4_1) */
            for (; i + 2 <= nr; i += 2) {
                RowSums s0, s1;
                zero_sums(&s0, 1);
                zero_sums(&s1, 1);
                row_sums2_mxfp4_1(W, r0 + i, q, &s0, &s1);
                store_sums(&s0, post, y + i, ldy, 1);
                store_sums(&s1, post, y + i + 1, ldy, 1);
            }
        for (; i < nr; i++) {
            const int r = r0 + i;
            if (fp8 && r / 128 != qb) { qb = r / 128; fp8_x_scaled(W, qb, q, xq, G); }
            RowSums sums;
            zero_sums(&sums, G);
            row_sums_g(W, r, 0, n, x, NULL, &sums, G);
            store_sums(&sums, post, y + i, ldy, G);
        }
        _mm_setcsr(csr);
        return;
    }
    /* blocked: chunks of rows, each a block of columns at a time; the weights that come two
     * row pieces later are fetched into L1 while a piece is summed (the hardware prefetcher
     * follows a stream through each page, not this walk across the rows) */
    RowSums sums[F32_CHUNK_ROWS];
    const int nblocks = (n + F32_BLOCK_COLS - 1) / F32_BLOCK_COLS;
    for (int i0 = 0; i0 < nr;) {
        int rb = nr - i0 < F32_CHUNK_ROWS ? nr - i0 : F32_CHUNK_ROWS;
        if (fp8 && (r0 + i0) % 128 + rb > 128) rb = 128 - (r0 + i0) % 128; /* within one scale block */
        if (fp8 && (r0 + i0) / 128 != qb) { qb = (r0 + i0) / 128; fp8_x_scaled(W, qb, q, xq, G); }
        for (int i = 0; i < rb; i++) zero_sums(&sums[i], G);
        for (int cb = 0; cb < nblocks; cb++) {
            const int k0 = cb * F32_BLOCK_COLS, k1 = n - k0 < F32_BLOCK_COLS ? n : k0 + F32_BLOCK_COLS;
            for (int i = 0; i < rb; i++) {
                int pi = i + F32_AHEAD, pc = cb, pr; /* the piece F32_AHEAD after this one */
                while (pi >= rb && pc < nblocks) { pi -= rb; pc++; }
                if (pc < nblocks) pr = r0 + i0 + pi;
                else { pr = r0 + i0 + rb + pi; pc = 0; }
                const uint8_t *pf = pr < r0 + nr ? weight_at(W, pr, pc * F32_BLOCK_COLS) : weight_at(W, r0 + i0 + i, k0);
                row_sums_g(W, r0 + i0 + i, k0, k1, x, pf, &sums[i], G);
            }
        }
        for (int i = 0; i < rb; i++) store_sums(&sums[i], post, y + i0 + i, ldy, G);
        i0 += rb;
    }
    _mm_setcsr(csr);
}

/* y[i] = W[r0+i] · x for i in [0, nr); xs = x as matvec_split_x orders it for W. */
AVX512 static void matvec_avx512(const Mat *W, int r0, int nr, const float *x, const float *xs, float *y) {
    rows_f32(W, r0, nr, W->fmt == WF_MXFP4 || W->fmt == WF_BF16 ? xs : x, y, 1, 1);
}

/* matvec_avx512 for n tokens, xp: their x as pack_tokens_x lays them out: each row is
 * decoded once per PACK_GROUP (F32_GROUP) tokens, and token t's results are bit for bit
 * matvec_avx512's for x_t alone. */
AVX512 static void matvec_n_packed_avx512(const Mat *W, int r0, int nr, const float *xp, int n, float *y, size_t ldy) {
    const size_t nv16 = PACKED_X_FLOATS(W->cols); /* floats of one token's packed x */
    for (int t = 0; t < n; t += F32_GROUP) {
        const float *q = xp + (size_t)t * nv16;
        rows_f32(W, r0, nr, q, y + (size_t)t * ldy, ldy, n - t < F32_GROUP ? n - t : F32_GROUP);
    }
}

/* out[0..kc) = W[r][k0 .. k0+kc) as floats (k0 a multiple of 32). */
AVX512 static void dequant_range_avx512(const Mat *W, int r, int k0, int kc, float *out) {
    const int n = W->cols, end = k0 + kc;
    int k = k0;
    switch (W->fmt) {
    case WF_F32: memcpy(out, (const float *)W->w + (size_t)r * n + k0, (size_t)kc * sizeof(float)); return;
    case WF_BF16: {
        const uint16_t *w = (const uint16_t *)W->w + (size_t)r * n;
        for (; k + 16 <= end; k += 16) _mm512_storeu_ps(out + k - k0, bf16x16(w + k));
        if (k < end) {
            __mmask16 m = (__mmask16)((1u << (end - k)) - 1);
            _mm512_mask_storeu_ps(out + k - k0, m, bf16x16_masked(w + k, m));
        }
        return;
    }
    case WF_FP8: {
        const uint8_t *w = W->w + (size_t)r * n;
        const float *scale = W->fp8_scale + (size_t)(r / 128) * ((n + 127) / 128);
        for (; k < end; k += 16) { /* k0 is a multiple of 16, so 16 never straddle a 128 block */
            __mmask16 m = end - k >= 16 ? 0xFFFF : (__mmask16)((1u << (end - k)) - 1);
            _mm512_mask_storeu_ps(out + k - k0, m, _mm512_mul_ps(fp8x16(_mm_maskz_loadu_epi8(m, w + k)), _mm512_set1_ps(scale[k / 128])));
        }
        return;
    }
    case WF_MXFP4: { /* byte i holds elements 2i (low nibble) and 2i+1: interleave after the lookup */
        const uint8_t *w = W->w + (size_t)r * (n / 2);
        const uint8_t *sc = W->mx_scale + (size_t)r * (n / 32);
        const __m512i lo_idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const __m512i hi_idx = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        for (int b = k0 / 32; b < end / 32; b++) {
            __m512 ev, od;
            mxfp4x32(w + 16 * b, sc[b], &ev, &od);
            _mm512_storeu_ps(out + 32 * b - k0, _mm512_permutex2var_ps(ev, lo_idx, od));
            _mm512_storeu_ps(out + 32 * b - k0 + 16, _mm512_permutex2var_ps(ev, hi_idx, od));
        }
        return;
    }
    }
}

/* out[0..cols) = row r of W as floats. */
AVX512 static void dequant_row_avx512(const Mat *W, int r, float *out) { dequant_range_avx512(W, r, 0, W->cols, out); }

/* Streaming read of buf[0..n) (one run of the bandwidth measurement). The parallel
 * regions live in functions without a target attribute: clang does not carry the
 * attribute into OpenMP's outlined functions. */
AVX512 static unsigned long long read_run_avx512(const uint8_t *buf, size_t n) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 256) {
        a = _mm512_add_epi64(a, _mm512_load_si512(buf + i));
        b = _mm512_add_epi64(b, _mm512_load_si512(buf + i + 64));
        c = _mm512_add_epi64(c, _mm512_load_si512(buf + i + 128));
        d = _mm512_add_epi64(d, _mm512_load_si512(buf + i + 192));
    }
    /* summed as unsigned: _mm512_reduce_add_epi64 adds signed long longs, which may overflow */
    unsigned long long lane[8], sum = 0;
    _mm512_storeu_si512(lane, _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
    for (int i = 0; i < 8; i++) sum += lane[i];
    return sum;
}

/* Bytes/s of a streaming read of the runs by all threads, each run to the thread that
 * frees up first, as decode hands out its rows: with fixed halves a thread the host
 * pauses leaves the other idle at the end, and the read would then measure the pause
 * rather than the memory. */
static double read_bandwidth_avx512(const ReadRun *runs, int n_runs) {
    double t0 = now_s(), bytes = 0;
    unsigned long long sink = 0;
    for (int r = 0; r < n_runs; r++) bytes += (double)runs[r].n;
#pragma omp parallel for reduction(+ : sink) schedule(dynamic, 1)
    for (int r = 0; r < n_runs; r++) sink += read_run_avx512(runs[r].p, runs[r].n);
    double dt = now_s() - t0;
    return sink == 42 ? 0.0 : bytes / dt; /* sink keeps the loads alive */
}

/* One thread's part of the FMA peak: 12 independent 16-wide FMA chains (enough to cover
 * the latency on current cores), named variables so they stay in registers. */
AVX512 static float fma_chains_avx512(long iters) {
    const __m512 m = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
    __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2), a3 = _mm512_set1_ps(3);
    __m512 a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5), a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7);
    __m512 a8 = _mm512_set1_ps(8), a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
    for (long i = 0; i < iters; i++) {
        a0 = _mm512_fmadd_ps(a0, m, c); a1 = _mm512_fmadd_ps(a1, m, c); a2 = _mm512_fmadd_ps(a2, m, c);
        a3 = _mm512_fmadd_ps(a3, m, c); a4 = _mm512_fmadd_ps(a4, m, c); a5 = _mm512_fmadd_ps(a5, m, c);
        a6 = _mm512_fmadd_ps(a6, m, c); a7 = _mm512_fmadd_ps(a7, m, c); a8 = _mm512_fmadd_ps(a8, m, c);
        a9 = _mm512_fmadd_ps(a9, m, c); a10 = _mm512_fmadd_ps(a10, m, c); a11 = _mm512_fmadd_ps(a11, m, c);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)), _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(s);
}

/* fp32 FMA peak of all threads, FLOP/s counting 2 per lane per FMA. */
static double fma_peak_avx512(void) {
    const long iters = 20000000;
    double t0 = now_s();
    float sink = 0.0f;
#pragma omp parallel reduction(+ : sink)
    sink += fma_chains_avx512(iters);
    double dt = now_s() - t0;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    return sink == 42.0f ? 0.0 : 2.0 * 16 * 12 * iters * threads / dt;
}

/* vdpbf16ps against fp32 FMA on this core, FLOP for FLOP: the default precision of the
 * weight products follows it (fast_init). On the project's Intel Xeon (Emerald Rapids)
 * VM vdpbf16ps runs at 0.50x the FMA's rate, so bf16 activations there cost accuracy
 * and speed both (prefill 0.44 against 0.58 of the FMA peak); on the AMD EPYC (Zen 5) VM
 * bf16 prompts ran ~2x faster than fp32 ones. Twelve independent chains of each, the best
 * of five short alternating runs (~1 ms in all): a rate ratio far from 1 either way, so
 * the choice does not flip with the host's noise. */
__attribute__((target("avx512f,avx512bf16"))) static float dpbf16_chains(long iters) {
    const __m512bh m = (__m512bh)_mm512_set1_epi16(0x3F80), c = (__m512bh)_mm512_set1_epi16(0x3380); /* 1, ~6e-8 */
    __m512 a[12];
    for (int j = 0; j < 12; j++) a[j] = _mm512_set1_ps((float)j);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) a[j] = _mm512_dpbf16_ps(a[j], m, c);
    }
    __m512 s = a[0];
    for (int j = 1; j < 12; j++) s = _mm512_add_ps(s, a[j]);
    return _mm512_reduce_add_ps(s);
}

static double bf16_speedup_avx512(void) {
    static double measured; /* once per process: what chose the default is what glm bench reports */
    if (measured > 0) return measured;
    const long iters = 20000;
    double best_dp = 1e9, best_fma = 1e9;
    float sink = 0.0f;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s();
        sink += dpbf16_chains(iters);
        double t1 = now_s();
        sink += fma_chains_avx512(iters);
        double t2 = now_s();
        if (t1 - t0 < best_dp) best_dp = t1 - t0;
        if (t2 - t1 < best_fma) best_fma = t2 - t1;
    }
    /* FLOP per instruction: vdpbf16ps 64 (32 pairs), vfmadd231ps 32 */
    measured = sink == 42.0f ? 0.0 : (64.0 / best_dp) / (32.0 / best_fma);
    return measured;
}

/* Prefill GEMM micro-kernel: Y[t*ldy + j] += Σ_k P[k*ldp + j] · X[t*ldx + k] for j < nj
 * (≤ 32 rows of W, k-major in the panel P, usually ldp = 32), t < n tokens, k < K. T
 * tokens at a time keep 2T accumulators (32 rows each) in registers; each X element is
 * broadcast once. Lanes past nj are neither loaded nor stored. */
#define GEMM_TILE(T)                                                                          \
    AVX512 static inline void gemm_tile##T(const float *P, int ldp, int K, const float *X, int ldx, \
                                            float *Y, int ldy, __mmask16 m0, __mmask16 m1) {   \
        __m512 acc[T][2]; /* every loop over it unrolled: then GCC keeps it in registers */     \
        _Pragma("GCC unroll 12") for (int j = 0; j < T; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps(); \
        for (int k = 0; k < K; k++) {                                                          \
            __m512 p0 = _mm512_maskz_loadu_ps(m0, P + (size_t)k * ldp), p1 = _mm512_maskz_loadu_ps(m1, P + (size_t)k * ldp + 16); \
            _Pragma("GCC unroll 12") for (int j = 0; j < T; j++) {                             \
                __m512 xb = _mm512_set1_ps(X[(size_t)j * ldx + k]);                            \
                acc[j][0] = _mm512_fmadd_ps(p0, xb, acc[j][0]);                                \
                acc[j][1] = _mm512_fmadd_ps(p1, xb, acc[j][1]);                                \
            }                                                                                  \
        }                                                                                      \
        _Pragma("GCC unroll 12") for (int j = 0; j < T; j++) {                                 \
            float *y = Y + (size_t)j * ldy;                                                    \
            _mm512_mask_storeu_ps(y, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, y), acc[j][0])); \
            _mm512_mask_storeu_ps(y + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, y + 16), acc[j][1])); \
        }                                                                                      \
    }
GEMM_TILE(12)
GEMM_TILE(4)
GEMM_TILE(1)

/* Transposes a 16x16 block: out[k*ldo + j] = in[j*ldi + k]. Four stages of lane
 * shuffles (pairs, quads, 128-bit halves, 256-bit halves). Every loop unrolled: then
 * GCC keeps r and t in registers (rolled, it spilled them to the stack between stages,
 * and a 512-token prefill took 1.7% longer). */
AVX512 static void transpose16x16(const float *in, int ldi, float *out, int ldo) {
    __m512 r[16], t[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_ps(in + (size_t)j * ldi);
#pragma GCC unroll 8
    for (int j = 0; j < 16; j += 2) {
        t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 16; j += 4) {
        r[j] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[j]), _mm512_castps_pd(t[j + 2])));
        r[j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[j]), _mm512_castps_pd(t[j + 2])));
        r[j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[j + 1]), _mm512_castps_pd(t[j + 3])));
        r[j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[j + 1]), _mm512_castps_pd(t[j + 3])));
    }
    /* r[4q + i] now holds, for rows 4q..4q+3, column (4·lane128 + i) of each 128-bit lane */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512 a = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88), b = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xDD);
        __m512 c = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88), d = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xDD);
        t[i] = _mm512_shuffle_f32x4(a, c, 0x88);      /* column i      */
        t[8 + i] = _mm512_shuffle_f32x4(a, c, 0xDD);  /* column 8 + i  */
        t[4 + i] = _mm512_shuffle_f32x4(b, d, 0x88);  /* column 4 + i  */
        t[12 + i] = _mm512_shuffle_f32x4(b, d, 0xDD); /* column 12 + i */
    }
#pragma GCC unroll 16
    for (int k = 0; k < 16; k++) _mm512_storeu_ps(out + (size_t)k * ldo, t[k]);
}

/* P[k*32 + j] = rows[j*ld + k] for j < 32, k < K (K a multiple of 16 here; the
 * caller does the rest): the k-major panel of the prefill product. */
AVX512 static void pack_panel_avx512(const float *rows, int ld, int K, float *P) {
    for (int k = 0; k + 16 <= K; k += 16) {
        transpose16x16(rows + k, ld, P + (size_t)k * 32, 32);
        transpose16x16(rows + (size_t)16 * ld + k, ld, P + (size_t)k * 32 + 16, 32);
    }
}

AVX512 static void gemm_panel_avx512(const float *P, int ldp, int K, const float *X, int ldx, int n, float *Y, int ldy, int nj) {
    __mmask16 m0 = row_mask(nj), m1 = row_mask(nj - 16);
    int t = 0;
    for (; t + 12 <= n; t += 12) gemm_tile12(P, ldp, K, X + (size_t)t * ldx, ldx, Y + (size_t)t * ldy, ldy, m0, m1);
    for (; t + 4 <= n; t += 4) gemm_tile4(P, ldp, K, X + (size_t)t * ldx, ldx, Y + (size_t)t * ldy, ldy, m0, m1);
    for (; t < n; t++) gemm_tile1(P, ldp, K, X + (size_t)t * ldx, ldx, Y + (size_t)t * ldy, ldy, m0, m1);
}

/* The same product with bf16 inputs (AVX512-BF16): P holds the 32 rows as bf16 pairs
 * [K/2][32][2], X as bf16 [n][ldx]; vdpbf16ps does 32 multiply-adds per instruction,
 * twice the fp32 FMA rate on AMD Zen 4/5, in exchange for rounding activations to bf16.
 * The default prefill where vdpbf16ps outpaces FMA (not with --fp32). K is even. */
#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define GEMM_TILE_BF16(T)                                                                      \
    BF16 static inline void gemm_bf16_tile##T(const uint16_t *P, int K, const uint16_t *X, int ldx, \
                                               float *Y, int ldy, __mmask16 m0, __mmask16 m1) {  \
        __m512 acc[T][2];                                                                      \
        for (int j = 0; j < T; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps();               \
        for (int k = 0; k < K; k += 2) {                                                       \
            __m512i p0 = _mm512_loadu_si512(P + (size_t)k * 32), p1 = _mm512_loadu_si512(P + (size_t)k * 32 + 32); \
            _Pragma("GCC unroll 12") for (int j = 0; j < T; j++) {                             \
                uint32_t pair;                                                                 \
                memcpy(&pair, X + (size_t)j * ldx + k, 4);                                     \
                __m512i xb = _mm512_set1_epi32((int)pair);                                     \
                acc[j][0] = _mm512_dpbf16_ps(acc[j][0], (__m512bh)p0, (__m512bh)xb);           \
                acc[j][1] = _mm512_dpbf16_ps(acc[j][1], (__m512bh)p1, (__m512bh)xb);           \
            }                                                                                  \
        }                                                                                      \
        for (int j = 0; j < T; j++) {                                                          \
            float *y = Y + (size_t)j * ldy;                                                    \
            _mm512_mask_storeu_ps(y, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, y), acc[j][0])); \
            _mm512_mask_storeu_ps(y + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, y + 16), acc[j][1])); \
        }                                                                                      \
    }
GEMM_TILE_BF16(12)
GEMM_TILE_BF16(8)
GEMM_TILE_BF16(4)
GEMM_TILE_BF16(1)

/* The 16 bf16 of 16 floats in order (round to nearest even; denormals flush to zero in
 * this instruction, which only matters for values below 1e-38). */
BF16 static inline __m256i bf16_round16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

/* xb[0..kpad) = bf16(x[0..n)) then zeros: one token's activations for gemm_panel_bf16. */
BF16 static void round_bf16_avx512(const float *x, int n, uint16_t *xb, int kpad) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(xb + i), bf16_round16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(xb + i, m, bf16_round16(_mm512_maskz_loadu_ps(m, x + i)));
        i = n;
    }
    for (; i < kpad; i++) xb[i] = 0;
}

/* out[0..kc) = bf16 of W[r][k0 .. k0+kc), zeros past the last column (k0 a multiple of
 * 32): the one conversion both bf16 products start from. BF16 is copied, MXFP4 turned
 * into words directly (byte i -> the pair bf16(lo)·s, bf16(hi)·s; e2m1·2^k is exact in
 * bf16), FP8 and F32 go through fp32 and are rounded (FP8 times its block scale is not
 * exact in bf16). */
BF16 static void bf16_row_range(const Mat *W, int r, int k0, int kc, uint16_t *out) {
    const int n = W->cols, valid = n - k0 < kc ? n - k0 : kc;
    switch (W->fmt) {
    case WF_BF16:
        memcpy(out, (const uint16_t *)W->w + (size_t)r * n + k0, (size_t)valid * 2);
        break;
    case WF_MXFP4: {
        const uint8_t *w = W->w + (size_t)r * (n / 2), *sc = W->mx_scale + (size_t)r * (n / 32);
        const __m512i top = _mm512_set1_epi32((int)0xFFFF0000u);
        for (int b = k0 / 32; b < (k0 + valid) / 32; b++) {
            __m512 lo, hi;
            mxfp4x32(w + 16 * b, sc[b], &lo, &hi);
            /* (lo >> 16) | (hi & top): ternary logic A|(B&C) is 0xF8 */
            _mm512_storeu_si512(out + 32 * b - k0, _mm512_ternarylogic_epi32(_mm512_srli_epi32(_mm512_castps_si512(lo), 16), _mm512_castps_si512(hi), top, 0xF8));
        }
        break;
    }
    default: {
        float tmp[512];
        for (int k = 0; k < valid; k += 512) {
            int len = valid - k < 512 ? valid - k : 512;
            dequant_range_avx512(W, r, k0 + k, len, tmp);
            round_bf16_avx512(tmp, len, out + k, len);
        }
        break;
    }
    }
    for (int k = valid < 0 ? 0 : valid; k < kc; k++) out[k] = 0;
}

/* A bf16 panel of one k-chunk, for gemm_panel_bf16: P[p*32 + j] = the pair (W[r+j][k0+2p],
 * W[r+j][k0+2p+1]) as two bf16 in one 32-bit word, p < kc/2, j < 32; rows past nj, and
 * columns past the matrix, are zero. Two neighbouring elements of a row are one word,
 * so this is a 32-bit transpose of the dequantized rows: each row goes through a small
 * staging buffer (stage[32][kc/2] words, hot in L1/L2) and 16x16 blocks are transposed
 * into the panel. kc is a multiple of 32 (the caller pads the chunk at the row end) and
 * k0 a multiple of 32. Building a chunk at a time keeps everything in cache: a panel of
 * a whole row of 32 rows is 0.8 MB at GLM widths. */
BF16 static void build_panel_bf16_avx512(const Mat *W, int r, int nj, int k0, int kc, uint32_t *stage, uint32_t *panel) {
    const int n = W->cols, words = kc / 2;
    if (W->fmt == WF_BF16 && nj == 32 && k0 + kc <= n && n % 2 == 0) { /* already bf16 pairs: transpose from the file */
        const uint16_t *w = (const uint16_t *)W->w + (size_t)r * n + k0;
        for (int p = 0; p < words; p += 16)
            for (int j = 0; j < 32; j += 16)
                transpose16x16((const float *)(w + (size_t)j * n + 2 * p), n / 2, (float *)(panel + (size_t)p * 32 + j), 32);
        return;
    }
    for (int j = 0; j < 32; j++) {
        uint16_t *row = (uint16_t *)(stage + (size_t)j * words);
        if (j < nj) bf16_row_range(W, r + j, k0, kc, row);
        else memset(row, 0, (size_t)kc * 2);
    }
    for (int p = 0; p < words; p += 16)
        for (int j = 0; j < 32; j += 16)
            transpose16x16((const float *)(stage + (size_t)j * words + p), words, (float *)(panel + (size_t)p * 32 + j), 32);
}


BF16 static void gemm_panel_bf16_avx512(const uint16_t *P, int K, const uint16_t *X, int ldx, int n, float *Y, int ldy, int nj) {
    __mmask16 m0 = row_mask(nj), m1 = row_mask(nj - 16);
    int t = 0;
    for (; t + 12 <= n; t += 12) gemm_bf16_tile12(P, K, X + (size_t)t * ldx, ldx, Y + (size_t)t * ldy, ldy, m0, m1);
    /* the rest: 8 tokens keep 16 sums in flight, enough to hide vdpbf16ps's latency;
     * 4 keep 8, and ran at ~half the rate (512 tokens = 42 x 12 + 8) */
    for (; t + 8 <= n; t += 8) gemm_bf16_tile8(P, K, X + (size_t)t * ldx, ldx, Y + (size_t)t * ldy, ldy, m0, m1);
    for (; t + 4 <= n; t += 4) gemm_bf16_tile4(P, K, X + (size_t)t * ldx, ldx, Y + (size_t)t * ldy, ldy, m0, m1);
    for (; t < n; t++) gemm_bf16_tile1(P, K, X + (size_t)t * ldx, ldx, Y + (size_t)t * ldy, ldy, m0, m1);
}

/* A bf16 panel whose k runs down the rows of a matrix (the k-major operands of attention:
 * W_UK's rows, the cached latent rows of a block of keys): P[p*32 + j] = the pair
 * (A[row(2p)][j], A[row(2p+1)][j]), p < ceil(K/2), j < 32, where row(k) = idx ? idx[k] : k
 * (rows in place, no gather copy); a missing row K (K odd) and lanes j >= nj are zero.
 * Interleaving two rows' words is one two-source permute per 16 pairs. */
BF16 static void pack_pairs_bf16_avx512(const uint16_t *A, int lda, const int *idx, int K, int nj, uint32_t *P) {
    static const uint16_t lo_pairs[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                          8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i lo = _mm512_loadu_si512(lo_pairs), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    const __mmask32 m = nj >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << nj) - 1);
    for (int k = 0; k < K; k += 2) {
        __m512i a = _mm512_maskz_loadu_epi16(m, A + (size_t)(idx ? idx[k] : k) * lda);
        __m512i b = k + 1 < K ? _mm512_maskz_loadu_epi16(m, A + (size_t)(idx ? idx[k + 1] : k + 1) * lda) : _mm512_setzero_si512();
        _mm512_storeu_si512(P + (size_t)k * 16, _mm512_permutex2var_epi16(a, lo, b));
        _mm512_storeu_si512(P + (size_t)k * 16 + 16, _mm512_permutex2var_epi16(a, hi, b));
    }
}

/* The same product for few tokens (an expert's share of a prompt chunk), without a panel:
 * building a panel costs about as much as using it when only ~32 tokens pass through.
 * Instead four rows at a time are dequantized once into a small bf16 buffer (row order,
 * no transpose: two neighbours are one word, as the instruction wants them) and each
 * token's dot products with them run along k, 32 at a time, in 4 x T accumulators that
 * are summed across lanes at the end.
 *   y[t*ldy + i] = Σ_k W[r0+i][k] · X[t*ldx + k], i < nr, t < n;
 * X bf16, zero-padded to kp = cols rounded up to 32; wbuf: [4][kp] bf16 of scratch. */

#define ROWS_TILE_BF16(T)                                                                       \
    BF16 static void rows_bf16_tile##T(const uint16_t *wb, int kp, const uint16_t *X, int ldx, float *Y, int ldy, int nr) { \
        __m512 acc[T][4];                                                                       \
        for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = _mm512_setzero_ps(); \
        for (int k = 0; k < kp; k += 32) {                                                      \
            __m512bh w0 = (__m512bh)_mm512_loadu_si512(wb + k), w1 = (__m512bh)_mm512_loadu_si512(wb + kp + k); \
            __m512bh w2 = (__m512bh)_mm512_loadu_si512(wb + 2 * (size_t)kp + k), w3 = (__m512bh)_mm512_loadu_si512(wb + 3 * (size_t)kp + k); \
            _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) {                                \
                __m512bh xv = (__m512bh)_mm512_loadu_si512(X + (size_t)t * ldx + k);            \
                acc[t][0] = _mm512_dpbf16_ps(acc[t][0], w0, xv); acc[t][1] = _mm512_dpbf16_ps(acc[t][1], w1, xv); \
                acc[t][2] = _mm512_dpbf16_ps(acc[t][2], w2, xv); acc[t][3] = _mm512_dpbf16_ps(acc[t][3], w3, xv); \
            }                                                                                   \
        }                                                                                       \
        for (int t = 0; t < T; t++)                                                             \
            for (int i = 0; i < nr; i++) Y[(size_t)t * ldy + i] = _mm512_reduce_add_ps(acc[t][i]); \
    }
ROWS_TILE_BF16(6)
ROWS_TILE_BF16(5)
ROWS_TILE_BF16(4)
ROWS_TILE_BF16(3)
ROWS_TILE_BF16(2)
ROWS_TILE_BF16(1)

BF16 static void gemm_rows_bf16_avx512(const Mat *W, int r0, int nr, const uint16_t *X, int ldx, int n, float *Y, int ldy, uint16_t *wbuf) {
    const int kp = (W->cols + 31) & ~31;
    for (int i = 0; i < nr; i += 4) {
        int rows = nr - i < 4 ? nr - i : 4;
        for (int j = 0; j < 4; j++) {
            if (j < rows) bf16_row_range(W, r0 + i + j, 0, kp, wbuf + (size_t)j * kp);
            else memset(wbuf + (size_t)j * kp, 0, (size_t)kp * 2);
        }
        int t = 0;
        for (; t + 6 <= n; t += 6) rows_bf16_tile6(wbuf, kp, X + (size_t)t * ldx, ldx, Y + (size_t)t * ldy + i, ldy, rows);
        const uint16_t *Xt = X + (size_t)t * ldx;
        float *Yt = Y + (size_t)t * ldy + i;
        /* the last 1-5 tokens in one pass: one at a time kept only 4 sums in flight, and an
         * expert of 15 tokens ran 1.2x slower from cache (1.04-1.13x from the page cache) */
        switch (n - t) {
        case 5: rows_bf16_tile5(wbuf, kp, Xt, ldx, Yt, ldy, rows); break;
        case 4: rows_bf16_tile4(wbuf, kp, Xt, ldx, Yt, ldy, rows); break;
        case 3: rows_bf16_tile3(wbuf, kp, Xt, ldx, Yt, ldy, rows); break;
        case 2: rows_bf16_tile2(wbuf, kp, Xt, ldx, Yt, ldy, rows); break;
        case 1: rows_bf16_tile1(wbuf, kp, Xt, ldx, Yt, ldy, rows); break;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Decode with bf16 activations (AVX512-BF16, the default where vdpbf16ps outpaces FMA;
 * see fast.c). vdpbf16ps multiplies 32 bf16 pairs straight from weight bits, about one
 * instruction per 64 bytes of weights after the format's unpacking; the fp32 route
 * above spends several per 64 bytes and, measured on a VM core shared with its
 * neighbours, fell to half of the read bandwidth (BF16 rows: 22 vs 46 GB/s on two
 * threads in the same run). x is rounded to bf16 (as in the prefill) once per call.
 * Each format's unpacking leaves the weights in an order of its own; x is laid out in
 * that order beforehand (matvec_order_bf16), so the kernels never shuffle x; rounding
 * it costs a few hundred instructions per call (~1 MB of weights).
 *   BF16   the row as it is: one 64-byte load is 32 weights.
 *   FP8    the 64 bytes read as 32 words: a word's high byte (the odd column) is a
 *          bf16 after an arithmetic shift by 4 and a mask (sign in bit 15, the 7
 *          magnitude bits at 10..4: the bf16 of (E4M3 value) x 2^-120, as
 *          fp8x16_placed does for fp32), its low byte (the even column) the same after
 *          a shift left by 8; x per 64 columns is the 32 even ones, then the 32 odd
 *          ones. No byte shuffles (unpacking with zeros measured 0-3% slower from memory).
 *          x carries 2^64 and the block scale 2^56. vdpbf16ps treats bf16 subnormals
 *          as zero, so E4M3 subnormals (|v| < 2^-6, below 1/28000 of a block's largest
 *          weight) count as zero: on real weights that is far under the format's own
 *          rounding step.
 *   MXFP4  per 64 bytes (4 blocks of 32 columns): vpermw looks up 32 words at once in
 *          a 32-entry table of E2M1 bf16s (exact; the 16 values twice, so an index's
 *          fifth bit needs no mask): the words themselves give the low nibbles of the
 *          even bytes, the words shifted by 4, 8 and 12 the other three nibbles. Word j
 *          of lookup v is column 4j + v, so lane l of the sums holds block l/4, scaled
 *          by its 2^(s-127). Four lookups and three shifts per 64 bytes, where two
 *          16-byte vpshufb tables and unpacking took eight shuffles (+10% from memory;
 *          on the Zen 5 measured, shifts and lookups each run 2 per cycle, and mixed
 *          with vdpbf16ps ~3 per cycle in all).
 */

/* xb[0..np) = bf16(xs[0..np)), np a multiple of 16 */
BF16 static void round_x_bf16(const float *xs, int np, uint16_t *xb) {
    for (int p = 0; p < np; p += 16) _mm256_storeu_si256((__m256i *)(xb + p), bf16_round16(_mm512_loadu_ps(xs + p)));
}

/* One row of W against G tokens (G <= MV_GROUP), y[g*ldy] = W[r]·x_g, each x_g in bf16 as
 * matvec_order_bf16 lays it out (xb + g*ldx, zero past the row). Every token's sums take
 * exactly the operations, in the same order, that they take with G = 1: a token's result
 * does not depend on the tokens beside it (glm serve's batch invariance), and the weights,
 * unpacked once, feed all G. always_inline with G a constant at each call: the per-token
 * arrays become registers. */
#define MV_GROUP 4
#define MV_ROW BF16 static inline __attribute__((always_inline)) void
MV_ROW mv_row_bf16(const uint16_t *w, int n, const uint16_t *xb, size_t ldx, float *y, size_t ldy, const int G) {
    __m512 a0[MV_GROUP], a1[MV_GROUP]; /* two sums per token: 64-byte pieces alternate between them */
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++) a0[g] = a1[g] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 128 <= n; k += 128) { /* 256 bytes */
        if (k % 2048 == 0) PREFETCH_AT(w + k, AHEAD_FAR); /* each 4 KB page of the row, its start included */
        PREFETCH_AT(w + k, AHEAD_BF16); PREFETCH_AT(w + k + 32, AHEAD_BF16); PREFETCH_AT(w + k + 64, AHEAD_BF16); PREFETCH_AT(w + k + 96, AHEAD_BF16);
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k), w1 = (__m512bh)_mm512_loadu_si512(w + k + 32);
        const __m512bh w2 = (__m512bh)_mm512_loadu_si512(w + k + 64), w3 = (__m512bh)_mm512_loadu_si512(w + k + 96);
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const uint16_t *x = xb + g * ldx + k;
            a0[g] = _mm512_dpbf16_ps(a0[g], w0, (__m512bh)_mm512_loadu_si512(x));
            a1[g] = _mm512_dpbf16_ps(a1[g], w1, (__m512bh)_mm512_loadu_si512(x + 32));
            a0[g] = _mm512_dpbf16_ps(a0[g], w2, (__m512bh)_mm512_loadu_si512(x + 64));
            a1[g] = _mm512_dpbf16_ps(a1[g], w3, (__m512bh)_mm512_loadu_si512(x + 96));
        }
    }
    for (; k < n; k += 32) { /* xb is zero past n; the mask keeps the loads inside the row */
        __mmask32 m = n - k >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << (n - k)) - 1);
        const __m512bh wm = (__m512bh)_mm512_maskz_loadu_epi16(m, w + k);
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) a0[g] = _mm512_dpbf16_ps(a0[g], wm, (__m512bh)_mm512_loadu_si512(xb + g * ldx + k));
    }
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++) y[g * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(a0[g], a1[g]));
}

/* mv_row_bf16 for two rows at once (w0, w1): each x load serves both rows, halving the
 * reads of x from L2 when several tokens' x no longer fit L1. Each (row, token) takes
 * the same operations in the same order as in mv_row_bf16. */
MV_ROW mv_row2_bf16(const uint16_t *w0, const uint16_t *w1, int n, const uint16_t *xb, size_t ldx, float *y, size_t ldy, const int G) {
    __m512 a0[MV_GROUP], a1[MV_GROUP], c0[MV_GROUP], c1[MV_GROUP];
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++) a0[g] = a1[g] = c0[g] = c1[g] = _mm512_setzero_ps();
    int k = 0;
    const int k128 = n & ~127; /* where mv_row_bf16's 128-column steps end and its tail begins */
    for (; k < k128; k += 64) { /* 128 bytes of each row: pieces alternate between the sums as there */
        if (k % 2048 == 0) { PREFETCH_AT(w0 + k, AHEAD_FAR); PREFETCH_AT(w1 + k, AHEAD_FAR); }
        const __m512bh u0 = (__m512bh)_mm512_loadu_si512(w0 + k), u1 = (__m512bh)_mm512_loadu_si512(w0 + k + 32);
        const __m512bh v0 = (__m512bh)_mm512_loadu_si512(w1 + k), v1 = (__m512bh)_mm512_loadu_si512(w1 + k + 32);
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const __m512bh x0 = (__m512bh)_mm512_loadu_si512(xb + g * ldx + k), x1 = (__m512bh)_mm512_loadu_si512(xb + g * ldx + k + 32);
            a0[g] = _mm512_dpbf16_ps(a0[g], u0, x0);
            a1[g] = _mm512_dpbf16_ps(a1[g], u1, x1);
            c0[g] = _mm512_dpbf16_ps(c0[g], v0, x0);
            c1[g] = _mm512_dpbf16_ps(c1[g], v1, x1);
        }
    }
    for (; k < n; k += 32) { /* the tail, all into the first sums, as there */
        __mmask32 m = n - k >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << (n - k)) - 1);
        const __m512bh u = (__m512bh)_mm512_maskz_loadu_epi16(m, w0 + k), v = (__m512bh)_mm512_maskz_loadu_epi16(m, w1 + k);
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const __m512bh x = (__m512bh)_mm512_loadu_si512(xb + g * ldx + k);
            a0[g] = _mm512_dpbf16_ps(a0[g], u, x);
            c0[g] = _mm512_dpbf16_ps(c0[g], v, x);
        }
    }
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        y[g * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(a0[g], a1[g]));
        y[g * ldy + 1] = _mm512_reduce_add_ps(_mm512_add_ps(c0[g], c1[g]));
    }
}

MV_ROW mv_row_fp8(const uint8_t *w, int n, const float *scale, const uint16_t *xb, size_t ldx, float *y, size_t ldy, const int G) {
    const int nb = (n + 127) / 128;
    const __m512i mask = _mm512_set1_epi16((short)0x87F0);
    PREFETCH_AT(w, AHEAD_FAR);
    __m512 t[MV_GROUP];
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++) t[g] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512 a0[MV_GROUP], a1[MV_GROUP];
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) a0[g] = a1[g] = _mm512_setzero_ps();
        for (int k = 128 * b; k < 128 * b + 128; k += 64) {
            __m512i words; /* word j: byte 2j low, byte 2j+1 high */
            if (k + 64 <= n) { PREFETCH_AT(w + k, AHEAD_FP8); words = _mm512_loadu_si512(w + k); }
            else words = _mm512_maskz_loadu_epi8(k < n ? ~0ull >> (64 - (n - k)) : 0, w + k);
            /* the high byte in place: shift and mask; the low one moved up first */
            const __m512bh odd = (__m512bh)_mm512_and_si512(_mm512_srai_epi16(words, 4), mask);
            const __m512bh even = (__m512bh)_mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(words, 8), 4), mask);
            #pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                a0[g] = _mm512_dpbf16_ps(a0[g], even, (__m512bh)_mm512_loadu_si512(xb + g * ldx + k));
                a1[g] = _mm512_dpbf16_ps(a1[g], odd, (__m512bh)_mm512_loadu_si512(xb + g * ldx + k + 32));
            }
        }
        /* one multiplier per 128x128 block, times the 2^(120-64) taken off above */
        const __m512 sb = _mm512_set1_ps(scale[b] * 0x1p56f);
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) t[g] = _mm512_fmadd_ps(_mm512_add_ps(a0[g], a1[g]), sb, t[g]);
    }
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++) y[g * ldy] = _mm512_reduce_add_ps(t[g]);
}

MV_ROW mv_row_mxfp4(const uint8_t *w, int n, const uint8_t *sc, __m512i lut, __m512i spread, const uint16_t *xb, size_t ldx,
                    float *y, size_t ldy, const int G) {
    const int nb = n / 32;
    PREFETCH_AT(w, AHEAD_FAR);
    __m512 t[MV_GROUP];
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++) t[g] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 4) { /* 64 bytes, 4 blocks */
        __m512i words; /* word j = bytes 2j, 2j+1: columns 4j .. 4j+3, one nibble each */
        uint32_t s4 = 0;
        if (b + 4 <= nb) { PREFETCH_AT(w + 16 * b, AHEAD_MXFP4); words = _mm512_loadu_si512(w + 16 * b); memcpy(&s4, sc + b, 4); }
        else { words = _mm512_maskz_loadu_epi8(~0ull >> (64 - 16 * (nb - b)), w + 16 * b); memcpy(&s4, sc + b, (size_t)(nb - b)); }
        const __m512bh v0 = (__m512bh)_mm512_permutexvar_epi16(words, lut);
        const __m512bh v1 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 4), lut);
        const __m512bh v2 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 8), lut);
        const __m512bh v3 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 12), lut);
        /* lane l holds columns of block l/4: scale 2^(s-127) from the exponent bits (s = 0 gives 0) */
        const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_shuffle_epi8(_mm512_set1_epi32((int)s4), spread), 23));
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const uint16_t *x = xb + g * ldx + 32 * b;
            __m512 a0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), v0, (__m512bh)_mm512_loadu_si512(x));
            __m512 a1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), v1, (__m512bh)_mm512_loadu_si512(x + 32));
            a0 = _mm512_dpbf16_ps(a0, v2, (__m512bh)_mm512_loadu_si512(x + 64));
            a1 = _mm512_dpbf16_ps(a1, v3, (__m512bh)_mm512_loadu_si512(x + 96));
            t[g] = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), s, t[g]);
        }
    }
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++) y[g * ldy] = _mm512_reduce_add_ps(t[g]);
}

/* mv_row_fp8 for two rows at once (r and r+1, scales s0 and s1): each x load serves both
 * rows, halving the reads of x from L2 when several tokens' x no longer fit L1. Each
 * (row, token) takes the same operations in the same order as in mv_row_fp8. */
MV_ROW mv_row2_fp8(const uint8_t *w0, const uint8_t *w1, int n, const float *s0, const float *s1, const uint16_t *xb, size_t ldx,
                   float *y, size_t ldy, const int G) {
    const int nb = (n + 127) / 128;
    const __m512i mask = _mm512_set1_epi16((short)0x87F0);
    PREFETCH_AT(w0, AHEAD_FAR);
    PREFETCH_AT(w1, AHEAD_FAR);
    __m512 t0[MV_GROUP], t1[MV_GROUP];
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++) t0[g] = t1[g] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512 a0[MV_GROUP], a1[MV_GROUP], c0[MV_GROUP], c1[MV_GROUP];
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) a0[g] = a1[g] = c0[g] = c1[g] = _mm512_setzero_ps();
        for (int k = 128 * b; k < 128 * b + 128; k += 64) {
            __m512i u, v;
            if (k + 64 <= n) { PREFETCH_AT(w0 + k, AHEAD_FP8); PREFETCH_AT(w1 + k, AHEAD_FP8); u = _mm512_loadu_si512(w0 + k); v = _mm512_loadu_si512(w1 + k); }
            else {
                const __mmask64 m = k < n ? ~0ull >> (64 - (n - k)) : 0;
                u = _mm512_maskz_loadu_epi8(m, w0 + k);
                v = _mm512_maskz_loadu_epi8(m, w1 + k);
            }
            const __m512bh odd0 = (__m512bh)_mm512_and_si512(_mm512_srai_epi16(u, 4), mask);
            const __m512bh even0 = (__m512bh)_mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(u, 8), 4), mask);
            const __m512bh odd1 = (__m512bh)_mm512_and_si512(_mm512_srai_epi16(v, 4), mask);
            const __m512bh even1 = (__m512bh)_mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(v, 8), 4), mask);
            #pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                const __m512bh xe = (__m512bh)_mm512_loadu_si512(xb + g * ldx + k), xo = (__m512bh)_mm512_loadu_si512(xb + g * ldx + k + 32);
                a0[g] = _mm512_dpbf16_ps(a0[g], even0, xe);
                a1[g] = _mm512_dpbf16_ps(a1[g], odd0, xo);
                c0[g] = _mm512_dpbf16_ps(c0[g], even1, xe);
                c1[g] = _mm512_dpbf16_ps(c1[g], odd1, xo);
            }
        }
        const __m512 sb0 = _mm512_set1_ps(s0[b] * 0x1p56f), sb1 = _mm512_set1_ps(s1[b] * 0x1p56f);
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            t0[g] = _mm512_fmadd_ps(_mm512_add_ps(a0[g], a1[g]), sb0, t0[g]);
            t1[g] = _mm512_fmadd_ps(_mm512_add_ps(c0[g], c1[g]), sb1, t1[g]);
        }
    }
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++) { y[g * ldy] = _mm512_reduce_add_ps(t0[g]); y[g * ldy + 1] = _mm512_reduce_add_ps(t1[g]); }
}

/* mv_row_mxfp4 for two rows at once (w0/sc0, w1/sc1), as mv_row2_fp8: the same
 * operations per (row, token), each x load serving both rows. */
MV_ROW mv_row2_mxfp4(const uint8_t *w0, const uint8_t *w1, int n, const uint8_t *sc0, const uint8_t *sc1, __m512i lut, __m512i spread,
                     const uint16_t *xb, size_t ldx, float *y, size_t ldy, const int G) {
    const int nb = n / 32;
    PREFETCH_AT(w0, AHEAD_FAR);
    PREFETCH_AT(w1, AHEAD_FAR);
    __m512 t0[MV_GROUP], t1[MV_GROUP];
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++) t0[g] = t1[g] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 4) { /* 64 bytes of each row, 4 blocks */
        __m512i u, v;
        uint32_t su = 0, sv = 0;
        if (b + 4 <= nb) {
            PREFETCH_AT(w0 + 16 * b, AHEAD_MXFP4); PREFETCH_AT(w1 + 16 * b, AHEAD_MXFP4);
            u = _mm512_loadu_si512(w0 + 16 * b); v = _mm512_loadu_si512(w1 + 16 * b);
            memcpy(&su, sc0 + b, 4); memcpy(&sv, sc1 + b, 4);
        } else {
            const __mmask64 m = ~0ull >> (64 - 16 * (nb - b));
            u = _mm512_maskz_loadu_epi8(m, w0 + 16 * b); v = _mm512_maskz_loadu_epi8(m, w1 + 16 * b);
            memcpy(&su, sc0 + b, (size_t)(nb - b)); memcpy(&sv, sc1 + b, (size_t)(nb - b));
        }
        const __m512bh p0 = (__m512bh)_mm512_permutexvar_epi16(u, lut), p1 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(u, 4), lut);
        const __m512bh p2 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(u, 8), lut);
        const __m512bh p3 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(u, 12), lut);
        const __m512bh q0 = (__m512bh)_mm512_permutexvar_epi16(v, lut), q1 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), lut);
        const __m512bh q2 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v, 8), lut);
        const __m512bh q3 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v, 12), lut);
        const __m512 ssu = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_shuffle_epi8(_mm512_set1_epi32((int)su), spread), 23));
        const __m512 ssv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_shuffle_epi8(_mm512_set1_epi32((int)sv), spread), 23));
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const uint16_t *x = xb + g * ldx + 32 * b;
            const __m512bh x0 = (__m512bh)_mm512_loadu_si512(x), x1 = (__m512bh)_mm512_loadu_si512(x + 32);
            const __m512bh x2 = (__m512bh)_mm512_loadu_si512(x + 64), x3 = (__m512bh)_mm512_loadu_si512(x + 96);
            __m512 a0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), p0, x0), a1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), p1, x1);
            __m512 c0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), q0, x0), c1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), q1, x1);
            a0 = _mm512_dpbf16_ps(a0, p2, x2);
            a1 = _mm512_dpbf16_ps(a1, p3, x3);
            c0 = _mm512_dpbf16_ps(c0, q2, x2);
            c1 = _mm512_dpbf16_ps(c1, q3, x3);
            t0[g] = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), ssu, t0[g]);
            t1[g] = _mm512_fmadd_ps(_mm512_add_ps(c0, c1), ssv, t1[g]);
        }
    }
    #pragma GCC unroll 4
    for (int g = 0; g < G; g++) { y[g * ldy] = _mm512_reduce_add_ps(t0[g]); y[g * ldy + 1] = _mm512_reduce_add_ps(t1[g]); }
}

/* Rows r0..r0+nr-1 of W against G tokens: the format's row function, specialised for G. */
MV_ROW mv_rows_g(const Mat *W, int r0, int nr, const uint16_t *xb, size_t ldx, float *y, size_t ldy, const int G) {
    const int n = W->cols;
    switch (W->fmt) {
    case WF_BF16: {
        /* One token: one row at a time, also the wide ones (o_proj's 16384 columns, the
         * dense down projection's 12288), whose x (24-32 KB in bf16) no longer stays in L1
         * beside the weight stream: several rows per pass (each x line loaded once for all
         * of them) won on some hosts and lost on others; one row keeps a single stream per
         * thread. Several tokens: their x are read from L2 for every row, so two rows share
         * each load. */
        int i = 0;
        if (G > 1) /* several tokens: two rows per pass over their x */
            for (; i + 2 <= nr; i += 2)
                mv_row2_bf16((const uint16_t *)W->w + (size_t)(r0 + i) * n, (const uint16_t *)W->w + (size_t)(r0 + i + 1) * n, n, xb, ldx,
                             y + i, ldy, G);
        for (; i < nr; i++) mv_row_bf16((const uint16_t *)W->w + (size_t)(r0 + i) * n, n, xb, ldx, y + i, ldy, G);
        return;
    }
    case WF_FP8: {
        const int nb = (n + 127) / 128;
        int i = 0;
        if (G > 1) /* several tokens: two rows per pass over their x */
            for (; i + 2 <= nr; i += 2)
                mv_row2_fp8(W->w + (size_t)(r0 + i) * n, W->w + (size_t)(r0 + i + 1) * n, n, W->fp8_scale + (size_t)((r0 + i) / 128) * nb,
                            W->fp8_scale + (size_t)((r0 + i + 1) / 128) * nb, xb, ldx, y + i, ldy, G);
        for (; i < nr; i++)
            mv_row_fp8(W->w + (size_t)(r0 + i) * n, n, W->fp8_scale + (size_t)((r0 + i) / 128) * nb, xb, ldx, y + i, ldy, G);
        return;
    }
    case WF_MXFP4: {
        uint16_t table[32]; /* bf16 of each E2M1 value, twice: vpermw reads 5 index bits */
        for (int c = 0; c < 32; c++) table[c] = f32_to_bf16(e2m1_value[c % 16]);
        const __m512i lut = _mm512_loadu_si512(table);
        /* dword lanes 4L..4L+3 (128-bit lane L) take scale byte L in their low byte */
        const __m512i spread = _mm512_set_epi8(-1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1, 3,
                                               -1, -1, -1, 2, -1, -1, -1, 2, -1, -1, -1, 2, -1, -1, -1, 2,
                                               -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 1,
                                               -1, -1, -1, 0, -1, -1, -1, 0, -1, -1, -1, 0, -1, -1, -1, 0);
        int i = 0;
        if (G > 1) /* several tokens: two rows per pass over their x */
            for (; i + 2 <= nr; i += 2)
                mv_row2_mxfp4(W->w + (size_t)(r0 + i) * (n / 2), W->w + (size_t)(r0 + i + 1) * (n / 2), n, W->mx_scale + (size_t)(r0 + i) * (n / 32),
                              W->mx_scale + (size_t)(r0 + i + 1) * (n / 32), lut, spread, xb, ldx, y + i, ldy, G);
        for (; i < nr; i++)
            mv_row_mxfp4(W->w + (size_t)(r0 + i) * (n / 2), n, W->mx_scale + (size_t)(r0 + i) * (n / 32), lut, spread, xb, ldx, y + i, ldy, G);
        return;
    }
    default:
        return;
    }
}

BF16 static void matvec_bf16_avx512(const Mat *W, int r0, int nr, const float *xs, float *y) {
    const int np = (W->cols + 127) & ~127;
    uint16_t xbuf[np + 32]; /* x in bf16, on this thread's stack (tens of KB at most), */
    uint16_t *xb = (uint16_t *)(((uintptr_t)xbuf + 63) & ~(uintptr_t)63); /* 64-byte aligned */
    round_x_bf16(xs, np, xb);
    mv_rows_g(W, r0, nr, xb, 0, y, 0, 1);
}

/* n tokens in groups of MV_GROUP; the row loop is the outer one, so a row read from
 * memory once serves every group from L1. */
BF16 static void matvec_bf16_n_avx512(const Mat *W, int r0, int nr, const uint16_t *xb, size_t ldx, int n, float *y, size_t ldy) {
    const int R = 2; /* rows per pass: with several tokens mv_rows_g pairs rows */
    for (int i = 0; i < nr; i += R)
        for (int t = 0; t < n; t += MV_GROUP) {
            const int rows = nr - i < R ? nr - i : R;
            const uint16_t *x = xb + (size_t)t * ldx;
            float *yt = y + (size_t)t * ldy + i;
            switch (n - t < MV_GROUP ? n - t : MV_GROUP) {
            case 4: mv_rows_g(W, r0 + i, rows, x, ldx, yt, ldy, 4); break;
            case 3: mv_rows_g(W, r0 + i, rows, x, ldx, yt, ldy, 3); break;
            case 2: mv_rows_g(W, r0 + i, rows, x, ldx, yt, ldy, 2); break;
            default: mv_rows_g(W, r0 + i, rows, x, ldx, yt, ldy, 1); break;
            }
        }
}

/* The MLA absorb of one token reads W_UK (BF16) against the grain: q_abs = Σ_i q[i]·row i.
 * 256 columns at a time stay in 16 accumulators while the rows stream past, instead of
 * each row widened into a buffer and added into q_abs in memory. A pass reads 512 bytes
 * of each 1 KB row, a stride the hardware prefetcher follows poorly: the first pass asks
 * for whole rows 8 ahead, and the second finds them in L2 (with the prefetch, 1.4% of a
 * decode's time for 0.7% of its bytes; without, 2.2%; widening each row into a buffer
 * and adding it into q_abs, 1.7%: perf on glm run, 100 tokens). */
AVX512 static void matvec_transposed_bf16_avx512(const Mat *W, int r0, int nr, const float *x, float *y) {
    const int n = W->cols;
    const uint16_t *w = (const uint16_t *)W->w + (size_t)r0 * n;
    for (int c0 = 0; c0 < n; c0 += 256) {
        __mmask16 m[16];
        __m512 acc[16]; /* every loop over it unrolled: then GCC keeps it in registers */
#pragma GCC unroll 16
        for (int q = 0; q < 16; q++) {
            int left = n - c0 - 16 * q;
            m[q] = left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
            acc[q] = _mm512_setzero_ps();
        }
        for (int i = 0; i < nr; i++) {
            const __m512 a = _mm512_set1_ps(x[i]);
            const uint16_t *row = w + (size_t)i * n + c0;
            if (c0 == 0 && i + 8 < nr) /* the rows 8 ahead, whole, into L2: later passes find them there */
                for (int b = 0; b < 2 * n; b += 64) _mm_prefetch((const char *)(w + (size_t)(i + 8) * n) + b, _MM_HINT_T2);
#pragma GCC unroll 16
            for (int q = 0; q < 16; q++) acc[q] = _mm512_fmadd_ps(a, bf16x16_masked(row + 16 * q, m[q]), acc[q]);
        }
#pragma GCC unroll 16
        for (int q = 0; q < 16; q++) _mm512_mask_storeu_ps(y + c0 + 16 * q, m[q], acc[q]);
    }
}

/* ------------------------------------------------------------------------ */
/* AVX2 + FMA: the same kernels 8 lanes wide, for CPUs without AVX-512. The
 * 16-entry E2M1 table does not fit one 8-lane permute, so the 3 magnitude bits
 * index an 8-entry table and the sign bit is xor-ed in. */
#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

AVX2 static inline __m256 fp8x8(const uint8_t *p) { /* as fp8x16 */
    __m256i d = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256 tiny = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(d, 20), _mm256_set1_epi32((int)0x87F00000u)));
    return _mm256_mul_ps(tiny, _mm256_set1_ps(0x1p120f));
}

AVX2 static inline __m256 e2m1x8(__m256i nib, __m256 lut8) { /* nib: 4-bit codes in 32-bit lanes */
    __m256 mag = _mm256_permutevar8x32_ps(lut8, nib); /* uses the low 3 bits */
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(8)), 28);
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
}

AVX2 static float dot_f32_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    float sum = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

AVX2 static void axpy_f32_avx2(float *y, float a, const float *x, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* One row at a time (two chains); tails in scalar code. */
AVX2 static float row_dot_avx2(const Mat *W, int r, const float *x, const float *xs) {
    const int n = W->cols;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    float tail = 0.0f;
    int k = 0;
    switch (W->fmt) {
    case WF_F32: return dot_f32_avx2((const float *)W->w + (size_t)r * n, x, n);
    case WF_BF16: {
        const uint16_t *w = (const uint16_t *)W->w + (size_t)r * n;
        for (; k + 16 <= n; k += 16) {
            a0 = _mm256_fmadd_ps(bf16x8(w + k), _mm256_loadu_ps(x + k), a0);
            a1 = _mm256_fmadd_ps(bf16x8(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
        }
        for (; k < n; k++) tail += bf16_to_f32(w[k]) * x[k];
        return hsum8(_mm256_add_ps(a0, a1)) + tail;
    }
    case WF_FP8: {
        const uint8_t *w = W->w + (size_t)r * n;
        const float *scale = W->fp8_scale + (size_t)(r / 128) * ((n + 127) / 128);
        float sum = 0.0f;
        for (int b = 0; b * 128 < n; b++) {
            int end = b * 128 + 128 < n ? b * 128 + 128 : n;
            a0 = a1 = _mm256_setzero_ps();
            float part = 0.0f;
            for (k = b * 128; k + 16 <= end; k += 16) {
                a0 = _mm256_fmadd_ps(fp8x8(w + k), _mm256_loadu_ps(x + k), a0);
                a1 = _mm256_fmadd_ps(fp8x8(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
            }
            for (; k < end; k++) part += fp8_table[w[k]] * x[k];
            sum += (hsum8(_mm256_add_ps(a0, a1)) + part) * scale[b];
        }
        return sum;
    }
    case WF_MXFP4: {
        const uint8_t *w = W->w + (size_t)r * (n / 2), *sc = W->mx_scale + (size_t)r * (n / 32);
        const __m256 lut8 = _mm256_loadu_ps(e2m1_value);
        __m256 t = _mm256_setzero_ps();
        for (int b = 0; b < n / 32; b++) {
            __m256i d0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + 16 * b)));
            __m256i d1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + 16 * b + 8)));
            /* xs: 16 even then 16 odd elements of the block; low nibbles are the evens */
            __m256 v = _mm256_mul_ps(e2m1x8(d0, lut8), _mm256_loadu_ps(xs + 32 * b));
            v = _mm256_fmadd_ps(e2m1x8(d1, lut8), _mm256_loadu_ps(xs + 32 * b + 8), v);
            v = _mm256_fmadd_ps(e2m1x8(_mm256_srli_epi32(d0, 4), lut8), _mm256_loadu_ps(xs + 32 * b + 16), v);
            v = _mm256_fmadd_ps(e2m1x8(_mm256_srli_epi32(d1, 4), lut8), _mm256_loadu_ps(xs + 32 * b + 24), v);
            t = _mm256_fmadd_ps(v, _mm256_set1_ps(e8m0_table[sc[b]]), t);
        }
        return hsum8(t);
    }
    }
    return 0.0f;
}

AVX2 static void matvec_avx2(const Mat *W, int r0, int nr, const float *x, const float *xs, float *y) {
    for (int i = 0; i < nr; i++) y[i] = row_dot_avx2(W, r0 + i, x, xs);
}

/* row_dot_avx2 of one row against G tokens (G <= 4; x_g = x + g*ldx, its split xs + g*ldxs):
 * the row's weights are decoded once for all of them, and each token's sum takes exactly
 * row_dot_avx2's operations in row_dot_avx2's order, so its result does not depend on the
 * tokens beside it (glm serve's batches, --draft's verify pass). always_inline with G a
 * constant at each call: the per-token arrays become registers. */
#define ROW_G AVX2 static inline __attribute__((always_inline)) void
ROW_G row_dot_g_avx2(const Mat *W, int r, const float *x, size_t ldx, const float *xs, size_t ldxs, float *y, size_t ldy, const int G) {
    const int n = W->cols;
    __m256 a0[4], a1[4];
    float tail[4];
    int k = 0;
    switch (W->fmt) {
    case WF_F32: /* the router: one dot per token */
        for (int g = 0; g < G; g++) y[g * ldy] = dot_f32_avx2((const float *)W->w + (size_t)r * n, x + g * ldx, n);
        return;
    case WF_BF16: {
        const uint16_t *w = (const uint16_t *)W->w + (size_t)r * n;
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) { a0[g] = a1[g] = _mm256_setzero_ps(); tail[g] = 0.0f; }
        for (; k + 16 <= n; k += 16) {
            const __m256 w0 = bf16x8(w + k), w1 = bf16x8(w + k + 8);
            #pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                a0[g] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + g * ldx + k), a0[g]);
                a1[g] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + g * ldx + k + 8), a1[g]);
            }
        }
        for (; k < n; k++)
            for (int g = 0; g < G; g++) tail[g] += bf16_to_f32(w[k]) * x[g * ldx + k];
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) y[g * ldy] = hsum8(_mm256_add_ps(a0[g], a1[g])) + tail[g];
        return;
    }
    case WF_FP8: {
        const uint8_t *w = W->w + (size_t)r * n;
        const float *scale = W->fp8_scale + (size_t)(r / 128) * ((n + 127) / 128);
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int b = 0; b * 128 < n; b++) {
            const int end = b * 128 + 128 < n ? b * 128 + 128 : n;
            #pragma GCC unroll 4
            for (int g = 0; g < G; g++) { a0[g] = a1[g] = _mm256_setzero_ps(); tail[g] = 0.0f; }
            for (k = b * 128; k + 16 <= end; k += 16) {
                const __m256 w0 = fp8x8(w + k), w1 = fp8x8(w + k + 8);
                #pragma GCC unroll 4
                for (int g = 0; g < G; g++) {
                    a0[g] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + g * ldx + k), a0[g]);
                    a1[g] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + g * ldx + k + 8), a1[g]);
                }
            }
            for (; k < end; k++)
                for (int g = 0; g < G; g++) tail[g] += fp8_table[w[k]] * x[g * ldx + k];
            #pragma GCC unroll 4
            for (int g = 0; g < G; g++) sum[g] += (hsum8(_mm256_add_ps(a0[g], a1[g])) + tail[g]) * scale[b];
        }
        for (int g = 0; g < G; g++) y[g * ldy] = sum[g];
        return;
    }
    case WF_MXFP4: {
        const uint8_t *w = W->w + (size_t)r * (n / 2), *sc = W->mx_scale + (size_t)r * (n / 32);
        const __m256 lut8 = _mm256_loadu_ps(e2m1_value);
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) a0[g] = _mm256_setzero_ps(); /* row_dot_avx2's t */
        for (int b = 0; b < n / 32; b++) {
            const __m256i d0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + 16 * b)));
            const __m256i d1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + 16 * b + 8)));
            const __m256 e0 = e2m1x8(d0, lut8), e1 = e2m1x8(d1, lut8);
            const __m256 e2 = e2m1x8(_mm256_srli_epi32(d0, 4), lut8), e3 = e2m1x8(_mm256_srli_epi32(d1, 4), lut8);
            const __m256 s = _mm256_set1_ps(e8m0_table[sc[b]]);
            #pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                const float *xb = xs + g * ldxs + 32 * b;
                __m256 v = _mm256_mul_ps(e0, _mm256_loadu_ps(xb));
                v = _mm256_fmadd_ps(e1, _mm256_loadu_ps(xb + 8), v);
                v = _mm256_fmadd_ps(e2, _mm256_loadu_ps(xb + 16), v);
                v = _mm256_fmadd_ps(e3, _mm256_loadu_ps(xb + 24), v);
                a0[g] = _mm256_fmadd_ps(v, s, a0[g]);
            }
        }
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) y[g * ldy] = hsum8(a0[g]);
        return;
    }
    }
}

/* matvec_avx2 for n tokens, in groups of 4 over each row (row_dot_g_avx2): token t's
 * results are bit for bit matvec_avx2's for x_t alone. */
AVX2 static void matvec_n_avx2(const Mat *W, int r0, int nr, const float *x, size_t ldx, const float *xs, size_t ldxs, int n, float *y, size_t ldy) {
    for (int i = 0; i < nr; i++)
        for (int t = 0; t < n; t += 4) {
            const float *xt = x + (size_t)t * ldx, *st = xs + (size_t)t * ldxs;
            float *yt = y + (size_t)t * ldy + i;
            switch (n - t < 4 ? n - t : 4) {
            case 4: row_dot_g_avx2(W, r0 + i, xt, ldx, st, ldxs, yt, ldy, 4); break;
            case 3: row_dot_g_avx2(W, r0 + i, xt, ldx, st, ldxs, yt, ldy, 3); break;
            case 2: row_dot_g_avx2(W, r0 + i, xt, ldx, st, ldxs, yt, ldy, 2); break;
            default: row_dot_g_avx2(W, r0 + i, xt, ldx, st, ldxs, yt, ldy, 1); break;
            }
        }
}

static int cpu_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
#endif

/* Plain C versions of the two machine measurements (for CPUs without AVX-512). */
static double read_bandwidth_plain(const ReadRun *runs, int n_runs) {
    double t0 = now_s(), bytes = 0;
    uint64_t sink = 0;
    for (int r = 0; r < n_runs; r++) bytes += (double)runs[r].n;
#pragma omp parallel for reduction(+ : sink) schedule(dynamic, 1)
    for (int r = 0; r < n_runs; r++)
        for (size_t i = 0; i < runs[r].n; i += 64) {
            uint64_t v[8];
            memcpy(v, runs[r].p + i, 64);
            sink += v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
        }
    double dt = now_s() - t0;
    return sink == 42 ? 0.0 : bytes / dt;
}

static double fma_peak_plain(void) {
    const long iters = 50000000;
    double t0 = now_s();
    float sink = 0.0f;
    int threads = 1;
#pragma omp parallel reduction(+ : sink)
    {
        float a[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        for (long i = 0; i < iters; i++)
            for (int j = 0; j < 8; j++) a[j] = a[j] * 0.9999999f + 1e-7f;
        for (int j = 0; j < 8; j++) sink += a[j];
    }
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    return sink == 42.0f ? 0.0 : 2.0 * 8 * iters * threads / (now_s() - t0);
}

/* The kernel table glm.c calls through. NULL entries mean "use the plain C loop". */
Kernels kernels = {.name = "plain C", .read_bandwidth = read_bandwidth_plain, .fma_peak = fma_peak_plain};

void kernels_init(const char *want) {
    Kernels plain = {.name = "plain C", .read_bandwidth = read_bandwidth_plain, .fma_peak = fma_peak_plain};
    kernels = plain;
    if (want && !strcmp(want, "c")) return;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        Kernels k = {.name = "AVX2", .matvec = matvec_avx2, .matvec_n = matvec_n_avx2, .dot = dot_f32_avx2, .axpy = axpy_f32_avx2,
                     .read_bandwidth = read_bandwidth_plain, .fma_peak = fma_peak_plain};
        kernels = k;
    }
    if (want && !strcmp(want, "avx2")) return; /* GLM_KERNELS=avx2: test the AVX2 set on an AVX-512 machine */
    if (cpu_has_avx512()) {
        for (int sc = 0; sc < 256; sc++)
            for (int i = 0; i < 16; i++) mx_e2m1_scaled[sc][i] = e2m1_value[i] * e8m0_to_f32((uint8_t)sc);
        Kernels k = {.name = "AVX-512", .matvec = matvec_avx512, .matvec_n_packed = matvec_n_packed_avx512, .dequant_row = dequant_row_avx512, .gemm_panel = gemm_panel_avx512,
                     .pack_panel = pack_panel_avx512, .matvec_transposed_bf16 = matvec_transposed_bf16_avx512,
                     .dot = dot_f32_avx512, .axpy = axpy_f32_avx512, .softmax = softmax_avx512, .index_relu_sums = index_relu_sums_avx512,
                     .read_bandwidth = read_bandwidth_avx512, .fma_peak = fma_peak_avx512};
        if (__builtin_cpu_supports("avx512bf16")) {
            k.name = "AVX-512 (+BF16)";
            k.bf16_speedup = bf16_speedup_avx512;
            k.gemm_panel_bf16 = gemm_panel_bf16_avx512;
            k.build_panel_bf16 = build_panel_bf16_avx512;
            k.round_bf16 = round_bf16_avx512;
            k.pack_pairs_bf16 = pack_pairs_bf16_avx512;
            k.gemm_rows_bf16 = gemm_rows_bf16_avx512;
            k.matvec_bf16 = matvec_bf16_avx512;
            k.matvec_bf16_n = matvec_bf16_n_avx512;
        }
        kernels = k;
    }
#endif
}
