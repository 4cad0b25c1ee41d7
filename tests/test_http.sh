#!/usr/bin/env bash
# http.c (glm serve's HTTP/1.1): the request parser's return codes on known requests, a body
# split at every byte, pipelining and keep-alive, buf_json_str's escapes and U+FFFD, the bearer
# check, and the socket calls over loopback (tests/http_test.c), always under ASan + UBSan:
# it takes a second or two. Builds in a temporary folder; the glm binary ($GLM) is not used.
# Ends with "N passed, N failed"; exits non-zero on any failure.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=$(mktemp -d "${TMPDIR:-/tmp}/glm-http-test.XXXXXX") || exit 1
trap 'rm -rf "$OUT"' EXIT
if ! ${CC:-cc} -std=c11 -Wall -Wextra -Werror -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
        -fno-sanitize-recover=undefined -pthread -o "$OUT/http_test" tests/http_test.c http.c json.c \
        >"$OUT/build.log" 2>&1; then
    echo "FAIL build: $(head -n 5 "$OUT/build.log" | tr '\n' ' ')"
    echo "0 passed, 1 failed"
    exit 1
fi
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} timeout 60 "$OUT/http_test"
