/* tests/gpu/emu_selftest.cpp - the emulator's own checks of what a GPU does not promise.
 *
 *   emu_selftest order        prints, in the order they ran, the 64 blocks of one launch
 *   emu_selftest chain        a launch whose block b reads v[b - 1], which block b - 1 of
 *                             the same launch writes: a race on a GPU
 *   emu_selftest independent  a launch whose blocks touch only their own element
 *   emu_selftest handoff      a launch whose last block to arrive adds the others' values
 *                             (the split products' handshake: legitimate)
 *
 * tests/test_gpu_emu.sh runs them: the order is shuffled (in order with GLM_EMU_SHUFFLE=0),
 * and GLM_EMU_RACECHECK=1 stops "chain" with one error line naming the kernel but lets
 * "independent" and "handoff" through.
 */
#include "../hip_emu.h"

#include <cstdio>
#include <cstring>

#define BLOCKS 64

__global__ void k_ticket(unsigned *ticket, int *order) {
    if (threadIdx.x == 0) order[atomicAdd(ticket, 1u)] = (int)blockIdx.x;
}

__global__ void k_chain(float *v) {
    if (threadIdx.x == 0 && blockIdx.x > 0) v[blockIdx.x] += v[blockIdx.x - 1];
}

__global__ void k_independent(float *v) {
    if (threadIdx.x == 0) v[blockIdx.x] = 2 * v[blockIdx.x] + 1;
}

/* each block posts its value; the last to arrive (the counter's last ticket) sums them in
 * block order and resets the counter, as k_gemv_fast's split-k blocks do */
__global__ void k_handoff(float *part, unsigned *count, float *sum) {
    if (threadIdx.x != 0) return;
    part[blockIdx.x] = (float)blockIdx.x * 0.5f;
    __threadfence();
    if (atomicAdd(count, 1u) != gridDim.x - 1) return;
    __threadfence();
    float s = 0;
    for (unsigned b = 0; b < gridDim.x; b++) s += part[b];
    *sum = s;
    *count = 0;
}

static float *dev_floats(int n, float value) {
    float host[BLOCKS], *d;
    for (int i = 0; i < n; i++) host[i] = value + (float)i;
    if (hipMalloc(&d, n * sizeof(float)) != hipSuccess) emu_die("hipMalloc");
    hipMemcpy(d, host, n * sizeof(float), hipMemcpyHostToDevice);
    return d;
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    hipSetDevice(0);
    if (!strcmp(what, "order")) {
        unsigned *ticket;
        int *order, host[BLOCKS];
        hipMalloc(&ticket, sizeof(unsigned));
        hipMalloc(&order, BLOCKS * sizeof(int));
        hipMemset(ticket, 0, sizeof(unsigned));
        LAUNCH(k_ticket, dim3(BLOCKS), dim3(WAVE), 0, 0, ticket, order);
        hipMemcpy(host, order, sizeof host, hipMemcpyDeviceToHost);
        for (int i = 0; i < BLOCKS; i++) printf("%d%c", host[i], i + 1 < BLOCKS ? ' ' : '\n');
    } else if (!strcmp(what, "chain")) {
        float *v = dev_floats(BLOCKS, 1);
        LAUNCH(k_chain, dim3(BLOCKS), dim3(WAVE), 0, 0, v);
    } else if (!strcmp(what, "independent")) {
        float *v = dev_floats(BLOCKS, 1);
        LAUNCH(k_independent, dim3(BLOCKS), dim3(WAVE), 0, 0, v);
    } else if (!strcmp(what, "handoff")) {
        float *part = dev_floats(BLOCKS, 0), *sum = dev_floats(1, 0), host;
        unsigned *count;
        hipMalloc(&count, sizeof(unsigned));
        hipMemset(count, 0, sizeof(unsigned));
        LAUNCH(k_handoff, dim3(BLOCKS), dim3(WAVE), 0, 0, part, count, sum);
        hipMemcpy(&host, sum, sizeof host, hipMemcpyDeviceToHost);
        if (host != 0.5f * BLOCKS * (BLOCKS - 1) / 2) emu_die("k_handoff: wrong sum");
    } else {
        fprintf(stderr, "usage: emu_selftest order|chain|independent|handoff\n");
        return 1;
    }
    puts("done");
    return 0;
}
