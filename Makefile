# glm.c - build with nothing but a C compiler and libc (+ OpenMP for two cores).
CC      ?= cc
CFLAGS  ?= -O2
WARN     = -std=c11 -Wall -Wextra
OMP     ?= -fopenmp
LIBS     = -lm -pthread
SRC      = cli.c glm.c spec.c serve.c model.c fast.c simd.c tokenizer.c json.c http.c tools/bench.c tools/synth.c tools/convert.c \
           tools/loadgen.c tools/plan.c
HDR      = glm.h json.h tokenizer.h tokenizer_unicode.h http.h

glm: $(SRC) $(HDR)
	$(CC) $(WARN) $(CFLAGS) $(OMP) -o $@ $(SRC) $(LIBS)

# The same program under AddressSanitizer + UndefinedBehaviorSanitizer, from one object per
# source so that make -j compiles them side by side (simd.c's unrolled kernels alone take
# ~20 s with the checks). -O2: the suites run ~25% faster under the sanitizers than at -O1.
ASAN_FLAGS = -O2 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
ASAN_OBJ   = $(patsubst %.c,build/asan/%.o,$(SRC))
build/asan/%.o: %.c $(HDR)
	@mkdir -p $(@D)
	$(CC) $(WARN) $(ASAN_FLAGS) $(OMP) -c -o $@ $<
glm_asan: $(ASAN_OBJ)
	$(CC) $(ASAN_FLAGS) $(OMP) -o $@ $(ASAN_OBJ) $(LIBS)

test: glm
	./test.sh

# What the tests need (Debian 12 packages and one npm fixture): make deps test
deps:
	sh tests/install-deps.sh

# GLM-5.2's tokenizer ships compressed in data/glm-5.2-tokenizer/ (MIT, see its README.md);
# the build unpacks it once. glm synth writes it into every checkpoint it makes, the tests
# read it. Order-only: a newer tokenizer.json does not relink the programs.
build/tokenizer.json: data/glm-5.2-tokenizer/tokenizer.json.gz
	@mkdir -p build
	gzip -dc $< > $@.tmp && mv $@.tmp $@
glm glm_asan test test-asan demo: | build/tokenizer.json

# A random model with GLM-5.2's real vocabulary and tokenizer, a few MB: the whole
# pipeline (tokenizer, chat template, forward pass, sampling) runs; the text is noise.
TOKENIZER_JSON ?= build/tokenizer.json
demo: glm
	@test -f $(TOKENIZER_JSON) || { echo "make demo: $(TOKENIZER_JSON) not found (set TOKENIZER_JSON=path/to/tokenizer.json)"; exit 1; }
	rm -rf demo_model
	./glm synth demo_model --tiny --tokenizer $(TOKENIZER_JSON)
	printf 'Hello! Who are you?\nWhat is 2+2?\n' | ./glm chat -m demo_model -n 24 --seed 1

# The same suites under ASan + UBSan. Left out: test_threads, which checks that thread
# counts change no bit (races), which ASan does not look for; and test_gpu_emu, whose GPU
# emulation binaries are not sanitizer builds, so a second pass would repeat the first
# (CI's 15-minute budget).
test-asan:
	$(MAKE) -j$$(nproc 2>/dev/null || echo 2) glm_asan
	GLM=./glm_asan SAN=1 SKIP="threads gpu_emu" ./test.sh

