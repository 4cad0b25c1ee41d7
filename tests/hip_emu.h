/* tests/hip_emu.h - run glm_hip.hip's kernels on the CPU, for CI machines without a GPU.
 *
 * glm_hip.hip includes this header instead of the HIP or CUDA runtime when it is
 * compiled as plain C++ with -DGLM_EMU -DWARP=32|64 (make emu). It supplies exactly
 * what the compatibility section at the top of glm_hip.hip supplies on real hardware:
 *
 *   WAVE, SHFL_XOR, LAUNCH   the wave width, the xor shuffle and the kernel launch;
 *   threadIdx, blockIdx, ... the built-in indices;
 *   __global__, __shared__   the qualifiers;
 *   hipMalloc, hipMemcpy...  the runtime API, on several virtual devices.
 *
 * Execution model, chosen to find the bugs a real GPU would hit:
 *   - a launch runs its blocks on a few worker threads at once (GLM_EMU_THREADS, default:
 *     the number of cores), in a shuffled order that changes from launch to launch
 *     (GLM_EMU_SHUFFLE=0: in order), as a GPU promises no order between blocks;
 *   - GLM_EMU_RACECHECK=1 runs every launch twice from the same device memory, its blocks
 *     in the shuffled order and then in reverse, and stops the program if device memory
 *     differs afterwards: some block read what another block of the same launch wrote
 *     (or raced it to a write). Legitimate hand-offs between blocks (a split product's
 *     last block adding the others' partial sums) give the same bytes either way. Slow:
 *     it copies all device memory three times per launch;
 *   - the threads of a block are cooperative fibers on one worker. A fiber runs until
 *     it reaches __syncthreads() or a shuffle, then the next fiber runs. A block barrier
 *     opens when every live thread of the block waits at it; a wave barrier (inside a
 *     shuffle) when every live lane of that wave waits at it. Anything else is a
 *     deadlock, e.g. __syncthreads() under a branch only some threads take, and stops
 *     the program with a message;
 *   - __shared__ is `static thread_local`: one copy per worker, and a worker runs one
 *     block at a time, so it is per-block storage. Like real shared memory it is not
 *     cleared between blocks;
 *   - the wave width is a build-time constant (WARP=32 or 64), so kernels that assume
 *     one width break under the other;
 *   - launch limits are checked (at most 1024 threads per block, grid y/z <= 65535).
 *   - device memory is host memory, counted per virtual device against
 *     GLM_EMU_DEVICE_MEM bytes (default 16 GiB) so "does not fit" can be tested;
 *     a hipMalloc larger than GLM_EMU_MAX_ALLOC bytes (default: no limit) fails with
 *     hipErrorOutOfMemory, as on a device whose free memory is fragmented;
 *     GLM_EMU_DEVICES virtual devices (default 4) are visible.
 *
 * Fibers switch with a few lines of assembly on x86-64 (a swapcontext() costs a
 * system call, which made the tests ten times slower) and with ucontext elsewhere.
 */
#ifndef HIP_EMU_H
#define HIP_EMU_H

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>
#include <sys/mman.h>
#if !defined(__x86_64__) || defined(EMU_UCONTEXT)
#include <ucontext.h>
#define EMU_USE_UCONTEXT 1
#endif

#if !defined(WARP) || (WARP != 32 && WARP != 64)
#error "build the emulation with -DWARP=32 or -DWARP=64"
#endif
#define WAVE WARP

/* ---- qualifiers ---------------------------------------------------------- */
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local

/* ---- vector types and built-in indices ------------------------------------ */
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) float4 { float x, y, z, w; };

enum { EMU_RUN, EMU_AT_BLOCK, EMU_AT_WAVE, EMU_DONE };

struct EmuFiber {
    void *sp;                /* saved stack pointer (x86-64) */
#ifdef EMU_USE_UCONTEXT
    ucontext_t uc;
#endif
    dim3 tid;
    int lin;                 /* linear thread index in the block */
    int state;
    unsigned shuffles;       /* shuffles done in this block: picks the exchange buffer */
    char *stack;
};

struct EmuWorker {
    void *sched_sp;
#ifdef EMU_USE_UCONTEXT
    ucontext_t sched_uc;
#endif
    std::vector<EmuFiber> fibers;
    const std::function<void()> *body;
    int n;                   /* threads in the current block */
    std::vector<char> dyn_shared;
};

inline thread_local EmuFiber *emu_cur;
inline thread_local EmuWorker *emu_worker;
inline thread_local dim3 emu_block_idx, emu_block_dim, emu_grid_dim;
inline thread_local uint64_t emu_slot[2][1024]; /* shuffle exchange, one slot per thread, two buffers */

#define threadIdx (emu_cur->tid)
#define blockIdx emu_block_idx
#define blockDim emu_block_dim
#define gridDim emu_grid_dim

inline thread_local int emu_device = 0;
/* Work queued on a device and not yet known to be finished by the host: a launch, an
 * async copy or a memset marks its device; hipDeviceSynchronize, hipStreamSynchronize
 * and a blocking hipMemcpy (ordered after the device's earlier work) clear it. ROCm's
 * hipMemcpyPeer does not wait for work still queued on the destination device, so a
 * peer copy into a device with unfinished work is a race on real hardware: abort. */
