#!/bin/sh
# The quick start on a bare Debian 12 machine: installs a C compiler and make if they are
# missing (apt-get; sudo when not root), then `make demo`: builds ./glm, writes a tiny
# random model with GLM-5.2's real tokenizer and chats with it (the replies are noise:
# the weights are random; the pipeline is the real one).
set -eu
cd "$(dirname "$0")"
if ! command -v cc >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then
    SUDO=
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "demo.sh: needs gcc and make: run as root, or install sudo" >&2; exit 1; }
        SUDO=sudo
    fi
    echo "demo.sh: apt-get install gcc make"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc make libc6-dev >/dev/null
fi
exec make demo
