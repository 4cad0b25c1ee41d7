#!/usr/bin/env bash
# The static ISA report of glm_hip.hip: what the compiler made of each kernel for MI300X
# (gfx942) and MI355X (gfx950), read from the assembly. No GPU runs anything here.
#
# Build: Debian clang-22 compiles the device code (-O3, warnings as errors) with the ROCm
# device libraries linked in (ockl, ocml, oclc_*: Debian's rocm-device-libs), so threadIdx,
# blockDim and __syncthreads become hardware registers and instructions, not external calls
# (gpu_compile_check.sh compiles with -nogpulib, whose register and spill figures describe
# code that never runs). The .s is then assembled and linked by ld.lld (--no-undefined) into
# a code object: anything left unresolved fails the link. Debian's libraries (ROCm 5.2) lack
# three one-constant files that clang-22 asks for; they are generated under $OUT/devlibs,
# next to links to the rest:
#   oclc_isa_version_942.bc, _950.bc   __oclc_ISA_version = 9402, 9500 (what ockl/ocml
#                                      consult for target-specific paths; 940's file says 9400)
#   oclc_abi_version_600.bc            __oclc_ABI_version = 600: clang-22 emits code object v6;
#                                      ockl 5.2 only asks "below 500?", so v6 takes the v5
#                                      path, which is the v6 layout of the implicit arguments
# and the ROCm 5.2 headers' __syncthreads calls __atomic_work_item_fence, which lives in
# hip.bc (linked with -mlink-builtin-bitcode; ROCm 6 headers use the builtin directly).
# Each is built as make hip builds it (the fast kernels use gfx950's conversions there).
#
# Per kernel (one table per target), from the code object metadata in the .s: VGPRs, AGPRs,
# SGPRs, SGPR/VGPR spills, scratch bytes (private segment), static LDS bytes, and waves per
# SIMD (the compiler's "; Occupancy:" for the kernel's 256-thread launch bound: the limit set
# by registers and LDS). Every kernel is treated as hot: each runs for every token (layer
# kernels once per layer, k_sample and k_embed once per step), so any scratch or spill,
# SGPR spills to VGPR lanes included, is a FAIL; except in the plain kernels that a fast
# one replaces (PLAIN_ONLY below: they run only with GLM_GPU_KERNELS=plain, as the fast
# kernels' reference), whose spills are printed as NOTE lines.
#
# The GEMV hot loops (kernels named k_gemv*), found from the branches alone:
#   - Basic blocks: a label (.LBB*) or a "; %bb." comment starts one, and so does the
#     instruction after any branch; s_branch and s_cbranch_* give the edges (a conditional
#     one also falls through), s_endpgm and s_setpc end the kernel.
#   - Loops are the cycles of that graph: a loop is a strongly connected set of blocks, its
#     header the block entered from outside; nested loops are the cycles left when the header
#     is taken out. Not "a block ending in a backward branch" alone: LLVM's layout often puts
#     the latch blocks (the ones that branch back) above the header, so the backward branches
#     of one loop target several blocks, none of them its header.
#   - A hot loop is an innermost loop (no cycle inside) that issues global/buffer/flat loads.
#     Its instructions are counted once per block: the iteration in which every guarded
#     block runs (all GEMV_GROUP rows, all tokens), which is also what a divergent branch
#     costs under the exec mask. Columns: VALU (v_*), VMEM (global/buffer/flat/scratch),
#     LDS (ds_*), SMEM (s_load*), waits (s_waitcnt*), SALU (other s_*, branches included).
#   - Weight bytes: loads are grouped by address operand (the register, until something
#     writes it). Several loads from one address at different offsets are a run: one lane's
#     slice of the activations x, shared by the rows of the iteration. Lone loads of the widest
#     width are the weight chunks (one per row per iteration); narrower lone loads are side
#     data (MXFP4/FP8 scales), listed but not counted as weights. Weight bytes per iteration
#     per wave = Σ chunk widths x 64 lanes, and "per 4 KB" = instructions x 4096 / that.
#   - The format: a template argument of the kernel if it has one (k_gemv_fast<3> =
#     WF_MXFP4, glm.h's WeightFormat); otherwise inferred from the loads, marked "(loads)":
#     a chunk of W bytes against a run of F floats of x holds F weights, so 8W/F bits each
#     (4: MXFP4, 8: FP8, 16: BF16). A loop with no run reads element by element (mat_elem,
#     every format behind a switch); its weight bytes then include x's loads: approximate.
#
# A missing clang-22, ld.lld-22 or bitcode folder is a failure, not a skip: CI installs them
# (tests/install-deps.sh). Prints the tables, PASS/FAIL lines and "N passed, N failed"; run
# from the repository root (make isa-report). ROCM_BITCODE=DIR uses other device libraries.
set -u
cd "$(dirname "$0")/.."
OUT=${GPU_ISA_OUT:-build/isa_report}
CLANG22=${CLANG22:-clang-22}
BITCODE=${ROCM_BITCODE:-/usr/lib/x86_64-linux-gnu/amdgcn/bitcode}
PY=/usr/bin/python3
mkdir -p "$OUT"
pass=0; fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit; }

