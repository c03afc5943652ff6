# The two set-up commands of the README: `make demo` and `make test`. Each installs what it needs
# (Debian packages, as root), builds, and runs.
BUILD ?= build
JOBS  ?= $(shell nproc)
# python3-pip: cmake/fetch_test_tools.sh's downloads; git: bench/candidates.sh applies its patches with it.
DEB_PACKAGES = cmake g++ make pkgconf libspdlog-dev libfmt-dev libxxhash-dev libgtest-dev libcli11-dev \
               nlohmann-json3-dev libamdhip64-dev hipcc rocm-device-libs librocprim-dev python3 python3-pip git
# apt waits for a lock another apt or dpkg holds (a second `make` at once, an unattended upgrade) instead of failing.
APT = DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600
# Tests without a TIMEOUT of their own: one that hangs fails after this, with its output, instead of holding CI.
CTEST_TIMEOUT ?= 1200

.PHONY: deps build test demo clean test-tools test-sanitize

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${db:Status-Abbrev}' $$p 2>/dev/null | grep -q '^ii' || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(APT) update -qq && $(APT) install -y -qq $$missing; \
	fi
	@command -v nvcc >/dev/null 2>&1 || { test -x /usr/local/cuda/bin/nvcc && test -f /usr/local/cuda/include/cuda.h; } || \
	  { echo "the CUDA toolkit (headers, NVRTC, and the nvcc and libcudart CMake's FindCUDAToolkit looks for) is needed at /usr/local/cuda"; exit 1; }

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(if $(wildcard /usr/local/cuda/bin/nvcc),-DCUDAToolkit_ROOT=/usr/local/cuda)
	cmake --build $(BUILD) -j $(JOBS)

# Tools of the offline tests that Debian and this toolkit lack (cmake/fetch_test_tools.sh: PyPI wheels, pinned): clang 20
# for the gfx950 / gfx942 compile check, cuobjdump for the sweep's SASS checks. A tool that cannot be fetched fails
# `make test` (README says CI runs those checks: a skip there would pass for them); SMLA_SKIP_TEST_TOOLS=1 goes on
# without it, and its tests skip or fall back, saying so.
test-tools:
	@bash cmake/fetch_test_tools.sh $(BUILD)/_tools || { \
	  if [ "$${SMLA_SKIP_TEST_TOOLS:-0}" = 1 ]; then echo "note: a test tool could not be fetched (SMLA_SKIP_TEST_TOOLS=1: its tests skip or fall back)"; \
	  else echo "error: a test tool could not be fetched (above); SMLA_SKIP_TEST_TOOLS=1 runs the tests without it"; exit 1; fi; }

test: build test-tools
	cd $(BUILD) && ctest --output-on-failure --timeout $(CTEST_TIMEOUT) -j $(JOBS)
	$(MAKE) test-sanitize

# The suites again, built with AddressSanitizer and UndefinedBehaviorSanitizer in a tree of their own: a memory error,
# a leak or undefined behaviour fails the test that met it. Left out: the kernel compile sweeps (device code; the
# first pass ran them) and the checks of the library's own link and install (the sanitizers' runtimes change both).
# handle_segv/handle_abort off: the hipRTC worker's crash on a target ROCm 5.2 does not know is a signal the probe
# reads as its answer, which ASan would turn into an exit status.
SAN_FLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
test-sanitize: deps
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo $(if $(wildcard /usr/local/cuda/bin/nvcc),-DCUDAToolkit_ROOT=/usr/local/cuda) \
	  -DCMAKE_C_FLAGS="$(SAN_FLAGS)" -DCMAKE_CXX_FLAGS="$(SAN_FLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS="$(SAN_FLAGS)" -DCMAKE_SHARED_LINKER_FLAGS="$(SAN_FLAGS)"
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1:handle_segv=0:handle_abort=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure --timeout $(CTEST_TIMEOUT) -j $(JOBS) -E '^Kernels\.CheckCompileSweep|HipKernelsClang20|^Build\.|^Install\.'

demo: build
	$(BUILD)/bin/smla-bench --check

clean:
	rm -rf $(BUILD) $(BUILD)-asan
