#!/usr/bin/env bash
# Compile checks of glm_hip.hip for the real GPU targets, warnings as errors:
#   hipcc (Debian 5.2.3) for gfx90a, with the real HIP headers: host + device, linked into
#     build/hip-gfx90a/glm_hip
#   nvcc for sm_90 (H100/H200): host + device, linked into build/cuda-sm_90/glm_cuda
#   (clang-22 for gfx942 / gfx950 is tests/gpu_isa_report.sh's: with the ROCm device
#     libraries linked, -Werror; a real MI300X/MI355X build uses the machine's own ROCm)
# And that the GPU builds follow their target: a build with other flags recompiles (the
# hipcc object is built with -O0 (quick), then with the -Werror flags above, which must recompile
# it), an unchanged command rebuilds nothing, and make hip for another GPU_ARCH compiles
# for that target into its own folder. Builds go to build/hip-*/ and build/cuda-*/ only:
# ./glm_hip and ./glm_cuda (make hip / make cuda) are left as they were.
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

# the C side of the GPU builds (shared objects, -DGLM_GPU)
if ! make -s build/gpu/glm.o >"$OUT/c.log" 2>&1; then bad "C objects for the GPU builds" "$(head -n 5 "$OUT/c.log")"; fi

# ./glm_hip, ./glm_cuda: absent, or inode, time and target of the link (compared at the end)
root_state() { for f in glm_hip glm_cuda; do
    if [ -e $f ] || [ -L $f ]; then echo "$f $(stat -c '%i %y' $f) $(readlink $f)"; else echo "$f absent"; fi; done; }
root_before=$(root_state)

# hipcc, gfx90a: first with -O0 (quick), then the check itself with -O3 -Werror (so it always compiles)
mk() { make --no-print-directory "$@"; }
HD=$(mk -s hip-dir GPU_ARCH=gfx90a)
O2=(HIPCC="$HIPCC" GPU_ARCH=gfx90a HIPFLAGS=-O0)
WE=(HIPCC="$HIPCC" GPU_ARCH=gfx90a HIPFLAGS="-O3 -Werror")
mtime() { stat -c %y "$1" 2>/dev/null; }
if ! command -v "$HIPCC" >/dev/null; then
    bad "hipcc gfx90a" "hipcc not found (apt-get install hipcc libamdhip64-dev)"
elif ! mk -s "$HD/glm_hip" "${O2[@]}" >"$OUT/hip_O2.log" 2>&1; then
    bad "hipcc gfx90a -O0" "compile or link failed:"; log "$OUT/hip_O2.log"
