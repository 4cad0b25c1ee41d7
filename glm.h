/* glm.h - the model as data: config, weight matrices, layers, KV cache.
 *
 * Shared by model.c (the loader), glm.c (the forward pass, the reference), fast.c and
 * simd.c (the fast CPU path), glm_hip.hip (the GPU path), cli.c (the command line) and
 * the tools (tools/convert.c, tools/synth.c, tools/bench.c). Shapes are written as [rows, cols] with
 * y = W·x, i.e. rows = out features, cols = in features, as in the HF files.
 *
 * Names used in shape comments:
 *   H  hidden_size          NH  num_attention_heads   V   vocab_size
 *   QR q_lora_rank          KR  kv_lora_rank          DN  qk_nope_head_dim
 *   DR qk_rope_head_dim     DV  v_head_dim            IH  index_n_heads
 *   ID index_head_dim       E   n_routed_experts      FI  moe_intermediate_size
 *   FD intermediate_size (dense MLP)                  T   context length (--ctx)
 */
#ifndef GLM_H
#define GLM_H

#include <stddef.h>
#include <stdint.h>

#define GLM_MAX_LAYERS 512
#define GLM_MAX_EOS 8

/* ------------------------------------------------------------------------ */
/* Configuration: every field read from config.json (docs/MODEL.md §1). */

typedef struct {
    int vocab_size;          /* V: rows of embed_tokens and lm_head */
    int hidden;              /* H */
    int n_layers;            /* decoder layers 0..n_layers-1; the MTP layer (if any) is n_layers */
    int n_mtp;               /* num_nextn_predict_layers (0 or 1): the MTP layer, if the checkpoint has it */
    int n_heads;             /* NH */
    int q_lora_rank;         /* QR */
    int kv_lora_rank;        /* KR: the cached latent width */
    int qk_nope;             /* DN */
    int qk_rope;             /* DR: rotary dims, last of each q head, first of each indexer head */
    int v_head;              /* DV */
    int index_n_heads;       /* IH */
    int index_head_dim;      /* ID */
    int index_topk;          /* keys each query may attend to */
    int n_experts;           /* E */
    int n_active;            /* num_experts_per_tok */
    int n_shared;            /* n_shared_experts: shared expert width = n_shared * FI */
    int moe_inter;           /* FI */
    int dense_inter;         /* FD */
    int n_group, topk_group; /* group-limited routing */
    int norm_topk_prob;
    float routed_scale;      /* routed_scaling_factor (routed experts only) */
    float rms_eps;           /* rms_norm_eps: input/post/final norms */
    double rope_theta;       /* rope_parameters.rope_theta */
    int max_pos;             /* max_position_embeddings */
    int n_eos, eos[GLM_MAX_EOS];
    int index_share_mtp;     /* index_share_for_mtp_iteration: MTP draft steps >= 1 reuse step 0's top-k (§5.2) */
    uint8_t dense[GLM_MAX_LAYERS];        /* 1 = dense MLP layer, 0 = MoE */
    uint8_t full_index[GLM_MAX_LAYERS];   /* 1 = layer runs its own indexer ("full"), 0 = "shared" */
} Config;

/* ------------------------------------------------------------------------ */
/* A weight matrix in its file format, used in place from the mmap'd shard. */

typedef enum { WF_F32, WF_BF16, WF_FP8, WF_MXFP4 } WeightFormat;

typedef struct {
    WeightFormat fmt;
    int rows, cols;          /* logical [out, in] */
    const uint8_t *w;        /* F32 float[rows][cols] | BF16 uint16[rows][cols] |
                                FP8 E4M3FN byte[rows][cols] | MXFP4 byte[rows][cols/2], element 2i in the low nibble */
    const float *fp8_scale;  /* FP8: multipliers [ceil(rows/128)][ceil(cols/128)] (weight_scale_inv, copied to fp32) */
    const uint8_t *mx_scale; /* MXFP4: E8M0 exponents [rows][cols/32], value 2^(s-127) */
    size_t bytes;            /* bytes read by one full pass over the matrix (weights + scales) */
} Mat;

/* One decoder layer. Matrices a layer does not have are left zeroed (rows == 0). */
typedef struct {
    int dense;               /* 1 = dense MLP (gate, up, down), 0 = MoE (router, experts) */
    float *input_norm;       /* [H] RMSNorm before attention */
    float *post_norm;        /* [H] RMSNorm before the MLP / MoE */
    /* MLA attention */
    Mat q_a;                 /* [QR, H] */
    float *q_a_norm;         /* [QR] */
    Mat q_b;                 /* [NH*(DN+DR), QR], per head: DN nope rows then DR rope rows */
    Mat kv_a;                /* [KR+DR, H]: latent c then the shared k_pe */
    float *kv_a_norm;        /* [KR] */
    Mat kv_b;                /* [NH*(DN+DV), KR], per head: DN rows of W_UK then DV rows of W_UV */
    Mat o;                   /* [H, NH*DV] */
    /* DSA lightning indexer (full layers only) */
    int has_indexer;
    Mat ix_wq_b;             /* [IH*ID, QR], per head: DR roped dims first */
    Mat ix_wk;               /* [ID, H] */
    float *ix_knorm_w;       /* [ID] LayerNorm weight */
    float *ix_knorm_b;       /* [ID] LayerNorm bias */
    Mat ix_weights;          /* [IH, H] per-head gate */
    int index_slot;          /* row of this layer in the indexer-key cache, -1 if shared */
    /* dense MLP (SwiGLU) */
    Mat gate, up, down;      /* [FD, H], [FD, H], [H, FD] */
    /* MoE */
    Mat router;              /* [E, H] */
    float *router_bias;      /* [E] e_score_correction_bias, selection only */
    Mat sh_gate, sh_up, sh_down;     /* shared expert: [n_shared*FI, H] x2, [H, n_shared*FI] */
    Mat *ex_gate, *ex_up, *ex_down;  /* [E] routed experts: [FI, H], [FI, H], [H, FI] */
} Layer;

