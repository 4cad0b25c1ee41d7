/* glm.c - GLM-5.2's forward pass in plain C: the reference.
 *
 * This file is the model's maths: what one step of GLM-5.2 computes, each op one
 * small function, in the order a token meets them. It uses no processor-specific
 * instructions, intrinsics or tuning constants; a few OpenMP pragmas split the work
 * across cores. Weights stay in their file format (BF16, FP8 block-scaled, MXFP4) and
 * are decoded on the fly; activations, norms, softmax, router and indexer scores are
 * fp32 (weight-only quantization, W4A16 / W8A16).
 *
 * The heavy ops go through the table `ops` (glm.h): this file fills it with its own
 * functions; fast.c (the fast CPU path, with simd.c) replaces entries once at start,
 * and GLM_KERNELS=c keeps these. tests/ref.py, a NumPy reference written from
 * docs/MODEL.md, checks the result; the fast path is tested against the same.
 *
 * Read top to bottom:
 *   1. matrix products
 *   2. small ops: RMSNorm, LayerNorm, RoPE, softmax, SiLU, top-k
 *   3. the DSA lightning indexer (§3.4)
 *   4. MLA attention, absorbed (§4.2)
 *   5. the MLP and the MoE (§3.7, §3.8)
 *   6. the whole model: forward() (§3.9)
 *   7. the MTP layer: mtp_forward() (§5; spec.c drafts with it)
 *   8. activations and the KV cache
 *   9. what a step costs, for the speed reports
 *  10. sampling
 *  11. a session: the model, its cache and activations, the GPU with --gpu
 *
 * Section numbers (§) and pitfalls refer to docs/MODEL.md. Shapes are [rows, cols] with
 * y = W·x; the short names (H, NH, KR, ...) are listed at the top of glm.h.
 */
#include "glm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Which thread we are in the one active parallel region (glm.c and fast.c allow one
 * active level): an op called from inside a parallel loop runs serially on the
 * calling thread, and either way each thread finds its own scratch. */
int thread_id(void) {
#ifdef _OPENMP
    for (int level = omp_get_level(); level >= 1; level--)
        if (omp_get_team_size(level) > 1) return omp_get_ancestor_thread_num(level);
#endif
    return 0;
}

static int max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* ======================================================================== */
/* 1. matrix products                                                       */

static float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy(float *y, float a, const float *x, int n) { /* y += a·x */
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* y[t][i] = W[i] · x[t] for every row i of W and token t < n: every Linear of the
 * model. Each row is decoded from its file format once (mat_dequant_row) and dotted
 * with every token of the chunk; the rows are split across threads. */
void matmul(float *y, const float *x, const Mat *W, int n) {
    const int rows = W->rows, cols = W->cols;
#pragma omp parallel
    {
        float row[cols];
#pragma omp for schedule(static)
        for (int i = 0; i < rows; i++) {
            mat_dequant_row(W, i, row);
            for (int t = 0; t < n; t++) y[(size_t)t * rows + i] = dot(row, x + (size_t)t * cols, cols);
        }
    }
}

/* Products that do not depend on each other (a layer's projections of one input). */
void matmul_group(const Product *p, int np, int n) {
    for (int i = 0; i < np; i++) matmul(p[i].y, p[i].x, p[i].W, n);
}

/* ======================================================================== */
/* 2. small ops                                                             */

/* RMSNorm (§3.1): y = w · x / sqrt(mean(x²) + eps), all fp32. */
static void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

/* LayerNorm with bias (the indexer's k_norm, §3.1, pitfall 9): biased variance. */
static void layernorm(float *y, const float *x, const float *w, const float *b, int n, float eps) {
    float mean = 0.0f, var = 0.0f;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (float)n;
    float r = 1.0f / sqrtf(var + eps);
    for (int i = 0; i < n; i++) y[i] = (x[i] - mean) * r * w[i] + b[i];
}

/* Interleaved (GPT-J) RoPE (§3.2): at position pos the pairs (2i, 2i+1) of a
 * `dims`-long vector rotate by pos·theta^(-2i/dims). rope_angles computes each pair's
 * cos and sin once per position, rope applies them to one vector (every head of a
 * token shares them). Angles in double: at long context the fp32 product loses ~0.03
 * rad on the fastest frequency. */
void rope_angles(float *cs, int dims, int pos, double theta) { /* cs: [dims/2][cos, sin] */
    for (int i = 0; i < dims / 2; i++) {
        double ang = (double)pos * pow(theta, -2.0 * i / dims);
        cs[2 * i] = (float)cos(ang);
        cs[2 * i + 1] = (float)sin(ang);
    }
}

static void rope(float *u, int dims, const float *cs) {
    for (int i = 0; i < dims / 2; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1], a = u[2 * i], b = u[2 * i + 1];
        u[2 * i] = a * c - b * s;
        u[2 * i + 1] = a * s + b * c;
    }
}

/* x = softmax(x) in place; the max is subtracted first, so no e^x overflows. */
void softmax(float *x, int n) {
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < n; j++) if (x[j] > mx) mx = x[j];
    for (int j = 0; j < n; j++) { x[j] = expf(x[j] - mx); sum += x[j]; }
    for (int j = 0; j < n; j++) x[j] /= sum;
}

static float silu(float x) { return x / (1.0f + expf(-x)); }
static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The k best of score[0..n) in the strict order (higher score first, then lower
 * index first) into out[0..k), a min-heap whose root is the worst kept. Ties are
 * common (ReLU zeros in the indexer), so the tie rule is part of the definition
 * (§3.5); the NumPy reference uses the same. */
static int better(const float *score, int a, int b) {
    float x = score[a], y = score[b];
    if (x != x || y != y) return y != y && (x == x || a < b); /* NaN ranks below every number (even -inf), NaNs by index */
    return x > y || (x == y && a < b);
}

static void topk_select(const float *score, int n, int k, int *heap) {
    for (int i = 0; i < n; i++) {
        int pos;
        if (i < k) { /* sift up */
            pos = i;
            while (pos > 0 && better(score, heap[(pos - 1) / 2], i)) { heap[pos] = heap[(pos - 1) / 2]; pos = (pos - 1) / 2; }
            heap[pos] = i;
        } else if (better(score, i, heap[0])) { /* replace the worst, sift down */
            pos = 0;
            for (;;) {
                int l = 2 * pos + 1, r = l + 1, w = pos;
                int wv = i; /* value being placed */
                if (l < k && better(score, wv, heap[l])) { w = l; wv = heap[l]; }
                if (r < k && better(score, wv, heap[r])) w = r;
                if (w == pos) break;
                heap[pos] = heap[w];
                pos = w;
            }
            heap[pos] = i;
        }
    }
}

/* This thread's row of s->scores: [T] floats. */
static float *thread_scores(const RunState *s, int ctx) {
    return s->scores + (size_t)thread_id() * ctx;
}

/* ======================================================================== */
/* 3. the DSA lightning indexer (§3.4)                                      */

/* I[t,s] = Σ_h w_h·ReLU(q_h·k_s / sqrt(ID)) / sqrt(IH): ReLU per head, then the
 * signed weighted sum (pitfall 10). */
static float index_score(const float *q, const float *w, const float *k, int IH, int ID) {
    const float q_scale = 1.0f / sqrtf((float)ID), w_scale = 1.0f / sqrtf((float)IH);
    float sum = 0.0f;
    for (int h = 0; h < IH; h++) {
        float d = dot(q + (size_t)h * ID, k, ID) * q_scale;
        sum += (w[h] * w_scale) * (d > 0.0f ? d : 0.0f);
    }
    return sum;
}

