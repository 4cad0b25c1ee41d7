#!/usr/bin/env bash
# SIMD kernels (simd.c) against the plain C loops (glm.c) on random inputs.
# Builds its own driver with the same sanitizer flags as the binary under test (SAN=1).
set -eu
cd "$(dirname "$0")/.."
mkdir -p tests/out
flags="-std=c11 -O2 -Wall -Wextra -fopenmp"
[ "${SAN:-0}" = 1 ] && flags="$flags -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined"
${CC:-cc} $flags -Dmain=glm_cli_main -o tests/out/kernels_test tests/kernels_test.c \
    cli.c glm.c spec.c serve.c model.c fast.c simd.c tokenizer.c json.c http.c tools/bench.c tools/synth.c tools/convert.c \
    tools/loadgen.c tools/plan.c -lm -pthread
# under the sanitizers the largest matrices are left to the plain run (CI time)
if [ "${SAN:-0}" = 1 ]; then exec tests/out/kernels_test --sanitized; fi
exec tests/out/kernels_test
