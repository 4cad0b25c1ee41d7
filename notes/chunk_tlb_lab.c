/* chunk_tlb_lab.c - the thirteenth session: per 2 MB chunk, a streaming read (one thread, alone)
 * and a TLB probe (a dependent chain of loads, one line in each of the chunk's 512 4 KB pages,
 * all of them in L1, so a hop costs what the TLB costs): a fresh 4 GB anonymous allocation on 2 MB
 * pages (set 0) and the page cache of FILE... (set 1), all chunks in a new random order each round.
 * Prints one line per chunk: index, set, then GB/s and ns per hop of each round. Root not needed.
 *   gcc -std=gnu11 -O2 -o /tmp/tlb notes/chunk_tlb_lab.c
 *   /tmp/tlb 4 /work/bench/glm2/model-*.safetensors > out.txt */
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
#define CHUNK ((size_t)2 << 20)
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
__attribute__((target("avx512f"))) static long read_chunk(const uint8_t *p){
  const __m512i *q=(const __m512i*)p; __m512i a=_mm512_setzero_si512(),b=a,d=a,e=a;
  for(size_t k=0;k<CHUNK/64;k+=4){a=_mm512_xor_si512(a,q[k]);b=_mm512_xor_si512(b,q[k+1]);d=_mm512_xor_si512(d,q[k+2]);e=_mm512_xor_si512(e,q[k+3]);}
  a=_mm512_xor_si512(_mm512_xor_si512(a,b),_mm512_xor_si512(d,e)); return _mm512_reduce_add_epi64(a);}
static uint32_t off[512]; volatile uint64_t zero_v=0;
static double chase(const uint8_t *p,int passes){
  uint64_t z=zero_v, v=0;
  for(int i=0;i<512;i++) v+= *(const volatile uint64_t*)(p+off[i]+(v&z));
  double t=now();
  for(int r=0;r<passes;r++) for(int i=0;i<512;i++) v = *(const uint64_t*)(p+off[i]+(v&z)) + v;
  t=now()-t; zero_v+= (v&z); return t/(passes*512.0)*1e9;}
typedef struct{const uint8_t*p;int set;double gbs[16],ns[16];}C;
int main(int argc,char**argv){
  int rounds=atoi(argv[1]); srand(1);
  for(int i=0;i<512;i++) off[i]=i*4096+((i*64)%4096);
  for(int i=511;i>0;i--){int j=rand()%(i+1);uint32_t t=off[i];off[i]=off[j];off[j]=t;}
  C*c=calloc(8192,sizeof(C)); int n=0;
  size_t anon=(size_t)4<<30; uint8_t*a=mmap(0,anon+CHUNK,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  a=(uint8_t*)(((uintptr_t)a+CHUNK-1)&~(CHUNK-1)); madvise(a,anon,MADV_HUGEPAGE); memset(a,1,anon);
  for(size_t o=0;o<anon;o+=CHUNK){c[n].p=a+o;c[n].set=0;n++;}
  for(int f=2;f<argc;f++){int fd=open(argv[f],O_RDONLY);struct stat st;fstat(fd,&st);
    uint8_t*m=mmap(0,st.st_size,PROT_READ,MAP_SHARED,fd,0); madvise(m,st.st_size,MADV_HUGEPAGE);
    for(size_t o=0;o<(size_t)st.st_size;o+=4096) (void)*(volatile uint8_t*)(m+o);
    uint8_t*s=(uint8_t*)(((uintptr_t)m+CHUNK-1)&~(CHUNK-1));
    for(;s+CHUNK<=m+st.st_size;s+=CHUNK){c[n].p=s;c[n].set=1;n++;}}
  int*ord=malloc(n*sizeof(int)); long sink=0;
  for(int r=0;r<rounds;r++){
    for(int i=0;i<n;i++)ord[i]=i;
    for(int i=n-1;i>0;i--){int j=rand()%(i+1);int t=ord[i];ord[i]=ord[j];ord[j]=t;}
    for(int k=0;k<n;k++){C*x=&c[ord[k]]; double t=now(); sink+=read_chunk(x->p); t=now()-t; x->gbs[r]=CHUNK/t/1e9; x->ns[r]=chase(x->p,20);}
  }
  printf("chunk set gbs ns\n");
  for(int i=0;i<n;i++) {printf("%d %d",i,c[i].set);for(int r=0;r<rounds;r++)printf(" %.2f %.3f",c[i].gbs[r],c[i].ns[r]);printf("\n");}
  fprintf(stderr,"%ld\n",sink); return 0;}