# GPU builds: the same program (-DGLM_GPU: --gpu, --gpus N) plus glm_hip.hip, one
# kernel source for three targets (see the top of glm_hip.hip):
#   make hip   hipcc for AMD; GPU_ARCH=gfx942,gfx950 (MI300X, MI355X) or e.g. gfx90a
#   make cuda  nvcc for NVIDIA; CUDA_ARCH=sm_90 (H100/H200)
#   make emu   ./glm_emu: the kernels as C++ on the CPU under tests/hip_emu.h, WARP=64 or 32
# Every GPU target builds in its own folder, $(HIP_DIR) = build/hip-<GPU_ARCH, commas as
# dashes> and $(CUDA_DIR) = build/cuda-<CUDA_ARCH>: glm_hip.o, the program (glm_hip or
# glm_cuda) and its kernel test gpu_ktest (tests/gpu/kernel_test.c). The file `flags`
# there holds the exact compiler and flags; a build with another HIPCC/HIPFLAGS (NVCC/
# NVFLAGS) rewrites it and so recompiles (build/gpu/flags: CC/CFLAGS of the shared C
# objects; build/emu.flags: CXX). make hip / make cuda point ./glm_hip / ./glm_cuda
# (symlinks) at the folder of the target asked for and print it; make hip-dir / cuda-dir
# print the folder (tests/gpu_check.sh). build/gpu_ktest{64,32}: the emulation's kernel tests;
# build/gpu_ktest_gfx950 / _gfx942 the same at wave 64 with those GPUs' conversion paths.
MAIN_SRC   = cli.c# the file with main() (left out of the kernel tests)
GPU_ARCH  ?= gfx942,gfx950
CUDA_ARCH ?= sm_90
HIPCC     ?= hipcc
NVCC      ?= nvcc
CXX       ?= c++
WARP      ?= 64
HIPFLAGS  ?= -O3
NVFLAGS   ?= -O3
comma     := ,
empty     :=
space     := $(empty) $(empty)
HIP_ARCHS  = $(foreach a,$(subst $(comma), ,$(GPU_ARCH)),--offload-arch=$(a))
HIP_DIR    = build/hip-$(subst :,_,$(subst $(space),-,$(strip $(subst $(comma), ,$(GPU_ARCH)))))
CUDA_DIR   = build/cuda-$(strip $(CUDA_ARCH))
GPU_COBJ   = $(SRC:%.c=build/gpu/%.o)
# the kernel tests: all but main() (MAIN_SRC) and glm.c, which tests/gpu/kernel_test.c includes whole
KTEST_COBJ = $(filter-out $(patsubst %.c,build/gpu/%.o,$(MAIN_SRC) glm.c),$(GPU_COBJ)) build/gpu/kernel_test.o
# the compile commands, as the flags files record them
GPU_CC_CMD = $(strip $(CC) $(WARN) $(CFLAGS) $(OMP))
HIP_CMD    = $(strip $(HIPCC) -std=c++17 $(HIPFLAGS) $(HIP_ARCHS) -Wall -Wextra -x hip)
CUDA_CMD   = $(strip $(NVCC) -std=c++17 $(NVFLAGS) -arch=$(CUDA_ARCH) -x cu)
EMU_CMD    = $(strip $(CXX) -std=c++17 -O2 -g -Wall -Wextra -DGLM_EMU -pthread -x c++)
# $(call gpu_flags_dep,FILE,TEXT): FORCE if FILE does not hold TEXT yet, else nothing;
# the flags rules below then rewrite FILE only when the command changed (so make -q and
# make -n stay exact, and an unchanged command rebuilds nothing).
gpu_flags_old = $(strip $(shell cat $(1) 2>/dev/null))
gpu_flags_dep = $(if $(subst $(2),,$(call gpu_flags_old,$(1)))$(subst $(call gpu_flags_old,$(1)),,$(2)),FORCE)
gpu_flags_write = @mkdir -p $(@D) && printf '%s\n' '$(subst ','\'',$(1))' >$@

build/gpu/flags: $(call gpu_flags_dep,build/gpu/flags,$(GPU_CC_CMD))
	$(call gpu_flags_write,$(GPU_CC_CMD))
$(HIP_DIR)/flags: $(call gpu_flags_dep,$(HIP_DIR)/flags,$(HIP_CMD))
	$(call gpu_flags_write,$(HIP_CMD))
$(CUDA_DIR)/flags: $(call gpu_flags_dep,$(CUDA_DIR)/flags,$(CUDA_CMD))
	$(call gpu_flags_write,$(CUDA_CMD))
build/emu.flags: $(call gpu_flags_dep,build/emu.flags,$(EMU_CMD))
	$(call gpu_flags_write,$(EMU_CMD))
FORCE:

build/gpu/%.o: %.c build/gpu/flags
	@mkdir -p $(@D)
	$(GPU_CC_CMD) -DGLM_GPU -MMD -MP -c $< -o $@
build/gpu/kernel_test.o: tests/gpu/kernel_test.c build/gpu/flags
	@mkdir -p $(@D)
	$(GPU_CC_CMD) -I. -MMD -MP -c $< -o $@
-include $(wildcard $(GPU_COBJ:.o=.d) build/gpu/kernel_test.d)

$(HIP_DIR)/glm_hip.o: glm_hip.hip glm.h $(HIP_DIR)/flags
	$(HIP_CMD) -c glm_hip.hip -o $@
$(CUDA_DIR)/glm_hip.o: glm_hip.hip glm.h $(CUDA_DIR)/flags
	$(CUDA_CMD) -c glm_hip.hip -o $@
build/emu-gfx950/glm_hip.o build/emu-gfx942/glm_hip.o: build/emu-%/glm_hip.o: glm_hip.hip glm.h tests/hip_emu.h build/emu.flags
	@mkdir -p $(@D)
	$(EMU_CMD) -DWARP=64 -DGLM_EMU_$(shell echo $* | tr a-z A-Z) -c glm_hip.hip -o $@