inline int emu_pending[64];

[[noreturn]] inline void emu_die(const char *msg) {
    fflush(stdout);
    fprintf(stderr, "glm: error: GPU emulation: %s\n", msg);
    exit(1);
}

/* ---- fibers ----------------------------------------------------------------- */
static const size_t EMU_STACK = 256 * 1024;

#ifndef EMU_USE_UCONTEXT
/* emu_ctx_switch(&save, to): push the callee-saved registers, store the stack pointer
 * in *save, load `to`, pop the same set, return into the other context. The SSE and
 * x87 control words are left alone: no kernel changes the rounding mode, and saving
 * them made a switch several times slower. */
extern "C" void emu_ctx_switch(void **save, void *to);
asm(".text\n"
    ".globl emu_ctx_switch\n"
    ".type emu_ctx_switch,@function\n"
    "emu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_ctx_switch, .-emu_ctx_switch\n");
#endif

/* Leaves fiber `me` (already marked waiting or done) for the next runnable fiber of
 * the block, or for the scheduler when none is left in this round. Going straight
 * from fiber to fiber halves the switches of a barrier. */
static inline void emu_leave(EmuFiber *me) {
    EmuWorker *w = emu_worker;
#ifdef EMU_USE_UCONTEXT
    swapcontext(&me->uc, &w->sched_uc);
#else
    for (int i = me->lin + 1; i < w->n; i++)
        if (w->fibers[i].state == EMU_RUN) {
            emu_cur = &w->fibers[i];
            emu_ctx_switch(&me->sp, w->fibers[i].sp);
            return;
        }
    emu_ctx_switch(&me->sp, w->sched_sp);
#endif
}

[[noreturn]] static void emu_fiber_main() {
    (*emu_worker->body)();
    emu_cur->state = EMU_DONE;
    emu_leave(emu_cur);
    emu_die("finished fiber resumed");
}

static void emu_fiber_start(EmuFiber *f) {
#ifdef EMU_USE_UCONTEXT
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = EMU_STACK;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, (void (*)())emu_fiber_main, 0);
#else
    /* a frame that emu_ctx_switch pops: six registers, then the return address; the
     * slot above it is where a caller's return address would be, so the entry sees
     * the stack alignment of a normal call */
    uint64_t *top = (uint64_t *)(f->stack + EMU_STACK);
    uint64_t *sp = top - 8; /* after the ret, rsp = top - 8: 8 mod 16, as after a call */
    for (int i = 0; i < 6; i++) sp[i] = 0;
    sp[6] = (uint64_t)(uintptr_t)&emu_fiber_main;
    f->sp = sp;
#endif
}

/* Runs the current fiber's thread until it must wait in `state`. */
static inline void emu_wait(int state) {
    EmuFiber *me = emu_cur;
    me->state = state;
    emu_leave(me);
}

inline void __syncthreads() { emu_wait(EMU_AT_BLOCK); }
inline void emu_syncwave() { emu_wait(EMU_AT_WAVE); }

/* xor shuffle: each lane posts its value, the wave meets, each reads its partner.
 * Consecutive shuffles alternate between two buffers, so one meeting per shuffle is
 * enough: a lane can only write a buffer again two shuffles later, after every lane
 * of its wave has passed the meeting in between, i.e. has finished reading it. */
template <class T> inline T emu_shfl_xor(T v, int mask) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    EmuFiber *me = emu_cur;
    int lane = me->lin % WAVE, src = me->lin ^ mask;
    uint64_t *slot = emu_slot[me->shuffles++ & 1];
    if (mask <= 0 || (lane ^ mask) >= WAVE || src >= emu_worker->n) emu_die("shuffle partner outside the wave");
    memcpy(&slot[me->lin], &v, sizeof v);
    emu_wait(EMU_AT_WAVE);
    /* the partner took part in this shuffle: it is still here, has gone on to the next
     * one, or has finished since; fewer shuffles means it exited or is elsewhere */
    if (emu_worker->fibers[src].shuffles - me->shuffles > 1u)
        emu_die("shuffle with a lane that has exited or is at another shuffle");
    T r;
    memcpy(&r, &slot[src], sizeof r);
    return r;
}
#define SHFL_XOR(v, m) emu_shfl_xor((v), (m))

/* Runs one block to completion: round-robin over runnable fibers, then open
 * whichever barrier every live participant has reached. */
