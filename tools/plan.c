/* tools/plan.c - glm plan: what one decoded token costs on a GPU, projected.
 *
 *   glm plan -m DIR [--target mi355x] [--gpus N] [--eff F] [--launch-us U] [--json]
 *   glm plan --glm52 [--format mxfp4|fp8|bf16] ...   GLM-5.2's shapes, no files needed
 *
 * A model, not a measurement. Decode reads every weight it uses once per token, so its
 * time is bytes / (bandwidth x the efficiency the GEMVs reach) plus the launches x what a
 * launch costs. The bytes are counted from the checkpoint's own tensors (or GLM-5.2's
 * shapes in a release's formats), kernel class by kernel class, as glm_hip.hip's decode
 * step reads them; the launches are counted from glm_hip.hip's code (plan_launches;
 * tests/test_gpu_emu.sh checks the count against the emulation's launch counter). Layers
 * split over --gpus N run one after another for one sequence (a pipeline), so more GPUs
 * add memory, not single-stream speed. Speculative decoding (--draft N) is projected the
 * same way: a verify pass reads the weights once for N+1 tokens plus the experts the
 * extra tokens choose, a draft step reads the MTP layer and the lm_head (docs/MODEL.md §5).
 */
#include "../glm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name, *card;
    double hbm_gbs;          /* per device */
    double mem_gb;           /* per device */
    double launch_us;        /* a kernel launch back to back on one stream */
    double node_us;          /* a kernel of a graph after the one before it (assumed, see below) */
    double handover_us;      /* the residual stream from one device to the next (assumed, see below) */
    double bf16_tflops;      /* dense BF16 matrix-core peak (no sparsity) */
} Target;

/* Vendor figures for bandwidth and memory; launch costs as commonly measured for
 * back-to-back launches on one stream (HIP costs more than CUDA). A graph's kernels skip
 * the host's launch path: NVIDIA's graph examples show ~0.5-1 us between short kernels;
 * for hipGraph on Instinct no figure was at hand, so 2 us is assumed. A hand-over between
 * devices (glm_hip.hip hand_over) synchronizes both devices and makes three small peer
 * copies, each a round trip of ~10 us over xGMI or NVLink: 50 and 30 us are assumed.
 * Override with flags. */
static const Target TARGETS[] = {
    {"mi355x", "AMD Instinct MI355X", 8000, 288, 5.0, 2.0, 50, 2500},
    {"mi300x", "AMD Instinct MI300X", 5300, 192, 5.0, 2.0, 50, 1307},
    {"h100", "NVIDIA H100 SXM", 3350, 80, 3.0, 1.0, 30, 989},
    {"h200", "NVIDIA H200", 4800, 141, 3.0, 1.0, 30, 989},
};

/* The kernel classes of one decode step, as glm_hip.hip runs them. */
enum { K_EMBED_HEAD, K_ATTN_PROJ, K_INDEXER, K_ATTEND, K_DENSE, K_MOE_SHARED, K_EXPERTS, K_SMALL, K_N };
static const char *const K_NAMES[K_N] = {"embedding row + lm_head", "attention projections", "indexer (full layers)",
                                         "MLA attention (cache rows)", "dense MLP", "MoE router + shared expert",
                                         "routed experts", "norms, adds, RoPE, top-k, routing"};

typedef struct {
    double bytes[K_N];
    int launches[K_N];
} StepCost;

static double mat(const Mat *W) { return (double)W->bytes; }

/* glm_hip.hip's launches for one layer of a step at position pos, a decode step of
 * `decode` tokens (1..8) or a prefill chunk (decode = 0) (layer_forward:
 * the previous layer's residual add fused with the input RMSNorm, the add fused with the
 * MLP's RMSNorm (the MLP's add goes to the next layer); attention: q_a, its norm, q_b,
 * kv_a, RoPE fused with the cache append, the absorb, the attention, its combine once a token selects more keys than
 * one slice holds (MLA_KEYS), the un-absorb, o_proj; a full layer's indexer: wq_b, wk,
 * weights, RoPE, the key, the scores once the context passes index_topk, top-k; the MLP,
 * where its formats allow (glm.h gpu_mlp_fused): gate and up of every expert (the shared
 * one too) in one launch, the down projections with the SiLU and the weighted combine in
 * the next, after the router and the routing (a dense layer: the two alone; several tokens
 * (decode > 1) take the same two, k_mlp_down_grouped or k_mlp_shared_down); otherwise
 * dense: gate, up, SiLU, down; MoE: the router, routing, the shared expert's 4, gate, up,
 * SiLU and down of the routed experts, the combine). Kept in step with the code by the
 * emulation's test. */
#define MLA_KEYS 64 /* glm_hip.hip: keys per tile of k_mla_attend_split, the shortest slice */
#define IX_TOKENS 8 /* glm_hip.hip: tokens per block of k_ix_scores_tiled */

