#!/usr/bin/env bash
# Build llama.cpp's `llama-bench` with the Vulkan backend, as a self-contained
# binary that can be copied to a GPU machine and run against a GGUF file there.
#
# What it produces (everything lives under .llama/ at the repository root,
# which git ignores):
#   .llama/llama-bench   stripped binary; ggml and llama are linked in
#                        statically, it needs only libc, libm, libstdc++,
#                        libgcc_s and the Vulkan loader (libvulkan.so.1) at
#                        run time (glibc 2.34 / GLIBCXX 3.4.30, so Debian 12 or
#                        newer); its CPU code is built for x86-64 with AVX2,
#                        FMA, F16C and BMI2 (llama.cpp's non-native default),
#                        not for the build host's CPU
#   .llama/BUILD.txt     what was built: llama.cpp commit and version, glslc
#                        version, which cooperative-matrix shader sets were
#                        compiled in, compiler, cmake options, run-time libraries
#   .llama/src, dl, deps, build, *.log   sources, downloads and intermediates
#
# Sources: llama.cpp as vendored in the llama-cpp-python sdist on PyPI
# (version below), fetched with pip; the sdist keeps llama.cpp's git metadata,
# so the build records the exact llama.cpp commit.
#
# What it needs: a Debian 12 (bookworm) or newer x86-64 host, root for
# apt-get, network access to PyPI and to Debian's package archive, python3
# with pip. Missing build tools (cmake, g++, make, git, glslc, spirv-headers,
# libvulkan-dev, xz-utils, binutils) are installed with apt-get.
# On Debian 12 two things from the system are too old for llama.cpp's Vulkan
# backend, and are taken from Debian 13 (trixie) instead, unpacked with
# `dpkg -x` into .llama/deps/ (the system's apt sources are left untouched;
# a throw-away apt configuration under .llama/deps/apt is used to fetch them):
#   - the Vulkan headers (libvulkan-dev 1.4), passed as Vulkan_INCLUDE_DIR;
#   - glslc (shaderc 2025.x): bookworm's glslc (glslang 11) lacks
#     GL_KHR_cooperative_matrix and GL_NV_cooperative_matrix2, so the tensor
#     core (coopmat / coopmat2) shaders would be left out. trixie's glslc is
#     run through trixie's own dynamic loader and libraries by a small wrapper
#     script (.llama/deps/glslc). Set LLAMA_GLSLC=system to use the system
#     glslc instead.
# On Debian 13 or newer the system packages are used as they are.
#
# How to run (from anywhere; takes a long while on a small machine, most of
# it compiling shaders and ggml-vulkan.cpp):
#   bash benches/llama_cpp.sh
# Settings, all optional, from the environment:
#   LLAMA_CPP_PYTHON_VERSION  llama-cpp-python sdist version (default 0.3.36)
#   LLAMA_JOBS                parallel build jobs (default 2)
#   LLAMA_NICE                niceness the build runs at (default 19)
#   LLAMA_GLSLC               "trixie" (default on Debian 12) or "system"
#   DEBIAN_MIRROR             archive for the trixie packages
#                             (default http://deb.debian.org/debian)
# Running it again reuses the downloads and the build directory; delete
# .llama/build (or all of .llama/) to start from scratch.
#
# On the GPU machine: install a libvulkan1 package and the NVIDIA Vulkan
# driver, then for example
#   ./llama-bench -m model.gguf -ngl 99 -p 512 -n 128
# (`--list-devices` shows the Vulkan devices llama.cpp uses;
# GGML_VK_VISIBLE_DEVICES=N picks one. CPU-type devices such as Mesa's
# llvmpipe are skipped unless picked that way, e.g. for a smoke test on a
# machine without a GPU: GGML_VK_VISIBLE_DEVICES=0 ./llama-bench -m m.gguf
# -p 16 -n 4 -r 1.)

set -euo pipefail

