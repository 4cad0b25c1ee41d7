/* stream_ops_lab.c - the thirteenth session's question: how many instructions per 64-byte line
 * can a streaming loop spend before it reads slower, with and without software prefetch?
 * Over 1 GiB of a shard's page cache, 2 threads, 8 MB runs, every variant in turn each round:
 *   - the plain read plus N dependent shift/xor ops on each loaded line (N = 0 .. 24);
 *   - an FP8-like body (the decode loop's unpacking, two x loads, two vdpbf16ps, a sum per
 *     128 bytes), and the same without the unpacking ("dot only");
 * each with no software prefetch, one line 64 KB ahead at every 4 KB page, or every line 8 KB
 * ahead. Prints each over the plain read (geometric mean of the rounds). Not part of the build:
 *   gcc -std=gnu11 -O2 -fopenmp -mavx512f -mavx512bw -o /tmp/ops notes/stream_ops_lab.c -lm
 *   /tmp/ops 6 /work/bench/glm2/model-00001-of-00003.safetensors */
#define _GNU_SOURCE
#include <fcntl.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
#define OPS1(v) v=_mm512_xor_si512(_mm512_srli_epi16(v,3),v)
#define BODY(N) for(int o=0;o<(N)/2;o++){OPS1(w);} 
#define K(N,PFM) static long k_##N##_##PFM(const uint8_t*p,size_t n){__m512i a=_mm512_setzero_si512(),b=a,c=a,d=a; \
  for(size_t i=0;i<n;i+=256){ if(PFM==1 && ((uintptr_t)(p+i)&4095)==0) _mm_prefetch((const char*)p+i+65536,_MM_HINT_T2); \
    if(PFM==2){_mm_prefetch((const char*)p+i+8192,_MM_HINT_T2);_mm_prefetch((const char*)p+i+8256,_MM_HINT_T2);_mm_prefetch((const char*)p+i+8320,_MM_HINT_T2);_mm_prefetch((const char*)p+i+8384,_MM_HINT_T2);} \
    __m512i w; w=_mm512_loadu_si512(p+i); BODY(N) a=_mm512_add_epi64(a,w); w=_mm512_loadu_si512(p+i+64); BODY(N) b=_mm512_add_epi64(b,w); \
    w=_mm512_loadu_si512(p+i+128); BODY(N) c=_mm512_add_epi64(c,w); w=_mm512_loadu_si512(p+i+192); BODY(N) d=_mm512_add_epi64(d,w);} \
  return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a,b),_mm512_add_epi64(c,d)));}
#define KS(N) K(N,0) K(N,1) K(N,2)
static uint16_t XB[8192] __attribute__((aligned(64)));
/* FP8-like bodies: D=1 dot only (2 x loads + 2 dpbf16 per line), D=2 with the 5-op unpacking; sums chained per 128 B block as simd.c */
#define KD(D,PFM) __attribute__((target("avx512f,avx512bw,avx512bf16"))) static long d_##D##_##PFM(const uint8_t*p,size_t n){ \
  const __m512i mask=_mm512_set1_epi16((short)0x87F0); __m512 t=_mm512_setzero_ps(); \
  for(size_t i=0;i<n;i+=128){ if(PFM==1 && ((uintptr_t)(p+i)&4095)==0) _mm_prefetch((const char*)p+i+65536,_MM_HINT_T2); \
    if(PFM==2){_mm_prefetch((const char*)p+i+8192,_MM_HINT_T2);_mm_prefetch((const char*)p+i+8256,_MM_HINT_T2);} \
    const uint16_t*x=XB+(i&4095); __m512 a0=_mm512_setzero_ps(),a1=a0; \
    for(int h=0;h<2;h++){ __m512i w=_mm512_loadu_si512(p+i+64*h); __asm__("" : "+v"(w)); __m512i e=w,o=w; \
      if(D==2){o=_mm512_and_si512(_mm512_srai_epi16(w,4),mask); e=_mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(w,8),4),mask);} \
      a0=_mm512_dpbf16_ps(a0,(__m512bh)e,(__m512bh)_mm512_load_si512(x+64*h)); a1=_mm512_dpbf16_ps(a1,(__m512bh)o,(__m512bh)_mm512_load_si512(x+64*h+32));} \
    t=_mm512_fmadd_ps(_mm512_add_ps(a0,a1),_mm512_set1_ps(1e-3f),t);} \
  float r=_mm512_reduce_add_ps(t); return (long)(r!=r);}
KD(1,0) KD(1,1) KD(1,2) KD(2,0) KD(2,1) KD(2,2)
KS(0) KS(4) KS(8) KS(12) KS(16) KS(24)
typedef long (*F)(const uint8_t*,size_t);
static F fs[]={k_0_0,k_0_1,k_0_2,k_4_0,k_4_1,k_4_2,k_8_0,k_8_1,k_8_2,k_12_0,k_12_1,k_12_2,k_16_0,k_16_1,k_16_2,k_24_0,k_24_1,k_24_2,d_1_0,d_1_1,d_1_2,d_2_0,d_2_1,d_2_2};
static const int Ns[]={0,4,8,12,16,24};
#define NV 24
int main(int argc,char**argv){
  if(argc<3){fprintf(stderr,"usage: ops ROUNDS SHARD (a file of 1.1 GB or more)\n");return 1;}
  for(int i=0;i<8192;i++) XB[i]=0x5f80^(i&7);
  int rounds=atoi(argv[1]); int fd=open(argv[2],O_RDONLY);struct stat st;
  /* 1 GiB is read from byte 4096 on, and the prefetches reach 64 KB past it */
  if(rounds<1||fd<0||fstat(fd,&st)||st.st_size<(1l<<30)+(1l<<20)){fprintf(stderr,"ops: %s: need ROUNDS >= 1 and a file of 1.1 GB or more\n",argv[2]);return 1;}
  const uint8_t*m=mmap(0,st.st_size,PROT_READ,MAP_SHARED,fd,0); for(off_t o=0;o<st.st_size;o+=4096)(void)*(volatile const uint8_t*)(m+o);
  const uint8_t*W=m+4096; size_t run=8u<<20; int nruns=128; double ls[NV]={0}; long sink=0;
  for(int r=0;r<rounds;r++){double g[NV]; for(int k=0;k<NV;k++){int v=(k+r*5)%NV; double t=now();
#pragma omp parallel for schedule(dynamic,1) reduction(+:sink)
      for(int q=0;q<nruns;q++) sink+=fs[v](W+(size_t)q*run,run);
      g[v]=nruns*(double)run/(now()-t)/1e9;}
    for(int v=0;v<NV;v++) ls[v]+=log(g[v]/g[0])/rounds;}
  printf("extra ops/line | none | page+64K | every line 8K   (x the plain read, geometric mean of %d rounds)\n",rounds);
  for(int i=0;i<6;i++) printf("%3d | %.3f | %.3f | %.3f\n",Ns[i],exp(ls[3*i]),exp(ls[3*i+1]),exp(ls[3*i+2]));
  printf("dot only | %.3f | %.3f | %.3f\nfp8 unpack+dot | %.3f | %.3f | %.3f\n",exp(ls[18]),exp(ls[19]),exp(ls[20]),exp(ls[21]),exp(ls[22]),exp(ls[23]));
  return (int)(sink&0);}