static void plan_launches(const Config *c, const Layer *L, int full, int dense, int pos, int decode, int *out) {
    const int n_sel = pos + 1 < c->index_topk ? pos + 1 : c->index_topk;
    out[K_SMALL] += 2;                      /* (add +) rmsnorm, add + rmsnorm */
    out[K_ATTN_PROJ] += 5;                  /* q_a, q_b, kv_a, un-absorb (kv_b), o */
    out[K_SMALL] += 2;                      /* q_a norm, rope + kv append */
    /* absorb, attend; the combine of the attention's slices: a decode step spreads more keys than one
     * tile over several workgroups (glm_hip.hip mla_slices: 2 per compute unit; any GPU has >= 1) */
    out[K_ATTEND] += 2 + (n_sel > MLA_KEYS);
    if (full) {
        out[K_INDEXER] += 3 + (pos + 1 > c->index_topk); /* wq_b, wk, weights, scores */
        out[K_SMALL] += 3;                  /* rope, key, top-k */
    }
    if (decode && gpu_mlp_fused(c, L, NULL, NULL)) { /* k_mlp_gate_up, k_mlp_down (a MoE layer: + router, routing) */
        if (dense) out[K_DENSE] += 2;
        else { out[K_MOE_SHARED] += 1; out[K_SMALL] += 1; out[K_EXPERTS] += 2; }
    } else if (!decode && !dense && c->n_shared <= 1) { /* a prefill chunk's grouped experts, the shared one among them */
        out[K_MOE_SHARED] += 1;                 /* router */
        out[K_SMALL] += 4;                      /* routing, k_moe_group, SiLU, combine */
        out[K_EXPERTS] += 2;                    /* gate + up, down (k_gemm_grouped) */
    } else if (dense) { out[K_DENSE] += 3; out[K_SMALL] += 1; }
    else {
        out[K_MOE_SHARED] += 1 + (c->n_shared ? 3 : 0); /* router, shared gate/up/down */
        out[K_SMALL] += 1 + (c->n_shared ? 1 : 0) + 2;  /* routing, shared SiLU, expert SiLU, combine */
        out[K_EXPERTS] += 3;
    }
}

/* Bytes and launches of one decode step of n_tok tokens at positions pos.. (n_tok > 1:
 * a verify pass; the experts are those n_tok tokens choose, independently, on average). */
static StepCost step_cost(const Model *m, int pos, int n_tok) {
    const Config *c = &m->cfg;
    StepCost s;
    memset(&s, 0, sizeof s);
    const double AD = c->kv_lora_rank + c->qk_rope;
    s.bytes[K_EMBED_HEAD] = n_tok * mat(&m->embed) / m->embed.rows + mat(&m->lm_head);
    s.launches[K_EMBED_HEAD] = 2;           /* embed, lm_head */
    s.launches[K_SMALL] += 2;               /* the last layer's residual add, the final norm (one more add per device boundary) */
    const double distinct = c->n_experts * (1 - pow(1 - (double)c->n_active / c->n_experts, n_tok)); /* experts touched */
    for (int l = 0; l < c->n_layers; l++) {
        const Layer *L = &m->layers[l];
        const int visible = pos + n_tok, n_sel = visible < c->index_topk ? visible : c->index_topk;
        s.bytes[K_ATTN_PROJ] += mat(&L->q_a) + mat(&L->q_b) + mat(&L->kv_a) + mat(&L->kv_b) + mat(&L->o);
        if (L->has_indexer)
            s.bytes[K_INDEXER] += mat(&L->ix_wq_b) + mat(&L->ix_wk) + mat(&L->ix_weights) + (visible > c->index_topk ? (double)visible * c->index_head_dim * 4 : 0);
        /* each selected row once per token for all heads (k_mla_attend_split; its second pass over the
         * rows, for the values, and the slices' partial sums are assumed to stay in the cache) */
        s.bytes[K_ATTEND] += n_tok * (double)n_sel * AD * 4;
        if (L->dense) s.bytes[K_DENSE] += mat(&L->gate) + mat(&L->up) + mat(&L->down);
        else {
            double gate_up = 0, down = 0;
            for (int e = 0; e < c->n_experts; e++) { gate_up += mat(&L->ex_gate[e]) + mat(&L->ex_up[e]); down += mat(&L->ex_down[e]); }
            s.bytes[K_MOE_SHARED] += mat(&L->router) + mat(&L->sh_gate) + mat(&L->sh_up) + mat(&L->sh_down);
            /* each expert the tokens chose once for all of them (glm_hip.hip k_mlp_gate_up,
             * k_mlp_down_grouped) */
            s.bytes[K_EXPERTS] += distinct * (gate_up + down) / c->n_experts;
        }
        plan_launches(c, L, L->has_indexer, L->dense, pos + n_tok - 1, n_tok <= 8 ? n_tok : 0, s.launches);
    }
    return s;
}

