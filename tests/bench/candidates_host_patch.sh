#!/usr/bin/env bash
# Bench.CandidatesRefuseAHostPatchWithoutK: a candidate patch with a host-code hunk (a new runtime/ file here) is
# refused by `candidates.sh prepare` (its variant would run with the build's host code), and taken with -k (the
# compile check of its kernel sources). $1: the build directory. Run from the repository root.
set -u
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
mkdir "$d/pd"
cat > "$d/pd/host.patch" <<'PATCH'
host: a patch with a host hunk (the test of the refusal).
diff --git a/runtime/smla-test-host.hpp b/runtime/smla-test-host.hpp
new file mode 100644
--- /dev/null
+++ b/runtime/smla-test-host.hpp
@@ -0,0 +1 @@
+// a host file
PATCH
msg=$(PATCH_DIR=$d/pd BUILD=$1 bash bench/candidates.sh prepare "$d/ab" -s 64,128,256,64 host 2>&1)
echo "without -k: rc $?, $(grep -o 'changes host code ([^)]*)' <<< "$msg")"
PATCH_DIR=$d/pd BUILD=$1 bash bench/candidates.sh prepare "$d/ab2" -s 64,128,256,64 -k host > "$d/k.log" 2>&1
echo "with -k: rc $?"
