# pollen — a plain Makefile that probes the toolchain.
#   make            build build/pollen (CPU backend; the CUDA backend too where nvcc exists, as
#                   build/libpollen-cuda.so beside it, loaded on --backend cuda; CUDA=0 turns it off)
#   make test       build and run every test (GPU-free), ends with "N passed, N failed"
#   make demo       reshard a small built-in model to TP 2 int8 and generate with its 2 ranks
#   make deps       install the Debian packages pollen needs (idempotent)
#   make fuzz       build the libFuzzer targets with clang and run each for a bounded time
#   make test-gpu   op checks and end-to-end tests on the CUDA backend (SKIP without a GPU)
#   make emu        the CUDA kernels built for the CPU harness (build/emu/; make test runs them)
#   make sass-tools cuobjdump + nvdisasm (PyPI wheels) into build/sass-tools for the SASS checks
#   SANITIZE=address,undefined   checked build (in build-san/)

CC      ?= cc
BUILD   ?= build
SANITIZE ?=
OPT     ?= -O2
DEBIAN_PKGS := build-essential pkg-config libjansson-dev libarchive-dev zlib1g-dev libxxhash-dev \
               libpcre2-dev libutf8proc-dev libmicrohttpd-dev libopenmpi-dev openmpi-bin python3 curl
# network namespaces for the multi-host test (tests/e2e_multihost.sh)
DEBIAN_PKGS += iproute2
# clang++ compiles the CUDA kernels for the CPU execution harness (kernels/cuda/emu) that make test runs
DEBIAN_PKGS += clang
# GNU time: tests count a process's page faults (what it touched), not its seconds
DEBIAN_PKGS += time

MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)

CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -fopenmp -pthread \
           -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -I. $(MPI_CFLAGS)
LDLIBS  += $(MPI_LIBS) -ljansson -larchive -lz -lxxhash -lpcre2-8 -lutf8proc -lmicrohttpd -lm -fopenmp -pthread

ifneq ($(SANITIZE),)
  BUILD   := build-san
  CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
  LDFLAGS += -fsanitize=$(SANITIZE)
  CUDA    := 0
endif

# CUDA: probe for nvcc; CUDA=0 turns it off.
NVCC ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
ifeq ($(NVCC),)
  CUDA ?= 0
else
  CUDA ?= 1
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCHS ?= -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a
NVCCFLAGS ?= -O3 -g -std=c++17 $(CUDA_ARCHS) -Werror all-warnings \
             -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter,-fPIC -I. -DPLN_HAVE_CUDA=1

