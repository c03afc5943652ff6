# The two set-up commands of the README: `make demo` and `make test`. Each installs what it needs
# (Debian packages, as root), builds, and runs.
BUILD ?= build
JOBS  ?= $(shell nproc)
DEB_PACKAGES = cmake g++ make pkgconf libspdlog-dev libfmt-dev libxxhash-dev libgtest-dev libcli11-dev \
               nlohmann-json3-dev libamdhip64-dev hipcc rocm-device-libs librocprim-dev

.PHONY: deps build test demo clean gfx950-clang

deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@command -v nvcc >/dev/null 2>&1 || { test -x /usr/local/cuda/bin/nvcc && test -f /usr/local/cuda/include/cuda.h; } || \
	  { echo "the CUDA toolkit (headers, NVRTC, and the nvcc and libcudart CMake's FindCUDAToolkit looks for) is needed at /usr/local/cuda"; exit 1; }

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(if $(wildcard /usr/local/cuda/bin/nvcc),-DCUDAToolkit_ROOT=/usr/local/cuda)
	cmake --build $(BUILD) -j $(JOBS)

# A clang of LLVM 20 for the offline gfx950 compile check (cmake/fetch_gfx950_clang.sh: PyPI's ziglang wheel, pinned);
# without it that one test skips and says why.
gfx950-clang:
	@bash cmake/fetch_gfx950_clang.sh $(BUILD)/_tools || echo "note: no clang 20 for the gfx950 compile check (it will skip)"

test: build gfx950-clang
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	$(BUILD)/bin/smla-bench --check

clean:
	rm -rf $(BUILD)