static void emu_run_block(EmuWorker *w, int n) {
    if ((int)w->fibers.size() < n) {
        size_t old = w->fibers.size();
        w->fibers.resize(n);
        for (size_t i = old; i < (size_t)n; i++) {
            void *p = mmap(nullptr, EMU_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) emu_die("cannot map a fiber stack");
            w->fibers[i].stack = (char *)p;
        }
    }
    w->n = n;
    const dim3 bd = emu_block_dim;
    for (int i = 0; i < n; i++) {
        EmuFiber *f = &w->fibers[i];
        f->lin = i;
        f->tid = dim3(i % bd.x, (i / bd.x) % bd.y, i / (bd.x * bd.y));
        f->state = EMU_RUN;
        f->shuffles = 0;
        emu_fiber_start(f);
    }
    for (;;) {
        /* one round: every runnable fiber runs until it waits or ends */
#ifdef EMU_USE_UCONTEXT
        for (int i = 0; i < n; i++) {
            EmuFiber *f = &w->fibers[i];
            if (f->state != EMU_RUN) continue;
            emu_cur = f;
            swapcontext(&w->sched_uc, &f->uc);
        }
#else
        for (int i = 0; i < n; i++) /* the first runnable fiber; the rest follow in a chain */
            if (w->fibers[i].state == EMU_RUN) {
                emu_cur = &w->fibers[i];
                emu_ctx_switch(&w->sched_sp, w->fibers[i].sp);
                break;
            }
#endif
        int done = 0;
        for (int i = 0; i < n; i++) done += w->fibers[i].state == EMU_DONE;
        if (done == n) return;
        int released = 0, at_block = 0, live = n - done;
        for (int w0 = 0; w0 < n; w0 += WAVE) {
            int end = w0 + WAVE < n ? w0 + WAVE : n, waiting = 0, alive = 0;
            for (int i = w0; i < end; i++) {
                int s = w->fibers[i].state;
                if (s != EMU_DONE) alive++;
                if (s == EMU_AT_WAVE) waiting++;
                if (s == EMU_AT_BLOCK) at_block++;
            }
            if (waiting && waiting == alive) {
                for (int i = w0; i < end; i++)
                    if (w->fibers[i].state == EMU_AT_WAVE) w->fibers[i].state = EMU_RUN;
                released = 1;
            }
        }
        if (released) continue;
        if (at_block == live) {
            for (int i = 0; i < n; i++)
                if (w->fibers[i].state == EMU_AT_BLOCK) w->fibers[i].state = EMU_RUN;
            continue;
        }
        emu_die("deadlock: threads of one block wait at different barriers (a __syncthreads or shuffle "
                "that not every thread reaches)");
    }
}

/* ---- launches: a small pool of workers takes blocks off a counter ------------- */
struct EmuPool {
    std::mutex mu;
    std::condition_variable cv_job, cv_done;
    std::vector<std::thread> threads;
    const std::function<void()> *body = nullptr;
    dim3 grid, block;
    size_t shmem = 0;
    std::atomic<long> next{0};
    long total = 0;
    long stride = 1, offset = 0; /* block i of the run order is (i * stride + offset) mod total */
    int busy = 0;
    unsigned long gen = 0;
    int n_threads = 0;
};
inline EmuPool &emu_pool = *new EmuPool; /* never destroyed: workers wait on it at exit */

static void emu_work(EmuWorker *w) {
    EmuPool &p = emu_pool;
    emu_worker = w;
    w->body = p.body;
    emu_grid_dim = p.grid;
    emu_block_dim = p.block;
    if (w->dyn_shared.size() < p.shmem) w->dyn_shared.resize(p.shmem);
    int n = (int)(p.block.x * p.block.y * p.block.z);
    for (long i; (i = p.next.fetch_add(1)) < p.total;) {
        const long b = (long)(((unsigned __int128)i * (unsigned long)p.stride + (unsigned long)p.offset) % (unsigned long)p.total);
        emu_block_idx = dim3((unsigned)(b % p.grid.x), (unsigned)(b / p.grid.x % p.grid.y), (unsigned)(b / ((long)p.grid.x * p.grid.y)));
        emu_run_block(w, n);
    }
}

static void emu_worker_loop() {
    EmuWorker w;
    EmuPool &p = emu_pool;
    unsigned long seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(p.mu);
            p.cv_job.wait(lk, [&] { return p.gen != seen; });
            seen = p.gen;
        }
        emu_work(&w);
        std::lock_guard<std::mutex> lk(p.mu);
        if (--p.busy == 0) p.cv_done.notify_all();
    }
}

/* The order of a launch's blocks: a stride coprime with the block count (a prime that
 * does not divide it) and an offset, both from the launch's number, so a run is
 * reproducible; in order with GLM_EMU_SHUFFLE=0; reverse for the race check's second run. */
inline unsigned long emu_launch_no;
inline void emu_block_order(long total, int reverse, long *stride, long *offset) {
    static int shuffle = -1;
    if (shuffle < 0) { const char *e = getenv("GLM_EMU_SHUFFLE"); shuffle = !(e && !strcmp(e, "0")); }
    static const long primes[] = {7919, 104729, 1299709, 15485863};
    const unsigned long n = emu_launch_no++;
    *stride = 1;
    *offset = 0;
    if (reverse) { *stride = total - 1; *offset = total - 1; return; } /* (i * (total - 1) + total - 1) mod total = total - 1 - i */
    if (!shuffle || total < 2) return;
    for (int k = 0; k < 4; k++) {
        const long q = primes[(n + k) % 4];
        if (total % q) { *stride = q % total; break; }
    }
    *offset = (long)((n * 2654435761ul) % (unsigned long)total);
}