PKG_VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
JOBS=${LLAMA_JOBS:-2}
NICENESS=${LLAMA_NICE:-19}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/.llama
SRC_PARENT=$OUT/src
DL=$OUT/dl
DEPS=$OUT/deps
BUILD=$OUT/build

log() { printf '\n== %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Everything below (compiler, shader compiler, pip, apt) inherits this.
renice -n "$NICENESS" -p $$ >/dev/null 2>&1 || true

START=$(date +%s)
mkdir -p "$OUT" "$SRC_PARENT" "$DL" "$DEPS"

# --- host -------------------------------------------------------------------
[ "$(uname -m)" = x86_64 ] || die "this script builds for x86-64 hosts only"
[ -r /etc/os-release ] || die "/etc/os-release missing: cannot tell the OS"
osr() { (. /etc/os-release && eval "echo \"\${$1:-}\""); }
OS_DESC=$(osr PRETTY_NAME)
[ "$(osr ID)" = debian ] || die "expects Debian 12 or newer, found: $OS_DESC"
case "$(osr VERSION_ID)" in
  12) NEED_TRIXIE=1 ;;
  1[3-9]|[2-9][0-9]) NEED_TRIXIE=0 ;;
  *) case "$(osr VERSION_CODENAME)" in   # testing/unstable have no VERSION_ID
       forky|sid) NEED_TRIXIE=0 ;;
       *) die "expects Debian 12 or newer, found: $OS_DESC" ;;
     esac ;;
esac
GLSLC_MODE=${LLAMA_GLSLC:-$([ "$NEED_TRIXIE" = 1 ] && echo trixie || echo system)}
case "$GLSLC_MODE" in trixie|system) ;; *) die "LLAMA_GLSLC must be trixie or system" ;; esac
log "host: $OS_DESC; Vulkan headers from $([ "$NEED_TRIXIE" = 1 ] && echo trixie || echo system); glslc: $GLSLC_MODE"

# --- build tools from apt ---------------------------------------------------
missing=()
for pkg in cmake make g++ glslc spirv-headers libvulkan-dev xz-utils binutils; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
    || missing+=("$pkg")
done
command -v git >/dev/null || missing+=(git)
command -v python3 >/dev/null || missing+=(python3 python3-pip)
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "need root to install: ${missing[*]}"
  log "installing with apt-get: ${missing[*]}"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip does not work"

# --- llama.cpp sources --------------------------------------------------------
SDIST=$DL/llama_cpp_python-$PKG_VERSION.tar.gz
TREE=$SRC_PARENT/llama_cpp_python-$PKG_VERSION
LLAMA=$TREE/vendor/llama.cpp
if [ ! -f "$SDIST" ]; then
  log "downloading the llama-cpp-python $PKG_VERSION sdist"
  # Only this package from source: build dependencies pip needs to read the
  # sdist's metadata come as wheels.
  python3 -m pip download --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$PKG_VERSION" -d "$DL"
fi
[ -f "$SDIST" ] || die "pip did not leave $SDIST"
if [ ! -f "$LLAMA/CMakeLists.txt" ]; then
  log "unpacking $SDIST"
  rm -rf "$TREE"
  tar -xzf "$SDIST" -C "$SRC_PARENT"
fi
[ -f "$LLAMA/ggml/src/ggml-vulkan/CMakeLists.txt" ] || die "no llama.cpp Vulkan backend in $LLAMA"
LLAMA_COMMIT=$(git -C "$LLAMA" rev-parse HEAD 2>/dev/null || echo unknown)