/* The MTP draft step: its layer (one row) and the shared lm_head. */
static StepCost draft_cost(const Model *m) {
    StepCost s;
    memset(&s, 0, sizeof s);
    const Config *c = &m->cfg;
    const Layer *L = &m->mtp->layer;
    double ex = 0;
    for (int e = 0; e < c->n_experts; e++) ex += mat(&L->ex_gate[e]) + mat(&L->ex_up[e]) + mat(&L->ex_down[e]);
    s.bytes[K_ATTN_PROJ] = mat(&m->mtp->eh_proj) + mat(&L->q_a) + mat(&L->q_b) + mat(&L->kv_a) + mat(&L->kv_b) + mat(&L->o) +
                           mat(&L->ix_wq_b) + mat(&L->ix_wk) + mat(&L->ix_weights);
    s.bytes[K_EXPERTS] = c->n_active * ex / c->n_experts + mat(&L->router) + mat(&L->sh_gate) + mat(&L->sh_up) + mat(&L->sh_down);
    s.bytes[K_EMBED_HEAD] = mat(&m->lm_head) + mat(&m->embed) / m->embed.rows;
    s.launches[K_SMALL] = 6;                /* embed, two norms, eh_proj, the residual add, head norm */
    plan_launches(c, L, 1, 0, 0, 1, s.launches);
    s.launches[K_EMBED_HEAD] = 1;
    return s;
}

typedef struct {
    const Target *t;
    int gpus;
    double eff, launch_us, mma_eff, node_us, handover_us;
} Machine;

static double total(const double *v, int n) { double s = 0; for (int i = 0; i < n; i++) s += v[i]; return s; }
static int total_i(const int *v, int n) { int s = 0; for (int i = 0; i < n; i++) s += v[i]; return s; }

/* ------------------------------------------------------------------------ */
/* Prefill: chunks of up to 2048 tokens (glm_hip.hip prefill_chunk), each a set of matrix
 * products over the whole chunk. Its time is the larger of its arithmetic on the matrix
 * cores (at mma_eff of the dense BF16 peak) and its bytes (the weights once per chunk,
 * each routed expert once for all the tokens routed to it: k_gemm_grouped; the cache rows
 * each token's attention reads), plus its launches. */
#define PREFILL_CHUNK 2048

typedef struct {
    double flops, weight_bytes, expert_bytes, cache_bytes;
    int launches;
} ChunkCost;

static double elems(const Mat *W) { return (double)W->rows * W->cols; }

/* A chunk of n tokens at positions pos0..pos0+n-1 (the last one's lm_head only). */
static ChunkCost chunk_cost(const Model *m, int pos0, int n) {
    const Config *c = &m->cfg;
    ChunkCost k;
    memset(&k, 0, sizeof k);
    const int NH = c->n_heads, KR = c->kv_lora_rank, AD = KR + c->qk_rope, A = c->n_active, E = c->n_experts;
    double sel = 0, vis = 0; /* Σ over the chunk's tokens of selected keys and of visible keys */
    for (int t = 0; t < n; t++) {
        const int v = pos0 + t + 1;
        vis += v;
        sel += v < c->index_topk ? v : c->index_topk;
    }
    /* the experts a chunk touches: each of E with probability 1 - (1 - A/E)^n */
    const double distinct = E ? E * (1 - pow(1 - (double)A / E, n)) : 0;
    for (int l = 0; l < c->n_layers; l++) {
        const Layer *L = &m->layers[l];
        const Mat *proj[] = {&L->q_a, &L->q_b, &L->kv_a, &L->kv_b, &L->o};
        for (int i = 0; i < 5; i++) k.weight_bytes += mat(proj[i]);
        k.flops += 2.0 * n * (elems(&L->q_a) + elems(&L->q_b) + elems(&L->kv_a) + elems(&L->o)); /* kv_b: absorb + un-absorb */
        k.flops += 2.0 * n * NH * ((double)c->qk_nope * KR + (double)KR * c->v_head);
        k.flops += 2.0 * NH * (AD + KR) * sel;              /* scores and values over the selected rows */
        k.cache_bytes += sel * AD * 4;
        if (L->has_indexer) {
            k.weight_bytes += mat(&L->ix_wq_b) + mat(&L->ix_wk) + mat(&L->ix_weights);
            k.flops += 2.0 * n * (elems(&L->ix_wq_b) + elems(&L->ix_wk) + elems(&L->ix_weights));
            k.flops += 2.0 * c->index_n_heads * c->index_head_dim * vis; /* every visible key scored */
            k.cache_bytes += vis * c->index_head_dim * 4 / IX_TOKENS; /* a key tile serves IX_TOKENS tokens */
        }
        if (L->dense) {
            k.weight_bytes += mat(&L->gate) + mat(&L->up) + mat(&L->down);
            k.flops += 2.0 * n * (elems(&L->gate) + elems(&L->up) + elems(&L->down));
        } else {
            double ex = 0, exe = 0;
            for (int e = 0; e < E; e++) {
                ex += mat(&L->ex_gate[e]) + mat(&L->ex_up[e]) + mat(&L->ex_down[e]);
                exe += elems(&L->ex_gate[e]) + elems(&L->ex_up[e]) + elems(&L->ex_down[e]);
            }
            k.weight_bytes += mat(&L->router) + mat(&L->sh_gate) + mat(&L->sh_up) + mat(&L->sh_down);
            k.expert_bytes += distinct * ex / E;
            k.flops += 2.0 * n * (elems(&L->router) + elems(&L->sh_gate) + elems(&L->sh_up) + elems(&L->sh_down) + A * exe / E);
        }
        int lc[K_N] = {0};
        plan_launches(c, L, L->has_indexer, L->dense, pos0 + n - 1, 0, lc);
        k.launches += total_i(lc, K_N);
    }
    k.weight_bytes += n * mat(&m->embed) / m->embed.rows + mat(&m->lm_head);
    k.flops += 2.0 * elems(&m->lm_head);
    k.launches += 4;
    return k;
}