build/emu%/glm_hip.o: glm_hip.hip glm.h tests/hip_emu.h build/emu.flags
	@mkdir -p $(@D)
	$(EMU_CMD) -DWARP=$* -c glm_hip.hip -o $@

$(HIP_DIR)/glm_hip: $(GPU_COBJ) $(HIP_DIR)/glm_hip.o
	$(HIPCC) $(HIP_ARCHS) -o $@ $^ -lgomp -lm
$(HIP_DIR)/gpu_ktest: $(KTEST_COBJ) $(HIP_DIR)/glm_hip.o
	$(HIPCC) $(HIP_ARCHS) -o $@ $^ -lgomp -lm
hip glm_hip: $(HIP_DIR)/glm_hip
	@ln -sfn $(HIP_DIR)/glm_hip glm_hip
	@echo "make hip: ./glm_hip -> $(HIP_DIR)/glm_hip, for $(GPU_ARCH): $(HIP_CMD)"

$(CUDA_DIR)/glm_cuda: $(GPU_COBJ) $(CUDA_DIR)/glm_hip.o
	$(NVCC) -arch=$(CUDA_ARCH) -o $@ $^ -lgomp -lm
$(CUDA_DIR)/gpu_ktest: $(KTEST_COBJ) $(CUDA_DIR)/glm_hip.o
	$(NVCC) -arch=$(CUDA_ARCH) -o $@ $^ -lgomp -lm
cuda glm_cuda: $(CUDA_DIR)/glm_cuda
	@ln -sfn $(CUDA_DIR)/glm_cuda glm_cuda
	@echo "make cuda: ./glm_cuda -> $(CUDA_DIR)/glm_cuda, for $(CUDA_ARCH): $(CUDA_CMD)"

hip-dir:
	@echo $(HIP_DIR)
cuda-dir:
	@echo $(CUDA_DIR)

# glm_emu64 / glm_emu32 are the two wave widths; make emu copies the WARP one to ./glm_emu
glm_emu64 glm_emu32: glm_emu%: $(GPU_COBJ) build/emu%/glm_hip.o
	$(CXX) -pthread $(OMP) -o $@ $^ -lm
# the emulator's own checks (block order, GLM_EMU_RACECHECK), tests/gpu/emu_selftest.cpp
build/emu_selftest: tests/gpu/emu_selftest.cpp tests/hip_emu.h build/emu.flags
	@mkdir -p $(@D)
	$(EMU_CMD) -DWARP=64 tests/gpu/emu_selftest.cpp -o $@
build/gpu_ktest64 build/gpu_ktest32: build/gpu_ktest%: $(KTEST_COBJ) build/emu%/glm_hip.o
	$(CXX) -pthread $(OMP) -o $@ $^ -lm
# the kernel tests of the code only gfx950 (MI355X) or gfx942 (MI300X) runs: their conversion instructions, emulated
build/gpu_ktest_gfx950 build/gpu_ktest_gfx942: build/gpu_ktest_%: $(KTEST_COBJ) build/emu-%/glm_hip.o
	$(CXX) -pthread $(OMP) -o $@ $^ -lm
emu: glm_emu$(WARP)
	cp glm_emu$(WARP) glm_emu
.PHONY: hip cuda emu glm_hip glm_cuda hip-dir cuda-dir FORCE

# libFuzzer targets (clang + libclang-rt-14-dev on Debian); see fuzz/README.md.
# fuzz_checkpoint links the whole program, main() renamed so libFuzzer's main links, and
# without OpenMP (the loader checks are serial; clang's outlined omp regions would lack
# simd.c's target attributes). json.c uses a small first arena block (faster, and it
# exercises block growth). make fuzz does not touch glm / glm_asan.
FUZZCC    ?= $(shell command -v clang-14 >/dev/null 2>&1 && echo clang-14 || echo clang)
FUZZSAN    = -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZFLAGS  = -std=c11 -Wall -Wextra -g -O1 -fno-omit-frame-pointer $(FUZZSAN) -DJSON_FIRST_BLOCK=4096
FUZZ_BINS  = fuzz/bin/fuzz_json fuzz/bin/fuzz_checkpoint fuzz/bin/fuzz_tokenizer_load fuzz/bin/fuzz_encode fuzz/bin/fuzz_chat fuzz/bin/fuzz_http \
             fuzz/bin/fuzz_request

fuzz: $(FUZZ_BINS)