/* One safetensors shard, mapped read-only. */
typedef struct {
    char *path;
    const uint8_t *map;      /* whole file: mmap'd, or read into memory with --no-mmap */
    size_t size;
    void *map_base;          /* what checkpoint_close unmaps: map, or the 2 MB page --no-mmap read it into */
    size_t map_len;          /* its length in bytes */
    const uint8_t *data;     /* start of the data section (8 + header length) */
    size_t data_size;
} Shard;

/* One tensor as described by a shard header. */
typedef struct {
    char *name;
    char dtype[16];          /* as written: BF16, F32, F8_E4M3, U8, ... */
    int ndim;
    int64_t shape[8];
    const uint8_t *data;     /* inside its shard's mapping */
    size_t nbytes;
    int shard;               /* index into Checkpoint.shards */
} TensorInfo;

typedef struct {
    char *dir;
    Shard *shards; int n_shards;
    TensorInfo *tensors; int n_tensors;
    int *table; int table_size;   /* open-addressing hash: name -> tensor index, -1 = empty */
} Checkpoint;

/* model.safetensors.index.json, checked: the distinct shard files in order of first
 * mention, and each weight_map entry as (tensor name, index into files). */
typedef struct {
    char **files; int n_files;
    char **names; int *file_of; int n_names;
} ShardIndex;

/* The MTP (multi-token prediction) layer, model.layers.{n_layers} (docs/MODEL.md §2.3, §5):
 * from the main model's hidden state at t and the token at t+1 it predicts the token at
 * t+2. It has no embedding or lm_head of its own: it uses the main model's. */
typedef struct {
    float *enorm;            /* [H] RMSNorm of the next token's embedding */
    float *hnorm;            /* [H] RMSNorm of the main model's (final-normed) hidden state */
    Mat eh_proj;             /* [H, 2H]: input columns 0..H-1 the embedding branch, H..2H-1 the hidden branch */
    float *head_norm;        /* [H] shared_head.norm: RMSNorm before the main model's lm_head */
    Layer layer;             /* a MoE decoder layer with its own indexer (index_slot n_index_layers) */
    size_t bytes;            /* its matrices and vectors (not in Model.weight_bytes) */
} Mtp;

typedef struct {
    Config cfg;
    Checkpoint ck;
    Mat embed;               /* [V, H] */
    float *final_norm;       /* [H] */
    Mat lm_head;             /* [V, H] */
    Layer *layers;           /* [n_layers] */
    Mtp *mtp;                /* the MTP layer, NULL if the checkpoint has none (§5: optional) */
    int n_index_layers;      /* how many main layers own an indexer-key cache */
    size_t weight_bytes;     /* all matrices and vectors used by the main forward */
} Model;

/* KV cache: what each token leaves behind for later tokens (docs/MODEL.md §4.1). The
 * MTP layer, if the model has one, has its own rows after the main layers': latent row
 * n_layers and indexer-key slot n_index_layers. */
typedef struct {
    int ctx;                 /* T: capacity in tokens */
    int pos;                 /* tokens cached so far (main layers) */
    int mtp_pos;             /* MTP-layer rows cached so far (row t pairs h_t with token t+1, §5.1) */
    float *latent;           /* [n_layers (+1 MTP)][T][KR+DR]: post-norm latent c, then roped k_pe */
    float *index_k;          /* [n_index_layers (+1 MTP)][T][ID]: post-LayerNorm, roped indexer keys */
} KVCache;

/* ------------------------------------------------------------------------ */
/* model.c: utilities, number formats, the loader (used by the program and the tools) */

/* One line "glm: error: ..." on stderr, then exit(1). Before exiting it removes the
 * file registered with glm_fatal_unlink (a half-written output) and calls
 * glm_fatal_cleanup (if set), e.g. to remove a converter's temporary files. */
void glm_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
extern void (*glm_fatal_cleanup)(void);
void glm_fatal_unlink(const char *path);                         /* NULL: nothing to remove */
void *xmalloc(size_t n);                                         /* malloc or glm_fatal */
void *xcalloc(size_t n, size_t size);
char *xstrdup(const char *s);
char *path_join(const char *dir, const char *name);              /* "dir/name", malloc'd */
double now_s(void);                                              /* monotonic seconds */
void progress(const char *what, size_t done, size_t total, double t0); /* bar on a tty stderr */
extern int g_no_mmap;    /* --no-mmap: shards read into memory on 2 MB pages instead of mapped */
void checkpoint_open(Checkpoint *ck, const char *dir);
void checkpoint_close(Checkpoint *ck);
const TensorInfo *checkpoint_find(const Checkpoint *ck, const char *name);
void config_load(Config *c, const char *dir);
int is_eos(const Config *c, int id);     /* id is one of config.json's eos_token_id */
/* The loader's checks as pure functions (the CLI wrappers above call them; so do the
 * fuzz targets in fuzz/). Each returns 0, or -1 with a one-line message in err[errlen]
 * (what the CLI prints after "glm: error: "), having freed what it allocated.
 *   safetensors_parse_header: file[0..size) is a whole .safetensors file; on success
 *     *tensors (malloc'd, names malloc'd, data pointing into file) holds *n tensors.
 *   checkpoint_add_shard: the same, appended to ck as a shard that then owns map
 *     (checkpoint_close munmaps it); ck is unchanged on failure.
 *   checkpoint_build_table: the name table; a tensor name twice is an error.
 *   shard_index_parse / shard_index_check: the index's weight_map; every name it
 *     lists must be in the shard it names (after checkpoint_build_table).
 *   config_parse: config.json text; c is usable only on success. */