static double chunk_seconds(const ChunkCost *k, const Machine *M) {
    const double compute = k->flops / (M->t->bf16_tflops * 1e12 * M->mma_eff);
    const double memory = (k->weight_bytes + k->expert_bytes + k->cache_bytes) / (M->t->hbm_gbs * 1e9 * M->eff);
    return (compute > memory ? compute : memory) + k->launches * M->launch_us * 1e-6;
}

/* A prompt of `len` tokens in chunks of PREFILL_CHUNK: seconds, and the first chunk's cost. */
static double prefill_seconds(const Model *m, const Machine *M, int len, ChunkCost *first) {
    double t = 0;
    for (int p = 0; p < len; p += PREFILL_CHUNK) {
        ChunkCost k = chunk_cost(m, p, len - p < PREFILL_CHUNK ? len - p : PREFILL_CHUNK);
        if (p == 0 && first) *first = k;
        t += chunk_seconds(&k, M);
    }
    return t;
}

static void print_prefill(const Model *m, const Machine *M, int json) {
    const int lens[] = {2048, 20000};
    const Config *c = &m->cfg;
    ChunkCost k0;
    double t[2];
    for (int i = 0; i < 2; i++) t[i] = prefill_seconds(m, M, lens[i], i == 0 ? &k0 : NULL);
    double per_token_ex = 0; /* the same chunk's experts read once per (token, slot), as the decode kernels would */
    for (int l = 0; l < c->n_layers; l++) {
        const Layer *L = &m->layers[l];
        if (L->dense) continue;
        double ex = 0;
        for (int e = 0; e < c->n_experts; e++) ex += mat(&L->ex_gate[e]) + mat(&L->ex_up[e]) + mat(&L->ex_down[e]);
        per_token_ex += (double)PREFILL_CHUNK * c->n_active * ex / c->n_experts;
    }
    if (json) {
        printf(", \"prefill\": {\"chunk\": %d, \"mma_eff\": %.3f, \"bf16_tflops\": %.0f, \"chunk_tflop\": %.3f, \"chunk_weight_gb\": %.4f, "
               "\"chunk_expert_gb\": %.4f, \"chunk_expert_gb_per_token\": %.4f, \"chunk_cache_gb\": %.4f, \"chunk_launches\": %d, "
               "\"s_2048\": %.4f, \"s_20000\": %.4f, \"tok_s_2048\": %.1f, \"tok_s_20000\": %.1f}",
               PREFILL_CHUNK, M->mma_eff, M->t->bf16_tflops, k0.flops / 1e12, k0.weight_bytes / 1e9, k0.expert_bytes / 1e9, per_token_ex / 1e9,
               k0.cache_bytes / 1e9, k0.launches, t[0], t[1], lens[0] / t[0], lens[1] / t[1]);
        return;
    }
    printf("  prefill in chunks of %d (matrix cores at %.0f%% of %.0f dense BF16 TFLOP/s, BF16 activations):\n", PREFILL_CHUNK, 100 * M->mma_eff,
           M->t->bf16_tflops);
    printf("    a first chunk: %.1f TFLOP; %.2f GB of weights, %.2f GB of routed experts (each chosen expert once;\n"
           "    %.1f GB if read per token and slot), %.3f GB of cache rows (each token's own: mostly L2 hits); %d launches\n",
           k0.flops / 1e12, k0.weight_bytes / 1e9, k0.expert_bytes / 1e9, per_token_ex / 1e9, k0.cache_bytes / 1e9, k0.launches);
    for (int i = 0; i < 2; i++)
        printf("    a %d-token prompt: %.2f s, %.0f tok/s\n", lens[i], t[i], lens[i] / t[i]);
}


/* What the devices add to a step run as graphs: a graph launch on each, and per hand-over
 * the hand-over itself and one more kernel (the residual add that the next layer's norm
 * would otherwise take over). */
static double devices_us(const Machine *M) { return M->gpus * M->launch_us + (M->gpus - 1) * (M->handover_us + M->node_us); }

/* Seconds of one step on the machine: its bytes at eff x bandwidth, plus its launches:
 * (graph) a node's gap per kernel and devices_us, or one launch per kernel and each
 * hand-over after its extra kernel. */
static double step_seconds(const StepCost *s, const Machine *M, int launches, int graph) {
    const int handovers = M->gpus - 1;
    const double over = graph ? launches * M->node_us + devices_us(M) : (launches + handovers) * M->launch_us + handovers * M->handover_us;
    return total(s->bytes, K_N) / (M->t->hbm_gbs * 1e9 * M->eff) + over * 1e-6;
}

/* ------------------------------------------------------------------------ */
/* GLM-5.2's shapes (docs/MODEL.md §1.1) in a release's formats, without its files. */

