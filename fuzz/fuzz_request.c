/* fuzz_request.c - libFuzzer target for glm serve's request bodies and responses (serve.c,
 * included whole so its static functions are reachable). The first byte picks the endpoint
 * (even: /v1/completions, odd: /v1/chat/completions); the rest is the JSON body, parsed
 * with the real GLM-5.2 tokenizer. For a body that is accepted, the bytes after it (up
 * to a NUL in the body, or the last 64 bytes) become "generated" token ids, and the
 * whole response and every streamed chunk are built from them.
 * Besides "no crash, no leak, no sanitizer report": a refused body has a 400 (or 500)
 * status and a message; an accepted one has a prompt of ids inside the vocabulary and
 * settings in their documented ranges; every response and chunk is valid JSON; the text
 * sent in chunks is never more than the text decoded. */
#include "../serve.c"

#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    number_tables_init();
    const char *paths[] = {getenv("GLM_TOKENIZER_JSON"), "build/tokenizer.json", "fuzz/corpus/tokenizer_load/tokenizer-2000.json"};
    char err[512];
    for (size_t i = 0; i < sizeof paths / sizeof *paths && !g.tok; i++)
        if (paths[i] && access(paths[i], R_OK) == 0) g.tok = tokenizer_load(paths[i], err, sizeof err);
    if (!g.tok) { fprintf(stderr, "fuzz_request: no tokenizer.json (make build/tokenizer.json)\n"); exit(1); }
    g.S.model.cfg.vocab_size = tokenizer_vocab_size(g.tok);
    g.args.ctx = 4096;
    g.model_id = "fuzz";
    return 0;
}

static void must_parse(const Buf *b) {
    Json j;
    if (b->oom || json_parse(&j, b->p ? b->p : "", b->len, NULL, 0)) abort();
    json_free(&j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int chat = data[0] & 1;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    const char *nul = memchr(body, 0, len);
    const uint8_t *gen = nul ? (const uint8_t *)nul + 1 : data + (size > 64 ? size - 64 : 1);
    const size_t n_gen = (size_t)(data + size - gen);
    if (nul) len = (size_t)(nul - body);
    Params p;
    ReqError e = {0};
    if (parse_params(body, len, chat, &p, &e)) {
        if ((e.status != 400 && e.status != 500) || !e.msg[0]) abort();
        params_free(&p);
        return 0;
    }
    const int V = g.S.model.cfg.vocab_size;
    if (p.n_prompt < 1 || !(p.temperature >= 0 && p.temperature <= 2) || !(p.top_p > 0 && p.top_p <= 1) || p.n_stop > 4) abort();
    for (int i = 0; i < p.n_prompt; i++) if (p.prompt[i] < 0 || p.prompt[i] >= V) abort();
    /* a response from "generated" ids: two bytes each */
    Job j = {.id = 1, .n_prompt = p.n_prompt, .finish = "length"};
    j.n_out = j.n_gen = (int)(n_gen / 2);
    j.out = xmalloc(((size_t)j.n_out + 1) * sizeof(int));
    j.logprob = xmalloc(((size_t)j.n_out + 1) * sizeof(float));
    for (int i = 0; i < j.n_out; i++) { j.out[i] = (gen[2 * i] | gen[2 * i + 1] << 8) % V; j.logprob[i] = -(float)i; }
    Output o;
    output_init(&o, &p);
    Buf b = {0};
    for (int i = 0; i <= j.n_out; i++) { /* one id at a time, as a stream sends them */
        const int final = i == j.n_out;
        output_add(&o, &p, j.out + (i < j.n_out ? i : 0), final ? 0 : 1, final);
        size_t end = output_ready(&o, &p, final);
        if (end > o.text.len || end < o.sent) abort();
        if (end > o.sent) { delta_chunk(&b, &o, &p, &j, o.sent, end, i == 0); must_parse(&b); b.len = 0; o.sent = end; }
        if (o.stopped) break;
    }
    full_body(&b, &o, &p, &j);
    must_parse(&b);
    buf_free(&b);
    output_free(&o);
    free(j.out);
    free(j.logprob);
    params_free(&p);
    return 0;
}