int safetensors_parse_header(const uint8_t *file, size_t size, const char *path,
                             TensorInfo **tensors, int *n, char *err, size_t errlen);
int checkpoint_add_shard(Checkpoint *ck, const char *path, const uint8_t *map, size_t size, char *err, size_t errlen);
int checkpoint_build_table(Checkpoint *ck, char *err, size_t errlen);
int shard_index_parse(ShardIndex *ix, const char *text, size_t len, const char *path, char *err, size_t errlen);
int shard_index_check(const Checkpoint *ck, const ShardIndex *ix, const char *path, char *err, size_t errlen);
void shard_index_free(ShardIndex *ix);
int config_parse(Config *c, const char *text, size_t len, const char *path, char *err, size_t errlen);
void model_load(Model *m, const char *dir);
void model_free(Model *m);
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float f);
extern const float e2m1_value[16];
float e8m0_to_f32(uint8_t s);
float fp8_e4m3_to_f32(uint8_t b);
extern float e8m0_table[256], fp8_table[256];   /* filled by number_tables_init() */
void number_tables_init(void);
void mat_dequant_row(const Mat *W, int r, float *out);   /* row r of W as fp32, plain C */

/* ------------------------------------------------------------------------ */
/* glm.c: the forward pass, the reference                                   */

/* The activations of one chunk of up to `cap` prompt tokens (one token when decoding);
 * allocated once (runstate_init), reused for every step. */
typedef struct {
    int cap;                 /* tokens per chunk */
    float *x;                /* [cap][H] residual stream */
    float *a;                /* [cap][H] normalised input of attention / MLP */
    float *cq;               /* [cap][QR] normalised q latent (also the indexer's query input) */
    float *q;                /* [cap][NH*(DN+DR)] per head: q_nope then the roped q_pe */
    float *ckv;              /* [cap][KR+DR] latent c and k_pe before their norm / rotation */
    float *q_abs;            /* [cap][NH][KR+DR] absorbed query: W_UKᵀ·q_nope, then q_pe */
    float *o_lat;            /* [cap][NH][KR] attention output in latent space */
    float *o_heads;          /* [cap][NH*DV] */
    float *out;              /* [cap][H] output of attention / MLP before the residual add */
    float *eh;               /* [cap][2H] the MTP layer's input, [RMSNorm(embedding) ; RMSNorm(h)] (NULL without MTP) */
    float *scores;           /* [threads][T] one thread's indexer or attention scores */
    float *ix_q;             /* [cap][IH*ID] */
    float *ix_k;             /* [cap][ID] */
    float *ix_w;             /* [cap][IH] */
    int *sel;                /* [cap][topk] key positions each token may attend to */
    int *n_sel;              /* [cap] */
    float *router;           /* [cap][E] */
    int *ex_idx;             /* [cap][n_active] chosen experts */
    float *ex_w;             /* [cap][n_active] their mixing weights */
    int *ex_tokens;          /* [cap] (token, slot) pairs routed to the expert being run */
    float *ex_x;             /* [cap][H] gathered inputs of one expert */
    float *ex_y;             /* [max(cap, n_active+1)][H] its outputs */
    float *h1, *h2;          /* [max(cap, n_active+1)][max(FD, n_shared*FI, FI)] SwiGLU hidden */
    float *logits;           /* [V] the last token's logits (bench scratch) */
} RunState;

/* One product of a chunk, y[n][W.rows] = x[n][W.cols] · Wᵀ (a row of W per output). */
typedef struct { float *y; const float *x; const Mat *W; } Product;

/* The heavy ops forward() calls, chosen once at start. glm.c fills the table with its
 * plain functions (the reference); fast.c's fast_init replaces entries with the fast
 * CPU path's. Every entry computes what the reference computes, up to summation order
 * (and bf16 rounding of activations where the fast path uses bf16 products). */
typedef struct {
    const char *name;        /* "plain C", or the fast path's kernel set */
    const char *precision;   /* "fp32" or "bf16": the activations of the weight products */
    /* y = x · Wᵀ for n tokens */
    void (*matmul)(float *y, const float *x, const Mat *W, int n);
    /* several independent products of one chunk (a layer's projections of one input) */
    void (*matmul_group)(const Product *p, int np, int n);
    /* the DSA indexer's score of n_keys cached keys [n_keys][ID] for one query token:
     * q [IH][ID] (roped), w [IH] (head gates) */
    void (*index_scores)(const Config *c, const float *q, const float *w, const float *keys, int n_keys, float *score);
    /* absorbed MLA (§4.2) in three steps: the absorb s->q -> s->q_abs for n rows; the
     * attention of n tokens at positions pos0.. over their selected keys (s->sel) in
     * latent row `layer` of the cache, s->q_abs -> s->o_lat; the un-absorb s->o_lat ->
     * s->o_heads for n rows */
    void (*mla_absorb)(const Config *c, const Layer *L, RunState *s, int n);
    void (*mla_attend)(const Model *m, const Layer *L, const KVCache *kv, RunState *s, int layer, int n, int pos0);
    void (*mla_unabsorb)(const Config *c, const Layer *L, RunState *s, int n);
    /* the shared and the routed experts of a MoE layer, routing done (s->ex_idx, s->ex_w) */
    void (*moe_experts)(const Model *m, const Layer *L, RunState *s, const float *x, float *y, int n);
    /* scratch for chunks of cap tokens and contexts of ctx (may be NULL) */
    void (*prepare)(const Config *c, int cap, int ctx);
    void (*release)(void);
    /* Set by glm serve while it runs a prompt's rows through the layers: every row's
     * arithmetic is then the same in a chunk of any length and start, so that the prefix
     * cache can hand out any whole block of a prompt. (The fast path otherwise picks its
     * kernels by the number of rows; the reference computes each row alone anyway.) */
    int prompt_rows;
} Ops;
extern Ops ops;