/* One query token against n_keys cached keys; split across threads when called
 * outside a parallel loop (decode). */
void index_scores(const Config *c, const float *q, const float *w, const float *keys, int n_keys, float *score) {
#pragma omp parallel for schedule(static)
    for (int j = 0; j < n_keys; j++) score[j] = index_score(q, w, keys + (size_t)j * c->index_head_dim, c->index_n_heads, c->index_head_dim);
}

/* Token t sees keys 0..visible-1; it keeps the index_topk best (all of them while
 * there are no more than that: attention is then dense and causal). */
static void index_select(const Config *c, const float *cache, int ctx, RunState *s, int t, int visible) {
    const int IH = c->index_n_heads, ID = c->index_head_dim, K = c->index_topk;
    int *sel = s->sel + (size_t)t * K;
    if (visible <= K) {
        for (int j = 0; j < visible; j++) sel[j] = j;
        s->n_sel[t] = visible;
        return;
    }
    float *score = thread_scores(s, ctx);
    ops.index_scores(c, s->ix_q + (size_t)t * IH * ID, s->ix_w + (size_t)t * IH, cache, visible, score);
    topk_select(score, visible, K, sel);
    s->n_sel[t] = K;
}

/* The indexer of a "full" layer: its queries (s->ix_q, from the q latent) and keys
 * (s->ix_k, from the normalised hidden state) came with attention's projections; the
 * keys get LayerNorm and RoPE and join the layer's indexer-key cache, then each token
 * of the chunk picks the cached positions it will attend to (s->sel). */
static void indexer(const Model *m, const Layer *L, KVCache *kv, RunState *s, int n, int pos0) {
    const Config *c = &m->cfg;
    const int IH = c->index_n_heads, ID = c->index_head_dim;
    float *cache = kv->index_k + (size_t)L->index_slot * kv->ctx * ID;
    float cs[c->qk_rope];
    for (int t = 0; t < n; t++) {
        rope_angles(cs, c->qk_rope, pos0 + t, c->rope_theta);
        for (int h = 0; h < IH; h++) rope(s->ix_q + ((size_t)t * IH + h) * ID, c->qk_rope, cs); /* first DR dims (pitfall 5) */
        float *k = cache + (size_t)(pos0 + t) * ID;
        layernorm(k, s->ix_k + (size_t)t * ID, L->ix_knorm_w, L->ix_knorm_b, ID, 1e-6f);
        rope(k, c->qk_rope, cs);
    }
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
    for (int t = 0; t < n; t++) index_select(c, cache, kv->ctx, s, t, pos0 + t + 1);
}

/* ======================================================================== */
/* 4. MLA attention, absorbed (§4.2)                                        */
/*
 * Keys and values are never expanded per head. Each token caches one latent row
 * (c, k_pe) per layer; the query is pulled into latent space instead:
 *   q_abs = W_UKᵀ·q_nope                         (absorb)
 *   score_j = (q_abs·c_j + q_pe·k_pe_j) / sqrt(DN+DR)
 *   o_lat = Σ_j softmax(score)_j · c_j           (the value sum stays a latent)
 *   o_head = W_UV·o_lat                          (un-absorb)
 * W_UK[h] and W_UV[h] are the DN and DV rows of head h in kv_b.
 */

/* q_abs[t][h] = (W_UK[h]ᵀ · q_nope[t][h], q_pe[t][h]) for every token and head. */
void mla_absorb(const Config *c, const Layer *L, RunState *s, int n) {
    const int NH = c->n_heads, DN = c->qk_nope, DR = c->qk_rope, DV = c->v_head, KR = c->kv_lora_rank;
    const int QD = DN + DR, AD = KR + DR;
#pragma omp parallel
    {
        float row[KR];
#pragma omp for schedule(static)
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < n; t++) {
                float *qa = s->q_abs + ((size_t)t * NH + h) * AD;
                memset(qa, 0, (size_t)KR * sizeof(float));
                memcpy(qa + KR, s->q + ((size_t)t * NH + h) * QD + DN, (size_t)DR * sizeof(float));
            }
            for (int i = 0; i < DN; i++) { /* row i of W_UK[h], scaled by q_nope[i] */
                mat_dequant_row(&L->kv_b, h * (DN + DV) + i, row);
                for (int t = 0; t < n; t++) axpy(s->q_abs + ((size_t)t * NH + h) * AD, s->q[((size_t)t * NH + h) * QD + i], row, KR);
            }
        }
    }
}

/* One token and head over its ns selected cached rows: scores, softmax over the
 * selected keys only, and the latent value sum o[KR]. score: [ns] scratch. */
static void mla_attend_head(const float *qa, const float *latent, const int *sel, int ns, int KR, int AD, float scale,
                            float *score, float *o) {
    for (int j = 0; j < ns; j++) score[j] = dot(qa, latent + (size_t)sel[j] * AD, AD) * scale;
    softmax(score, ns);
    memset(o, 0, (size_t)KR * sizeof(float));
    for (int j = 0; j < ns; j++) axpy(o, score[j], latent + (size_t)sel[j] * AD, KR);
}

/* o_heads[t][h] = W_UV[h] · o_lat[t][h] for every token and head. */
void mla_unabsorb(const Config *c, const Layer *L, RunState *s, int n) {
    const int NH = c->n_heads, DN = c->qk_nope, DV = c->v_head, KR = c->kv_lora_rank;
#pragma omp parallel
    {
        float row[KR];
#pragma omp for collapse(2) schedule(static)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < DV; i++) {
                mat_dequant_row(&L->kv_b, h * (DN + DV) + DN + i, row);
                for (int t = 0; t < n; t++)
                    s->o_heads[((size_t)t * NH + h) * DV + i] = dot(row, s->o_lat + ((size_t)t * NH + h) * KR, KR);
            }
    }
}

/* The attention itself, between the absorb and the un-absorb: every head of n tokens
 * over the cached latents its token selected, s->q_abs -> s->o_lat. pos0 is unused here:
 * the selection (s->sel) names every cached row a token reads. */
void mla_attend_absorbed(const Model *m, const Layer *L, const KVCache *kv, RunState *s, int layer, int n, int pos0) {
    (void)pos0; (void)L;
    const Config *c = &m->cfg;
    const int NH = c->n_heads, KR = c->kv_lora_rank, AD = KR + c->qk_rope, K = c->index_topk;
    const float *latent = kv->latent + (size_t)layer * kv->ctx * AD;
    const float scale = 1.0f / sqrtf((float)(c->qk_nope + c->qk_rope)); /* of qk_head_dim, not of the latent width (pitfall 7) */
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int t = 0; t < n; t++)
        for (int h = 0; h < NH; h++)
            mla_attend_head(s->q_abs + ((size_t)t * NH + h) * AD, latent, s->sel + (size_t)t * K, s->n_sel[t], KR, AD, scale,
                            thread_scores(s, kv->ctx), s->o_lat + ((size_t)t * NH + h) * KR);
}

/* The rows of a chunk that belong to one sequence: rows start..start+n-1, at positions
 * pos0.. of its cache kv. A prompt's chunk is one span; a batch of several sequences
 * (glm serve) is one span per sequence. Everything but attention treats the chunk's
 * rows alike; attention reads and writes each span's own cache. */
typedef struct {
    KVCache *kv;
    int start, n, pos0;
} Span;