inline void emu_run_order(dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body, int reverse) {
    long threads = (long)block.x * block.y * block.z, total = (long)grid.x * grid.y * grid.z;
    if (threads < 1 || threads > 1024) emu_die("launch with more than 1024 threads per block");
    if (grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u) emu_die("grid dimension over the hardware limit");
    if (total == 0) emu_die("launch with an empty grid");
    EmuPool &p = emu_pool;
    emu_block_order(total, reverse, &p.stride, &p.offset);
    static thread_local EmuWorker self;
    if (!p.n_threads) {
        const char *e = getenv("GLM_EMU_THREADS");
        p.n_threads = e ? atoi(e) : (int)std::thread::hardware_concurrency();
        if (p.n_threads < 1) p.n_threads = 1;
        for (int i = 1; i < p.n_threads; i++) {
            p.threads.emplace_back(emu_worker_loop);
            p.threads.back().detach();
        }
    }
    emu_pending[emu_device & 63] = 1;
    EmuFiber *saved = emu_cur;
    p.body = &body;
    p.grid = grid;
    p.block = block;
    p.shmem = shmem;
    p.total = total;
    p.next = 0;
    if (total > 1 && p.n_threads > 1) {
        std::unique_lock<std::mutex> lk(p.mu);
        p.busy = p.n_threads - 1;
        p.gen++;
        p.cv_job.notify_all();
    }
    emu_work(&self);
    if (total > 1 && p.n_threads > 1) {
        std::unique_lock<std::mutex> lk(p.mu);
        p.cv_done.wait(lk, [&] { return p.busy == 0; });
    }
    emu_cur = saved;
}

inline void emu_racecheck(const char *name, dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body);
inline void emu_run(const char *name, dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body) {
    static int check = -1;
    if (check < 0) { const char *e = getenv("GLM_EMU_RACECHECK"); check = e && !strcmp(e, "1"); }
    if (check) emu_racecheck(name, grid, block, shmem, body);
    else emu_run_order(grid, block, shmem, body, 0);
}

/* Dynamic shared memory (the `extern __shared__` array sized at launch). */
#define DYN_SHARED(type, name) type *name = (type *)(void *)emu_worker->dyn_shared.data()

/* Stream capture (hipStreamBeginCapture .. hipStreamEndCapture): launches, async copies
 * and memsets are recorded as the graph's nodes, in order, and run at each hipGraphLaunch.
 * A synchronous call during capture (hipMemcpy, hipMemset, a synchronize) is an error on
 * real hardware, and is fatal here. */
inline bool emu_capturing;
inline struct EmuStream *emu_capture_stream; /* the stream being captured */
inline std::vector<std::function<void()>> emu_captured;
inline void emu_not_capturing(const char *what) {
    if (emu_capturing) {
        fprintf(stderr, "hip_emu: %s during stream capture (not allowed in a captured graph)\n", what);
        abort();
    }
}

/* LAUNCH(kernel, grid, block, shared bytes, stream, args...): the arguments are
 * converted to the kernel's parameter types once, as a real launch copies them (and a
 * captured launch keeps that copy). */
inline void emu_check_stream(struct EmuStream *s, const char *what);
template <class... P, class... A>
inline void emu_launch(const char *name, struct EmuStream *s, dim3 grid, dim3 block, size_t shmem, void (*k)(P...), A &&...a) {
    emu_check_stream(s, "a kernel launch");
    std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
    if (emu_capturing) {
        emu_captured.push_back([=] { emu_run(name, grid, block, shmem, [&] { std::apply(k, args); }); });
        return;
    }
    emu_run(name, grid, block, shmem, [&] { std::apply(k, args); });
}
/* (name: the kernel as the launch spells it, for the race check's message) */
#define LAUNCH(k, grid, block, shmem, stream, ...) emu_launch(#k, (stream), dim3(grid), dim3(block), (shmem), k, __VA_ARGS__)

/* ---- device intrinsics ----------------------------------------------------------- */
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
/* Shared-memory integer atomics: the fibers of a block share one OS thread, so a plain
 * read-modify-write is atomic among them; global ones use real atomics across workers. */
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

/* __threadfence: this thread's global writes before it are seen before its writes after it
 * (the split products' "last block adds up" handshake relies on it). */
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

/* gfx950's and gfx942's conversion instructions, as AMD's CDNA3/CDNA4 ISA guides describe
 * them, so that the code the MI355X and MI300X builds run (glm_hip.hip's GF_HW_CVT and
 * GF_FNUZ_CVT paths, compiled here with -DGLM_EMU_GFX950 / -DGLM_EMU_GFX942) is tested too. The lower nibble / byte of each pair comes out in .x
 * (composable_kernel reads a lone nibble's value from .x; FlyDSL's pack/unpack round
 * trip keeps the first value low): docs/FORMATS.md §6.6. */