/* The reference ops (what `ops` holds unless fast_init replaced them), for the fast path
 * to fall back on where its kernels do not apply. */
void matmul(float *y, const float *x, const Mat *W, int n);
void matmul_group(const Product *p, int np, int n);
void index_scores(const Config *c, const float *q, const float *w, const float *keys, int n_keys, float *score);
void mla_absorb(const Config *c, const Layer *L, RunState *s, int n);
void mla_attend_absorbed(const Model *m, const Layer *L, const KVCache *kv, RunState *s, int layer, int n, int pos0);
void mla_unabsorb(const Config *c, const Layer *L, RunState *s, int n);
void moe_experts(const Model *m, const Layer *L, RunState *s, const float *x, float *y, int n);
/* moe_experts' steps around one routed expert's products (the fast path's prompt rows
 * run their own products between them): its tokens' rows of x -> s->ex_x (returns how
 * many), and their outputs s->ex_y, weighted, added to their rows of y */
int expert_gather(const Config *c, RunState *s, const float *x, int n, int e);
void expert_scatter(const Config *c, const RunState *s, float *y, int cnt);
void softmax(float *x, int n);
/* h_gate = SiLU(h_gate) ⊙ h_up for n rows of width F (the SwiGLU activation) */
void swiglu_act(float *h_gate, const float *h_up, int n, int F);
/* y = down · swiglu_act(gate · x, up · x) for n tokens through ops (h1, h2: [n][gate.rows] scratch) */
void swiglu(float *y, const float *x, const Mat *gate, const Mat *up, const Mat *down, float *h1, float *h2, int n);
/* RoPE (§3.2): cs[2i], cs[2i+1] = cos, sin of pos·theta^(-2i/dims), i < dims/2 (the GPU
 * path builds its table of positions from it) */
void rope_angles(float *cs, int dims, int pos, double theta);
int thread_id(void);      /* this thread's index in the one active OpenMP team (0 outside) */

#define PREFILL_CHUNK 2048  /* tokens of a prompt run together: see runstate_init */
void runstate_init(RunState *s, const Config *c, int cap, int ctx);
void runstate_free(RunState *s);
void kvcache_init(KVCache *kv, const Model *m, int ctx);
void kvcache_free(KVCache *kv);
size_t kvcache_bytes(const Model *m, int ctx);
/* Runs tokens[0..n) at positions kv->pos.. and appends them to the cache. Writes
 * logits [n][V] if all_logits, else only the last token's [V] (logits may be NULL). */
void forward(const Model *m, KVCache *kv, RunState *s, const int *tokens, int n, float *logits, int all_logits);
/* One sequence's part of a forward_batch: n >= 1 tokens appended to its cache at kv->pos. */
typedef struct {
    KVCache *kv;
    const int *tokens;
    int n;
    int all_logits;          /* logits for every one of its rows (a verify step of --draft), else its last row's */
    float *hidden;           /* [n][H] its rows' final-normed hidden states (the MTP layer's h_t), or NULL */
} SeqTokens;
/* forward() for n_seq sequences at once (glm serve's continuous batching): all their
 * tokens together are one chunk (at most s->cap rows), each sequence attends over its
 * own cache, and logits gets, in sequence order, every row of a sequence with all_logits
 * and the last row of the others ([rows][V]). A row's arithmetic does not depend on the
 * rows beside it. */
void forward_batch(const Model *m, RunState *s, const SeqTokens *seq, int n_seq, float *logits);
/* forward() that also writes hidden [n][H] (if not NULL): each token's final-normed
 * hidden state, the lm_head's input and the MTP layer's h_t (§5.1) */
void forward_hidden(const Model *m, KVCache *kv, RunState *s, const int *tokens, int n, float *logits, int all_logits,
                    float *hidden);
/* The MTP layer (§5.1, m->mtp required) at its positions t = kv->mtp_pos.. for n rows:
 * row i pairs the main model's hidden[i] (its h_t) with next[i] (the token at t+1) and
 * predicts the token at t+2. Appends the rows to the MTP layer's cache; writes logits
 * [n][V] if all_logits, else only the last row's [V] (logits may be NULL). */
void mtp_forward(const Model *m, KVCache *kv, RunState *s, const float *hidden, const int *next, int n, float *logits,
                 int all_logits);
/* The MTP layer's selection at draft step 0, kept for the steps after it
 * (index_share_for_mtp_iteration, §5.2). */
typedef struct {
    int *sel;                /* [index_topk] the MTP-cache rows step 0's query attended to */
    int n_sel;
    int pos;                 /* step 0's row: the rows after it were appended by later draft steps */
} MtpSelection;
/* mtp_forward that also writes out_hidden [H] (if not NULL): the last row's
 * shared_head.norm output, the lm_head's input, which the next draft step recycles as
 * its h; and keep (if not NULL): the last row's selection. */
void mtp_forward_hidden(const Model *m, KVCache *kv, RunState *s, const float *hidden, const int *next, int n,
                        float *logits, int all_logits, float *out_hidden, MtpSelection *keep);
/* One draft step >= 1 (one row at kv->mtp_pos) that runs no indexer: it attends to the
 * rows appended since step 0 (its own included) and to step 0's selection, newest rows
 * first, at most index_topk in all. logits [V], out_hidden [H] as mtp_forward_hidden. */
void mtp_draft_shared(const Model *m, KVCache *kv, RunState *s, const float *h, int next, float *logits, float *out_hidden,
                      const MtpSelection *step0);
/* What forward() reads and computes, for the speed reports (not measured: counted
 * from the shapes): the weight and cache bytes one decoded token reads at cache
 * position pos, and the FLOPs (2 per multiply-add) of n tokens at positions pos0..
 * with n_logits rows of logits. */
double decode_bytes(const Model *m, int pos);
double forward_flops(const Model *m, int n, int pos0, int n_logits);

