/* spec.c - speculative decoding with the MTP layer (docs/MODEL.md §5.2): --draft N.
 *
 * A step after token x (sampled, not yet cached) at position P:
 *   1. the MTP layer catches up: its rows for the main model's hidden states it has not
 *      paired yet, the last one (h_{P-1}, x) giving the first draft's logits (step 0);
 *   2. N - 1 more draft steps, each the MTP layer again at the next row, on the draft
 *      token's embedding and the previous step's output hidden (after shared_head.norm,
 *      as SGLang does; the main model's h_t is its lm_head input too, §5.1);
 *   3. one main-model pass over [x, d_1 .. d_N] at P .. P+N: N + 1 rows of logits;
 *   4. the longest accepted prefix d_1 .. d_k, plus one token from the main model (the
 *      correction at the first rejection, or the next token after d_N);
 *   5. every cache rolls back to what was accepted: kv->pos = P + k + 1 (x, d_1 .. d_k);
 *      the MTP layer's to row P: its draft rows paired drafts' hiddens, not the main
 *      model's, so the next step's catch-up redoes rows P .. P + k from the verify pass's
 *      hidden states (as vLLM's proposer does). The MTP cache therefore always holds
 *      exactly what glm logits --mtp computes, whatever was drafted.
 * Rolling back is setting a position: attention and the indexer read only rows below it
 * (glm.c: index_select's `visible`), and rows past it are written again before any query
 * can see them. Each forward recomputes every RunState field it reads (s->sel comes from
 * layer 0, always "full", or from mtp_draft_shared), so nothing stale survives a rollback.
 *
 * Acceptance. Greedy: d_j is accepted while it is the main model's argmax, so the output
 * is what --draft 0 gives (up to the verify pass running N + 1 tokens as one chunk: the
 * chunk's products sum in another order than a single token's, ~1e-6 relative in fp32).
 * Temperature > 0: speculative sampling (Leviathan et al. 2023, Chen et al. 2023): with p
 * the target and q the draft distribution, both from sampler_probs (the temperature and
 * top-p transform sample() applies), d ~ q is accepted with probability min(1, p(d)/q(d));
 * on rejection the token is drawn from norm(max(p - q, 0)); after N acceptances from p.
 * Each token is then distributed exactly as sample() would draw it from the main model.
 */
#include "glm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The default --draft per backend. The rule: drafts pay when the expected tokens per step,
 * (1 - a^(N+1)) / (1 - a), exceed the step's cost in decode steps, r(N) + N·c, with r(N) and
 * c from glm bench (a pass over N + 1 tokens, and one MTP draft step, each over a decode
 * step), for the 0.6-0.85 acceptance one MTP head typically gets (docs/MODEL.md §5.2).
 * CPU, measured on a 2-vCPU VM (Intel Xeon; bf16 products; glm bench, median of 3
 * runs): the verify pass costs r(1..3) = 1.42, 1.72, 1.99 decode steps on an 8-layer model
 * (glm synth --layers 8 --experts 64 --mtp; each extra token brings its own experts), and
 * 1.33, 1.53, 1.67 on the 2-layer bench model. The draft step c is the MTP layer plus the
 * lm_head over the main model's layers plus the lm_head: 0.72 with 2 layers, 0.275 with 8.
 * So drafts lose with 2 layers (at most 0.93x at a = 0.9), break even at a = 0.7 with 8
 * (1.00x; 1.06x at 0.8 for N = 1), and win from about 16 layers, where c <= 0.16 gives N = 1
 * at least 1.08x at a = 0.7 (GLM-5.2, 78 layers: c ~ 0.03, ~1.17x). Hence N = 1 from 16
 * main layers, else 0.
 * GPU: the steps run on the device through the session (session_forward_hidden,
 * session_mtp_forward_hidden, session_mtp_draft_shared), but every step copies its rows of
 * logits back (spec.c samples on the host) and r(N), c are not measured there (no GPU has
 * run this code; glm bench skips drafting with --gpu), so 0 until they are.
 *
 * With --gpu: positions stay the host's (kv->pos, kv->mtp_pos, passed to every gpu_* call),
 * so a rollback is the same assignment as on the CPU; the device's main, MTP and indexer
 * rows follow the CPU's visibility rule (k_topk: row t sees keys below pos0 + t + 1, and a
 * chunk's keys are written before they are scored or attended), so rows past a position
 * are rewritten before any query reads them. A draft step >= 1 with index sharing takes
 * its selection from the host (glm.c mtp_shared_selection, from step 0's selection the
 * device copied back) and runs the MTP layer without its indexer, as on the CPU. The verify
 * pass's N + 1 rows of logits and each draft's logits come back to the host, where
 * acceptance and sampling (sampler_probs) run; a plain step (N = 0) samples on the device. */