# --- newer Vulkan headers / glslc from Debian 13 (only on Debian 12) ----------
VULKAN_INCLUDE=/usr/include
GLSLC=$(command -v glslc || true)
TRIXIE_DEBS=()
if [ "$NEED_TRIXIE" = 1 ]; then
  pkgs=(libvulkan-dev)
  [ "$GLSLC_MODE" = trixie ] && pkgs+=(glslc libshaderc1 libc6 libstdc++6 libgcc-s1)
  APT=$DEPS/apt
  DEBS=$DEPS/debs
  stamp=$DEPS/.fetched-$(IFS=-; echo "${pkgs[*]}")
  if [ ! -f "$stamp" ]; then
    log "fetching from trixie: ${pkgs[*]}"
    rm -rf "$APT" "$DEBS"
    mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" \
             "$APT/sources.list.d" "$APT/preferences.d" "$DEBS"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR trixie main" \
      > "$APT/sources.list"
    aptopts=(-o "Dir::Etc::SourceList=$APT/sources.list"
             -o "Dir::Etc::SourceParts=$APT/sources.list.d"
             -o "Dir::Etc::Preferences=$APT/preferences"
             -o "Dir::Etc::PreferencesParts=$APT/preferences.d"
             -o "Dir::State::Lists=$APT/lists"
             -o "Dir::Cache=$APT/cache"
             -o "APT::Sandbox::User=root")
    apt-get "${aptopts[@]}" update
    (cd "$DEBS" && apt-get "${aptopts[@]}" download "${pkgs[@]}")
    rm -rf "$DEPS/vulkan-dev" "$DEPS/glslc-root"
    dpkg -x "$DEBS"/libvulkan-dev_*.deb "$DEPS/vulkan-dev"
    if [ "$GLSLC_MODE" = trixie ]; then
      for p in glslc libshaderc1 libc6 libstdc++6 libgcc-s1; do
        dpkg -x "$DEBS/${p}"_*.deb "$DEPS/glslc-root"
      done
    fi
    rm -f "$DEPS"/.fetched-*
    touch "$stamp"
  fi
  for d in "$DEPS"/debs/*.deb; do TRIXIE_DEBS+=("$(basename "$d")"); done
  VULKAN_INCLUDE=$DEPS/vulkan-dev/usr/include
  if [ "$GLSLC_MODE" = trixie ]; then
    GLSLC=$DEPS/glslc
    lib=$DEPS/glslc-root/usr/lib/x86_64-linux-gnu
    cat > "$GLSLC" <<EOF
#!/bin/sh
# glslc from Debian 13, run with its own loader and libraries.
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$DEPS/glslc-root/usr/bin/glslc" "\$@"
EOF
    chmod +x "$GLSLC"
  fi
fi
[ -f "$VULKAN_INCLUDE/vulkan/vulkan.hpp" ] || die "no vulkan.hpp under $VULKAN_INCLUDE"
VK_CORE=$VULKAN_INCLUDE/vulkan/vulkan_core.h
VK_HEADER="$(sed -n 's/^#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, *\([0-9]*\), *\([0-9]*\),.*/\1.\2/p' "$VK_CORE").$(awk '$1 == "#define" && $2 == "VK_HEADER_VERSION" {print $3}' "$VK_CORE")"
GLSLC_VERSION=$("$GLSLC" --version | sed -n '1,3p' | paste -sd';' -)
log "glslc: $GLSLC_VERSION"
log "Vulkan headers: $VK_HEADER ($VULKAN_INCLUDE)"

# --- configure and build ------------------------------------------------------
CMAKE_OPTS=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_VULKAN=ON
  -DGGML_NATIVE=OFF          # no -march=native; AVX2/FMA/F16C/BMI2 instead
  -DGGML_OPENMP=OFF          # ggml's own thread pool; no libgomp at run time
  -DLLAMA_CURL=OFF
  -DLLAMA_OPENSSL=OFF        # no libssl at run time
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_SERVER=OFF
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_TOOLS=ON     # llama-bench lives in tools/
  "-DVulkan_INCLUDE_DIR=$VULKAN_INCLUDE"
  "-DVulkan_GLSLC_EXECUTABLE=$GLSLC"
)
log "configuring in $BUILD"
cmake -S "$LLAMA" -B "$BUILD" "${CMAKE_OPTS[@]}" 2>&1 | tee "$OUT/configure.log"
# The private headers must be the ones the Vulkan backend compiles against.
grep -q -- "$VULKAN_INCLUDE" "$BUILD/compile_commands.json" \
  || [ "$VULKAN_INCLUDE" = /usr/include ] \
  || die "Vulkan include dir $VULKAN_INCLUDE not used by the build"