/* s seen from row `start` on: the per-token arrays advanced by start rows (the scratch
 * is shared), so that a span runs through code written for a chunk starting at row 0. */
static RunState rows_from(const RunState *s, const Config *c, int start) {
    RunState v = *s;
    const size_t t = (size_t)start, AD = (size_t)c->kv_lora_rank + c->qk_rope;
    v.x += t * c->hidden; v.a += t * c->hidden; v.out += t * c->hidden;
    v.cq += t * c->q_lora_rank;
    v.q += t * c->n_heads * (c->qk_nope + c->qk_rope);
    v.ckv += t * AD;
    v.q_abs += t * c->n_heads * AD;
    v.o_lat += t * c->n_heads * c->kv_lora_rank;
    v.o_heads += t * c->n_heads * c->v_head;
    v.ix_q += t * c->index_n_heads * c->index_head_dim;
    v.ix_k += t * c->index_head_dim;
    v.ix_w += t * c->index_n_heads;
    v.sel += t * c->index_topk;
    v.n_sel += t;
    v.router += t * c->n_experts;
    v.ex_idx += t * c->n_active;
    v.ex_w += t * c->n_active;
    return v;
}

/* One span's cache rows and selection: q_pe and the new latent rows get RoPE at their
 * positions, the rows join the cache, then the indexer ("full" layers) picks the rows
 * each token attends to, or the previous layer's selection stands ("shared" layers,
 * IndexShare §3.6). s is the span's view (rows_from). */
static void span_rows(const Model *m, const Layer *L, KVCache *kv, RunState *s, int layer, int n, int pos0) {
    const Config *c = &m->cfg;
    const int NH = c->n_heads, DN = c->qk_nope, DR = c->qk_rope, KR = c->kv_lora_rank, AD = KR + DR;
    float cs[DR];
    for (int t = 0; t < n; t++) {
        rope_angles(cs, DR, pos0 + t, c->rope_theta);
        for (int h = 0; h < NH; h++) rope(s->q + ((size_t)t * NH + h) * (DN + DR) + DN, DR, cs); /* q_pe: the last DR of a head */
        float *row = kv->latent + ((size_t)layer * kv->ctx + pos0 + t) * AD; /* the cached row: RMSNorm(c), roped k_pe */
        rmsnorm(row, s->ckv + (size_t)t * AD, L->kv_a_norm, KR, 1e-6f);
        memcpy(row + KR, s->ckv + (size_t)t * AD + KR, (size_t)DR * sizeof(float));
        rope(row + KR, DR, cs);
    }
    if (L->has_indexer) indexer(m, L, kv, s, n, pos0); /* a shared layer keeps s->sel */
}

/* One attention block for the chunk's B rows (§3.3): the projections, each span's
 * cache rows and attention, o_proj. Reads s->a, writes s->out. `layer` is the layer's
 * latent row of the cache (n_layers for the MTP layer). */
static void attention(const Model *m, const Layer *L, RunState *s, int layer, const Span *span, int n_span, int B) {
    const Config *c = &m->cfg;
    const int QR = c->q_lora_rank;
    const int ix = L->has_indexer; /* a full layer's indexer takes its projections from the same inputs */
    const Product from_a[4] = {{s->cq, s->a, &L->q_a}, {s->ckv, s->a, &L->kv_a}, {s->ix_k, s->a, &L->ix_wk}, {s->ix_w, s->a, &L->ix_weights}};
    ops.matmul_group(from_a, ix ? 4 : 2, B);
    for (int t = 0; t < B; t++) /* eps 1e-6 for the q/kv latent norms (pitfall 4) */
        rmsnorm(s->cq + (size_t)t * QR, s->cq + (size_t)t * QR, L->q_a_norm, QR, 1e-6f);
    const Product from_cq[2] = {{s->q, s->cq, &L->q_b}, {s->ix_q, s->cq, &L->ix_wq_b}};
    ops.matmul_group(from_cq, ix ? 2 : 1, B);
    for (int i = 0; i < n_span; i++) {
        RunState v = rows_from(s, c, span[i].start);
        span_rows(m, L, span[i].kv, &v, layer, span[i].n, span[i].pos0);
    }
    /* the absorb and the un-absorb are a token's own arithmetic: all rows at once (each
     * head's W_UK and W_UV read once); the attention between them reads each span's cache */
    ops.mla_absorb(c, L, s, B);
    for (int i = 0; i < n_span; i++) {
        RunState v = rows_from(s, c, span[i].start);
        ops.mla_attend(m, L, span[i].kv, &v, layer, span[i].n, span[i].pos0);
    }
    ops.mla_unabsorb(c, L, s, B);
    ops.matmul(s->out, s->o_heads, &L->o, B);
}

/* ======================================================================== */
/* 5. the MLP and the MoE                                                   */

/* h_gate = SiLU(h_gate) ⊙ h_up in place, for n rows of width F (on all threads for a prompt). */
void swiglu_act(float *h_gate, const float *h_up, int n, int F) {
#pragma omp parallel for if (n > 1)
    for (int t = 0; t < n; t++)
        for (int i = 0; i < F; i++) h_gate[(size_t)t * F + i] = silu(h_gate[(size_t)t * F + i]) * h_up[(size_t)t * F + i];
}

/* SwiGLU MLP on n rows of x (§3.8): y = W_down · (SiLU(W_gate·x) ⊙ (W_up·x)). */
void swiglu(float *y, const float *x, const Mat *gate, const Mat *up, const Mat *down, float *h1, float *h2, int n) {
    const Product gate_up[2] = {{h1, x, gate}, {h2, x, up}};
    ops.matmul_group(gate_up, 2, n);
    swiglu_act(h1, h2, n, gate->rows);
    ops.matmul(y, h1, down, n);
}

/* The router (§3.7): fp32 sigmoid scores; the correction bias and the group limit
 * decide only WHICH experts run; their weights are the plain scores, renormalised,
 * times routed_scaling_factor. */
static void moe_route(const Config *c, const float *logits, const float *bias, int *idx, float *weight) {
    const int E = c->n_experts, G = c->n_group, per = E / G;
    float score[E], sel[E];
    for (int e = 0; e < E; e++) { score[e] = sigmoidf(logits[e]); sel[e] = score[e] + bias[e]; }
    if (G > 1) { /* keep the topk_group groups with the largest sum of their two best experts */
        float gscore[G];
        int gbest[G];
        for (int g = 0; g < G; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (sel[e] > b1) { b2 = b1; b1 = sel[e]; }
                else if (sel[e] > b2) b2 = sel[e];
            }
            gscore[g] = b1 + b2;
        }
        topk_select(gscore, G, c->topk_group, gbest);
        for (int g = 0; g < G; g++) {
            int kept = 0;
            for (int i = 0; i < c->topk_group; i++) kept |= gbest[i] == g;
            if (!kept) for (int e = g * per; e < (g + 1) * per; e++) sel[e] = -INFINITY;
        }
    }
    topk_select(sel, E, c->n_active, idx);
    float sum = 0.0f;
    for (int k = 0; k < c->n_active; k++) { weight[k] = score[idx[k]]; sum += weight[k]; }
    for (int k = 0; k < c->n_active; k++)
        weight[k] = (c->norm_topk_prob ? weight[k] / (sum + 1e-20f) : weight[k]) * c->routed_scale;
}

/* The (token, slot) pairs of the chunk's n tokens that chose expert e, as t * A + slot,
 * into s->ex_tokens, and their tokens' rows of x into s->ex_x; returns how many. */