struct f32x2 { float x, y; };
inline float emu_e2m1(unsigned c) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (c & 8) ? -mag[c & 7] : mag[c & 7];
}
/* v_cvt_scalef32_pk_f32_fp4: the two E2M1 nibbles of byte `byte_sel` of src, times scale */
inline f32x2 __builtin_amdgcn_cvt_scalef32_pk_f32_fp4(unsigned src, float scale, int byte_sel) {
    unsigned b = (src >> (8 * byte_sel)) & 0xff;
    return f32x2{emu_e2m1(b & 15) * scale, emu_e2m1(b >> 4) * scale};
}
/* v_cvt_pk_f32_fp8 (gfx950: OCP E4M3FN): bytes 0,1 of src (hi = false) or 2,3 */
inline float emu_e4m3(unsigned b) {
    unsigned e = (b >> 3) & 15, m = b & 7;
    float v = e ? std::ldexp(1.0f + (float)m / 8.0f, (int)e - 7) : std::ldexp((float)m, -9);
    if ((b & 0x7f) == 0x7f) v = NAN;
    return (b & 0x80) ? -v : v;
}
/* gfx942 decodes FNUZ E4M3 instead (-DGLM_EMU_GFX942): bias 8, 0x80 is the only NaN, no -0 */
inline float emu_e4m3_fnuz(unsigned b) {
    if (b == 0x80) return NAN;
    unsigned e = (b >> 3) & 15, m = b & 7;
    float v = e ? std::ldexp(1.0f + (float)m / 8.0f, (int)e - 8) : std::ldexp((float)m, -10);
    return (b & 0x80) ? -v : v;
}
inline f32x2 __builtin_amdgcn_cvt_pk_f32_fp8(int src, bool hi) {
    unsigned w = (unsigned)src >> (hi ? 16 : 0);
#if defined(GLM_EMU_GFX942)
    return f32x2{emu_e4m3_fnuz(w & 0xff), emu_e4m3_fnuz((w >> 8) & 0xff)};
#else
    return f32x2{emu_e4m3(w & 0xff), emu_e4m3((w >> 8) & 0xff)};
#endif
}

/* ---- the runtime API on virtual devices --------------------------------------------- */
typedef int hipError_t;
enum { hipSuccess = 0, hipErrorOutOfMemory = 2, hipErrorInvalidValue = 1, hipErrorInvalidDevice = 101 };
typedef enum { hipMemcpyHostToHost, hipMemcpyHostToDevice, hipMemcpyDeviceToHost, hipMemcpyDeviceToDevice, hipMemcpyDefault } hipMemcpyKind;
typedef struct EmuStream *hipStream_t;
typedef struct EmuEvent { double t; } *hipEvent_t;
typedef struct {
    char name[256];
    size_t totalGlobalMem;
    int multiProcessorCount;
    int warpSize;
    char gcnArchName[256];
} hipDeviceProp_t;

struct EmuDevices {
    int n = -1;
    size_t cap = 0;
    size_t max_alloc = (size_t)-1; /* GLM_EMU_MAX_ALLOC: the largest one hipMalloc (fragmented memory) */
    size_t used[64] = {0};
    std::unordered_map<void *, std::pair<size_t, int>> allocs;
    std::mutex mu;
};
inline EmuDevices emu_dev;
inline hipError_t emu_last_error = hipSuccess;

static void emu_dev_init() {
    if (emu_dev.n >= 0) return;
    const char *e = getenv("GLM_EMU_DEVICES"), *m = getenv("GLM_EMU_DEVICE_MEM");
    emu_dev.n = e ? atoi(e) : 4;
    if (emu_dev.n < 0) emu_dev.n = 0;
    if (emu_dev.n > 64) emu_dev.n = 64;
    emu_dev.cap = m ? (size_t)strtoull(m, nullptr, 10) : ((size_t)16 << 30);
    const char *x = getenv("GLM_EMU_MAX_ALLOC");
    if (x && *x) emu_dev.max_alloc = (size_t)strtoull(x, nullptr, 10);
}

inline const char *hipGetErrorString(hipError_t e) {
    switch (e) {
    case hipSuccess: return "no error";
    case hipErrorOutOfMemory: return "out of memory (emulated device)";
    case hipErrorInvalidDevice: return "invalid device ordinal (emulated)";
    default: return "invalid value (emulated)";
    }
}
inline hipError_t hipGetLastError() { hipError_t e = emu_last_error; emu_last_error = hipSuccess; return e; }
inline hipError_t hipGetDeviceCount(int *n) { emu_dev_init(); *n = emu_dev.n; return hipSuccess; }
inline hipError_t hipSetDevice(int d) {
    emu_dev_init();
    if (d < 0 || d >= emu_dev.n) return hipErrorInvalidDevice;
    emu_device = d;
    return hipSuccess;
}
inline hipError_t hipGetDevice(int *d) { *d = emu_device; return hipSuccess; }
inline hipError_t hipGetDeviceProperties(hipDeviceProp_t *p, int d) {
    emu_dev_init();
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "emulated device %d (wave %d)", d, WAVE);
    snprintf(p->gcnArchName, sizeof p->gcnArchName, "emu");
    p->totalGlobalMem = emu_dev.cap;
    p->multiProcessorCount = 8; /* a small GPU: matrices with few rows get split along k */
    p->warpSize = WAVE;
    return hipSuccess;
}
inline hipError_t hipMemGetInfo(size_t *free_b, size_t *total) {
    emu_dev_init();
    std::lock_guard<std::mutex> lk(emu_dev.mu);
    *total = emu_dev.cap;
    *free_b = emu_dev.cap - emu_dev.used[emu_device];
    return hipSuccess;
}
inline hipError_t hipMalloc(void **p, size_t n) {
    emu_dev_init();
    std::lock_guard<std::mutex> lk(emu_dev.mu);
    if (n > emu_dev.cap - emu_dev.used[emu_device] || n > emu_dev.max_alloc) { *p = nullptr; return hipErrorOutOfMemory; }
    void *q = nullptr;
    if (posix_memalign(&q, 256, n ? n : 1)) return hipErrorOutOfMemory;
    memset(q, 0xA5, n); /* device memory starts as garbage, not zeros */
    emu_dev.used[emu_device] += n;
    emu_dev.allocs[q] = {n, emu_device};
    *p = q;
    return hipSuccess;
}
template <class T> inline hipError_t hipMalloc(T **p, size_t n) { return hipMalloc((void **)p, n); }
inline hipError_t hipFree(void *p) {
    if (!p) return hipSuccess;
    std::lock_guard<std::mutex> lk(emu_dev.mu);
    auto it = emu_dev.allocs.find(p);
    if (it == emu_dev.allocs.end()) return hipErrorInvalidValue;
    emu_dev.used[it->second.second] -= it->second.first;
    emu_dev.allocs.erase(it);
    free(p);
    return hipSuccess;
}
/* GLM_EMU_RACECHECK=1 (see the top): the launch from the same device memory twice, its
 * blocks shuffled then reversed; any byte of device memory that differs is a dependency
 * between blocks of one launch. */
