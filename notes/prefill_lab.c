/* prefill_lab.c - the fourteenth session's prefill harness: times forward() on a P-token
 * prompt of random ids after one untimed warm-up, as glm bench does, and prints tok/s and
 * GFLOP/s against the FMA peak measured around each run. It includes glm.c itself (for its
 * statics: session_open, forward, g_flops), so `perf record` on it profiles prefills only:
 *   gcc -std=gnu11 -O2 -fopenmp -o /tmp/prefill_lab notes/prefill_lab.c json.c synth.c simd.c \
 *       convert.c tokenizer.c -lm
 *   /tmp/prefill_lab /work/bench/glm2 6          # 6 timed prefills of 512 tokens
 *   perf record -o /tmp/p.data /tmp/prefill_lab /work/bench/glm2 8; perf report -i /tmp/p.data --sort pid,symbol
 * (--sort pid,symbol splits the main thread from the worker: what the main thread does
 * while the worker spins in libgomp is serial time.) To A/B a change in one process, put
 * both versions behind a global switch and alternate it between the runs: on this VM the
 * host's minute moves a run by more than most single changes do. */
#define main glm_cli_main
#include "../glm.c"
#undef main

int main(int argc, char **argv) {
    const int runs = argc > 2 ? atoi(argv[2]) : 0, P = 512;
    if (argc != 3 || runs < 1) { fprintf(stderr, "usage: prefill_lab MODEL_DIR RUNS (RUNS >= 1)\n"); return 1; }
    number_tables_init();
    kernels_init(NULL);
    Args a;
    char *av[] = {"glm", "bench", "-m", argv[1]};
    parse_args(&a, 4, av); /* fails with one line on a missing or broken checkpoint */
    a.ctx = P + 1;
    Session S;
    session_open(&S, &a, P);
    int *ids = xmalloc(P * sizeof(int));
    uint64_t rng = 12345; /* glm bench's ids */
    for (int i = 0; i < P; i++) { rng = rng * 6364136223846793005ull + 1442695040888963407ull; ids[i] = (int)((rng >> 33) % (uint64_t)S.model.cfg.vocab_size); }
    prefault_weights(&S.model);
    forward(&S.model, &S.kv, &S.state, ids, P, NULL, 0); /* warm-up: scratch mapped on first write */
    for (int r = 0; r < runs; r++) {
        double peak = kernels.fma_peak();
        S.kv.pos = 0;
        g_flops = 0;
        double t0 = now_s();
        forward(&S.model, &S.kv, &S.state, ids, P, S.state.logits, 0);
        double t = now_s() - t0;
        peak = 0.5 * (peak + kernels.fma_peak());
        printf("prefill %d: %.1f tok/s, %.1f GFLOP/s, FMA peak %.1f, ratio %.3f\n", P, P / t, g_flops / t / 1e9, peak / 1e9, g_flops / t / peak);
    }
    free(ids);
    session_close(&S);
    return 0;
}