int expert_gather(const Config *c, RunState *s, const float *x, int n, int e) {
    const int H = c->hidden, A = c->n_active;
    int cnt = 0;
    for (int t = 0; t < n; t++)
        for (int k = 0; k < A; k++)
            if (s->ex_idx[t * A + k] == e) s->ex_tokens[cnt++] = t * A + k;
#pragma omp parallel for if (cnt > 1)
    for (int i = 0; i < cnt; i++) memcpy(s->ex_x + (size_t)i * H, x + (size_t)(s->ex_tokens[i] / A) * H, (size_t)H * sizeof(float));
    return cnt;
}

/* y[t] += w · s->ex_y[i] for the cnt pairs expert_gather found, w their routing weights. */
void expert_scatter(const Config *c, const RunState *s, float *y, int cnt) {
    const int H = c->hidden, A = c->n_active;
    /* a token picks an expert at most once, so these rows of y are distinct (no race) */
#pragma omp parallel for if (cnt > 1)
    for (int i = 0; i < cnt; i++)
        axpy(y + (size_t)(s->ex_tokens[i] / A) * H, s->ex_w[s->ex_tokens[i]], s->ex_y + (size_t)i * H, H);
}

/* y = shared expert(x) + Σ_k w_k · expert_k(x) for n tokens, routing done. Each chosen
 * expert runs once on all the tokens that chose it, so its weights are read once per
 * chunk; the shared expert's output is not scaled (pitfall 8). */
void moe_experts(const Model *m, const Layer *L, RunState *s, const float *x, float *y, int n) {
    const Config *c = &m->cfg;
    if (c->n_shared) swiglu(y, x, &L->sh_gate, &L->sh_up, &L->sh_down, s->h1, s->h2, n);
    else memset(y, 0, (size_t)n * c->hidden * sizeof(float));
    for (int e = 0; e < c->n_experts; e++) {
        const int cnt = expert_gather(c, s, x, n, e);
        if (!cnt) continue;
        swiglu(s->ex_y, s->ex_x, &L->ex_gate[e], &L->ex_up[e], &L->ex_down[e], s->h1, s->h2, cnt);
        expert_scatter(c, s, y, cnt);
    }
}

/* A MoE block (§3.7): route every token, then the experts. */
static void moe(const Model *m, const Layer *L, RunState *s, const float *x, float *y, int n) {
    const Config *c = &m->cfg;
    const int A = c->n_active;
    ops.matmul(s->router, x, &L->router, n);
    for (int t = 0; t < n; t++) moe_route(c, s->router + (size_t)t * c->n_experts, L->router_bias, s->ex_idx + (size_t)t * A, s->ex_w + (size_t)t * A);
    ops.moe_experts(m, L, s, x, y, n);
}

/* ======================================================================== */
/* 6. the whole model (§3.9)                                                */

/* x[t] = RMSNorm(x[t]; w) into y for the chunk's B tokens (on all threads for a prompt). */
static void rmsnorm_rows(float *y, const float *x, const float *w, int B, int H, float eps) {
#pragma omp parallel for if (B > 1)
    for (int t = 0; t < B; t++) rmsnorm(y + (size_t)t * H, x + (size_t)t * H, w, H, eps);
}

static void add_rows(float *x, const float *out, int B, int H) { /* the residual: x += out */
#pragma omp parallel for if (B > 1)
    for (int t = 0; t < B; t++) axpy(x + (size_t)t * H, 1.0f, out + (size_t)t * H, H);
}

/* One decoder layer L on the chunk's B rows (its spans): pre-norm attention and pre-norm
 * MLP (dense layers) or MoE, each added to the residual stream s->x. The layer comes as
 * (L, l), not as an index into m->layers, so that the MTP layer (l = n_layers, its
 * latent row of the cache) runs through the same code. */
static void layer_forward(const Model *m, const Layer *L, int l, RunState *s, const Span *span, int n_span, int B) {
    const Config *c = &m->cfg;
    const int H = c->hidden;
    rmsnorm_rows(s->a, s->x, L->input_norm, B, H, c->rms_eps);
    attention(m, L, s, l, span, n_span, B);
    add_rows(s->x, s->out, B, H);
    rmsnorm_rows(s->a, s->x, L->post_norm, B, H, c->rms_eps);
    if (L->dense) swiglu(s->out, s->a, &L->gate, &L->up, &L->down, s->h1, s->h2, B);
    else moe(m, L, s, s->a, s->out, B);
    add_rows(s->x, s->out, B, H);
}

/* The output head of a chunk (§3.9; the MTP layer's with its shared_head.norm): rows
 * start..start+B-1 of n are s->x; RMSNorm(x; norm) -> hidden (if wanted) and -> lm_head ->
 * logits of every row (all_logits) or of the n-th only. Only the rows asked for are
 * normed: a decoded token's step norms just itself. */
static void head(const Model *m, const float *norm, RunState *s, int start, int B, int n, float *logits, int all_logits,
                 float *hidden) {
    const int H = m->cfg.hidden, V = m->cfg.vocab_size;
    if (all_logits || hidden) {
        rmsnorm_rows(s->a, s->x, norm, B, H, m->cfg.rms_eps);
        if (hidden) memcpy(hidden + (size_t)start * H, s->a, (size_t)B * H * sizeof(float));
        if (all_logits) ops.matmul(logits + (size_t)start * V, s->a, &m->lm_head, B);
    }
    if (!all_logits && logits && start + B == n) { /* the last token only */
        rmsnorm(s->a, s->x + (size_t)(B - 1) * H, norm, H, m->cfg.rms_eps);
        ops.matmul(logits, s->a, &m->lm_head, 1);
    }
}

/* A prompt runs in chunks of s->cap tokens: each chunk's weights are read once for all
 * its tokens, and its cache rows are written before the next chunk attends to them. */
void forward_hidden(const Model *m, KVCache *kv, RunState *s, const int *tokens, int n, float *logits, int all_logits,
                    float *hidden) {
    const Config *c = &m->cfg;
    const int H = c->hidden;
    for (int start = 0; start < n; start += s->cap) {
        const int B = n - start < s->cap ? n - start : s->cap;
        const Span one = {kv, 0, B, kv->pos};
        for (int t = 0; t < B; t++) mat_dequant_row(&m->embed, tokens[start + t], s->x + (size_t)t * H);
        for (int l = 0; l < c->n_layers; l++) layer_forward(m, &m->layers[l], l, s, &one, 1, B);
        kv->pos += B;
        head(m, m->final_norm, s, start, B, n, logits, all_logits, hidden);
    }
}

/* Every caller but the MTP path wants the logits only. */
void forward(const Model *m, KVCache *kv, RunState *s, const int *tokens, int n, float *logits, int all_logits) {
    forward_hidden(m, kv, s, tokens, n, logits, all_logits, NULL);
}

/* Several sequences in one chunk (continuous batching): their rows side by side, so
 * each weight is read once for all of them, and each span attends over its own cache.
 * Every row's arithmetic is what it would be alone: the products, norms and experts
 * treat rows independently, and attention is per span. */