inline void emu_racecheck(const char *name, dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body) {
    static std::vector<std::pair<char *, size_t>> mem;
    static std::vector<char> before, first; /* all allocations back to back; kept between launches (no page faults) */
    size_t total = 0;
    mem.clear();
    {
        std::lock_guard<std::mutex> lk(emu_dev.mu);
        for (auto &a : emu_dev.allocs) { mem.push_back({(char *)a.first, a.second.first}); total += a.second.first; }
    }
    if (before.size() < total) { before.resize(total); first.resize(total); }
    for (size_t i = 0, at = 0; i < mem.size(); at += mem[i].second, i++) memcpy(&before[at], mem[i].first, mem[i].second);
    emu_run_order(grid, block, shmem, body, 0);
    for (size_t i = 0, at = 0; i < mem.size(); at += mem[i].second, i++) {
        memcpy(&first[at], mem[i].first, mem[i].second);
        memcpy(mem[i].first, &before[at], mem[i].second);
    }
    emu_run_order(grid, block, shmem, body, 1);
    for (size_t i = 0, at = 0; i < mem.size(); at += mem[i].second, i++) {
        if (!memcmp(&first[at], mem[i].first, mem[i].second)) continue;
        size_t b = 0;
        while (first[at + b] == mem[i].first[b]) b++;
        char msg[400];
        snprintf(msg, sizeof msg,
                 "%s (grid %u x %u x %u): its blocks depend on each other's writes: byte %zu of a %zu-byte allocation "
                 "differs when the blocks run in reverse order (GLM_EMU_RACECHECK)",
                 name, grid.x, grid.y, grid.z, b, mem[i].second);
        emu_die(msg);
    }
}
inline hipError_t hipHostMalloc(void **p, size_t n, unsigned = 0) { *p = malloc(n ? n : 1); return *p ? hipSuccess : hipErrorOutOfMemory; }
inline hipError_t hipHostFree(void *p) { free(p); return hipSuccess; }
inline hipError_t hipMemcpy(void *d, const void *s, size_t n, hipMemcpyKind) {
    emu_not_capturing("hipMemcpy");
    if (n) memmove(d, s, n);
    emu_pending[emu_device & 63] = 0;
    return hipSuccess;
}
inline hipError_t hipMemcpyAsync(void *d, const void *s, size_t n, hipMemcpyKind, hipStream_t st = nullptr) {
    emu_check_stream(st, "hipMemcpyAsync");
    if (emu_capturing) { emu_captured.push_back([=] { if (n) memmove(d, s, n); }); return hipSuccess; }
    if (n) memmove(d, s, n);
    emu_pending[emu_device & 63] = 1;
    return hipSuccess;
}
inline hipError_t hipMemcpyPeer(void *d, int dd, const void *s, int, size_t n) {
    if (emu_pending[dd & 63])
        emu_die("hipMemcpyPeer into a device that still has unfinished work (kernels queued, not synchronized): "
                "ROCm's peer copy does not wait for the destination, so it can overwrite buffers those kernels "
                "still read; synchronize the destination device first");
    if (n) memmove(d, s, n);
    return hipSuccess;
}
inline hipError_t hipMemset(void *d, int v, size_t n) {
    emu_not_capturing("hipMemset");
    memset(d, v, n);
    emu_pending[emu_device & 63] = 1;
    return hipSuccess;
}
inline hipError_t hipMemsetAsync(void *d, int v, size_t n, hipStream_t st = nullptr) {
    emu_check_stream(st, "hipMemsetAsync");
    if (emu_capturing) { emu_captured.push_back([=] { memset(d, v, n); }); return hipSuccess; }
    memset(d, v, n);
    emu_pending[emu_device & 63] = 1;
    return hipSuccess;
}
inline hipError_t hipDeviceSynchronize() { emu_not_capturing("hipDeviceSynchronize"); emu_pending[emu_device & 63] = 0; return hipSuccess; }
/* A stream is a handle (work runs at once, in call order) that belongs to the device
 * current when it was made. As on real hardware: work sent to a stream of another device
 * than the current one is an error, capture needs a stream that is not the null stream,
 * and while a stream is captured every launch and async copy must go to that stream (the
 * null stream would not be recorded: the graph would miss it). */
