#!/usr/bin/env bash
# Compile checks of glm_hip.hip for the real GPU targets, warnings as errors:
#   hipcc (Debian 5.2.3) for gfx90a, with the real HIP headers: host + device, linked into glm_hip
#   nvcc for sm_90 (H100/H200): host + device, linked into glm_cuda
#   Debian clang-22 for gfx942 (MI300X) and gfx950 (MI355X): device code generation
#     (ISA, registers, LDS) with the ROCm 5.2 headers, assembled into an object. Not
#     linked: Debian's ROCm 5.2 device libraries have no gfx942/gfx950 build, so the
#     __ockl_* calls behind threadIdx stay unresolved; a real MI300X/MI355X build uses
#     the machine's own ROCm (make hip).
# A missing compiler is a failure, not a skip: CI installs them (see the README).
# Prints PASS/FAIL lines and "N passed, N failed"; run from the repository root.
set -u
cd "$(dirname "$0")/.."
OUT=${GPU_CC_OUT:-build/compile_check}
mkdir -p "$OUT"
pass=0; fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
log() { sed 's/^/    /' "$1" | head -n 30; }

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
HIPCC=${HIPCC:-hipcc}
CLANG22=${CLANG22:-clang-22}

# the C side of the GPU builds (shared objects, -DGLM_GPU)
if ! make -s build/gpu/glm.o >"$OUT/c.log" 2>&1; then bad "C objects for the GPU builds" "$(head -n 5 "$OUT/c.log")"; fi

# hipcc, gfx90a
if ! command -v "$HIPCC" >/dev/null; then
    bad "hipcc gfx90a" "hipcc not found (apt-get install hipcc libamdhip64-dev)"
elif rm -f build/hip/glm_hip.o glm_hip && make -s glm_hip HIPCC="$HIPCC" GPU_ARCH=gfx90a HIPFLAGS="-O3 -Werror" >"$OUT/hip.log" 2>&1; then
    ok "hipcc $("$HIPCC" --version 2>/dev/null | grep -o 'HIP version: [0-9.]*' | head -n 1) gfx90a (-Werror), linked ./glm_hip"
else
    bad "hipcc gfx90a" "compile or link failed:"; log "$OUT/hip.log"
fi

# nvcc, sm_90
# (the CUDA toolkit is not a Debian main package: CI, whose machines have it, sets
#  GLM_REQUIRE_NVCC=1 so a missing nvcc fails there; elsewhere it is reported and left out)
if [ ! -x "$NVCC" ] && ! command -v "$NVCC" >/dev/null; then
    if [ "${GLM_REQUIRE_NVCC:-0}" = 1 ]; then bad "nvcc sm_90" "nvcc not found (CUDA toolkit at /usr/local/cuda)"
    else echo "NOT RUN nvcc sm_90: nvcc not found (set NVCC=...; CI requires it)"; fi
elif rm -f build/cuda/glm_hip.o glm_cuda &&
     make -s glm_cuda NVCC="$NVCC" CUDA_ARCH=sm_90 NVFLAGS="-O3 -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror" >"$OUT/nvcc.log" 2>&1; then
    ok "nvcc $("$NVCC" --version | grep -o 'release [0-9.]*') sm_90 (-Werror), linked ./glm_cuda"
else
    bad "nvcc sm_90" "compile or link failed:"; log "$OUT/nvcc.log"
fi

# clang-22, gfx942 and gfx950 device code
for arch in gfx942 gfx950; do
    if ! command -v "$CLANG22" >/dev/null; then
        bad "clang-22 $arch" "clang-22 not found (apt-get install clang-22 lld-22, bookworm-security)"
        continue
    fi
    extra=; [ $arch = gfx950 ] && extra=-DGLM_FP4_CVT   # gfx950 also compiles the hardware FP4 conversion path
    if "$CLANG22" -x hip -std=c++17 -O3 --offload-arch=$arch --offload-device-only -nogpulib -D__AMDGCN_WAVEFRONT_SIZE=64 $extra \
           -Wall -Wextra -Werror -S -o "$OUT/dev_$arch.s" glm_hip.hip >"$OUT/clang_$arch.log" 2>&1 &&
       "$CLANG22" -target amdgcn-amd-amdhsa -mcpu=$arch -c "$OUT/dev_$arch.s" -o "$OUT/dev_$arch.o" >>"$OUT/clang_$arch.log" 2>&1; then
        n=$(grep -c '^_Z[0-9]*k_[A-Za-z0-9_]*:' "$OUT/dev_$arch.s")
        spill=$(awk '/\.private_segment_fixed_size:/ && $2 > 0' "$OUT/dev_$arch.s" | wc -l)
        if [ "$n" -ge 15 ] && [ "$spill" -eq 0 ]; then ok "clang-22 $arch device code: $n kernels, no register spills (-Werror)"
        else bad "clang-22 $arch" "$n kernels, $spill with scratch (register spills)"; fi
    else
        bad "clang-22 $arch" "device compile failed:"; log "$OUT/clang_$arch.log"
    fi
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