void forward_batch(const Model *m, RunState *s, const SeqTokens *seq, int n_seq, float *logits) {
    const Config *c = &m->cfg;
    const int H = c->hidden;
    const float eps = c->rms_eps;
    Span span[n_seq];
    int B = 0;
    for (int i = 0; i < n_seq; i++) {
        span[i] = (Span){seq[i].kv, B, seq[i].n, seq[i].kv->pos};
        for (int t = 0; t < seq[i].n; t++) mat_dequant_row(&m->embed, seq[i].tokens[t], s->x + (size_t)(B + t) * H);
        B += seq[i].n;
    }
    if (B > s->cap) glm_fatal("forward_batch: %d rows for a chunk of %d", B, s->cap);
    for (int l = 0; l < c->n_layers; l++) layer_forward(m, &m->layers[l], l, s, span, n_seq, B);
    int rows = 0; /* the rows that get logits -> s->a, side by side -> one lm_head product */
    for (int i = 0; i < n_seq; i++) {
        const float *x = s->x + (size_t)span[i].start * H;
        seq[i].kv->pos += seq[i].n;
        if (seq[i].hidden) rmsnorm_rows(seq[i].hidden, x, m->final_norm, seq[i].n, H, eps);
        if (seq[i].all_logits) {
            rmsnorm_rows(s->a + (size_t)rows * H, x, m->final_norm, seq[i].n, H, eps);
            rows += seq[i].n;
        } else
            rmsnorm(s->a + (size_t)rows++ * H, x + (size_t)(seq[i].n - 1) * H, m->final_norm, H, eps);
    }
    /* one row per sequence here (or a verify step's few): the one-token kernels, even for
     * a prompt's last row (ops.prompt_rows holds for the layers' rows only) */
    const int prompt_rows = ops.prompt_rows;
    ops.prompt_rows = 0;
    ops.matmul(logits, s->a, &m->lm_head, rows);
    ops.prompt_rows = prompt_rows;
}

/* ======================================================================== */
/* 7. the MTP layer (§5)                                                    */
/*
 * From the main model's h_t and the token x_{t+1}, a prediction of x_{t+2}:
 *   u = eh_proj · [RMSNorm(embed(x_{t+1}); enorm) ; RMSNorm(h_t; hnorm)]   (embedding first)
 *   u = DecoderLayer_{n_layers}(u) at position t      (own MLA rows, own indexer, MoE)
 *   logits = lm_head · RMSNorm(u; shared_head.norm)    (the main model's lm_head)
 * h_t is the main model's FINAL-NORMED hidden state (model.norm's output, the lm_head's
 * input), as in vLLM (deepseek_mtp.py takes the target model's output, which
 * DeepseekV2Model returns after self.norm), SGLang (deepseek_nextn.py's
 * spec_info.hidden_states is what the logits processor fed to lm_head) and Megatron-LM's
 * training (the MTP block takes the decoder's output after its final_layernorm); see
 * docs/MODEL.md §5.1.
 */

/* The MTP layer's input for the chunk's B rows into s->x: u = eh_proj · [RMSNorm(embed(
 * next[t]); enorm) ; RMSNorm(h[t]; hnorm)]. The embedding is NOT zeroed at position 0
 * (vLLM zeroes it, "not needed by MTP"): §5.1 has no mask, SGLang and Megatron-LM's
 * training feed the real embedding at every position, and at t = 0 the pair (h_0, x_1)
 * is as real an input as any other. (A mask would change row 0's input only, but later
 * rows would see it through the MTP layer's attention.) */
static void mtp_input(const Model *m, RunState *s, const float *h, const int *next, int B) {
    const Mtp *P = m->mtp;
    const int H = m->cfg.hidden;
    const float eps = m->cfg.rms_eps;
#pragma omp parallel for if (B > 1)
    for (int t = 0; t < B; t++) {
        float *e = s->a + (size_t)t * H, *eh = s->eh + (size_t)t * 2 * H;
        mat_dequant_row(&m->embed, next[t], e);
        rmsnorm(eh, e, P->enorm, H, eps);
        rmsnorm(eh + H, h + (size_t)t * H, P->hnorm, H, eps);
    }
    ops.matmul(s->x, s->eh, &P->eh_proj, B);
}

/* One chunk of B rows through the MTP layer L (m->mtp->layer, or a copy of it without
 * its indexer for a draft step that reuses step 0's selection): input, the layer, the
 * head; rows start..start+B-1 of n. out_hidden [H] gets the last row's normed output. */
static void mtp_chunk(const Model *m, const Layer *L, KVCache *kv, RunState *s, const float *h, const int *next, int start,
                      int B, int n, float *logits, int all_logits, float *out_hidden) {
    const int H = m->cfg.hidden;
    const Span one = {kv, 0, B, kv->mtp_pos};
    mtp_input(m, s, h, next, B);
    layer_forward(m, L, m->cfg.n_layers, s, &one, 1, B);
    kv->mtp_pos += B;
    head(m, m->mtp->head_norm, s, start, B, n, logits, all_logits, NULL);
    if (out_hidden && start + B == n) rmsnorm(out_hidden, s->x + (size_t)(B - 1) * H, m->mtp->head_norm, H, m->cfg.rms_eps);
}

/* In chunks of s->cap rows, as forward(): the rows of a chunk are cached (latent row
 * n_layers, indexer slot n_index_layers) before the next chunk attends to them. */
void mtp_forward_hidden(const Model *m, KVCache *kv, RunState *s, const float *hidden, const int *next, int n,
                        float *logits, int all_logits, float *out_hidden, MtpSelection *keep) {
    const int H = m->cfg.hidden, K = m->cfg.index_topk;
    for (int start = 0; start < n; start += s->cap) {
        const int B = n - start < s->cap ? n - start : s->cap;
        mtp_chunk(m, &m->mtp->layer, kv, s, hidden + (size_t)start * H, next + start, start, B, n, logits, all_logits, out_hidden);
        if (keep && start + B == n) { /* the MTP layer is always "full": its indexer just chose s->sel */
            keep->n_sel = s->n_sel[B - 1];
            memcpy(keep->sel, s->sel + (size_t)(B - 1) * K, (size_t)keep->n_sel * sizeof(int));
            keep->pos = kv->mtp_pos - 1;
        }
    }
}

void mtp_forward(const Model *m, KVCache *kv, RunState *s, const float *hidden, const int *next, int n, float *logits,
                 int all_logits) {
    mtp_forward_hidden(m, kv, s, hidden, next, n, logits, all_logits, NULL, NULL);
}

static int cmp_int_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

/* A draft step >= 1 with index_share_for_mtp_iteration (§5.2): vLLM and SGLang skip the
 * MTP layer's indexer after step 0 and reuse its top-k. Step 0's selection cannot name the
 * rows later draft steps appended (its own among them), so those come first, then step 0's
 * rows newest first, index_topk at most: while the context is within index_topk this is
 * exactly dense causal attention, like every other layer. (Which keys engines add there is
 * an open point, docs/MODEL.md §9; it changes what is drafted, never what is output.) */
/* The selection of a draft step >= 1 at MTP row mtp_pos into sel[K]; returns its size
 * (>= 1: the row itself). The GPU's draft step takes it from here too. */
static int mtp_shared_selection(int K, int mtp_pos, const MtpSelection *step0, int *sel) {
    int n = 0;
    for (int r = mtp_pos; r > step0->pos && n < K; r--) sel[n++] = r;
    int *old = xmalloc((size_t)(step0->n_sel ? step0->n_sel : 1) * sizeof(int));
    memcpy(old, step0->sel, (size_t)step0->n_sel * sizeof(int));
    qsort(old, (size_t)step0->n_sel, sizeof(int), cmp_int_desc);
    for (int i = 0; i < step0->n_sel && n < K; i++) sel[n++] = old[i];
    free(old);
    return n;
}

