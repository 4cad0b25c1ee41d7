/* latency_lab.c - the thirteenth session: the latency of a dependent load to a random line of a
 * random 4 KB page, over 2 GB of a fresh anonymous allocation (2 MB pages) and over 2 GB of the
 * page cache holding FILE... (the same number of pages, so the same TLB reach), 3 rounds each,
 * alternating. Prints the mean ns per hop of each and their ratio.
 *   gcc -O2 -o /tmp/lat notes/latency_lab.c && /tmp/lat /work/bench/glm2/model-*.safetensors */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static uint64_t rs=88172645463325252ull; static uint64_t rnd(void){rs^=rs<<13;rs^=rs>>7;rs^=rs<<17;return rs;}
volatile uint64_t zero_v=0;
static double chase(const uint8_t*const*pages,size_t np,int hops){uint64_t z=zero_v,v=0; double t=now();
  for(int h=0;h<hops;h++){ const uint8_t*p=pages[rnd()%np]+((rnd()%64)*64); v+=*(const volatile uint64_t*)(p+(v&z)); }
  t=now()-t; zero_v+=v&z; return t/hops*1e9;}
int main(int argc,char**argv){
  size_t an=(size_t)2<<30; uint8_t*a=aligned_alloc(2<<20,an); madvise(a,an,MADV_HUGEPAGE); memset(a,1,an);
  size_t npa=an/4096; const uint8_t**pa=malloc(npa*sizeof*pa); for(size_t i=0;i<npa;i++)pa[i]=a+i*4096;
  size_t npf=0; const uint8_t**pf=malloc((size_t)(8<<20)*sizeof*pf);
  if(argc<2){fprintf(stderr,"usage: lat FILE...\n");return 1;}
  for(int f=1;f<argc;f++){int fd=open(argv[f],O_RDONLY);struct stat st;
    if(fd<0||fstat(fd,&st)||st.st_size<4096){fprintf(stderr,"lat: %s: cannot read, or under 4 KB\n",argv[f]);return 1;}
    const uint8_t*m=mmap(0,st.st_size,PROT_READ,MAP_SHARED,fd,0);
    for(off_t o=0;o+4096<=st.st_size;o+=4096){(void)*(volatile const uint8_t*)(m+o); if(npf<npa) pf[npf++]=m+o;}}
  double sa=0,sf=0; for(int r=0;r<3;r++){ if(r%2){sf+=chase(pf,npf,200000);sa+=chase(pa,npa,200000);} else {sa+=chase(pa,npa,200000);sf+=chase(pf,npf,200000);} }
  printf("latency ns/hop: anonymous %.1f, page cache %.1f (x%.3f)\n",sa/3,sf/3,sf/sa); return 0;}