static Mat shape(WeightFormat f, int rows, int cols) {
    Mat W = {.fmt = f, .rows = rows, .cols = cols};
    const double n = (double)rows * cols;
    W.bytes = (size_t)(f == WF_BF16 ? 2 * n : f == WF_FP8 ? n + 4.0 * ((rows + 127) / 128) * ((cols + 127) / 128) : n / 2 + n / 32);
    return W;
}

/* mxfp4: amd/GLM-5.2-MXFP4 (routed experts MXFP4, everything else BF16); fp8: the FP8
 * release (every linear layer FP8 with 128x128 scales, embedding and lm_head BF16);
 * bf16: the original. */
static void glm52_model(Model *m, const char *format) {
    memset(m, 0, sizeof *m);
    Config *c = &m->cfg;
    *c = (Config){.vocab_size = 154880, .hidden = 6144, .n_layers = 78, .n_mtp = 1, .n_heads = 64, .q_lora_rank = 2048,
                  .kv_lora_rank = 512, .qk_nope = 192, .qk_rope = 64, .v_head = 256, .index_n_heads = 32, .index_head_dim = 128,
                  .index_topk = 2048, .n_experts = 256, .n_active = 8, .n_shared = 1, .moe_inter = 2048, .dense_inter = 12288};
    const int mx = !strcmp(format, "mxfp4"), fp8 = !strcmp(format, "fp8");
    const WeightFormat lin = fp8 ? WF_FP8 : WF_BF16, ex = mx ? WF_MXFP4 : lin;
    const int H = c->hidden, NH = c->n_heads;
    m->embed = shape(WF_BF16, c->vocab_size, H);
    m->lm_head = shape(WF_BF16, c->vocab_size, H);
    m->layers = xcalloc((size_t)c->n_layers + 1, sizeof(Layer));
    for (int l = 0; l <= c->n_layers; l++) { /* the last one: the MTP layer's */
        Layer *L = &m->layers[l];
        c->dense[l] = l < 3;
        c->full_index[l] = l < c->n_layers && (l < 3 || (l - 2) % 4 == 0); /* 21 full layers: 0, 1, 2, 6, ..., 74 (docs/MODEL.md §1) */
        L->dense = l < c->n_layers && c->dense[l];
        L->has_indexer = l == c->n_layers || c->full_index[l];
        L->q_a = shape(lin, c->q_lora_rank, H);
        L->q_b = shape(lin, NH * (c->qk_nope + c->qk_rope), c->q_lora_rank);
        L->kv_a = shape(lin, c->kv_lora_rank + c->qk_rope, H);
        L->kv_b = shape(lin, NH * (c->qk_nope + c->v_head), c->kv_lora_rank);
        L->o = shape(lin, H, NH * c->v_head);
        if (L->has_indexer) {
            L->ix_wq_b = shape(lin, c->index_n_heads * c->index_head_dim, c->q_lora_rank);
            L->ix_wk = shape(lin, c->index_head_dim, H);
            L->ix_weights = shape(WF_BF16, c->index_n_heads, H);
        }
        if (L->dense) { L->gate = L->up = shape(lin, c->dense_inter, H); L->down = shape(lin, H, c->dense_inter); continue; }
        L->router = shape(WF_F32, c->n_experts, H);
        L->router.bytes = (size_t)c->n_experts * H * 4;
        L->sh_gate = L->sh_up = shape(lin, c->moe_inter, H);
        L->sh_down = shape(lin, H, c->moe_inter);
        L->ex_gate = xmalloc((size_t)c->n_experts * sizeof(Mat));
        L->ex_up = xmalloc((size_t)c->n_experts * sizeof(Mat));
        L->ex_down = xmalloc((size_t)c->n_experts * sizeof(Mat));
        for (int e = 0; e < c->n_experts; e++) {
            L->ex_gate[e] = L->ex_up[e] = shape(ex, c->moe_inter, H);
            L->ex_down[e] = shape(ex, H, c->moe_inter);
        }
    }
    for (int l = 0; l < c->n_layers; l++) m->n_index_layers += c->full_index[l];
    /* the matrices' bytes (the main model's; the norms' vectors are a rounding error) */
    m->weight_bytes = m->embed.bytes + m->lm_head.bytes;
    for (int l = 0; l < c->n_layers; l++) {
        const Layer *L = &m->layers[l];
        const Mat *each[] = {&L->q_a, &L->q_b, &L->kv_a, &L->kv_b, &L->o, &L->ix_wq_b, &L->ix_wk, &L->ix_weights, &L->gate, &L->up,
                             &L->down, &L->router, &L->sh_gate, &L->sh_up, &L->sh_down};
        for (size_t i = 0; i < sizeof each / sizeof *each; i++) m->weight_bytes += each[i]->bytes;
        for (int e = 0; !L->dense && e < c->n_experts; e++) m->weight_bytes += L->ex_gate[e].bytes + L->ex_up[e].bytes + L->ex_down[e].bytes;
    }
    static Mtp mtp;
    mtp.layer = m->layers[c->n_layers];
    mtp.eh_proj = shape(lin, H, 2 * H);
    m->mtp = &mtp;
}