if ! command -v "$CLANG22" >/dev/null; then bad "clang-22" "not found (apt-get install clang-22 lld-22)"; finish; fi
LLD=$("$CLANG22" -print-prog-name=ld.lld)
if [ ! -x "$LLD" ]; then bad "ld.lld" "clang-22's linker $LLD not found (apt-get install lld-22)"; finish; fi
if [ ! -f "$BITCODE/ockl.bc" ] || [ ! -f "$BITCODE/ocml.bc" ] || [ ! -f "$BITCODE/hip.bc" ]; then
    bad "ROCm device libraries" "no ockl.bc/ocml.bc/hip.bc in $BITCODE (apt-get install rocm-device-libs)"; finish
fi

# the device library folder: Debian's files, plus the three constants they lack
LIB=$OUT/devlibs
rm -rf "$LIB" && mkdir -p "$LIB"
for f in "$BITCODE"/*.bc; do ln -s "$(readlink -f "$f")" "$LIB/"; done
DL=$("$CLANG22" -target amdgcn-amd-amdhsa -nogpulib -x c -S -emit-llvm -o - /dev/null | grep '^target datalayout')
const_bc() { # NAME VAR VALUE: a module defining the constant VAR as ockl/ocml expect it
    [ -e "$LIB/$1.bc" ] && return 0
    printf '%s\ntarget triple = "amdgcn-amd-amdhsa"\n@%s = linkonce_odr protected local_unnamed_addr addrspace(4) constant i32 %s, align 4\n' \
        "$DL" "$2" "$3" | "$CLANG22" -target amdgcn-amd-amdhsa -nogpulib -c -emit-llvm -x ir - -o "$LIB/$1.bc"
}
if const_bc oclc_isa_version_942 __oclc_ISA_version 9402 && const_bc oclc_isa_version_950 __oclc_ISA_version 9500 &&
   const_bc oclc_abi_version_600 __oclc_ABI_version 600; then :
else bad "device libraries" "could not generate the oclc constants in $LIB"; finish; fi

# one build per target: NAME ARCH EXTRA-FLAGS
builds=("gfx942 gfx942" "gfx950 gfx950")
asm=()
for b in "${builds[@]}"; do
    set -- $b; name=$1; arch=$2; shift 2
    s=$OUT/$name.s
    if "$CLANG22" -x hip -std=c++17 -O3 --offload-arch=$arch --offload-device-only -D__AMDGCN_WAVEFRONT_SIZE=64 "$@" \
           --rocm-device-lib-path="$LIB" -Xclang -mlink-builtin-bitcode -Xclang "$LIB/hip.bc" \
           -Wall -Wextra -Werror -S -o "$s" glm_hip.hip >"$OUT/$name.log" 2>&1 &&
       "$CLANG22" -target amdgcn-amd-amdhsa -mcpu=$arch "$s" -o "$OUT/$name.co" >>"$OUT/$name.log" 2>&1; then
        ok "clang-22 $name: device code with the ROCm device libraries, linked into $OUT/$name.co (ld.lld --no-undefined)"
        asm+=("$name=$s")
    else
        bad "clang-22 $name" "compile or link failed:"; sed 's/^/    /' "$OUT/$name.log" | head -n 30
    fi
done
[ ${#asm[@]} -gt 0 ] || finish

"$PY" - "${asm[@]}" >"$OUT/report.txt" <<'PY'
import re, subprocess, sys
# the plain kernels a fast kernel replaces on the default path (glm_hip.hip section 3b)
PLAIN_ONLY = {"k_gemv1", "k_gemvn", "k_gemv_experts"}

WAVE = 64
FORMATS = {}  # WeightFormat value -> name, from glm.h
m = re.search(r"typedef enum \{([^}]*)\} WeightFormat;", open("glm.h").read())
for i, n in enumerate(x.strip() for x in m.group(1).split(",")):
    FORMATS[str(i)] = n.replace("WF_", "")
ADDR_END = ("offset:", "glc", "slc", "nt", "sc0", "sc1", "lds", "offen", "idxen")
NO_DEST = re.compile(r"^(s_waitcnt|s_branch|s_cbranch|s_barrier|s_nop|s_endpgm|s_setprio|s_sleep|s_setpc|s_dcache|buffer_wbl2|buffer_inv|.*store|ds_write|s_trap)")
WIDTH = {"byte": 1, "ubyte": 1, "sbyte": 1, "short": 2, "ushort": 2, "sshort": 2, "dword": 4,
         "dwordx2": 8, "dwordx3": 12, "dwordx4": 16, "b32": 4, "b64": 8, "b96": 12, "b128": 16,
         "u8": 1, "i8": 1, "u16": 2, "i16": 2}

def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    short = {}
    for raw, d in zip(names, out):
        d = d.strip() or raw
        if d.startswith("void "): d = d[5:]
        depth = 0  # drop the parameter list: the last top-level "(...)"
        for i in range(len(d) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(d[i], 0)
            if depth == 0 and d[i] == "(":
                d = d[:i]; break
        short[raw] = re.sub(r"\(WeightFormat\)", "", d)
    return short

def regs(op):  # "v[4:5]" -> {v4, v5}; "s7" -> {s7}
    m = re.match(r"([vsa])\[(\d+):(\d+)\]$", op)
    if m: return {f"{m.group(1)}{i}" for i in range(int(m.group(2)), int(m.group(3)) + 1)}
    m = re.match(r"([vsa])(\d+)$", op)
    return {op} if m else set()

def parse(path):
    """The kernels' metadata (the amdhsa.kernels list), code lines and "; Occupancy:"."""
    lines = open(path).read().split("\n")
    kernels, cur, in_meta = {}, None, False
    for l in lines:
        if l.startswith("amdhsa.kernels:"): in_meta = True; continue
        if in_meta and not l.startswith(" "): in_meta = False
        m = re.match(r"  (- |  )\.(\w+):\s*(\S*)", l) if in_meta else None
        if m and m.group(1) == "- ": cur = {}
        if m: cur[m.group(2)] = m.group(3)
        if m and m.group(2) == "name": kernels[m.group(3)] = cur
    bodies, occ, name, last = {}, {}, None, None
    for l in lines:
        m = re.match(r"^(\S+):", l)
        if m and m.group(1) in kernels: name = m.group(1); bodies[name] = []; continue
        if name and (l.startswith(".Lfunc_end") or re.match(r"\s*\.(section|amdhsa_kernel)\b", l)): name = None
        if name: bodies[name].append(l)
        m = re.match(r"\s*\.size\s+(\S+),", l)
        if m: last = m.group(1)  # the kernel info comments follow the kernel's .size
        m = re.match(r"; Occupancy: (\d+)", l)
        if m and last: occ[last] = m.group(1)
    return kernels, bodies, occ

def blocks_of(body):
    blocks, cur = [], None
    def new(label):
        nonlocal cur
        cur = {"label": label, "ins": [], "succ": [], "falls": True}
        blocks.append(cur)
    new("entry")
    for l in body:
        m = re.match(r"^(\.LBB\w+):", l)
        if m: new(m.group(1)); continue
        if re.match(r"^; %bb\.\d+:", l):
            if cur["ins"]: new(l.split(":")[0][2:])
            continue
        m = re.match(r"^\s+([a-z][a-z0-9_]*)\b(.*)", l)
        if not m or l.lstrip().startswith((".", ";")): continue
        op, args = m.group(1), m.group(2).split(";")[0].strip()
        if cur["succ"] or not cur["falls"]: new(None)
        cur["ins"].append((op, args))
        if op == "s_branch": cur["succ"].append(args); cur["falls"] = False; new(None)
        elif op.startswith("s_cbranch"): cur["succ"].append(args.split()[0]); new(None)
        elif op in ("s_endpgm", "s_setpc_b64"): cur["falls"] = False; new(None)
    blocks = [b for b in blocks if b["ins"] or b["label"]]
    index = {b["label"]: i for i, b in enumerate(blocks) if b["label"]}
    for i, b in enumerate(blocks):
        b["to"] = {index[s] for s in b["succ"] if s in index}
        if b["falls"] and i + 1 < len(blocks): b["to"].add(i + 1)
    return blocks

def sccs(nodes, blocks):
    """Tarjan's strongly connected components of the subgraph on `nodes`."""
    idx, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    def visit(v):
        idx[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in blocks[v]["to"]:
            if w not in nodes: continue
            if w not in idx: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = set()
            while True:
                w = stack.pop(); on.discard(w); comp.add(w)
                if w == v: break
            out.append(comp)
    sys.setrecursionlimit(100000)
    for v in sorted(nodes):
        if v not in idx: visit(v)
    return [c for c in out if len(c) > 1 or any(v in blocks[v]["to"] for v in c)]

def innermost(nodes, blocks):
    """Innermost loops: cycles with no cycle left once their header is taken out."""
    found = []
    for comp in sccs(nodes, blocks):
        heads = [v for v in sorted(comp) if v == 0 or any(v in blocks[u]["to"] for u in range(len(blocks)) if u not in comp)]
        head = heads[0] if heads else min(comp)
        inner = innermost(comp - {head}, blocks)
        found += inner if inner else [(head, comp)]
    return found

def loop_stats(head, comp, blocks):
    c = dict(valu=0, vmem=0, lds=0, smem=0, wait=0, salu=0)
    groups, version = {}, {}  # address operand -> [(offset, width)], bumped when written
    for i in sorted(comp):
        for op, args in blocks[i]["ins"]:
            ops = [a.strip() for a in args.split(",")]
            if op.startswith("v_"): c["valu"] += 1
            elif op.startswith(("global_", "buffer_", "flat_", "scratch_")): c["vmem"] += 1
            elif op.startswith("ds_"): c["lds"] += 1
            elif op.startswith(("s_load", "s_buffer_load")): c["smem"] += 1
            elif op.startswith("s_waitcnt"): c["wait"] += 1
            else: c["salu"] += 1
            m = re.match(r"(global|buffer|flat)_load_(?:lds_)?(\w+)$", op)
            if m and m.group(2) in WIDTH:
                parts = args.split(",")
                rest = " ".join(p.strip() for p in parts[1:])
                addr = " ".join(t for t in rest.split() if not t.startswith(ADDR_END))
                off = re.search(r"offset:(-?\d+)", rest)
                key = (addr, tuple(version.get(r, 0) for a in addr.split() for r in sorted(regs(a))))
                groups.setdefault(key, []).append((int(off.group(1)) if off else 0, WIDTH[m.group(2)]))
            if ops and not NO_DEST.match(op):
                for r in regs(ops[0]): version[r] = version.get(r, 0) + 1
    runs = [g for g in groups.values() if len({o for o, _ in g}) > 1]
    lone = [w for g in groups.values() if len({o for o, _ in g}) == 1 for _, w in g]
    W = max(lone) if lone else 0
    chunks = [w for w in lone if w == W]
    side = sorted((w for w in lone if w < W), reverse=True)
    c["total"] = sum(c.values())
    c["wbytes"] = sum(chunks) * WAVE
    runs_txt = [" + ".join(f"{ws.count(w)}x{w}B" for w in sorted(set(ws), reverse=True)) for ws in ([w for _, w in g] for g in runs)]
    c["loads"] = ", ".join(filter(None, [
        "x " + " + ".join(f"{runs_txt.count(r)}x({r})" if runs_txt.count(r) > 1 else r for r in dict.fromkeys(runs_txt)) if runs else "",
        f"w {len(chunks)}x{W}B" if chunks else "",
        "side " + " + ".join(f"{side.count(w)}x{w}B" for w in sorted(set(side), reverse=True)) if side else ""]))
    F = max((sum(w for _, w in g) // 4 for g in runs), default=0)
    if not runs: c["fmt"] = "element-wise (loads)"
    else:
        bits = 8 * W // F if F else 0
        name = {4: "MXFP4" if side else "4-bit", 8: "FP8", 16: "BF16", 32: "F32"}.get(bits, f"{bits}-bit")
        c["fmt"] = f"{name} (loads)"
    c["label"] = blocks[head]["label"] or f"block {head}"
    return c

def table(rows, head):
    w = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    out = ["| " + " | ".join(str(h).ljust(w[i]) for i, h in enumerate(head)) + " |",
           "|" + "|".join("-" * (x + 2) for x in w) + "|"]
    for r in rows: out.append("| " + " | ".join(str(v).ljust(w[i]) for i, v in enumerate(r)) + " |")
    return "\n".join(out)

results = []
for arg in sys.argv[1:]:
    target, path = arg.split("=", 1)
    kernels, bodies, occ = parse(path)
    short = demangle(list(kernels))
    rows, loops, checked = [], [], 0
    fails = {"spill": [], "call": [], "loops": [], "hot": []}
    for k in sorted(kernels, key=lambda n: short[n]):
        md = kernels[k]
        spills = int(md.get("sgpr_spill_count", 0)) + int(md.get("vgpr_spill_count", 0))
        scratch = int(md.get("private_segment_fixed_size", 0))
        rows.append([short[k], md.get("vgpr_count"), md.get("agpr_count", "0"), md.get("sgpr_count"),
                     f'{md.get("sgpr_spill_count", 0)}/{md.get("vgpr_spill_count", 0)}', scratch,
                     md.get("group_segment_fixed_size"), occ.get(k, "?")])
        if (spills or scratch or md.get("uses_dynamic_stack") == "true") and short[k] in PLAIN_ONLY:
            print(f"NOTE {target} {short[k]} (plain reference, GLM_GPU_KERNELS=plain only): {md.get('sgpr_spill_count')} SGPR and {md.get('vgpr_spill_count')} VGPR spills, {scratch} bytes of scratch")
        elif spills or scratch or md.get("uses_dynamic_stack") == "true":
            fails["spill"].append(f"{target} {short[k]}: {md.get('sgpr_spill_count')} SGPR and {md.get('vgpr_spill_count')} VGPR spills, {scratch} bytes of scratch")
        calls = [l.split()[-1] for l in bodies[k] if re.match(r"\s+s_swappc_b64", l)]
        if calls or any(re.search(r"__oc[km]l_|__atomic_work_item", l) for l in bodies[k]):
            fails["call"].append(f"{target} {short[k]}: {len(calls)} function calls left in the kernel")
        # the loop finder against LLVM's own loop comments, where it prints them
        blocks = blocks_of(bodies[k])
        mine = {blocks[h]["label"] for h, _ in innermost(set(range(len(blocks))), blocks)}
        llvm, label = set(), None
        for l in bodies[k]:
            m = re.match(r"(\.LBB\w+|; %bb\.\d+):", l)
            if m: label = m.group(1).lstrip("; ")
            if "Inner Loop Header" in l: llvm.add(label)
        if llvm and mine != llvm:
            fails["loops"].append(f"{target} {short[k]}: the innermost loops found ({' '.join(sorted(map(str, mine)))}) are not LLVM's ({' '.join(sorted(llvm))})")
        checked += bool(llvm)
        if short[k].startswith("k_gemv"):
            hot = [(h, c) for h, c in innermost(set(range(len(blocks))), blocks)
                   if any(re.match(r"(global|buffer|flat)_load", op) for i in c for op, _ in blocks[i]["ins"])]
            if not hot: fails["hot"].append(f"{target} {short[k]}: no hot loop found (a loop with global loads)")
            for h, c in sorted(hot):
                s = loop_stats(h, c, blocks)
                t = re.search(r"<\s*(\w+)", short[k])
                if t: s["fmt"] = FORMATS.get(t.group(1), t.group(1).replace("WF_", ""))
                per4k = lambda n: f"{n * 4096 / s['wbytes']:.0f}" if s["wbytes"] else "-"
                loops.append([short[k], s["label"], s["fmt"], s["loads"], s["valu"], f'{s["vmem"]}/{s["lds"]}/{s["smem"]}',
                              s["wait"], s["salu"], s["total"], s["wbytes"], per4k(s["total"]), per4k(s["valu"])])
    results.append((target, rows, fails, loops, len(kernels), checked))

for target, rows, fails, loops, n, checked in results:
    print(f"### {target}: {n} kernels\n")
    print(table(rows, ["kernel", "VGPRs", "AGPRs", "SGPRs", "spills s/v", "scratch B", "LDS B", "waves/SIMD"]) + "\n")
    print(f"### {target}: GEMV hot loops, per iteration (one wave)\n")
    print(table(loops, ["kernel", "loop", "format", "global loads / lane", "VALU", "mem v/lds/s", "waits", "SALU",
                        "total", "weight B", "instr / 4 KB", "VALU / 4 KB"]) + "\n")
for target, rows, fails, loops, n, checked in results:
    passed = {"spill": f"{target}: no scratch and no spills in the {n} kernels",
              "call": f"{target}: no function calls left in the kernels (threadIdx, barriers: registers and instructions)",
              "loops": f"{target}: the loop finder's innermost loops are LLVM's own (its loop comments, {checked} kernels with loops)",
              "hot": f"{target}: {len(loops)} GEMV hot loops, every k_gemv* kernel has one"}
    for what, msg in passed.items():
        for f in fails[what]: print(f"FAIL {f}")
        if not fails[what]: print(f"PASS {msg}")
PY
rc=$?
grep -v -E '^(PASS|FAIL) ' "$OUT/report.txt"
grep -E '^(PASS|FAIL) ' "$OUT/report.txt"
pass=$((pass + $(grep -c '^PASS ' "$OUT/report.txt"))); fail=$((fail + $(grep -c '^FAIL ' "$OUT/report.txt")))
[ $rc -eq 0 ] || bad "report" "the analysis stopped (exit $rc)"
finish