typedef struct {
    float temperature;       /* 0 = greedy */
    float top_p;             /* nucleus size, 1 = off */
    uint64_t rng;            /* xorshift64* state */
    int *order;              /* [V] scratch for top-p */
} Sampler;
void sampler_init(Sampler *sp, float temperature, float top_p, uint64_t seed, int vocab);
void sampler_free(Sampler *sp);
float random_f32(Sampler *sp);                 /* uniform in [0, 1) */
int argmax(const float *x, int n);
float log_sum_exp(const float *x, int n);       /* log Σ exp(x): a log-probability is a logit minus it */
int sample(Sampler *sp, float *logits, int V); /* logits are overwritten with probabilities */
/* What sample() draws from, whole (temperature > 0): logits[V] become probabilities,
 * the top_p nucleus renormalised and zero outside it. */
void sampler_probs(Sampler *sp, float *logits, int V);
/* A draw from weights w[V] >= 0 (not necessarily normalised), one random number. */
int sample_weights(Sampler *sp, const float *w, int V);

typedef struct GpuModel GpuModel;
/* Everything a generation holds: the model, its cache, the activations, and with --gpu
 * the devices' copy, where forward and sampling then run. */
typedef struct {
    Model model;
    KVCache kv;
    RunState state;
    GpuModel *gpu;           /* NULL: the CPU */
    const float *gpu_logits; /* the host copy of the device's last logits (session_sample) */
} Session;
void session_open(Session *S, const char *dir, int ctx, int n_gpus);
/* session_open for a caller that runs the MTP layer: fatal (the only line printed) if
 * the checkpoint has none (with n_gpus the MTP layer runs on the last device) */
void session_open_mtp(Session *S, const char *dir, int ctx, int n_gpus);
void session_close(Session *S);
/* forward() on kv (S->kv unless a second cache), on the GPU when there is one */
void session_forward(Session *S, KVCache *kv, const int *tokens, int n, float *logits, int all_logits);
int session_sample(Session *S, Sampler *sp, float *logits);
/* glm logits --mtp (a session_open_mtp session): the main model runs ids[0..n) (n >= 2)
 * from an empty cache, then the MTP layer pairs h_i with ids[i+1]: logits [n-1][V], row
 * i the MTP layer's prediction of ids[i+2]. one_at_a_time: both one token per step
 * (decode, the MTP row as soon as its token is known), else one prefill each. */
void session_mtp_logits(Session *S, const int *ids, int n, float *logits, int one_at_a_time);
/* spec.c's steps on kv (S->kv, or a glm serve slot's), on the GPU when there is one
 * (positions stay the host's: kv->pos and kv->mtp_pos; a rollback is setting them). session_forward_hidden is
 * forward_hidden; session_mtp_forward_hidden is mtp_forward_hidden; session_mtp_draft_shared
 * is mtp_draft_shared. Each leaves the last logits on the device for session_sample only
 * when it is the main model's single-row pass. */
void session_forward_hidden(Session *S, KVCache *kv, const int *tokens, int n, float *logits, int all_logits, float *hidden);
void session_mtp_forward_hidden(Session *S, KVCache *kv, const float *hidden, const int *next, int n, float *logits,
                                int all_logits, float *out_hidden, MtpSelection *keep);
void session_mtp_draft_shared(Session *S, KVCache *kv, const float *h, int next, float *logits, float *out_hidden,
                              const MtpSelection *step0);

/* GPU forward pass (glm_hip.hip; linked only into the GLM_GPU builds: make hip | cuda | emu).
 * gpu_load prints the plan (layers and bytes per device), stops if it does not fit,
 * then uploads the weights; the KV cache lives on the devices. gpu_forward mirrors
 * glm.c's forward() for tokens at positions pos.. (the caller's kv->pos); the last
 * token's logits stay on the device for gpu_sample, which draws with u uniform in
 * [0, 1) from the CPU's generator. */
GpuModel *gpu_load(const Model *m, int n_gpus, int ctx);
/* gpu_load with `slots` sequences' worth of cache rows in every layer (glm serve
 * --parallel; the MTP layer keeps one): gpu_use_slot picks the one the one-sequence
 * calls below use, gpu_forward_rows runs one token of several at once. */
GpuModel *gpu_load_slots(const Model *m, int n_gpus, int ctx, int slots);
void gpu_use_slot(GpuModel *g, int slot);
/* A decode step of n <= 8 sequences: tokens[i] at pos[i] in cache slot slot[i]; logits
 * [n][V] (NULL: they stay on the device, for gpu_argmax_rows). Each row's logits are bit
 * for bit those of its own gpu_forward. */
#define GPU_BATCH_MAX 8 /* the most rows of a gpu_forward_rows (glm_hip.hip GEMV_MAXN) */
void gpu_forward_rows(GpuModel *g, const int *slot, const int *pos, const int *tokens, int n, float *logits);
void gpu_forward(GpuModel *g, int pos, const int *tokens, int n, float *logits, int all_logits);
/* gpu_forward that also writes hidden [n][H] (host, if not NULL): each token's
 * final-normed hidden state, the MTP layer's h_t (as forward_hidden). */
void gpu_forward_hidden(GpuModel *g, int pos, const int *tokens, int n, float *logits, int all_logits, float *hidden);
/* The MTP layer (gpu_load put it on the last device when m->mtp is set) at its rows
 * mtp_pos.. (the caller's kv->mtp_pos) for n rows, as mtp_forward_hidden without `keep`:
 * row i pairs hidden[i] (host [n][H], from gpu_forward_hidden) with next[i]; logits
 * [n][V] if all_logits, else the last row's [V] (logits may be NULL); out_hidden [H]
 * (if not NULL) the last row's shared_head.norm output. The last row's logits stay on
 * the device in place of the main model's: gpu_sample would draw from them. */