# Each source compiles once (instrumented for libFuzzer, not linked with its main) and the
# targets link what they need; cli.c's main() is renamed so libFuzzer's links.
FUZZ_OBJ = $(patsubst %.c,fuzz/obj/%.o,$(1))
fuzz/obj/%.o: %.c $(HDR)
	@mkdir -p $(dir $@)
	$(FUZZCC) $(FUZZFLAGS) -fsanitize=fuzzer-no-link -Dmain=glm_cli_main -c -o $@ $<
fuzz/bin/%: fuzz/%.c
	@mkdir -p fuzz/bin
	$(FUZZCC) $(FUZZFLAGS) -fsanitize=fuzzer -o $@ $< $(filter %.o,$^) $(LIBS)

# The fuzz targets never run simd.c's kernels (fuzz_checkpoint links them for the loader):
# UBSan's pointer checks of their unrolled loops were 25 of the 60 s its compile took.
fuzz/obj/simd.o: FUZZSAN += -fno-sanitize=pointer-overflow

fuzz/bin/fuzz_json: $(call FUZZ_OBJ,json.c)
fuzz/bin/fuzz_checkpoint: $(call FUZZ_OBJ,$(SRC))
fuzz/bin/fuzz_tokenizer_load fuzz/bin/fuzz_chat fuzz/bin/fuzz_encode: $(call FUZZ_OBJ,tokenizer.c json.c)
fuzz/bin/fuzz_http: $(call FUZZ_OBJ,http.c json.c)
# serve.c's request parsing and responses; the target includes serve.c whole (its functions are static)
fuzz/bin/fuzz_request: $(call FUZZ_OBJ,$(filter-out serve.c,$(SRC))) serve.c | build/tokenizer.json

# The static ISA report (tests/gpu_isa_report.sh): registers, spills, LDS and waves per SIMD of
# every kernel for gfx942 and gfx950, and the GEMV hot loops' instructions per 4 KB of weights,
# from clang-22's assembly with the ROCm device libraries linked. No GPU needed.
isa-report:
	bash tests/gpu_isa_report.sh

clean:
	rm -f glm glm_asan glm_hip glm_cuda glm_emu glm_emu32 glm_emu64
	rm -rf build/asan build/gpu build/hip build/cuda build/hip-* build/cuda-* build/emu32 build/emu64 build/emu.flags build/gpu_ktest* build/compile_check build/isa_report
	rm -rf fuzz/bin fuzz/obj

# The benchmark of issue 6: a 2-layer checkpoint with GLM-5.2's widths (layer 0 dense,
# layer 1 with 64 MXFP4 experts + shared expert, BF16 attention, 8-bit embed/lm_head).
BENCH_DIR ?= bench_model
bench: glm
	test -f $(BENCH_DIR)/config.json || ./glm synth $(BENCH_DIR) --layers 2 --experts 64
	./glm bench -m $(BENCH_DIR)

# glm serve under load (glm loadgen, tools/loadgen.c): 8 clients, prompts sharing a 60% prefix,
# then one client alone (no shared prefix) for the single-stream speed to compare with, then
# the decode alone: 8 sequences against one (tools/serve_ratio.sh, issue 34's ratio).
bench-serve: glm
	test -f $(BENCH_DIR)/config.json || ./glm synth $(BENCH_DIR) --layers 2 --experts 64
	./glm serve -m $(BENCH_DIR) --port 8091 --parallel 8 & pid=$$!; trap 'kill $$pid 2>/dev/null' EXIT; \
	up=0; for i in $$(seq 120); do curl -sf http://127.0.0.1:8091/health >/dev/null && { up=1; break; }; \
	    kill -0 $$pid 2>/dev/null || break; sleep 1; done; \
	[ $$up = 1 ] || { echo "make bench-serve: glm serve exited, or did not answer GET /health within 120 s"; exit 1; }; \
	rc=0; ./glm loadgen http://127.0.0.1:8091 --input 2000 --output 100 --shared 0.6 --concurrency 8 --requests 32 || rc=1; \
	echo "make bench-serve: one client alone, for the ratio:"; \
	./glm loadgen http://127.0.0.1:8091 --input 2000 --output 100 --shared 0 --concurrency 1 --requests 4 || rc=1; \
	kill $$pid; wait $$pid 2>/dev/null; \
	echo "make bench-serve: decode alone, 8 sequences against one (issue 34's ratio):"; \
	tools/serve_ratio.sh $(BENCH_DIR) 3 || rc=1; \
	echo "make bench-serve: time to first token, 60% of the prompt from the cache against none (issue 34's ratio):"; \
	tools/serve_ttft.sh $(BENCH_DIR) 2 || rc=1; \
	exit $$rc

.PHONY: test test-asan clean demo bench bench-serve fuzz hip cuda emu deps isa-report