void mtp_draft_shared(const Model *m, KVCache *kv, RunState *s, const float *h, int next, float *logits, float *out_hidden,
                      const MtpSelection *step0) {
    /* row 0 of the chunk's selection, which attention reads as it is */
    s->n_sel[0] = mtp_shared_selection(m->cfg.index_topk, kv->mtp_pos, step0, s->sel);
    Layer shared = m->mtp->layer; /* the same weights; attention keeps s->sel when the layer has no indexer */
    shared.has_indexer = 0;
    mtp_chunk(m, &shared, kv, s, h, &next, 0, 1, 1, logits, 0, out_hidden);
}

/* The table the forward pass calls through (glm.h); fast_init may replace entries. */
Ops ops = {.name = "plain C", .precision = "fp32", .matmul = matmul, .matmul_group = matmul_group, .index_scores = index_scores,
           .mla_absorb = mla_absorb, .mla_attend = mla_attend_absorbed, .mla_unabsorb = mla_unabsorb, .moe_experts = moe_experts};

/* ======================================================================== */
/* 8. activations and the KV cache                                          */

/* cap: tokens per chunk. A prompt's chunk is PREFILL_CHUNK tokens (glm.h): each weight
 * is read once per chunk, and GLM-5.2 routes a token to 8 of 256 experts, so a chunk of
 * 2048 gives an expert 64 tokens on average. The cost is memory: ~0.65 MB per token of
 * chunk at GLM-5.2's widths (a context shorter than the chunk sizes it instead). */
void runstate_init(RunState *s, const Config *c, int cap, int ctx) {
#ifdef _OPENMP
    omp_set_max_active_levels(1); /* an op inside a parallel loop runs serially; thread_id() relies on it */
#endif
    memset(s, 0, sizeof *s);
    s->cap = cap;
    int ffn = c->dense_inter > c->n_shared * c->moe_inter ? c->dense_inter : c->n_shared * c->moe_inter;
    if (ffn < c->moe_inter) ffn = c->moe_inter;
    const size_t B = (size_t)cap, rows = B > (size_t)c->n_active + 1 ? B : (size_t)c->n_active + 1; /* one token's experts side by side */
    const size_t AD = (size_t)c->kv_lora_rank + c->qk_rope;
    s->x = xmalloc(B * c->hidden * sizeof(float));
    s->a = xmalloc(B * c->hidden * sizeof(float));
    s->cq = xmalloc(B * c->q_lora_rank * sizeof(float));
    s->q = xmalloc(B * c->n_heads * (c->qk_nope + c->qk_rope) * sizeof(float));
    s->ckv = xmalloc(B * AD * sizeof(float));
    s->q_abs = xmalloc(B * c->n_heads * AD * sizeof(float));
    s->o_lat = xmalloc(B * c->n_heads * c->kv_lora_rank * sizeof(float));
    s->o_heads = xmalloc(B * c->n_heads * c->v_head * sizeof(float));
    s->out = xmalloc(B * c->hidden * sizeof(float));
    s->eh = c->n_mtp ? xmalloc(B * 2 * c->hidden * sizeof(float)) : NULL; /* 2H per token, when config.json announces MTP */
    s->scores = xmalloc((size_t)max_threads() * ctx * sizeof(float));
    s->ix_q = xmalloc(B * c->index_n_heads * c->index_head_dim * sizeof(float));
    s->ix_k = xmalloc(B * c->index_head_dim * sizeof(float));
    s->ix_w = xmalloc(B * c->index_n_heads * sizeof(float));
    s->sel = xmalloc(B * c->index_topk * sizeof(int));
    s->n_sel = xmalloc(B * sizeof(int));
    s->router = xmalloc(B * c->n_experts * sizeof(float));
    s->ex_idx = xmalloc(B * c->n_active * sizeof(int));
    s->ex_w = xmalloc(B * c->n_active * sizeof(float));
    s->ex_tokens = xmalloc(B * sizeof(int)); /* a token picks an expert at most once */
    s->ex_x = xmalloc(B * c->hidden * sizeof(float));
    s->ex_y = xmalloc(rows * c->hidden * sizeof(float));
    s->h1 = xmalloc(rows * ffn * sizeof(float));
    s->h2 = xmalloc(rows * ffn * sizeof(float));
    s->logits = xmalloc((size_t)c->vocab_size * sizeof(float));
    if (ops.prepare) ops.prepare(c, cap, ctx);
}

void runstate_free(RunState *s) {
    void *all[] = {s->x, s->a, s->cq, s->q, s->ckv, s->q_abs, s->o_lat, s->o_heads, s->out, s->eh, s->scores, s->ix_q, s->ix_k,
                   s->ix_w, s->sel, s->n_sel, s->router, s->ex_idx, s->ex_w, s->ex_tokens, s->ex_x, s->ex_y, s->h1, s->h2, s->logits};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    if (ops.release) ops.release();
}

/* The layers with cache rows: the main ones, then the MTP layer (if any), whose rows
 * are its own (§5.1: it attends over its own past, not the main layers'). */
static int latent_layers(const Model *m) { return m->cfg.n_layers + (m->mtp != NULL); }
static int index_layers(const Model *m) { return m->n_index_layers + (m->mtp != NULL); }

/* What each token leaves behind for later tokens (§4.1): per layer its latent row
 * (KR + DR floats), per indexer layer its indexer key (ID floats). */
void kvcache_init(KVCache *kv, const Model *m, int ctx) {
    const Config *c = &m->cfg;
    kv->ctx = ctx;
    kv->pos = kv->mtp_pos = 0;
    kv->latent = xcalloc((size_t)latent_layers(m) * ctx * (c->kv_lora_rank + c->qk_rope), sizeof(float));
    kv->index_k = xcalloc((size_t)(index_layers(m) ? index_layers(m) : 1) * ctx * c->index_head_dim, sizeof(float));
}

size_t kvcache_bytes(const Model *m, int ctx) {
    const Config *c = &m->cfg;
    return (size_t)ctx * ((size_t)latent_layers(m) * (c->kv_lora_rank + c->qk_rope) + (size_t)index_layers(m) * c->index_head_dim) * sizeof(float);
}

void kvcache_free(KVCache *kv) { free(kv->latent); free(kv->index_k); }

/* ======================================================================== */
/* 9. what a step costs                                                      */
/*
 * Counted from the shapes, op by op as forward() runs them, for the tokens/s, GB/s and
 * FLOP/s reports of glm run and glm bench. A matrix's bytes are its file bytes with
 * scales (Mat.bytes); a cached latent row is KR+DR floats, an indexer key ID floats.
 */

static double mat_flops(const Mat *W) { return 2.0 * W->rows * W->cols; } /* per token */

/* The bytes of one routed expert of layer L (gate, up, down), averaged over the experts. */
static double expert_bytes(const Config *c, const Layer *L) {
    double b = 0;
    for (int e = 0; e < c->n_experts; e++) b += (double)L->ex_gate[e].bytes + L->ex_up[e].bytes + L->ex_down[e].bytes;
    return b / c->n_experts;
}