struct EmuStream { int dev; };
inline void emu_check_stream(struct EmuStream *s, const char *what) {
    char msg[200];
    if (s && s->dev != emu_device) {
        snprintf(msg, sizeof msg, "%s into a stream of device %d while device %d is current", what, s->dev, emu_device);
        emu_die(msg);
    }
    if (emu_capturing && s != emu_capture_stream) {
        snprintf(msg, sizeof msg, "%s into %s during another stream's capture (it would not be in the graph)", what,
                 s ? "a stream" : "the null stream");
        emu_die(msg);
    }
}
inline hipError_t hipStreamCreate(hipStream_t *s) { emu_dev_init(); *s = new EmuStream{emu_device}; return hipSuccess; }
inline hipError_t hipStreamDestroy(hipStream_t s) { delete s; return hipSuccess; }
inline hipError_t hipStreamSynchronize(hipStream_t) { emu_not_capturing("hipStreamSynchronize"); emu_pending[emu_device & 63] = 0; return hipSuccess; }
/* Graphs: the captured nodes and the device whose stream was captured; an executable
 * graph is a copy of them, launched on a stream of that device. */
typedef struct EmuGraph { std::vector<std::function<void()>> nodes; int dev; } *hipGraph_t, *hipGraphExec_t;
typedef enum { hipStreamCaptureModeGlobal, hipStreamCaptureModeThreadLocal, hipStreamCaptureModeRelaxed } hipStreamCaptureMode;
inline hipError_t hipStreamBeginCapture(hipStream_t s, hipStreamCaptureMode) {
    if (!s) emu_die("hipStreamBeginCapture on the null stream");
    if (emu_capturing) emu_die("hipStreamBeginCapture while already capturing");
    emu_check_stream(s, "hipStreamBeginCapture");
    emu_capturing = true;
    emu_capture_stream = s;
    emu_captured.clear();
    return hipSuccess;
}
inline hipError_t hipStreamEndCapture(hipStream_t s, hipGraph_t *g) {
    if (!emu_capturing) emu_die("hipStreamEndCapture without a capture");
    if (s != emu_capture_stream) emu_die("hipStreamEndCapture on a stream that is not being captured");
    emu_capturing = false;
    emu_capture_stream = nullptr;
    *g = new EmuGraph{std::move(emu_captured), s->dev};
    emu_captured.clear();
    return hipSuccess;
}
inline hipError_t hipGraphInstantiateWithFlags(hipGraphExec_t *e, hipGraph_t g, unsigned long long) { *e = new EmuGraph{g->nodes, g->dev}; return hipSuccess; }
inline hipError_t hipGraphLaunch(hipGraphExec_t e, hipStream_t s) {
    emu_not_capturing("hipGraphLaunch");
    emu_check_stream(s, "hipGraphLaunch");
    if (e->dev != emu_device) emu_die("hipGraphLaunch of a graph captured on another device");
    for (auto &node : e->nodes) node();
    emu_pending[emu_device & 63] = 1;
    return hipSuccess;
}
inline hipError_t hipGraphDestroy(hipGraph_t g) { delete g; return hipSuccess; }
inline hipError_t hipGraphExecDestroy(hipGraphExec_t e) { delete e; return hipSuccess; }
static double emu_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
inline hipError_t hipEventCreate(hipEvent_t *e) { *e = new EmuEvent{0}; return hipSuccess; }
inline hipError_t hipEventDestroy(hipEvent_t e) { delete e; return hipSuccess; }
inline hipError_t hipEventRecord(hipEvent_t e, hipStream_t = nullptr) { e->t = emu_now(); return hipSuccess; }
inline hipError_t hipEventSynchronize(hipEvent_t) { return hipSuccess; }
inline hipError_t hipEventElapsedTime(float *ms, hipEvent_t a, hipEvent_t b) { *ms = (float)((b->t - a->t) * 1e3); return hipSuccess; }

/* ---- matrix instructions ----------------------------------------------------------------
 * The two instructions of glm_hip.hip's prefill product (section 3c), each a wave-wide
 * operation: every lane posts its operand registers, the wave meets, each lane computes
 * its own result registers from all the lanes' operands (the documented layouts mapped
 * back to matrix coordinates, then plain loops), and the wave meets again before any lane
 * may post the next operands. The sums run over k in order in fp32 (the products of two
 * bf16 are exact); the hardware's internal order and rounding are not specified by
 * either vendor, so results agree with a GPU to rounding, exactly for small integers.
 * Layout sources:
 *   v_mfma_f32_32x32x8_bf16 (wave 64): "AMD Instinct MI300 ISA Reference Guide" (CDNA3), §7
 *     "Matrix Arithmetic Instructions", and AMD's Matrix Instruction Calculator
 *     (--instruction v_mfma_f32_32x32x8_bf16 --register-layout): A[i][k] is element k % 4
 *     of lane i + 32 * (k / 4); B[k][j] element k % 4 of lane j + 32 * (k / 4); D[i][j] is
 *     register 4 * (i / 8) + i % 4 of lane j + 32 * ((i / 4) % 2). (cbsz, abid, blgp = 0:
 *     no broadcast, which is all glm_hip.hip uses; anything else stops the program.)
 *   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (wave 32): PTX ISA, "Matrix
 *     Fragments for mma.m16n8k16 with floating point type": g = lane / 4, t = lane % 4;
 *     A (16x16, 4 registers of two bf16, the lower k in the low half): a0 A[g][2t..2t+1],
 *     a1 A[g+8][2t..], a2 A[g][2t+8..], a3 A[g+8][2t+8..]; B (16x8, 2 registers):
 *     b0 B[2t..2t+1][g], b1 B[2t+8..2t+9][g]; C/D (4 floats): c0, c1 at C[g][2t], C[g][2t+1],
 *     c2, c3 at C[g+8][2t], C[g+8][2t+1]. */
