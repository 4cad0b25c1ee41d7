# glm.c - build with nothing but a C compiler and libc (+ OpenMP for two cores).
CC      ?= cc
CFLAGS  ?= -O2
WARN     = -std=c11 -Wall -Wextra
OMP     ?= -fopenmp
SRC      = cli.c glm.c model.c fast.c simd.c tokenizer.c json.c tools/bench.c tools/synth.c tools/convert.c
HDR      = glm.h json.h tokenizer.h tokenizer_unicode.h

glm: $(SRC) $(HDR)
	$(CC) $(WARN) $(CFLAGS) $(OMP) -o $@ $(SRC) -lm

# The same program under AddressSanitizer + UndefinedBehaviorSanitizer.
glm_asan: $(SRC) $(HDR)
	$(CC) $(WARN) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined $(OMP) -o $@ $(SRC) -lm

test: glm
	./test.sh

# A random model with GLM-5.2's real vocabulary and tokenizer, a few MB: the whole
# pipeline (tokenizer, chat template, forward pass, sampling) runs; the text is noise.
TOKENIZER_JSON ?= ../shared/data/glm-5.2-tokenizer/tokenizer.json
demo: glm
	@test -f $(TOKENIZER_JSON) || { echo "make demo: $(TOKENIZER_JSON) not found (set TOKENIZER_JSON=path/to/tokenizer.json)"; exit 1; }
	./glm synth demo_model --tiny --tokenizer $(TOKENIZER_JSON)
	printf 'Hello! Who are you?\nWhat is 2+2?\n' | ./glm chat -m demo_model -n 24 --seed 1

# The same suites under ASan + UBSan. test_threads is left out: it checks that thread
# counts change no bit (races), which ASan does not look for, and it is the slowest there.
test-asan: glm_asan
	GLM=./glm_asan SAN=1 SKIP="threads" ./test.sh

# GPU builds: the same program (-DGLM_GPU: --gpu, --gpus N) plus glm_hip.hip, one
# kernel source for three targets (see the top of glm_hip.hip):
#   make hip   hipcc for AMD; GPU_ARCH=gfx942,gfx950 (MI300X, MI355X) or e.g. gfx90a
#   make cuda  nvcc for NVIDIA; CUDA_ARCH=sm_90 (H100/H200)
#   make emu   ./glm_emu: the kernels as C++ on the CPU under tests/hip_emu.h, WARP=64 or 32
# build/gpu_ktest{64,32,_hip,_cuda}: the kernel tests (tests/gpu/kernel_test.c) per build.
GPU_ARCH  ?= gfx942,gfx950
CUDA_ARCH ?= sm_90
HIPCC     ?= hipcc
NVCC      ?= nvcc
CXX       ?= c++
WARP      ?= 64
HIPFLAGS  ?= -O3
NVFLAGS   ?= -O3
comma     := ,
HIP_ARCHS  = $(foreach a,$(subst $(comma), ,$(GPU_ARCH)),--offload-arch=$(a))
GPU_COBJ   = $(SRC:%.c=build/gpu/%.o)
KTEST_COBJ = $(filter-out build/gpu/glm.o build/gpu/cli.o,$(GPU_COBJ)) build/gpu/kernel_test.o

build/gpu/%.o: %.c
	@mkdir -p build/gpu
	$(CC) $(WARN) $(CFLAGS) $(OMP) -DGLM_GPU -MMD -MP -c $< -o $@
build/gpu/kernel_test.o: tests/gpu/kernel_test.c
	@mkdir -p build/gpu
	$(CC) $(WARN) $(CFLAGS) $(OMP) -I. -MMD -MP -c $< -o $@
