#!/usr/bin/env bash
# One-command set-up for trigd on a Debian/Ubuntu machine with a Rust toolchain:
#   ./setup.sh            build trigd and install what the tests need (Prometheus, NATS;
#                         pylsl, whose wheel bundles liblsl, for EEG over Lab Streaming Layer;
#                         NumPy for the independent tracking simulation; NVRTC, where
#                         there is no CUDA toolkit, to compile the GPU kernels in the tests)
#   ./setup.sh --python   also the Python packages that regenerate fixtures and run the
#                         MNE-Python / SciPy comparisons (fixtures/requirements.txt)
# It is idempotent: run it again after pulling.
set -euo pipefail
cd "$(dirname "$0")"

need_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "setup: need root (or sudo) to run: $*" >&2; return 1; fi
}

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust from https://rustup.rs first" >&2
  exit 1
fi

# The integration tests scrape trigd with a real Prometheus server and check the alert
# rules with promtool.
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "setup: installing Prometheus (Debian package 'prometheus')"
  need_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # The package starts a system service we do not need.
  need_root systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

# The farm test (tests/farm.rs) runs a real NATS JetStream server.
if ! command -v nats-server >/dev/null && [ ! -x /usr/sbin/nats-server ]; then
  echo "setup: installing NATS (Debian package 'nats-server')"
  need_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nats-server >/dev/null
  # The package starts a system service we do not need.
  need_root systemctl disable --now nats-server >/dev/null 2>&1 || true
fi

# tests/clones_kernel_on_cpu.rs compiles a GPU kernel's source for the CPU (C++20).
if ! command -v "${CXX:-g++}" >/dev/null; then
  echo "setup: installing g++ (Debian package 'g++') for the kernel-on-CPU tests"
  need_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ >/dev/null
fi

# `trigd report` and `trigd eval --plots` draw their text with DejaVu Sans.
if [ ! -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] && [ -z "${TRIGD_FONT:-}" ]; then
  echo "setup: installing DejaVu Sans (Debian package 'fonts-dejavu-core') for the pictures"
  need_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fonts-dejavu-core >/dev/null
fi

# EEG over Lab Streaming Layer: trigd loads liblsl at run time (only for lsl:// inputs
# and outputs); the pylsl wheel bundles liblsl, and the LSL tests' amplifier and marker
# listener are written with pylsl.
PYTHON="${TRIGD_PYTHON:-python3}"
PYLSL_VERSION="1.18.6"
if ! "$PYTHON" -c 'import pylsl, sys; sys.exit(pylsl.__version__ != "'"$PYLSL_VERSION"'")' >/dev/null 2>&1; then
  if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
    echo "setup: installing pip (Debian package 'python3-pip') for pylsl"
    need_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  echo "setup: installing pylsl $PYLSL_VERSION (bundles liblsl) for Lab Streaming Layer"
  "$PYTHON" -m pip install -q "pylsl==$PYLSL_VERSION" 2>/dev/null \
    || "$PYTHON" -m pip install -q --break-system-packages "pylsl==$PYLSL_VERSION"
fi
"$PYTHON" -c 'import pylsl; pylsl.library_version()' >/dev/null 2>&1 || {
  echo "setup: pylsl is installed but its liblsl does not load (it needs glibc 2.35 or newer);" >&2
  echo "setup: build liblsl from https://github.com/sccn/liblsl and set TRIGD_LIBLSL and PYLSL_LIB to it" >&2
  exit 1
}

# tests/independent_simulation.rs simulates detectors with NumPy only
# (fixtures/tracking/independent/simulate.py), independently of trigd's own simulation.
NUMPY_VERSION="2.4.6"
if ! "$PYTHON" -c 'import numpy' >/dev/null 2>&1; then
  echo "setup: installing NumPy $NUMPY_VERSION for the independent tracking simulation"
  "$PYTHON" -m pip install -q "numpy==$NUMPY_VERSION" 2>/dev/null \
    || "$PYTHON" -m pip install -q --break-system-packages "numpy==$NUMPY_VERSION"
fi

# tests/kernels_compile.rs compiles every GPU kernel with NVRTC, which needs no GPU. Where
# the dynamic linker knows no libnvrtc (a machine without the CUDA toolkit), the NVRTC
# wheel of the CUDA release trigd is built against is installed and its directory given
# to the linker. A machine with a toolkit keeps its own. (grep reads ldconfig's whole list:
# under pipefail, grep -q leaving early could fail the pipe.)
NVRTC_VERSION="13.0.88"
if ! /sbin/ldconfig -p | grep 'libnvrtc\.so' >/dev/null; then
  echo "setup: installing NVRTC $NVRTC_VERSION (Python wheel nvidia-cuda-nvrtc) for the kernels' compile test"
  "$PYTHON" -m pip install -q "nvidia-cuda-nvrtc==$NVRTC_VERSION" 2>/dev/null \
    || "$PYTHON" -m pip install -q --break-system-packages "nvidia-cuda-nvrtc==$NVRTC_VERSION"
  NVRTC_LIB="$("$PYTHON" - <<'PY'
import glob, os, sys
roots = [p for p in sys.path if os.path.isdir(os.path.join(p, "nvidia"))]
libs = [l for r in roots for l in glob.glob(os.path.join(r, "nvidia", "*", "lib", "libnvrtc.so.13"))]
print(os.path.dirname(sorted(libs)[-1]) if libs else "")
PY
)"
  if [ -z "$NVRTC_LIB" ]; then
    echo "setup: the NVRTC wheel installed no libnvrtc.so" >&2
    exit 1
  fi
  echo "$NVRTC_LIB" | need_root tee /etc/ld.so.conf.d/trigd-nvrtc.conf >/dev/null
  need_root /sbin/ldconfig
  /sbin/ldconfig -p | grep 'libnvrtc\.so' >/dev/null || {
    echo "setup: libnvrtc in $NVRTC_LIB is not known to the dynamic linker after ldconfig" >&2
    exit 1
  }
fi

if [ "${1:-}" = "--python" ]; then
  python3 -m pip install -q -r fixtures/requirements.txt
fi

cargo build --release
echo "setup: done. Try: ./target/release/trigd --help"