/* the builtin's vector types, as structs (a 64-byte vector return would change the ABI) */
struct emu_s16x4 {
    short v[4];
    short operator[](int i) const { return v[i]; }
};
struct emu_f32x16 {
    float v[16];
    float &operator[](int i) { return v[i]; }
    float operator[](int i) const { return v[i]; }
};
struct EmuMmaLane { float a[8], b[4]; };
inline thread_local EmuMmaLane emu_mma_lane[1024];
inline float emu_bf16(unsigned h) { return __uint_as_float((h & 0xffffu) << 16); }
/* The wave's meeting; returns the first lane of this lane's wave. At the first meeting of
 * an instruction every lane of the wave must be there (none exited: a lane that finished
 * could not have posted its operands); at the second, lanes released before may have gone
 * on, even to their end. */
inline int emu_mma_meet(const char *what, bool first) {
    EmuFiber *me = emu_cur;
    const int w0 = me->lin - me->lin % WAVE;
    if (w0 + WAVE > emu_worker->n) emu_die(what);
    emu_syncwave();
    if (first)
        for (int i = w0; i < w0 + WAVE; i++)
            if (emu_worker->fibers[i].state == EMU_DONE) emu_die(what);
    return w0;
}
inline emu_f32x16 __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(emu_s16x4 a, emu_s16x4 b, emu_f32x16 c, int cbsz, int abid, int blgp) {
    if (WAVE != 64 || cbsz || abid || blgp) emu_die("v_mfma_f32_32x32x8_bf16 needs wave 64 and no broadcast");
    const int lin = emu_cur->lin, lane = lin % WAVE;
    for (int e = 0; e < 4; e++) { emu_mma_lane[lin].a[e] = emu_bf16((unsigned short)a[e]); emu_mma_lane[lin].b[e] = emu_bf16((unsigned short)b[e]); }
    const int w0 = emu_mma_meet("v_mfma_f32_32x32x8_bf16 without every lane of the wave", true);
    emu_f32x16 d;
    for (int r = 0; r < 16; r++) {
        const int i = 8 * (r / 4) + 4 * (lane / 32) + r % 4, j = lane % 32;
        float s = c[r];
        for (int k = 0; k < 8; k++) s += emu_mma_lane[w0 + i + 32 * (k / 4)].a[k % 4] * emu_mma_lane[w0 + j + 32 * (k / 4)].b[k % 4];
        d[r] = s;
    }
    emu_mma_meet("v_mfma_f32_32x32x8_bf16 without every lane of the wave", false);
    return d;
}
/* d = A · B + d, the registers of this lane */
inline void emu_mma_m16n8k16_bf16(float d[4], const unsigned a[4], const unsigned b[2]) {
    if (WAVE != 32) emu_die("mma.sync.m16n8k16 needs wave 32");
    const int lin = emu_cur->lin, lane = lin % WAVE;
    for (int r = 0; r < 4; r++) { emu_mma_lane[lin].a[2 * r] = emu_bf16(a[r]); emu_mma_lane[lin].a[2 * r + 1] = emu_bf16(a[r] >> 16); }
    for (int r = 0; r < 2; r++) { emu_mma_lane[lin].b[2 * r] = emu_bf16(b[r]); emu_mma_lane[lin].b[2 * r + 1] = emu_bf16(b[r] >> 16); }
    const int w0 = emu_mma_meet("mma.sync.m16n8k16 without every lane of the warp", true);
    /* A[i][k]: lane 4 * (i % 8) + (k % 8) / 2, register (i / 8) + 2 * (k / 8), half k % 2;
     * B[k][j]: lane 4 * j + (k % 8) / 2, register k / 8, half k % 2 */
    float out[4];
    for (int r = 0; r < 4; r++) {
        const int i = lane / 4 + 8 * (r / 2), j = 2 * (lane % 4) + r % 2;
        float s = d[r];
        for (int k = 0; k < 16; k++)
            s += emu_mma_lane[w0 + 4 * (i % 8) + (k % 8) / 2].a[2 * (i / 8 + 2 * (k / 8)) + k % 2] * emu_mma_lane[w0 + 4 * j + (k % 8) / 2].b[2 * (k / 8) + k % 2];
        out[r] = s;
    }
    emu_mma_meet("mma.sync.m16n8k16 without every lane of the warp", false);
    for (int r = 0; r < 4; r++) d[r] = out[r];
}

#endif