double decode_bytes(const Model *m, int pos) {
    const Config *c = &m->cfg;
    const int AD = c->kv_lora_rank + c->qk_rope;
    const int visible = pos + 1, n_sel = visible < c->index_topk ? visible : c->index_topk;
    double b = (double)m->embed.bytes / m->embed.rows + (double)m->lm_head.bytes;
    for (int l = 0; l < c->n_layers; l++) {
        const Layer *L = &m->layers[l];
        b += (double)L->q_a.bytes + L->kv_a.bytes + L->q_b.bytes + L->kv_b.bytes + L->o.bytes; /* kv_b: W_UK and W_UV */
        if (L->has_indexer)
            b += (double)L->ix_wk.bytes + L->ix_weights.bytes + L->ix_wq_b.bytes + (double)visible * c->index_head_dim * sizeof(float);
        b += (double)n_sel * AD * sizeof(float);
        if (c->dense[l]) b += (double)L->gate.bytes + L->up.bytes + L->down.bytes;
        else b += (double)L->router.bytes + L->sh_gate.bytes + L->sh_up.bytes + L->sh_down.bytes + c->n_active * expert_bytes(c, L);
    }
    return b;
}

double forward_flops(const Model *m, int n, int pos0, int n_logits) {
    const Config *c = &m->cfg;
    const int NH = c->n_heads, DN = c->qk_nope, DV = c->v_head, KR = c->kv_lora_rank, AD = KR + c->qk_rope;
    double f = mat_flops(&m->lm_head) * n_logits, attend = 0, index = 0;
    for (int t = 0; t < n; t++) { /* per token: its selected keys; the indexer scores keys only past topk */
        const int visible = pos0 + t + 1;
        attend += 2.0 * NH * (visible < c->index_topk ? visible : c->index_topk) * (AD + KR);
        if (visible > c->index_topk) index += 2.0 * visible * c->index_n_heads * c->index_head_dim;
    }
    for (int l = 0; l < c->n_layers; l++) {
        const Layer *L = &m->layers[l];
        double per_token = mat_flops(&L->q_a) + mat_flops(&L->kv_a) + mat_flops(&L->q_b) + mat_flops(&L->o)
                         + 2.0 * NH * DN * KR + 2.0 * NH * DV * KR; /* absorb, un-absorb */
        if (L->has_indexer) per_token += mat_flops(&L->ix_wk) + mat_flops(&L->ix_weights) + mat_flops(&L->ix_wq_b);
        if (c->dense[l]) per_token += mat_flops(&L->gate) + mat_flops(&L->up) + mat_flops(&L->down);
        else per_token += mat_flops(&L->router) + mat_flops(&L->sh_gate) + mat_flops(&L->sh_up) + mat_flops(&L->sh_down)
                        + c->n_active * (mat_flops(&L->ex_gate[0]) + mat_flops(&L->ex_up[0]) + mat_flops(&L->ex_down[0]));
        f += per_token * n + attend + (L->has_indexer ? index : 0);
    }
    return f;
}

/* ======================================================================== */
/* 10. sampling                                                             */

void sampler_init(Sampler *sp, float temperature, float top_p, uint64_t seed, int vocab) {
    sp->temperature = temperature;
    sp->top_p = top_p;
    sp->rng = seed * 2654435761u + 88172645463325252ull; /* never 0 for xorshift */
    sp->order = xmalloc((size_t)vocab * sizeof(int));
}

void sampler_free(Sampler *sp) { free(sp->order); sp->order = NULL; }