static void glm52_free(Model *m) {
    for (int l = 0; l <= m->cfg.n_layers; l++) { free(m->layers[l].ex_gate); free(m->layers[l].ex_up); free(m->layers[l].ex_down); }
    free(m->layers);
}

/* ------------------------------------------------------------------------ */

static void print_step(const char *what, const StepCost *s, const Machine *M, int launches_per_layer_cap, const Config *c, int json,
                       int first) {
    const int L = total_i(s->launches, K_N);
    const int capped = launches_per_layer_cap ? launches_per_layer_cap * c->n_layers + 4 : L;
    const double t = step_seconds(s, M, L, 1), t1 = step_seconds(s, M, L, 0), tc = step_seconds(s, M, capped, 1);
    const double tb = total(s->bytes, K_N) / (M->t->hbm_gbs * 1e9);
    if (json) {
        printf("%s\"%s\": {\"gb\": %.4f, \"launches\": %d, \"graph\": %s, \"ms\": %.4f, \"tok_s\": %.2f, \"tok_s_one_launch_per_kernel\": %.2f, "
               "\"tok_s_6_launches_per_layer\": %.2f, \"tok_s_bandwidth_bound\": %.2f}",
               first ? "" : ", ", what, total(s->bytes, K_N) / 1e9, L, "true", t * 1e3, 1 / t, 1 / t1, 1 / tc, 1 / tb);
        return;
    }
    printf("  %s: %.2f GB and %d launches per token (%.1f per layer)\n", what, total(s->bytes, K_N) / 1e9, L, (double)L / c->n_layers);
    for (int k = 0; k < K_N; k++)
        printf("    %-30s %8.3f GB  %5d launches  %7.3f ms\n", K_NAMES[k], s->bytes[k] / 1e9, s->launches[k],
               (s->bytes[k] / (M->t->hbm_gbs * 1e9 * M->eff) + s->launches[k] * M->node_us * 1e-6) * 1e3);
    if (M->gpus > 1)
        printf("    %-30s %8s     %5d hand-overs  %7.3f ms\n", "devices (a graph each)", "", M->gpus - 1,
               devices_us(M) * 1e-3);
    printf("    => as %s: %.2f ms: %.1f tok/s (one launch per kernel: %.1f tok/s); with <= 6 kernels per layer %.1f tok/s;\n"
           "       the bandwidth alone %.1f tok/s\n", M->gpus > 1 ? "a graph per device" : "one graph", t * 1e3, 1 / t, 1 / t1, 1 / tc, 1 / tb);
}

static const double ACCEPT[] = {0.6, 0.7, 0.8, 0.9};

static void print_spec(const Model *m, const Machine *M, int pos, int json) {
    /* the decode and verify steps as graphs, the MTP layer's draft steps one launch per kernel */
    const StepCost d0 = step_cost(m, pos, 1), dr = draft_cost(m);
    const double t1 = step_seconds(&d0, M, total_i(d0.launches, K_N), 1);
    const double c = step_seconds(&dr, M, total_i(dr.launches, K_N), 0) / t1;
    double r[5];
    for (int N = 1; N <= 4; N++) {
        StepCost v = step_cost(m, pos, N + 1);
        r[N] = step_seconds(&v, M, total_i(v.launches, K_N), 1) / t1;
    }
    if (json) printf(", \"spec\": {\"verify_cost\": [%.4f, %.4f, %.4f, %.4f], \"draft_cost\": %.4f, \"speedup\": {", r[1], r[2], r[3], r[4], c);
    else printf("  --draft N (MTP): verify pass r(N) = %.2f %.2f %.2f %.2f decode steps (N = 1..4), a draft step c = %.2f\n", r[1], r[2], r[3], r[4], c);
    for (int i = 0; i < 4; i++) {
        const double a = ACCEPT[i];
        if (json) printf("%s\"%.1f\": [", i ? ", " : "", a);
        else printf("    projected speedup at acceptance %.1f:", a);
        for (int N = 1; N <= 4; N++) {
            const double s = (1 - pow(a, N + 1)) / ((1 - a) * (r[N] + N * c));
            printf(json ? "%s%.3f" : "%s %.2f", json && N > 1 ? ", " : "", s);
        }
        printf(json ? "]" : " (N = 1..4)\n");
    }
    if (json) printf("}}");
}

/* The launches one more sequence adds to glm serve's decode step at position pos (each
 * sequence one token): per layer a full layer's indexer scores (past index_topk) and its
 * attention with the combine of its slices (glm_hip.hip attention(); the products, the
 * RoPE and cache append, the indexer's RoPE, key and top-k, and the MLP take all rows at
 * once). */
static int sequence_launches(const Model *m, int pos) {
    const Config *c = &m->cfg;
    const int n_sel = pos + 1 < c->index_topk ? pos + 1 : c->index_topk;
    int n = 0;
    for (int l = 0; l < c->n_layers; l++)
        n += (m->layers[l].has_indexer && pos + 1 > c->index_topk) + 1 + (n_sel > MLA_KEYS);
    return n;
}