void gpu_mtp_forward(GpuModel *g, int mtp_pos, const float *hidden, const int *next, int n, float *logits, int all_logits,
                     float *out_hidden);
/* gpu_mtp_forward that also writes keep (if not NULL): the last row's selection, its pos
 * mtp_pos + n - 1 (as mtp_forward_hidden's keep). */
void gpu_mtp_forward_keep(GpuModel *g, int mtp_pos, const float *hidden, const int *next, int n, float *logits,
                          int all_logits, float *out_hidden, MtpSelection *keep);
/* glm.c mtp_draft_shared on the device: one MTP row at mtp_pos that runs no indexer and
 * attends to the MTP-cache rows sel[0..n_sel) (the host's mtp_shared_selection);
 * logits [V] (may be NULL) and out_hidden [H] as gpu_mtp_forward. */
void gpu_mtp_draft_shared(GpuModel *g, int mtp_pos, const float *h, int next, float *logits, float *out_hidden,
                          const int *sel, int n_sel);
int gpu_sample(GpuModel *g, float temperature, float top_p, float u);
/* The greedy token (gpu_sample at temperature 0) of each of the latest forward's n rows
 * (gpu_forward_rows, or gpu_forward_hidden's last row), with n ints copied back rather
 * than the rows' logits: glm serve's greedy decodes call the forward with logits NULL. */
void gpu_argmax_rows(GpuModel *g, int n, int *tokens);
/* Whether the GPU runs a decode step's MLP of layer L through its fused kernels
 * (glm_hip.hip's mlp_decode: two launches for one token, k_mlp_gate_up / k_mlp_down): its matrices in one of the format pairs those kernels are
 * built for (routed experts, shared expert or dense MLP: BF16/BF16, FP8/FP8, MXFP4/MXFP4,
 * FP8/BF16, MXFP4/BF16), rows in whole 16-byte chunks, at most one shared expert. *ef and
 * *sf (if not NULL) get the two formats. glm plan counts launches with it. */
/* A row of `cols` values in format fmt is whole 16-byte chunks the fast GPU products read. */
static inline int gpu_chunks_ok(int fmt, int cols) {
    return (fmt == WF_BF16 && cols % 8 == 0) || (fmt == WF_FP8 && cols % 16 == 0) || fmt == WF_MXFP4;
}
static inline int gpu_mat_chunks_ok(const Mat *W) { return gpu_chunks_ok(W->fmt, W->cols); }
static inline int gpu_mlp_fused(const Config *c, const Layer *L, int *ef, int *sf) {
    int e, s;
    const Mat *m3[3] = {L->dense ? &L->gate : &L->sh_gate, L->dense ? &L->up : &L->sh_up, L->dense ? &L->down : &L->sh_down};
    if (L->dense || c->n_shared == 1) {
        s = m3[0]->fmt;
        for (int i = 0; i < 3; i++) if ((int)m3[i]->fmt != s || !gpu_mat_chunks_ok(m3[i])) return 0;
    } else if (c->n_shared == 0) s = -1;
    else return 0;
    if (L->dense) e = s;
    else {
        e = L->ex_gate[0].fmt;
        for (int x = 0; x < c->n_experts; x++) {
            const Mat *ex[3] = {&L->ex_gate[x], &L->ex_up[x], &L->ex_down[x]};
            for (int i = 0; i < 3; i++) if ((int)ex[i]->fmt != e || !gpu_mat_chunks_ok(ex[i])) return 0;
        }
        if (s < 0) s = e;
    }
    if (!(e == s || (s == WF_BF16 && (e == WF_FP8 || e == WF_MXFP4)))) return 0;
    if (ef) *ef = e;
    if (sf) *sf = s;
    return 1;
}
/* Kernel launches so far (GLM_GPU_LAUNCHES=1: gpu_free prints the count; glm plan's
 * launches per token are checked against it) */
long gpu_launch_count(void);
void gpu_free(GpuModel *g);

/* ------------------------------------------------------------------------ */
/* spec.c: speculative decoding with the MTP layer (glm run / chat --draft N, §5.2) */

#define GLM_MAX_DRAFT 16     /* --draft N: at most this many drafts per step */

/* One generation's drafting state. With n_draft 0 its functions are plain prefill and
 * decode through session_forward / session_sample (the GPU included). Positions: the
 * main cache holds t < kv->pos; the MTP layer's holds rows t < kv->mtp_pos; the main
 * model's hidden states h_t of mtp_pos <= t < mtp_pos + n_pend wait in pend for their
 * MTP rows (row t pairs h_t with tok[t+1], known by then). */
typedef struct {
    KVCache *kv;             /* the cache it drives and rolls back (a Session's, or a glm serve slot's) */
    size_t H, V;             /* hidden width, vocabulary */
    int n_draft;             /* N: MTP drafts per verify step; 0 = plain decoding */
    int *tok;                /* [ctx + 1] the token at each position (the not yet cached one at kv->pos) */
    float *pend;             /* [cap + N + 2][H] main hidden states not yet paired in the MTP cache */
    int n_pend;
    float *g;                /* [H] the MTP layer's last output hidden, recycled by the next draft step */
    float *vlogits;          /* [N + 1][V] the verify pass's logits */
    float *q;                /* [N][V] each draft's MTP logits, then (temperature > 0) its distribution */
    float *w;                /* [V] scratch: the residual distribution of a rejection */
    float *raw;              /* [V] scratch: a verify row's logits, kept for its log-probabilities */
    int draft[GLM_MAX_DRAFT];
    MtpSelection step0;      /* for draft steps >= 1 (index_share_for_mtp_iteration) */
    int *oracle, n_oracle;   /* GLM_DRAFT_ORACLE (a test hook): the draft for position p is oracle[p] */
    long steps, drafted, accepted; /* verify steps, drafts proposed, drafts accepted */
} Speculator;
/* asked: --draft N, or -1 for this backend's default (spec.c: SPEC_DEFAULT_*). Drafts
 * need the MTP layer (with --gpu it runs on the last device, through the session_*
 * entries); asked for without one, one stderr line says why and decoding goes on
 * without drafts. */
