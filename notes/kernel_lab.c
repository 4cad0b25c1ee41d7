/* kernel_lab.c - the eighth session's microbenchmark: the committed matvec_bf16 FP8 and MXFP4 kernels
 * against loop-shape variants (notes/2026-12-05-loop-shape.diff has them as a simd.c patch), in L2
 * on one thread (mode 0: compute rate per core) and from a 1 GiB buffer on two threads (mode 1,
 * with the read loop before and after each pass). Not part of the build or the tests:
 *   gcc -std=c11 -O2 -fopenmp -Dmain=glm_cli_main -o /tmp/lab notes/kernel_lab.c \
 *       glm.c json.c synth.c simd.c convert.c tokenizer.c -lm
 *   OMP_NUM_THREADS=1 /tmp/lab 0 10; /tmp/lab 1 6 */
#define _GNU_SOURCE
#undef main
#include "../glm.h"
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <omp.h>
#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"),noinline))
/* simd.c's prefetch distances and round_x_bf16 are private to it: copied here, so keep
 * them equal to simd.c's when re-measuring, or the variants are not compared like for like */
#ifndef AHEAD_FP8
#define AHEAD_FP8 8192
#endif
#ifndef AHEAD_MXFP4
#define AHEAD_MXFP4 8192
#endif
#define AHEAD_FAR 65536
#define PREFETCH_AT(p, ahead) _mm_prefetch((const char *)(p) + (ahead), _MM_HINT_T2)
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint64_t rng=88172645463325252ull;
static uint32_t rnd(void){rng^=rng<<13;rng^=rng>>7;rng^=rng<<17;return (uint32_t)(rng>>11);}
static void *huge(size_t n){void*p=mmap(NULL,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);madvise(p,n,MADV_HUGEPAGE);return p;}
BF16 static void round_x(const float *xs, int np, uint16_t *xb) { for (int p = 0; p < np; p += 16) _mm256_storeu_si256((__m256i *)(xb + p), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(xs + p))); }

/* FP8, widths a multiple of 128: one block (2 lines) per iteration, no tail test */
BF16 static void fp8_new(const Mat *W, int r0, int nr, const float *xs, float *y) {
    const int n = W->cols, nb = n / 128;
    uint16_t xbuf[n + 32]; uint16_t *xb = (uint16_t *)(((uintptr_t)xbuf + 63) & ~(uintptr_t)63);
    round_x(xs, n, xb);
    const __m512i mask = _mm512_set1_epi16((short)0x87F0);
    for (int i = 0; i < nr; i++) {
        const int r = r0 + i;
        const uint8_t *w = W->w + (size_t)r * n;
        const float *scale = W->fp8_scale + (size_t)(r / 128) * nb;
        PREFETCH_AT(w, AHEAD_FAR);
        __m512 t0 = _mm512_setzero_ps(), t1 = t0;
        for (int b = 0; b < nb; b++) {
            const uint8_t *p = w + 128 * b; const uint16_t *x = xb + 128 * b;
            PREFETCH_AT(p, AHEAD_FP8); PREFETCH_AT(p + 64, AHEAD_FP8);
            __m512i w0 = _mm512_loadu_si512(p), w1 = _mm512_loadu_si512(p + 64);
            __asm__("" : "+v"(w0), "+v"(w1)); /* one load per line (GCC would fold it into both shifts) */
            __m512 a0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(w0, 8), 4), mask), (__m512bh)_mm512_loadu_si512(x));
            __m512 a1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_and_si512(_mm512_srai_epi16(w0, 4), mask), (__m512bh)_mm512_loadu_si512(x + 32));
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(w1, 8), 4), mask), (__m512bh)_mm512_loadu_si512(x + 64));
            a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_and_si512(_mm512_srai_epi16(w1, 4), mask), (__m512bh)_mm512_loadu_si512(x + 96));
            const __m512 s = _mm512_set1_ps(scale[b] * 0x1p56f);
            if (b & 1) t1 = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), s, t1); else t0 = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), s, t0);
        }
        y[i] = _mm512_reduce_add_ps(_mm512_add_ps(t0, t1));
    }
}

/* MXFP4: full 64-byte groups without a tail test; scales 16 at a time widened to dwords,
 * one vpermd per group */