log "building llama-bench with $JOBS jobs"
BUILD_START=$(date +%s)
cmake --build "$BUILD" --target llama-bench -j "$JOBS" 2>&1 | tee "$OUT/build.log"
# Keep the compile time of the build that last produced the binary, so that
# a later no-op run does not overwrite it.
if [ "$(stat -c %Y "$BUILD/bin/llama-bench")" -ge "$BUILD_START" ] || [ ! -f "$OUT/build-seconds" ]; then
  echo $(($(date +%s) - BUILD_START)) > "$OUT/build-seconds"
fi

cp "$BUILD/bin/llama-bench" "$OUT/llama-bench"
strip "$OUT/llama-bench"
END=$(date +%s)

# --- record -----------------------------------------------------------------
LLAMA_VERSION=$(sed -n 's/.*llama\.cpp version: \(.*\)$/\1/p' "$OUT/configure.log" | head -n1)
LLAMA_BUILD_NUMBER=$(git -C "$LLAMA" rev-list --count HEAD 2>/dev/null || echo unknown)
FEATURES=$(grep -E 'supported by glslc' "$OUT/configure.log" | sed 's/^-- /  /')
LDD=$(ldd "$OUT/llama-bench" | sed 's/ (0x[0-9a-f]*)$//; s/^[[:space:]]*/  /')
{
  echo "llama-bench (llama.cpp, Vulkan backend)"
  echo "built:              $(date -u -r "$BUILD/bin/llama-bench" +%Y-%m-%dT%H:%M:%SZ) on $OS_DESC"
  echo "compile time:       $(cat "$OUT/build-seconds") s with $JOBS jobs (cmake --build; downloads and configure not counted)"
  echo "source:             llama-cpp-python $PKG_VERSION sdist (PyPI), vendor/llama.cpp"
  echo "sdist sha256:       $(sha256sum "$SDIST" | cut -d' ' -f1)"
  echo "llama.cpp commit:   $LLAMA_COMMIT"
  echo "llama.cpp version:  ${LLAMA_VERSION:-unknown} (build number $LLAMA_BUILD_NUMBER)"
  echo "compiler:           $(g++ --version | head -n1)"
  echo "cmake:              $(cmake --version | head -n1)"
  echo "glslc:              $GLSLC_VERSION ($GLSLC_MODE)"
  echo "Vulkan headers:     $VK_HEADER"
  if [ "${#TRIXIE_DEBS[@]}" -gt 0 ]; then
    echo "from Debian 13:     ${TRIXIE_DEBS[*]}"
  fi
  echo "cmake options:"
  for o in "${CMAKE_OPTS[@]}"; do echo "  $o"; done
  echo "shader extensions (as checked against glslc by llama.cpp's cmake):"
  echo "$FEATURES"
  echo "  => coopmat (KHR) shaders: $(grep -q 'GL_KHR_cooperative_matrix supported' <<<"$FEATURES" && echo enabled || echo disabled)"
  echo "  => coopmat2 (NV) shaders: $(grep -q 'GL_NV_cooperative_matrix2 supported' <<<"$FEATURES" && echo enabled || echo disabled)"
  echo "binary:             llama-bench, stripped, $(stat -c %s "$OUT/llama-bench") bytes, sha256 $(sha256sum "$OUT/llama-bench" | cut -d' ' -f1)"
  echo "run-time libraries (ldd on the build host):"
  echo "$LDD"
} > "$OUT/BUILD.txt"

log "done in $((END - START)) s: $OUT/llama-bench"
cat "$OUT/BUILD.txt"
"$OUT/llama-bench" --help >/dev/null
