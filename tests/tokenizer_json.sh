# tests/tokenizer_json.sh - sourced (not run) by the suites that need GLM-5.2's tokenizer.json,
# from the repository root. need_tokenizer sets TOK=build/tokenizer.json, unpacking it from
# data/glm-5.2-tokenizer/tokenizer.json.gz first when it is missing or older (what
# `make build/tokenizer.json` does), so a suite also runs on its own, without make. On failure
# it sets TOK_WHY to the reason (one line) and returns 1; the suite then fails (never skips).
need_tokenizer() {
    TOK=build/tokenizer.json
    tok_gz=data/glm-5.2-tokenizer/tokenizer.json.gz
    if [ ! -f "$tok_gz" ]; then
        [ -s "$TOK" ] && return 0
        TOK_WHY="tokenizer: $tok_gz is missing (it is part of the repository) and $TOK was never unpacked"
        return 1
    fi
    if [ -s "$TOK" ] && [ ! "$tok_gz" -nt "$TOK" ]; then return 0; fi
    mkdir -p build && gzip -dc "$tok_gz" > "$TOK.tmp.$$" && mv "$TOK.tmp.$$" "$TOK" && return 0
    rm -f "$TOK.tmp.$$"
    TOK_WHY="tokenizer: cannot unpack $tok_gz to $TOK (run: make build/tokenizer.json)"
    return 1
}