BF16 static void mx_new(const Mat *W, int r0, int nr, const float *xs, float *y) {
    const int n = W->cols, nb = n / 32, np = (n + 127) & ~127;
    uint16_t xbuf[np + 32]; uint16_t *xb = (uint16_t *)(((uintptr_t)xbuf + 63) & ~(uintptr_t)63);
    round_x(xs, np, xb);
    uint16_t table[32];
    for (int c = 0; c < 32; c++) table[c] = f32_to_bf16(e2m1_value[c % 16]);
    const __m512i lut = _mm512_loadu_si512(table);
    /* lane l of group g (blocks 4g..4g+3) takes scale 4g + l/4 */
    const __m512i q0 = _mm512_set_epi32(3,3,3,3,2,2,2,2,1,1,1,1,0,0,0,0);
    const __m512i q1 = _mm512_add_epi32(q0, _mm512_set1_epi32(4)), q2 = _mm512_add_epi32(q0, _mm512_set1_epi32(8)), q3 = _mm512_add_epi32(q0, _mm512_set1_epi32(12));
#define MXG(g, q, t)                                                                                                   \
    do {                                                                                                            \
        const uint8_t *p = w + 16 * (b + 4 * (g)); const uint16_t *x = xb + 32 * (b + 4 * (g));                   \
        PREFETCH_AT(p, AHEAD_MXFP4);                                                                                \
        __m512i words = _mm512_loadu_si512(p);                                                                      \
        __asm__("" : "+v"(words));                                                                                  \
        __m512 a0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_permutexvar_epi16(words, lut), (__m512bh)_mm512_loadu_si512(x)); \
        __m512 a1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 4), lut), (__m512bh)_mm512_loadu_si512(x + 32)); \
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 8), lut), (__m512bh)_mm512_loadu_si512(x + 64)); \
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 12), lut), (__m512bh)_mm512_loadu_si512(x + 96)); \
        t = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), _mm512_castsi512_ps(_mm512_permutexvar_epi32(q, s16)), t);     \
    } while (0)
    for (int i = 0; i < nr; i++) {
        const uint8_t *w = W->w + (size_t)(r0 + i) * (n / 2), *sc = W->mx_scale + (size_t)(r0 + i) * nb;
        PREFETCH_AT(w, AHEAD_FAR);
        __m512 t0 = _mm512_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
        int b = 0;
        for (; b + 16 <= nb; b += 16) { /* 256 bytes, 16 blocks */
            const __m512i s16 = _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + b))), 23);
            MXG(0, q0, t0); MXG(1, q1, t1); MXG(2, q2, t2); MXG(3, q3, t3);
        }
        /* no tail: the lab's widths are multiples of 512 columns (the simd.c patch has one) */
        y[i] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(t0, t1), _mm512_add_ps(t2, t3)));
    }
#undef MXG
}

static Mat mk(WeightFormat f,int rows,int cols){Mat W;memset(&W,0,sizeof W);W.fmt=f;W.rows=rows;W.cols=cols;
 size_t n=(size_t)rows*cols; size_t bytes=f==WF_BF16?n*2:f==WF_FP8?n:n/2; uint8_t*p=huge(bytes);
 for(size_t i=0;i<bytes;i++){uint8_t b=(uint8_t)rnd(); if(f==WF_FP8&&(b&0x7f)==0x7f)b=1; p[i]=b;}
 W.w=p;W.bytes=bytes; if(f==WF_FP8){int nb=((rows+127)/128)*((cols+127)/128);float*s=malloc(nb*4);for(int i=0;i<nb;i++)s[i]=ldexpf(1,-(int)(rnd()%8));W.fp8_scale=s;}
 if(f==WF_MXFP4){uint8_t*s=malloc(n/32);for(size_t i=0;i<n/32;i++)s[i]=118+rnd()%16;W.mx_scale=s;} return W;}
typedef void (*KF)(const Mat*,int,int,const float*,float*);
int main(int argc,char**argv){ number_tables_init(); kernels_init(NULL);
 int mode=argc>1?atoi(argv[1]):0, reps=argc>2?atoi(argv[2]):4; int cols=6144;
 float*x=malloc(cols*4),*xs=malloc((cols+256)*4); for(int i=0;i<cols;i++)x[i]=(rnd()%1000)/1000.0f-0.5f;
 WeightFormat fm[2]={WF_FP8,WF_MXFP4}; KF nf[2]={fp8_new,mx_new}; const char*nm[2]={"fp8","mxfp4"};
 uint8_t*buf=NULL; size_t target=(size_t)1<<30; if(mode){buf=huge(target); memset(buf,1,target);}
 for(int f=0;f<2;f++){
  int rb=fm[f]==WF_FP8?cols:cols/2; int rows= mode==0 ? (262144/rb)&~0 : (int)(target/rb)&~255; if(mode==0) rows=fm[f]==WF_FP8?40:80;
  Mat W=mk(fm[f],rows,cols); float*y=malloc(rows*4),*y2=malloc(rows*4); matvec_order_bf16(&W,x,xs);
  kernels.matvec_bf16(&W,0,rows,xs,y); nf[f](&W,0,rows,xs,y2); double md=0,mx=0; for(int i=0;i<rows;i++){double d=fabs(y[i]-y2[i]); if(d>md)md=d; if(fabs(y[i])>mx)mx=fabs(y[i]);}
  printf("%s: max diff %.3g of max %.3g\n",nm[f],md,mx);
  double sum[2]={0,0}; 
  for(int r=0;r<reps;r++) for(int v=0;v<2;v++){ KF k = v==0 ? kernels.matvec_bf16 : nf[f];
   if(mode==0){ double t=now(); for(int it=0;it<2000;it++) k(&W,0,rows,xs,y); double g=2000.0*W.bytes/(now()-t)/1e9; sum[v]+=log(g); printf("  %s %s L2 1 thread: %.1f GB/s\n",nm[f],v?"new":"old",g);}
   else { ReadRun whole={buf,target}; double b0=kernels.read_bandwidth(&whole,1); double t=now();
    #pragma omp parallel
    { int nt=omp_get_num_threads(),id=omp_get_thread_num(); int per=rows/nt; k(&W,id*per,per,xs,y+id*per);}
    double g=W.bytes/(now()-t)/1e9; double b1=kernels.read_bandwidth(&whole,1); double ratio=2*g/(b0+b1)*1e9; sum[v]+=log(ratio);
    printf("  %s %s mem: %.1f GB/s, read %.1f, ratio %.3f\n",nm[f],v?"new":"old",g,(b0+b1)/2e9,ratio);}
  }
  printf("%s new/old geo mean: %.3f\n",nm[f],exp((sum[1]-sum[0])/reps));
 }
 return 0;}