enum { SPEC_DEFAULT_CPU_MIN_LAYERS = 16, SPEC_DEFAULT_CPU = 1, SPEC_DEFAULT_GPU = 0 };

/* GLM_DRAFT_ORACLE=id,id,... (a test hook): the draft for position p is the p-th id
 * (a sequence the test computed beforehand, e.g. the greedy output itself) instead of
 * the MTP layer's, with a one-hot q; the MTP layer still runs, so every cache path is
 * exercised with long accepted prefixes. */
static void read_oracle(Speculator *sp, int vocab) {
    const char *s = getenv("GLM_DRAFT_ORACLE");
    if (!s || !*s) return;
    int cap = 64;
    sp->oracle = xmalloc((size_t)cap * sizeof(int));
    for (const char *p = s; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= vocab) glm_fatal("GLM_DRAFT_ORACLE: expected token ids below %d, comma-separated", vocab);
        if (sp->n_oracle == cap) { cap *= 2; sp->oracle = realloc(sp->oracle, (size_t)cap * sizeof(int)); if (!sp->oracle) glm_fatal("out of memory"); }
        sp->oracle[sp->n_oracle++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') glm_fatal("GLM_DRAFT_ORACLE: expected token ids below %d, comma-separated", vocab);
    }
}

/* The number of drafts this session can run, saying why on stderr when it is fewer than
 * asked. */
static int drafts_possible(const Session *S, int asked) {
    const int dflt = S->gpu ? SPEC_DEFAULT_GPU : S->model.cfg.n_layers >= SPEC_DEFAULT_CPU_MIN_LAYERS ? SPEC_DEFAULT_CPU : 0;
    const int n = asked < 0 ? dflt : asked;
    if (n == 0) return 0;
    if (!S->model.mtp) {
        char why[64] = "num_nextn_predict_layers 0";
        if (S->model.cfg.n_mtp) snprintf(why, sizeof why, "no model.layers.%d.* tensors", S->model.cfg.n_layers);
        if (asked > 0) fprintf(stderr, "glm: --draft %d: %s has no MTP layer (%s); decoding without drafts\n", asked, S->model.ck.dir, why);
        return 0;
    }
    return n;
}

void spec_open(Speculator *sp, Session *S, KVCache *kv, int asked) {
    memset(sp, 0, sizeof *sp);
    sp->kv = kv;
    sp->n_draft = drafts_possible(S, asked);
    if (!sp->n_draft) return;
    const Config *c = &S->model.cfg;
    const size_t H = (size_t)c->hidden, V = (size_t)c->vocab_size, N = (size_t)sp->n_draft;
    sp->tok = xcalloc((size_t)kv->ctx + 1, sizeof(int));
    sp->pend = xmalloc(((size_t)S->state.cap + N + 2) * H * sizeof(float));
    sp->g = xmalloc(H * sizeof(float));
    sp->vlogits = xmalloc((N + 1) * V * sizeof(float));
    sp->q = xmalloc(N * V * sizeof(float));
    sp->w = xmalloc(V * sizeof(float));
    sp->raw = xmalloc(V * sizeof(float));
    sp->step0.sel = xmalloc((size_t)c->index_topk * sizeof(int));
    sp->H = H;
    sp->V = V;
    read_oracle(sp, c->vocab_size);
}

void spec_close(Speculator *sp) {
    free(sp->tok); free(sp->pend); free(sp->g); free(sp->vlogits); free(sp->q); free(sp->w); free(sp->raw); free(sp->step0.sel); free(sp->oracle);
    memset(sp, 0, sizeof *sp);
}

/* The MTP layer's rows for the first `rows` pending hidden states (row t pairs h_t with
 * tok[t + 1]); logits and out_hidden of the last of them, and its selection when the
 * draft steps after it will share it. The rows are no longer pending. */
static void catch_up(Speculator *sp, Session *S, int rows, float *logits, float *out_hidden) {
    if (rows <= 0) return;
    const Model *m = &S->model;
    const size_t H = (size_t)m->cfg.hidden;
    KVCache *kv = sp->kv;
    session_mtp_forward_hidden(S, kv, sp->pend, sp->tok + kv->mtp_pos + 1, rows, logits, 0, out_hidden,
                               m->cfg.index_share_mtp ? &sp->step0 : NULL);
    sp->n_pend -= rows;
    memmove(sp->pend, sp->pend + (size_t)rows * H, (size_t)sp->n_pend * H * sizeof(float));
}

/* Which kept rows still hold: the MTP layer's rows pair h_t with token t+1, so with
 * ids[0..keep) kept only rows t <= keep-2 stand, and a pending h_t only for t < keep.
 * Returns where the main model must start so that every h_t past the MTP rows is known
 * (keep, or earlier when the pending states it needs were consumed or never kept). */