float random_f32(Sampler *sp) { /* xorshift64*, the top 24 bits */
    sp->rng ^= sp->rng >> 12; sp->rng ^= sp->rng << 25; sp->rng ^= sp->rng >> 27;
    return (float)((sp->rng * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

/* The first index of the largest x. The running maximum sits in a register: comparing
 * with x[best] would make every step wait for a load of the last winner. */
int argmax(const float *x, int n) {
    int best = 0;
    float top = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > top) { top = x[i]; best = i; }
    return best;
}

float log_sum_exp(const float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    return (float)(mx + log(sum));
}

/* qsort's comparator sees only the two indices; the probabilities it orders them by are
 * this thread's (glm serve samples its sequences' rows on several threads at once) */
static _Thread_local const float *g_sort_probs;
static int cmp_prob_desc(const void *a, const void *b) {
    float x = g_sort_probs[*(const int *)a], y = g_sort_probs[*(const int *)b];
    return x < y ? 1 : x > y ? -1 : (*(const int *)a - *(const int *)b);
}

/* The nucleus: the most probable tokens whose probabilities first sum past top_p,
 * into sp->order[0..n); returns n, their sum in *mass. Only tokens above
 * (1 - top_p) / (V - 1) can be in it (if one below were, every token would be more
 * probable than it and the rest would sum to more than top_p), so only those are sorted. */
static int nucleus(Sampler *sp, const float *probs, int V, float *mass) {
    const float cutoff = (1.0f - sp->top_p) / (float)(V - 1);
    int n = 0;
    for (int i = 0; i < V; i++) if (probs[i] >= cutoff) sp->order[n++] = i;
    g_sort_probs = probs;
    qsort(sp->order, (size_t)n, sizeof(int), cmp_prob_desc);
    float cum = 0.0f;
    int last = n - 1;
    for (int i = 0; i < n; i++) { cum += probs[sp->order[i]]; if (cum > sp->top_p) { last = i; break; } }
    n = last + 1;
    *mass = cum < sp->top_p ? cum : 0.0f;
    if (*mass == 0.0f) for (int i = 0; i < n; i++) *mass += probs[sp->order[i]];
    return n;
}

/* Picks the next token from logits[V] (overwritten with probabilities): greedy at
 * temperature 0, else softmax(logits / T), cut to the top_p nucleus, drawn. */
int sample(Sampler *sp, float *logits, int V) {
    if (sp->temperature <= 0.0f) return argmax(logits, V);
    float mx = logits[argmax(logits, V)], sum = 0.0f;
    for (int i = 0; i < V; i++) { logits[i] = expf((logits[i] - mx) / sp->temperature); sum += logits[i]; }
    for (int i = 0; i < V; i++) logits[i] /= sum;
    int n = V;
    if (sp->top_p < 1.0f) n = nucleus(sp, logits, V, &sum);
    else {
        for (int i = 0; i < V; i++) sp->order[i] = i;
        sum = 1.0f;
    }
    float r = random_f32(sp) * sum, cdf = 0.0f;
    for (int i = 0; i < n; i++) { cdf += logits[sp->order[i]]; if (r < cdf) return sp->order[i]; }
    return n > 0 ? sp->order[n - 1] : V - 1; /* NaN probabilities leave no candidate: the last id, as the GPU's sampler */
}

/* The distribution sample() draws from, as a whole vector: the same temperature,
 * softmax and nucleus, so speculative sampling's target and draft are exactly it. */
void sampler_probs(Sampler *sp, float *logits, int V) {
    float mx = logits[argmax(logits, V)], sum = 0.0f;
    for (int i = 0; i < V; i++) { logits[i] = expf((logits[i] - mx) / sp->temperature); sum += logits[i]; }
    for (int i = 0; i < V; i++) logits[i] /= sum;
    if (sp->top_p >= 1.0f) return;
    float mass;
    int n = nucleus(sp, logits, V, &mass);
    float *keep = xmalloc((size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) keep[i] = logits[sp->order[i]] / mass;
    memset(logits, 0, (size_t)V * sizeof(float));
    for (int i = 0; i < n; i++) logits[sp->order[i]] = keep[i];
    free(keep);
}

/* Inverse CDF over w in index order, scaled by w's sum (a residual max(p - q, 0) is
 * drawn from without normalising it first); the last positive weight if rounding runs
 * past the end. */
int sample_weights(Sampler *sp, const float *w, int V) {
    float sum = 0.0f;
    int last = 0;
    for (int i = 0; i < V; i++) if (w[i] > 0.0f) { sum += w[i]; last = i; }
    float r = random_f32(sp) * sum, cdf = 0.0f;
    for (int i = 0; i < V; i++) { cdf += w[i]; if (w[i] > 0.0f && r < cdf) return i; }
    return last;
}

/* ======================================================================== */
/* 11. a session                                                            */

/* What glm logits --mtp (and speculative decoding) needs: an MTP layer (with --gpu
 * gpu_load puts it on the last device). Checked right after loading, so a refusal is
 * the only line printed. */
static void need_mtp(const Model *m) {
    if (!m->mtp && !m->cfg.n_mtp)
        glm_fatal("--mtp: %s has no MTP layer (config.json: num_nextn_predict_layers 0)", m->ck.dir);
    if (!m->mtp) glm_fatal("--mtp: %s has no MTP layer (no model.layers.%d.* tensors)", m->ck.dir, m->cfg.n_layers);
}

/* Loads the model, sizes its cache and activations for ctx tokens, prints one summary
 * line, then with n_gpus uploads it; mtp: the caller runs the MTP layer (need_mtp). */
static void session_start(Session *S, const char *dir, int ctx, int n_gpus, int mtp) {
    memset(S, 0, sizeof *S);
    double t0 = now_s();
    model_load(&S->model, dir);
    if (mtp) need_mtp(&S->model);
    kvcache_init(&S->kv, &S->model, ctx);
    runstate_init(&S->state, &S->model.cfg, ctx < PREFILL_CHUNK ? ctx : PREFILL_CHUNK, ctx);
    fprintf(stderr, "glm: %s: %d layers, %.2f GB of weights in %d shard(s), loaded in %.2f s; KV cache %d tokens x %zu bytes = %.1f MiB; %d threads, %s kernels\n",
            dir, S->model.cfg.n_layers, S->model.weight_bytes / 1e9, S->model.ck.n_shards, now_s() - t0, ctx,
            kvcache_bytes(&S->model, 1), kvcache_bytes(&S->model, ctx) / 1048576.0, max_threads(), ops.name);
#ifdef GLM_GPU
    if (n_gpus) S->gpu = gpu_load(&S->model, n_gpus, ctx);
#else
    if (n_gpus) glm_fatal("--gpu: this glm was built without GPU support (build it with make hip, make cuda or make emu)");
#endif
}

/* Two names rather than a flag, so the callers that never run the MTP layer stay as they were. */
void session_open(Session *S, const char *dir, int ctx, int n_gpus) { session_start(S, dir, ctx, n_gpus, 0); }
void session_open_mtp(Session *S, const char *dir, int ctx, int n_gpus) { session_start(S, dir, ctx, n_gpus, 1); }

void session_close(Session *S) {
#ifdef GLM_GPU
    if (S->gpu) gpu_free(S->gpu);
#endif
    runstate_free(&S->state);
    kvcache_free(&S->kv);
    model_free(&S->model);
    memset(S, 0, sizeof *S);
}

/* With --gpu, glm_hip.hip's copy of forward() runs at the same cache position; the
 * last token's logits stay on the device for session_sample. */
void session_forward(Session *S, KVCache *kv, const int *tokens, int n, float *logits, int all_logits) {
#ifdef GLM_GPU
    if (S->gpu) {
        gpu_forward(S->gpu, kv->pos, tokens, n, logits, all_logits);
        kv->pos += n;
        S->gpu_logits = all_logits ? NULL : logits;
        return;
    }
#endif
    forward(&S->model, kv, &S->state, tokens, n, logits, all_logits);
}

/* forward_hidden and mtp_forward on kv, on the GPU when there is one (the host keeps the
 * hidden states in between). */
void session_forward_hidden(Session *S, KVCache *kv, const int *tokens, int n, float *logits, int all_logits, float *hidden) {
#ifdef GLM_GPU
    if (S->gpu) {
        gpu_forward_hidden(S->gpu, kv->pos, tokens, n, logits, all_logits, hidden);
        kv->pos += n;
        S->gpu_logits = all_logits ? NULL : logits;
        return;
    }
#endif
    forward_hidden(&S->model, kv, &S->state, tokens, n, logits, all_logits, hidden);
}

void session_mtp_forward_hidden(Session *S, KVCache *kv, const float *hidden, const int *next, int n, float *logits,
                                int all_logits, float *out_hidden, MtpSelection *keep) {
#ifdef GLM_GPU
    if (S->gpu) {
        gpu_mtp_forward_keep(S->gpu, kv->mtp_pos, hidden, next, n, logits, all_logits, out_hidden, keep);
        kv->mtp_pos += n;
        S->gpu_logits = NULL; /* the device's last logits are now the MTP layer's */
        return;
    }
#endif
    mtp_forward_hidden(&S->model, kv, &S->state, hidden, next, n, logits, all_logits, out_hidden, keep);
}

static void session_mtp_forward(Session *S, const float *hidden, const int *next, int n, float *logits, int all_logits) {
    session_mtp_forward_hidden(S, &S->kv, hidden, next, n, logits, all_logits, NULL, NULL);
}

/* On the GPU the host computes the selection (the same rows as on the CPU) and the
 * device's MTP row attends to it. */
void session_mtp_draft_shared(Session *S, KVCache *kv, const float *h, int next, float *logits, float *out_hidden,
                              const MtpSelection *step0) {
#ifdef GLM_GPU
    if (S->gpu) {
        const int K = S->model.cfg.index_topk;
        int *sel = xmalloc((size_t)K * sizeof(int));
        const int n_sel = mtp_shared_selection(K, kv->mtp_pos, step0, sel);
        gpu_mtp_draft_shared(S->gpu, kv->mtp_pos, h, next, logits, out_hidden, sel, n_sel);
        free(sel);
        kv->mtp_pos += 1;
        S->gpu_logits = NULL;
        return;
    }
#endif
    mtp_draft_shared(&S->model, kv, &S->state, h, next, logits, out_hidden, step0);
}

/* glm logits --mtp. Decoding one token at a time, the MTP layer's row t runs as soon as
 * the main model has h_t and token t+1 is known: the order speculative decoding uses. */
void session_mtp_logits(Session *S, const int *ids, int n, float *logits, int one_at_a_time) {
    const Model *m = &S->model;
    const int H = m->cfg.hidden, V = m->cfg.vocab_size;
    need_mtp(m);
    if (n < 2) glm_fatal("--mtp: needs at least 2 ids (row i pairs h_i with ids[i+1])");
    float *hidden = xmalloc((size_t)n * H * sizeof(float)); /* h_0 .. h_{n-1} */
    if (one_at_a_time) {
        for (int t = 0; t < n; t++) {
            session_forward_hidden(S, &S->kv, ids + t, 1, NULL, 0, hidden + (size_t)t * H);
            if (t) session_mtp_forward(S, hidden + (size_t)(t - 1) * H, ids + t, 1, logits + (size_t)(t - 1) * V, 0);
        }
    } else {
        session_forward_hidden(S, &S->kv, ids, n, NULL, 0, hidden);
        session_mtp_forward(S, hidden, ids + 1, n - 1, logits, 1);
    }
    free(hidden);
}

/* On the GPU the draw happens on the device, from the same generator's numbers. */
int session_sample(Session *S, Sampler *sp, float *logits) {
#ifdef GLM_GPU
    if (S->gpu && logits && logits == S->gpu_logits) {
        S->gpu_logits = NULL;
        return gpu_sample(S->gpu, sp->temperature, sp->top_p, sp->temperature > 0.0f ? random_f32(sp) : 0.0f);
    }
#endif
    return sample(sp, logits, S->model.cfg.vocab_size);
}