-include $(wildcard build/gpu/*.d)

build/hip/glm_hip.o: glm_hip.hip glm.h
	@mkdir -p build/hip
	$(HIPCC) -std=c++17 $(HIPFLAGS) $(HIP_ARCHS) -Wall -Wextra -x hip -c glm_hip.hip -o $@
build/cuda/glm_hip.o: glm_hip.hip glm.h
	@mkdir -p build/cuda
	$(NVCC) -std=c++17 $(NVFLAGS) -arch=$(CUDA_ARCH) -x cu -c glm_hip.hip -o $@
build/emu%/glm_hip.o: glm_hip.hip glm.h tests/hip_emu.h
	@mkdir -p build/emu$*
	$(CXX) -std=c++17 -O2 -g -Wall -Wextra -DGLM_EMU -DWARP=$* -pthread -x c++ -c glm_hip.hip -o $@

hip: glm_hip
glm_hip: $(GPU_COBJ) build/hip/glm_hip.o
	$(HIPCC) $(HIP_ARCHS) -o $@ $^ -lgomp -lm
build/gpu_ktest_hip: $(KTEST_COBJ) build/hip/glm_hip.o
	$(HIPCC) $(HIP_ARCHS) -o $@ $^ -lgomp -lm

cuda: glm_cuda
glm_cuda: $(GPU_COBJ) build/cuda/glm_hip.o
	$(NVCC) -arch=$(CUDA_ARCH) -o $@ $^ -lgomp -lm
build/gpu_ktest_cuda: $(KTEST_COBJ) build/cuda/glm_hip.o
	$(NVCC) -arch=$(CUDA_ARCH) -o $@ $^ -lgomp -lm

# glm_emu64 / glm_emu32 are the two wave widths; make emu copies the WARP one to ./glm_emu
glm_emu64 glm_emu32: glm_emu%: $(GPU_COBJ) build/emu%/glm_hip.o
	$(CXX) -pthread $(OMP) -o $@ $^ -lm
build/gpu_ktest64 build/gpu_ktest32: build/gpu_ktest%: $(KTEST_COBJ) build/emu%/glm_hip.o
	$(CXX) -pthread $(OMP) -o $@ $^ -lm
emu: glm_emu$(WARP)
	cp glm_emu$(WARP) glm_emu

# libFuzzer targets (clang + libclang-rt-14-dev on Debian); see fuzz/README.md.
# fuzz_checkpoint links the whole program, main() renamed so libFuzzer's main links, and
# without OpenMP (the loader checks are serial; clang's outlined omp regions would lack
# simd.c's target attributes). json.c uses a small first arena block (faster, and it
# exercises block growth). make fuzz does not touch glm / glm_asan.
FUZZCC    ?= $(shell command -v clang-14 >/dev/null 2>&1 && echo clang-14 || echo clang)
FUZZFLAGS  = -std=c11 -Wall -Wextra -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
             -fno-sanitize-recover=undefined -DJSON_FIRST_BLOCK=4096
FUZZ_BINS  = fuzz/bin/fuzz_json fuzz/bin/fuzz_checkpoint fuzz/bin/fuzz_tokenizer_load fuzz/bin/fuzz_encode

fuzz: $(FUZZ_BINS)

fuzz/bin/fuzz_json: fuzz/fuzz_json.c json.c json.h
	@mkdir -p fuzz/bin
	$(FUZZCC) $(FUZZFLAGS) -o $@ fuzz/fuzz_json.c json.c

fuzz/bin/fuzz_checkpoint: fuzz/fuzz_checkpoint.c $(SRC) $(HDR)
	@mkdir -p fuzz/bin
	$(FUZZCC) $(FUZZFLAGS) -Dmain=glm_cli_main -o $@ fuzz/fuzz_checkpoint.c $(SRC) -lm

fuzz/bin/fuzz_tokenizer_load: fuzz/fuzz_tokenizer_load.c tokenizer.c json.c tokenizer.h tokenizer_unicode.h json.h
	@mkdir -p fuzz/bin
	$(FUZZCC) $(FUZZFLAGS) -o $@ fuzz/fuzz_tokenizer_load.c tokenizer.c json.c

fuzz/bin/fuzz_encode: fuzz/fuzz_encode.c tokenizer.c json.c tokenizer.h tokenizer_unicode.h json.h
	@mkdir -p fuzz/bin
	$(FUZZCC) $(FUZZFLAGS) -o $@ fuzz/fuzz_encode.c tokenizer.c json.c

clean:
	rm -f glm glm_asan glm_hip glm_cuda glm_emu glm_emu32 glm_emu64
	rm -rf build/gpu build/hip build/cuda build/emu32 build/emu64 build/gpu_ktest*
	rm -rf fuzz/bin

# The benchmark of issue 6: a 2-layer checkpoint with GLM-5.2's widths (layer 0 dense,
# layer 1 with 64 MXFP4 experts + shared expert, BF16 attention, 8-bit embed/lm_head).
BENCH_DIR ?= bench_model
bench: glm
	test -f $(BENCH_DIR)/config.json || ./glm synth $(BENCH_DIR) --layers 2 --experts 64
	./glm bench -m $(BENCH_DIR)

.PHONY: test test-asan clean demo bench fuzz hip cuda emu
