// OMP_NUM_THREADS threads, each its own contiguous slice of 1 GiB: a streaming read vs the same with one
// prefetch FAR bytes ahead every EVERY bytes, alternating. Usage: rows2 ROUNDS [FAR [EVERY]]
// Build: gcc -O2 -fopenmp -o rows2 rows2.c
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#define AVX512 __attribute__((target("avx512f,avx512bw")))
static double now_s(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static size_t FAR=65536, EVERY=6144;
AVX512 static unsigned long long stream(const uint8_t *buf, size_t lo, size_t hi){
  __m512i a=_mm512_setzero_si512(),b=a,c=a,d=a;
  for(size_t i=lo;i<hi;i+=256){a=_mm512_add_epi64(a,_mm512_load_si512(buf+i));b=_mm512_add_epi64(b,_mm512_load_si512(buf+i+64));
   c=_mm512_add_epi64(c,_mm512_load_si512(buf+i+128));d=_mm512_add_epi64(d,_mm512_load_si512(buf+i+192));}
  unsigned long long l[8],s=0;_mm512_storeu_si512(l,_mm512_add_epi64(_mm512_add_epi64(a,b),_mm512_add_epi64(c,d)));for(int i=0;i<8;i++)s+=l[i];return s;}
AVX512 static unsigned long long stream_pf(const uint8_t *buf, size_t lo, size_t hi){ /* one far prefetch per EVERY bytes */
  __m512i a=_mm512_setzero_si512(),b=a,c=a,d=a;
  for(size_t j=lo;j<hi;j+=EVERY){ _mm_prefetch((const char*)buf+j+FAR,_MM_HINT_T2); size_t e=j+EVERY<hi?j+EVERY:hi;
  for(size_t i=j;i<e;i+=256){a=_mm512_add_epi64(a,_mm512_load_si512(buf+i));b=_mm512_add_epi64(b,_mm512_load_si512(buf+i+64));
   c=_mm512_add_epi64(c,_mm512_load_si512(buf+i+128));d=_mm512_add_epi64(d,_mm512_load_si512(buf+i+192));}}
  unsigned long long l[8],s=0;_mm512_storeu_si512(l,_mm512_add_epi64(_mm512_add_epi64(a,b),_mm512_add_epi64(c,d)));for(int i=0;i<8;i++)s+=l[i];return s;}
int main(int argc,char**argv){
  size_t n=1ul<<30; uint8_t*r=mmap(NULL,n+(2<<20)+(1<<20),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  uint8_t*buf=(uint8_t*)(((uintptr_t)r+(2<<20)-1)&~(uintptr_t)((2<<20)-1)); madvise(buf,n+(1<<20),MADV_HUGEPAGE); memset(buf,1,n+(1<<20));
  int rounds=atoi(argv[1]); if(argc>2)FAR=atol(argv[2]); if(argc>3)EVERY=atol(argv[3]);
  for(int R=0;R<rounds;R++){ double t[2];
    for(int v0=0;v0<2;v0++){ int v=(v0+R)%2; unsigned long long sink=0; double t0=now_s();
#pragma omp parallel reduction(+:sink)
      {size_t nt=omp_get_num_threads(),id=omp_get_thread_num();size_t per=(n/256+nt-1)/nt*256,lo=id*per,hi=lo+per<n?lo+per:n; sink+= v?stream_pf(buf,lo,hi):stream(buf,lo,hi);}
      t[v]=now_s()-t0; if(sink==42)puts("");}
    printf("stream %.1f GB/s  stream+far %.1f GB/s  ratio %.3f\n", n/t[0]/1e9, n/t[1]/1e9, t[0]/t[1]);
  }
}