static int reconcile(Speculator *sp, KVCache *kv, int keep) {
    const int mtp = kv->mtp_pos < keep - 1 ? kv->mtp_pos : (keep > 0 ? keep - 1 : 0);
    int start = mtp;
    if (mtp == kv->mtp_pos) start = kv->mtp_pos + sp->n_pend < keep ? kv->mtp_pos + sp->n_pend : keep;
    kv->mtp_pos = mtp;
    sp->n_pend = start - mtp;
    return start;
}

void spec_prefill(Speculator *sp, Session *S, const int *ids, int n, float *logits) {
    KVCache *kv = sp->kv;
    if (!sp->n_draft) { session_forward(S, kv, ids + kv->pos, n - kv->pos, logits, 0); return; }
    kv->pos = reconcile(sp, kv, kv->pos);
    memcpy(sp->tok, ids, (size_t)n * sizeof(int));
    /* in chunks of the RunState's size, as forward() would cut the prompt (same rows, same
     * sums): each chunk's hidden states join the pending ones, and all but the last get
     * their MTP rows (the token after each is known) */
    while (kv->pos < n) {
        const int B = n - kv->pos < S->state.cap ? n - kv->pos : S->state.cap;
        session_forward_hidden(S, kv, ids + kv->pos, B, kv->pos + B == n ? logits : NULL, 0, spec_pending_end(sp));
        spec_prompt_chunk(sp, S, B);
    }
}

float *spec_pending_end(Speculator *sp) { return sp->pend + (size_t)sp->n_pend * sp->H; }

void spec_prompt_chunk(Speculator *sp, Session *S, int B) {
    sp->n_pend += B;
    catch_up(sp, S, sp->n_pend - 1, NULL, NULL);
}

void spec_resume(Speculator *sp, const int *ids, int n, int pos, const float *h_last) {
    KVCache *kv = sp->kv;
    memcpy(sp->tok, ids, (size_t)n * sizeof(int));
    kv->pos = pos;
    kv->mtp_pos = pos > 0 ? pos - 1 : 0;
    sp->n_pend = pos > 0;
    if (pos > 0) memcpy(sp->pend, h_last, (size_t)sp->H * sizeof(float));
}

/* The token that drafts position pos: the oracle's (tests), else the MTP layer's
 * logits[V]: their argmax (greedy), or a draw from their distribution, which q becomes. */
static int draft_token(Speculator *sp, Sampler *smp, float *q, int V, int pos) {
    if (pos < sp->n_oracle) return sp->oracle[pos];
    if (smp->temperature <= 0.0f) return argmax(q, V);
    sampler_probs(smp, q, V);
    return sample_weights(smp, q, V);
}

/* Steps 1-2: step 0's catch-up and drafts d_1 .. d_N for positions P+1 .. P+N (x at P
 * already in tok). The MTP layer's draft rows are left past P, to be rolled back. */
static void draft(Speculator *sp, Session *S, Sampler *smp, int N) {
    const Model *m = &S->model;
    const int V = m->cfg.vocab_size, P = sp->kv->pos;
    catch_up(sp, S, sp->n_pend, sp->q, N > 1 ? sp->g : NULL);
    sp->draft[0] = draft_token(sp, smp, sp->q, V, P + 1);
    for (int j = 1; j < N; j++) {
        float *q = sp->q + (size_t)j * V;
        if (m->cfg.index_share_mtp) session_mtp_draft_shared(S, sp->kv, sp->g, sp->draft[j - 1], q, sp->g, &sp->step0);
        else session_mtp_forward_hidden(S, sp->kv, sp->g, &sp->draft[j - 1], 1, q, 0, sp->g, NULL);
        sp->draft[j] = draft_token(sp, smp, q, V, P + 1 + j);
    }
}

/* Step 4 for temperature > 0: is the draft d for position pos accepted? p: its row of the
 * verify pass's logits, made the target distribution here; q: the draft's distribution
 * (one-hot for an oracle draft). On rejection *y is drawn from norm(max(p - q, 0)). */
static int accept_sampled(Speculator *sp, Sampler *smp, float *p, const float *q, int d, int pos, int V, int *y) {
    sampler_probs(smp, p, V);
    const int one_hot = pos < sp->n_oracle;
    const float qd = one_hot ? 1.0f : q[d];
    if (random_f32(smp) * qd < p[d]) return 1; /* u < p(d) / q(d) */
    for (int i = 0; i < V; i++) sp->w[i] = p[i] - (one_hot ? (i == d) : q[i]) > 0.0f ? p[i] - (one_hot ? (i == d) : q[i]) : 0.0f;
    *y = sample_weights(smp, sp->w, V);
    return 0;
}