else
    # (make -q on the objects: the C sources may change under a running test)
    if mk -q "$HD/glm_hip.o" "${O2[@]}"; then ok "rebuild: the same hipcc command again leaves $HD/glm_hip.o up to date"
    else bad "rebuild" "make -q: $HD/glm_hip.o out of date right after its build with the same command"; fi
    mk -n "$HD/glm_hip" "${WE[@]}" >"$OUT/hip_n.log" 2>&1
    if ! mk -q "$HD/glm_hip.o" "${WE[@]}" && grep -q -- "-O3 -Werror --offload-arch=gfx90a .*-c glm_hip.hip -o $HD/glm_hip.o" "$OUT/hip_n.log"; then
        ok "rebuild: HIPFLAGS -O0 -> '-O3 -Werror' (gfx90a both) makes $HD/glm_hip.o out of date (make -q, make -n)"
    else bad "rebuild" "HIPFLAGS changed but make does not plan to recompile:"; log "$OUT/hip_n.log"; fi
    t_obj=$(mtime "$HD/glm_hip.o"); t_bin=$(mtime "$HD/glm_hip")
    sleep 0.01
    if mk -s "$HD/glm_hip" "${WE[@]}" >"$OUT/hip.log" 2>&1; then
        ok "hipcc $("$HIPCC" --version 2>/dev/null | grep -o 'HIP version: [0-9.]*' | head -n 1) gfx90a (-Werror), linked $HD/glm_hip"
        if [ "$(mtime "$HD/glm_hip.o")" != "$t_obj" ] && [ "$(mtime "$HD/glm_hip")" != "$t_bin" ] && grep -q -- "-O3 -Werror --offload-arch=gfx90a" "$HD/flags"; then
            ok "rebuild: $HD/glm_hip.o recompiled and relinked with the new flags ($HD/flags: $(cat "$HD/flags"))"
        else bad "rebuild" "object or program not rebuilt after the HIPFLAGS change (flags: $(cat "$HD/flags"))"; fi
    else
        bad "hipcc gfx90a" "compile or link failed:"; log "$OUT/hip.log"
    fi
    # the new user's case: after a gfx90a build, make hip for gfx950 must compile for gfx950
    # (dry run: Debian's hipcc cannot target it), in its own folder, and point ./glm_hip there
    mk -n hip HIPCC="$HIPCC" GPU_ARCH=gfx950 >"$OUT/hip_gfx950_n.log" 2>&1
    if grep -q -- "--offload-arch=gfx950 .*-c glm_hip.hip -o build/hip-gfx950/glm_hip.o" "$OUT/hip_gfx950_n.log" &&
       grep -q "ln -sfn build/hip-gfx950/glm_hip glm_hip" "$OUT/hip_gfx950_n.log" && ! grep -q "gfx90a" "$OUT/hip_gfx950_n.log"; then
        ok "rebuild: make hip GPU_ARCH=gfx950 after gfx90a compiles for gfx950 into build/hip-gfx950 (make -n)"
    else bad "rebuild" "make -n hip GPU_ARCH=gfx950 does not compile for gfx950:"; log "$OUT/hip_gfx950_n.log"; fi
    # back to a target already built: nothing compiles, ./glm_hip is pointed at it
    mk -n hip "${WE[@]}" >"$OUT/hip_back_n.log" 2>&1
    if ! grep -q -- "-c glm_hip.hip" "$OUT/hip_back_n.log" && grep -q "ln -sfn $HD/glm_hip glm_hip" "$OUT/hip_back_n.log"; then
        ok "rebuild: make hip for the built gfx90a compiles nothing and points ./glm_hip at $HD (make -n)"
    else bad "rebuild" "make -n hip for the built target:"; log "$OUT/hip_back_n.log"; fi
fi

# nvcc, sm_90
# (the CUDA toolkit is not a Debian main package: CI, whose machines have it, sets
#  GLM_REQUIRE_NVCC=1 so a missing nvcc fails there; elsewhere it is reported and left out)
if [ ! -x "$NVCC" ] && ! command -v "$NVCC" >/dev/null; then
    if [ "${GLM_REQUIRE_NVCC:-0}" = 1 ]; then bad "nvcc sm_90" "nvcc not found (CUDA toolkit at /usr/local/cuda)"
    else echo "NOT RUN nvcc sm_90: nvcc not found (set NVCC=...; CI requires it)"; fi
else
    CD=$(mk -s cuda-dir CUDA_ARCH=sm_90)
    NV=(NVCC="$NVCC" CUDA_ARCH=sm_90 NVFLAGS="-O3 -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror")
    if rm -f "$CD/glm_hip.o" && mk -s "$CD/glm_cuda" "${NV[@]}" >"$OUT/nvcc.log" 2>&1; then
        ok "nvcc $("$NVCC" --version | grep -o 'release [0-9.]*') sm_90 (-Werror), linked $CD/glm_cuda"
        if mk -q "$CD/glm_hip.o" "${NV[@]}" && ! mk -q "$CD/glm_hip.o" NVCC="$NVCC" CUDA_ARCH=sm_90 NVFLAGS=-O2; then
            ok "rebuild: $CD/glm_hip.o up to date for the same nvcc command, out of date for NVFLAGS=-O2 (make -q)"
        else bad "rebuild" "make -q on $CD/glm_hip.o does not follow NVFLAGS"; fi
    else
        bad "nvcc sm_90" "compile or link failed:"; log "$OUT/nvcc.log"
    fi
fi

# clang-22 for gfx942 and gfx950 (MI300X, MI355X): tests/gpu_isa_report.sh compiles them with the
# ROCm device libraries linked, -Werror, and fails on spills (test_gpu_emu runs both scripts)

root_after=$(root_state)
if [ "$root_after" = "$root_before" ]; then ok "./glm_hip and ./glm_cuda left as they were ($(echo $root_after | sed 's/ \(glm_cuda\)/, \1/'))"
else bad "root binaries" "the compile checks changed ./glm_hip or ./glm_cuda: before '$root_before', after '$root_after'"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