void spec_open(Speculator *sp, Session *S, KVCache *kv, int asked);
void spec_close(Speculator *sp);
/* Runs ids[kv->pos..n) (kv->pos: the prefix the caller kept cached, ids[0..kv->pos) in
 * it) and writes the last token's logits [V]; with drafts it also fills the MTP layer's
 * rows, and may rerun a few kept tokens whose hidden states it no longer has. */
void spec_prefill(Speculator *sp, Session *S, const int *ids, int n, float *logits);
/* One decoding step after token x (sampled, not yet cached): caches x and produces 1 to
 * N + 1 (at most max_new) next tokens into out, returning how many; every token but the
 * last of them is then cached too. logits: [V] scratch. */
int spec_step(Speculator *sp, Session *S, Sampler *smp, int x, int max_new, float *logits, int *out);
/* spec_step in two halves around the verify pass, for a caller that batches the verify
 * passes of several sequences (glm serve): spec_draft caches x's MTP rows, drafts and
 * returns N (0..n_draft) with seq[0..N] = x, d_1 .. d_N; the caller runs the main model
 * over seq (all N + 1 rows' logits into vlogits [N + 1][V], their hidden states into
 * sp->pend); spec_accept then writes the 1 .. N + 1 tokens it keeps into out (and, if
 * logprob is not NULL, their log-probabilities under the model; vlogits is overwritten)
 * and rolls the caches back. */
int spec_draft(Speculator *sp, Session *S, Sampler *smp, int x, int max_new, int *seq);
int spec_accept(Speculator *sp, Sampler *smp, int N, float *vlogits, int *out, float *logprob);
/* A prompt in chunks run by the caller (glm serve): the chunk's B hidden states go to
 * spec_pending_end(sp) (room for s->cap rows), then spec_prompt_chunk gives every row but
 * the last its MTP row. spec_resume starts a sequence whose first pos tokens of ids[0..n)
 * came from a cache with their MTP rows up to pos - 2 and h_last = h_{pos-1}. */
float *spec_pending_end(Speculator *sp);
void spec_prompt_chunk(Speculator *sp, Session *S, int B);
void spec_resume(Speculator *sp, const int *ids, int n, int pos, const float *h_last);
/* The caller stopped early: only positions < pos stay cached (pos <= kv->pos). */
void spec_truncate(Speculator *sp, KVCache *kv, int pos);

/* ------------------------------------------------------------------------ */
/* fast.c + simd.c: the fast CPU path                                       */

/* Up to this many rows in a chunk (and fewer than 8 of one sequence, whose attention
 * then runs row by row), the fast path computes every row's products as it would a lone
 * token's: glm serve keeps its decode batches within it (batch invariance). */
#define MATVEC_MAX_TOKENS 16

/* fast_init: once at start, picks the SIMD kernel set (want "c": none, the plain
 * reference end to end; "avx2": the AVX2 set) and fills `ops` with the fast path's
 * entries; bf16: weight products with activations rounded to bf16 where the CPU has
 * AVX512-BF16 (0: fp32 products; -1: bf16 where vdpbf16ps is the faster, see
 * kernels.bf16_speedup). */
void fast_init(const char *want, int bf16);

/* One stretch of memory for glm bench's streaming read: p 64-byte aligned, n a multiple
 * of 256. The threads take the runs in turn as they free up, as decode takes its rows. */
typedef struct {
    const uint8_t *p;
    size_t n;
} ReadRun;

/* SIMD kernels (simd.c), the fast path's building blocks, chosen by kernels_init; a NULL
 * entry means the CPU has none (the fast path then uses its plain loop or glm.c's op).
 * tests/kernels_test.c checks each against a plain loop. */