/* glm serve's decode step of n sequences at position pos: a one-token step's launches,
 * where with n > 1 a full layer's indexer RoPE and key are one launch for all rows
 * (k_ix_rope_key_rows; one sequence: k_rope, k_ix_key), plus sequence_launches for each
 * sequence after the first. */
static int serve_step_launches(const Model *m, int pos, int n) {
    int full = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) full += m->layers[l].has_indexer;
    return total_i(step_cost(m, pos, 1).launches, K_N) - (n > 1 ? full : 0) + (n - 1) * sequence_launches(m, pos);
}

/* glm serve's decode step of n sequences, one token each, at the same context: the bytes
 * of n tokens of one sequence (each row reads its own cache rows and its own experts) and
 * a one-token step's launches plus sequence_launches for each sequence after the first;
 * the n sequences decode at n / (its cost in decode steps) times one sequence's tok/s
 * (issue 34's target: 5x for 8). */
static void print_serve(const Model *m, const Machine *M, int pos, int json) {
    const StepCost one = step_cost(m, pos, 1), eight = step_cost(m, pos, 8);
    const int launches = serve_step_launches(m, pos, 8);
    const double r = step_seconds(&eight, M, launches, 1) / step_seconds(&one, M, total_i(one.launches, K_N), 1);
    if (json) printf(", \"serve_8\": {\"step_cost\": %.4f, \"ratio\": %.3f}", r, 8 / r);
    else printf("  glm serve, 8 sequences decoding together: a step of %.2f decode steps, %.2fx one sequence's tok/s\n", r, 8 / r);
}

