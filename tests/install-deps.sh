#!/bin/sh
# Installs what the test suites need on Debian 12 (make deps; .ci/run): a C compiler and
# make, NumPy (the independent reference), jinja2 (the chat template, rendered as the oracle
# of the C renderer), clang-14 + libFuzzer (the fuzz targets), hipcc + clang-22, lld-22 and
# the ROCm device libraries (the GPU compile checks and the ISA report), and from npm the
# Llama-3 tokenizer fixture of the tokenizer tests and the official OpenAI Node SDK (the
# client of tests/test_serve.sh). Works as root, or as a user with sudo; where nodejs
# already ships npm (NodeSource's packages), Debian's npm is not asked for (it would conflict).
set -eu
cd "$(dirname "$0")/.."
SUDO=
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install-deps: run as root, or install sudo" >&2; exit 1; }
    SUDO=sudo
fi
pkgs="build-essential python3-numpy python3-jinja2 clang-14 libclang-rt-14-dev hipcc libamdhip64-dev clang-22 lld-22 rocm-device-libs"
command -v node >/dev/null 2>&1 || pkgs="$pkgs nodejs"
command -v npm >/dev/null 2>&1 || pkgs="$pkgs npm"
echo "install-deps: apt-get install $pkgs"
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null
echo "install-deps: npm ci --prefix tests/tokenizer"
npm ci --prefix tests/tokenizer --omit=optional --no-audit --no-fund
echo "install-deps: npm ci --prefix tests/serve"
npm ci --prefix tests/serve --omit=optional --no-audit --no-fund