typedef struct {
    const char *name;
    /* y[i] = W[r0+i]·x for i < nr; x_split: x as matvec_split_x orders it for W */
    void (*matvec)(const Mat *W, int r0, int nr, const float *x, const float *x_split, float *y);
    /* the same with x rounded to bf16 (vdpbf16ps); xs = x as matvec_order_bf16 lays it out;
     * not for F32; FP8 subnormals count as zero */
    void (*matvec_bf16)(const Mat *W, int r0, int nr, const float *xs, float *y);
    /* the same for n tokens: y[t*ldy + i] = W[r0+i]·x_t, x_t = xb + t*ldx, matvec_order_bf16's
     * layout rounded to bf16 (round_bf16) and zero to cols rounded up to 128. Token t's sums
     * are bit for bit matvec_bf16's for x_t alone, whatever n is (glm serve's batches). */
    void (*matvec_bf16_n)(const Mat *W, int r0, int nr, const uint16_t *xb, size_t ldx, int n, float *y, size_t ldy);
    /* matvec for n tokens: y[t*ldy + i] = W[r0+i]·x_t, x_t = x + t*ldx split as xs + t*ldxs.
     * Each row is decoded once for all n, and token t's sums are bit for bit matvec's for
     * x_t alone, whatever n is (where the CPU has no matvec_bf16_n: AVX2). */
    void (*matvec_n)(const Mat *W, int r0, int nr, const float *x, size_t ldx, const float *xs, size_t ldxs, int n, float *y, size_t ldy);
    /* the same with the tokens' x as pack_tokens_x lays them out (AVX-512) */
    void (*matvec_n_packed)(const Mat *W, int r0, int nr, const float *xp, int n, float *y, size_t ldy);
    void (*dequant_row)(const Mat *W, int r, float *out);
    /* Y[t*ldy + j] += Σ_k P[k*ldp + j]·X[t*ldx + k], j < nj <= 32, t < n, k < K: the prefill
     * product against a panel of 32 dequantized rows stored k-major (ldp = 32), also used
     * on any k-major block (W_UK, cached latent rows) in place */
    void (*gemm_panel)(const float *P, int ldp, int K, const float *X, int ldx, int n, float *Y, int ldy, int nj);
    /* the same with bf16 inputs, P as pairs [K/2][32][2], K even (the default prefill; not with --fp32) */
    void (*gemm_panel_bf16)(const uint16_t *P, int K, const uint16_t *X, int ldx, int n, float *Y, int ldy, int nj);
    /* P[k*32 + j] = rows[j*ld + k], j < 32, k < K rounded down to 16: build a panel */
    void (*pack_panel)(const float *rows, int ld, int K, float *P);
    /* one k-chunk of a panel for gemm_panel_bf16: P[p*32 + j] = bf16 pair (W[r+j][k0+2p],
     * W[r+j][k0+2p+1]), p < kc/2, j < 32, zero past nj rows and past the matrix;
     * k0 and kc multiples of 32; stage: [32][kc/2] words of scratch */
    void (*build_panel_bf16)(const Mat *W, int r, int nj, int k0, int kc, uint32_t *stage, uint32_t *panel);
    /* y[t*ldy + i] = Σ_k bf16(W[r0+i][k])·X[t*ldx + k], i < nr, t < n, X bf16 zero-padded to
     * cols rounded up to 32: the bf16 product for few tokens, no panel; wbuf: [4][that] */
    void (*gemm_rows_bf16)(const Mat *W, int r0, int nr, const uint16_t *X, int ldx, int n, float *Y, int ldy, uint16_t *wbuf);
    /* P[p*32 + j] = bf16 pair (A[row(2p)*lda + j], A[row(2p+1)*lda + j]), row(k) = idx ? idx[k] : k,
     * p < ceil(K/2), j < 32; zero for j >= nj and for the row past an odd K: a panel for
     * gemm_panel_bf16 whose k runs down the rows of A (W_UK, cached latent rows) */
    void (*pack_pairs_bf16)(const uint16_t *A, int lda, const int *idx, int K, int nj, uint32_t *P);
    /* xb[0..kpad) = bf16(x[0..n)) rounded to nearest even, then zeros */
    void (*round_bf16)(const float *x, int n, uint16_t *xb, int kpad);
    /* y[j] = Σ_i x[i]·W[r0+i][j], i < nr, j < cols: x times a block of W's rows, for one
     * token's MLA absorb (q_abs = W_UKᵀ·q_nope); BF16 rows only */
    void (*matvec_transposed_bf16)(const Mat *W, int r0, int nr, const float *x, float *y);
    float (*dot)(const float *a, const float *b, int n);
    void (*softmax)(float *x, int n);                         /* x = softmax(x), in place */
    /* out[j] = Σ_h wh[h]·max(d[j*32 + h]·q_scale, 0), h < 32, j < n: the indexer's score of n
     * keys from their 32 heads' dot products (wh zero past the real heads) */
    void (*index_relu_sums)(const float *d, int n, const float *wh, float q_scale, float *out);
    void (*axpy)(float *y, float a, const float *x, int n);   /* y += a·x */
    /* machine measurements for glm bench (never NULL) */
    double (*read_bandwidth)(const ReadRun *runs, int n_runs); /* bytes/s, all threads */
    double (*fma_peak)(void);                                  /* fp32 FLOP/s, all threads */
    double (*bf16_speedup)(void); /* vdpbf16ps FLOP/s over fp32 FMA FLOP/s on one core, measured once (NULL: no bf16 products) */
} Kernels;
extern Kernels kernels;
/* x prepared the way the fp32 SIMD matvec reads it for W's format (MXFP4, and BF16's
 * whole 32-blocks: each 32-block as its 16 even then 16 odd elements); untouched otherwise */
void matvec_split_x(const Mat *W, const float *x, float *xs);
/* n tokens' x (token t at x + (rows ? rows[t] : t)*ldx) as kernels.matvec_n_packed reads
 * them: groups of PACK_GROUP tokens, each [16-float vector][token][16] of matvec_split_x's
 * order, zero past cols; n * PACKED_X_FLOATS(cols) floats */
#define PACK_GROUP 8
#define PACKED_X_FLOATS(cols) ((size_t)((cols) + 15) / 16 * 16)
void pack_tokens_x(const Mat *W, const float *x, size_t ldx, const int *rows, int n, float *xp);
/* xs[0 .. cols rounded up to 128) = x in the order matvec_bf16 reads it for W's format
 * (FP8: times 2^64), zeros past cols */
void matvec_order_bf16(const Mat *W, const float *x, float *xs);
void kernels_init(const char *want);   /* want "c" forces the plain loops, "avx2" the AVX2 set */

/* ------------------------------------------------------------------------ */
/* The tools, commands of the glm program (cli.c); argv[0] is the command name. */
int synth_main(int argc, char **argv);   /* tools/synth.c */
int serve_main(int argc, char **argv);   /* serve.c: glm serve */
int loadgen_main(int argc, char **argv); /* tools/loadgen.c: glm loadgen */
int plan_main(int argc, char **argv);    /* tools/plan.c: glm plan (a GPU decode projection) */
int convert_main(int argc, char **argv); /* tools/convert.c */
/* glm bench's settings (cli.c parses them; -t, --fp32 and --no-mmap are applied before) */
typedef struct {
    const char *model_dir;
    int prompt;              /* -P: tokens of the timed prefill */
    int long_ctx;            /* --long: the context of the second decode */
    int n_decode;            /* -n: tokens timed at each context */
    int json;                /* --json */
    int ctx, n_gpus;         /* --ctx (0: what the runs need), --gpu / --gpus */
} BenchArgs;
int bench_run(const BenchArgs *a);       /* tools/bench.c */

#endif