int plan_main(int argc, char **argv) {
    const char *dir = NULL, *format = "mxfp4", *target = "mi355x";
    int gpus = 1, json = 0, glm52 = 0;
    double eff = 0.75, launch_us = -1, mma_eff = 0.45, node_us = -1, handover_us = -1;
    static const char usage[] =
        "usage: glm plan (-m DIR | --glm52) [--format mxfp4|fp8|bf16] [--target NAME] [--gpus N] [--eff F] [--mma-eff F] [--launch-us U]\n"
        "                [--node-us U] [--handover-us U] [--json]\n"
        "  A projection, not a measurement: a decoded token's bytes and kernel launches on the GPU path\n"
        "  (glm_hip.hip), class by class, and the decode tok/s they imply at context 1024 and 8192 on a\n"
        "  named GPU; glm serve's 8 sequences decoding together against one; with the MTP layer, the\n"
        "  projected speedup of --draft N; and prefill: a chunk's\n"
        "  arithmetic and bytes, and the seconds of a 2048- and a 20000-token prompt.\n"
        "  -m DIR            a checkpoint: its tensors' own bytes (nothing is read but the headers)\n"
        "  --glm52           GLM-5.2's shapes instead, in a release's formats (--format; default mxfp4 =\n"
        "                    amd/GLM-5.2-MXFP4: routed experts MXFP4, the rest BF16)\n"
        "  --target NAME     mi355x (default), mi300x, h100, h200\n"
        "  --gpus N          devices the layers are split over (a pipeline: memory, not single-stream speed;\n"
        "                    a graph per device, the residual stream handed from one to the next)\n"
        "  --eff F           the fraction of HBM bandwidth the kernels reach (default 0.75: issue 32's target)\n"
        "  --mma-eff F       the fraction of the dense BF16 matrix-core peak prefill reaches (default 0.45)\n"
        "  --launch-us U     one kernel launch in microseconds (default: the target's)\n"
        "  --node-us U       one kernel of a graph (a decode step's share of a device) in microseconds\n"
        "                    (default: the target's, assumed)\n"
        "  --handover-us U   one hand-over between devices in microseconds (default: the target's, assumed)\n"
        "  --json            one JSON object\n"
        "  -h, --help        this text";
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { puts(usage); return 0; }
        if (!strcmp(f, "--json")) { json = 1; continue; }
        if (!strcmp(f, "--glm52")) { glm52 = 1; continue; }
        if (strcmp(f, "-m") && strcmp(f, "--format") && strcmp(f, "--target") && strcmp(f, "--gpus") && strcmp(f, "--eff") && strcmp(f, "--mma-eff") && strcmp(f, "--launch-us") && strcmp(f, "--node-us") &&
            strcmp(f, "--handover-us"))
            glm_fatal("plan: unknown flag '%s' (see glm plan --help)", f);
        if (i + 1 >= argc) glm_fatal("%s: missing value", f);
        const char *v = argv[++i];
        char *end;
        if (!strcmp(f, "-m")) dir = v;
        else if (!strcmp(f, "--format")) {
            if (strcmp(v, "mxfp4") && strcmp(v, "fp8") && strcmp(v, "bf16")) glm_fatal("--format %s: expected mxfp4, fp8 or bf16", v);
            format = v;
        } else if (!strcmp(f, "--target")) target = v;
        else if (!strcmp(f, "--gpus")) { long x = strtol(v, &end, 10); if (!*v || *end || x < 1 || x > 64) glm_fatal("--gpus %s: expected 1..64", v); gpus = (int)x; }
        else if (!strcmp(f, "--eff")) { eff = strtod(v, &end); if (!*v || *end || !(eff > 0 && eff <= 1)) glm_fatal("--eff %s: expected a fraction in (0, 1]", v); }
        else if (!strcmp(f, "--mma-eff")) { mma_eff = strtod(v, &end); if (!*v || *end || !(mma_eff > 0 && mma_eff <= 1)) glm_fatal("--mma-eff %s: expected a fraction in (0, 1]", v); }
        else if (!strcmp(f, "--handover-us")) { handover_us = strtod(v, &end); if (!*v || *end || !(handover_us >= 0 && handover_us < 1e6)) glm_fatal("--handover-us %s: expected microseconds >= 0", v); }
        else if (!strcmp(f, "--node-us")) { node_us = strtod(v, &end); if (!*v || *end || !(node_us >= 0 && node_us < 1e6)) glm_fatal("--node-us %s: expected microseconds >= 0", v); }
        else { launch_us = strtod(v, &end); if (!*v || *end || !(launch_us >= 0 && launch_us < 1e6)) glm_fatal("--launch-us %s: expected microseconds >= 0", v); }
    }
    if (!dir == !glm52) glm_fatal("plan: give a checkpoint (-m DIR) or --glm52 (see glm plan --help)");
    const Target *t = NULL;
    for (size_t i = 0; i < sizeof TARGETS / sizeof *TARGETS; i++) if (!strcmp(target, TARGETS[i].name)) t = &TARGETS[i];
    if (!t) glm_fatal("--target %s: expected mi355x, mi300x, h100 or h200", target);
    Machine M = {t, gpus, eff, launch_us >= 0 ? launch_us : t->launch_us, mma_eff, node_us >= 0 ? node_us : t->node_us,
                 handover_us >= 0 ? handover_us : t->handover_us};
    Model m;
    if (glm52) glm52_model(&m, format);
    else model_load(&m, dir);
    const Config *c = &m.cfg;
    const double weights_gb = m.weight_bytes / 1e9;
    const int ctxs[] = {1024, 8192};
    if (json) printf("{\"model\": \"%s\", \"target\": \"%s\", \"gpus\": %d, \"hbm_gbs\": %.0f, \"eff\": %.3f, \"launch_us\": %.2f, "
                     "\"node_us\": %.2f, \"handover_us\": %.2f, \"weights_gb\": %.4f, \"launches_decode_step_pos0\": %d, ",
                     glm52 ? "GLM-5.2" : dir, t->name, gpus, t->hbm_gbs, eff, M.launch_us, M.node_us, M.handover_us, weights_gb, total_i(step_cost(&m, 0, 1).launches, K_N));
    if (json) { /* one-token steps at positions 0..31 (the emulation's test sums them) */
        printf("\"launches_positions_0_31\": [");
        for (int p = 0; p < 32; p++) printf("%s%d", p ? ", " : "", total_i(step_cost(&m, p, 1).launches, K_N));
        printf("], \"launches_rows_1_8\": ["); /* one step of n = 1..8 tokens of one sequence from position 0 (a verify pass) */
        for (int n = 1; n <= 8; n++) printf("%s%d", n > 1 ? ", " : "", total_i(step_cost(&m, 0, n).launches, K_N));
        printf("], \"launches_serve_rows_1_8\": ["); /* glm serve's step of n = 1..8 sequences at position 0 */
        for (int n = 1; n <= 8; n++) printf("%s%d", n > 1 ? ", " : "", serve_step_launches(&m, 0, n));
        printf("], ");
    }
    else {
        printf("glm plan: %s%s%s on %s x %d: %.0f GB/s HBM per device, kernels at %.0f%% of it, %.1f us per launch, %.1f us per graph kernel",
               glm52 ? "GLM-5.2 (" : dir, glm52 ? format : "", glm52 ? " release layout)" : "", t->card, gpus, t->hbm_gbs, 100 * eff, M.launch_us, M.node_us);
        if (gpus > 1) printf(", %.0f us per hand-over", M.handover_us);
        printf("\n");
        printf("  (a model, not a measurement; one sequence; with --gpus N the layers run one device after another)\n");
        if (weights_gb > 0) {
            printf("  weights %.1f GB: %.0f%% of %d x %.0f GB", weights_gb, 100 * weights_gb / (gpus * t->mem_gb), gpus, t->mem_gb);
            const int need = (int)ceil(weights_gb / (0.9 * t->mem_gb)); /* a tenth of each device for the cache and scratch */
            if (need > gpus) printf(": does not fit, --gpus %d would", need);
            printf("\n");
        }
    }
    for (int i = 0; i < 2; i++) {
        char what[64];
        snprintf(what, sizeof what, json ? "context_%d" : "decode at context %d", ctxs[i]);
        StepCost s = step_cost(&m, ctxs[i], 1);
        print_step(what, &s, &M, 6, c, json, i == 0);
    }
    print_serve(&m, &M, 1024, json);
    if (m.mtp) print_spec(&m, &M, 1024, json);
    else if (!json) printf("  --draft N: no MTP layer in this checkpoint\n");
    print_prefill(&m, &M, json);
    if (json) printf("}\n");
    if (glm52) glm52_free(&m);
    else model_free(&m);
    return 0;
}
