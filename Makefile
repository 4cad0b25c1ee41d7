# glm.c - build with nothing but a C compiler and libc (+ OpenMP for two cores).
CC      ?= cc
CFLAGS  ?= -O2 -march=native
WARN     = -std=c11 -Wall -Wextra
OMP     ?= -fopenmp
SRC      = glm.c json.c
HDR      = glm.h json.h

glm: $(SRC) $(HDR)
	$(CC) $(WARN) $(CFLAGS) $(OMP) -o $@ $(SRC) -lm

# The same program under AddressSanitizer + UndefinedBehaviorSanitizer.
glm_asan: $(SRC) $(HDR)
	$(CC) $(WARN) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined $(OMP) -o $@ $(SRC) -lm

test: glm
	./test.sh

test-asan: glm_asan
	GLM=./glm_asan SAN=1 ./test.sh

clean:
	rm -f glm glm_asan

.PHONY: test test-asan clean