LIB_SRCS  := $(sort $(wildcard formats/*.c runtime/*.c kernels/*.c kernels/cpu/*.c))
TOOL_SRCS := $(sort $(wildcard tools/*.c))
TEST_SRCS := $(sort $(wildcard tests/test_*.c))
FUZZ_SRCS := $(sort $(wildcard tests/fuzz/fuzz_*.c))
CU_SRCS   := $(sort $(wildcard kernels/cuda/*.cu))
CUC_SRCS  := $(sort $(wildcard kernels/cuda/*.c))

# The CUDA backend (kernels/cuda/*.cu + NCCL) is built into $(BUILD)/libpollen-cuda.so, the only
# thing that links cudart/cuBLASLt/NCCL: pollen opens it beside itself on --backend cuda
# (kernels/backend.c), so the CPU path never loads them and runs where they are absent. pollen is
# linked with every libpollen object and exports them (-rdynamic) for the library's references.
# The GPU test binaries link the CUDA objects directly.
ifeq ($(CUDA),1)
  CFLAGS   += -DPLN_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lnccl -lcudart -lstdc++
  CU_OBJS  := $(CU_SRCS:%.cu=$(BUILD)/%.cu.o) $(CUC_SRCS:%.c=$(BUILD)/%.o)
  CUDA_SO  := $(BUILD)/libpollen-cuda.so
  POLLEN_LIB := -rdynamic -Wl,--whole-archive $(BUILD)/libpollen.a -Wl,--no-whole-archive
endif
LDLIBS    += -ldl
POLLEN_LIB ?= $(BUILD)/libpollen.a

LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/%.o)
TOOL_OBJS := $(TOOL_SRCS:%.c=$(BUILD)/%.o)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
GPU_TEST_SRCS := $(sort $(wildcard tests/gpu/*.c))
GPU_TEST_BINS := $(if $(filter 1,$(CUDA)),$(GPU_TEST_SRCS:tests/gpu/%.c=$(BUILD)/tests-gpu/%))
LIB       := $(BUILD)/libpollen.a

.PHONY: all deps test test-gpu test-clients demo fuzz clean bench
all: $(BUILD)/pollen

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# GET /openapi.json serves docs/openapi.json, built into this object (.incbin).
$(BUILD)/runtime/openapi.o: docs/openapi.json

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/pollen: $(TOOL_OBJS) $(LIB) $(CUDA_SO)
	$(CC) $(LDFLAGS) $(TOOL_OBJS) $(POLLEN_LIB) $(LDLIBS) -o $@

# formats/tp.c's SIMD conversions give the bits of its plain C code: no multiply-add contraction
# (target("avx512f") implies FMA, and GCC fuses separate multiply and add intrinsics by default).
$(BUILD)/formats/tp.o: CFLAGS += -ffp-contract=off

# Position-independent: nccl.c goes into the shared object (nvcc gets -fPIC in NVCCFLAGS).
$(CUC_SRCS:%.c=$(BUILD)/%.o): CFLAGS += -fPIC

$(BUILD)/libpollen-cuda.so: $(CU_OBJS)
	$(CC) -shared $(LDFLAGS) $(CU_OBJS) $(CUDA_LDLIBS) -o $@

$(BUILD)/tests/%: tests/%.c $(LIB) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

# The batch-1 GEMV bandwidth microbenchmark (tools/bench/gemv-bw.c): pollen's kernels from the library.
$(BUILD)/bench/gemv-bw: tools/bench/gemv-bw.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

# test_fuzz_regress compiles the fuzz targets in: rebuild it when one changes.
$(BUILD)/tests/test_fuzz_regress: $(FUZZ_SRCS)

$(BUILD)/tests-gpu/%: tests/gpu/%.c $(LIB) $(CU_OBJS) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(CU_OBJS) $(LIB) $(LDLIBS) $(CUDA_LDLIBS) -o $@

# Install missing Debian packages (idempotent: asks apt only when something is missing).
deps:
	@missing=""; for p in $(DEBIAN_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# The GPU test binaries are built here too (they only compile where there is no GPU): a test
# that no longer compiles is caught before the one GPU run that would need it.
test: deps
	$(MAKE) --no-print-directory $(BUILD)/pollen $(TEST_BINS) $(GPU_TEST_BINS) emu
	@BUILD=$(BUILD) tests/run.sh

# The real Python clients (PyPI) against a real server; make test stays Python-free.
CLIENT_PKGS := python3-venv
test-clients: deps
	@for p in $(CLIENT_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	$(MAKE) --no-print-directory $(BUILD)/pollen $(BUILD)/tests/test_shard
	@BUILD=$(BUILD) tests/clients/run.sh

test-gpu: deps
	$(MAKE) --no-print-directory $(BUILD)/pollen $(TEST_BINS) $(GPU_TEST_BINS)
	@BUILD=$(BUILD) CUDA=$(CUDA) tests/run-gpu.sh

# cuobjdump and nvdisasm for tests/e2e_sass.sh (the toolkit here lacks them); never fails, the
# test SKIPs without them. `make test` itself never needs Python.
.PHONY: sass-tools
sass-tools:
	@tools/sass-tools.sh

demo: deps
	$(MAKE) --no-print-directory $(BUILD)/pollen
	@BUILD=$(BUILD) tools/demo.sh

FUZZ_CC ?= clang
FUZZ_SECONDS ?= 20
fuzz: deps
	@BUILD=build-fuzz FUZZ_CC=$(FUZZ_CC) FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh

clean:
	rm -rf build build-san build-fuzz

# ---- the CUDA kernels on the CPU (kernels/cuda/emu, docs/CUDA.md "Running the kernels on the CPU")
# Every kernels/cuda/*.cu is compiled as host C++ by clang++ against the CUDA headers (no nvcc, no
# GPU), its loads and stores traced for the shared-memory checks, and linked into $(BUILD)/emu/:
# the op checks, the harness's self-test, the engine e2e test and a pollen binary. Built wherever
# clang++ and the CUDA headers exist, SANITIZE builds included (EMU=0 turns it off); make test
# runs it. Never linked with libcudart/cuBLASLt/NCCL: the harness provides the runtime.
EMU_CXX ?= clang++
EMU_CUDA_INC ?= $(patsubst %/cuda_runtime.h,%,$(firstword $(wildcard $(CUDA_HOME)/include/cuda_runtime.h \
                  /usr/local/cuda/include/cuda_runtime.h /usr/include/cuda_runtime.h)))
# (x86-64 only: the fibers switch with x86-64 code; clang 14 or newer for trace-loads/stores)
ifeq ($(and $(shell command -v $(EMU_CXX) 2>/dev/null),$(EMU_CUDA_INC),$(filter x86_64,$(shell uname -m))),)
  EMU ?= 0
else
  EMU ?= 1
endif
EMU_DIR := $(BUILD)/emu
EMU_CXXFLAGS := -std=c++17 $(OPT) -g -fno-strict-aliasing -Wall -Wextra -Werror -Wno-unused-parameter -I. \
                -I$(EMU_CUDA_INC) -DPLN_HAVE_CUDA=1 -DPLN_CUDA_EMU=1
ifneq ($(SANITIZE),)
  EMU_CXXFLAGS += -fsanitize=$(SANITIZE) -fno-sanitize=function -fno-sanitize=vptr -fno-omit-frame-pointer \
                  -fno-sanitize-recover=all
endif
EMU_KFLAGS := -x c++ -include kernels/cuda/emu/cuda_emu.h -fsanitize-coverage=inline-8bit-counters,trace-loads,trace-stores
EMU_CDEF_SRCS := $(shell grep -l PLN_HAVE_CUDA $(LIB_SRCS))
EMU_OBJS := $(CU_SRCS:%.cu=$(EMU_DIR)/%.cu.o) $(EMU_DIR)/kernels/cuda/emu/cuda_emu.o $(EMU_CDEF_SRCS:%.c=$(EMU_DIR)/%.o) \
            $(filter-out $(EMU_CDEF_SRCS:%.c=$(BUILD)/%.o),$(LIB_SRCS:%.c=$(BUILD)/%.o))
comma := ,
EMU_LDLIBS := $(filter-out -lcublasLt -lcublas -lnccl -lcudart -lstdc++ -L$(CUDA_HOME)/lib64 \
                -Wl$(comma)-rpath$(comma)$(CUDA_HOME)/lib64,$(LDLIBS)) -lstdc++
EMU_BINS := $(EMU_DIR)/pollen $(EMU_DIR)/tests-gpu/test_cuda_ops $(EMU_DIR)/tests-gpu/test_cuda_e2e \
            $(EMU_DIR)/tests-gpu/test_cuda_emu
.PHONY: emu
emu: $(if $(filter 1,$(EMU)),$(EMU_BINS))

$(EMU_DIR)/%.cu.o: %.cu kernels/cuda/emu/cuda_emu.h kernels/cuda/emu/emu.h
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_CXXFLAGS) $(EMU_KFLAGS) -MMD -MP -c $< -o $@

$(EMU_DIR)/kernels/cuda/emu/cuda_emu.o: kernels/cuda/emu/cuda_emu.cc kernels/cuda/emu/emu.h
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@

$(EMU_DIR)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DPLN_HAVE_CUDA=1 -DPLN_CUDA_EMU=1 -MMD -MP -c $< -o $@

$(EMU_DIR)/libpollen.a: $(EMU_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(EMU_DIR)/pollen: $(TOOL_OBJS) $(EMU_DIR)/libpollen.a
	$(CC) $(LDFLAGS) $(TOOL_OBJS) $(EMU_DIR)/libpollen.a $(EMU_LDLIBS) -o $@

$(EMU_DIR)/tests-gpu/%: tests/gpu/%.c $(EMU_DIR)/libpollen.a $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DPLN_HAVE_CUDA=1 -DPLN_CUDA_EMU=1 $(LDFLAGS) $< $(EMU_DIR)/libpollen.a $(EMU_LDLIBS) -o $@

# The harness's self-test: deliberately broken kernels, so it is kernel code too.
$(EMU_DIR)/tests-gpu/test_cuda_emu: tests/gpu/test_cuda_emu.cu $(EMU_DIR)/libpollen.a $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_CXXFLAGS) $(EMU_KFLAGS) -c $< -o $@.o
	$(CC) $(LDFLAGS) $@.o $(EMU_DIR)/libpollen.a $(EMU_LDLIBS) -o $@

-include $(EMU_OBJS:.o=.d)

-include $(LIB_OBJS:.o=.d) $(CU_OBJS:.o=.d) $(TOOL_OBJS:.o=.d)