/* The verify pass's row j as the model's log-probabilities are read from it: sp->raw keeps
 * the row's logits and *lse their log-sum-exp before sampling turns the row into
 * probabilities (only when the caller asked for log-probabilities). */
static void keep_row(Speculator *sp, const float *row, int V, int want, float *lse) {
    if (!want) return;
    memcpy(sp->raw, row, (size_t)V * sizeof(float));
    *lse = log_sum_exp(row, V);
}

/* Step 4: how many drafts are accepted (k), and the main model's token after them (*y);
 * logprob (if not NULL) [k + 1]: each emitted token's log-probability under the model. */
static int accept(Speculator *sp, Sampler *smp, float *vlogits, int N, int P, int V, int *y, float *logprob) {
    float lse = 0;
    for (int j = 0; j < N; j++) {
        float *p = vlogits + (size_t)j * V;
        keep_row(sp, p, V, logprob != NULL, &lse);
        int taken;
        if (smp->temperature <= 0.0f) {
            *y = argmax(p, V);
            taken = *y == sp->draft[j];
        } else
            taken = accept_sampled(sp, smp, p, sp->q + (size_t)j * V, sp->draft[j], P + 1 + j, V, y);
        if (logprob) logprob[j] = sp->raw[taken ? sp->draft[j] : *y] - lse;
        if (!taken) return j;
    }
    float *p = vlogits + (size_t)N * V;
    keep_row(sp, p, V, logprob != NULL, &lse);
    if (smp->temperature <= 0.0f) *y = argmax(p, V);
    else { sampler_probs(smp, p, V); *y = sample_weights(smp, p, V); }
    if (logprob) logprob[N] = sp->raw[*y] - lse;
    return N;
}

int spec_draft(Speculator *sp, Session *S, Sampler *smp, int x, int max_new, int *seq) {
    KVCache *kv = sp->kv;
    const int P = kv->pos;
    int N = sp->n_draft; /* no more drafts than tokens wanted, nor past the context */
    if (N > max_new - 1) N = max_new - 1;
    if (N > kv->ctx - 1 - P) N = kv->ctx - 1 - P;
    if (N < 0) N = 0;
    sp->tok[P] = x;
    seq[0] = x;
    if (N == 0) catch_up(sp, S, sp->n_pend, NULL, NULL); /* a plain step, its hidden state pending like any other */
    else draft(sp, S, smp, N);
    memcpy(seq + 1, sp->draft, (size_t)N * sizeof(int));
    return N;
}

int spec_accept(Speculator *sp, Sampler *smp, int N, float *vlogits, int *out, float *logprob) {
    KVCache *kv = sp->kv;
    const int V = (int)sp->V, P = kv->pos - (N + 1); /* the verify pass cached x and the N drafts */
    int y, k = accept(sp, smp, vlogits, N, P, V, &y, logprob);
    kv->pos = P + k + 1;           /* x and the accepted drafts */
    kv->mtp_pos = P;               /* the draft rows go; catch-up redoes them from the main model's h */
    sp->n_pend = k + 1;            /* h_P .. h_{P+k} */
    memcpy(sp->tok + P + 1, sp->draft, (size_t)k * sizeof(int));
    sp->tok[P + k + 1] = y;
    memcpy(out, sp->draft, (size_t)k * sizeof(int));
    out[k] = y;
    if (N) {
        sp->steps++;
        sp->drafted += N;
        sp->accepted += k;
    }
    return k + 1;
}

int spec_step(Speculator *sp, Session *S, Sampler *smp, int x, int max_new, float *logits, int *out) {
    KVCache *kv = sp->kv;
    if (!sp->n_draft) {
        session_forward(S, kv, &x, 1, logits, 0);
        out[0] = session_sample(S, smp, logits);
        return 1;
    }
    int seq[GLM_MAX_DRAFT + 1];
    const int N = spec_draft(sp, S, smp, x, max_new, seq);
    if (N == 0) { /* one row: its logits stay on the device for session_sample (GPU) */
        session_forward_hidden(S, kv, &x, 1, logits, 0, sp->pend);
        sp->n_pend = 1;
        out[0] = session_sample(S, smp, logits);
        return 1;
    }
    session_forward_hidden(S, kv, seq, N + 1, sp->vlogits, 1, sp->pend); /* the pending list is empty after step 0 */
    return spec_accept(sp, smp, N, sp->vlogits, out, NULL);
}

void spec_truncate(Speculator *sp, KVCache *kv, int pos) {
    if (pos >= kv->pos) return;
    kv->pos = pos;
    if (!sp->n_draft) return;
    if (kv->mtp_pos > pos) { kv->mtp_pos = pos; sp->n_pend = 0; } /* spec_prefill's reconcile reruns what it needs */
    else if (kv->mtp_pos + sp->n_pend > pos) sp->n_pend = pos - kv->mtp_pos;
}
