/* tok_bench.c - the C side of bench.sh: tokenizer.json load time (best and mean of LOADS runs)
 * and encode throughput on one JSON string per line, REPEAT passes, one thread.
 *   tok_bench TOKENIZER.json strings.jsonl REPEAT LOADS
 * Prints one JSON object. */
#define _POSIX_C_SOURCE 200809L
#include "../../json.h"
#include "../../tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu(void) {   /* on a busy machine wall time includes waiting for a core */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: tok_bench TOKENIZER.json strings.jsonl REPEAT LOADS\n"); return 2; }
    int repeat = atoi(argv[3]), loads = atoi(argv[4]);
    char err[512];
    double best = 1e9, sum = 0, best_cpu = 1e9;
    Tokenizer *t = NULL;
    for (int i = 0; i < loads; i++) {
        double t0 = now(), c0 = cpu();
        Tokenizer *u = tokenizer_load(argv[1], err, sizeof err);
        double dt = now() - t0, dc = cpu() - c0;
        if (dc < best_cpu) best_cpu = dc;
        if (!u) { fprintf(stderr, "%s\n", err); return 1; }
        if (dt < best) best = dt;
        sum += dt;
        if (t) tokenizer_free(t);
        t = u;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) { perror(argv[2]); return 1; }
    char *line = NULL, **s = NULL;
    size_t cap = 0, n = 0, scap = 0, *len = NULL, bytes = 0;
    ssize_t l;
    while ((l = getline(&line, &cap, f)) >= 0) {
        Json j;
        if (json_parse(&j, line, (size_t)l, err, sizeof err) || j.root->type != JSON_STRING) { fprintf(stderr, "bad line\n"); return 1; }
        if (n == scap) { scap = scap ? 2 * scap : 1024; s = realloc(s, scap * sizeof *s); len = realloc(len, scap * sizeof *len); }
        s[n] = malloc(j.root->str_len + 1);
        memcpy(s[n], j.root->str, j.root->str_len + 1);
        len[n] = j.root->str_len;
        bytes += len[n++];
        json_free(&j);
    }
    fclose(f);
    free(line);
    long tokens = 0;
    int *ids;
    for (size_t i = 0; i < n && i < 200; i++) { tokenizer_encode(t, s[i], len[i], &ids, err, sizeof err); free(ids); }
    double t0 = now();
    for (int r = 0; r < repeat; r++)
        for (size_t i = 0; i < n; i++) {
            tokens += tokenizer_encode(t, s[i], len[i], &ids, err, sizeof err);
            free(ids);
        }
    double dt = now() - t0;
    printf("{\"load_best_s\": %.4f, \"load_cpu_best_s\": %.4f, \"load_mean_s\": %.4f, \"strings\": %zu, \"bytes\": %zu, \"s\": %.4f, \"tokens\": %ld}\n",
           best, best_cpu, sum / loads, n * (size_t)repeat, bytes * (size_t)repeat, dt, tokens);
    for (size_t i = 0; i < n; i++) free(s[i]);
    free(s);
    free(len);
    tokenizer_free(t);
    return 0;
}
